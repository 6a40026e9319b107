"""Zero-code-change use: the hook of the JSON configuration joins every ``xgboost.train`` call, and so
every scikit-learn estimator's ``fit`` (which calls it), unless the call already has an smdebug hook."""

from __future__ import annotations

import functools
import inspect
import logging

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
    return hook


def install(hook) -> None:
    """Make ``xgboost.train`` (also as the scikit-learn wrappers see it) add ``hook`` to its callbacks."""
    import xgboost
    import xgboost.sklearn
    import xgboost.training

    current = xgboost.training.train
    original = getattr(current, ORIGINAL, current)
    wrapper = _train_with(original, hook)
    for module in (xgboost, xgboost.training, xgboost.sklearn):
        train = getattr(module, "train", None)
        if train is original or hasattr(train, ORIGINAL):
            module.train = wrapper


def uninstall() -> None:
    """Give xgboost its own train function back."""
    import xgboost
    import xgboost.sklearn
    import xgboost.training

    for module in (xgboost, xgboost.training, xgboost.sklearn):
        train = getattr(module, "train", None)
        if hasattr(train, ORIGINAL):
            module.train = getattr(train, ORIGINAL)


def _train_with(train, hook):
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
        dtrain = bound.arguments.get("dtrain")
        evals = [d for d, _ in bound.arguments.get("evals") or () if d is not dtrain]
        borrowed = {}
        if hook.train_data is None and dtrain is not None:
            borrowed["train_data"] = dtrain
        if hook.validation_data is None and evals:
            borrowed["validation_data"] = evals[0]
        for name, value in borrowed.items():
            setattr(hook, name, value)
        try:
            return train(*bound.args, **bound.kwargs)
        finally:
            for name in borrowed:
                setattr(hook, name, None)

    setattr(train_with_smdebug, ORIGINAL, train)
    return train_with_smdebug
