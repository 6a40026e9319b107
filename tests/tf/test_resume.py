"""Resume after preemption, with Keras' fit and with a SessionHook on a TF 1.x graph: a job killed after a
checkpoint and restarted with the same checkpoint configuration numbers its steps on from the checkpoint,
in the same run (tests/conftest.py: Preemption)."""

SCRIPT = """
import os, signal, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import keras
import smdebug.tensorflow as smd

out_dir, (run, steps, checkpoint_at, kill_at) = sys.argv[1], map(int, sys.argv[2:])
path = os.path.join(os.environ["CKPT_DIR"], "model.weights.h5")
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
start = 0
if os.path.exists(path):
    model.load_weights(path)
    start = int(open(path + ".step").read()) + 1


class Checkpoint(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        step = start + batch
        hook.save_scalar("run", run)
        if step == checkpoint_at:
            model.save_weights(path)
            with open(path + ".step", "w") as f:
                f.write(str(step))
        if step == kill_at:
            hook.flush()
            os.kill(os.getpid(), signal.SIGKILL)


hook = smd.KerasHook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights", "losses"])
x = np.arange((steps - start) * 6, dtype="float32").reshape(-1, 3) / 10
model.fit(x, np.zeros((len(x), 1)), batch_size=2, epochs=1, shuffle=False, verbose=0, callbacks=[hook, Checkpoint()])
hook.close()
"""


def test_restarted_job_numbers_its_steps_on_from_the_checkpoint(preemption, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    # killed after step 7, its checkpoint is of step 4: the restarted job trains steps 5 and 6 again
    preemption.run(script, run=1, steps=10, checkpoint_at=4, kill_at=7)
    done = preemption.run(script, run=2, steps=7)
    assert "removed worker_0's steps 5-7" in done.stderr  # what the first job saved after step 4
    trial = preemption.check({0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 2}, seen=4)
    assert trial.tensor_names(collection="weights")


# A TF 1.x graph trained by a MonitoredTrainingSession that keeps its checkpoints in the checkpoint folder
# (TensorFlow's CheckpointSaverHook: the step that reaches CHECKPOINT_AT + 1 writes one) and restores the
# latest on restart. The job is killed right after the run call that wrote its checkpoint.
GRAPH_SCRIPT = """
import os, signal, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np
import tensorflow as tf
tf.compat.v1.disable_eager_execution()
import smdebug.tensorflow as smd

out_dir, (run, steps, checkpoint_at, kill_at) = sys.argv[1], map(int, sys.argv[2:])
hook = smd.SessionHook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights", "losses"])
x = tf.compat.v1.placeholder(tf.float32, [None, 3])
w = tf.compat.v1.get_variable("w", [3, 1], initializer=tf.compat.v1.zeros_initializer())
loss = tf.compat.v1.losses.mean_squared_error(tf.ones([2, 1]), tf.matmul(x, w))
global_step = tf.compat.v1.train.get_or_create_global_step()
train_op = hook.wrap_optimizer(tf.compat.v1.train.GradientDescentOptimizer(0.01)).minimize(loss, global_step)
with tf.control_dependencies([train_op]):
    trained = tf.identity(global_step.read_value())  # the global step after the update
hook.set_mode(smd.modes.TRAIN)
with tf.compat.v1.train.MonitoredTrainingSession(
    checkpoint_dir=os.environ["CKPT_DIR"], hooks=[hook, tf.compat.v1.train.StopAtStepHook(last_step=steps)],
    save_checkpoint_steps=checkpoint_at + 1, save_summaries_steps=None, log_step_count_steps=None,
) as sess:
    while not sess.should_stop():  # one run call, one step
        step = sess.run(trained, feed_dict={x: np.ones((2, 3), np.float32)}) - 1
        hook.save_scalar("run", run)
        if step == kill_at:
            hook.flush()
            os.kill(os.getpid(), signal.SIGKILL)
hook.close()
"""


def test_session_hook_restarted_from_the_checkpoint_its_step_wrote(preemption, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(GRAPH_SCRIPT)
    # the run call of step 4 writes the checkpoint (global step 5), and the job dies right after it
    preemption.run(script, run=1, steps=10, checkpoint_at=4, kill_at=4)
    done = preemption.run(script, run=2, steps=8)
    assert "saved after the checkpoint" not in done.stderr  # no step was removed: none came after it
    trial = preemption.check({**dict.fromkeys(range(5), 1), 5: 2, 6: 2, 7: 2})
    assert trial.tensor("w:0").steps() == list(range(8))
