"""``smdebug report``: a real run's page, rendered in headless Chromium (Debian's chromium)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import Net, batch, train
from numpy_training import SGD, CrossEntropyLoss, Linear, NumpyHook, ReLU, train_step
from numpy_training import Net as _Net
from support import chromium, script_errors

import smdebug
from smdebug import plugins

LOSS = "CrossEntropyLoss_output_0"
LAYERS = ["Net_fc1.weight", "Net_fc1.bias", "Net_fc2.weight", "Net_fc2.bias"]


@pytest.fixture(scope="module")
def report(run_dir, tmp_path_factory):
    from support import smdebug_cli

    out = tmp_path_factory.mktemp("report") / "report.html"
    result = smdebug_cli("report", run_dir, "-o", out)
    assert result.returncode == 0, result.stderr
    assert str(out) in result.stdout
    return out


def test_the_page_loads_without_script_errors_and_shows_the_loss_and_every_layer(report, tmp_path):
    dom, stderr = chromium(report, tmp_path, "--dump-dom")
    assert script_errors(stderr) == []
    assert 'data-render="ok"' in dom, dom[:500]
    # the loss curve: an SVG line with a point per saved TRAIN step, and its EVAL mode
    svg = re.search(rf'<svg[^>]*aria-label="{LOSS}".*?</svg>', dom, re.S)
    assert svg is not None
    points = re.findall(r'<polyline[^>]*points="([^"]*)"', svg.group(0))
    assert points and len(points[0].split()) >= 3
    assert "TRAIN" in dom and "EVAL" in dom
    # every layer of the model, in model order, a row of the gradient heatmap
    gradients = dom.split('id="heatmap-gradients"', 1)[1].split("</section>", 1)[0]
    rows = re.findall(r'<div class="layer"[^>]*title="([^"]+)"', gradients)
    assert rows == LAYERS
    assert len(Net().named_parameters()) == len(rows)
    assert "weight-update ratio" in dom


# Mouse events sent to the rendered page: hovering the loss curve and a heatmap cell, dragging to zoom.
INTERACT = """<script>
(function () {
  var out = {}, tip = document.getElementById("smdebug-tip");
  function at(el, fx, fy, type, target) {
    var r = el.getBoundingClientRect();
    (target || el).dispatchEvent(new MouseEvent(type, {clientX: r.left + r.width * fx, clientY: r.top + r.height * fy, bubbles: true}));
  }
  var plot = document.querySelector("#curve-0 .plot");
  function ticks() { return Array.from(plot.querySelectorAll("text.tick")).map(function (t) { return t.textContent; }); }
  at(plot, 0.5, 0.5, "mousemove");
  out.curveTip = tip.hidden ? null : tip.textContent;
  out.ticks = ticks();
  at(plot, 0.12, 0.5, "mousedown"); at(plot, 0.5, 0.5, "mousemove", window); at(plot, 0.5, 0.5, "mouseup", window);
  out.zoomedTicks = ticks();
  var canvas = document.querySelector("#heatmap-gradients canvas");
  at(canvas, 0.5, 0.1, "mousemove");
  out.heatmapTip = tip.hidden ? null : tip.textContent;
  document.body.setAttribute("data-selftest", JSON.stringify(out));
})();
</script></body>"""


def test_hover_shows_values_and_dragging_zooms(report, tmp_path):
    import html as html_module

    page = tmp_path / "interact.html"
    page.write_text(report.read_text().replace("</body>", INTERACT))
    dom, stderr = chromium(page, tmp_path, "--dump-dom")
    assert script_errors(stderr) == []
    found = json.loads(html_module.unescape(re.search(r'data-selftest="([^"]*)"', dom).group(1)))
    assert found["curveTip"] and LOSS in found["curveTip"] and "TRAIN step" in found["curveTip"]
    assert found["zoomedTicks"] != found["ticks"]  # the x axis now spans the dragged steps only
    assert found["heatmapTip"] and LAYERS[0] in found["heatmapTip"] and "step" in found["heatmapTip"]


def test_the_screenshot_is_not_blank(report, tmp_path):
    import matplotlib.image

    shot = tmp_path / "shot.png"
    chromium(report, tmp_path, f"--screenshot={shot}")
    pixels = matplotlib.image.imread(str(shot))[:, :, :3]
    colours = np.unique((pixels.reshape(-1, 3) * 255).astype(np.uint8), axis=0)
    assert len(colours) > 50  # text, curves and a heatmap's colour ramp, not one flat colour
    assert pixels.std() > 0.05


def test_a_script_error_would_be_seen(report, tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text(
        report.read_text().replace("var D = JSON.parse(", "var D = JSON.parse(undefinedName + ")
    )
    dom, stderr = chromium(broken, tmp_path, "--dump-dom")
    assert script_errors(stderr) or 'data-render="error"' in dom
    assert 'data-render="ok"' not in dom


def test_the_page_is_self_contained(report):
    html = report.read_text()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", html, re.I)
    assert "http://" not in html and "https://" not in html
    assert "@import" not in html and "url(" not in html
    assert len(html) < 200_000  # no plotting library inlined


def test_panels_rules_contents_and_downsampling_notes(tmp_path, cli):
    out = tmp_path / "run"
    plugins.reset()
    train(out, train_steps=40, eval_steps=0, save_config=smdebug.SaveConfig(save_interval=1))
    plugins.reset()
    page = tmp_path / "small.html"
    result = cli("report", out, "-o", page, "--max-steps", "5", "--max-points", "10")
    assert result.returncode == 0, result.stderr
    html = page.read_text()
    data = json.loads(
        re.search(r'id="smdebug-data">(.*?)</script>', html, re.S).group(1).replace("<\\/", "</")
    )
    assert len(data["gradients"]["steps"]) == 5
    assert max(len(s["x"]) for c in data["curves"] for s in c["series"]) <= 10
    assert "Downsampled" in html and "5 of 40 saved steps" in html
    assert [r["rule"] for r in data["rules"]]  # the built-in rules, as `smdebug rules` runs them
    # a rule with nothing to read in this run (no activations saved) says so, as `smdebug rules` does
    dead_relu = next(r for r in data["rules"] if r["rule"] == "dead_relu")
    assert dead_relu["result"] == "no data" and "nothing to check" in dead_relu["details"]
    assert {"Rules", "Run contents", "Unsaved steps"} <= set(
        re.findall(r"Rules|Run contents|Unsaved steps", html)
    )
    assert 'id="provenance"' not in html  # the run recorded no non-finite value
    # many layers: fewer columns, every layer kept (4 layers, 8 cells: 2 steps)
    result = cli("report", out, "-o", page, "--max-cells", "8", "--no-rules")
    assert result.returncode == 0, result.stderr
    data = json.loads(re.search(r'id="smdebug-data">(.*?)</script>', page.read_text(), re.S).group(1))
    assert data["gradients"]["rows"] == LAYERS and len(data["gradients"]["steps"]) == 2
    assert data["rules"] is None and "not evaluated" in page.read_text()


def test_rule_firings_and_non_finite_gradients_are_marked(tmp_path, cli):
    """A run whose input explodes at step 6: the rule that fires is marked on the loss curve, the NaN
    gradients are red cells."""
    out = tmp_path / "exploding"
    plugins.reset()
    rng = np.random.default_rng(0)
    model, loss_fn, opt = Net(), CrossEntropyLoss(), SGD(0.1)
    hook = NumpyHook(
        out_dir=str(out),
        save_config=smdebug.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients", "losses"],
    )
    for step in range(10):
        x, y = batch(rng, 8)
        with np.errstate(over="ignore"):  # inf, as in a framework
            x = x * np.float32(1e38 if step >= 6 else 1.0)
            train_step(hook, model, x * x, y, loss_fn, opt)
    hook.close()
    plugins.reset()
    page = tmp_path / "exploding.html"
    result = cli("report", out, "-o", page)
    assert result.returncode == 0, result.stderr
    html = page.read_text()
    data = json.loads(
        re.search(r'id="smdebug-data">(.*?)</script>', html, re.S).group(1).replace("<\\/", "</")
    )
    fired = {r["rule"]: r["steps"] for r in data["rules"] if r["result"] == "fired"}
    assert fired, data["rules"]
    loss = next(c for c in data["curves"] if c["name"] == LOSS)
    assert {m["step"] for m in loss["marks"]} >= {s for steps in fired.values() for s in steps[:1]}
    assert data["gradients"]["non_finite"] > 0
    dom, stderr = chromium(page, tmp_path, "--dump-dom")
    assert script_errors(stderr) == [] and 'data-render="ok"' in dom
    assert '<line class="mark"' in dom


def test_rules_that_fired_during_training_are_listed_and_marked(tmp_path, cli):
    """A rule the hook ran during training with action None fired and training went on: the report
    lists its firings in the Rules panel and marks them on the loss curve."""
    out = tmp_path / "flat"
    plugins.reset()
    model, loss_fn = Net(), CrossEntropyLoss()
    hook = NumpyHook(
        out_dir=str(out), save_config=smdebug.SaveConfig(save_interval=1), include_collections=["losses"]
    )
    hook.set_mode(smdebug.modes.TRAIN)
    hook.add_rule("loss_not_decreasing", action=None, num_steps="3")
    x, y = batch(np.random.default_rng(0), 8)
    for _ in range(8):  # no update: the loss never decreases
        train_step(hook, model, x, y, loss_fn, SGD(0.0))
    hook.close()
    plugins.reset()
    page = tmp_path / "flat.html"
    result = cli("report", out, "-o", page, "--no-rules")
    assert result.returncode == 0, result.stderr
    html = page.read_text()
    data = json.loads(
        re.search(r'id="smdebug-data">(.*?)</script>', html, re.S).group(1).replace("<\\/", "</")
    )
    assert [(f["rule"], f["step"], f["mode"]) for f in data["training_firings"]] == [
        ("LossNotDecreasing", 3, "TRAIN"),
        ("LossNotDecreasing", 6, "TRAIN"),
    ]
    panel = html.split('id="rules"', 1)[1].split("</section>", 1)[0]
    assert (
        "Fired during training:</b> 2 firing(s)" in panel
        and panel.count("<td class='mono'>LossNotDecreasing") == 2
    )
    loss = next(c for c in data["curves"] if c["name"] == LOSS)
    assert {"step": 3, "label": "LossNotDecreasing fired during training"} in loss["marks"]
    assert {m["step"] for m in loss["marks"]} == {3, 6}
    dom, stderr = chromium(page, tmp_path, "--dump-dom")
    assert script_errors(stderr) == [] and 'data-render="ok"' in dom
    for step in (3, 6):
        assert f"<title>LossNotDecreasing fired during training at step {step}</title>" in dom


def test_provenance_panel_when_the_trial_records_one(run_dir):
    from smdebug.report import build_report
    from smdebug.trials import create_trial

    trial = create_trial(run_dir)
    trial.first_nonfinite = lambda: {"step": 3, "tensor": "gradient/Net_fc1.weight", "value": "nan"}
    html = build_report(trial, rules=False)
    panel = html.split('id="provenance"', 1)[1].split("</section>", 1)[0]
    assert "gradient/Net_fc1.weight" in panel and "First non-finite value" in panel
    assert '{"step":3,"label":"first non-finite value"}' in html  # marked on the curves too
    trial.first_nonfinite = lambda: None
    assert 'id="provenance"' not in build_report(trial, rules=False)


def test_watch_regenerates_the_page_while_the_run_is_written(tmp_path, cli):
    out, page = tmp_path / "live", tmp_path / "live.html"
    seen = []

    def watch():
        seen.append(
            cli("report", out, "-o", page, "--watch", "--interval", "0.5", "--no-rules", "--timeout", "60")
        )

    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(1.0)

    plugins.reset()
    rng = np.random.default_rng(0)
    model, loss_fn = Net(), CrossEntropyLoss()
    hook = NumpyHook(
        out_dir=str(out),
        save_config=smdebug.SaveConfig(save_interval=1),
        include_collections=["losses", "gradients"],
    )
    live_pages = []
    for step in range(12):
        train_step(hook, model, *batch(rng, 8), loss_fn, SGD(0.0))  # gradients, no update
        if step >= 2 and page.exists():
            live_pages.append(page.read_text())
        time.sleep(0.3)
    hook.close()
    plugins.reset()
    watcher.join(90)
    assert seen and seen[0].returncode == 0, seen and seen[0].stderr
    assert "final report" in seen[0].stdout
    assert any('"reload_seconds":0.5' in p for p in live_pages)  # a live page reloads itself
    assert '"reload_seconds":0' in page.read_text() and '"reload_seconds":0.5' not in page.read_text()
    assert "training ended" in page.read_text()


def test_report_errors_are_one_line(run_dir, tmp_path, cli):
    result = cli("report", tmp_path / "nothing", "-o", tmp_path / "x.html")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "smdebug report: error:" in result.stderr
    assert not (tmp_path / "x.html").exists()
    result = cli("report", run_dir, "-o", tmp_path / "no" / "x.html")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "folder does not exist" in result.stderr and not (tmp_path / "no").exists()
    os.makedirs(tmp_path / "empty")
    result = cli("report", tmp_path / "empty", "--max-steps", "0")
    assert result.returncode == 2 and "--max-steps" in result.stderr


HOSTILE = "<!--<script>x=1</script>\"'é😀"


def test_hostile_tensor_names_neither_break_nor_inject_into_the_page(tmp_path, cli):
    """Names are the user's: a scalar and a gradient named with an HTML comment opener and a script tag
    (which, left raw in the page's JSON block, would swallow the page's own script) are shown as text."""
    out = tmp_path / "hostile"
    plugins.reset()
    rng = np.random.default_rng(0)
    model, loss_fn, opt = Net(), CrossEntropyLoss(), SGD(0.1)
    hook = NumpyHook(
        out_dir=str(out),
        save_config=smdebug.SaveConfig(save_interval=1),
        include_collections=["weights", "gradients", "losses"],
    )
    hook.set_mode(smdebug.modes.TRAIN)
    for step in range(4):
        train_step(hook, model, *batch(rng, 8), loss_fn, opt)
        hook.save_scalar(HOSTILE, float(step))
        hook.save_tensor(f"gradient/{HOSTILE}", np.ones(3) * step, collections_to_write="gradients")
    hook.close()
    plugins.reset()
    page = tmp_path / "hostile.html"
    assert cli("report", out, "-o", page).returncode == 0
    html = page.read_text()
    data = re.search(r'id="smdebug-data">(.*?)</script>', html, re.S).group(1)
    assert "<" not in data  # nothing in the data block the HTML parser could read as markup
    assert HOSTILE in {c["name"].split("/", 1)[-1] for c in json.loads(data)["curves"]}
    dom, stderr = chromium(page, tmp_path, "--dump-dom")
    assert script_errors(stderr) == [] and 'data-render="ok"' in dom, stderr[-2000:]
    assert "<script>x=1" not in dom  # shown escaped, never as markup
    gradients = dom.split('id="heatmap-gradients"', 1)[1].split("</section>", 1)[0]
    assert len(re.findall(r'<div class="layer"', gradients)) == len(LAYERS) + 1


def test_damaged_steps_are_shown_as_smdebug_ls_lists_them(tmp_path, cli):
    """A run with a malformed index file (step 3) and a truncated event file (step 5): the page says both
    steps are damaged, in its header and its contents panel, and still renders."""

    out = tmp_path / "damaged"
    plugins.reset()
    train(out, train_steps=8, eval_steps=0, save_config=smdebug.SaveConfig(save_interval=1))
    plugins.reset()
    (out / "index" / "000000000" / "000000000003_worker_0.json").write_text("{not json")
    (event,) = (out / "events" / "000000000005").iterdir()
    with open(event, "r+b") as f:
        f.truncate(40)
    page = tmp_path / "damaged.html"
    result = cli("report", out, "-o", page, "--no-rules")
    assert result.returncode == 0, result.stderr
    html = page.read_text()
    assert "2 step(s) damaged" in html.split("</header>", 1)[0]
    panel = html.split('id="contents"', 1)[1].split("</section>", 1)[0]
    assert "Damaged steps" in panel and "3: " in panel and "5: " in panel
    assert "malformed index file" in panel and "truncated" in panel
    dom, stderr = chromium(page, tmp_path, "--dump-dom")
    assert script_errors(stderr) == [] and 'data-render="ok"' in dom


def test_a_weight_that_starts_at_zero_does_not_blow_up_the_update_ratio_scale(tmp_path, cli):
    """Zero-initialised biases (Keras's default, LayerNorm's): their first update has no ratio (||w_prev||
    is 0), so it is left blank and said so, not a ~1e10 cell that makes every other cell look dark."""
    out = tmp_path / "zero_bias"
    plugins.reset()
    rng = np.random.default_rng(0)
    model = _Net(
        "Net", [("fc1", Linear(4, 8, rng, std=0.5)), ("relu", ReLU()), ("fc2", Linear(8, 3, rng, std=0.5))]
    )
    hook = NumpyHook(
        out_dir=str(out),
        save_config=smdebug.SaveConfig(save_interval=1),
        include_collections=["weights", "biases", "losses"],
    )
    hook.set_mode(smdebug.modes.TRAIN)
    for _ in range(5):
        train_step(hook, model, *batch(rng, 8), CrossEntropyLoss(), SGD(0.1))
    hook.close()
    plugins.reset()
    page = tmp_path / "zero_bias.html"
    assert cli("report", out, "-o", page, "--no-rules").returncode == 0
    data = json.loads(re.search(r'id="smdebug-data">(.*?)</script>', page.read_text(), re.S).group(1))
    ratio = data["update_ratio"]
    assert ratio["rows"] == LAYERS
    assert 10 ** ratio["hi"] < 10, ratio  # an SGD step moves a weight by a fraction of its size
    codes = np.frombuffer(__import__("base64").b64decode(ratio["codes"]), "<u2").reshape(4, -1)
    assert (codes[[1, 3], 1] == 65535).all() and (codes[[0, 2], 1] < 65533).all()  # biases: blank
    assert "all zeros" in ratio["missing"]
    dom, stderr = chromium(page, tmp_path, "--dump-dom")
    assert script_errors(stderr) == []
    legend = re.search(r'<span class="scale">(.*?)</div>', dom.split('id="update_ratio"', 1)[1], re.S)
    assert "all zeros" in legend.group(1)


def test_a_reduction_the_gradients_do_not_hold_is_a_clear_error(tmp_path, cli):
    """Gradients saved as l2 norms only: --reduction abs_max cannot be drawn (it used to give a heatmap of
    grey "not saved" cells); one line names what was saved. l2 itself is drawn."""
    out = tmp_path / "l2_only"

    def configure(hook):
        hook.get_collection("gradients").reduction_config = smdebug.ReductionConfig(norms=["l2"])

    plugins.reset()
    train(out, configure=configure)
    plugins.reset()
    page = tmp_path / "l2.html"
    result = cli("report", out, "-o", page, "--reduction", "abs_max", "--no-rules")
    assert result.returncode == 2 and not page.exists()
    (line,) = result.stderr.strip().splitlines()
    assert "abs_max" in line and "l2" in line, line
    assert cli("report", out, "-o", page, "--reduction", "l2", "--no-rules").returncode == 0
    assert "gradient norm (l2)</b>: 4 layers" in page.read_text()


def test_watch_with_an_output_folder_that_does_not_exist_fails_at_once(tmp_path, cli):
    """--watch on a run that has not started yet: a wrong -o is said before waiting for the run (it used to
    be said only once the first step arrived, or never without --timeout)."""
    started = time.monotonic()
    result = cli("report", tmp_path / "not_yet", "-o", tmp_path / "no" / "x.html", "--watch")
    assert result.returncode == 2 and time.monotonic() - started < 30
    (line,) = result.stderr.strip().splitlines()
    assert "folder does not exist" in line


def _curve(html, name):
    data = json.loads(re.search(r'id="smdebug-data">(.*?)</script>', html, re.S).group(1))
    return next((c for c in data["curves"] if c["name"] == name), None)


def test_a_per_sample_loss_and_a_loss_saved_as_reductions_get_curves(tmp_path, cli):
    """Gluon losses (and torch's reduction="none") are one value per sample: the curve is their mean
    at each step, and says so. A loss saved as its mean reduction only is drawn from that."""
    out = tmp_path / "vector_loss"
    plugins.reset()
    hook = NumpyHook(out_dir=str(out), save_config=smdebug.SaveConfig(save_interval=1))
    hook.set_mode(smdebug.modes.TRAIN)
    for step in range(4):
        hook.begin_step()
        hook.save_tensor("PerSampleLoss_output_0", np.array([1.0, 3.0]) / (step + 1), "losses")
        hook.end_step()
    hook.close()
    plugins.reset()
    page = tmp_path / "vector.html"
    assert cli("report", out, "-o", page, "--no-rules").returncode == 0
    html = page.read_text()
    curve = _curve(html, "PerSampleLoss_output_0")
    assert curve is not None, "no loss curve"
    assert curve["series"][0]["y"] == [2.0, 1.0, 2 / 3, 0.5] and "mean" in curve["summary"]
    assert "mean of" in html.split('id="curves"', 1)[1].split("</section>", 1)[0]

    out = tmp_path / "mean_only"

    def configure(hook):
        hook.get_collection("losses").reduction_config = smdebug.ReductionConfig(reductions=["mean"])

    plugins.reset()
    train(out, configure=configure)
    plugins.reset()
    assert cli("report", out, "-o", page, "--no-rules").returncode == 0
    curve = _curve(page.read_text(), LOSS)
    assert curve is not None and len(curve["series"][0]["x"]) >= 3, "no curve of the loss's mean"
    dom, stderr = chromium(page, tmp_path, "--dump-dom")
    assert script_errors(stderr) == [] and f'aria-label="{LOSS}"' in dom


def test_an_output_that_is_a_folder_or_a_negative_timeout_is_a_clear_error(run_dir, tmp_path, cli):
    result = cli("report", run_dir, "-o", tmp_path, "--no-rules")
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "is a folder" in line and ".tmp-" not in line, line
    result = cli("report", run_dir, "-o", tmp_path / "x.html", "--watch", "--timeout", "-1")
    assert result.returncode == 2 and "--timeout" in result.stderr and not (tmp_path / "x.html").exists()


def test_an_output_that_is_a_symlink_or_a_fifo_stays_one(run_dir, tmp_path, cli):
    """-o a symlink: its target gets the page and the link stays a link (it was replaced by a regular file);
    -o a FIFO (or a device: /dev/null) is written into, not replaced by a regular file."""
    target, link = tmp_path / "target.html", tmp_path / "link.html"
    target.write_text("old")
    link.symlink_to(target.name)
    assert cli("report", run_dir, "-o", link, "--no-rules").returncode == 0
    assert link.is_symlink() and target.read_text().startswith("<!DOCTYPE html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.html", "target.html"]  # no temporary left

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    read = []
    reader = threading.Thread(target=lambda: read.append(fifo.read_text()), daemon=True)
    reader.start()
    assert cli("report", run_dir, "-o", fifo, "--no-rules").returncode == 0
    reader.join(timeout=60)
    assert read and read[0].startswith("<!DOCTYPE html>") and read[0].rstrip().endswith("</html>")
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == [
        "fifo",
        "link.html",
        "target.html",
    ]


def test_the_number_of_curves_is_bounded_and_said(tmp_path, cli):
    """A run saving many scalars (one per layer, say): the page draws at most --max-curves of them, losses
    first, and says how many it left out, so its size stays bounded."""
    out = tmp_path / "many_scalars"
    plugins.reset()
    rng = np.random.default_rng(0)
    model, loss_fn = Net(), CrossEntropyLoss()
    hook = NumpyHook(out_dir=str(out), save_config=smdebug.SaveConfig(save_interval=1))
    for step in range(3):
        train_step(hook, model, *batch(rng, 8), loss_fn, SGD(0.1))
        for k in range(30):
            hook.save_scalar(f"layer{k}_ratio", float(step * k))
    hook.close()
    plugins.reset()
    page = tmp_path / "many.html"
    assert cli("report", out, "-o", page, "--no-rules", "--max-curves", "5").returncode == 0
    html = page.read_text()
    data = json.loads(re.search(r'id="smdebug-data">(.*?)</script>', html, re.S).group(1))
    assert len(data["curves"]) == 5 and data["curves"][0]["name"] == LOSS
    assert "5 of 31 curves" in html.split('class="notes"', 1)[1]
    assert cli("report", out, "-o", page, "--no-rules").returncode == 0  # the default draws all 31
    assert page.read_text().count('<div class="curve">') == 31


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_watch_stopped_by_the_user_leaves_a_page_that_no_longer_reloads(tmp_path, stop):
    """--watch over a run that has not ended, stopped with Ctrl-C (or a kill): the page it leaves must not
    go on reloading itself every --interval, calling itself live; it is written once more without that."""
    out, page = tmp_path / "unfinished", tmp_path / "unfinished.html"
    plugins.reset()
    train(out, train_steps=4, eval_steps=0, save_config=smdebug.SaveConfig(save_interval=1))
    plugins.reset()
    (out / "training_job_end.ts").unlink()  # an interrupted (or still running) training
    exe = shutil.which("smdebug", path=os.path.dirname(sys.executable)) or "smdebug"
    watcher = subprocess.Popen(
        [exe, "report", str(out), "-o", str(page), "--watch", "--interval", "0.5", "--no-rules"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C must reach it even when pytest runs as a background job (SIGINT ignored, inherited)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not (page.exists() and '"reload_seconds":0.5' in page.read_text()):
            assert watcher.poll() is None and time.monotonic() < deadline, watcher.communicate()
            time.sleep(0.2)
        watcher.send_signal(stop)
        stdout, stderr = watcher.communicate(timeout=120)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 130, stderr
    assert "Stopped watching" in stdout and "Traceback" not in stderr
    html = page.read_text()
    assert '"reload_seconds":0' in html and '"reload_seconds":0.5' not in html
    assert "Live:" not in html and "training not ended" in html
    dom, stderr = chromium(page, tmp_path, "--dump-dom")
    assert script_errors(stderr) == [] and 'data-render="ok"' in dom


# Every layer label the heatmap shows: its text's box, and whether an element around it clips it (an
# ancestor with overflow other than visible whose box does not hold the text) or it overlaps the one above.
LABELS = """<script>
(function () {
  var out = [], above = null;
  document.querySelectorAll("#heatmap-gradients .labels .layer").forEach(function (row) {
    var walker = document.createTreeWalker(row, NodeFilter.SHOW_TEXT), text = walker.nextNode();
    if (!text || !text.textContent.trim()) return;
    var range = document.createRange();
    range.selectNodeContents(text);
    var box = range.getBoundingClientRect(), clipped = false;
    for (var el = text.parentElement; el && !el.classList.contains("hm"); el = el.parentElement) {
      var style = getComputedStyle(el), r = el.getBoundingClientRect();
      if (style.overflowY !== "visible" && (box.top < r.top - 0.5 || box.bottom > r.bottom + 0.5)) clipped = true;
    }
    out.push({text: text.textContent, height: box.height, clipped: clipped, overlaps: above !== null && box.top < above - 2});
    above = box.bottom;
  });
  document.body.setAttribute("data-labels", JSON.stringify(out));
})();
</script></body>"""


def test_the_heatmap_layer_labels_of_a_deep_model_are_readable(tmp_path, cli):
    """300 layers: rows are 2 px high and every sixth is labelled; each label must show its whole text
    height (it was cut to its 2 px row, unreadable), without overlapping the next label."""
    import html as html_module

    out = tmp_path / "deep"
    plugins.reset()
    hook = NumpyHook(
        out_dir=str(out), save_config=smdebug.SaveConfig(save_interval=1), include_collections=["gradients"]
    )
    hook.get_collection("gradients").reduction_config = smdebug.ReductionConfig(norms=["l2"])
    hook.set_mode(smdebug.modes.TRAIN)
    for step in range(3):
        hook.begin_step()
        for i in range(300):
            hook.save_tensor(f"gradient/layer{i}.weight", np.full(2, i + step, np.float32), "gradients")
        hook.end_step()
    hook.close()
    plugins.reset()
    page = tmp_path / "deep.html"
    assert cli("report", out, "-o", page, "--no-rules").returncode == 0
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", LABELS))
    dom, stderr = chromium(probe, tmp_path, "--dump-dom")
    assert script_errors(stderr) == [] and 'data-render="ok"' in dom
    labels = json.loads(html_module.unescape(re.search(r'data-labels="([^"]*)"', dom).group(1)))
    assert len(labels) >= 20 and labels[0]["text"] == "layer0.weight", labels[:3]
    assert all(lb["height"] >= 9 and not lb["clipped"] and not lb["overlaps"] for lb in labels), labels[:3]


def test_a_missing_update_ratio_says_why_when_weights_were_saved(tmp_path, cli):
    """A run that saved its weights as values at one training step: there is no update ratio, but the
    panel must not say that the run saved no weights as values (it did); it says a ratio needs two steps."""
    out = tmp_path / "one_step"
    plugins.reset()
    train(out, train_steps=1, eval_steps=0)
    plugins.reset()
    page = tmp_path / "one_step.html"
    assert cli("report", out, "-o", page, "--no-rules").returncode == 0
    panel = page.read_text().split('id="update_ratio"', 1)[1].split("</section>", 1)[0]
    assert "saved no weights" not in panel
    assert "one training step" in panel, panel


def test_a_page_opened_before_the_run_starts_waits_for_it(tmp_path, cli):
    """--watch started before training (the run's folder does not exist yet): the page is there at once,
    says it waits for the run and reloads itself (a browser opened on it found no file, and never
    retried); --timeout without a run leaves a page that says watching stopped and no longer reloads."""
    out, page = tmp_path / "not_started", tmp_path / "waiting.html"
    exe = shutil.which("smdebug", path=os.path.dirname(sys.executable)) or "smdebug"
    watcher = subprocess.Popen(
        [
            exe,
            "report",
            str(out),
            "-o",
            str(page),
            "--watch",
            "--interval",
            "0.5",
            "--no-rules",
            "--timeout",
            "120",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not page.exists():
            assert watcher.poll() is None and time.monotonic() < deadline, watcher.communicate()
            time.sleep(0.2)
        waiting = page.read_text()
        assert (
            "Waiting for the run" in waiting
            and "setTimeout(function () { location.reload(); }, 500)" in waiting
        )
        plugins.reset()
        train(out, train_steps=4, eval_steps=0)
        plugins.reset()
        stdout, stderr = watcher.communicate(timeout=120)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0, stderr
    html = page.read_text()
    assert "Waiting" not in html and LOSS in html
    dom, stderr = chromium(page, tmp_path, "--dump-dom")
    assert script_errors(stderr) == [] and 'data-render="ok"' in dom

    result = cli("report", tmp_path / "never", "-o", page, "--watch", "--interval", "0.2", "--timeout", "1")
    assert result.returncode == 2 and "no smdebug run appeared" in result.stderr
    assert "Watching stopped" in page.read_text() and "location.reload" not in page.read_text()


class _Rank(NumpyHook):
    rank = 0

    def worker_name(self):
        return f"worker_{self.rank}"

    def num_workers(self):
        return 2


def test_a_live_page_shows_a_step_once_its_last_worker_wrote_it(tmp_path):
    """--watch over a 2-worker run whose worker_1 writes each step after worker_0: the page is made again
    when the slower worker completes the step (it waited for the next step, or the end of training, to
    show it, as the number of steps any worker wrote had not changed)."""
    src, live, page = tmp_path / "src", tmp_path / "live", tmp_path / "live.html"
    plugins.reset()
    hooks = [
        type(f"Rank{r}", (_Rank,), {"rank": r})(
            out_dir=str(src), save_config=smdebug.SaveConfig(save_interval=1), include_workers="all"
        )
        for r in (0, 1)
    ]
    for step in range(3):
        for hook in hooks:
            hook.begin_step()
            hook.save_tensor("MSELoss_output_0", np.float32(1.0 / (step + 1)), "losses")
            hook.end_step()
    for hook in hooks:
        hook.close()
    plugins.reset()

    def publish(step, worker):  # the event file, then its index (as the writer does)
        for kind, folder in (("events", f"{step:012d}"), ("index", "000000000")):
            (live / kind / folder).mkdir(parents=True, exist_ok=True)
            name = f"{step:012d}_{worker}." + ("tfevents" if kind == "events" else "json")
            shutil.copy(src / kind / folder / name, live / kind / folder / name)

    shutil.copytree(src / "collections", live / "collections")
    for step, worker in [(0, "worker_0"), (0, "worker_1"), (1, "worker_0"), (1, "worker_1"), (2, "worker_0")]:
        publish(step, worker)

    def shown():
        curve = _curve(page.read_text(), "MSELoss_output_0") if page.exists() else None
        return curve and curve["series"][0]["x"]

    exe = shutil.which("smdebug", path=os.path.dirname(sys.executable)) or "smdebug"
    watcher = subprocess.Popen(
        [exe, "report", str(live), "-o", str(page), "--watch", "--interval", "0.3", "--no-rules"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while shown() != [0, 1]:
            assert watcher.poll() is None and time.monotonic() < deadline, (shown(), watcher.communicate())
            time.sleep(0.2)
        publish(2, "worker_1")  # step 2 complete: no new step number, no end of training
        deadline = time.monotonic() + 60
        while shown() != [0, 1, 2]:
            assert watcher.poll() is None and time.monotonic() < deadline, shown()
            time.sleep(0.2)
        assert '"reload_seconds":0.3' in page.read_text()  # still live
        (live / "training_job_end.ts").write_text("")
        watcher.communicate(timeout=120)
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0


def test_the_charts_of_a_multi_worker_run_show_only_the_named_worker(tmp_path, cli):
    """A 2-worker run where worker_0 saves every other step and worker_1 every step (another model): the
    header says "charts: worker_0", and the loss curve and both heatmaps hold worker_0's values at the
    steps it saved only (they took worker_1's value at the steps worker_0 did not save)."""
    from smdebug.trials import create_trial

    out = tmp_path / "two_workers"
    plugins.reset()
    ranks = []
    for rank, interval in ((0, 2), (1, 1)):
        hook = type(f"Rank{rank}", (_Rank,), {"rank": rank})(
            out_dir=str(out),
            save_config=smdebug.SaveConfig(save_interval=interval),
            include_collections=["weights", "biases", "gradients", "losses"],
            include_workers="all",
        )
        hook.set_mode(smdebug.modes.TRAIN)
        ranks.append((hook, Net(seed=rank), SGD(0.1 * (rank + 1)), np.random.default_rng(rank)))
    for _ in range(6):
        for hook, model, opt, rng in ranks:
            train_step(hook, model, *batch(rng), CrossEntropyLoss(), opt)
    for hook, *_ in ranks:
        hook.close()
    plugins.reset()
    page = tmp_path / "two_workers.html"
    assert cli("report", out, "-o", page, "--no-rules").returncode == 0
    html = page.read_text()
    assert "(charts: worker_0)" in html
    data = json.loads(re.search(r'id="smdebug-data">(.*?)</script>', html, re.S).group(1))
    trial = create_trial(str(out))
    (series,) = _curve(html, LOSS)["series"]
    assert series["x"] == [0, 2, 4], series
    assert series["y"] == [
        pytest.approx(float(trial.tensor(LOSS).value(s, worker="worker_0"))) for s in (0, 2, 4)
    ]
    for key, first in (("gradients", 0), ("update_ratio", 2)):
        heatmap = data[key]
        assert heatmap["steps"] == [0, 2, 4], (key, heatmap["steps"])
        codes = np.frombuffer(__import__("base64").b64decode(heatmap["codes"]), "<u2").reshape(4, 3)
        assert (codes[:, first // 2 :] <= 65533).all(), (key, codes)  # every cell of worker_0 drawn
    # worker_0's gradient norms: the heatmap's scale spans them, not worker_1's
    norms = [
        np.linalg.norm(trial.tensor("gradient/" + layer).value(s, worker="worker_0"))
        for layer in LAYERS
        for s in (0, 2, 4)
    ]
    lo, hi = np.log10(min(norms)), np.log10(max(norms))
    assert (data["gradients"]["lo"], data["gradients"]["hi"]) == (pytest.approx(lo), pytest.approx(hi))
