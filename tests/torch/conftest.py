"""Fixtures of the torch suite."""

from __future__ import annotations

import pytest

from smdebug_torch import native


@pytest.fixture
def native_kernel() -> None:
    """The native kernel (smdebug_torch.native) loaded, built on this machine first if need be."""
    if not native.wait(timeout=600):
        pytest.skip("the native kernel could not be built here (no C++ compiler?)")


@pytest.fixture(params=["native", "torch"])
def reduction_path(request, monkeypatch):
    """The ordinary reductions computed by the native kernel or by torch's batched calls (the kernel not
    loaded yet, or no compiler)."""
    if request.param == "native":
        request.getfixturevalue("native_kernel")
    else:
        monkeypatch.setattr(native, "reducer", lambda: None)
    return request.param


@pytest.fixture(params=["native", "torch"])
def kernel(request, monkeypatch):
    """Health's statistics computed by the native kernel or by torch's batched calls (the kernel not
    loaded yet, or no compiler)."""
    if request.param == "native":
        request.getfixturevalue("native_kernel")
    else:
        monkeypatch.setattr(native, "health_watch", lambda *args: None)
    return request.param
