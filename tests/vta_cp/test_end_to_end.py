"""Whole flow on VTA: ONNX QDQ -> canonicalize -> partition -> strategy -> simulator, bit-exact
against the canonical integer graph compiled for the CPU."""

import pytest

from helpers import models

# (cin, cout, k, stride, pad, batch, hw): every acceptance value appears at least once.
CONV_CASES = [
    (3, 16, 7, 2, 3, 1, 16),
    (16, 16, 1, 1, 0, 1, 8),
    (16, 24, 3, 1, 1, 2, 8),
    (24, 64, 5, 2, 2, 1, 9),
    (64, 100, 3, 2, 0, 1, 7),
    (100, 16, 1, 2, 1, 2, 6),
    (3, 3, 5, 1, 3, 1, 6),
    (64, 64, 7, 1, 2, 1, 8),
]


@pytest.mark.parametrize("cin, cout, k, stride, pad, batch, hw", CONV_CASES)
def test_conv2d_is_bit_exact(compare, config, cin, cout, k, stride, pad, batch, hw):
    model = models.quantized("single_conv", cin=cin, cout=cout, k=k, stride=stride, pad=pad,
                          batch=batch, hw=hw)
    r = compare(model, config)
    assert [o.op for o in r.offloaded] == ["conv2d"]
    r.assert_bit_exact()


@pytest.mark.parametrize("act, per_channel", [("uint8", True), ("int8", False)])
def test_conv_relu_with_uint8_and_per_tensor_scales_is_bit_exact(compare, act, per_channel):
    model = models.quantized("single_conv", act, per_channel, cin=16, cout=24, k=3, stride=1,
                          pad=1, hw=8, relu=True)
    r = compare(model, "vta_1x16x16")
    assert len(r.offloaded) == 1
    r.assert_bit_exact()


def test_dense_is_bit_exact(compare, config):
    r = compare(models.quantized("single_dense", cin=100, cout=24, batch=2, relu=True), config)
    assert [o.op for o in r.offloaded] == ["dense"]
    r.assert_bit_exact()


def test_conv_with_residual_add_runs_add_on_the_alu(compare, config):
    r = compare(models.quantized("conv_residual", c=24, hw=8), config)
    assert {o.op for o in r.offloaded} == {"conv2d", "add"}
    r.assert_bit_exact()


def test_depthwise_conv_runs_on_vta_bit_exactly(compare):
    r = compare(models.quantized("single_conv", cin=16, cout=16, k=3, pad=1, groups=16, hw=8),
                "vta_1x16x16")
    conv = [o for o in r.report.offloads if o.op == "conv2d"]
    assert conv and conv[0].placement == "vta"
    r.assert_bit_exact()


def test_resnet20_is_bit_exact_under_the_default_auto_strategy(compare, config):
    r = compare(models.quantized("resnet20"), config)
    assert len([o for o in r.offloaded if o.op == "conv2d"]) == 21
    decisions = r.report.layouts
    assert len(decisions) == 21 and {d.strategy for d in decisions} == {"auto"}
    if config == "vta_8x8x8":  # batch 1 on BATCH=8: auto picks image packs over padding
        assert sum(not d.rewrite.is_identity for d in decisions) >= 10
    r.assert_bit_exact()


@pytest.mark.slow
def test_resnet50_with_multi_output_functions_is_bit_exact(compare):
    """ResNet-50's bottlenecks give offloaded functions several outputs whose callers' layout
    rewrites the blocking fuses (the rebuilt call needs one output buffer per tuple field; it
    used to fail the compile)."""
    from tvm_accel import quantize, zoo

    r = compare(quantize.ort_quantize(zoo.resnet50(hw=32)))
    assert any(len(f.graph.outputs) > 1 for f in r.report.functions)
    r.assert_bit_exact()


def test_registered_pipeline_compiles_by_name_and_matches_the_reference():
    import numpy as np
    import tvm
    from tvm import relax

    import tvm_vta_cp
    from tvm_accel.frontend import load_onnx, random_inputs
    from tvm_accel.pipeline import compile_reference

    mod, info = load_onnx(models.quantized("conv_residual", c=16, hw=8))
    ex = tvm.compile(mod, target="llvm", relax_pipeline="vta")
    assert "tvm_vta_cp.run" in ex.as_text()
    x = tvm.runtime.tensor(next(iter(random_inputs(info).values())))
    y = relax.VirtualMachine(ex, tvm.cpu())["main"](x).numpy()
    ref = relax.VirtualMachine(compile_reference(mod, tvm_vta_cp.TARGET), tvm.cpu())
    np.testing.assert_array_equal(y, ref["main"](x).numpy())


def test_offload_listing_names_every_host_op_with_its_reason():
    import tvm_vta_cp
    from tvm_accel.frontend import load_onnx
    from tvm_accel.partition import explain
    from tvm_accel.pipeline import canonicalize_for

    mod, _ = load_onnx(models.quantized("conv_flatten_dense"))
    canon = canonicalize_for(mod, tvm_vta_cp.TARGET)
    recs = {r.op: r for r in explain(canon, tvm_vta_cp.TARGET.pattern_table(), "vta")}
    assert recs["conv2d"].placement == "vta"
    assert recs["reshape"].placement == "cpu"
    assert "no vta pattern" in recs["reshape"].reason
