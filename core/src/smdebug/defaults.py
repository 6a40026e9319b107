"""The core's own implementations of its hooks: numpy capture and reductions, the fsspec store, the
command line's subcommands, the built-in rules, and TensorBoard export for hooks that ask for it (the
in-training rule runner is the core's other default plugin, smdebug.rules.runner).

Plugins load as soon as a configured process starts (activation), so this module imports what each
hook needs only when the hook is first called.
"""

from __future__ import annotations

import importlib
import numbers

from smdebug.hookspecs import hookimpl


@hookimpl(trylast=True)
def smdebug_to_numpy(value):
    import numpy as np

    # A copy: the writer encodes it later, off the training thread, and the caller may change it meanwhile.
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, (np.generic, numbers.Number, list, tuple)) or hasattr(value, "__array__"):
        try:
            return np.array(value)
        except Exception as exc:  # e.g. a torch DTensor: the run's record names what could not be saved
            from smdebug.exceptions import SMDebugTypeError

            raise SMDebugTypeError(
                f"cannot convert a {type(value).__name__} to a numpy array: {exc}"
            ) from exc
    return None


@hookimpl(trylast=True)
def smdebug_host_view(value):
    import numpy as np

    return value if type(value) is np.ndarray else None


@hookimpl(trylast=True)
def smdebug_reduce(value, reduction, abs):
    import numpy as np

    from smdebug.reductions import numpy_reduction

    if isinstance(value, (np.ndarray, np.generic, numbers.Number)):
        return numpy_reduction(value, reduction, abs)
    from smdebug import plugins

    array = plugins.to_numpy(value)
    return None if array is None else numpy_reduction(array, reduction, abs)


@hookimpl(trylast=True)
def smdebug_to_host(results):
    import numpy as np

    from smdebug import plugins

    # results of plugins that answer smdebug_reductions but not this: one conversion each
    rows = [r if isinstance(r, np.ndarray) else plugins.to_numpy(r) for r in results]
    for result, row in zip(results, rows):
        if row is None:
            raise TypeError(f"no plugin converts a {type(result).__name__} result to numpy")
    return rows


@hookimpl(trylast=True)
def smdebug_open_store(uri):
    from smdebug.store import Store

    return Store(uri)


@hookimpl
def smdebug_add_commands(subparsers):
    from smdebug.cli import COMMAND_MODULES

    for name in COMMAND_MODULES:
        importlib.import_module(name).add_command(subparsers)


# -- TensorBoard export of hooks made with export_tensorboard / tensorboard_dir (smdebug.tensorboard) --
@hookimpl
def smdebug_tensor_saved(hook, name, value, step, mode):
    if getattr(hook, "tensorboard_dir", None) is not None:
        from smdebug import tensorboard

        tensorboard.tensor_saved(hook, name, value, step, mode)


@hookimpl
def smdebug_step_end(hook, mode, step, mode_step):
    if getattr(hook, "tensorboard_dir", None) is not None:
        from smdebug import tensorboard

        tensorboard.step_end(hook)


# -- rules -------------------------------------------------------------------------------------------
@hookimpl(tryfirst=True)  # first: a plugin's rule cannot take the name of one of the core's
def smdebug_rules():
    from smdebug.rules.builtin import CORE_RULES

    return dict(CORE_RULES)


@hookimpl
def smdebug_hook_closed(hook):
    if getattr(hook, "tensorboard_dir", None) is not None:
        from smdebug import tensorboard

        tensorboard.hook_closed(hook)
