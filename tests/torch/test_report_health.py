"""``smdebug report`` of a torch run with health=True: the page shows where a non-finite value first
appeared (the torch plugin's provenance), rendered in headless Chromium."""

import torch
from support import chromium, script_errors, smdebug_cli
from torch import nn

from smdebug import plugins


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_provenance_of_a_real_non_finite_input(tmp_path):
    """health=True and a NaN in the input at step 6: the page shows where it first appeared."""
    import smdebug.pytorch as smd

    out = tmp_path / "nan"
    plugins.reset()
    torch.manual_seed(0)
    model, loss_fn = Net(), nn.CrossEntropyLoss()
    hook = smd.Hook(out_dir=str(out), health=True, save_config=smd.SaveConfig(save_interval=5))
    hook.register_module(model)
    hook.register_loss(loss_fn)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(8):
        x = torch.randn(8, 4)
        if step == 6:
            x[2, 1] = float("nan")
        opt.zero_grad()
        loss_fn(model(x), torch.randint(0, 3, (8,))).backward()
        opt.step()
    hook.close()
    plugins.reset()
    page = tmp_path / "nan.html"
    assert smdebug_cli("report", out, "-o", page, "--no-rules").returncode == 0
    html = page.read_text()
    panel = html.split('id="provenance"', 1)[1].split("</section>", 1)[0]
    assert "<th>step</th><td class='mono'>6</td>" in panel and "input" in panel
    dom, stderr = chromium(page, tmp_path, "--dump-dom")
    assert script_errors(stderr) == [] and 'data-render="ok"' in dom
