"""Whole flow on the DPU: ONNX QDQ (power-of-two scales) -> canonicalize -> partition ->
strategy -> DPU simulator, bit-exact against the canonical integer graph compiled for the CPU."""

import numpy as np
import pytest

from helpers import models


def pow2(name, **kw):
    return models.quantized(name, power_of_two=True, **kw)


# (cin, cout, k, stride, pad, batch, hw): kernels 1/3/5/7, strides 1/2, padding, odd channels,
# batch 1..4 over 4 PEs (2 and 3 are not multiples of NUM_PE)
CONV_CASES = [
    (3, 16, 7, 2, 3, 1, 16),
    (16, 16, 1, 1, 0, 4, 8),
    (17, 24, 3, 1, 1, 2, 9),
    (24, 33, 5, 2, 2, 3, 9),
    (5, 7, 3, 2, 0, 1, 7),
    (16, 16, 7, 1, 2, 1, 10),
]


@pytest.mark.parametrize("cin, cout, k, stride, pad, batch, hw", CONV_CASES)
def test_conv2d_is_bit_exact(compare, cin, cout, k, stride, pad, batch, hw):
    r = compare(pow2("single_conv", cin=cin, cout=cout, k=k, stride=stride, pad=pad,
                     batch=batch, hw=hw))
    assert [o.op for o in r.offloaded] == ["conv2d"]
    r.assert_bit_exact()


def test_conv_relu_is_bit_exact_on_the_8pe_config(compare):
    r = compare(pow2("single_conv", cin=16, cout=24, k=3, pad=1, hw=8, batch=5, relu=True),
                "dpu_8pe")
    assert len(r.offloaded) == 1
    r.assert_bit_exact()


def test_depthwise_conv_runs_on_the_conv_engine(compare):
    r = compare(pow2("single_conv", cin=16, cout=16, k=3, pad=1, groups=16, hw=8))
    assert [o.op for o in r.offloaded] == ["conv2d"]
    r.assert_bit_exact()


def test_dense_is_bit_exact(compare):
    r = compare(pow2("single_dense", cin=100, cout=24, batch=3, relu=True))
    assert [o.op for o in r.offloaded] == ["dense"]
    r.assert_bit_exact()


def test_conv_with_residual_add_runs_add_on_misc(compare):
    r = compare(pow2("conv_residual", c=24, hw=8, batch=2))
    assert {o.op for o in r.offloaded} == {"conv2d", "add"}
    r.assert_bit_exact()


def test_uint8_activations_fall_back_with_their_reason(compare):
    r = compare(models.quantized("single_conv", "uint8", power_of_two=True, cin=8, cout=8, k=3,
                              pad=1, hw=6))
    conv = [o for o in r.report.offloads if o.op == "conv2d"]
    assert conv and conv[0].placement == "cpu"
    assert "uint8 activations stay on the CPU" in conv[0].reason
    r.assert_bit_exact()


def test_non_power_of_two_scales_fall_back_with_their_reason(compare):
    r = compare(models.quantized("single_conv", "int8", False, cin=8, cout=8, k=3, pad=1, hw=6))
    conv = [o for o in r.report.offloads if o.op == "conv2d"]
    assert conv and conv[0].placement == "cpu" and "power of two" in conv[0].reason
    r.assert_bit_exact()


@pytest.mark.parametrize("fusion", [True, False], ids=["fused", "layer_by_layer"])
def test_resnet_block_is_bit_exact_and_profiled(compare, fusion):
    from tvm_accel import profiler

    with profiler.profiling() as prof:
        r = compare(pow2("conv_residual", c=64, hw=16, batch=4),
                    knobs={"@fusion": {"enabled": fusion}})
    r.assert_bit_exact()
    recs = [x for x in prof.records if x.engine == "dpu"]
    assert {x.op for x in recs} >= ({"conv2d+add"} if fusion else {"conv2d", "add"})
    for x in recs:
        assert x.cycles > 0 and 0 <= x.utilization <= 1
    conv = [x for x in recs if x.op.startswith("conv2d")]
    assert conv and all(x.utilization > 0.05 for x in conv)


def test_registered_pipeline_compiles_by_name_and_disassembles():
    import tvm
    from tvm import relax

    import tvm_dpu
    from tvm_accel.frontend import load_onnx, random_inputs
    from tvm_accel.pipeline import compile_reference

    mod, info = load_onnx(pow2("conv_residual", c=16, hw=8))
    ex = tvm.compile(mod, target="llvm", relax_pipeline="dpu")
    assert "tvm_dpu.run" in ex.as_text()
    x = tvm.runtime.tensor(next(iter(random_inputs(info).values())))
    y = relax.VirtualMachine(ex, tvm.cpu())["main"](x).numpy()
    ref = relax.VirtualMachine(compile_reference(mod, tvm_dpu.TARGET), tvm.cpu())
    np.testing.assert_array_equal(y, ref["main"](x).numpy())


