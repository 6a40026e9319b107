"""An entry-point module with a misspelled hook: smdebug refuses the whole plugin when it loads."""

from smdebug.plugin import Framework, hookimpl


@hookimpl
def smdebug_framework():
    return Framework(alias="toytypo", package="smdebug_toybroken", import_names=("toytypo",))


@hookimpl
def smdebug_to_numpyy(value):  # the typo: smdebug_to_numpy
    return None
