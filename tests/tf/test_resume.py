"""Resume after preemption with Keras' fit: a job killed after a checkpoint and restarted with the same
checkpoint configuration numbers its steps on from the checkpoint, in the same run (tests/conftest.py:
Preemption)."""

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
