"""Packaging beyond pyproject.toml: install the startup file ``zz-smdebug-activation.pth``.

The interpreter runs the ``import`` lines of the .pth files it finds in site-packages at startup, so the
file must sit at the root of the wheel: ``build_py`` copies it there for ``pip install ./core``, and
``editable_wheel`` adds it to the editable wheel for ``pip install -e ./core`` (whose own .pth only puts
``src`` on sys.path). Both wheels list it in RECORD, so pip uninstalls it with the rest.

The interpreter runs .pth files in name order; "zz-" makes this one run last, once every other .pth
(editable installs of plugins, whichever tool made them) has put its folders on sys.path.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "zz-smdebug-activation.pth"
HERE = Path(__file__).parent


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(str(HERE / PTH), os.path.join(self.build_lib, PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


class EditableWheelWithPth(editable_wheel):
    def run(self):
        super().run()
        wheels = sorted(Path(self.dist_dir).glob("*.whl"), key=lambda p: p.stat().st_mtime)
        if not wheels:
            raise RuntimeError(f"no editable wheel found in {self.dist_dir} to add {PTH} to")
        _add_to_wheel(wheels[-1], PTH, (HERE / PTH).read_bytes())


def _add_to_wheel(wheel: Path, name: str, data: bytes) -> None:
    """Rewrite the wheel with one more file at its root, recorded in RECORD."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    with zipfile.ZipFile(wheel) as src:
        entries = [(info, src.read(info)) for info in src.infolist()]
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        dst.writestr(name, data)
        for info, content in entries:
            if info.filename.endswith(".dist-info/RECORD"):
                content = f"{name},sha256={digest},{len(data)}\n".encode() + content
            dst.writestr(info, content)
    tmp.replace(wheel)


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
