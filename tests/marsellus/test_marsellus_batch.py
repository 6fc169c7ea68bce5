"""Batch passes: a function whose batch does not fit L3 is planned for the largest sub-batch
that fits and run once per sub-batch, bit-exact; when even one image does not fit it falls back
with both reasons."""

from dataclasses import replace

import numpy as np
import pytest

from helpers import models
from tvm_accel.errors import MappingError
from tvm_accel.layers import LayerGraph, reference_execute
from tvm_accel.profiler import profiling
from tvm_marsellus import TARGET, strategy
from tvm_marsellus.program import build_blob, load_blob
from tvm_marsellus.runtime import execute_program, io_spec, run_blob
from tvm_marsellus.strategy.batch import batch_of, sub_batch

from .test_marsellus_strategy import CFG, T, conv

BATCH = 4
#: an L2 smaller than one image's tensors: every tensor lives in L3
SMALL_L2 = replace(CFG, L2_BYTES=24 * 1024)


def _chain(rng, n=BATCH):
    """Two 3x3 convs over 16 x 24 x 24 images (input, intermediate and output per image)."""
    sh = (n, 16, 24, 24)
    layers = [conv(rng, "c1", "x", "y", 16, 16, 3), conv(rng, "c2", "y", "z", 16, 16, 3)]
    g = LayerGraph({t: T(t, sh) for t in "xyz"}, layers, ["x"], ["z"])
    return g, {"x": rng.integers(-128, 128, sh).astype(np.int8)}


def _l3_need(g, b):
    """L3 bytes the plan of ``b`` images uses when L3 is ample (some: L2 cannot hold them)."""
    need = strategy.plan(sub_batch(g, b), replace(SMALL_L2, L3_BYTES=1 << 30)).l3_bytes
    assert need > 0
    return need


@pytest.mark.parametrize("fits", [2, 1])
def test_a_batch_beyond_l3_runs_in_the_largest_sub_batch_that_fits(fits):
    rng = np.random.default_rng(11)
    g, xs = _chain(rng)
    cfg = replace(SMALL_L2, L3_BYTES=_l3_need(g, fits))
    assert _l3_need(g, 2 * fits) > cfg.L3_BYTES  # twice as many images do not fit
    prog = strategy.plan(g, cfg)
    assert prog.passes == BATCH // fits
    assert prog.tensors["x"].shape[0] == prog.tensors["z"].shape[0] == fits
    assert all(ly.meta["batch"].startswith(f"batch {BATCH} in {BATCH // fits} passes of "
                                            f"{fits} (function needs ") for ly in prog.layers)
    outs, stats = execute_program(prog, xs, cfg)
    np.testing.assert_array_equal(outs["z"], reference_execute(g, xs)["z"])
    macs = sum(st.rbe_macs + st.cluster_macs for _, st in stats)
    assert macs == BATCH * sum(ly.macs for ly in prog.layers) // fits


def test_a_batch_whose_one_image_does_not_fit_falls_back_with_both_reasons():
    g, _ = _chain(np.random.default_rng(12))
    cfg = replace(SMALL_L2, L3_BYTES=_l3_need(g, 1) - 1)
    with pytest.raises(MappingError, match=f"one image of the batch of {BATCH} does not fit"):
        strategy.plan(g, cfg)


def test_a_single_image_beyond_l3_keeps_its_own_reason():
    g, _ = _chain(np.random.default_rng(13), n=1)
    cfg = replace(SMALL_L2, L3_BYTES=_l3_need(g, 1) - 1)
    with pytest.raises(MappingError, match="bytes of L3") as e:
        strategy.plan(g, cfg)
    assert "one image" not in str(e.value)


def test_a_function_in_passes_takes_and_returns_the_whole_batch_through_its_blob():
    rng = np.random.default_rng(14)
    g, xs = _chain(rng)
    cfg = replace(SMALL_L2, L3_BYTES=_l3_need(g, 1))
    blob = build_blob(strategy.plan(g, cfg), cfg, "f")
    prog, _, _ = load_blob(blob)
    assert prog.passes == BATCH and io_spec(prog, "x")[0] == tuple(g.tensors["x"].shape)
    with profiling() as prof:
        [z] = run_blob(np.frombuffer(blob, np.uint8), [xs["x"]])
    np.testing.assert_array_equal(z, reference_execute(g, xs)["z"])
    assert [r.macs for r in prof.records] == [BATCH * ly.macs for ly in prog.layers]
    assert all(r.extra["batch"].startswith(f"batch {BATCH} in {BATCH} passes of 1")
               for r in prof.records)
    assert f"{BATCH} batch passes" in TARGET.disassemble(blob, limit=1)


def test_graphs_whose_tensors_differ_in_batch_have_none():
    g, _ = _chain(np.random.default_rng(15))
    g.tensors["z"] = T("z", (2, 16, 24, 24))
    assert batch_of(g) == 0 and batch_of(_chain(np.random.default_rng(15))[0]) == BATCH


def test_the_offload_report_says_the_batch_runs_in_passes(compare):
    model = models.quantized("single_conv", cin=16, cout=16, k=3, pad=1, hw=24, batch=BATCH)
    cfg = replace(CFG, L2_BYTES=40 * 1024)  # one image's tensors fit, the batch's do not
    one = compare(model, config=replace(cfg, L3_BYTES=1 << 30))
    need = load_blob(one.report.functions[0].blob)[0].l3_bytes
    assert need > 0
    r = compare(model, config=replace(cfg, L3_BYTES=need - 1))
    [row] = r.offloaded
    assert f"batch {BATCH} in " in row.reason and "bytes of L3" in row.reason
    r.assert_bit_exact()
