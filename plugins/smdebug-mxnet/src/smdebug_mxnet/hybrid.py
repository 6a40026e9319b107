"""Layer inputs/outputs inside hybridized Gluon blocks.

After ``hybridize()`` a block runs as one cached graph and its children's forward hooks no longer see
NDArrays. They still run once, with Symbols, while MXNet builds that graph: that pass tells which graph
node output is which child's input or output. MXNet's op hook (``register_op_hook``) then hands each node
output over as the cached graph runs, and it is saved under the child's name (``dense0_output_0``), as an
unhybridized block's would be. A child input that is one of the graph's own inputs (MXNet names them
``data`` or ``data<i>``) is saved from the arguments of the hybridized block's call.

A block called more than once in a step is numbered per call, as without ``hybridize()``. Inside one graph
its nodes share one name (MXNet names a block's operator ``<block>_fwd`` at every call): each traced node
is tagged with an attribute, and the graph's node order, which is the order the op hook reports them in,
tells which call each report is. A hybridized block called again in the step reports the same nodes again:
its names are numbered on, one call's count further.
"""

from __future__ import annotations

import ctypes
import functools
import json
import warnings
import weakref

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


TAG = "__smdebug_tap__"  # the attribute a traced graph node carries (MXNet keeps "__*__" attributes)


class Graph:
    """What one hybridized block's cached graph holds: tensor names as (prefix, index) of its first call."""

    def __init__(self, per_call: dict[str, int]):
        self.nodes: dict[str, list[list[tuple[str, int]]]] = {}  # reported name -> per occurrence -> names
        self.positions: dict[int, list[tuple[str, int]]] = {}  # graph input position -> names
        self.per_call = per_call  # prefix -> how many of its numbers one call takes
        self.names: set[tuple[str, int]] = set()  # every name of a call (graph inputs and node outputs)
        self.parameters: list[tuple[mx.gluon.Parameter, list[tuple[str, int]]]] = []  # a parameter, its names

    def name(self, prefix: str, index: int, call: int) -> str:
        return f"{prefix}{index + call * self.per_call.get(prefix, 0)}"


def _is_variable(sym) -> bool:
    """Whether a one-node Symbol is a variable (a graph input or a parameter), not an operator."""
    try:
        return json.loads(sym.tojson())["nodes"][-1]["op"] == "null"
    except Exception:  # (as before: a node without inputs taken for a graph input)
        return True


