"""Activations on the DPU (issue 24 item 4): LeakyReLU in the CONV's nonlinear module, fused
after the conv (conv -> Q -> DQ -> LeakyRelu -> Q), when the model's table is exactly what the
module computes (slope 26/256 at the conv's scale); any other slope stays a table on the CPU
with the reason. Bit-exact against the CPU reference, within 2 LSB of onnxruntime."""

import numpy as np
import pytest

from helpers import models
from tvm_accel.quantize import ort_quantize
from tvm_accel.zoo import INPUT_NAME, Builder
from tvm_dpu.codegen import Conv, decode_stream, load_blob
from tvm_dpu.numerics import LEAKY_SLOPE, leaky_mismatch, leaky_relu

CODES = np.arange(-128, 128)


def _table(alpha: float, ratio: float = 1.0) -> np.ndarray:
    """The table canonicalize builds for LeakyRelu(alpha) with output scale = input scale /
    ``ratio``: float32, half to even, as onnxruntime computes it."""
    x = CODES.astype(np.float32)
    y = np.where(x >= 0, x, x * np.float32(alpha)) * np.float32(ratio)
    return np.clip(np.rint(y), -128, 127).astype(np.int64)




def _conv_insns(report) -> list[Conv]:
    return [i for f in report.functions for ly in load_blob(f.blob)[0].layers
            for i in decode_stream(ly.insns) if isinstance(i, Conv)]


def test_the_nonlinear_module_is_the_slope_26_256_table_on_every_code():
    assert LEAKY_SLOPE == 0.1015625
    np.testing.assert_array_equal(leaky_relu(CODES), _table(LEAKY_SLOPE))
    assert leaky_mismatch(_table(LEAKY_SLOPE), -128, -128, 127) is None
    assert leaky_mismatch(np.tile(_table(LEAKY_SLOPE), 8), -128, -128, 127) is None  # per row
    # ONNX's default 0.01, PyTorch's / YOLO's 0.1, another scale: the DPU cannot compute them
    for table in (_table(0.01), _table(0.1), _table(0.2), _table(LEAKY_SLOPE, 0.5)):
        assert leaky_mismatch(table, -128, -128, 127) is not None
    # a conv whose requantize folded a ReLU: the table only sees codes >= 0, the DPU all codes
    assert leaky_mismatch(_table(LEAKY_SLOPE), -128, 0, 127) is not None


@pytest.mark.parametrize("batch", [1, 3])
def test_leaky_relu_with_the_dpu_slope_runs_in_the_conv_bit_exact(compare, batch):
    m = ort_quantize(models.conv_unary("LeakyRelu", hw=16, batch=batch, alpha=LEAKY_SLOPE),
                     power_of_two=True)
    r = compare(m)
    rows = {o.layer: o for o in r.report.nodes if o.kind in ("layer", "fused")}
    assert (rows["conv1"].placement, rows["conv1"].reason) == ("dpu", "matched dpu.qconv2d_leaky")
    assert (rows["leakyrelu"].placement, rows["leakyrelu"].reason) == ("dpu", "fused into conv1")
    assert rows["conv2"].placement == "dpu"
    assert [c.leaky for c in _conv_insns(r.report)].count(True) >= 1
    r.assert_bit_exact()
    diff = np.abs(models.ort_run(m, r.inputs[0]) - r.outputs[0]).max()
    assert diff <= 2 * models.output_step(m) + 1e-6


def test_the_power_of_two_quantizer_sets_a_slope_of_0_1_to_26_256_which_runs_in_the_conv(
        compare):
    """Vitis AI's quantizer sets a LeakyReLU of 0.1 to the DPU's 26/256; so does the
    power-of-two scheme, and onnxruntime runs the QDQ model's 26/256 slope too."""
    m = ort_quantize(models.conv_unary("LeakyRelu", hw=16, batch=2, alpha=0.1),
                     power_of_two=True)
    alpha = next(a.f for n in m.graph.node if n.op_type == "LeakyRelu" for a in n.attribute)
    assert alpha == LEAKY_SLOPE
    r = compare(m)
    rows = {o.layer: o for o in r.report.nodes if o.kind in ("layer", "fused")}
    assert (rows["leakyrelu"].placement, rows["leakyrelu"].reason) == ("dpu", "fused into conv1")
    r.assert_bit_exact()
    diff = np.abs(models.ort_run(m, r.inputs[0]) - r.outputs[0]).max()
    assert diff <= 2 * models.output_step(m) + 1e-6


@pytest.mark.parametrize("alpha", [0.01, 0.2, 0.11])
def test_leaky_relu_with_another_slope_stays_on_the_cpu_naming_the_dpu_slope(compare, alpha):
    m = ort_quantize(models.conv_unary("LeakyRelu", hw=16, alpha=alpha), power_of_two=True)
    r = compare(m)
    rows = {o.layer: o for o in r.report.nodes if o.kind in ("layer", "fused")}
    assert rows["conv1"].placement == "dpu" and rows["conv2"].placement == "dpu"
    assert rows["leakyrelu"].placement == "cpu"
    assert "slope 26/256 = 0.1015625" in rows["leakyrelu"].reason
    assert not any(c.leaky for c in _conv_insns(r.report))
    r.assert_bit_exact()
    diff = np.abs(models.ort_run(m, r.inputs[0]) - r.outputs[0]).max()
    assert diff <= 2 * models.output_step(m) + 1e-6


def test_relu6_is_the_conv_clip_bit_exact(compare):
    """Clip(0, 6) after a conv folds into the requantize's clip (CONV clip_lo / clip_hi)."""
    m = ort_quantize(models.conv_unary("Clip", hw=16), power_of_two=True)
    r = compare(m)
    rows = {o.layer: o for o in r.report.nodes if o.kind in ("layer", "fused")}
    assert (rows["clip"].placement, rows["clip"].reason) == ("dpu", "fused into conv1")
    convs = _conv_insns(r.report)
    assert any(c.clip_lo == 0 and c.clip_hi < 127 for c in convs)
    assert not any(c.leaky for c in convs)
    r.assert_bit_exact()
    diff = np.abs(models.ort_run(m, r.inputs[0]) - r.outputs[0]).max()
    assert diff <= 2 * models.output_step(m) + 1e-6


def test_leaky_convs_keep_their_activation_inside_an_on_chip_chain(compare):
    """conv -> LeakyRelu -> conv -> LeakyRelu -> 1x1 conv: the fusion search chains the convs
    (intermediate bands in FM) and every CONV of a fused layer carries ``leaky``."""
    b = Builder(3)
    y = INPUT_NAME
    for i, k in enumerate((3, 3, 1), 1):
        y = b.conv(y, 16, 16, k, name=f"c{i}")
        y = b.node("LeakyRelu", [y], f"l{i}", alpha=LEAKY_SLOPE) if i < 3 else y
    m = ort_quantize(b.model("leaky_chain", INPUT_NAME, (4, 16, 32, 32), [y]),
                     power_of_two=True)
    r = compare(m)
    rows = {o.layer: o for o in r.report.nodes if o.kind in ("layer", "fused")}
    assert rows["c1"].reason == rows["c2"].reason == "matched dpu.qconv2d_leaky"
    groups = [ly.name for f in r.report.functions for ly in load_blob(f.blob)[0].layers]
    assert "c1+c2+c3" in groups
    assert any(c.leaky for c in _conv_insns(r.report))
    r.assert_bit_exact()
