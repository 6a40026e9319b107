"""Test sessions, each in its own virtualenv (hydra-style: one row per distribution or suite).

`nox` runs the default sessions (the README's test command, and CI's); `nox -s demo` runs the demo and
`nox -s bench` the benchmarks (neither is a default session).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
# uv: each venv hard-links its packages from one cache (one copy of torch on disk, not one per session).
# uv reads no pip config: the wheels pip finds through PIP_FIND_LINKS (this machine's CPU torch) it is told of.
nox.options.default_venv_backend = "uv" if shutil.which("uv") else "virtualenv"
if os.environ.get("PIP_FIND_LINKS") and not os.environ.get("UV_FIND_LINKS"):
    os.environ["UV_FIND_LINKS"] = os.environ["PIP_FIND_LINKS"]
# Python keeps the bytecode it compiles: with PYTHONDONTWRITEBYTECODE (set on some machines) every process
# the tests start compiles torch from source again (`import torch`: 5.9 s against 2.3 s).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False

TORCH = "torch==2.13.0"  # a CPU build on this machine's disk; a bare "torch" pulls a CUDA build
TEST_DEPS = ["pytest>=8", "pytest-timeout"]
# xgboost's CPU-only build (6 MB, the plugin's [cpu] extra); "xgboost" is 130 MB of CUDA kernels and pulls
# NVIDIA's NCCL.
XGBOOST = ["dask[dataframe]", "distributed", "scikit-learn"]  # the tests' Dask, sklearn
# The real smdebug 1.0.34 imports only with these beside it (it forgets some and needs old others). It
# asks for setuptools<70 elsewhere, but torch 2.13 needs >=77 and smdebug imports fine with it.
SMDEBUG_1034 = [
    "smdebug==1.0.34",
    TORCH,
    "requests",
    "pandas",
    "psutil",
    "boto3",
    "numpy<2",
    "protobuf<=3.20.3",
]
DUMMY_PLUGINS = ["tests/core/fixture_plugins/smdebug-dummy", "tests/core/fixture_plugins/smdebug-broken"]
# a toy framework, its plugin and a broken plugin, installed as a third party ships them (not editable)
THIRDPARTY = [
    "tests/thirdparty/toyml",
    "tests/thirdparty/smdebug-toyml",
    "tests/thirdparty/smdebug-toybroken",
]

# session "tests-<name>" -> (extra pip requirements, local distributions installed with -e, test folder)
SUITES = {
    "core": ([], [], "tests/core"),
    # (matplotlib, pandas: the README's demo, tests/torch/test_demo.py, plots and tabulates)
    "torch": ([TORCH, "matplotlib", "pandas"], ["plugins/smdebug-torch"], "tests/torch"),
    # sharded (FSDP2, tensor parallel) and DDP training on 2 gloo CPU ranks: one 2-process job
    # (pandas: smdebug diff over a DDP job's two ranks)
    "torch-dist": ([TORCH, "pandas"], ["plugins/smdebug-torch"], "tests/torch_dist"),
    "xgb": (XGBOOST, ["plugins/smdebug-xgb[cpu]"], "tests/xgb"),
    # storage, analysis, rules, dask: the core alone, on runs trained in numpy (tests/numpy_training.py)
    "storage": (["s3fs", "moto[server]"], [], "tests/storage"),
    "analysis": (["tensorboard", "matplotlib", "pandas", "s3fs", "moto[server]"], [], "tests/analysis"),
    "thirdparty": (["pip"], [], "tests/thirdparty"),  # its tests build wheels with pip
    "rules": ([], [], "tests/rules"),
    # rules and reads over many runs on a Dask LocalCluster (smdebug-core[dask]), local and on moto's S3
    "dask": (["dask[dataframe]", "distributed", "pandas", "s3fs", "moto[server]"], [], "tests/dask"),
    # Keras 3, TensorFlow's CPU build (the plugin's [cpu] extra)
    "tf": (["tensorflow-cpu==2.21.0"], ["plugins/smdebug-tf[cpu]"], "tests/tf"),
}

nox.options.sessions = [f"tests-{name}" for name in SUITES] + ["compat", "lint"]


@nox.session(name="tests-install", python="3.11")  # MXNet's line resolves on Python <= 3.11
def tests_install(session: nox.Session) -> None:
    """The README's install lines, each resolved by pip (--dry-run --report): nothing is installed."""
    session.install(*TEST_DEPS, "pip", "packaging")
    session.install("-e", str(ROOT / "core"))  # the shared conftest imports smdebug
    session.run("pytest", str(ROOT / "tests" / "install"), *session.posargs)


