"""Whole flow on MARSELLUS: ONNX QDQ (int8 / uint8) -> canonicalize (NormQuant recipe) ->
partition -> strategy -> simulator, bit-exact against the canonical integer graph on the CPU."""

import numpy as np
import pytest

from helpers import models

# (cin, cout, k, stride, hw, engine, pinned by the knob): RBE 3x3 / 1x1, stride 1 / 2, channels
# 32 / 64 / 96 and not a multiple of 32; a 5x5 conv runs on the cluster
CONV_CASES = [
    (32, 32, 3, 1, 8, "rbe", False),
    (64, 64, 3, 2, 9, "rbe", False),
    (16, 96, 1, 1, 6, "cluster", False),  # a 1x1 over 16 channels of a 6x6 host tensor: the
    (16, 96, 1, 1, 6, "rbe", True),       # cores' conv costs less than the marshaling
    (96, 40, 1, 2, 7, "cluster", False),  # likewise ...
    (96, 40, 1, 2, 7, "rbe", True),       # ... unless the knob says RBE
    (20, 45, 3, 1, 7, "rbe", False),
    (8, 16, 5, 1, 8, "cluster", False),
]


@pytest.mark.parametrize("cin, cout, k, stride, hw, engine, pinned", CONV_CASES)
def test_conv2d_is_bit_exact(compare, cin, cout, k, stride, hw, engine, pinned):
    knobs = {"conv": {"engine": engine}} if pinned else None
    r = compare(models.quantized("single_conv", cin=cin, cout=cout, k=k, stride=stride,
                              pad=k // 2, hw=hw), knobs=knobs)
    assert [o.op for o in r.offloaded] == ["conv2d"]
    assert list(r.engines().values()) == [engine]
    r.assert_bit_exact()


def test_uint8_conv_relu_batch_is_bit_exact(compare):
    r = compare(models.quantized("single_conv", "uint8", cin=24, cout=32, k=3, pad=1, hw=6,
                              batch=2, relu=True))
    assert list(r.engines().values()) == ["rbe"]
    r.assert_bit_exact()


def test_depthwise_conv_runs_on_the_cluster(compare):
    r = compare(models.quantized("single_conv", cin=16, cout=16, k=3, pad=1, groups=16, hw=8))
    assert list(r.engines().values()) == ["cluster"]
    r.assert_bit_exact()


def test_dense_is_bit_exact(compare):
    r = compare(models.quantized("single_dense", cin=100, cout=24, batch=3, relu=True))
    assert [o.op for o in r.offloaded] == ["dense"]
    r.assert_bit_exact()


def test_residual_add_on_the_cluster(compare):
    r = compare(models.quantized("conv_residual", c=24, hw=8, batch=2))
    assert set(r.engines().values()) == {"rbe", "cluster"}
    r.assert_bit_exact()


@pytest.mark.parametrize("kind", ["max", "avg", "gap"])
def test_pooling_is_bit_exact(compare, kind):
    r = compare(models.quantized("conv_pool", kind=kind, c=16, hw=8))
    assert {o.op for o in r.offloaded} >= {"conv2d"}
    assert len(r.offloaded) == 2
    r.assert_bit_exact()


def test_grouped_conv_falls_back_with_its_reason(compare):
    r = compare(models.quantized("single_conv", cin=8, cout=8, k=3, pad=1, groups=2, hw=6))
    conv = [o for o in r.report.offloads if o.op == "conv2d"]
    assert conv and conv[0].placement == "cpu"
    assert "grouped conv other than depthwise" in conv[0].reason
    r.assert_bit_exact()


def test_unsupported_op_stays_on_the_host(compare):
    r = compare(models.quantized("conv_unary", op="Softmax", c=8, hw=6))
    assert any(o.op == "softmax" and o.placement == "cpu"
               and o.reason == "no integer form for Softmax: runs in float on the CPU"
               for o in r.report.offloads)
    r.assert_bit_exact()


def test_profile_reports_engine_cycles_latency_and_energy(compare):
    from tvm_accel import profiler

    with profiler.profiling() as prof:
        r = compare(models.quantized("conv_residual", c=32, hw=8))
    r.assert_bit_exact()
    recs = prof.records
    assert {x.engine for x in recs} == {"RBE", "cluster"}
    for x in recs:
        assert x.cycles > 0 and x.time_us == pytest.approx(x.cycles / 420.0)
        assert 0 < x.extra["energy_uj"] < 10 and x.extra["vdd"] == 0.8


def test_operating_point_changes_latency_and_energy_not_results():
    import tvm

    import tvm_marsellus
    from tvm_accel import profiler
    from tvm_accel.frontend import load_onnx, random_inputs
    from tvm_marsellus.energy import LOW_05

    from ..conftest import run_vm as _run

    mod, info = load_onnx(models.quantized("single_conv", cin=32, cout=32, k=3, pad=1, hw=6))
    x = list(random_inputs(info).values())
    outs, recs = [], []
    for op in (None, LOW_05):
        ex = tvm.compile(mod, target="llvm", relax_pipeline=tvm_marsellus.pipeline(op=op))
        with profiler.profiling() as prof:
            outs.append(_run(ex, x)[0])
        recs.append(prof.records[0])
    np.testing.assert_array_equal(outs[0], outs[1])
    assert recs[0].cycles == recs[1].cycles
    assert recs[1].time_us == pytest.approx(4.2 * recs[0].time_us)
    assert recs[1].extra["energy_uj"] < recs[0].extra["energy_uj"] / 2


def test_relax_pipeline_name_is_registered():
    from tvm.relax.pipeline import PIPELINE_MAP

    import tvm_marsellus  # noqa: F401

    assert "marsellus" in PIPELINE_MAP
