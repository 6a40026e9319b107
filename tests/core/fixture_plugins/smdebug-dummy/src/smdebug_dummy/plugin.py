"""Entry-point module: only hook implementations, nothing heavy at import time."""

import builtins

from smdebug.hookspecs import hookimpl
from smdebug.plugins import Framework

CALLS = []


@hookimpl
def smdebug_framework():
    return Framework(
        alias="dummy", package="smdebug_dummy", import_names=("json",), distribution="numpy", supported=">=1"
    )


@hookimpl
def smdebug_to_numpy(value):
    from smdebug_dummy.hook import DummyTensor, to_numpy

    return to_numpy(value) if isinstance(value, DummyTensor) else None


@hookimpl
def smdebug_reduce(value, reduction, abs):
    from smdebug_dummy.hook import DummyTensor

    if not isinstance(value, DummyTensor) or reduction != "max":
        return None
    value.reduced_here += 1
    return float(max(builtins.abs(v) if abs else v for v in value.values))


@hookimpl
def smdebug_activate(framework, module):
    if framework.alias == "dummy":
        CALLS.append(("activate", module.__name__))
        return "activated"
    return None


@hookimpl
def smdebug_step_begin(hook, mode, step, mode_step):
    CALLS.append(("step_begin", mode.name, step, mode_step))


@hookimpl
def smdebug_step_end(hook, mode, step, mode_step):
    CALLS.append(("step_end", mode.name, step, mode_step))


@hookimpl
def smdebug_tensor_saved(hook, name, value, step, mode):
    CALLS.append(("tensor_saved", name, step))


@hookimpl
def smdebug_hook_closed(hook):
    CALLS.append(("closed", hook.out_dir))


@hookimpl
def smdebug_open_store(uri):
    if uri.startswith("dummy://"):
        from smdebug.store import Store

        return Store("memory://dummy-store/" + uri[len("dummy://") :])
    return None


@hookimpl
def smdebug_add_commands(subparsers):
    parser = subparsers.add_parser("dummy-hello", help="say hello (a subcommand added by a plugin)")
    parser.add_argument("name")
    parser.set_defaults(func=lambda args: print(f"hello {args.name}") or 0)


@hookimpl
def smdebug_rules():
    from smdebug.rules.rule import Rule

    class AlwaysFires(Rule):
        def invoke_at_step(self, step):
            return True

    return {"always_fires": AlwaysFires}