nox.options.sessions.append("tests-install")
CONTRACT = "tests/contract"
PLUGIN_SUITES = {"torch", "xgb", "thirdparty", "tf"}


def _install(session: nox.Session, requirements: list[str], local: list[str]) -> None:
    if requirements:
        session.install(*requirements)
    session.install("-e", str(ROOT / "core"), *(arg for p in local for arg in ("-e", str(ROOT / p))))


def _tests(name: str, requirements: list[str], local: list[str], folder: str):
    @nox.session(name=f"tests-{name}")
    def session_fn(session: nox.Session) -> None:
        _install(session, [*TEST_DEPS, *requirements], local)
        if name == "core":
            # small real plugin distributions, to test discovery and alias imports end to end
            session.install(*(str(ROOT / p) for p in DUMMY_PLUGINS))
        if name == "thirdparty":
            session.install(*(str(ROOT / p) for p in THIRDPARTY))
        if name in ("analysis", "torch"):
            _ensure_chromium(session)  # the HTML report's tests render it in headless Chromium
        # a framework plugin's session checks the plugin contract too (tests/contract, for every plugin)
        contract = [CONTRACT] if name in PLUGIN_SUITES else []
        # tests-tf has smdebug 1.0.34 read a Keras run (it reads runs without TensorFlow, in its own venv)
        env = {"SMDEBUG_1034_PYTHON": smdebug_1034_python(session)} if name == "tf" else None
        session.run("pytest", folder, *contract, *session.posargs, env=env)

    return session_fn


for _name, (_requirements, _local, _folder) in SUITES.items():
    globals()[f"tests_{_name}"] = _tests(_name, _requirements, _local, _folder)


def _ensure_chromium(session: nox.Session) -> None:
    """Debian's chromium, installed with apt-get where it is missing and we may (root); else the report's
    browser tests skip, saying why."""
    if shutil.which("chromium") or not shutil.which("apt-get") or os.geteuid() != 0:
        return
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    for args in (["update", "-qq"], ["install", "-y", "-qq", "--no-install-recommends", "chromium"]):
        try:
            session.run("apt-get", *args, external=True, env=env, silent=True)
        except Exception as exc:  # no network or no package: the browser tests skip
            session.warn(f"chromium could not be installed ({exc}); the report's browser tests will skip")
            return


def side_venv(session: nox.Session, name: str, requirements: list[str], python: str | None = None) -> str:
    """The python of .nox/<name>, a venv outside nox's sessions holding ``requirements`` (made and filled
    with uv where it is installed: hard links from its cache, as the sessions' venvs)."""
    venv = ROOT / ".nox" / name
    bin_python = venv / "bin" / "python"
    if shutil.which("uv"):
        if not bin_python.exists():
            session.run("uv", "venv", "-q", "-p", python or sys.executable, str(venv), external=True)
        session.run("uv", "pip", "install", "-q", "-p", str(bin_python), *requirements, external=True)
        return str(bin_python)
    if not bin_python.exists():
        session.run(
            sys.executable, "-m", "virtualenv", "-q", "-p", python or sys.executable, str(venv), external=True
        )
    session.run(str(bin_python), "-m", "pip", "install", "-q", *requirements, external=True)
    return str(bin_python)


def smdebug_1034_python(session: nox.Session) -> str:
    """The python of a venv of its own holding the real smdebug 1.0.34 (for compat and bench)."""
    python = side_venv(session, "smdebug-1.0.34", SMDEBUG_1034)
    session.run(python, "-c", "import smdebug.pytorch, smdebug.trials", external=True)
    return python


def smdebug_1034_mxnet_python(session: nox.Session) -> str:
    """The python of an MXNet venv of its own holding the real smdebug 1.0.34 (tests-mxnet and bench)."""
    python = side_venv(session, "smdebug-1.0.34-mxnet", SMDEBUG_1034_MXNET, "python3.11")
    session.run(python, "-c", "import smdebug.mxnet, smdebug.trials", external=True)
    return python


