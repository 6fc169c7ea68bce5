"""Narrowed activations of a precision config keep their calibrated range (issue 21, item 6):
the scale widens, every reader follows, the result equals the same narrowing done in the ONNX
model (tvm_accel.quantize.apply_mixed_precision) and runs bit-exact on MARSELLUS; ``keep_scale``
restores the clip at the old scale, with a warning."""

import json
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import helper, numpy_helper
from tvm import relax

from helpers import models
from tvm_accel import quantize, zoo
from tvm_accel.canonicalize import canonicalize
from tvm_accel.cli import main
from tvm_accel.errors import ConfigError
from tvm_accel.frontend import load_onnx
from tvm_accel.pipeline import compile_model, compile_reference
from tvm_accel.precision import PrecisionWarning, load_precision, widen


def _run(ex, x: np.ndarray) -> np.ndarray:
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _rec(report, onnx_name: str):
    return next(r for r in report if r.onnx_name == onnx_name and r.integer)


@pytest.fixture(scope="module")
def tiny_u8():
    return models.quantized("tiny_cnn", activation_type="uint8")


@pytest.mark.parametrize("scale, zp, old, bits, dtype, want", [
    (0.03, 0, (0, 255), 4, "uint8", (np.float32(0.03 * 17), 0)),
    (0.03, 10, (0, 255), 4, "uint8", (np.float32(0.03 * 17), 1)),       # round(10 * 15 / 255)
    (0.03, -128, (-128, 127), 4, "int8", (np.float32(0.03 * 17), -8)),
    (0.03, 0, (-128, 127), 4, "int8", (np.float32(0.03 * 17), 0)),
    (0.03, 0, (0, 15), 2, "uint8", (np.float32(0.03 * 5), 0)),          # from a 4-bit range
    (0.125, 0, (-128, 127), 4, "int8", (2.0, 0)),                       # power of two: x16
    (0.125, 0, (-128, 127), 2, "int8", (8.0, 0)),
])
def test_widen_keeps_the_real_range_on_fewer_levels(scale, zp, old, bits, dtype, want):
    assert widen(scale, zp, old, bits, dtype) == (float(want[0]), want[1])


def test_narrowed_output_gets_the_widened_scale_and_its_reader_follows(tiny_u8):
    mod, _ = load_onnx(tiny_u8)
    _, base = canonicalize(mod)
    _, report = canonicalize(mod, precision_config={"layers": {"block1.conv1": {"o": 4}}})
    s8 = _rec(base, "block1.conv1").output_scale
    conv1, conv2 = _rec(report, "block1.conv1"), _rec(report, "block1.conv2")
    assert conv1.output_scale == float(np.float32(s8 * 255 / 15))
    assert conv1.output_zero_point == 0
    assert (conv1.detail["qmin"], conv1.detail["qmax"]) == (0, 15)
    assert conv1.detail["bits"]["o"] == 4
    # the reader: input scale, input bits and requantize scale from the widened tensor
    assert conv2.detail["input_scale"] == conv1.output_scale
    assert conv2.detail["bits"]["i"] == 4
    base2 = _rec(base, "block1.conv2")
    np.testing.assert_allclose(conv2.detail["requant"].scale,
                               base2.detail["requant"].scale * 17, rtol=1e-6)
    assert conv2.output_scale == base2.output_scale  # not narrowed itself


@pytest.mark.parametrize("act", ["uint8", "int8"])
@pytest.mark.parametrize("bits", [
    {"block1.conv1": {"o": 4}},
    # conv1 shares its scale initializer with pool1 in the ONNX model; fc is the model output
    {"conv1": {"o": 3}, "block1.conv2": {"o": 5}, "fc": {"o": 4}},
    {"pool1": {"o": 4}, "block1.conv1": {"w": 4, "o": 2}, "conv2": {"i": 4}},
])
def test_precision_config_equals_the_same_narrowing_in_the_onnx_model(act, bits):
    """The config narrows at compile time what apply_mixed_precision narrows in the model
    (``i`` on conv2 = ``o`` on its producer, block1's add): the same integers, bit for bit."""
    q = models.quantized("tiny_cnn", activation_type=act)
    mod, _ = load_onnx(q)
    ex = compile_reference(mod, None, precision={"layers": bits})
    onnx_bits = {("block1.add" if k == "conv2" else k): {"o" if f == "i" else f: b
                                                          for f, b in v.items()}
                 for k, v in bits.items()}
    mod2, _ = load_onnx(quantize.apply_mixed_precision(q, onnx_bits, native_int4=False))
    ex2 = compile_reference(mod2, None)
    for seed in range(2):
        x = zoo.random_input(q, seed)[0]
        np.testing.assert_array_equal(_run(ex, x), _run(ex2, x))


