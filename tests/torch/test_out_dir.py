"""The torch hook refuses an out_dir holding a run, as the core's hook does (tests/storage/test_out_dir.py)."""

import numpy as np
import pytest

import smdebug
import smdebug.pytorch as smd
from smdebug.exceptions import ConfigError
from smdebug.hook import BaseHook


def test_the_torch_hook_refuses_a_directory_holding_a_run(tmp_path):
    out_dir = str(tmp_path / "run")
    hook = BaseHook(out_dir=out_dir, save_config=smdebug.SaveConfig(save_interval=1))
    for _ in range(2):
        hook.begin_step()
        hook.save_tensor("x", np.arange(3.0))
    hook.close()
    with pytest.raises(ConfigError, match="choose a new out_dir"):
        smd.Hook(out_dir=out_dir)
