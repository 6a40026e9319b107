"""Resume after preemption with Gluon: a job killed after a checkpoint and restarted with the same
checkpoint configuration numbers its steps on from the checkpoint, in the same run (tests/conftest.py:
Preemption)."""

SCRIPT = """
import os, signal, sys
import mxnet as mx
from mxnet import autograd, gluon
import smdebug.mxnet as smd

out_dir, (run, steps, checkpoint_at, kill_at) = sys.argv[1], map(int, sys.argv[2:])
path = os.path.join(os.environ["CKPT_DIR"], "net.params")
mx.random.seed(0)
net = gluon.nn.Dense(1, in_units=3)
net.initialize()
start = 0
if os.path.exists(path):
    net.load_parameters(path)
    start = int(open(path + ".step").read()) + 1
loss_fn = gluon.loss.L2Loss()
trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01})
hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights", "losses"])
hook.register_block(net)
hook.register_block(loss_fn)
hook.set_mode(smd.modes.TRAIN)
for step in range(start, steps):
    with autograd.record():
        loss = loss_fn(net(mx.nd.full((2, 3), step)), mx.nd.zeros((2, 1)))
    loss.backward()
    trainer.step(2)
    hook.save_scalar("run", run)
    if step == checkpoint_at:
        net.save_parameters(path)
        with open(path + ".step", "w") as f:
            f.write(str(step))
    if step == kill_at:
        hook.flush()
        os.kill(os.getpid(), signal.SIGKILL)
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


def test_a_later_hook_numbers_on_like_smdebug_1_0s_spot_training_test(preemption, tmp_path):
    """smdebug 1.0's own test of spot training: hooks made one after the other in one process, each with its
    own out_dir, the parameters saved after each epoch; the later hook's steps go on after the checkpoint
    (here the last one, which the first hook records when it closes)."""
    from conftest import Run, batches, make_net

    import smdebug.mxnet as smd
    from smdebug.trials import create_trial

    save = smd.SaveConfig(save_steps=[1, 2, 7, 8, 9])
    steps = []
    for job in ("first", "later"):
        net, loss_fn = make_net()
        hook = smd.Hook(str(tmp_path / job), save_config=save, include_collections=["weights", "gradients"])
        hook.register_block(net)
        run = Run(hook, net, loss_fn)
        for epoch in range(2):
            run.train(batches(2, seed=epoch))
            net.save_parameters(str(preemption.folder / f"params_{epoch}.params"))
        hook.close()
        steps.append(create_trial(str(tmp_path / job)).steps())
    assert steps == [[0, 1, 2], [7]]  # the first job's steps 0-3, the later job's 4-7
