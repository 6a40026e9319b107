"""Test sessions: one per distribution, each in its own virtualenv (hydra-style, one row per plugin).

`nox` runs the default sessions (the README's test command, and CI's); `nox -s demo` runs the demo.
"""

from __future__ import annotations

from pathlib import Path

import nox

ROOT = Path(__file__).parent
nox.options.default_venv_backend = "virtualenv"  # pip finds the local CPU torch wheel; uv would not
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = False

TORCH = "torch==2.13.0"  # a CPU build on this machine's disk; a bare "torch" pulls a CUDA build
TEST_DEPS = ["pytest>=8", "pytest-timeout"]

# distribution folder -> (extra pip requirements, test folder)
DISTRIBUTIONS = {
    "core": ([], "tests/core"),
    "torch": ([TORCH], "tests/torch"),
}

nox.options.sessions = [f"tests-{name}" for name in DISTRIBUTIONS] + ["lint"]


def _install_core(session: nox.Session) -> None:
    session.install("-e", str(ROOT / "core"))


def _tests(name: str, extra: list[str], folder: str):
    @nox.session(name=f"tests-{name}")
    def session_fn(session: nox.Session) -> None:
        session.install(*TEST_DEPS, *extra)
        _install_core(session)
        if name == "core":
            # a small real plugin distribution, to test discovery and alias imports end to end
            session.install(str(ROOT / "tests/core/fixture_plugins/smdebug-dummy"))
            session.install(str(ROOT / "tests/core/fixture_plugins/smdebug-broken"))
        else:
            session.install("-e", str(ROOT / "plugins" / f"smdebug-{name}"))
        session.run("pytest", folder, *session.posargs)

    return session_fn


for _name, (_extra, _folder) in DISTRIBUTIONS.items():
    globals()[f"tests_{_name}"] = _tests(_name, _extra, _folder)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: train a small PyTorch model with the hook, then analyse the run."""
    session.install(TORCH)
    _install_core(session)
    session.install("-e", str(ROOT / "plugins/smdebug-torch"))
    session.run("python", str(ROOT / "examples/demo.py"), *session.posargs)
