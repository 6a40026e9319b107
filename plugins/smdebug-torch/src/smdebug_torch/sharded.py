"""Sharded tensors (DTensor: FSDP2's ``fully_shard``, tensor parallel, any DTensor parameter).

A sharded tensor is captured on every rank, whether that rank writes or not (include_workers): its
reductions are those of the full (logical) tensor, combined from each rank's partial statistics of its
shard by ONE all_gather per flush, for all the tensors captured since the last flush. The flushes happen
at points every rank reaches in the same order (the end of a backward pass, the end of a step), and every
rank captures the same tensors there (save steps and models are the same on every rank): no collective
that only some ranks enter. The all_gather runs on a process group of its own, asynchronously: issued at
the flush, awaited when the step ends (the optimizer step runs meanwhile), never queued among FSDP's
collectives on the default group. Raw values: each writing rank saves its own shard and records its
placement in the run (the Trial assembles the full tensor), or, with ``gather_full_tensors`` or
include_workers="one", the full tensor is gathered (one collective per tensor) and saved whole.

The median has no exact partial form: it is not saved for a sharded tensor unless the full tensor is
gathered (or replicated); ``trial.tensor(name).reduction_value(step, "median")`` computes it from the
saved shards.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from smdebug_torch import native
from smdebug_torch.tensors import _median_rows, _prepared

if TYPE_CHECKING:
    from smdebug_torch.hook import Hook

# the partial statistics of a shard, one row per tensor: what every reduction of the full tensor needs
N, SUM, M2, MIN, MAX, PROD, ASUM, AM2, AMIN, AMAX, APROD, SUMSQ, NONFINITE = range(13)
_EMPTY = (0.0, 0.0, 0.0, math.inf, -math.inf, 1.0, 0.0, 0.0, math.inf, -math.inf, 1.0, 0.0, 0.0)
_EMPTY_ROW = np.array(_EMPTY)
_MEDIAN = "median"
_NOTHING = torch.empty(0)  # what a replica that does not count contributes


def dtensor_class() -> type | None:
    """torch's DTensor class, once the script has imported it (no sharded tensor exists before)."""
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None)


def is_sharded(value: Any) -> bool:
    cls = dtensor_class()
    return cls is not None and isinstance(value, cls)


def class_name(module: torch.nn.Module) -> str:
    """The model's own class name: FSDP2 swaps a module's class for ``FSDP<Name>``, names must not follow."""
    fsdp = _fsdp_module_class()
    if fsdp is None or not isinstance(module, fsdp):
        return module._get_name()
    for cls in type(module).__mro__[1:]:
        if not issubclass(cls, fsdp):
            return cls.__name__
    return module._get_name()


def sharded_modules() -> int:
    """How many modules torch's composable APIs (fully_shard, ...) manage now: it grows when fully_shard
    puts sharded parameters in place, which it does without telling torch's registration hooks."""
    module = sys.modules.get("torch.distributed._composable_state")
    return len(getattr(module, "_module_state_mapping", ()))


def _fsdp_module_class() -> type | None:
    module = sys.modules.get("torch.distributed.fsdp._fully_shard._fully_shard")
    return getattr(module, "FSDPModule", None)


def classic_fsdp(module: torch.nn.Module) -> bool | None:
    """Whether the model holds a classic FullyShardedDataParallel wrapper (flat parameters): None when
    it holds none, else whether it keeps the original parameters (use_orig_params=True)."""
    fsdp = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    cls = getattr(fsdp, "FullyShardedDataParallel", None)
    found = next((m for m in module.modules() if isinstance(m, cls)), None) if cls is not None else None
    return None if found is None else bool(getattr(found, "_use_orig_params", True))


def is_flat_parameter(param) -> bool:
    """A classic FullyShardedDataParallel's flat parameter (use_orig_params=False)."""
    return bool(getattr(param, "_is_flat_param", False))


