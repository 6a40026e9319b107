"""TensorFlow values to host numpy arrays, and reductions computed with TF ops where the value lives."""

from __future__ import annotations

import sys

import numpy as np
import tensorflow as tf


class Captured:
    """A tensor of a due step, on the host: its raw value (a view into the step's buffer, or None when it
    is not saved) and its reductions computed in the step (``row``, in the order of ``pairs``; None when
    it is empty)."""

    __slots__ = ("name", "host", "row", "pairs", "empty")

    def __init__(self, name: str, host: np.ndarray | None, row: np.ndarray | None, pairs: tuple, empty: bool):
        self.name = name
        self.host = host
        self.row = row
        self.pairs = pairs
        self.empty = empty

    @classmethod
    def of(cls, name: str, host, row, pairs: tuple, sized: bool, empty: bool) -> Captured:
        """From what the step returned: ``row`` (``packing.reduction_vector``'s value) ends with the
        element count when ``sized``."""
        if row is not None and sized:
            empty = bool(row[-1] == 0)
            row = None if empty else row[:-1]
        return cls(name, host, row, pairs, empty)

    def to_numpy(self) -> np.ndarray:
        if self.host is None:
            raise ValueError(f"the step did not bring the raw value of {self.name} over")
        return self.host  # a view of the step's buffer, which nothing changes

    def reductions(self, pairs: list[tuple[str, bool]]) -> np.ndarray | None:
        """The requested pairs' results from the step's, or None when the step did not compute them all."""
        if self.row is None:
            return None
        if len(pairs) == len(self.pairs) and all(a == b for a, b in zip(pairs, self.pairs)):
            return self.row
        where = {pair: i for i, pair in enumerate(self.pairs)}
        try:
            return self.row[[where[(r, bool(a))] for r, a in pairs]]
        except KeyError:
            return None


_cached: list = []  # the types, once Keras (whose Variable is one of them) is imported


def _types() -> tuple[type, ...]:
    if _cached:
        return _cached[0]
    types = (Captured, tf.Tensor, tf.Variable, tf.IndexedSlices, tf.distribute.DistributedValues)
    keras = sys.modules.get("keras")
    if keras is None or not hasattr(keras, "Variable"):
        return types
    _cached.append((*types, keras.Variable))  # Keras 3 variables are neither tf.Variable nor tf.Tensor
    return _cached[0]


def is_tf_value(value) -> bool:
    return type(value) is Captured or isinstance(value, _types())


def as_tensor(value) -> tf.Tensor:
    """A plain (dense, eager) tensor holding the value; a distributed value gives its first replica's."""
    if isinstance(value, tf.distribute.DistributedValues):
        value = value.values[0]
    if isinstance(value, tf.IndexedSlices):
        return tf.convert_to_tensor(value)
    if isinstance(value, tf.Tensor):
        return value
    return tf.convert_to_tensor(value)  # tf.Variable, keras.Variable: their current value


def snapshot(value):
    """A variable's current value as a tensor (later updates do not change it: TF copies on write);
    anything else as it is. What the hook hands the core, which may convert it after the step."""
    if isinstance(value, tf.Tensor) or not is_tf_value(value):
        return value
    return as_tensor(value)


UPCAST = frozenset(
    d for d in (tf.bfloat16, *(getattr(tf.dtypes, n, None) for n in ("float8_e4m3fn", "float8_e5m2"))) if d
)


def to_numpy(value) -> np.ndarray:
    """A host array that later updates of a variable do not change (the writer encodes it later)."""
    if type(value) is Captured:
        return value.to_numpy()
    t = value if isinstance(value, tf.Tensor) else as_tensor(value)
    if t.dtype in UPCAST:
        t = tf.cast(t, tf.float32)  # numpy cannot hold them: any reader can use float32
    if t.dtype == tf.string:
        return np.array(t.numpy(), dtype=object)
    # no second copy: a tensor never changes (a variable was read into a new one by as_tensor)
    return np.asarray(t.numpy())


def _median(t: tf.Tensor) -> tf.Tensor:
    """numpy's median: the mean of the two middle values when the count is even, NaN if any is NaN
    (decided on the device: nothing waits for the value)."""
    ordered = tf.sort(tf.reshape(t, [-1]))
    size = tf.size(ordered)
    if not t.shape.is_fully_defined():  # maybe empty when the step runs: index a padded copy (the
        ordered = tf.concat([ordered, tf.zeros([1], t.dtype)], 0)  # result is not used then)
    half = size // 2
    upper = tf.gather(ordered, half)
    # (tf.equal: in a TF 1.x graph, == between Tensors compares the objects, always False)
    middle = tf.where(tf.equal(size % 2, 1), upper, (tf.gather(ordered, tf.maximum(half - 1, 0)) + upper) / 2)
    if t.dtype.is_floating:
        middle = tf.where(tf.reduce_any(tf.math.is_nan(t)), tf.constant(float("nan"), t.dtype), middle)
    return middle


_REDUCTIONS = {
    "min": tf.reduce_min,
    "max": tf.reduce_max,
    "median": _median,
    "mean": tf.reduce_mean,
    "std": tf.math.reduce_std,  # population std (numpy's ddof=0)
    "variance": tf.math.reduce_variance,
    "sum": tf.reduce_sum,
    "prod": tf.reduce_prod,
    # norms of the flattened tensor, whatever its rank
    "l1": lambda t: tf.reduce_sum(tf.abs(t)),
    "l2": lambda t: tf.sqrt(tf.reduce_sum(tf.square(t))),
}


