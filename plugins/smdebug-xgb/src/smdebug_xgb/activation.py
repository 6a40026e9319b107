"""Zero-code-change use: the hook of the JSON configuration joins every ``xgboost.train`` call, and so
every scikit-learn estimator's ``fit`` (which calls it), every ``xgboost.cv`` call and, once the script
imports ``xgboost.dask``, every ``xgboost.dask.train`` call (its workers get copies of the hook), unless the
call already has an smdebug hook."""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import sys

logger = logging.getLogger("smdebug")

ORIGINAL = "__smdebug_original__"  # set on our wrapper: the function it wraps


def activate():
    """Build the hook from the JSON configuration and install it; None when there is no configuration."""
    from smdebug_xgb.hook import Hook

    hook = Hook.create_from_json_file()
    if hook is None:
        return None
    install(hook)
    logger.info("smdebug: every xgboost.train and scikit-learn fit now saves to %s", hook.out_dir)
    from smdebug.plugin import after_import

    after_import(DASK, lambda module: install_dask(module, hook))  # xgboost's import does not load it
    return hook


def install(hook) -> None:
    """Make ``xgboost.train`` (also as the scikit-learn wrappers see it) and ``xgboost.cv`` add ``hook``
    to their callbacks."""
    for name, modules in _WRAPPED.items():
        current = getattr(importlib.import_module(modules[1]), name)
        original = getattr(current, ORIGINAL, current)
        wrapper = _train_with(original, hook)
        for module in map(importlib.import_module, modules):
            function = getattr(module, name, None)
            if function is original or hasattr(function, ORIGINAL):
                setattr(module, name, wrapper)


def install_dask(module, hook) -> None:
    """Make ``xgboost.dask.train`` add ``hook`` to its callbacks (Dask ships a copy to each worker)."""
    current = module.train
    original = getattr(current, ORIGINAL, current)
    module.train = _train_with(original, hook, borrow=False)  # a DaskDMatrix stays where it is


def uninstall() -> None:
    """Give xgboost its own train and cv functions back."""
    dask = [("train", (DASK,))] if DASK in sys.modules else []
    for name, modules in [*_WRAPPED.items(), *dask]:
        for module in map(importlib.import_module, modules):
            function = getattr(module, name, None)
            if hasattr(function, ORIGINAL):
                setattr(module, name, getattr(function, ORIGINAL))


# the functions wrapped, and the modules that hold them (the second defines it)
_WRAPPED = {
    "train": ("xgboost", "xgboost.training", "xgboost.sklearn"),
    "cv": ("xgboost", "xgboost.training"),
}
DASK = "xgboost.dask"  # its train is wrapped once the script imports it


def _train_with(train, hook, borrow: bool = True):
    from smdebug_xgb.hook import Hook

    signature = inspect.signature(train)

    @functools.wraps(train)
    def train_with_smdebug(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return train(*args, **kwargs)  # xgboost reports the bad call itself
        callbacks = list(bound.arguments.get("callbacks") or ())
        if hook.closed or any(isinstance(cb, Hook) for cb in callbacks):
            return train(*args, **kwargs)
        bound.arguments["callbacks"] = [*callbacks, hook]
        # Without data of its own the hook takes this call's: SHAP values on the training data,
        # predictions and labels on the first evaluation set that is not the training data.
        dtrain = bound.arguments.get("dtrain") if borrow else None
        evals = [d for d, _ in bound.arguments.get("evals") or () if d is not dtrain] if borrow else []
        borrowed = {}
        if hook.train_data is None and dtrain is not None:
            borrowed["train_data"] = dtrain
        if hook.validation_data is None and evals:
            borrowed["validation_data"] = evals[0]
        elif hook.validation_data is None and borrow and bound.arguments.get("evals"):
            borrowed["_no_validation_data"] = (
                "the training call's only evaluation set is its training data (give the hook "
                "validation_data, or the call another evaluation set)"
            )
        before = {name: getattr(hook, name) for name in borrowed}
        for name, value in borrowed.items():
            setattr(hook, name, value)
        try:
            return train(*bound.args, **bound.kwargs)
        finally:
            for name, value in before.items():
                setattr(hook, name, value)

    setattr(train_with_smdebug, ORIGINAL, train)
    return train_with_smdebug
