"""The README's install lines, one per framework, each resolved by pip (``--dry-run --report``) as a user
would run it from a clone: the CPU build of its framework, no second build of it, no other framework, and
smdebug-core from this tree (it is on no index).

Offline-friendly: where the PyTorch index cannot be reached, torch's CPU wheel comes from PIP_FIND_LINKS
(this machine's /opt/wheels) and the line is resolved without that index."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).parents[2]
# plugin distribution -> (the framework's CPU build, every distribution of that framework)
FRAMEWORKS = {
    "smdebug-torch": ("torch", {"torch"}),
    "smdebug-tf": (
        "tensorflow-cpu",
        {"tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tf-nightly"},
    ),
    "smdebug-mxnet": ("mxnet", {"mxnet", "mxnet-mkl", "mxnet-cu112", "mxnet-cu110", "mxnet-cu102"}),
    "smdebug-xgb": ("xgboost-cpu", {"xgboost", "xgboost-cpu"}),
}
GPU_ONLY = re.compile(r"^(nvidia-.*|triton|pytorch-triton.*|cuda-.*)$")


def readme_lines(path: Path = ROOT / "README.md") -> dict[str, list[str]]:
    """plugin distribution -> the arguments after ``pip install`` of its line in the Install section."""
    section = path.read_text().split("## Install", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = {}
    for line in block.splitlines():
        args = shlex.split(line, comments=True)
        if not args:
            continue
        assert args[:2] == ["pip", "install"], line
        plugins = [
            p for p in FRAMEWORKS if any(a.split("[")[0].rstrip("/").endswith(f"plugins/{p}") for a in args)
        ]
        assert len(plugins) == 1, f"one plugin per line: {line}"
        assert plugins[0] not in lines, f"two lines for {plugins[0]}"
        lines[plugins[0]] = args[2:]
    return lines


LINES = readme_lines()


def test_one_line_per_framework_and_the_plugin_readmes_agree():
    assert sorted(LINES) == sorted(FRAMEWORKS)
    for plugin, args in LINES.items():
        assert "./core" in args, f"{plugin}: smdebug-core is on no index, the line must take ./core"
        text = (ROOT / "plugins" / plugin / "README.md").read_text()
        assert shlex.join(["pip", "install", *args]) in _pip_lines(text), f"{plugin}'s README differs"


def _pip_lines(text: str) -> list[str]:
    return [shlex.join(shlex.split(m, comments=True)) for m in re.findall(r"^(pip install .*)$", text, re.M)]


def _reachable(url: str) -> bool:
    try:
        socket.getaddrinfo(url.split("://", 1)[1].split("/", 1)[0], 443)
        return True
    except OSError:
        return False


def _offline(args: list[str]) -> list[str]:
    """The line without an index this machine cannot reach (the wheels then come from PIP_FIND_LINKS)."""
    out = list(args)
    for i, arg in enumerate(args[:-1]):
        if arg == "--extra-index-url" and not _reachable(args[i + 1]):
            assert os.environ.get("PIP_FIND_LINKS"), (
                f"{args[i + 1]} is unreachable and PIP_FIND_LINKS is unset"
            )
            out.remove(arg)
            out.remove(args[i + 1])
    return out


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict:
    """plugin -> pip's report of its line (the four resolved at once: they wait on the network)."""
    folder = tmp_path_factory.mktemp("reports")

    def resolve(plugin: str):
        report = folder / f"{plugin}.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        cmd += ["--report", str(report), *_offline(LINES[plugin])]
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{plugin}: {done.stderr[-3000:]}"
        return {
            canonicalize_name(i["metadata"]["name"]): i for i in json.loads(report.read_text())["install"]
        }

    with ThreadPoolExecutor(len(LINES)) as pool:
        return dict(zip(LINES, pool.map(resolve, LINES)))


@pytest.mark.parametrize("plugin", sorted(FRAMEWORKS))
def test_install_line_resolves_to_the_cpu_build_alone(plugin, resolved):
    items = resolved[plugin]
    assert plugin in items and "smdebug-core" in items
    assert items["smdebug-core"]["download_info"]["url"] == (ROOT / "core").as_uri()
    cpu_build, builds = FRAMEWORKS[plugin]
    assert builds & set(items) == {cpu_build}, f"{plugin}: {sorted(builds & set(items))}"
    others = {d for p, (_, b) in FRAMEWORKS.items() if p != plugin for d in b} - builds
    assert not others & set(items), f"{plugin} pulls another framework: {sorted(others & set(items))}"
    assert not [n for n in items if GPU_ONLY.match(n)], f"{plugin} pulls GPU packages"
    if plugin == "smdebug-torch":
        assert items["torch"]["metadata"]["version"].endswith("+cpu")
    if plugin == "smdebug-mxnet":
        assert Version(items["numpy"]["metadata"]["version"]) < Version("1.24")
