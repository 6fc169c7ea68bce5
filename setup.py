"""Build hook: compile the C simulator in ``sim/`` into ``tvm_accel/lib/libaccelsim.so``.

The library is plain C99 loaded with ``ctypes`` (no CPython API), so it is built with the system C
compiler directly rather than as a Python extension module. ``ACCELSIM_WERROR=1`` (set by
``scripts/test.sh``) turns every compiler warning into an error.

Without a working C compiler the build stops with one ``error:`` line naming the compiler it
looked for (``$CC``, else ``cc`` / ``gcc`` on ``PATH``); ``pip wheel .`` on a machine that has one
gives a platform wheel carrying the built library, which installs and runs without a compiler.

The license is given here (``dynamic`` in ``pyproject.toml``) rather than as a ``project.license``
table, which setuptools >= 77 deprecates, or as an SPDX string, which the setuptools < 77 of
``setup.py build_sim`` in an older venv rejects.
"""

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from setuptools import Command, setup
from setuptools.command.build_py import build_py
from setuptools.command.develop import develop
from setuptools.errors import CompileError

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1: the wheel package's command, if installed
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

ROOT = Path(__file__).parent.resolve()
LIB_NAME = "libaccelsim.so"


def compile_sim(out_dir: Path) -> Path:
    """Compiles every C file under ``sim/`` into ``out_dir/libaccelsim.so``."""
    sources = sorted(str(p) for p in (ROOT / "sim").rglob("*.c"))
    if not sources:
        raise RuntimeError("no C sources found under sim/")
    cc = c_compiler()
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / LIB_NAME
    werror = ["-Werror"] if os.environ.get("ACCELSIM_WERROR") == "1" else []
    cmd = [*cc, "-std=c99", "-O3", "-fPIC", "-shared", "-Wall", "-Wextra", *werror,
           f"-I{ROOT / 'sim'}", *sources, "-o", str(out), "-lm"]
    try:
        subprocess.check_call(cmd)
    except (OSError, subprocess.CalledProcessError) as e:
        raise CompileError(f"tvm-accel: building the simulator library with {cc[0]} failed "
                           f"({e}); see the compiler output above") from None
    return out


def c_compiler() -> list[str]:
    """The C compiler command (``$CC``, else ``cc`` or ``gcc`` on ``PATH``), or one error line
    naming what was looked for: the simulator library cannot be built without it."""
    hint = ("install one (Debian/Ubuntu: apt-get install gcc) or set CC, or install a prebuilt "
            "tvm-accel wheel (pip wheel . on a machine with a compiler)")
    env_cc = shlex.split(os.environ.get("CC", ""))
    if env_cc:
        if shutil.which(env_cc[0]) is None:
            raise CompileError(f"tvm-accel needs a C compiler to build its simulator "
                               f"(libaccelsim.so): CC={env_cc[0]} not found; {hint}")
        return env_cc
    found = shutil.which("cc") or shutil.which("gcc")
    if found is None:
        raise CompileError("tvm-accel needs a C compiler to build its simulator "
                           f"(libaccelsim.so): neither cc nor gcc is on PATH; {hint}")
    return [found]


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


COMMANDS = {"build_py": BuildPy, "build_sim": BuildSim, "develop": Develop}
if bdist_wheel is not None:
    class BdistWheel(bdist_wheel):
        """A platform wheel (``py3-none-linux_x86_64``): it carries a native library, but one
        loaded with ``ctypes``, so it fits any Python 3 of the platform."""

        def finalize_options(self):
            super().finalize_options()
            self.root_is_pure = False

        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    COMMANDS["bdist_wheel"] = BdistWheel


setup(license="Apache-2.0", cmdclass=COMMANDS)
