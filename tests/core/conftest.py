import logging

import pytest

from smdebug import plugins


@pytest.fixture(autouse=True)
def fresh_plugins(monkeypatch):
    """Each test sees entry points as they are now (some tests disable plugins through the env)."""
    monkeypatch.delenv("SMDEBUG_DISABLE_PLUGINS", raising=False)
    plugins.reset()
    yield
    plugins.reset()


@pytest.fixture
def dummy_calls():
    from smdebug_dummy import plugin

    plugin.CALLS.clear()
    return plugin.CALLS


@pytest.fixture
def caplog_smdebug(caplog):
    caplog.set_level(logging.INFO, logger="smdebug")
    return caplog
