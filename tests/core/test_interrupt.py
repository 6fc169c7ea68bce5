"""Ctrl-C stops a simulation within a second, and the cycle budget is a ``tvmc run`` option
(issue 12, item 4).

Each simulator gets one hand-built instruction that would run for many seconds (a VTA GEMM with
16383 x 16383 loop iterations, a DPU CONV of 16 PEs x 9.7 GMAC, a MARSELLUS RBE job of 21.7 GMAC
in an enlarged L1); a timer thread sends SIGINT to the process 0.3 s into the run, and the run
must end with ``KeyboardInterrupt`` well within a second, leave no stop request behind and let
the next simulation run. ``tvmc run`` gets the same through the VM (in a subprocess whose VTA
binding swaps the package's program for the long GEMM): one stderr line, exit code 130.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import onnx
import pytest

from helpers import models
from tvm_accel import cli, simlib
from tvm_accel.errors import AccelError, SimulatorError

SIGNAL_AFTER_S = 0.3
#: SIGINT to the end of the call; the simulators poll every few ms, the waiting thread every 0.1 s
MAX_STOP_S = 1.0


# --- long single instructions, one per simulator ---------------------------------------------
def _vta_long():
    from tvm_vta_cp.codegen import ISA, FinishInsn, GemmInsn
    from tvm_vta_cp.hw_config import load_config
    from tvm_vta_cp.simulator import simulate

    cfg = load_config("vta_1x16x16")
    stream = ISA(cfg).encode_stream([GemmInsn(False, 0, 8, 16383, 16383), FinishInsn()])
    return lambda: simulate(cfg, stream, np.zeros(16, np.uint8))


def _vta_short():
    from tvm_vta_cp.codegen import ISA, FinishInsn, GemmInsn
    from tvm_vta_cp.hw_config import load_config
    from tvm_vta_cp.simulator import simulate

    cfg = load_config("vta_1x16x16")
    stream = ISA(cfg).encode_stream([GemmInsn(False, 0, 1, 100, 100), FinishInsn()])
    return lambda **kw: simulate(cfg, stream, np.zeros(16, np.uint8), **kw)


def _dpu_conv(cfg, h: int, c: int):
    from tvm_dpu.codegen import Conv, End, encode_stream
    from tvm_dpu.simulator import simulate

    conv = Conv(in_mem=0, in_addr=0, in_pix_stride=c, in_row_stride=h * c, ic=c, out_mem=1,
                out_addr=0, out_pix_stride=c, out_row_stride=h * c, out_h=h, out_w=h, oc=c,
                kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, pad_top=1, pad_bottom=1,
                pad_left=1, pad_right=1, shift=8, clip_lo=-128, clip_hi=127)
    q = 1024
    regions = {"INPUT": (0, q), "OUTPUT": (q, q), "PARAM": (2 * q, q), "INSN": (3 * q, 4096),
               "SWAP": (3 * q + 4096, q)}
    stream = encode_stream([conv, End()])
    return lambda **kw: simulate(cfg, stream, np.zeros(1 << 14, np.uint8), regions=regions, **kw)


def _dpu_long():
    from tvm_dpu.hw_config import load_config

    cfg = dataclasses.replace(load_config(), NUM_PE=16, FM_BANK_BYTES=1 << 17, PM_BYTES=1 << 23)
    return _dpu_conv(cfg, 32, 960)  # 0.9 MiB in and out per PE, 7.9 MiB of weights (PM <= 8 MiB)


def _dpu_short():
    from tvm_dpu.hw_config import load_config

    return _dpu_conv(load_config(), 8, 16)


def _mars_job(cfg, h: int, k: int, l1_bytes: int):
    from tvm_marsellus import codegen as cg
    from tvm_marsellus.simulator import simulate

    mib = 1 << 20
    ptrs = (dict(x_ptr=0, w_ptr=5 * mib, nq_ptr=8 * mib, y_ptr=9 * mib) if l1_bytes > mib else
            dict(x_ptr=0, w_ptr=4096, nq_ptr=32768, y_ptr=40960))
    job = cg.RbeJob(h_in=h + 2, w_in=h + 2, h_out=h, w_out=h, k_in=k, k_out=k, kernel=3,
                    shift=16, **ptrs)
    stream = cg.encode_stream([job])
    return lambda **kw: simulate(cfg, stream, l1=np.zeros(l1_bytes, np.uint8), **kw)


def _mars_long():
    from tvm_marsellus.hw_config import load_config

    cfg = dataclasses.replace(load_config(), L1_BYTES=1 << 24)
    return _mars_job(cfg, 96, 512, cfg.L1_BYTES)


def _mars_short():
    from tvm_marsellus.hw_config import load_config

    cfg = load_config()
    return _mars_job(cfg, 3, 32, cfg.L1_BYTES)


LONG = {"vta": _vta_long, "dpu": _dpu_long, "marsellus": _mars_long}
SHORT = {"vta": _vta_short, "dpu": _dpu_short, "marsellus": _mars_short}


def _sigint_after(seconds: float) -> threading.Timer:
    t = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    t.start()
    return t


@pytest.fixture(autouse=True)
def sigint_raises():
    """Python's Ctrl-C handler, also when the suite runs where SIGINT is ignored (a background
    job of a non-interactive shell inherits SIG_IGN, and Python then keeps it)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.mark.parametrize("target", list(LONG))
