"""The plugin host: smdebug's one pluggy PluginManager, what it loaded, and a typed call per hook.

``PluginHost`` owns the PluginManager (built on first use: the core's defaults, then every entry point
of the ``smdebug`` group, each validated and isolated) and its caches. The module-level functions are
its default instance's (``host``), so the rest of the core calls ``plugins.to_numpy(value)`` and never
pluggy's hook relay.

Isolation: an implementation that raises is logged once per process (naming the plugin and the hook)
and skipped, whichever way it is called: an observation hook still reaches the other plugins, and a
capture, reduction or storage hook is answered by the next implementation, finally the core's own
(``smdebug.defaults``). Validation: a plugin implementing a hook that does not exist (a misspelling) is
refused at registration, naming the closest real hook.

Calls go through pluggy (its hook wrappers, ``add_hookcall_monitoring`` and tracing all apply), except
on the per-step path: a hook that has no wrapper, while nothing monitors the calls, has its
implementations called by a plain loop over a cached list, which costs a fraction of pluggy's call.
``SMDEBUG_TRACE_PLUGINS=1`` logs every hook call to the ``smdebug`` logger through pluggy's tracing.

The host's parts: ``smdebug.plugin_host`` (the PluginManager, loading and validating), ``smdebug.plugin_calls``
(the typed calls), ``smdebug.plugin_isolation`` (a failing implementation reported and skipped).
"""

from __future__ import annotations

import pluggy

from smdebug.hookspecs import Framework
from smdebug.plugin_host import (
    DEFAULT_PLUGINS,
    ENTRY_POINT_GROUP,
    PROJECT,
    RAISING_HOOKS,
    PluginHost,
    PluginInfo,
)

__all__ = [
    "DEFAULT_PLUGINS",
    "ENTRY_POINT_GROUP",
    "KNOWN_ALIASES",
    "PROJECT",
    "RAISING_HOOKS",
    "Framework",
    "PluginHost",
    "PluginInfo",
    "activate",
    "add_commands",
    "declared_by",
    "describe",
    "frameworks",
    "get_plugin_manager",
    "hook_closed",
    "host",
    "open_store",
    "reduce",
    "reductions",
    "reset",
    "rules",
    "step_begin",
    "step_end",
    "tensor_saved",
    "to_host",
    "to_numpy",
]

# Where the plugins for the aliases smdebug 1.0 users know live in this project.
KNOWN_ALIASES = {
    "pytorch": "smdebug-torch",
    "tensorflow": "smdebug-tf",
    "mxnet": "smdebug-mxnet",
    "xgboost": "smdebug-xgb",
}

# -- the default host, and its methods as this module's functions (what the core calls) ------------
host = PluginHost()
load_errors = host.load_errors


def get_plugin_manager() -> pluggy.PluginManager:
    """The default host's PluginManager (built on first use)."""
    return host.pm


reset = host.reset
describe = host.describe
frameworks = host.frameworks
declared_by = host.declared_by
activate = host.activate
to_numpy = host.to_numpy
host_view = host.host_view
reduce = host.reduce
reductions = host.reductions
to_host = host.to_host
open_store = host.open_store
step_begin = host.step_begin
step_end = host.step_end
tensor_saved = host.tensor_saved
listens_to_tensors = host.listens_to_tensors
listens_to_idle_steps = host.listens_to_idle_steps
hook_closed = host.hook_closed
add_commands = host.add_commands
rules = host.rules
