"""Fixtures of the torch suite."""

from __future__ import annotations

import pytest

from smdebug_torch import native


@pytest.fixture
def native_kernel() -> None:
    """The native kernel (smdebug_torch.native) loaded, built on this machine first if need be."""
    if not native.wait(timeout=600):
        pytest.skip("the native kernel could not be built here (no C++ compiler?)")


def _kernel_or_torch(request, monkeypatch, native_entry: str):
    """The parametrized path: the native kernel loaded, or torch's batched calls with ``native_entry`` (the
    kernel's getter for that use) answering None, as when the kernel is not loaded yet or cannot be built."""
    if request.param == "native":
        request.getfixturevalue("native_kernel")
    else:
        monkeypatch.setattr(native, native_entry, lambda *args: None)
    return request.param


@pytest.fixture(params=["native", "torch"])
def reduction_path(request, monkeypatch):
    """The ordinary reductions computed by the native kernel or by torch's batched calls."""
    return _kernel_or_torch(request, monkeypatch, "reducer")


@pytest.fixture(params=["native", "torch"])
def kernel(request, monkeypatch):
    """Health's statistics computed by the native kernel or by torch's batched calls."""
    return _kernel_or_torch(request, monkeypatch, "health_watch")
