"""An entry-point module that imports, but whose hook implementations raise."""

from smdebug.plugin import hookimpl


@hookimpl
def smdebug_framework():
    raise RuntimeError("toybroken cannot describe its framework")


@hookimpl(tryfirst=True)  # called before any other plugin's: the worst case
def smdebug_to_numpy(value):
    raise RuntimeError("toybroken fails to convert a value")


@hookimpl
def smdebug_step_end(hook, mode, step, mode_step):
    raise RuntimeError(f"toybroken fails at the end of step {step}")