@pytest.mark.parametrize("name, kw, op", [
    ("single_pool", dict(kind="max", c=16, hw=9, batch=2), "max_pool2d"),
    ("single_pool", dict(kind="avg", k=2, stride=2, pad=0, c=16, hw=8), "avg_pool2d"),
    ("single_pool", dict(kind="avg", k=3, stride=1, c=16, hw=8), "avg_pool2d"),
    ("single_pool", dict(kind="gap", c=16, hw=8), "global_avg_pool2d"),
    ("single_upsample", dict(c=16, hw=6, batch=3), "upsample"),
    ("conv_concat", dict(c=8, hw=8), "concat"),
])
def test_misc_layers_run_on_the_dpu_bit_exact(compare, name, kw, op):
    r = compare(pow2(name, **kw))
    assert op in [o.op for o in r.offloaded]
    r.assert_bit_exact()


@pytest.mark.parametrize("kw", [dict(), dict(k=4, stride=2, pad=1),
                                dict(output_padding=1, batch=2)])
def test_deconv_runs_as_subconvs_bit_exact(compare, kw):
    r = compare(pow2("single_deconv", **kw))
    assert [o.op for o in r.offloaded] == ["conv2d_transpose"]
    r.assert_bit_exact()


def test_grouped_deconv_falls_back_with_its_reason(compare):
    r = compare(pow2("single_deconv", groups=2))
    de = [o for o in r.report.offloads if o.op == "conv2d_transpose"]
    assert de and de[0].placement == "cpu" and "transpose conv with groups" in de[0].reason
    assert "Error" not in de[0].reason
    r.assert_bit_exact()


def test_encoder_decoder_with_deconv_and_concat_is_bit_exact(compare):
    r = compare(pow2("encoder_decoder"))
    assert {"conv2d", "conv2d_transpose", "concat"} <= {o.op for o in r.offloaded}
    r.assert_bit_exact()


def test_dense_with_one_output_channel_is_offloaded(compare):
    r = compare(pow2("single_dense", cin=100, cout=1, batch=2))
    assert [o.op for o in r.offloaded] == ["dense"]
    r.assert_bit_exact()


@pytest.mark.parametrize("batch, pad", [(1, (0, 0, 0, 0)), (4, (0, 8, 0, 8))])
def test_deepbench_speech_kernel_wider_than_the_conv_fields_runs_on_the_dpu(compare, batch, pad):
    """A 5x20 kernel, stride 2, one input channel (DeepBench's speech layers): the W
    space-to-depth view of the HWC input (2 pixels per pixel, 2 channels) makes it a 5x10
    stride-1 conv the CONV fields hold, with no data movement; bit-exact."""
    r = compare(pow2("single_conv", cin=1, cout=16, k=(5, 20), stride=2, pad=pad, batch=batch,
                     hw=(13, 40)))
    assert [o.placement for o in r.offloaded if o.op == "conv2d"] == ["dpu"]
    r.assert_bit_exact()


@pytest.mark.parametrize("batch", [1, 6])
def test_global_pool_flattened_as_the_output_writes_the_flat_tensor(compare, batch):
    """SqueezeNet's head ends in GlobalAveragePool -> Flatten: in HWC DDR the (N, C, 1, 1)
    pool output is the (N, C) tensor, so the pool (pattern ``dpu.globalavgpool_flat``) SAVEs
    the model output and the Flatten is a view, on the DPU."""
    m = models.quantized("conv_pool_flatten", power_of_two=True, batch=batch, c=12)
    r = compare(m)
    rows = {n.layer: n for n in r.report.nodes}
    assert (rows["avgpool"].placement, rows["avgpool"].reason) == (
        "dpu", "matched dpu.globalavgpool_flat")
    assert (rows["flatten"].placement, rows["flatten"].kind) == ("dpu", "fused")
    assert r.outputs[0].shape == (batch, 12)
    r.assert_bit_exact()
    diff = np.abs(models.ort_run(m, r.inputs[0]) - r.outputs[0]).max()
    assert diff <= 2 * models.output_step(m) + 1e-6


def test_global_pool_flatten_and_classifier_share_one_stream(compare):
    """The Flatten between a global pool and the classifier is a view in HWC DDR: the dense
    reads the (N, C, 1, 1) pool output directly, so the head joins the network's function
    (DPU pattern ``dpu.qdense_flat``) instead of a function of its own."""
    r = compare(models.quantized("tiny_cnn", power_of_two=True, batch=4))
    assert [f.layers[-2:] for f in r.report.functions] == [["avgpool", "fc"]]
    flat = next(n for n in r.report.nodes if n.layer == "flatten")
    assert (flat.placement, flat.kind) == ("dpu", "fused")
    assert "flatten" not in [o.layer for o in r.report.offloads]
    r.assert_bit_exact()