def computable(t: tf.Tensor) -> tf.Tensor:
    if t.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(t, tf.float32)  # float16 sums overflow quickly
    if not t.dtype.is_floating:
        return tf.cast(t, tf.float64)  # integers and booleans, as numpy computes them
    return t


def every_pair(t: tf.Tensor, pairs: tuple) -> tf.Tensor:
    t = computable(t)
    magnitude = tf.abs(t) if any(a for _, a in pairs) else None
    return tf.stack([tf.reshape(_REDUCTIONS[r](magnitude if a else t), []) for r, a in pairs])


_programs: dict[tuple, object] = {}


def _program(dtype: tf.DType, pairs: tuple, count: int = 1):
    """One TF graph computing every pair of ``count`` tensors of this dtype (any shapes) into a
    [count, pairs] tensor: one call costs about what one eager op does (the eager ops one by one, ten
    per tensor, cost far more). Traced once per (dtype, pairs, count): a step's groups repeat."""
    key = (dtype, pairs, count)
    program = _programs.get(key)
    if program is None:
        if len(_programs) > 256:  # counts that do not repeat: do not keep their graphs forever
            _programs.clear()

        def every_tensor(*ts):
            return tf.stack([every_pair(t, pairs) for t in ts])

        spec = [tf.TensorSpec(None, dtype)] * count
        program = _programs[key] = tf.function(every_tensor, input_signature=spec, autograph=False)
    return program


class Pending:
    """A tensor's reductions, computed in to_host with the other tensors of its group (one graph call for
    them all). Holding the tensor is safe: a tensor never changes (a variable was read into one)."""

    __slots__ = ("tensor", "pairs")

    def __init__(self, tensor: tf.Tensor, pairs: tuple):
        self.tensor = tensor
        self.pairs = pairs


def _reducible(value) -> tf.Tensor | None:
    """The eager tensor to reduce, or None when TF does not reduce it: complex and text values (the core
    reduces the numpy copy) and symbolic tensors."""
    t = as_tensor(value)
    if t.dtype.is_complex or t.dtype == tf.string or tf.is_symbolic_tensor(t):
        return None
    return t


def _check(pairs) -> None:
    for reduction, _ in pairs:
        if reduction not in _REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}: choose from {', '.join(_REDUCTIONS)}")


def reduce(value, reduction: str, abs: bool = False):
    """One reduction computed by TF on the value's device; only the scalar reaches the host.
    None when TF cannot compute it (the core then reduces the numpy copy)."""
    _check([(reduction, abs)])
    if type(value) is Captured:  # a step's tensor whose reductions the step did not compute
        if value.empty:
            raise ValueError(f"cannot compute {reduction} of an empty tensor")
        if value.host is None:
            return None
        value = tf.convert_to_tensor(value.host)
    t = as_tensor(value)
    if t.shape.num_elements() == 0:
        raise ValueError(f"cannot compute {reduction} of an empty tensor")
    t = _reducible(t)
    if t is None:
        return None
    with tf.device(t.device):
        # a numpy scalar of the result's dtype: the core stores the reduction in it, as smdebug 1.0 does
        return _program(t.dtype, ((reduction, bool(abs)),))(t).numpy()[0, 0]


def reductions(values: list, pairs: list[tuple[str, bool]]) -> list:
    """Every (reduction, abs) pair of each value, by the same graph ops as ``reduce``: a step's tensor
    already has them (computed in the step, on the host now); others are computed with the rest of the
    step's in to_host, on the tensors' devices. None where ``reduce`` would not give a value from TF
    (empty, complex, text, symbolic) or the value is not TensorFlow's."""
    _check(pairs)
    pairs = tuple((r, bool(a)) for r, a in pairs)
    if all(type(v) is Captured for v in values):  # a Keras step's tensors: all of them on the host
        return [v.reductions(pairs) for v in values]
    started = []
    for value in values:
        if type(value) is Captured:
            started.append(value.reductions(pairs))
            continue
        t = _reducible(value) if is_tf_value(value) else None
        started.append(None if t is None or t.shape.num_elements() == 0 else Pending(t, pairs))
    return started


def to_host(results: list) -> list[np.ndarray] | None:
    """The step's reduction results on the host: one graph call and one copy per (device, dtype, pairs)
    group of tensors; a step's tensor's results are on the host already. None when a result is not ours."""
    groups: dict[tuple, list[int]] = {}
    host: list = [None] * len(results)
    for i, r in enumerate(results):
        if type(r) is Pending:
            groups.setdefault((r.tensor.device, r.tensor.dtype, r.pairs), []).append(i)
        elif isinstance(r, np.ndarray):
            host[i] = r
        else:
            return None
    for (device, dtype, pairs), members in groups.items():
        with tf.device(device):
            matrix = _program(dtype, pairs, len(members))(*(results[i].tensor for i in members)).numpy()
        for row, i in enumerate(members):
            host[i] = matrix[row]
            results[i].tensor = None  # not kept beyond the step
    return host
