import pytest


@pytest.fixture
def dummy_calls():
    from smdebug_dummy import plugin

    plugin.CALLS.clear()
    return plugin.CALLS
