"""DPU operator coverage beyond the plain conv / pool: dilated convs (DeepLab's ASPP head) on the
CONV engine, global average pools beyond the 15 x 15 AVGPOOL window in steps, ceil-mode
average pools whose windows are whole; bit-exact against the CPU reference and within 1 LSB of
onnxruntime."""

import numpy as np
import onnx
import pytest
from conftest import run_vm

from helpers import models
from tvm_accel.frontend import load_onnx, random_inputs
from tvm_accel.pipeline import compile_model, compile_reference
from tvm_accel.quantize import ort_quantize
from tvm_accel.target import get_target
from tvm_accel.zoo import INPUT_NAME, Builder
from tvm_dpu.codegen import load_blob
from tvm_dpu.numerics import global_pool_steps


def pow2(name, **kw):
    return models.quantized(name, power_of_two=True, **kw)




@pytest.mark.parametrize("dilations, batch", [((2, 6, 12), 1), ((2, 6, 12), 3)])
def test_aspp_head_runs_its_dilated_branches_on_the_dpu(compare, dilations, batch):
    m = pow2("aspp_head", dilations=dilations, batch=batch)
    r = compare(m)
    placed = {o.layer: o.placement for o in r.report.offloads}
    assert placed == {"aspp_1x1": "dpu", **{f"aspp_d{d}": "dpu" for d in dilations},
                      "aspp_concat": "dpu", "aspp_project": "dpu"}
    shapes = {ly.name: ly.shape for f in r.report.functions
              for ly in load_blob(f.blob)[0].layers}
    assert all(shapes[f"aspp_d{d}"].endswith(f"k3x3 s1 p{d} d{d}") for d in dilations)
    r.assert_bit_exact()
    diff = np.abs(models.ort_run(m, r.inputs[0]) - r.outputs[0]).max()
    assert diff <= models.output_step(m) + 1e-6


def test_dilation_differing_between_h_and_w_falls_back_with_its_reason(compare):
    m = models.single_conv(cin=8, cout=8, k=3, pad=(1, 2, 1, 2), hw=10)
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    conv.attribute.append(onnx.helper.make_attribute("dilations", [1, 2]))
    r = compare(ort_quantize(m, power_of_two=True))
    row = next(o for o in r.report.offloads if o.op == "conv2d")
    assert row.placement == "cpu"
    assert "dilation differs between H and W" in row.reason
    r.assert_bit_exact()


# --- global average pool beyond the 15 x 15 AVGPOOL window -------------------------------------
def _gap_model(hw: int, flat_calibration: bool = True, batch: int = 1) -> onnx.ModelProto:
    """conv -> GlobalAveragePool on (batch, 16, hw, hw), power-of-two QDQ. Calibrated on
    spatially flat images (per-channel constants), the pool's output range is the conv's (as
    in a trained network's last feature map); on noise it is 16x narrower."""
    f = models.single_pool(kind="gap", c=16, hw=hw, batch=batch)
    if not flat_calibration:
        return ort_quantize(f, power_of_two=True)
    rng = np.random.default_rng(0)
    calib = [{"input": np.broadcast_to(rng.normal(0, 1, (batch, 16, 1, 1)),
                                       (batch, 16, hw, hw)).astype(np.float32)}
             for _ in range(4)]
    return ort_quantize(f, power_of_two=True, calibration=calib)


@pytest.mark.parametrize("hw, batch, steps", [(16, 1, [[4, 4], [4, 4]]),
                                              (32, 3, [[4, 4], [8, 8]]),
                                              (64, 1, [[4, 4], [4, 4], [4, 4]])])
def test_global_pool_beyond_the_window_runs_in_steps_bit_exact(compare, hw, batch, steps):
    m = _gap_model(hw, batch=batch)
    r = compare(m)
    placed = [(o.layer, o.op, o.placement) for o in r.report.offloads]
    assert placed == [("conv", "conv2d", "dpu"),
                      *[(f"gap_step{i + 1}", "avg_pool2d", "dpu") for i in range(len(steps) - 1)],
                      ("gap", "global_avg_pool2d", "dpu")]
    rec = next(n for n in r.report.numerics if n.name == "gap")
    assert rec.detail["steps"] == steps
    assert rec.max_lsb_error == 0.5 * (len(steps) - 1)  # half an input LSB per 8-bit step
    r.assert_bit_exact()
    diff = np.abs(models.ort_run(m, r.inputs[0]) - r.outputs[0]).max()
    assert diff <= models.output_step(m) + 1e-6


