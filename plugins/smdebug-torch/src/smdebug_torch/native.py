"""The native statistics kernel (stats.cpp), on the CPU, in one call for a list of tensors and one reading
of each: health's l2 norm and max |x| of every weight, gradient and the loss (``health_watch``); the
ordinary reductions (``reducer``); each tensor's partial statistics (``partials``).

It is built with the machine's C++ compiler against the installed torch, once per machine, torch and
source (kept in torch's extension cache, ``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``),
by a detached compiler at the lowest priority, which a background thread started by the first hook
with ``health=True`` or the first batch of reductions waits for: training never waits for it (the
process's exit waits for the library's loading and checks, never for a build).
Until it is loaded, and wherever it cannot be built (no compiler, another platform, ``SMDEBUG_NATIVE=0``),
torch's batched calls compute the same statistics.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import logging
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import torch

logger = logging.getLogger("smdebug")

SOURCE = Path(__file__).with_name("stats.cpp")
BUILD_TIMEOUT = 600  # seconds: a build that takes longer is given up

_watch = None  # torch.classes.smdebug_torch.HealthWatch once loaded
_fill = None  # its smdebug_health_fill (ctypes) once loaded
_reduce = None  # torch.ops.smdebug_torch.reduce once loaded
_reduce_list = None  # its smdebug_reduce_list (ctypes) once loaded, where it was built with Python's headers
_partials = None  # torch.ops.smdebug_torch.partials once loaded
_thread: threading.Thread | None = None
_started = False
_lock = threading.Lock()
# The loader runs torch's code (loading the library, checking the kernel) on a daemon thread: a process
# that exits meanwhile was aborted by the C++ runtime ("terminate called without an active exception",
# exit status 134, 6 short scripts in 10), so the exit waits for that part, and no load starts after it.
_loading = False
_exiting = False
EXIT_WAIT = 60  # seconds the exit waits for the kernel's loading and checks at most

# the reductions the kernel computes, by their codes' order (a pair's code: 2 x index + abs)
REDUCTIONS = ("min", "max", "mean", "std", "variance", "sum", "l1", "l2")
# the columns of a row of partials; an empty tensor's row holds EMPTY
STATS = ("count", "sum", "m2", "min", "max", "abs_sum", "abs_m2", "abs_min", "abs_max", "sumsq", "nonfinite")
EMPTY = (0.0, 0.0, 0.0, math.inf, -math.inf, 0.0, 0.0, math.inf, -math.inf, 0.0, 0.0)
ABS = (
    1  # partials: also the sum and min of |x| (max |x|, the count, sum of squares, non-finite count: always)
)
M2 = 2  # partials: also the squared deviations from the mean (and of |x| with ABS), summed


def health_watch(weights: list, grad_params: list, columns: list[int]):
    """A HealthWatch of these parameters (``fill(loss, with_grads, row)`` writes a step's statistics of
    the weights, their gradients and the loss into the row's columns), or None while the kernel is not
    loaded; the first call starts loading it (building it first if this machine has none)."""
    if _watch is None:
        if not _started:
            start()
        return None
    return HealthWatch(_watch(weights, grad_params, columns), _fill)


_LOSS_BITS = {torch.float32: 32, torch.float64: 64}


class HealthWatch:
    """The kernel's HealthWatch, filled through a ctypes call where it can be (far less code than a
    custom class's method call: a step runs it with cold caches)."""

    __slots__ = ("watch", "_address", "_fill")

    def __init__(self, watch, fill):
        self.watch = watch  # (keeps the address valid)
        self._address = watch.address()
        self._fill = fill

    def fill(self, loss: torch.Tensor | None, with_grads: bool, row: torch.Tensor) -> bool:
        """The row's statistics (see stats.cpp); True when every value is finite."""
        return self.watch.fill(loss, with_grads, row)

    def fill_at(self, loss: torch.Tensor | None, with_grads: bool, row: torch.Tensor, address: int) -> bool:
        """``fill`` into a row known to be a contiguous float32 CPU tensor of 2 x the columns, at
        ``address`` (its data_ptr)."""
        bits, at = 0, None
        if type(loss) is torch.Tensor and loss.is_cpu and loss.numel() == 1:  # (no subclass: its memory)
            bits = _LOSS_BITS.get(loss.dtype, 0)
            at = loss.data_ptr() if bits else None
        if (bits or loss is None) and self._fill is not None:
            done = self._fill(self._address, address, with_grads, at, bits)
            if done >= 0:
                return bool(done)
        return self.watch.fill(loss, with_grads, row)  # (says why it failed, if it does)


def reducer():
    """The kernel's ``reduce(tensors, codes, out)`` (each tensor's reductions, ``codes`` by REDUCTIONS,
    into its row of ``out``, a [tensors, codes] float64 CPU tensor, when all are non-empty plain CPU
    tensors, all float32 or all float64: it returns 32 or 64, their dtype; else 0, and computes
    nothing), or None while the kernel is not loaded; the first call starts loading it."""
    if not _started:
        start()
    return _reduce


def list_reducer():
    """``reduce`` by a ctypes call: ``(values, codes, m, out, rows)``, ``values`` a list of ``rows``
    tensors, ``codes`` the address of m int64 codes, ``out`` of a [rows, m] float64 matrix; 32 or 64 as
    ``reduce``, or 0 where ``reduce`` refuses and wherever this cannot read the values (a tensor
    subclass, a value that is no tensor: ``reduce`` then says). None where the kernel has none."""
    return _reduce_list


def partials(tensors: list, want: int = ABS | M2, out: torch.Tensor | None = None) -> torch.Tensor | None:
    """Each tensor's partial statistics (STATS), a [tensors, 11] float64 CPU matrix (``out`` if given), in one
    call and one reading of each tensor (an empty one's row: EMPTY); ``want`` (ABS, M2) adds the costlier
    columns (without them, theirs are not to be read). NaN and inf as numpy reduces them: a NaN makes every
    statistic NaN but the count and the non-finite count; an inf makes m2 NaN. float16/bfloat16 are read in
    float32, integers and booleans in float64, complex values as their magnitudes. None while the kernel is
    not loaded (the first call starts loading it); RuntimeError for a tensor that is not a plain CPU
    tensor."""
    if not _started:
        start()
    if _partials is None:
        return None
    if out is None:
        out = torch.empty(len(tensors), len(STATS), dtype=torch.float64)
    with torch.no_grad():
        _partials(tensors, want, out)
    return out


def start() -> None:
    global _thread, _started
    with _lock:
        if not _started and os.environ.get("SMDEBUG_NATIVE", "1") != "0":
            _thread = threading.Thread(target=_load, name="smdebug-native-build", daemon=True)
            _thread.start()
            atexit.register(_settle)
        _started = True


def wait(timeout: float | None = None) -> bool:
    """Whether the kernel is loaded, once loading has ended (waiting at most ``timeout``)."""
    start()
    thread = _thread
    if thread is not None:
        thread.join(timeout)
    return _watch is not None


def _settle() -> None:
    """At exit: no load starts from now on, and one under way ends first (a build is not waited for)."""
    global _exiting
    with _lock:
        _exiting = True
        loading = _loading
    if loading and _thread is not None:
        _thread.join(EXIT_WAIT)


def _load() -> None:
    global _watch, _fill, _reduce, _reduce_list, _partials, _loading
    try:
        library = _built()
        with _lock:
            if library is None or _exiting:
                return
            _loading = True
        torch.ops.load_library(str(library))
        watch = torch.classes.smdebug_torch.HealthWatch
        ops = torch.ops.smdebug_torch
        fill = ctypes.PyDLL(str(library)).smdebug_health_fill  # (the GIL held, as the method holds it)
        fill.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        fill.restype = ctypes.c_int
        _fill = fill
        _watch = _checked(library, "health statistics", watch, _works)
        _reduce = _checked(library, "reductions", ops.reduce, _reduces_right)
        listed = _list_function(library) if _reduce is not None else None
        if listed is not None:  # (None: built without Python's headers; the op computes the same)
            _reduce_list = _checked(library, "reductions of a list", listed, _lists_right)
        _partials = _checked(library, "partial statistics", ops.partials, _partials_right)
    except Exception as exc:  # no kernel: torch's calls compute the statistics
        logger.info("smdebug: the native statistics kernel is not used: %s", exc)
    finally:
        _loading = False


def _checked(library: Path, what: str, kernel, right):
    """The kernel, if ``right(kernel)``, else None."""
    try:
        if right(kernel):
            return kernel
        logger.info("smdebug: the native kernel %s computes wrong %s: not used", library, what)
    except Exception as exc:  # (a kernel that raises is not used either)
        logger.info("smdebug: the native kernel %s failed on %s: %s: not used", library, what, exc)
    return None


def _works(watch) -> bool:
    """The kernel's values on a few tensors (a NaN, an inf, values whose squares overflow float32, a
    float64 one, a strided one, an absent gradient, columns in another order) against torch's, computed
    in float64."""
    weights = [
        torch.arange(-5.0, 70.0),
        torch.tensor([1.0, float("nan"), 2.0]),
        torch.tensor(-float("inf")),
        torch.full((3,), -1e30),
        torch.arange(9.0, dtype=torch.float64),
        torch.arange(12.0).view(3, 4).t(),
    ]
    params = [torch.zeros(3, requires_grad=True), torch.zeros(2, requires_grad=True)]
    params[0].grad = torch.tensor([3.0, -4.0, 0.0])
    loss = torch.tensor(2.5)
    tensors = [*weights, params[0].grad, None, loss]
    columns = list(range(len(tensors)))[::-1]
    out, fast = torch.empty(2 * len(tensors)), torch.empty(2 * len(tensors))
    finite = HealthWatch(watch([torch.ones(4)], [], [0]), _fill)
    one = torch.empty(2)
    with torch.no_grad():
        held = HealthWatch(watch(weights, params, columns), _fill)
        flags = (held.fill(loss, True, out), held.fill_at(loss, True, fast, fast.data_ptr()))
        flags += (finite.fill_at(None, True, one, one.data_ptr()),)
    want = torch.empty(2 * len(tensors), dtype=torch.float64)
    for t, column in zip(tensors, columns):
        t = None if t is None else t.double()
        want[column] = -1.0 if t is None else torch.linalg.vector_norm(t)
        want[len(tensors) + column] = -1.0 if t is None else t.abs().max()
    return (
        flags == (False, False, True)
        and one.tolist() == [2.0, 1.0]
        and all(torch.allclose(o.double(), want, rtol=1e-6, atol=0, equal_nan=True) for o in (out, fast))
    )


def _check_tensors() -> list[torch.Tensor]:
    """Tensors the kernel's reductions and partials are checked on: NaN, inf of both signs, values whose
    squares overflow float32, a large mean beside a small spread, a strided tensor, tensors read in
    several blocks (of both signs), small and 0-d ones (float32; each also in float64)."""
    g = torch.Generator().manual_seed(0)
    base = [
        torch.arange(-5.0, 70.0),
        torch.tensor([1.0, float("nan"), 2.0]),
        torch.tensor([float("inf"), -1.0]),
        torch.tensor([float("inf"), float("-inf")]),
        torch.full((3,), -1e30),
        torch.randn(9000, generator=g) + 1e4,
        torch.randn(9000, generator=g),
        torch.arange(12.0).view(3, 4).t(),
        torch.tensor(-2.5),
        torch.randn(5000, generator=g).index_fill_(0, torch.tensor([4321]), float("-inf")),
    ]
    return base + [t.double() for t in base]


def _torch_reduction(t: torch.Tensor, reduction: str, absolute: bool) -> float:
    t = t.double().abs() if absolute else t.double()
    if reduction in ("std", "variance"):
        return (t.std if reduction == "std" else t.var)(correction=0).item()
    if reduction in ("l1", "l2"):
        return torch.linalg.vector_norm(t, 1 if reduction == "l1" else 2).item()
    return {"min": torch.amin, "max": torch.amax, "mean": torch.mean, "sum": torch.sum}[reduction](t).item()


def _reduces_right(reduce) -> bool:
    """The kernel's reductions (every one, plain and abs) against torch's in float64; its refusals: an
    empty tensor, float32 beside float64."""
    codes = list(range(2 * len(REDUCTIONS)))
    for dtype, bits in ((torch.float32, 32), (torch.float64, 64)):
        tensors = [t for t in _check_tensors() if t.dtype == dtype]
        out = torch.empty(len(tensors), len(codes), dtype=torch.float64)
        if reduce(tensors, codes, out) != bits:
            return False
        want = torch.tensor(
            [[_torch_reduction(t, REDUCTIONS[c // 2], bool(c % 2)) for c in codes] for t in tensors],
            dtype=torch.float64,
        )
        if not torch.allclose(out, want, rtol=1e-6, atol=1e-9, equal_nan=True):
            return False
    out = torch.empty(2, 1, dtype=torch.float64)
    return (
        reduce([torch.ones(2), torch.ones(0)], [0], out)
        == 0
        == reduce([torch.ones(2), torch.ones(2, dtype=torch.float64)], [0], out)
    )


def _list_function(library: Path):
    """The library's smdebug_reduce_list, its plain types set; None where it was built without it."""
    dll = ctypes.PyDLL(str(library))  # (the GIL held: it reads Python objects)
    if not hasattr(dll, "smdebug_reduce_list"):
        return None
    init = dll.smdebug_reduce_init
    init.argtypes = [ctypes.py_object, ctypes.py_object]
    if not init(torch.Tensor, torch.nn.Parameter):
        return None
    function = dll.smdebug_reduce_list
    function.argtypes = [ctypes.py_object, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    function.restype = ctypes.c_int64
    return function


def _lists_right(function) -> bool:
    """smdebug_reduce_list's values and refusals equal the op's (``_reduce``, checked before): every
    reduction of the check tensors, in each dtype and as parameters; an empty tensor, float32 beside
    float64, a tensor subclass, a value that is no tensor, a tuple, a wrong count."""
    every = list(range(2 * len(REDUCTIONS)))

    class Sub(torch.Tensor):
        pass

    def agree(values, codes, rows=None) -> bool:
        rows = len(values) if rows is None else rows
        want = torch.zeros(rows, len(codes), dtype=torch.float64)
        got = torch.zeros(rows, len(codes), dtype=torch.float64)
        array = (ctypes.c_int64 * len(codes))(*codes)
        bits = function(values, ctypes.addressof(array), len(codes), got.data_ptr(), rows)
        plain = type(values) is list and rows == len(values)
        plain = plain and all(type(v) in (torch.Tensor, torch.nn.Parameter) for v in values)
        expected = _reduce(values, codes, want) if plain else 0  # (a subclass: left to the op)
        return bits == expected and (not bits or torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0)))

    floats = [t for t in _check_tensors() if t.dtype == torch.float32]
    doubles = [t for t in _check_tensors() if t.dtype == torch.float64]
    ones = torch.ones(2)
    return (
        agree(floats, every)
        and agree(doubles, every)
        and agree([torch.nn.Parameter(t) for t in floats[:3]], [4, 15, 0])
        and agree([ones, torch.ones(0)], [0])
        and agree([ones, ones.double()], [0])
        and agree([ones, ones.as_subclass(Sub)], [0])
        and agree([ones, 1.0], [0])
        and agree((ones, ones), [0])
        and agree([ones, ones], [0], rows=3)
    )


def _partials_right(partials) -> bool:
    """The kernel's partial statistics against torch's in float64 (an empty tensor's: EMPTY)."""
    tensors = [*_check_tensors(), torch.empty(0), torch.tensor([3, -4], dtype=torch.int32)]
    out = torch.empty(len(tensors), len(STATS), dtype=torch.float64)
    partials(tensors, ABS | M2, out)
    for t, row in zip(tensors, out):
        if not t.numel():
            want = list(EMPTY)
        else:
            n = t.numel()
            var, avar = _torch_reduction(t, "variance", False), _torch_reduction(t, "variance", True)
            want = [n, *(_torch_reduction(t, r, a) for r, a in (("sum", False),)), var * n]
            want += [_torch_reduction(t, r, a) for r, a in (("min", False), ("max", False), ("sum", True))]
            want += [avar * n, _torch_reduction(t, "min", True), _torch_reduction(t, "max", True)]
            want += [_torch_reduction(t, "l2", False) ** 2, float((~torch.isfinite(t)).sum())]
        if not torch.allclose(
            row, torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=1e-9, equal_nan=True
        ):
            return False
    return True


def _python_include() -> list[str]:
    """The compiler's flag for Python's headers (the list reductions read Python objects), where they are."""
    include = sysconfig.get_paths().get("include")
    return [f"-I{include}"] if include and os.path.exists(os.path.join(include, "Python.h")) else []


def _built() -> Path | None:
    """The kernel's shared library, built now if this machine has none for this torch and source."""
    if sys.platform not in ("linux", "darwin"):
        return None
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    if compiler is None:
        logger.info("smdebug: no C++ compiler: torch's batched calls compute the health statistics")
        return None
    source = SOURCE.read_bytes()
    root = Path(torch.__file__).parent
    command = [
        compiler,
        "-O3",
        "-std=c++17",
        "-shared",
        "-fPIC",
        "-w",
        f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
        f"-I{root / 'include'}",
        *_python_include(),
        str(SOURCE),
        f"-L{root / 'lib'}",
        "-lc10",
        "-ltorch_cpu",
    ]
    key = hashlib.sha256(source + torch.__version__.encode() + " ".join(command).encode()).hexdigest()[:16]
    cache = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch_extensions"
    )
    library = Path(cache) / "smdebug_torch" / f"stats-{key}.so"
    if library.exists():
        return library
    library.parent.mkdir(parents=True, exist_ok=True)
    # One build per machine: the first process claims it with a marker file; the others wait for its
    # library. The build runs detached, at the lowest priority: it finishes (and puts the library in
    # place for the next processes) even when this process ends first; a claim older than
    # BUILD_TIMEOUT was abandoned (a machine that rebooted mid-build).
    marker = library.with_suffix(".building")
    for _ in range(2):
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            break
        except FileExistsError:
            try:
                age = time.time() - marker.stat().st_mtime
            except FileNotFoundError:  # (the other build just ended)
                continue
            if age > BUILD_TIMEOUT:
                marker.unlink(missing_ok=True)
                continue
            deadline = time.time() + BUILD_TIMEOUT - age
            while time.time() < deadline and marker.exists() and not library.exists():
                time.sleep(1)
            return library if library.exists() else None
    else:
        return None
    partial = library.with_suffix(f".{os.getpid()}.partial")
    nice = ["nice", "-n", "19"] if shutil.which("nice") else []
    script = (
        f"{shlex.join([*nice, *command, '-o', str(partial)])} && mv -f {shlex.quote(str(partial))} "
        f"{shlex.quote(str(library))}; status=$?; rm -f {shlex.quote(str(partial))} {shlex.quote(str(marker))}; "
        "exit $status"
    )
    proc = subprocess.Popen(
        ["sh", "-c", script],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # (not ended with this process)
    )
    try:
        _, errors = proc.communicate(timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        partial.unlink(missing_ok=True)
        marker.unlink(missing_ok=True)
        return None
    if proc.returncode != 0 or not library.exists():
        logger.info("smdebug: the native statistics kernel did not build: %s", errors.strip()[-500:])
        return None
    return library
