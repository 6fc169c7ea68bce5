"""Installed as users install it (issue 28): a plain ``pip install`` of the sources into a fresh
virtualenv, without extras, gives every ``tvmc`` verb what it needs; without a C compiler the
install stops with one line naming it; ``pip wheel`` gives a wheel carrying the built simulator
library, which installs and runs the demo with no compiler present.

One virtualenv for the module (creating it and installing the dependencies takes ~30 s with
pip's wheel cache warm; pip uses the machine's package index and cache). The sources are copied
first, so pip's build directories never land in the repository. Subprocesses run without this
process's ``PYTHONPATH`` (which points at the sources) so that only the installed package is
used.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
#: what is not part of the sources (build products, caches, the developer's venv, outputs)
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "build", "dist", "work", "*.egg-info",
                                     "__pycache__", "*.so", ".*_cache", "*.tar")
NO_CC = "/nonexistent/cc"


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without what would import the sources or another build."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "ACCELSIM_LIB", "CC", "CXX")}
    env.update(extra)
    return env


def _run(cmd: list, cwd: Path, env: dict[str, str], timeout: float = 600
         ) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"{proc.args}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _no_compiler_env(venv: Path, **extra: str) -> dict[str, str]:
    """``PATH`` holding only the virtualenv's scripts: no cc, gcc, g++ or clang."""
    env = _env(PATH=str(venv / "bin"), **extra)
    for cc in ("cc", "gcc", "g++", "c++", "clang"):
        assert shutil.which(cc, path=env["PATH"]) is None
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> SimpleNamespace:
    """A fresh virtualenv with ``pip install <copy of the sources>`` (no extras) done."""
    tmp = tmp_path_factory.mktemp("install")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCES)
    venv = tmp / "venv"
    t = time.perf_counter()
    _ok(_run([sys.executable, "-m", "venv", venv], tmp, _env()))
    _ok(_run([venv / "bin" / "python", "-m", "pip", "install", "-q", src], tmp, _env()))
    seconds = time.perf_counter() - t
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
    print(f"fresh virtualenv + pip install: {seconds:.0f} s, {size / 2**20:.0f} MiB")
    work = tmp / "work"
    work.mkdir()
    return SimpleNamespace(src=src, venv=venv, work=work, tmp=tmp)


def test_every_verb_runs_after_a_plain_pip_install(installed):
    venv, work = installed.venv, installed.work
    tvmc, env = venv / "bin" / "tvmc", _env(TVM_ACCEL_CACHE=str(installed.tmp / "cache"))
    where = _ok(_run([venv / "bin" / "python", "-c",
                      "import tvm_accel, onnxruntime; print(tvm_accel.__file__)"], work, env))
    assert where.startswith(str(venv)), where  # the installed package, not the sources
    listed = _ok(_run([venv / "bin" / "python", "-m", "pip", "list"], work, env))
    assert "pytest" not in listed  # no extras
    bundled = Path(where.strip()).parent / "models" / "tiny_cnn_int8.onnx"
    steps = [
        (["--version"], "tvm-accel"),
        (["zoo"], "tiny_cnn"),
        (["zoo", "tiny_cnn", "-o", "t.onnx"], "t.onnx"),
        (["quantize", "t.onnx", "-o", "tq.onnx"], "tq.onnx"),
        (["compile", bundled, "--target", "vta, llvm", "-o", "m.tar"], "layers on vta"),
        (["run", "m.tar", "--fill-mode", "random", "--profile"], "summary:"),
        (["tune", bundled, "--target", "vta, llvm", "-o", "rec.json", "--trials", "2"],
         "trials"),
        (["timeline", "m.tar", "-o", "m.png"], "m.png"),
    ]
    for argv, expected in steps:
        t = time.perf_counter()
        out = _ok(_run([tvmc, *argv], work, env))
        print(f"tvmc {' '.join(map(str, argv))}: exit 0 in {time.perf_counter() - t:.1f} s; "
              f"{out.strip().splitlines()[-1][:100] if out.strip() else ''}")
        assert expected in out, (argv, out[-2000:])
    assert (work / "m.png").stat().st_size > 0 and (work / "rec.json").stat().st_size > 0


@pytest.mark.parametrize(("cc", "named"), [(NO_CC, f"CC={NO_CC} not found"),
                                           (None, "neither cc nor gcc is on PATH")],
                         ids=["CC_missing", "no_cc_on_PATH"])
def test_pip_install_without_a_c_compiler_says_so_in_one_line(installed, cc, named):
    extra = {"CC": cc} if cc else {}
    proc = _run([installed.venv / "bin" / "python", "-m", "pip", "install", "--no-deps",
                 installed.src], installed.tmp, _no_compiler_env(installed.venv, **extra))
    assert proc.returncode != 0
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines()
             if "needs a C compiler" in ln]
    print("\n".join(lines))
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in proc.stdout + proc.stderr


def test_the_wheel_carries_the_simulator_and_runs_without_a_compiler(installed):
    venv, tmp = installed.venv, installed.tmp
    dist = tmp / "dist"
    _ok(_run([venv / "bin" / "python", "-m", "pip", "wheel", "-q", "--no-deps", "-w", dist,
              installed.src], tmp, _env()))
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        libs = [n for n in z.namelist() if n.endswith("tvm_accel/lib/libaccelsim.so")]
    print(f"{wheel.name}: {wheel.stat().st_size / 1024:.0f} KiB")
    assert len(libs) == 1 and not wheel.name.endswith("-any.whl")  # a platform wheel
    no_cc = _no_compiler_env(venv, CC=NO_CC)
    _ok(_run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps",
              "--force-reinstall", wheel], tmp, no_cc))
    demo = _ok(_run([venv / "bin" / "python", "-m", "tvm_accel.demo"], installed.work, no_cc))
    assert "all targets bit-exact" in demo
    proc = _run([venv / "bin" / "tvmc", "compile",
                 installed.src / "python" / "tvm_accel" / "models" / "tiny_cnn_int8.onnx",
                 "--target", "vta, llvm", "-o", "nocc.tar"], installed.work,
                _no_compiler_env(venv))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "C/C++ compiler is needed to link" in proc.stderr