def test_global_pool_steps_beyond_the_error_limit_fall_back_unless_allowed():
    """On noise the pool's output LSB is 1/16 of its input's: an 8-bit intermediate costs
    8 output LSBs, more than the default limit of 2, so the pool keeps its one-step form on
    the CPU; with no limit the steps run on the DPU, bit-exact with that reference."""
    dpu = get_target("dpu")
    mod, info = load_onnx(_gap_model(16, flat_calibration=False))
    x = list(random_inputs(info, seed=0).values())
    _, rep = compile_model(mod, dpu)
    gap = next(o for o in rep.offloads if o.layer == "gap")
    assert gap.placement == "cpu" and "not split in steps" in gap.reason
    ex, rep = compile_model(mod, dpu, max_requant_error=float("inf"))
    assert {o.layer: o.placement for o in rep.offloads} == {
        "conv": "dpu", "gap_step1": "dpu", "gap": "dpu"}
    assert next(n for n in rep.numerics if n.name == "gap").max_lsb_error == 8.0
    ref = compile_reference(mod, dpu, max_requant_error=float("inf"))
    np.testing.assert_array_equal(run_vm(ex, x)[0], run_vm(ref, x)[0])


def test_global_pool_with_a_prime_side_falls_back_with_its_reason(compare):
    r = compare(_gap_model(17))
    gap = next(o for o in r.report.offloads if o.layer == "gap")
    assert gap.placement == "cpu" and "global pool over more than 15 x 15" in gap.reason
    r.assert_bit_exact()


def test_global_pool_steps_prefer_few_exact_windows_within_the_misc_fields():
    assert global_pool_steps(15, 15, "int8", (0, 0)) is None  # one window holds it
    assert global_pool_steps(16, 16, "int8", (0, 0)) == [(4, 4), (4, 4)]
    assert global_pool_steps(56, 56, "int8", (0, 0)) == [(7, 7), (8, 8)]
    assert global_pool_steps(224, 224, "int8", (0, 0)) == [(7, 7), (4, 4), (8, 8)]
    for h, w in [(16, 16), (20, 30), (14, 16), (100, 45), (224, 224)]:
        steps = global_pool_steps(h, w, "int8", (0, 0))
        assert np.prod([s[0] for s in steps]) == h and np.prod([s[1] for s in steps]) == w
        assert all(max(s) <= 7 for s in steps[:-1]) and max(steps[-1]) <= 15
    assert global_pool_steps(17, 16, "int8", (0, 0)) is None  # prime side
    assert global_pool_steps(16, 16, "uint8", (0, 0)) is None  # AVGPOOL is int8 only
    assert global_pool_steps(16, 16, "int8", (3, 0)) is None   # ... with zero points 0


# --- average pools with ceil_mode --------------------------------------------------------------
def _conv_ceil_avg_pool(hw: int, k: int, stride: int, pad: int) -> onnx.ModelProto:
    b = Builder(0)
    y = b.conv(INPUT_NAME, 8, 16, 3, name="conv", relu=True)
    y = b.node("AveragePool", [y], "pool", kernel_shape=[k, k], strides=[stride, stride],
               pads=[pad] * 4, ceil_mode=1, count_include_pad=1)
    return ort_quantize(b.model("ceil_avg_pool", INPUT_NAME, (1, 8, hw, hw), [y]),
                        power_of_two=True)


@pytest.mark.parametrize("hw, k, stride, pad", [(8, 3, 1, 1), (8, 2, 2, 0), (14, 5, 3, 0)])
def test_ceil_mode_average_pool_without_overhang_runs_on_the_dpu(compare, hw, k, stride, pad):
    """Every window whole (ceil and floor give one output size): the floor-mode pool."""
    m = _conv_ceil_avg_pool(hw, k, stride, pad)
    r = compare(m)
    assert {o.layer: o.placement for o in r.report.offloads}["pool"] == "dpu"
    r.assert_bit_exact()
    diff = np.abs(models.ort_run(m, r.inputs[0]) - r.outputs[0]).max()
    assert diff <= models.output_step(m) + 1e-6


def test_ceil_mode_average_pool_with_overhanging_windows_runs_on_avgpool_by_region(compare):
    """3x3 stride 2 on 8x8: the last windows overhang and onnxruntime divides them by their
    clipped size (6, 4 instead of 9): four AVGPOOL layers, one per divisor, each with its own
    recipe, and the CPU reassembles them."""
    r = compare(_conv_ceil_avg_pool(8, 3, 2, 0))
    placed = {o.layer: o.placement for o in r.report.offloads}
    assert [placed[n] for n in ("pool", "pool_part1", "pool_part2", "pool_part3")] == ["dpu"] * 4
    assert placed["pool_cat"] == "cpu"
    r.assert_bit_exact()
