"""Optional dependencies (matplotlib, pandas): imported on first use, with an error saying what to install."""

from __future__ import annotations

import importlib

from smdebug.exceptions import SMDebugError


class MissingDependencyError(SMDebugError, ImportError):
    """An optional dependency a feature needs is not installed; the message says what to pip install."""


def require(module: str, feature: str, pip_name: str | None = None):
    """Import module, or raise MissingDependencyError naming the package that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = pip_name or module.split(".")[0]
        raise MissingDependencyError(
            f"{feature} needs {package}, which is not installed: pip install {package} ({exc})"
        ) from None