def test_ctrl_c_stops_a_long_instruction_within_a_second(target):
    run = LONG[target]()
    t0 = time.perf_counter()  # before the timer starts: a loaded machine may delay this line
    timer = _sigint_after(SIGNAL_AFTER_S)
    try:
        with pytest.raises(KeyboardInterrupt):
            run()
    finally:
        timer.cancel()  # never deliver the signal outside the call (it would stop pytest)
    elapsed = time.perf_counter() - t0
    assert SIGNAL_AFTER_S <= elapsed < SIGNAL_AFTER_S + MAX_STOP_S, elapsed
    assert not simlib.stop_requested()
    assert SHORT[target]()().cycles > 0  # the next simulation runs


@pytest.mark.parametrize("target", list(LONG))
def test_a_stop_request_interrupts_a_run_off_the_main_thread_with_its_position(target):
    """Off the main thread the call is direct; a stop request makes it return status
    ``interrupted`` naming the instruction and cycle."""
    run, out = LONG[target](), []

    def worker():
        try:
            run()
        except SimulatorError as e:
            out.append(e)

    th = threading.Thread(target=worker)
    th.start()
    time.sleep(SIGNAL_AFTER_S)
    t0 = time.perf_counter()
    simlib.request_stop()
    th.join(timeout=30)
    elapsed = time.perf_counter() - t0
    simlib.clear_stop()
    assert not th.is_alive() and out and elapsed < MAX_STOP_S, elapsed
    what = "cmd 0 (RBE)" if target == "marsellus" else \
        f"insn 0 ({'GEMM' if target == 'vta' else 'CONV'})"
    assert out[0].kind == "interrupted" and f"interrupted at {what}, cycle " in str(out[0])


@pytest.mark.parametrize("target", list(SHORT))
def test_a_pending_stop_request_stops_the_next_run_at_once(target):
    run = SHORT[target]()
    simlib.request_stop()
    try:
        with pytest.raises(SimulatorError, match="interrupted") as ei:
            run()
    finally:
        simlib.clear_stop()
    assert ei.value.kind == "interrupted" and ei.value.code == simlib.INTERRUPTED
    assert run().cycles > 0


@pytest.mark.parametrize("target", list(SHORT))
def test_cycle_budget_applies_to_runs_without_their_own(target):
    run = SHORT[target]()
    full = run().cycles
    with simlib.cycle_budget(full - 1):
        with pytest.raises(simlib.CycleBudgetError, match="cycle budget") as ei:
            run()
        assert ei.value.kind == "budget"
        assert run(max_cycles=full).cycles == full  # an explicit budget wins
        with simlib.cycle_budget(full):  # nests
            assert run().cycles == full
        with pytest.raises(simlib.CycleBudgetError):
            run()
    assert run().cycles == full and simlib.current_cycle_budget() is None


@pytest.mark.parametrize("bad", [0, -1, 2**62 + 1, 1.5, True, "10"])
def test_cycle_budget_must_be_a_positive_integer(bad):
    with pytest.raises(AccelError, match="max_cycles must be a positive"):
        with simlib.cycle_budget(bad):
            pass


def test_a_call_abandoned_before_it_started_never_runs():
    """The waiting thread gives up on a call the worker has not started (an exception between
    queueing and waiting): the worker then drops it instead of writing into freed arrays."""
    ran = []
    job = simlib._Job(lambda: ran.append(1), ())
    simlib._abandon(job)
    job.run()  # what the worker does when it gets to the job
    assert job.finished and not ran and not simlib.stop_requested()


