"""Tiny real Keras models and data shared by the TensorFlow tests."""

import keras


def make_model(seed=1, jit_compile=False, optimizer="sgd", metrics=("accuracy",)):
    """A two-layer classifier on 4 features, compiled."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(5, activation="relu", name="hidden"),
            keras.layers.Dense(3, activation="softmax", name="head"),
        ],
        name="mlp",
    )
    model.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        metrics=list(metrics),
        jit_compile=jit_compile,
    )
    return model


def batches(x, y, batch_size=8):
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(x), batch_size)]


def reference_gradients(weights, xb, yb):
    """Gradients of the loss on one batch for a fresh copy of the model holding these weights."""
    import tensorflow as tf

    model = make_model(seed=99)
    for variable, value in zip(model.trainable_variables, weights):
        variable.assign(value)
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy()(yb, model(xb))
    grads = tape.gradient(loss, model.trainable_variables)
    return {v.path: g.numpy() for v, g in zip(model.trainable_variables, grads)}, model


class WeightsBefore(keras.callbacks.Callback):
    """Records the trainable weights at the start of every training batch (by variable path)."""

    def __init__(self):
        super().__init__()
        self.at = []

    def on_train_batch_begin(self, batch, logs=None):
        self.at.append([v.numpy().copy() for v in self.model.trainable_variables])
