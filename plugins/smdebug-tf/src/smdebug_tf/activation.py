"""Zero code change: with a hook configuration present, every Keras fit/evaluate/predict gets the hook, and
so does every ``tf.compat.v1.train.MonitoredTrainingSession`` (the hook then becomes a SessionHook, and
every ``tf.compat.v1.train.Optimizer`` shows it its gradients).

Activation runs just after ``import tensorflow`` (or ``import keras``). Keras' TensorFlow trainer may not be
imported yet then (``import keras`` imports TensorFlow half-way through its own import), so the trainer's
fit, evaluate and predict are wrapped the moment its module has finished importing.
"""

from __future__ import annotations

import functools
import importlib.abc
import inspect
import logging
import sys

logger = logging.getLogger("smdebug")

TRAINER_MODULE = "keras.src.backend.tensorflow.trainer"
_METHODS = ("fit", "evaluate", "predict")
_state = {"hook": None, "patched": False, "sessions": False}


def activate():
    """Build the hook from the configuration and attach it to Keras. Returns the hook (or None)."""
    if _state["hook"] is not None:
        return _state["hook"]
    module = sys.modules.get(TRAINER_MODULE)
    ready = module is not None and not _initializing(module)
    if ready:
        from smdebug_tf.hook import KerasHook as hook_class
    else:  # Keras is (maybe) half imported: a TFHook now, a KerasHook once the trainer is there
        from smdebug_tf.tfhook import TFHook as hook_class
    hook = hook_class.create_from_json_file()
    if hook is None:
        return None
    _state["hook"] = hook
    if ready:
        patch(module)
    else:
        sys.meta_path.insert(0, _TrainerWatcher())
    patch_sessions()
    return hook


# where tf.compat.v1.train.MonitoredTrainingSession is defined, and the API module that offers it; both
# exist once `import tensorflow` has started them, before it has finished (when activation may run)
SESSION_MODULES = ("tensorflow.python.training.monitored_session", "tensorflow._api.v2.compat.v1.train")
OPTIMIZER_MODULE = "tensorflow.python.training.optimizer"


def patch_sessions() -> None:
    """Wrap tf.compat.v1.train.MonitoredTrainingSession (it adds the hook) and v1 optimizers'
    apply_gradients (they record their gradients for it)."""
    modules = [sys.modules.get(name) for name in SESSION_MODULES]
    if _state["sessions"] or any(m is None or not hasattr(m, "MonitoredTrainingSession") for m in modules):
        return
    _state["sessions"] = True
    try:
        original = modules[0].MonitoredTrainingSession
        wrapped = _with_session_hook(original)
        for module in modules:
            if module.MonitoredTrainingSession is original:
                module.MonitoredTrainingSession = wrapped
        optimizer = sys.modules.get(OPTIMIZER_MODULE)
        if optimizer is not None:
            from smdebug_tf.graph import wrap_optimizer_class

            wrap_optimizer_class(optimizer.Optimizer)
    except Exception as exc:
        logger.warning(
            "smdebug: could not attach the hook to TF 1.x sessions: %s: %s", type(exc).__name__, exc
        )


def _with_session_hook(function):
    signature = inspect.signature(function)

    @functools.wraps(function)
    def call(*args, **kwargs):
        hook = _state["hook"]
        if hook is not None and not hook.closed:
            try:
                bound = signature.bind(*args, **kwargs)
                hooks = list(bound.arguments.get("hooks") or ())
                session_hook = as_session_hook(hook, hooks)
                if session_hook is not None:
                    bound.arguments["hooks"] = [*hooks, session_hook]
                    args, kwargs = bound.args, bound.kwargs
            except Exception as exc:  # never stand between the script and TensorFlow
                hook.warn_once("attach-session", "smdebug: could not attach the hook to the session: %s", exc)
        return function(*args, **kwargs)

    return call


