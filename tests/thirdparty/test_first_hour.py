"""A new user's first hour with zero code change (`smdebug run`, SMDEBUG_CONFIG_FILE_PATH): what went where
and how to save more is said; a malformed configuration stops the script. Real subprocesses, toyml."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from smdebug.trials import create_trial

SMDEBUG_CLI = str(Path(sys.executable).with_name("smdebug"))
TRAIN = textwrap.dedent(
    """
    import numpy as np
    import toyml

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3))
    y = x @ np.array([[1.0], [-2.0], [0.5]])
    print("training")
    toyml.fit(toyml.Linear(3, 1), x, y, epochs=2, lr=0.1, batch_size=16)
    """
)
OWN_HOOK = textwrap.dedent(
    """
    import sys
    import numpy as np
    import toyml
    import smdebug.toyml as smd

    hook = smd.Hook(out_dir=sys.argv[1], save_config=smd.SaveConfig(save_interval=1),
                    include_collections=["losses"])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3))
    toyml.fit(toyml.Linear(3, 1), x, x[:, :1], epochs=2, lr=0.1, batch_size=16, callbacks=[hook])
    hook.close()
    """
)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("SMDEBUG_DISABLE", "USE_SMDEBUG")}
    env.pop("SMDEBUG_CONFIG_FILE_PATH", None)
    return {**env, **extra}


def _run(tmp_path, source, *command, env=None):
    script = tmp_path / "train.py"
    script.write_text(source)
    args = [a if a != "SCRIPT" else str(script) for a in command]
    return subprocess.run(args, capture_output=True, text=True, env=env or _env(), cwd=tmp_path, timeout=120)


def test_malformed_configuration_under_activation_stops_with_one_line(tmp_path):
    config = tmp_path / "hook.json"
    config.write_text('{"LocalPath": "run", ')
    done = _run(tmp_path, TRAIN, sys.executable, "SCRIPT", env=_env(SMDEBUG_CONFIG_FILE_PATH=str(config)))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "training" not in done.stdout  # it did not train without smdebug
    # one line (the other lines are this session's deliberately broken plugins, skipped)
    lines = [line for line in done.stderr.splitlines() if "hook configuration" in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert str(config) in lines[0] and "invalid JSON" in lines[0] and "SMDEBUG_CONFIG_FILE_PATH" in lines[0]


def test_run_says_where_the_scripts_own_hook_saved(tmp_path):
    own, configured = tmp_path / "own", tmp_path / "configured"
    done = _run(
        tmp_path,
        OWN_HOOK,
        SMDEBUG_CLI,
        "run",
        "--out-dir",
        str(configured),
        "--",
        "python",
        "SCRIPT",
        str(own),
    )
    assert done.returncode == 0, done.stderr
    assert f"the script's own hook saved to {own}" in done.stdout, done.stdout + done.stderr
    assert "imported no framework" not in done.stderr
    assert create_trial(str(own)).steps() == list(range(8))


def test_run_with_the_defaults_says_how_to_save_more(tmp_path):
    out = tmp_path / "run"
    done = _run(tmp_path, TRAIN, SMDEBUG_CLI, "run", "--out-dir", str(out), "--", "python", "SCRIPT")
    assert done.returncode == 0, done.stderr
    assert create_trial(str(out)).steps() == [0]  # the defaults: the losses every 500 steps
    assert "--collections" in done.stderr and "--save-interval" in done.stderr
