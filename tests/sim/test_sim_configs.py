"""Every simulator entry point validates its config: a config that reaches the C library without
Python's checks (``dataclasses.replace`` skips ``validate``) ends in a result or a
``SimulatorError``, with status ``config`` for a value the simulator cannot take; never a hang,
a crash, a silently wrapped value or a raw Python error.

The table holds the MARSELLUS cases found by fuzzing (issue 27); the fuzzer changes 1 to 3 fields
of every target's bundled configs to edge values and runs every entry point that takes a
config on a valid program, in a worker subprocess (``python <this file> fuzz START COUNT``), also
against the ASan + UBSan build in ``test_sim_sanitizers.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import sys

import numpy as np
import pytest

from helpers import fuzz
from tvm_accel.errors import SimulatorError
from tvm_dpu.hw_config import load_config as dpu_config
from tvm_marsellus import codegen as mars_cg
from tvm_marsellus.hw_config import load_config as mars_config
from tvm_marsellus.simulator import rbe_job_phases
from tvm_marsellus.simulator import simulate as mars_simulate
from tvm_vta_cp.hw_config import load_config as vta_config

FUZZ_CASES = 600
MARS = mars_config()
DPU = dpu_config("dpu_default")
VTA = vta_config("vta_1x16x16")
JOB = mars_cg.RbeJob(h_in=5, w_in=5, h_out=3, w_out=3, k_in=32, k_out=40, in_bits=4, w_bits=2,
                     out_bits=4, pad_top=1, shift=3)
END = mars_cg.encode_stream([mars_cg.End()])


def _mars_run(cfg) -> None:
    mars_simulate(cfg, END, l1=np.zeros(1024, np.uint8), l2=np.zeros(1024, np.uint8),
                  l3=np.zeros(0, np.uint8), max_cycles=1000)


def _mars_run_own_memories(cfg) -> None:
    mars_simulate(cfg, END, max_cycles=1000)


def _mars_job(cfg) -> None:
    rbe_job_phases(cfg, JOB)


def _dpu_empty_run(cfg) -> None:
    from tvm_dpu.simulator import simulate

    simulate(cfg, b"", np.zeros(64, np.uint8))


def _vta_empty_run(cfg) -> None:
    from tvm_vta_cp.simulator import simulate

    simulate(cfg, b"", np.zeros(64, np.uint8))


CONFIG_CASES = [
    # check_config's core grid search overflowed a signed int (UBSan) and never returned
    ("rbe_cores_near_2_31", MARS, _mars_run, {"RBE_CORES": 2**31 - 1}, "rbe_cores"),
    ("rbe_cores_negative", MARS, _mars_run, {"RBE_CORES": -4}, "rbe_cores"),
    # mars_sim_rbe_job_cycles did not check the config: a division by 0 looped forever, a
    # negative core count looped ~2^32 times, a 0-bit port gave nonsense cycles
    ("job_binconvs_0", MARS, _mars_job, {"RBE_BINCONVS": 0}, "geometry"),
    ("job_cores_negative", MARS, _mars_job, {"RBE_CORES": -4}, "rbe_cores"),
    ("job_port_bits_0", MARS, _mars_job, {"RBE_TCDM_PORT_BITS": 0}, "geometry"),
    ("job_rate_nan", MARS, _mars_job, {"CL_MATMUL_8B_MACS_PER_CYCLE": float("nan")}, "rate"),
    # memories simulate() allocates itself: np.zeros raised ValueError / MemoryError (939 GiB)
    ("l1_bytes_negative", MARS, _mars_run_own_memories, {"L1_BYTES": -1}, "L1_BYTES"),
    ("l3_bytes_939_gib", MARS, _mars_run_own_memories, {"L3_BYTES": 939 << 30}, "L3_BYTES"),
    ("l2_bytes_float", MARS, _mars_run_own_memories, {"L2_BYTES": 1e6}, "L2_BYTES"),
    # a value ctypes would wrap into the C field (2^32 + 4 -> 4 cores) is refused
    ("rbe_cores_wraps", MARS, _mars_run, {"RBE_CORES": 2**32 + 4}, "rbe_cores"),
    ("cores_not_an_integer", MARS, _mars_run, {"CLUSTER_CORES": 8.5}, "cluster_cores"),
    # the DPU's default DDR layout, computed from the config on the Python side
    ("dpu_ddr_bytes_float", DPU, _dpu_empty_run, {"DDR_INPUT_BYTES": 2.5}, "region INPUT"),
    ("dpu_ddr_bytes_2_40", DPU, _dpu_empty_run, {"DDR_SWAP_BYTES": 1 << 40}, "region SWAP"),
    ("dpu_pes_wrap", DPU, _dpu_empty_run, {"NUM_PE": 2**32 + 4}, "num_pe"),
    ("vta_log_batch_wraps", VTA, _vta_empty_run, {"LOG_BATCH": 2**32}, "log_batch"),
]


@pytest.mark.parametrize(("base", "run", "fields", "names"), [c[1:] for c in CONFIG_CASES],
                         ids=[c[0] for c in CONFIG_CASES])
def test_an_unvalidated_config_gets_the_config_error(base, run, fields, names):
    with pytest.raises(SimulatorError, match=names) as e:
        run(dataclasses.replace(base, **fields))
    assert e.value.kind == "config"


# --- fuzzing ---------------------------------------------------------------------------------
#: edge values of an integer field and of a float field (plus the field's value doubled, negated)
INT_EDGES = [0, -1, 1, 2, 3, 7, 64, 255, 2**15, 2**20, 2**31 - 1, -2**31, 2**31, 2**32 + 4,
             2**63, -2**63, 2.5]
FLOAT_EDGES = [0.0, -0.0, -1.0, float("nan"), float("inf"), float("-inf"), 5e-324, 1e-300,
               1e-9, 0.5, 1e9, 1e300, 10**400]
#: random cases (1 to 3 fields changed) after the sweep of every single-field change
RANDOM_CASES = 600


def _numeric_fields(cfg) -> list[str]:
    return [f.name for f in dataclasses.fields(cfg)
            if isinstance(getattr(cfg, f.name), (int, float))
            and not isinstance(getattr(cfg, f.name), bool)]


def _edges(value) -> list:
    edges = INT_EDGES if isinstance(value, int) else FLOAT_EDGES
    return [*edges, value * 2, -value]


@functools.cache
def _vta_bases(name: str):
    from vta_cp.test_simulator import _base_programs

    from tvm_vta_cp.hw_config import load_config

    cfg = load_config(name)
    return cfg, _base_programs(cfg)


@functools.cache
def _dpu_bases(name: str):
    from dpu.test_dpu_simulator import _base_programs

    from tvm_dpu.hw_config import load_config

    cfg = load_config(name)
    return cfg, _base_programs(cfg)


@functools.cache
def _mars_bases():
    from marsellus.test_marsellus_simulator import _base_streams

    return _base_streams()


def _vta_fuzz_run(change, k: int) -> None:
    from tvm_vta_cp.simulator import simulate

    cfg, bases = _vta_bases(("vta_1x16x16", "vta_8x8x8")[k % 2])
    stream, dram = bases[k % len(bases)]
    simulate(change(cfg), stream, dram.copy(), max_cycles=200_000)


def _dpu_fuzz_run(change, k: int, ranges: bool = False) -> None:
    from tvm_dpu.simulator import simulate, simulate_ranges

    cfg, bases = _dpu_bases(("dpu_default", "dpu_8pe")[k % 2])
    stream, ddr, regions = bases[k % len(bases)]
    if ranges:
        n = len(stream) // 32
        simulate_ranges(change(cfg), stream, ddr.copy(), [n // 2, n], max_cycles=20_000,
                        regions=regions)
    else:
        simulate(change(cfg), stream, ddr.copy(), max_cycles=20_000, regions=regions)


def _mars_fuzz_run(change, k: int) -> None:
    stream, l1 = _mars_bases()[0]
    mem = np.zeros(MARS.L1_BYTES, np.uint8)
    mem[:l1.size] = l1
    mars_simulate(change(MARS), stream, l1=mem, l3=np.zeros(4096, np.uint8),
                  l2=np.zeros(65536, np.uint8), max_cycles=200_000)


#: (C entry point, its config, a run of a valid program with the config as ``change`` makes it)
ENTRY_POINTS = [
    ("vta_sim_run", VTA, _vta_fuzz_run),
    ("dpu_sim_run", DPU, _dpu_fuzz_run),
    ("dpu_sim_run_ranges", DPU, functools.partial(_dpu_fuzz_run, ranges=True)),
    ("mars_sim_run", MARS, _mars_fuzz_run),
    ("mars_sim_rbe_job_cycles", MARS, lambda change, k: _mars_job(change(MARS))),
    ("mars_sim_run, memories from the config", MARS,
     lambda change, k: _mars_run_own_memories(change(MARS))),
]
#: every single-field change of every entry point's config: (entry index, field, value)
SWEEP = [(i, name, v) for i, (_, cfg, _) in enumerate(ENTRY_POINTS)
         for name in _numeric_fields(cfg) for v in _edges(getattr(cfg, name))]
FUZZ_CASES = len(SWEEP) + RANDOM_CASES


def test_the_bundled_configs_pass_every_entry_point():
    for _, _, run in ENTRY_POINTS:
        for k in range(2):
            run(lambda cfg: cfg, k)


def _fuzz_case(seed: int, rng: np.random.Generator) -> None:
    if seed < len(SWEEP):
        i, name, value = SWEEP[seed]
        changes = {name: value}
    else:
        i = int(rng.integers(0, len(ENTRY_POINTS)))
        names = _numeric_fields(ENTRY_POINTS[i][1])
        changes = {}
        for _ in range(int(rng.integers(1, 4))):
            name = names[int(rng.integers(0, len(names)))]
            edges = _edges(getattr(ENTRY_POINTS[i][1], name))
            changes[name] = edges[int(rng.integers(0, len(edges)))]
    ENTRY_POINTS[i][2](lambda cfg: dataclasses.replace(cfg, **changes), seed)


def test_fuzzed_configs_fail_cleanly_or_run():
    """Every entry point, mutated configs: success or SimulatorError; a crash or a hang names
    the seed."""
    ok, err = fuzz.run_worker(__file__, FUZZ_CASES, timeout=240)
    assert ok + err == FUZZ_CASES and ok > 0 and err > 0


if __name__ == "__main__":
    fuzz.worker_main(_fuzz_case, sys.argv)
