"""The requantize guard (tvm_accel.canonicalize.guard): a dead filter's bias no longer sets the
shift of the whole layer, and a layer whose recipe is still too far from its float scales runs
on the CPU with the reason instead of silently losing accuracy."""

import numpy as np
import onnxruntime as ort
import pytest
from conftest import Compared, run_vm
from onnx import numpy_helper

from helpers import models
from tvm_accel.canonicalize.guard import guard_weighted
from tvm_accel.cli import main
from tvm_accel.frontend import load_onnx, random_inputs
from tvm_accel.pipeline import compile_model, compile_reference
from tvm_accel.quantize import ort_quantize
from tvm_accel.target import get_target
from tvm_marsellus.numerics import requant_recipe as normquant_recipe

QUANT = {"vta": ("int8", True, False), "dpu": ("int8", False, True),
         "marsellus": ("uint8", True, False)}


def near_dead_conv(target: str, cout: int = 8):
    """A conv + ReLU whose filter 1 was 1e-12 before quantizing: onnxruntime keeps that
    channel's bias within int32 with a ~1e-9 weight scale, i.e. a bias near -2^31."""
    m = models.single_conv(cin=8, cout=cout, relu=False, seed=3)
    for init in m.graph.initializer:
        if len(init.dims) == 4:
            w = numpy_helper.to_array(init).copy()
            w[1] = 1e-12
            init.CopyFrom(numpy_helper.from_array(w, init.name))
    act, per_channel, pow2 = QUANT[target]
    return ort_quantize(m, act, per_channel, power_of_two=pow2)


def _output_scale(model) -> float:
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"
          and n.output[0] == model.graph.output[0].name]
    return float(inits[dq[0].input[1]])


def test_a_constant_channel_keeps_the_shift_of_the_healthy_ones():
    scale = np.array([2e-3, 3e-11, 1.5e-3])
    wbound = np.array([20000, 0, 30000])
    bias = np.array([100, -2_147_268_884, -50])
    g = guard_weighted(normquant_recipe, None, scale, wbound, bias, np.ones(3), 0, -128, 127,
                       2.0)
    alone = normquant_recipe(scale[[0, 2]], wbound[[0, 2]] + np.abs(bias[[0, 2]]), 0, -128, 127)
    assert g.rq.shift == alone.shift
    assert g.detail["constant_channels"] == {1: 0}
    assert g.rq.apply(g.bias.reshape(1, 3))[0, 1] == 0  # the same constant, exactly
    assert g.err.max_lsb_error < 0.1


@pytest.mark.parametrize("target", ["vta", "dpu", "marsellus"])
def test_near_dead_filter_is_offloaded_bit_exact_and_agrees_with_onnxruntime(target):
    model = near_dead_conv(target)
    r = Compared(target, model)
    assert [o.placement for o in r.offloaded] == [target]
    r.assert_bit_exact()
    conv = next(n for n in r.report.numerics if n.op == "conv2d")
    assert conv.max_lsb_error < 1.0
    _, info = load_onnx(model)
    inputs = random_inputs(info, seed=0)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expect = sess.run(None, inputs)[0]
    lsb = np.abs(r.outputs[0].astype(np.float64) - expect) / _output_scale(model)
    assert lsb.max() <= 1.0 + 1e-6


def test_a_layer_beyond_the_limit_runs_on_the_cpu_with_the_reason():
    model = models.quantized("single_conv", "uint8", cin=8, cout=8)
    mod, info = load_onnx(model)
    target = get_target("marsellus")
    ex, report = compile_model(mod, target, max_requant_error=1e-6)
    conv = next(r for r in report.offloads if r.op == "conv2d")
    assert conv.placement == "cpu"
    assert conv.reason.startswith("requantize error ") and "> 1e-06 LSB limit" in conv.reason
    ref = compile_reference(mod, target, max_requant_error=1e-6)
    x = list(random_inputs(info, seed=1).values())
    np.testing.assert_array_equal(run_vm(ex, x)[0], run_vm(ref, x)[0])
    _, report = compile_model(mod, target, max_requant_error=float("inf"))
    assert next(r for r in report.offloads if r.op == "conv2d").placement == "marsellus"


def test_max_requant_error_flag_reaches_the_report(tmp_path, capsys):
    path = tmp_path / "conv.onnx"
    path.write_bytes(models.quantized("single_conv", "uint8", cin=8, cout=8)
                     .SerializeToString())
    rc = main(["compile", str(path), "--target", "marsellus, llvm", "-o",
               str(tmp_path / "m.tar"), "--max-requant-error", "0", "--dump-offloads"])
    out = capsys.readouterr().out
    assert rc == 0 and "0 of 1 layers on marsellus" in out and "LSB limit" in out


@pytest.mark.parametrize("value", ["-1", "lots", "nan"])
def test_a_bad_max_requant_error_is_one_line(tmp_path, capsys, value):
    path = tmp_path / "conv.onnx"
    path.write_bytes(models.quantized("single_conv", cin=8, cout=8).SerializeToString())
    with pytest.raises(SystemExit) as e:
        main(["compile", str(path), "--target", "vta, llvm", "--max-requant-error", value])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and "--max-requant-error" in err[-1]
