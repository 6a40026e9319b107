"""Resume after preemption: a job killed after a checkpoint and restarted with the same checkpoint
configuration numbers its steps on from the checkpoint, in the same run (tests/conftest.py: Preemption)."""

SCRIPT = """
import os, signal, sys
import torch
import smdebug.pytorch as smd

out_dir, (run, steps, checkpoint_at, kill_at) = sys.argv[1], map(int, sys.argv[2:])
path = os.path.join(os.environ["CKPT_DIR"], "model.pt")
torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
start = 0
if os.path.exists(path):
    state = torch.load(path)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    start = state["step"] + 1
hook = smd.Hook(out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights", "losses"])
hook.register_module(model)
loss_fn = torch.nn.MSELoss()
hook.register_loss(loss_fn)
hook.set_mode(smd.modes.TRAIN)
for step in range(start, steps):
    loss = loss_fn(model(torch.full((2, 3), float(step))), torch.zeros(2, 1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    hook.save_scalar("run", run)
    if step == checkpoint_at:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path)
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
    # the later job's values: its weights at step 5 are the checkpoint's, trained once more
    assert set(trial.tensor_names(collection="weights")) == {"Linear_weight"}
    assert trial.tensor("Linear_weight").value(5).shape == (1, 3)