def named_parameters(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The model's parameters by their names; under FSDP2 the sharded parameters, also while a forward
    pass has swapped them for the gathered ones (FSDP2's own forward pre-hook runs before any other)."""
    params = list(module.named_parameters())
    sharded = _fsdp2_sharded(module)
    if not sharded:
        return params
    out = []
    for path, param in params:
        owner_path, _, attr = path.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        out.append((path, sharded.get((id(owner), attr), param)))
    return out


def _fsdp2_sharded(module: torch.nn.Module) -> dict[tuple[int, str], torch.nn.Parameter]:
    """(id(owning module), attribute) -> FSDP2's sharded parameter, for the modules ``fully_shard`` manages
    (through FSDP2's state: torch keeps no public map of it)."""
    fsdp = _fsdp_module_class()
    if fsdp is None:
        return {}
    found = {}
    for sub in module.modules():
        if not isinstance(sub, fsdp):
            continue
        try:
            group = sub._get_fsdp_state()._fsdp_param_group
            for fsdp_param in group.fsdp_params if group is not None else ():
                info = fsdp_param._module_info
                found[(id(info.module), info.param_name)] = fsdp_param.sharded_param
        except AttributeError:  # another torch's FSDP2 internals: the module's own parameters then
            continue
    return found


def _plain_placements(dt) -> bool:
    """Whether every placement is a plain Shard or a Replicate (after Partial was resolved): then each
    rank's local tensor is one block of the full tensor at offsets this module computes."""
    from torch.distributed.tensor import Replicate, Shard

    return all(type(p) is Shard or type(p) is Replicate for p in dt.placements)


def _resolved(dt):
    """The DTensor with Partial placements reduced to Replicate (a collective on its mesh, which every
    rank enters: every rank captures the same tensors at the same point)."""
    if any(p.is_partial() for p in dt.placements):
        from torch.distributed.tensor import Replicate

        dt = dt.redistribute(dt.device_mesh, [Replicate() if p.is_partial() else p for p in dt.placements])
    return dt


def placement(dt) -> dict | None:
    """Where this rank's local tensor lies in the full tensor (torch.chunk's split of each sharded
    dimension, as DTensor shards), None when this rank holds no part of it."""
    mesh = dt.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None
    shape = list(dt.shape)
    offsets, sizes = [0] * len(shape), list(shape)
    for mesh_dim, p in enumerate(dt.placements):
        if p.is_shard():
            d = p.dim if p.dim >= 0 else p.dim + len(shape)
            chunk = -(-sizes[d] // mesh.size(mesh_dim)) if sizes[d] else 0
            start = min(coordinate[mesh_dim] * chunk, sizes[d])
            offsets[d] += start
            sizes[d] = min(start + chunk, sizes[d]) - start
    return {
        "global_shape": shape,
        "offsets": offsets,
        "local_shape": sizes,
        "mesh_shape": list(mesh.shape),
        "coordinate": list(coordinate),
        "placements": [repr(p) for p in dt.placements],
    }


def _contributes(dt) -> bool:
    """Whether this rank's shard counts in the full tensor's statistics: replicas count once (the rank at
    coordinate 0 of each replicated mesh dimension)."""
    coordinate = dt.device_mesh.get_coordinate()
    if coordinate is None:
        return False
    return all(c == 0 for c, p in zip(coordinate, dt.placements) if p.is_replicate())


# the statistics each reduction needs (besides the count)
_NEEDS = {
    ("min", False): {MIN},
    ("max", False): {MAX},
    ("mean", False): {SUM},
    ("sum", False): {SUM},
    ("prod", False): {PROD},
    ("variance", False): {SUM, M2},
    ("std", False): {SUM, M2},
    ("min", True): {AMIN},
    ("max", True): {AMAX},
    ("mean", True): {ASUM},
    ("sum", True): {ASUM},
    ("prod", True): {APROD},
    ("variance", True): {ASUM, AM2},
    ("std", True): {ASUM, AM2},
}
_ALL = set(range(len(_EMPTY)))


def needed(pairs) -> set[int]:
    """The statistics the reductions ``pairs`` need (the count, the sum of squares and the non-finite
    count always: they are cheap); l1 needs the sum of magnitudes, l2 the sum of squares."""
    found = {N, SUMSQ, NONFINITE}
    for reduction, absolute in pairs:
        found |= _NEEDS.get((reduction, absolute), {ASUM} if reduction == "l1" else set())
    return found


def partials(
    shards: list[torch.Tensor], stats: set[int] = _ALL, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The partial statistics of each shard, a [shards, 13] float64 host matrix (or written into ``out``,
    one): at least ``stats`` (the others keep the neutral values of an empty shard). CPU shards are read
    once each, by the native kernel (smdebug_torch.native) in one call, once it is loaded and unless a
    product is asked (it has none); else they are computed where the shards live by a few batched calls
    for all of them (torch's foreach kernels where they exist), then one stack of the results and one
    transfer to the host per device and dtype; the rest in numpy, on the host."""
    if out is None:
        out = torch.tensor([_EMPTY] * len(shards), dtype=torch.float64)
    host = out.numpy()
    if not stats & {PROD, APROD} and _native_partials(shards, stats, host):
        return out
    groups: dict = {}
    for i, shard in enumerate(shards):
        t = _prepared(shard.detach())
        if t is not None:  # (None: empty, its row stays _EMPTY)
            rows, ts = groups.setdefault((t.device, t.dtype), ([], []))
            rows.append(i)
            ts.append(t.reshape(-1))
    for rows, ts in groups.values():
        block = _columns(ts, stats)
        bad = ~np.isfinite(block[:, SUMSQ])
        if bad.any():  # rare: a shard with NaN or inf (a finite sum of squares rules them out)
            for k in bad.nonzero()[0].tolist():
                block[k, NONFINITE] = float((~torch.isfinite(ts[k])).sum())
        host[rows] = block
    return out


# the native kernel's columns (native.STATS), always computed, and those it computes when asked (ABS, M2)
# -> this module's columns
_NATIVE_ALWAYS = {0: N, 1: SUM, 3: MIN, 4: MAX, 8: AMAX, 9: SUMSQ, 10: NONFINITE}
_NATIVE_ABS = {5: ASUM, 7: AMIN}
_NATIVE_M2 = {2: M2}
_NATIVE_ABS_M2 = {6: AM2}
_native_columns: dict[int, tuple[list[int], list[int]]] = {}  # want -> (native's, this module's)


def _native_partials(shards: list[torch.Tensor], stats: set[int], host: np.ndarray) -> bool:
    """The shards' partial statistics by the native kernel into ``host``; False when it is not loaded
    (it starts loading at the first call) or does not take every shard (one not on the CPU)."""
    want = (native.ABS if stats & {ASUM, AMIN, AM2} else 0) | (native.M2 if stats & {M2, AM2} else 0)
    try:
        found = native.partials(shards, want)
    except RuntimeError:  # a shard the kernel does not read (another device): torch's calls
        return False
    if found is None:
        return False
    columns = _native_columns.get(want)
    if columns is None:
        pairs = dict(_NATIVE_ALWAYS)
        if want & native.ABS:
            pairs.update(_NATIVE_ABS)
        if want & native.M2:
            pairs.update(_NATIVE_M2)
        if want == native.ABS | native.M2:
            pairs.update(_NATIVE_ABS_M2)
        columns = _native_columns[want] = (list(pairs), list(pairs.values()))
    host[:, columns[1]] = found.numpy()[:, columns[0]]
    return True


def _columns(ts: list[torch.Tensor], stats: set[int]) -> np.ndarray:
    """The [tensors, 13] float64 matrix of flat tensors of one device and dtype: one foreach call per
    statistic where torch has one, then one stack of every 0-d result and one transfer."""
    k = len(ts)
    found: dict[int, list] = {SUMSQ: torch._foreach_norm(ts, 2)}  # squared on the host (no overflow)
    # (sums apart from the variances: var_mean's running mean is NaN beside an inf, where the sum is inf)
    if stats & {SUM, M2}:
        found[SUM] = [t.sum() for t in ts]
    if M2 in stats:
        found[M2] = [t.var(correction=0) for t in ts]  # variances: times the count on the host
    if MAX in stats:
        found[MAX] = torch._foreach_max(ts) if hasattr(torch, "_foreach_max") else [t.amax() for t in ts]
    if MIN in stats:
        found[MIN] = [t.amin() for t in ts]
    if PROD in stats:
        found[PROD] = [t.prod() for t in ts]
    if AMAX in stats:
        found[AMAX] = torch._foreach_norm(ts, math.inf)
    if stats & {ASUM, AM2, AMIN, APROD}:
        magnitudes = torch._foreach_abs(ts) if stats & {AM2, AMIN, APROD} else None
        found[ASUM] = torch._foreach_norm(ts, 1)
        if AM2 in stats:
            found[AM2] = [a.var(correction=0) for a in magnitudes]
        if AMIN in stats:
            found[AMIN] = [a.amin() for a in magnitudes]
        if APROD in stats:
            found[APROD] = [a.prod() for a in magnitudes]
    columns = list(found)
    values = torch.stack([v for c in columns for v in found[c]]).double().cpu().numpy()
    block = np.tile(_EMPTY_ROW, (k, 1))
    block[:, columns] = values.reshape(len(columns), k).T
    n = np.array([t.numel() for t in ts], dtype=np.float64)
    block[:, N] = n
    block[:, SUMSQ] **= 2
    if M2 in stats:
        block[:, M2] *= n
    if AM2 in stats:
        block[:, AM2] *= n
    return block


def combine(gathered: np.ndarray, pairs=None) -> dict[tuple[str, bool], np.ndarray]:
    """The reductions ``pairs`` (default: every one but the median) of each full tensor, from its shards'
    partial statistics (gathered: [ranks, tensors, 13]): {(reduction, abs): [tensors]}; NaN for an empty
    tensor. Only those asked are computed (this runs at every saved step)."""
    g = gathered
    n = g[:, :, N].sum(0)
    out = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for absolute, (s, m2, lo, hi, prod) in (
            (False, (SUM, M2, MIN, MAX, PROD)),
            (True, (ASUM, AM2, AMIN, AMAX, APROD)),
        ):
            want = _COMBINED if pairs is None else {r for r, a in pairs if a == absolute}
            if "min" in want:
                out[("min", absolute)] = g[:, :, lo].min(0)
            if "max" in want:
                out[("max", absolute)] = g[:, :, hi].max(0)
            if "prod" in want:
                out[("prod", absolute)] = g[:, :, prod].prod(0)
            if "l1" in want:
                out[("l1", absolute)] = g[:, :, ASUM].sum(0)
            if "l2" in want:
                out[("l2", absolute)] = np.sqrt(g[:, :, SUMSQ].sum(0))
            if want.isdisjoint(("sum", "mean", "variance", "std")):
                continue
            total = g[:, :, s].sum(0)
            mean = total / n
            out[("sum", absolute)] = total
            out[("mean", absolute)] = mean
            if not want.isdisjoint(("variance", "std")):
                # Chan et al.'s pairwise update: each shard's squared deviations moved to the full mean
                shift = np.where(g[:, :, N] > 0, g[:, :, N] * (g[:, :, s] / g[:, :, N] - mean) ** 2, 0.0)
                variance = (g[:, :, m2] + shift).sum(0) / n
                out[("variance", absolute)] = variance
                out[("std", absolute)] = np.sqrt(variance)
    return out


_COMBINED = frozenset(("min", "max", "mean", "sum", "prod", "variance", "std", "l1", "l2"))


class _Item:
    __slots__ = ("name", "value", "pairs", "raw")

    def __init__(self, name, value, pairs, raw):
        self.name, self.value, self.pairs, self.raw = name, value, pairs, raw


# numbers the hooks of this process as they capture a sharded tensor (in the same order on every rank)
_hook_numbers = itertools.count(1)
_WAIT_FOR_RANKS = 10.0  # seconds; a rank with a hook has announced it long before (see Shards.flush)


def _store():
    """The job's key-value store (the default process group's): ranks tell each other, without a
    collective, that their hook captures sharded tensors. None where torch keeps it elsewhere."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:
        return None


class _InFlight:
    """A flush's all_gather of partial statistics, issued and not yet awaited, and what its combination
    needs: the flush's layout and items, the gathered buffer, and the medians computed at the flush."""

    __slots__ = ("work", "layout", "items", "everyone", "medians")

    def __init__(self, work, layout, items, everyone):
        self.work, self.layout, self.items, self.everyone, self.medians = work, layout, items, everyone, {}


class _Layout:
    """What a flush of the same tensors as the last one (in training: every saved step) reuses: the checks
    of each tensor (its mesh, its placements, whether its shard counts), the reductions asked and the
    statistics they need, their dtypes, and the all_gather's buffers (free again once it was awaited,
    which happens before the next flush). Worked out anew when a tensor, its placements or its reductions
    change."""

    def __init__(self, key: list, items: list[_Item], world: int, hook: Hook):
        self.key = key
        self.partial = [
            k for k, item in enumerate(items) if any(p.is_partial() for p in item.value.placements)
        ]
        for k in self.partial:
            items[k].value = _resolved(items[k].value)
        self.reduced = []  # the items whose reductions are combined (their rows in the all_gather)
        for k, item in enumerate(items):
            if not item.pairs:
                continue
            if item.value.device_mesh.size() == world:
                self.reduced.append(k)
                continue
            hook.warn_once(
                f"shards:mesh:{item.name}",
                "smdebug: %s is sharded over a mesh that is not the whole job: its reductions are "
                "not saved (save its raw value instead)",
                item.name,
            )
            hook.record_unsaved_tensor(item.name, "reductions of a tensor sharded over part of the job")
        # the items whose raw value or exact median is saved at the flush (_save_value)
        self.valued = [k for k, i in enumerate(items) if i.raw or any(p[0] == _MEDIAN for p in i.pairs)]
        reduced = [items[k] for k in self.reduced]
        self.contributes = [_contributes(i.value) for i in reduced]
        self.pairs = {pair for i in reduced for pair in i.pairs if pair[0] != _MEDIAN}
        self.stats = needed(self.pairs)
        # each reduced item's (reductions, dtype), grouped: one cast of a matrix per group at each step
        groups: dict[tuple, list[int]] = {}
        for j, item in enumerate(reduced):
            pairs = tuple(p for p in item.pairs if p[0] != _MEDIAN)
            groups.setdefault((pairs, _result_dtype(item.value)), []).append(j)
        self.groups = [(pairs, dtype, np.array(js)) for (pairs, dtype), js in groups.items()]
        names = [i.name for i in reduced]
        self.names = names
        header = [float(len(names)), float(zlib.crc32("\n".join(names).encode()))]
        self.template = np.array([header + [0.0] * (len(_EMPTY) - 2)] + [_EMPTY] * len(names))
        self.mine = torch.from_numpy(self.template.copy())
        self.everyone = self.mine.new_empty((world * self.mine.shape[0], self.mine.shape[1]))
        self.gathered = self.everyone.numpy().reshape(world, *self.mine.shape)  # a view of the buffer


def _all_gather(*args, **kwargs):
    """torch's all_gather into one tensor (all_gather_into_tensor is deprecated for all_gather_single)."""
    dist = torch.distributed
    return (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(*args, **kwargs)


_group: tuple[Any, Any] | None = None  # (the default group it was made in, the statistics' own group)


def _statistics_group():
    """The process group of the statistics' all_gather, made once per default group by every rank (at
    the first flush, which every rank reaches: see Shards.flush): its own group (gloo, on the host), so
    it runs beside FSDP's collectives on the default group, never queued among them or blocking them."""
    global _group
    dist = torch.distributed
    world = dist.group.WORLD
    if _group is None or _group[0] is not world:
        backend = "gloo" if dist.is_gloo_available() else None
        _group = (world, dist.new_group(backend=backend))
    return _group[1]


class Shards:
    """A hook's sharded tensors captured since the last flush, and the flush that saves them."""

    def __init__(self, hook: Hook):
        self.hook = hook
        self.pending: dict[str, _Item] = {}
        self.grads: list[tuple[str, Any]] = []  # (name, parameter) given a gradient: captured at the flush
        # id(parameter) -> its gradient when the running backward pass began (accumulation): what the pass
        # adds is saved, as for an unsharded parameter, not the sum so far
        self.before: dict[int, Any] = {}
        self.flush_queued = False
        self.in_flight: _InFlight | None = None  # the last flush's all_gather, awaited by resolve()
        self.layout: _Layout | None = None  # the last flush's, reused while its tensors stay the same
        self.broken = False  # the statistics' collective failed once: no more reductions (see resolve)
        self.key: str | None = None  # this hook's key in the job's store, once it captured a sharded tensor
        self.every_rank: bool | None = None  # whether every rank's hook captures them (at the first flush)

    def capture(self, name: str, value) -> None:
        """Note a sharded tensor due now (on every rank, writing or not); saved at the next flush."""
        plan = self.hook.plan_for(name)
        if plan is not None and value is not None:
            if self.key is None:
                self._announce()
            self.pending[name] = _Item(name, value, plan[0], plan[1])

    def note_before(self, grads: list[tuple[str, Any]]) -> None:
        """At a backward pass's start: copies of the due gradients already there (a gradient accumulated
        over several passes, or zeroed in place), so that each pass saves its own."""
        is_due = self.hook.is_due
        for name, param in grads:
            grad = param.grad
            if grad is not None and is_due(name):
                self.before[id(param)] = grad.detach().clone()  # (a local copy of the shard)

    def save_now(self, name: str, value, pairs, raw: bool) -> None:
        """``hook.save_tensor`` of a sharded tensor: saved at once as a captured one is at a flush (every
        rank calls it at the same point, as any collective: its reductions need every rank's shard)."""
        if self.key is None:
            self._announce()
        self.pending[name] = _Item(name, value, tuple(pairs), raw)
        self.flush()
        self.resolve()

    def _announce(self) -> None:
        """Tell the other ranks that this rank's hook captures sharded tensors (it enters the flushes'
        collectives): a key of the job's store, numbered by this process's hooks."""
        self.key = f"smdebug/shards/{next(_hook_numbers)}"
        store = _store()
        if store is not None and torch.distributed.is_initialized():
            try:
                store.set(f"{self.key}/{torch.distributed.get_rank()}", "1")
            except Exception:  # a store that refuses: the flushes trust every rank, as they always did
                pass

    def _every_rank_captures(self, world: int) -> bool:
        """Whether every rank's hook announced itself: a hook made on rank 0 only (``if rank == 0``)
        would enter collectives the others never do, matched against FSDP's own, and crash the job. By
        the first flush (the end of a backward pass or of a step) every other rank has run the forward
        pass whose collectives this rank's did, so its announcement is there if it has a hook."""
        store = _store()
        if store is None or world == 1 or self.key is None:
            return True
        keys = [f"{self.key}/{rank}" for rank in range(world)]
        alone = f"{self.key}/alone"  # set by a rank that gave up waiting: the later ones follow it
        deadline = time.monotonic() + _WAIT_FOR_RANKS
        try:
            while not store.check(keys):
                if time.monotonic() > deadline:
                    store.set(alone, "1")
                    return False
                time.sleep(0.05)
            # Keys are only added: a rank that found them all was not preceded by one that gave up,
            # unless that one's mark is here now (it set it before this rank announced itself).
            return not store.check([alone])
        except Exception:  # a store that cannot tell: as before
            return True

    def flush(self) -> None:
        """Save what was captured: each rank's shards (or the gathered tensors) now; the full tensors'
        reductions once the all_gather of every rank's partial statistics, issued here, is done
        (resolve, at the step's end). Awaited here instead, it cost a gloo round trip on the training
        thread at every saved step (interleaved A/B on 2 CPU ranks: about 1 ms of a 17-21 ms step,
        the same as no collective at all once awaited at the step's end)."""
        if self.grads:
            grads, self.grads = self.grads, []
            before, self.before = self.before, {}
            for name, param in grads:
                grad, earlier = param.grad, before.get(id(param))
                self.capture(name, grad if earlier is None or grad is None else grad.detach() - earlier)
        if not self.pending:
            return
        self.resolve()  # (a second flush in a step: a second backward pass)
        hook = self.hook
        pending, self.pending = self.pending, {}
        items = [pending[name] for name in sorted(pending)]  # the same order on every rank
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            for item in items:
                hook.record_unsaved_tensor(item.name, "the process group was destroyed before it was saved")
            hook.warn_once("shards:nogroup", "smdebug: sharded tensors not saved: no process group any more")
            return
        world = dist.get_world_size()
        if self.every_rank is None:
            self.every_rank = self._every_rank_captures(world)
        if not self.every_rank:
            self._save_alone(items)
            return
        gather = hook.options.gather_full_tensors or hook.include_workers == "one"
        with torch.no_grad():
            key = [
                (i.name, i.pairs, i.raw, i.value.device_mesh, i.value.placements, i.value.dtype)
                for i in items
            ]
            layout = self.layout
            if layout is not None and layout.key == key:
                for k in layout.partial:
                    items[k].value = _resolved(items[k].value)
            else:
                layout = self.layout = _Layout(key, items, world, hook)
            # (the all_gather, issued now, is awaited at the step's end: resolve())
            self.in_flight = self._issue(layout, items)
            values, medians = {}, {}
            for k in layout.valued:
                self._save_value(items[k], gather, values, medians)
            if self.in_flight is not None:  # saved with the reductions, together
                self.in_flight.medians, medians = medians, {}
            if values or medians:
                hook.save_computed(values, medians)

    def _issue(self, layout: _Layout, items: list[_Item]) -> _InFlight | None:
        """Every rank's partial statistics of the layout's reduced items, computed now (before the optimizer
        changes the weights) and gathered by one all_gather on the statistics' own group, not awaited here."""
        if not layout.reduced:
            return None
        reduced = [items[k] for k in layout.reduced]
        if self.broken:
            for item in reduced:
                self.hook.record_unsaved_tensor(item.name, "the reductions' collective failed earlier")
            return None
        layout.mine.numpy()[:] = layout.template  # (the rows of empty shards keep the neutral values)
        shards = [i.value.to_local() if c else _NOTHING for i, c in zip(reduced, layout.contributes)]
        partials(shards, layout.stats, out=layout.mine[1:])
        group = _statistics_group()
        mine, everyone = layout.mine, layout.everyone
        if torch.distributed.get_backend(group) != "gloo":  # e.g. NCCL alone: it gathers only CUDA tensors
            mine = mine.to(reduced[0].value.device_mesh.device_type)
            everyone = mine.new_empty(everyone.shape)
        work = _all_gather(everyone, mine, group=group, async_op=True)
        return _InFlight(work, layout, reduced, everyone)

    def resolve(self) -> None:
        """Await the last flush's all_gather and save the full tensors' reductions it combines (in the
        step of that flush: called before the step ends, and before the next flush)."""
        flight, self.in_flight = self.in_flight, None
        if flight is None:
            return
        hook = self.hook
        reductions = {}
        try:
            flight.work.wait()
        except Exception as e:  # a rank that died or left: the reductions of this step are lost, said so
            self.broken = True
            hook.warn_once(
                "shards:collective",
                "smdebug: the all_gather of the sharded tensors' statistics failed (%s): their reductions "
                "are not saved from now on",
                e,
            )
            for item in flight.items:
                hook.record_unsaved_tensor(item.name, f"the reductions' collective failed: {e}")
        else:
            if hook.writing:
                layout = flight.layout
                gathered = layout.gathered
                if flight.everyone is not layout.everyone:  # (gathered on a device)
                    gathered = flight.everyone.cpu().view(gathered.shape).numpy()
                reductions = self._combined(gathered, layout)
        for name, found in flight.medians.items():
            reductions.setdefault(name, {}).update(found)
        hook.save_computed({}, reductions)

    def _combined(self, gathered: np.ndarray, layout: _Layout) -> dict[str, dict]:
        """The reduced items' reductions from every rank's gathered statistics ([rank, 1 + tensors,
        statistics]), each as numpy scalars of its dtype."""
        if not (gathered[:, 0, :2] == gathered[0, 0, :2]).all():
            self.hook.warn_once(
                "shards:mismatch",
                "smdebug: the ranks captured different sharded tensors; their reductions are not saved",
            )
            return {}
        columns = combine(gathered[:, 1:], layout.pairs)
        count = gathered[:, 1:, N].sum(0)
        names = layout.names
        found = {}
        for pairs, dtype, js in layout.groups:
            if not pairs:  # (a median alone: saved at the flush)
                continue
            matrix = np.stack([columns[p][js] for p in pairs], 1).astype(dtype, copy=False)
            for j, row in zip(js.tolist(), matrix):
                if count[j]:
                    found[names[j]] = dict(zip(pairs, row))
        return {name: found[name] for name in names if name in found}  # (in the items' order)

    def _save_alone(self, items: list[_Item]) -> None:
        """No hook on some other rank: no collective; this rank's shards are saved with their placement
        where asked, the full tensors' reductions are recorded as not saved."""
        hook = self.hook
        hook.warn_once(
            "shards:alone",
            "smdebug: not every rank has a hook capturing the sharded tensors (create the hook and register "
            "the model on every rank; include_workers chooses the ranks that write): their reductions "
            "need all of them and are not saved, each shard is saved alone",
        )
        values = {}
        for item in items:
            dt, where = item.value, None
            if hook.writing and item.raw and _plain_placements(dt):
                where = placement(dt)
            if where is not None and list(dt.to_local().shape) == where["local_shape"]:
                hook.record_placement(item.name, where)
                values[item.name] = dt.to_local()
            if item.pairs or (item.raw and item.name not in values):
                hook.record_unsaved_tensor(item.name, "sharded, and not every rank has a hook to combine it")
        hook.save_computed(values, {})

    def _save_value(self, item: _Item, gather: bool, values: dict, medians: dict) -> None:
        """The item's raw value (its shard and placement, or the gathered tensor) into ``values``, and
        its exact median into ``medians`` when the full tensor is at hand."""
        hook, dt = self.hook, item.value
        full = None
        median = [p for p in item.pairs if p[0] == _MEDIAN]
        if item.raw or (gather and median):
            if gather or not _plain_placements(dt):
                full = dt.full_tensor()  # a collective of the tensor's mesh: every rank is here
        whole = full
        if whole is None and median and all(p.is_replicate() for p in dt.placements):
            whole = dt.to_local()  # (each rank holds the whole tensor: its median is exact, no collective)
        for pair in median:
            value = _median(whole, pair[1]) if whole is not None else None
            if value is not None:
                medians.setdefault(item.name, {})[pair] = _result_dtype(dt).type(value)
            elif whole is None and hook.writing:
                hook.warn_once(
                    "shards:median",
                    "smdebug: the median of a sharded tensor (%s, and any other) is not saved: it has "
                    "no exact partial form; the Trial computes it from saved shards, or use "
                    "gather_full_tensors=True",
                    item.name,
                )
        if not (hook.writing and item.raw):
            return
        if full is not None:
            values[item.name] = full
            return
        where = placement(dt)
        local = dt.to_local()
        if where is not None and list(local.shape) == where["local_shape"]:
            hook.record_placement(item.name, where)
        else:
            hook.warn_once(
                f"shards:placement:{item.name}",
                "smdebug: the shard of %s has no known place in the full tensor: saved as it is",
                item.name,
            )
        values[item.name] = local


def _result_dtype(dt) -> np.dtype:
    """The dtype a reduction of this tensor is stored in (as the unsharded reductions: float32 for
    float32 and lower precisions, float64 otherwise)."""
    return (
        np.dtype(np.float32)
        if dt.dtype in (torch.float32, torch.float16, torch.bfloat16)
        else np.dtype(np.float64)
    )


def _median(full: torch.Tensor, absolute: bool):
    t = _prepared(full.detach())
    if t is None:
        return None
    t = t.abs() if absolute else t
    return _median_rows(t.reshape(1, -1))[0].cpu().numpy()
