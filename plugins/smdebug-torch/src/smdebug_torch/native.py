"""The native statistics kernel (stats.cpp): every tensor's l2 norm and max |x| in one call and one
reading of each tensor, on the CPU.

It is built with the machine's C++ compiler against the installed torch, once per machine, torch and
source (kept in torch's extension cache, ``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``),
by a detached compiler at the lowest priority, which a background thread started by the first hook
with ``health=True`` waits for: training never waits for it.
Until it is loaded, and wherever it cannot be built (no compiler, another platform, ``SMDEBUG_NATIVE=0``),
torch's batched calls compute the same statistics.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

logger = logging.getLogger("smdebug")

SOURCE = Path(__file__).with_name("stats.cpp")
BUILD_TIMEOUT = 600  # seconds: a build that takes longer is given up

_watch = None  # torch.classes.smdebug_torch.HealthWatch once loaded
_thread: threading.Thread | None = None
_lock = threading.Lock()


def health_watch(weights: list, grad_params: list, columns: list[int]):
    """A HealthWatch of these parameters (``fill(loss, with_grads, row)`` writes a step's statistics of
    the weights, their gradients and the loss into the row's columns), or None while the kernel is not
    loaded; the first call starts loading it (building it first if this machine has none)."""
    if _watch is None:
        if _thread is None:
            start()
        return None
    return _watch(weights, grad_params, columns)


def start() -> None:
    global _thread
    with _lock:
        if _thread is None and os.environ.get("SMDEBUG_NATIVE", "1") != "0":
            _thread = threading.Thread(target=_load, name="smdebug-native-build", daemon=True)
            _thread.start()


def wait(timeout: float | None = None) -> bool:
    """Whether the kernel is loaded, once loading has ended (waiting at most ``timeout``)."""
    start()
    thread = _thread
    if thread is not None:
        thread.join(timeout)
    return _watch is not None


def _load() -> None:
    global _watch
    try:
        library = _built()
        if library is None:
            return
        torch.ops.load_library(str(library))
        watch = torch.classes.smdebug_torch.HealthWatch
        if _works(watch):
            _watch = watch
        else:
            logger.info("smdebug: the native statistics kernel %s computes wrong values: not used", library)
    except Exception as exc:  # no kernel: torch's calls compute the statistics
        logger.info("smdebug: the native statistics kernel is not used: %s", exc)


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
    out = torch.empty(2 * len(tensors))
    with torch.no_grad():
        watch(weights, params, columns).fill(loss, True, out)
    want = torch.empty(2 * len(tensors), dtype=torch.float64)
    for t, column in zip(tensors, columns):
        t = None if t is None else t.double()
        want[column] = -1.0 if t is None else torch.linalg.vector_norm(t)
        want[len(tensors) + column] = -1.0 if t is None else t.abs().max()
    return bool(torch.allclose(out.double(), want, rtol=1e-6, atol=0, equal_nan=True))


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
