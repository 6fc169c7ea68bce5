"""Build hook: compile the C simulator in ``sim/`` into ``tvm_accel/lib/libaccelsim.so``.

The library is plain C99 loaded with ``ctypes`` (no CPython API), so it is built with the system C
compiler directly rather than as a Python extension module. ``ACCELSIM_WERROR=1`` (set by
``scripts/test.sh``) turns every compiler warning into an error.
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop

ROOT = Path(__file__).parent.resolve()
LIB_NAME = "libaccelsim.so"


def compile_sim(out_dir: Path) -> Path:
    """Compiles every C file under ``sim/`` into ``out_dir/libaccelsim.so``."""
    sources = sorted(str(p) for p in (ROOT / "sim").rglob("*.c"))
    if not sources:
        raise RuntimeError("no C sources found under sim/")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise RuntimeError("a C compiler (cc or gcc) is needed to build the simulator")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / LIB_NAME
    werror = ["-Werror"] if os.environ.get("ACCELSIM_WERROR") == "1" else []
    cmd = [cc, "-std=c99", "-O3", "-fPIC", "-shared", "-Wall", "-Wextra", *werror,
           f"-I{ROOT / 'sim'}", *sources, "-o", str(out), "-lm"]
    subprocess.check_call(cmd)
    return out


class BuildSim(Command):
    """``python setup.py build_sim``: build the simulator into the source tree."""

    user_options: list = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        compile_sim(ROOT / "python" / "tvm_accel" / "lib")


class BuildPy(build_py):
    def run(self):
        super().run()
        if not self.editable_mode:
            compile_sim(Path(self.build_lib) / "tvm_accel" / "lib")
        else:
            compile_sim(ROOT / "python" / "tvm_accel" / "lib")


class Develop(develop):
    def run(self):
        compile_sim(ROOT / "python" / "tvm_accel" / "lib")
        super().run()


setup(cmdclass={"build_py": BuildPy, "build_sim": BuildSim, "develop": Develop})
