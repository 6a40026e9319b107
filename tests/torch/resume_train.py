"""A training job for the resume tests (tests/conftest.py: Preemption), written against smdebug 1.0's
API only: tests/compat runs it with the real smdebug 1.0.34 too."""

import os
import signal
import sys

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
hook = smd.Hook(
    out_dir, save_config=smd.SaveConfig(save_interval=1), include_collections=["weights", "losses"]
)
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
