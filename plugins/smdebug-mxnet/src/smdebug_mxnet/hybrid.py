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


def _symbols(value):
    if isinstance(value, mx.sym.Symbol):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _symbols(item)


def _ndarrays(value):
    if isinstance(value, NDArray):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _ndarrays(item)


class HybridTaps:
    """Maps graph node outputs to child block tensor names, and saves them when the op hook reports them."""

    def __init__(self, hook):
        self.hook = hook
        self.by_node: dict[str, list[str]] = {}  # graph node output -> tensor names ("dense0_output_0")
        self.graph_inputs: dict[str, list[str]] = {}  # graph input variable -> names, while a graph builds
        self.by_block: dict[int, dict[int, list[str]]] = {}  # id(hybridized block) -> arg position -> names
        self.counters: dict[str, int] = {}  # numbering of one graph-building pass
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
        return bool(self.by_node or self.by_block)

    def record(self, block, inputs, outputs) -> None:
        """A child's forward hook during graph building: remember which node outputs are its tensors."""
        for suffix, value in ((INPUT_SUFFIX, inputs), (OUTPUT_SUFFIX, outputs)):
            prefix = block.name + suffix
            for sym in _symbols(value):
                variable = sym.get_children() is None
                for node_output in sym.list_outputs():
                    index = self.counters.get(prefix, 0)
                    self.counters[prefix] = index + 1
                    table = self.graph_inputs if variable else self.by_node
                    names = table.setdefault(node_output, [])
                    if f"{prefix}{index}" not in names:
                        names.append(f"{prefix}{index}")

    def called(self, block, inputs) -> None:
        """A block's forward hook with NDArrays: a graph built during this call belongs to it."""
        self.counters.clear()
        if self.graph_inputs:
            positions = {}
            for var, names in self.graph_inputs.items():
                position = 0 if var == "data" else int(var[4:]) if var[4:].isdigit() else None
                if var.startswith("data") and position is not None:
                    positions[position] = names
            self.by_block[id(block)] = positions
            self.graph_inputs = {}
        positions = self.by_block.get(id(block))
        if positions and self.hook.anything_due():
            for position, value in enumerate(_ndarrays(inputs)):
                for name in positions.get(position, ()):
                    self.hook.save_for_step(name, value)

    def on_node_output(self, node_output, op_name, handle) -> None:
        # MXNet hands over a new NDArray handle: wrap it so that it is freed, even when it is not saved.
        value = NDArray(ctypes.cast(handle, mx.base.NDArrayHandle), writable=False)
        names = self.by_node.get(node_output.decode() if isinstance(node_output, bytes) else node_output)
        if not names or not self.hook.anything_due():
            return
        with self.hook.guard("save a hybridized layer's tensors"):
            for name in names:
                self.hook.save_for_step(name, value)
