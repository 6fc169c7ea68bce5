"""One fuzz driver for the three simulators.

A target's fuzz test mutates valid instruction streams (bit flips, random words, truncation,
random bytes, reordered instructions, ...: the mutators below, composed per target) and runs
them; every run must end in success or :class:`SimulatorError`. The cases run in a worker
subprocess (the test file itself, run as ``python <file> fuzz <start> <count>``) so that a crash
of the C library fails the test with the seed it died at instead of killing pytest. The same
worker runs against a sanitizer build of the library in ``tests/sim/test_sim_sanitizers.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from tvm_accel.errors import SimulatorError

#: a mutation of a stream: (rng, stream bytes) -> mutated bytes
Mutator = Callable[[np.random.Generator, bytearray], bytearray]
#: one fuzz case: (seed, rng) -> None; raises SimulatorError for a rejected stream
Case = Callable[[int, np.random.Generator], None]

TESTS_DIR = Path(__file__).resolve().parents[1]


def flip_bits(rng: np.random.Generator, b: bytearray) -> bytearray:
    """1 to 8 random bit flips."""
    for _ in range(rng.integers(1, 9)):
        i = int(rng.integers(0, len(b) * 8))
        b[i // 8] ^= 1 << (i % 8)
    return b


def random_words(word: int) -> Mutator:
    """1 to 3 aligned words of ``word`` bytes replaced by random bytes."""
    def mutate(rng: np.random.Generator, b: bytearray) -> bytearray:
        for _ in range(rng.integers(1, 4)):
            i = int(rng.integers(0, len(b) // word))
            b[word * i:word * (i + 1)] = rng.bytes(word)
        return b
    return mutate


def truncate(insn: int) -> Mutator:
    """The stream cut short, half the time to a length that is not a multiple of ``insn``."""
    def mutate(rng: np.random.Generator, b: bytearray) -> bytearray:
        cut = int(rng.integers(0, len(b)))
        return b[: cut if rng.integers(0, 2) else cut // insn * insn]
    return mutate


def random_stream(insn: int) -> Mutator:
    """A stream of 1 to 11 instructions of random bytes."""
    def mutate(rng: np.random.Generator, b: bytearray) -> bytearray:
        return bytearray(rng.bytes(insn * int(rng.integers(1, 12))))
    return mutate


def reorder(insn: int) -> Mutator:
    """1 to 3 instructions duplicated, dropped or swapped."""
    def mutate(rng: np.random.Generator, b: bytearray) -> bytearray:
        ins = [bytes(b[insn * i:insn * (i + 1)]) for i in range(len(b) // insn)]
        for _ in range(rng.integers(1, 4)):
            i, j = (int(x) for x in rng.integers(0, len(ins), 2))
            op = rng.integers(0, 3)
            if op == 0:
                ins.insert(i, ins[j])
            elif op == 1 and len(ins) > 1:
                ins.pop(i)
            else:
                ins[i], ins[j] = ins[j], ins[i]
        return bytearray(b"".join(ins))
    return mutate


def byte_ff(rng: np.random.Generator, b: bytearray) -> bytearray:
    """One byte set to 0xff."""
    b[int(rng.integers(0, len(b)))] = 0xFF
    return b


def mutate(rng: np.random.Generator, stream: bytes, mutators: Sequence[Mutator]) -> bytes:
    """``stream`` changed by one mutator drawn at random."""
    return bytes(mutators[int(rng.integers(0, len(mutators)))](rng, bytearray(stream)))


def maybe_truncate(rng: np.random.Generator, mem: np.ndarray) -> np.ndarray:
    """A quarter of the time, the memory cut to a random length (out-of-range accesses)."""
    if rng.integers(0, 4) == 0:
        return mem[: int(rng.integers(0, mem.size + 1))]
    return mem


def worker(case: Case, start: int, count: int) -> int:
    """Runs cases ``start .. start + count - 1``, printing each seed before it runs and
    ``done ok=N err=M`` at the end."""
    ok = err = 0
    for seed in range(start, start + count):
        print(f"seed={seed}", flush=True)
        try:
            case(seed, np.random.default_rng(seed))
            ok += 1
        except SimulatorError:
            err += 1
    print(f"done ok={ok} err={err}", flush=True)
    return 0


def worker_main(case: Case, argv: Sequence[str]) -> None:
    """The ``__main__`` hook of a fuzz test file: ``<file> fuzz <start> <count>``."""
    if len(argv) == 4 and argv[1] == "fuzz":
        sys.exit(worker(case, int(argv[2]), int(argv[3])))


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker: this one with ``tests/`` on the path (for ``helpers``) and
    ``extra``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS_DIR), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def run_worker(script: str, count: int, env: dict[str, str] | None = None, timeout: float = 300,
               forbid: Sequence[str] = ()) -> tuple[int, int]:
    """Runs ``count`` cases of the fuzz test file ``script`` in a subprocess; fails naming the
    seed the worker died at, or when its stderr holds one of ``forbid``; returns (ok, err)."""
    try:
        proc = subprocess.run([sys.executable, script, "fuzz", "0", str(count)],
                              capture_output=True, text=True, timeout=timeout, env=worker_env(env))
    except subprocess.TimeoutExpired as e:  # a case that never returns: name its seed
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        seeds = out.strip().splitlines() or ["(no output)"]
        raise AssertionError(f"fuzz worker still running after {timeout} s at {seeds[-1]}"
                             ) from None
    lines = proc.stdout.strip().splitlines()
    last = lines[-1] if lines else "(no output)"
    assert proc.returncode == 0, (f"fuzz worker died (rc {proc.returncode}) at {last}\n"
                                  f"{proc.stderr[-3000:]}")
    assert last.startswith("done"), last
    for text in forbid:
        assert text not in proc.stderr, (f"{text!r} reported by the fuzz worker:\n"
                                         f"{proc.stderr[-6000:]}")
    ok = int(last.split("ok=")[1].split()[0])
    err = int(last.split("err=")[1])
    return ok, err