def test_status_names_match_the_library():
    name = simlib.function("accel_status_name", ctypes.c_char_p, [ctypes.c_int])
    assert {code: name(code).decode() for code in simlib.STATUS_NAMES} == simlib.STATUS_NAMES
    assert simlib.STATUS_NAMES[simlib.INTERRUPTED] == "interrupted"


# --- tvmc run -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("interrupt")
    model, pkg = str(root / "m.onnx"), str(root / "m.tar")
    onnx.save(models.quantized("single_conv", cin=16, cout=16, hw=8), model)
    assert cli.main(["compile", model, "--target", "vta, llvm", "--target-vta-strategy",
                     "static", "-o", pkg]) == 0
    return pkg


def _tvmc(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:  # argparse
        return e.code


def test_max_cycles_too_small_is_one_error_line(package, capsys):
    assert _tvmc(["run", package, "--max-cycles", "10"]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1, captured.err
    assert err[0].startswith("tvmc run: error: ") and package in err[0]
    assert "cycle budget of 10 cycles exceeded" in err[0] and "--max-cycles (now 10" in err[0]
    assert "raise max_cycles" not in err[0]


def test_a_generous_max_cycles_runs(package, capsys):
    assert _tvmc(["run", package, "--max-cycles", str(10**9)]) == 0
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("value, needle", [("0", "positive"), ("-5", "positive"),
                                           (str(2**62 + 1), "at most 2^62"),
                                           ("abc", "invalid int"), ("1.5", "invalid int")])
def test_max_cycles_must_be_a_positive_integer(package, capsys, value, needle):
    assert _tvmc(["run", package, f"--max-cycles={value}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-cycles" in err[0] and needle in err[0], err


#: runs tvmc in a fresh process whose VTA binding runs the long GEMM instead of the package's
#: program (through the VM's packed-function call, as a real long layer would)
DRIVER = textwrap.dedent("""
    import pathlib, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    import tvm_vta_cp.simulator as sim
    from tvm_vta_cp.codegen import ISA, FinishInsn, GemmInsn
    from tvm_vta_cp.hw_config import load_config
    from tvm_accel.cli import main

    marker, real = pathlib.Path(sys.argv[1]), sim._run_fn()
    long = ISA(load_config("vta_1x16x16")).encode_stream(
        [GemmInsn(False, 0, 8, 16383, 16383), FinishInsn()])

    def slow(cfg, insns, n, *rest):
        marker.touch()
        return real(cfg, long, len(long), *rest)

    sim._run_fn = lambda: slow
    sys.exit(main(sys.argv[2:]))
""")


def test_tvmc_run_ctrl_c_is_one_line_and_exit_code_130(package, tmp_path):
    marker = tmp_path / "simulating"
    p = subprocess.Popen([sys.executable, "-c", DRIVER, str(marker), "run", package],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "the simulation never started"
            time.sleep(0.05)
        time.sleep(SIGNAL_AFTER_S)
        t0 = time.perf_counter()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        elapsed = time.perf_counter() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130, (p.returncode, err)
    assert err.strip().splitlines() == ["tvmc run: interrupted"], err
    assert elapsed < 2 * MAX_STOP_S, elapsed  # includes the interpreter's shutdown


def test_a_main_thread_call_runs_on_the_main_thread_under_pythons_handler():
    """No thread hand-off under Python's own Ctrl-C handler: the library's SIGINT handler
    guards the call (the hand-off was ~20% of a small network's inference)."""
    where = []
    simlib.call(lambda: where.append(threading.current_thread() is threading.main_thread()))
    assert where == [True] and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_custom_sigint_handler_still_runs_during_a_long_call():
    class Custom(Exception):
        """What the user's handler raises."""

    def handler(sig, frame):
        raise Custom

    signal.signal(signal.SIGINT, handler)  # the fixture puts the default back
    run = LONG["vta"]()
    timer = _sigint_after(SIGNAL_AFTER_S)
    try:
        with pytest.raises(Custom):
            run()
    finally:
        timer.cancel()
    assert not simlib.stop_requested() and signal.getsignal(signal.SIGINT) is handler
    assert SHORT["vta"]()().cycles > 0
