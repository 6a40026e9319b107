import pytest
import torch

from smdebug import plugins

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fresh_plugins():
    plugins.reset()
    yield
    plugins.reset()
