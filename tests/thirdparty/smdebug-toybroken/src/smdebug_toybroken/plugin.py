"""An entry-point module that imports, but whose hook implementations raise."""

from smdebug.plugin import hookimpl


@hookimpl
def smdebug_framework():
    raise RuntimeError("toybroken cannot describe its framework")


@hookimpl(tryfirst=True)  # called before any other plugin's: the worst case
def smdebug_activate(framework, module):
    raise RuntimeError(f"toybroken fails while {framework.alias} activates")
