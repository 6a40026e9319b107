"""Entry-point module: hook implementations only; toyml is not imported here."""

from __future__ import annotations

import sys

from smdebug.plugin import Framework, hookimpl

REDUCED_HERE: list[str] = []  # reductions toyml computed itself (the tests look)


def _is_toyml_array(value) -> bool:
    toyml = sys.modules.get("toyml")  # nothing can be a toyml value before toyml is imported
    return toyml is not None and isinstance(value, toyml.Array)


@hookimpl
def smdebug_framework():
    return Framework(
        alias="toyml",
        package="smdebug_toyml",
        import_names=("toyml",),
        distribution="toyml",
        supported=">=1.0,<2",
    )


@hookimpl
def smdebug_to_numpy(value):
    return value.data.copy() if _is_toyml_array(value) else None


@hookimpl
def smdebug_reduce(value, reduction, abs):
    if not _is_toyml_array(value) or reduction != "max":
        return None  # the core computes the others from smdebug_to_numpy's array
    REDUCED_HERE.append(reduction)
    return (value.abs() if abs else value).max()


@hookimpl
def smdebug_activate(framework, module):
    from smdebug_toyml.hook import Hook

    hook = Hook.create_from_json_file()
    if hook is not None:
        module.add_global_callback(hook)
    return hook
