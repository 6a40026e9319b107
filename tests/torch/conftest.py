import logging

import pytest
import torch

from smdebug import plugins

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fresh_plugins():
    plugins.reset()
    yield
    plugins.reset()


@pytest.fixture
def out_dir(tmp_path):
    return str(tmp_path / "run")


@pytest.fixture
def caplog_smdebug(caplog):
    caplog.set_level(logging.INFO, logger="smdebug")
    return caplog