@nox.session
def compat(session: nox.Session) -> None:
    """Both directions against the real smdebug 1.0.34, run in its own venv: each reads the other's runs."""
    _install(session, [*TEST_DEPS, TORCH], ["plugins/smdebug-torch"])
    reference = smdebug_1034_python(session)
    env = {"SMDEBUG_1034_PYTHON": reference}
    session.run("pytest", str(ROOT / "tests" / "compat"), *session.posargs, env=env)


# MXNet 1.9.1 (its last release) needs numpy<1.24 (np.bool) and Python <= 3.11 (it imports distutils).
MXNET = ["mxnet==1.9.1", "numpy<1.24"]
SMDEBUG_1034_MXNET = [
    "smdebug==1.0.34",
    *MXNET,
    "requests",
    "pandas<2.3",
    "psutil",
    "protobuf<=3.20.3",
    "setuptools<70",  # smdebug 1.0.34 imports pkg_resources
]


@nox.session(name="tests-mxnet", python="3.11")
def tests_mxnet(session: nox.Session) -> None:
    """The MXNet plugin on MXNet 1.9.1; its compat tests run the same scripts under the real smdebug
    1.0.34, in an MXNet venv of its own (.nox/smdebug-1.0.34-mxnet)."""
    _install(session, [*TEST_DEPS, *MXNET], ["plugins/smdebug-mxnet"])
    env = {"SMDEBUG_1034_MXNET_PYTHON": smdebug_1034_mxnet_python(session)}
    session.run("pytest", str(ROOT / "tests" / "mxnet"), CONTRACT, *session.posargs, env=env)


nox.options.sessions.append("tests-mxnet")


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff==0.17.6")  # pinned: a new ruff release may format differently
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: train a small PyTorch model with the hook, then analyse the run."""
    _install(session, [TORCH, "matplotlib", "pandas"], ["plugins/smdebug-torch"])  # plot, DataFrame
    session.run("python", str(ROOT / "examples/demo.py"), *session.posargs)


def _bench_venv(session: nox.Session, name: str, requirements: list[str], local: list[str]) -> str:
    """A venv of its own (.nox/<name>, Python 3.11) with a framework and a regular install of this tree's
    core and plugin, for the TensorFlow and MXNet rows (bench/frameworks.py)."""
    python = ROOT / ".nox" / name / "bin" / "python"
    if not python.exists():
        venv = str(python.parent.parent)
        session.run(sys.executable, "-m", "virtualenv", "-q", "-p", "python3.11", venv, external=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    session.run(*pip, *requirements, str(ROOT / "core"), external=True)
    tree = [str(ROOT / "core"), *(str(ROOT / p) for p in local)]
    session.run(*pip, "--force-reinstall", "--no-deps", *tree, external=True)  # plugins: framework above
    return str(python)


def _framework_bench_args(session: nox.Session) -> list[str]:
    tf = _bench_venv(session, "bench-tf", ["tensorflow-cpu==2.21.0"], ["plugins/smdebug-tf"])
    mxnet = _bench_venv(session, "bench-mxnet", MXNET, ["plugins/smdebug-mxnet"])
    reference = smdebug_1034_mxnet_python(session)  # as tests-mxnet makes it
    return ["--tf-python", tf, "--mxnet-python", mxnet, "--smdebug-mxnet-python", reference]


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks against the real smdebug 1.0.34; prints the table and writes bench/RESULTS.md."""
    if {"-h", "--help"} & set(session.posargs):  # the driver's help needs none of the venvs below
        session.run(sys.executable, str(ROOT / "bench" / "run.py"), "--help", external=True)
        return
    ours = [str(ROOT / "core"), str(ROOT / "plugins/smdebug-torch")]
    # + Dask and pandas: the sweep row (smdebug-core[dask])
    session.install(
        TORCH, "s3fs", "moto[server]", "psutil", "dask[dataframe]", "distributed", "pandas", *ours
    )
    # a regular install, as users have it (not editable), of this tree's code even in a reused venv
    session.install("--force-reinstall", "--no-deps", *ours)
    reference = smdebug_1034_python(session)
    # torch alone (no smdebug at all): the baseline of the import-time row
    baseline = side_venv(session, "bench-baseline", [TORCH, "numpy"])
    session.run(
        "python",
        str(ROOT / "bench" / "run.py"),
        "--smdebug-python",
        reference,
        "--baseline-python",
        baseline,
        *_framework_bench_args(session),
        *session.posargs,
    )
