"""Optional dependencies, each an extra of smdebug-core (``pip install 'smdebug-core[plot]'``): imported on
first use, with a one-line error naming the extra (and the package) when it is missing."""

from __future__ import annotations

import importlib

from smdebug.exceptions import SMDebugError

# extra of smdebug-core -> the package it installs (see core/pyproject.toml)
EXTRAS = {
    "plot": "matplotlib",
    "tensorboard": "tensorboard",
    "s3": "s3fs",
    "pandas": "pandas",
    "dask": "dask",
}
_EXTRA_OF = {package: extra for extra, package in EXTRAS.items()}


class MissingDependencyError(SMDebugError, ImportError):
    """An optional dependency a feature needs is not installed; the message says what to pip install."""


def install_hint(package: str) -> str:
    """``pip install 'smdebug-core[extra]' (or pip install package)``, or just the package's own."""
    extra = _EXTRA_OF.get(package)
    if extra is None:
        return f"pip install {package}"
    return f"pip install 'smdebug-core[{extra}]' (or pip install {package})"


def require(module: str, feature: str, pip_name: str | None = None):
    """Import module, or raise MissingDependencyError naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = pip_name or module.split(".")[0]
        raise MissingDependencyError(
            f"{feature} needs {package}, which is not installed: {install_hint(package)} ({exc})"
        ) from None
