"""The simulator fuzz drivers of the three targets against an ASan + UBSan build of ``sim/``.

The library is compiled into a temporary directory and loaded by the fuzz workers through
``ACCELSIM_LIB`` (:mod:`tvm_accel.simlib`). Python itself is not instrumented, so the sanitizer
runtime is preloaded (with libstdc++, which ASan must find at start-up to intercept C++ throws
in TVM); leak checking is off (the interpreter's own allocations are reported as leaks). Any
sanitizer report fails the test: UBSan halts on the first one, ASan always does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers import fuzz

ROOT = Path(__file__).resolve().parents[2]
#: fuzz test files (relative to tests/) and their case counts
FUZZ_TESTS = [pytest.param("vta_cp/test_simulator.py", 2000, id="vta_cp"),
              pytest.param("dpu/test_dpu_simulator.py", 600, id="dpu"),
              pytest.param("marsellus/test_marsellus_simulator.py", 800, id="marsellus"),
              # every single-field change of every target's config, then 600 random ones
              pytest.param("sim/test_sim_configs.py", 3653, id="configs")]
SANITIZE = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g"]
REPORTS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "runtime error:")


def _runtime(cc: str, name: str) -> str:
    path = subprocess.run([cc, f"-print-file-name={name}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    if not os.path.isabs(path) or not os.path.exists(path):
        pytest.skip(f"{cc} has no {name}")
    return path


@pytest.fixture(scope="module")
def sanitizer_env(tmp_path_factory) -> dict[str, str]:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        pytest.skip("no C compiler")
    lib = tmp_path_factory.mktemp("asan") / "libaccelsim.so"
    sources = sorted(str(p) for p in (ROOT / "sim").rglob("*.c"))
    subprocess.run([cc, "-std=c99", "-O1", "-fPIC", "-shared", *SANITIZE, f"-I{ROOT / 'sim'}",
                    *sources, "-o", str(lib), "-lm"], check=True)
    preload = [_runtime(cc, "libasan.so"), _runtime(cc, "libstdc++.so")]
    return {"ACCELSIM_LIB": str(lib), "LD_PRELOAD": " ".join(preload),
            "ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1"}


@pytest.mark.slow
@pytest.mark.parametrize(("script", "count"), FUZZ_TESTS)
def test_fuzzed_streams_are_clean_under_asan_and_ubsan(sanitizer_env, script, count):
    ok, err = fuzz.run_worker(str(ROOT / "tests" / script), count, env=sanitizer_env,
                              timeout=1800, forbid=REPORTS)
    assert ok + err == count
