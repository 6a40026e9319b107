"""A due step's tensors as the compiled step hands them to the host, in a few buffers.

Inside the instrumented step (smdebug_tf.capture) each captured tensor that is due gets its reductions
computed by TF ops in the same graph, all of them stacked into one vector per result dtype, and its raw
value (when that is saved) flattened into one buffer per dtype. The step then returns a handful of
tensors instead of one per tensor and reduction, and the host takes each buffer over once (one transfer
per buffer, numpy views for the tensors in it: nothing is copied again on the training thread).

Which tensors, and what of each, is the hook's plan (``plan_of(name) -> (pairs, raw)`` or None when the
tensor is not due), asked while the step is traced. Where the buffers hold what is a :class:`Layout`,
known on the host by the key of the dict the step returns (dict keys survive tf.function and XLA, which
turn any other Python value into a tensor).
"""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from smdebug_tf.tensors import UPCAST, Captured, every_pair, to_numpy


class Entry(NamedTuple):
    name: str
    raw: tuple | None  # (buffer, offset, size, shape): its raw value; offset None: the whole buffer
    reduced: tuple | None  # (buffer, offset): its reductions, one element per pair
    pairs: tuple  # the (reduction, abs) pairs computed in the graph
    sized: bool  # the reductions are followed by the element count (a shape not known when traced)
    host: bool  # reduced by the core on the host (complex, text): handed over as a numpy array
    empty: bool  # no elements (known when traced): no reductions


class Layout(NamedTuple):
    entries: tuple[Entry, ...]
    text: tuple[bool, ...]  # per buffer: converted with to_numpy (text) rather than viewed


_lock = threading.Lock()  # MirroredStrategy traces its replicas on threads of their own
_ids: dict[Layout, str] = {}
_layouts: dict[str, Layout] = {}


def _key(layout: Layout) -> str:
    with _lock:
        key = _ids.get(layout)
        if key is None:
            key = _ids[layout] = f"smdebug-layout-{len(_ids)}"
            _layouts[key] = layout
        return key


def reducible_in_graph(t: tf.Tensor) -> bool:
    return not (t.dtype.is_complex or t.dtype == tf.string)


def reduction_vector(t: tf.Tensor, pairs: tuple) -> tuple[tf.Tensor | None, bool, bool]:
    """``(vector, sized, empty)``: the ops computing every pair of ``t`` in one vector (None when there
    are no pairs, or ``t`` is empty, which the core says it cannot reduce), followed by ``t``'s element
    count when its shape is not known while tracing (``sized``: whether it is empty is known only when
    the step runs); ``empty`` when it is known to have no elements."""
    static = t.shape.is_fully_defined()
    empty = static and t.shape.num_elements() == 0
    if not pairs or empty:
        return None, False, empty
    vector = every_pair(t, pairs)
    if static:
        return vector, False, False
    return tf.concat([vector, tf.cast(tf.reshape(tf.size(t), [1]), vector.dtype)], 0), True, False


def raw_value(t: tf.Tensor) -> tf.Tensor:
    """The tensor as the host receives it: float32 for the dtypes numpy cannot hold."""
    return tf.cast(t, tf.float32) if t.dtype in UPCAST else t


def pack(tensors: dict[str, tf.Tensor], plan_of) -> dict[str, tuple]:
    """``{layout key: buffers}`` for the due tensors among ``tensors`` (called while tracing)."""
    buffers: list = []
    text: list[bool] = []
    raw_groups: dict[tf.DType, list] = {}  # dtype -> [(entry index, flat tensor, size, shape)]
    red_groups: dict[tf.DType, list] = {}  # result dtype -> [(entry index, vector)]
    entries: list[dict] = []
    for name, t in tensors.items():
        plan = plan_of(name)
        if plan is None:
            continue
        pairs, raw = plan
        entry = dict(name=name, raw=None, reduced=None, pairs=(), sized=False, host=False, empty=False)
        if not reducible_in_graph(t):  # the core reduces these on the host: always hand over the value
            entry["host"] = True
            entry["raw"] = (len(buffers), None, None, None)
            buffers.append(t)
            text.append(t.dtype == tf.string)
            entries.append(entry)
            continue
        static = t.shape.is_fully_defined()
        vector, entry["sized"], entry["empty"] = reduction_vector(t, pairs)
        if vector is not None:
            entry["pairs"] = pairs
            red_groups.setdefault(vector.dtype, []).append((len(entries), vector))
        if raw:
            value = raw_value(t)
            if static:
                size = t.shape.num_elements()
                raw_groups.setdefault(value.dtype, []).append(
                    (len(entries), tf.reshape(value, [-1]), size, tuple(t.shape))
                )
            else:  # a buffer of its own
                entry["raw"] = (len(buffers), None, None, None)
                buffers.append(value)
                text.append(False)
        entries.append(entry)
    for members in raw_groups.values():
        offset = 0
        for index, _, size, shape in members:
            entries[index]["raw"] = (len(buffers), offset, size, shape)
            offset += size
        flat = [m[1] for m in members]
        buffers.append(flat[0] if len(flat) == 1 else tf.concat(flat, 0))
        text.append(False)
    for members in red_groups.values():
        offset = 0
        for index, vector in members:
            entries[index]["reduced"] = (len(buffers), offset)
            offset += vector.shape[0]
        vectors = [m[1] for m in members]
        buffers.append(vectors[0] if len(vectors) == 1 else tf.concat(vectors, 0))
        text.append(False)
    layout = Layout(tuple(Entry(**e) for e in entries), tuple(text))
    return {_key(layout): tuple(buffers)}


def unpack(packed: dict[str, tuple]) -> list[list[tuple[str, object]]]:
    """Per replica, ``(name, value)`` of the step's due tensors: a :class:`Captured`, or a numpy array for
    the values the core reduces itself. ``packed``'s buffers hold one tensor per replica each."""
    ((key, buffers),) = packed.items()
    layout = _layouts[key]
    replicas = len(buffers[0]) if buffers else 1
    out = []
    for r in range(replicas):
        # the one transfer of each buffer (np.asarray takes the host buffer as it is, without a copy)
        arrays = [to_numpy(b[r]) if text else np.asarray(b[r]) for b, text in zip(buffers, layout.text)]
        values = []
        for e in layout.entries:
            host = None
            if e.raw is not None:
                index, offset, size, shape = e.raw
                host = (
                    arrays[index] if offset is None else arrays[index][offset : offset + size].reshape(shape)
                )
            if e.host:
                values.append((e.name, host))
                continue
            row = None
            if e.reduced is not None:
                index, offset = e.reduced
                row = arrays[index][offset : offset + len(e.pairs) + e.sized]
            values.append((e.name, Captured.of(e.name, host, row, e.pairs, e.sized, e.empty)))
        out.append(values)
    return out
