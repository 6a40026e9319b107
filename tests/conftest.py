"""Fixtures every test session shares (each suite's conftest adds its own)."""

import logging

import pytest

from smdebug import plugins


@pytest.fixture(autouse=True)
def fresh_plugins(monkeypatch):
    """Each test sees the entry points as they are now (some tests disable plugins through the env)."""
    monkeypatch.delenv("SMDEBUG_DISABLE_PLUGINS", raising=False)
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