def as_session_hook(hook, hooks):
    """The activated hook as a SessionHook (the same object), or None when the session has a SessionHook
    already or the hook saved Keras steps."""
    from smdebug_tf.session import SessionHook

    if any(isinstance(h, SessionHook) for h in hooks):
        return None
    if not isinstance(hook, SessionHook):
        if hook.step >= 0:
            hook.warn_once(
                "session-after-keras",
                "smdebug: the hook saved Keras steps already; this MonitoredTrainingSession runs without it",
            )
            return None
        hook.__class__ = SessionHook  # both keep their state in the instance dict
        hook.setup_graph()
    return hook


def session_hook_asked() -> None:
    """``smd.get_hook(hook_type="session")``: the activated hook, if no step used it yet, becomes the
    SessionHook asked for (as a MonitoredTrainingSession makes it), so no second hook of the same
    configuration is made (it would find the run's out_dir taken)."""
    from smdebug.plugin import get_hook

    hook = _state["hook"]
    if hook is not None and hook is get_hook() and not hook.closed and hook.step < 0:
        as_session_hook(hook, [])


def _initializing(module) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def patch(module) -> None:
    """Wrap the TensorFlow trainer's fit/evaluate/predict: each adds the active hook to its callbacks."""
    if _state["patched"]:
        return
    keras = sys.modules.get("keras")
    if keras is not None and not _initializing(keras):
        upgrade()  # else at the first fit/evaluate/predict, when Keras is complete
    patch_sessions()
    trainer = getattr(module, "TensorFlowTrainer", None)
    if trainer is None:
        logger.warning("smdebug: this Keras has no TensorFlowTrainer; the hook is not attached to fit")
        return
    for name in _METHODS:
        setattr(trainer, name, _with_hook(getattr(trainer, name)))
    _state["patched"] = True


def upgrade():
    """Make the activated TFHook a KerasHook: the same object, now also a keras.callbacks.Callback."""
    hook = _state["hook"]
    from smdebug_tf.hook import KerasHook
    from smdebug_tf.session import SessionHook

    if hook is not None and not isinstance(hook, (KerasHook, SessionHook)):
        hook.__class__ = KerasHook  # both keep their state in the instance dict
        import keras

        keras.callbacks.Callback.__init__(hook)


def _with_hook(method):
    signature = inspect.signature(method)

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        hook = _state["hook"]
        if hook is not None and not hook.closed and not _is_session_hook(hook):
            try:
                upgrade()
                bound = signature.bind(self, *args, **kwargs)
                callbacks = bound.arguments.get("callbacks")
                added = _add(callbacks, hook)
                if added is not callbacks:
                    bound.arguments["callbacks"] = added
                    args, kwargs = bound.args[1:], bound.kwargs
            except Exception as exc:  # never stand between the script and Keras
                hook.warn_once("attach", "smdebug: could not attach the hook to %s: %s", method.__name__, exc)
        return method(self, *args, **kwargs)

    return call


def _is_session_hook(hook) -> bool:
    session = sys.modules.get("smdebug_tf.session")
    return session is not None and isinstance(hook, session.SessionHook)


def _add(callbacks, hook):
    import keras

    if isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks  # fit's own list, handed to evaluate for validation: the hook is in it already
    if callbacks is None:
        return [hook]
    items = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    if any(item is hook for item in items):
        return callbacks
    from smdebug_tf.tfhook import TFHook

    if any(isinstance(item, TFHook) for item in items):
        # the script passes a hook of its own: it alone is used (two would each swap in their own step
        # function, and the steps one of them saves would be lost to the other)
        logger.info("smdebug: fit has the script's own hook; the hook from the configuration is not added")
        return callbacks
    return [*items, hook]


class _TrainerWatcher(importlib.abc.MetaPathFinder):
    """Finds nothing: patches the trainer once its module has executed, then steps aside."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TRAINER_MODULE:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec

        def exec_then_patch(module):
            exec_module(module)
            try:
                patch(module)
            except Exception as exc:
                logger.warning("smdebug: could not attach the hook to Keras: %s: %s", type(exc).__name__, exc)

        try:
            loader.exec_module = exec_then_patch
        except AttributeError:
            return spec
        return spec
