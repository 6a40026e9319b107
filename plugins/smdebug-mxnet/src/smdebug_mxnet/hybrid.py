"""Layer inputs/outputs inside hybridized Gluon blocks.

After ``hybridize()`` a block runs as one cached graph and its children's forward hooks no longer see
NDArrays. They still run once, with Symbols, while MXNet builds that graph: that pass tells which graph
node output is which child's input or output. MXNet's op hook (``register_op_hook``) then hands each node
output over as the cached graph runs, and it is saved under the child's name (``dense0_output_0``), as an
unhybridized block's would be. A child input that is one of the graph's own inputs (MXNet names them
``data`` or ``data<i>``) is saved from the arguments of the hybridized block's call.
"""

from __future__ import annotations

import ctypes
import warnings

import mxnet as mx
from mxnet.ndarray import NDArray

from smdebug_mxnet.collection import INPUT_SUFFIX, OUTPUT_SUFFIX


def symbols_in(value):
    if isinstance(value, mx.sym.Symbol):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from symbols_in(item)


def _ndarrays(value):
    if isinstance(value, NDArray):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _ndarrays(item)


def reported_names(node_output: str) -> tuple[str, ...]:
    """The names MXNet's op hook may report a graph node output under: the Symbol's ("<node>_output", or
    "<node>_output<i>" for several outputs) and, for an operator without output names (exp, tanh,
    broadcast_mul...), "<node>_<i>"."""
    node, _, index = node_output.rpartition("_output")
    if node and (not index or index.isdigit()):
        return node_output, f"{node}_{index or 0}"
    return (node_output,)


class HybridTaps:
    """Maps graph node outputs to child block tensor names, and saves them when the op hook reports them."""

    def __init__(self, hook):
        self.hook = hook
        self.by_node: dict[str, list[str]] = {}  # graph node output -> tensor names ("dense0_output_0")
        self.by_block: dict[int, dict[int, list[str]]] = {}  # id(hybridized block) -> arg position -> names
        self.names_of: dict[int, set[str]] = {}  # id(hybridized block) -> every name its graph maps
        # while a graph builds: node outputs and graph inputs (variables) -> names, blocks seen, numbering
        self.pending_nodes: dict[str, list[str]] = {}
        self.pending_inputs: dict[str, list[str]] = {}
        self.traced: set[int] = set()
        self.counters: dict[str, int] = {}
        self.saved: set[str] = set()  # names saved during the current call of a hybridized block
        self.attached: set[int] = set()

    def attach(self, block) -> None:
        """Have MXNet report the graph node outputs of ``block`` (and of hybridized blocks inside it)."""
        if id(block) in self.attached:
            return
        self.attached.add(id(block))
        # MXNet 1.9 warns on every cached call that op hooks are "experimental with static_alloc", even
        # when static_alloc is off (it tests tuples for truth); the warning would only mislead.
        warnings.filterwarnings("ignore", message="register_op_hook is experimental", category=UserWarning)
        block.register_op_hook(self.on_node_output, monitor_all=False)

    @property
    def mapped(self) -> bool:
        return bool(self.by_node or self.by_block or self.traced)

    def record(self, block, inputs, outputs) -> None:
        """A child's forward hook during graph building: remember which node outputs are its tensors."""
        self.traced.add(id(block))
        for suffix, value in ((INPUT_SUFFIX, inputs), (OUTPUT_SUFFIX, outputs)):
            prefix = block.name + suffix
            for sym in symbols_in(value):
                table = self.pending_inputs if sym.get_children() is None else self.pending_nodes
                for node_output in sym.list_outputs():
                    index = self.counters.get(prefix, 0)
                    self.counters[prefix] = index + 1
                    # (a graph's inputs are variables, which the op hook never reports)
                    keys = reported_names(node_output) if table is self.pending_nodes else (node_output,)
                    for key in keys:
                        table.setdefault(key, []).append(f"{prefix}{index}")

    def called(self, block, inputs) -> None:
        """A block's forward hook with NDArrays. The first one after a graph was built tells whose graph it
        was: a block outside the graph is the hybridized block that will run it; a block inside it means
        the graph only inferred shapes (deferred initialisation) for blocks that run one by one."""
        self.counters.clear()
        if self.traced:
            if id(block) not in self.traced:
                self.bind(block)
            self.pending_nodes, self.pending_inputs, self.traced = {}, {}, set()
        positions = self.by_block.get(id(block))
        if positions and self.hook.anything_due():
            for position, value in enumerate(_ndarrays(inputs)):
                for name in positions.get(position, ()):
                    self.hook.defer(name, value)
                    self.saved.add(name)
        names = self.names_of.get(id(block))
        if names and self.hook.anything_due():
            # fused operators (static_alloc, MKLDNN subgraphs) remove graph nodes the op hook would report
            missing = sorted(n for n in names if n not in self.saved and self.hook.is_due(n))
            if missing:
                self.hook.warn_once(
                    f"unreported:{block.name}",
                    "smdebug: MXNet did not report %s inside hybridized block %s (its operators were fused, "
                    "e.g. by static_alloc): not saved",
                    ", ".join(missing),
                    block.name,
                )
        self.saved.clear()

    def bind(self, block) -> None:
        names: set[str] = set()
        for node_output, found in self.pending_nodes.items():
            known = self.by_node.setdefault(node_output, [])
            known.extend(n for n in found if n not in known)
            names.update(found)
        positions: dict[int, list[str]] = {}
        for var, found in self.pending_inputs.items():
            # MXNet names a graph's inputs "data" (one input) or "data0", "data1"...
            if var == "data" or (var.startswith("data") and var[4:].isdigit()):
                positions[int(var[4:] or 0)] = found
                names.update(found)
        self.by_block[id(block)] = positions
        self.names_of[id(block)] = names

    def on_node_output(self, node_output, op_name, handle) -> None:
        # MXNet hands over a new NDArray handle: wrap it so that it is freed, even when it is not saved.
        value = NDArray(ctypes.cast(handle, mx.base.NDArrayHandle), writable=False)
        node_output = node_output.decode() if isinstance(node_output, bytes) else node_output
        health = self.hook.health_part
        if health is not None:  # (health=True keeps the step's block outputs: smdebug_mxnet.health)
            health.node_output(node_output, value)
        # a graph's first run comes right after it was built, before its block's forward hook binds it
        names = self.by_node.get(node_output) or self.pending_nodes.get(node_output)
        if not names or not self.hook.anything_due():
            return
        with self.hook.guard("save a hybridized layer's tensors"):
            for name in names:
                self.hook.defer(name, value)
                self.saved.add(name)