def test_apply_mixed_precision_narrows_only_the_named_tensor(tiny_u8):
    """conv1's output and pool1's share one scale initializer in onnxruntime's model: narrowing
    conv1 leaves pool1 at its 8-bit scale (it used to widen it too, and narrowing both widened
    the shared scale twice: 289x in resnet18_mixed's stem)."""
    def q_scales(m):
        inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
        return {n.name: float(inits[n.input[1]]) for n in m.graph.node
                if n.op_type == "QuantizeLinear"}

    before = q_scales(tiny_u8)
    one = q_scales(quantize.apply_mixed_precision(tiny_u8, {"conv1": {"o": 4}}))
    both = q_scales(quantize.apply_mixed_precision(tiny_u8, {"conv1": {"o": 4},
                                                             "pool1": {"o": 4}}))
    conv1_q, pool1_q = "conv1_relu_out_QuantizeLinear", "pool1_out_QuantizeLinear"
    assert before[conv1_q] == before[pool1_q]
    widened = float(np.float32(before[conv1_q] * 17))
    assert one[conv1_q] == widened and one[pool1_q] == before[pool1_q]
    assert both[conv1_q] == both[pool1_q] == widened


def test_widened_power_of_two_scale_stays_a_power_of_two():
    q = quantize.ort_quantize(models.single_conv(relu=True), "int8", power_of_two=True)
    mod, _ = load_onnx(q)
    _, base = canonicalize(mod)
    _, report = canonicalize(mod, precision_config={"layers": {"conv": {"o": 4}}})
    assert _rec(report, "conv").output_scale == _rec(base, "conv").output_scale * 16


def test_mixed_precision_config_runs_bit_exact_on_marsellus(tiny_u8):
    import tvm_marsellus

    bits = {"layers": {"conv1": {"o": 4}, "pool1": {"o": 4},
                       "block1.conv1": {"w": 4, "o": 3}, "block1.conv2": {"w": 6, "o": 4},
                       "conv2": {"i": 4, "w": 4}, "fc": {"o": 4}}}
    mod, _ = load_onnx(tiny_u8)
    ex, report = compile_model(mod, tvm_marsellus.TARGET, precision=bits)
    where = {r.layer: r.placement for r in report.offloads}
    assert {where[k] for k in ("conv1", "pool1", "block1.conv1", "block1.conv2", "block1.add",
                               "conv2", "fc")} == {"marsellus"}
    ref = compile_reference(mod, tvm_marsellus.TARGET, precision=bits)
    for seed in range(2):
        x = zoo.random_input(tiny_u8, seed)[0]
        np.testing.assert_array_equal(_run(ex, x), _run(ref, x))


# --- keep_scale ----------------------------------------------------------------------------------
def test_keep_scale_clips_at_the_old_scale_and_warns_about_the_saturated_share(tiny_u8):
    mod, _ = load_onnx(tiny_u8)
    _, base = canonicalize(mod)
    keep = {"layers": {"block1.conv1": {"o": 4, "keep_scale": True}}}
    with pytest.warns(PrecisionWarning) as caught:
        _, report = canonicalize(mod, precision_config=keep)
    conv1 = _rec(report, "block1.conv1")
    assert conv1.output_scale == _rec(base, "block1.conv1").output_scale
    assert (conv1.detail["qmin"], conv1.detail["qmax"]) == (0, 15)
    assert _rec(report, "block1.conv2").detail["input_scale"] == conv1.output_scale
    msg = str(caught[0].message)
    assert "layers.block1.conv1.o" in msg and "93.8% of its calibrated range" in msg
    assert "240 of 256 codes" in msg and "\n" not in msg
    # the same through the config-wide choice; an entry's own choice wins over it
    with pytest.warns(PrecisionWarning):
        _, again = canonicalize(mod, precision_config=load_precision(
            {"layers": {"block1.conv1": {"o": 4}}}, keep_scale=True))
    assert _rec(again, "block1.conv1").output_scale == conv1.output_scale
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecisionWarning)
        _, own = canonicalize(mod, precision_config=load_precision(
            {"layers": {"block1.conv1": {"o": 4, "keep_scale": False}}}, keep_scale=True))
    assert _rec(own, "block1.conv1").output_scale != conv1.output_scale


