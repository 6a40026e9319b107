"""Fixtures of the torch suite."""

from __future__ import annotations

import pytest

from smdebug_torch import native


@pytest.fixture(params=["native", "torch"])
def reduction_path(request, monkeypatch):
    """The ordinary reductions computed by the native kernel (smdebug_torch.native, built on this machine)
    or by torch's batched calls (the kernel not loaded yet, or no compiler)."""
    if request.param == "native":
        if not native.wait(timeout=600):
            pytest.skip("the native kernel could not be built here (no C++ compiler?)")
    else:
        monkeypatch.setattr(native, "reducer", lambda: None)
    return request.param