class HybridTaps:
    """Maps graph node outputs to child block tensor names, and saves them when the op hook reports them."""

    def __init__(self, hook):
        self.hook = hook
        self.graphs: dict[int, Graph] = {}  # id(hybridized block) -> its graph's names
        # while a graph builds: tagged nodes' outputs and graph inputs (variables) -> names, blocks seen
        self.pending_nodes: dict[str, dict[str, list[tuple[str, int]]]] = {}  # tag -> node output -> names
        self.pending_inputs: dict[str, list[tuple[str, int]]] = {}
        self.traced: set[int] = set()
        self.counters: dict[str, int] = {}
        self.serial = 0
        # the current step's reports per (block, reported name) and calls per block, and the names saved
        # during the current call of a hybridized block
        self.step_of_counts = None
        self.reports: dict[tuple[int, str], int] = {}
        self.calls: dict[int, int] = {}
        self.saved: set[str] = set()
        self.attached: set[int] = set()

    def attach(self, block) -> None:
        """Have MXNet report the graph node outputs of ``block`` and of the blocks inside it, each
        hybridized block's to a callback that knows it (MXNet's register_op_hook gives a block's callback
        to its direct children only: each block gets its own, parents first)."""
        if id(block) in self.attached:
            return
        self.attached.add(id(block))
        # MXNet 1.9 warns on every cached call that op hooks are "experimental with static_alloc", even
        # when static_alloc is off (it tests tuples for truth); the warning would only mislead.
        warnings.filterwarnings("ignore", message="register_op_hook is experimental", category=UserWarning)
        blocks: list = []
        block.apply(blocks.append)  # children before their parent
        for each in reversed(blocks):
            if isinstance(each, mx.gluon.HybridBlock):
                each.register_op_hook(
                    functools.partial(self.on_node_output, weakref.ref(each)), monitor_all=False
                )

    @property
    def mapped(self) -> bool:
        return bool(self.graphs or self.traced)

    def record(self, block, inputs, outputs) -> None:
        """A child's forward hook during graph building: remember which node outputs are its tensors."""
        self.traced.add(id(block))
        for suffix, value in ((INPUT_SUFFIX, inputs), (OUTPUT_SUFFIX, outputs)):
            prefix = block.name + suffix
            for sym in symbols_in(value):
                outputs_of = sym.list_outputs()
                for i, node_output in enumerate(outputs_of):
                    index = self.counters.get(prefix, 0)
                    self.counters[prefix] = index + 1
                    part = sym[i] if len(outputs_of) > 1 else sym  # (a grouped Symbol holds several nodes)
                    if part.get_children() is None and _is_variable(part):
                        # a graph input or a parameter, which the op hook never reports (an operator
                        # without inputs, such as F.zeros, is a node it reports)
                        self.pending_inputs.setdefault(node_output, []).append((prefix, index))
                        continue
                    tag = part.attr(TAG)
                    if tag is None:
                        self.serial += 1
                        tag = str(self.serial)
                        part._set_attr(**{TAG: tag})
                    self.pending_nodes.setdefault(tag, {}).setdefault(node_output, []).append((prefix, index))

    def called(self, block, inputs) -> None:
        """A block's forward hook with NDArrays. The first one after a graph was built and never run (its
        operators all fused) tells whose graph it was: a block outside the graph is the hybridized block
        that ran it; a block inside it means the graph only inferred shapes (deferred initialisation) for
        blocks that run one by one."""
        if self.traced:
            if id(block) not in self.traced:
                self.bind(block)
            else:
                self.forget_trace()
        graph = self.graphs.get(id(block))
        if graph is None:
            return
        self.count_for_step()
        call = self.calls.get(id(block), 0)
        self.calls[id(block)] = call + 1
        if not self.hook.anything_due():
            self.saved.clear()
            return
        for position, value in enumerate(_ndarrays(inputs)):
            for prefix, index in graph.positions.get(position, ()):
                name = graph.name(prefix, index, call)
                self.hook.defer(name, value)
                self.saved.add(name)
        for param, found in graph.parameters:  # a parameter a child is given (or returns): its value now
            for prefix, index in found:
                name = graph.name(prefix, index, call)
                if self.hook.is_due(name):
                    self.hook.defer(name, param.data(param.list_ctx()[0]))
                    self.saved.add(name)
        # fused operators (static_alloc, MKLDNN subgraphs) remove graph nodes the op hook would report
        missing = sorted(
            name
            for prefix, index in graph.names
            if (name := graph.name(prefix, index, call)) not in self.saved and self.hook.is_due(name)
        )
        if missing:
            self.hook.warn_once(
                f"unreported:{block.name}",
                "smdebug: MXNet did not report %s inside hybridized block %s (its operators were fused, "
                "e.g. by static_alloc): not saved",
                ", ".join(missing),
                block.name,
            )
        self.saved.clear()

    def forget_trace(self) -> None:
        self.pending_nodes, self.pending_inputs, self.traced = {}, {}, set()
        self.counters.clear()

    def bind(self, block) -> None:
        """The graph just traced is ``block``'s: its nodes in the order MXNet runs (and reports) them."""
        graph = Graph(dict(self.counters))
        occurrences: dict[str, int] = {}  # node name -> how often it is in the graph
        node_of: dict[str, str] = {}  # reported name -> node name
        for node, tag in self.node_names(block):
            occurrence = occurrences.get(node, 0)
            occurrences[node] = occurrence + 1
            for node_output, found in self.pending_nodes.get(tag, {}).items() if tag else ():
                graph.names.update(found)
                for key in reported_names(node_output):
                    node_of[key] = node
                    per_occurrence = graph.nodes.setdefault(key, [])
                    per_occurrence.extend([] for _ in range(occurrence + 1 - len(per_occurrence)))
                    per_occurrence[occurrence].extend(found)
        for key, per_occurrence in graph.nodes.items():  # (reported once per node of that name, per call)
            per_occurrence.extend([] for _ in range(occurrences[node_of[key]] - len(per_occurrence)))
        params = dict(block.collect_params().items()) if self.pending_inputs else {}
        for var, found in self.pending_inputs.items():
            # MXNet names a graph's inputs "data" (one input) or "data0", "data1"...; the other variables
            # are the block's parameters
            if var == "data" or (var.startswith("data") and var[4:].isdigit()):
                graph.positions[int(var[4:] or 0)] = found
            elif var in params:  # (ParameterDict.get would make one)
                graph.parameters.append((params[var], found))
            graph.names.update(found)
        self.graphs[id(block)] = graph
        self.forget_trace()

    def node_names(self, block) -> list[tuple[str, str | None]]:
        """(name, tag) of each operator node of ``block``'s cached graph, in its order; without a graph to
        read, the tagged nodes traced, each once."""
        cached = getattr(block, "_cached_graph", None)
        if cached:
            with self.hook.guard("read a hybridized block's graph"):
                nodes = json.loads(cached[1].tojson())["nodes"]
                return [(n["name"], (n.get("attrs") or {}).get(TAG)) for n in nodes if n["op"] != "null"]
        found = []
        for tag, outputs in self.pending_nodes.items():
            node_output = next(iter(outputs))
            found.append((node_output.rpartition("_output")[0] or node_output, tag))
        return found

    def count_for_step(self) -> None:
        step = (self.hook.step, self.hook.mode)
        if step != self.step_of_counts:
            self.step_of_counts = step
            self.reports.clear()
            self.calls.clear()

    def on_node_output(self, ref, node_output, op_name, handle) -> None:
        # MXNet hands over a new NDArray handle: wrap it so that it is freed, even when it is not saved.
        value = NDArray(ctypes.cast(handle, mx.base.NDArrayHandle), writable=False)
        node_output = node_output.decode() if isinstance(node_output, bytes) else node_output
        health = self.hook.health_part
        if health is not None:  # (health=True keeps the step's block outputs: smdebug_mxnet.health)
            health.node_output(node_output, value)
        block = ref()
        if block is None:
            return
        if self.traced:  # a graph's first run comes right after it was built
            with self.hook.guard("map a hybridized block's tensors"):
                self.bind(block)
        graph = self.graphs.get(id(block))
        occurrences = graph.nodes.get(node_output) if graph is not None else None
        if not occurrences or not self.hook.anything_due():
            return
        with self.hook.guard("save a hybridized layer's tensors"):
            self.count_for_step()
            key = (id(block), node_output)
            seen = self.reports.get(key, 0)
            self.reports[key] = seen + 1
            call, occurrence = divmod(seen, len(occurrences))
            for prefix, index in occurrences[occurrence]:
                name = graph.name(prefix, index, call)
                self.hook.defer(name, value)
                self.saved.add(name)