def test_widening_is_silent_and_keeps_accuracy_that_keep_scale_loses(tiny_u8):
    """Against the float model on seeded inputs: the widened 4-bit tensor stays close to the
    8-bit model, the clipped one does not (the figures are printed)."""
    float_model = zoo.tiny_cnn()
    sess = ort.InferenceSession(float_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    mod, _ = load_onnx(tiny_u8)
    layers = {"conv1": {"o": 4}, "block1.conv1": {"o": 4}}
    keep = {k: {**v, "keep_scale": True} for k, v in layers.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", PrecisionWarning)
        wide = compile_reference(mod, None, precision={"layers": layers})
    with pytest.warns(PrecisionWarning):
        clip = compile_reference(mod, None, precision={"layers": keep})
    eight = compile_reference(mod, None)
    err = {"8-bit": [], "widened": [], "keep_scale": []}
    for seed in range(4):
        x = zoo.random_input(tiny_u8, seed)[0]
        ref = sess.run(None, {sess.get_inputs()[0].name: x})[0]
        for k, ex in (("8-bit", eight), ("widened", wide), ("keep_scale", clip)):
            err[k].append(float(np.abs(_run(ex, x) - ref).mean() / np.abs(ref).mean()))
    mean = {k: float(np.mean(v)) for k, v in err.items()}
    print("relative error vs float:", json.dumps(mean))
    assert mean["widened"] < 2 * mean["keep_scale"] / 3


def test_keep_scale_on_a_float_producer_clips_what_its_readers_see():
    """A Softmax stays float (on the CPU): its quantize is clipped too, as onnxruntime clips a
    Clip between Q and DQ (the check is against onnxruntime running that model)."""
    q = models.quantized("conv_unary", op="Softmax", activation_type="uint8")
    mod, _ = load_onnx(q)
    with pytest.warns(PrecisionWarning):
        ex = compile_reference(mod, None, precision={"layers": {"softmax": {
            "o": 4, "keep_scale": True}}})
    clipped = onnx.ModelProto()
    clipped.CopyFrom(q)
    g = clipped.graph
    sig = next(n for n in g.node if n.op_type == "Softmax")
    qn = next(n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == sig.output[0])
    g.initializer.extend([numpy_helper.from_array(np.array(v, np.uint8), n)
                          for n, v in (("clip_lo", 0), ("clip_hi", 15))])
    for n in g.node:
        n.input[:] = [f"{qn.output[0]}_c" if i == qn.output[0] else i for i in n.input]
    g.node.insert(list(g.node).index(qn) + 1, helper.make_node(
        "Clip", [qn.output[0], "clip_lo", "clip_hi"], [f"{qn.output[0]}_c"]))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(clipped.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    x = zoo.random_input(q, 0)[0]
    want = sess.run(None, {g.input[0].name: x})[0]
    got = _run(ex, x)
    unclipped = _run(compile_reference(mod, None), x)
    assert np.abs(got - want).max() <= np.abs(unclipped - want).max() / 10


def test_keep_scale_and_widening_on_one_tensor_is_a_one_line_error(tiny_u8):
    mod, _ = load_onnx(tiny_u8)
    cfg = {"layers": {"block1.conv1": {"o": 4, "keep_scale": True}, "block1.conv2": {"i": 4}}}
    with pytest.raises(ConfigError, match=r"layers\.block1\.conv1\.o keeps the tensor's scale "
                                          r"but layers\.block1\.conv2\.i widens it"):
        canonicalize(mod, precision_config=cfg)


def test_bad_keep_scale_value_is_a_one_line_error():
    with pytest.raises(ConfigError, match=r"layers\.c\.keep_scale = 'yes': must be true or "
                                          "false"):
        load_precision({"layers": {"c": {"o": 4, "keep_scale": "yes"}}})


def test_tvmc_compile_precision_keep_scale_prints_one_warning_line(tiny_u8, tmp_path, capsys):
    model = tmp_path / "tiny.onnx"
    onnx.save(tiny_u8, str(model))
    cfg = tmp_path / "p.json"
    cfg.write_text('{"layers": {"block1.conv1": {"o": 4}}}')
    args = ["compile", str(model), "--target", "llvm", "--precision-config", str(cfg),
            "-o", str(tmp_path / "m.tar")]
    assert main(args) == 0
    assert "warning" not in capsys.readouterr().err
    assert main([*args, "--precision-keep-scale"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tvmc compile: warning: ")
    assert "layers.block1.conv1.o: keep_scale clips" in err[0]
    assert main(args[:4] + ["--precision-keep-scale", "-o", str(tmp_path / "m.tar")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--precision-keep-scale" in err[0] and "--precision-config" in err[0]
