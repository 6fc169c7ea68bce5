"""Sub-byte mixed precision in the core (tvm_accel.precision): int4/uint4 and clipped-range QDQ
import, b-bit requantize clips, the precision config, bits in the layer IR, and the VTA/DPU
fallback of sub-8-bit activations.

Agreement with onnxruntime is measured in LSBs of the model's output scale on seeded inputs;
the canonical graph computes exactly ORT's QDQ arithmetic here, so the bound asserted is 1 LSB
(the figure observed is 0).
"""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, numpy_helper
from tvm import relax

from helpers import models
from tvm_accel import quantize, zoo
from tvm_accel.canonicalize import canonicalize
from tvm_accel.cli import main
from tvm_accel.errors import ConfigError
from tvm_accel.frontend import load_onnx
from tvm_accel.lower import _offload_input_bits, extract_layer_graph
from tvm_accel.partition import module_layer_bits, partition
from tvm_accel.pipeline import compile_model, compile_reference
from tvm_accel.precision import LAYER_BITS_ATTR, load_precision, signed_bits

LSB_BOUND = 1.0


def _ort(q: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {q.graph.input[0].name: x})[0]


def _output_scale(q: onnx.ModelProto) -> float:
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    node = next(n for n in q.graph.node if n.output[0] == q.graph.output[0].name)
    return float(inits[node.input[1]])


def _run(ex, x: np.ndarray) -> np.ndarray:
    return relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()


def _lsb_vs_ort(q: onnx.ModelProto, seeds=(0, 1)) -> float:
    """CPU reference (compile_reference) vs onnxruntime running the original model."""
    mod, _ = load_onnx(q)
    ex = compile_reference(mod, None)
    worst = 0.0
    for seed in seeds:
        x = zoo.random_input(q, seed)[0]
        worst = max(worst, float(np.abs(_run(ex, x) - _ort(q, x)).max()) / _output_scale(q))
    return worst


def _bits(report, onnx_name: str) -> dict:
    return next(r for r in report if r.onnx_name == onnx_name).detail["bits"]


@pytest.fixture(scope="module")
def conv8():
    return quantize.ort_quantize(models.single_conv(relu=True), "uint8")


# --- import --------------------------------------------------------------------------------------
def test_int4_uint4_qdq_model_loads_and_matches_onnxruntime(conv8):
    q = quantize.apply_mixed_precision(conv8, {"conv": {"w": 4, "o": 4}}, native_int4=True)
    types = {t.data_type for t in q.graph.initializer}
    assert TensorProto.INT4 in types and TensorProto.UINT4 in types  # really an int4 model
    mod, info = load_onnx(q)
    assert list(info.activation_ranges.values()) == [(0, 15)]
    assert list(info.weight_bits.values()) == [4]
    _, report = canonicalize(mod)
    assert _bits(report, "conv") == {"w": 4, "i": 8, "o": 4}
    assert report[0].detail["qmax"] == 15
    lsb = _lsb_vs_ort(q)
    print(f"int4 weights / uint4 output conv vs onnxruntime: {lsb} LSB")
    assert lsb <= LSB_BOUND


@pytest.mark.parametrize("w, o", [(3, 3), (2, 6)])
def test_clipped_range_model_loads_and_matches_onnxruntime(conv8, w, o):
    q = quantize.apply_mixed_precision(conv8, {"conv": {"w": w, "o": o}}, native_int4=False)
    assert any(n.op_type == "Clip" for n in q.graph.node)  # Q -> Clip -> DQ
    mod, info = load_onnx(q)
    assert list(info.activation_ranges.values()) == [(0, (1 << o) - 1)]
    _, report = canonicalize(mod)
    assert _bits(report, "conv") == {"w": w, "i": 8, "o": o}
    lsb = _lsb_vs_ort(q)
    print(f"clipped-range conv W{w}/O{o} vs onnxruntime: {lsb} LSB")
    assert lsb <= LSB_BOUND


# --- precision config ----------------------------------------------------------------------------
def test_precision_config_changes_the_layer_bits_in_the_canonical_graph(tmp_path):
    """(int8 symmetric activations: a 4-bit clip keeps the zero point, see
    test_marsellus_runs_a_precision_config_sub8bit_output_bit_exact for the refusal.)"""
    cfg = tmp_path / "bits.json"
    cfg.write_text(json.dumps({"layers": {"conv": {"w": 3, "i": 4, "o": 4}}}))
    conv8 = quantize.ort_quantize(models.single_conv(relu=True), "int8", symmetric_activations=True)
    mod, _ = load_onnx(conv8)
    cmod, report = canonicalize(mod, precision_config=str(cfg))
    assert _bits(report, "conv") == {"w": 3, "i": 4, "o": 4}
    assert dict(cmod.attrs[LAYER_BITS_ATTR]["conv"]) == {"w": 3, "i": 4, "o": 4}
    conv = next(b.value for blk in cmod["main"].body.blocks for b in blk.bindings
                if b.var.name == "conv_acc")
    assert signed_bits(conv.args[1].value.numpy()) <= 3  # weights re-quantized to 3 bits
    # the reference computes the 4-bit values: the conv's (widened) scale counts the model's
    # output (its ReLU, a layer of its own here, keeps the 8-bit scale) in 4-bit steps
    ex = compile_reference(mod, None, precision=str(cfg))
    x = zoo.random_input(conv8, 0)[0]
    y = _run(ex, x)
    conv_rec = next(r for r in report if r.onnx_name == "conv")
    s, z = conv_rec.output_scale, conv_rec.output_zero_point
    q = np.rint(y / s) + z
    assert q.min() >= 0 and q.max() <= 7 and len(np.unique(q)) > 4  # ReLU, int4 [-8, 7]
    np.testing.assert_allclose(y, (q - z) * s, rtol=1e-5)
    ref8 = _run(compile_reference(mod, None), x)
    assert not np.array_equal(y, ref8)


def test_precision_config_default_applies_to_weighted_layers(conv8):
    mod, _ = load_onnx(conv8)
    _, report = canonicalize(mod, precision_config={"default": {"w": 5}})
    assert _bits(report, "conv")["w"] == 5


@pytest.mark.parametrize("text, field", [
    ('{"layers": {"nope": {"w": 4}}}', "layers.nope"),
    ('{"layers": {"conv": {"w": 9}}}', "layers.conv.w"),
    ('{"layers": {"conv": {"o": 1}}}', "layers.conv.o"),
    ('{"layers": {"conv": {"x": 4}}}', "layers.conv.x"),
    ('{"layer": {}}', "layer"),
    ('{"layers": {"conv": {"w": 4}', "malformed JSON"),
])
def test_bad_precision_config_is_a_one_line_error_naming_file_and_field(conv8, tmp_path, text,
                                                                        field):
    cfg = tmp_path / "bad.json"
    cfg.write_text(text)
    mod, _ = load_onnx(conv8)
    with pytest.raises(ConfigError) as e:
        canonicalize(mod, precision_config=str(cfg))
    msg = str(e.value)
    assert "bad.json" in msg and field in msg and "\n" not in msg


def test_tvmc_compile_takes_a_precision_config(conv8, tmp_path, capsys):
    model = tmp_path / "conv.onnx"
    onnx.save(conv8, str(model))
    cfg = tmp_path / "p.json"
    cfg.write_text('{"layers": {"conv": {"w": 4, "o": 4}}}')
    rc = main(["compile", str(model), "--target", "llvm", "--precision-config", str(cfg),
               "-o", str(tmp_path / "m.tar")])
    assert rc == 0
    cfg.write_text('{"layers": {"conv": {"w": "four"}}}')
    rc = main(["compile", str(model), "--target", "llvm", "--precision-config", str(cfg),
               "-o", str(tmp_path / "m.tar")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "p.json" in err[0] and "layers.conv.w" in err[0]


def test_load_precision_accepts_dicts_and_json_text():
    a = load_precision({"layers": {"c": {"w": 2}}, "default": {"o": 8}})
    b = load_precision('{"layers": {"c": {"w": 2}}, "default": {"o": 8}}')
    assert a.layers == b.layers and a.for_layer("c", True).w == 2
    assert a.for_layer("other", False).o is None  # defaults: weighted layers only


# --- layer IR ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def resnet20_mixed():
    return quantize.resnet20_mixed()


def test_extract_layer_graph_reports_activation_bits_and_weight_bits(resnet20_mixed):
    import tvm_vta_cp.patterns as vp

    q = onnx.ModelProto()
    q.CopyFrom(resnet20_mixed)
    qin = next(n for n in q.graph.node if n.input[0] == q.graph.input[0].name)
    for t in q.graph.initializer:  # input zero point 0: a 4-bit clip of it keeps real 0.0
        if t.name == qin.input[2]:
            t.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(t)), t.name))
    mod, _ = load_onnx(q)
    # i=4 on conv1 clips the model's input quantize: a 4-bit function input
    cmod, _ = canonicalize(mod, "vta", precision_config={"layers": {"conv1": {"i": 4}}})
    pats = vp.pattern_table()
    for p in pats:  # the layer IR, not VTA's policy, is under test here
        p.checks.remove(vp.activations_are_8bit)
    parted = partition(cmod, pats)
    funcs = {gv: f for gv, f in parted.functions_items()
             if isinstance(f, relax.Function) and f.attrs and f.attrs.get("Codegen") == "vta"}
    bits = module_layer_bits(cmod)
    in_bits = _offload_input_bits(parted, funcs, pats, bits)
    layers, tensors, first_inputs = {}, {}, {}
    for gv, f in funcs.items():
        g = extract_layer_graph(f, pats, bits, in_bits[gv])
        layers.update({ly.name: ly for ly in g.layers})
        tensors.update(g.tensors)
        first_inputs.update({ly.name: g.tensors[ly.input] for ly in g.layers
                             if getattr(ly, "input", None) in g.inputs})
    assert tensors["layer1_0_conv1"].bits == 4 and tensors["layer1_0_conv2"].bits == 4
    assert layers["layer1_0_conv2"].weight_bits == 6
    assert layers["layer2_0_conv2"].weight_bits == 4
    assert layers["layer3_0_conv1"].weight_bits == 2
    assert layers["layer3_0_conv2"].weight_bits == 3
    assert layers["conv1"].weight_bits == 8
    for ly in layers.values():
        if hasattr(ly, "weight_bits"):
            lo, hi = -(1 << (ly.weight_bits - 1)), (1 << (ly.weight_bits - 1)) - 1
            assert ly.weight.min() >= lo and ly.weight.max() <= hi
    # a function input carries the bits recorded for the value main passes in
    assert first_inputs["conv1"].bits == 4


# --- VTA / DPU policy ----------------------------------------------------------------------------
def test_vta_keeps_sub8bit_activation_layers_on_the_cpu_and_stays_bit_exact(resnet20_mixed):
    import tvm_vta_cp

    mod, info = load_onnx(resnet20_mixed)
    ex, report = compile_model(mod, tvm_vta_cp.TARGET, "vta_1x16x16")
    where = {r.layer: r for r in report.offloads}
    assert where["layer1.0.conv1"].placement == "cpu"
    assert "sub-8-bit (2..7-bit) activations: VTA computes int8 only" in \
        where["layer1.0.conv1"].reason
    assert where["layer1.0.conv2"].placement == "cpu"  # reads a 4-bit tensor
    assert where["fc"].placement == "vta"  # 8-bit weights, reads the 8-bit pooled features
    x = zoo.random_input(resnet20_mixed, 0)[0]
    np.testing.assert_array_equal(_run(ex, x), _run(compile_reference(mod, tvm_vta_cp.TARGET),
                                                     x))


def test_dpu_names_the_sub8bit_activation_reason():
    import tvm_dpu

    q = quantize.ort_quantize(models.single_conv(relu=True), "int8", power_of_two=True)
    mod, _ = load_onnx(q)
    _, report = compile_model(mod, tvm_dpu.TARGET)
    assert next(r for r in report.offloads if r.layer == "conv").placement == "dpu"
    _, report = compile_model(mod, tvm_dpu.TARGET, precision={"layers": {"conv": {"o": 4}}})
    conv = next(r for r in report.offloads if r.layer == "conv")
    assert conv.placement == "cpu"
    assert "sub-8-bit (2..7-bit) activations: the DPU computes int8 only" in conv.reason


def test_plain_8bit_models_are_untouched_by_the_precision_machinery(conv8):
    mod, info = load_onnx(conv8)
    assert not info.activation_ranges and not info.weight_bits
    import tvm_vta_cp

    _, report = compile_model(mod, tvm_vta_cp.TARGET, "vta_1x16x16")
    assert [r.placement for r in report.offloads if r.layer == "conv"] == ["vta"]


# --- mixed-precision networks --------------------------------------------------------------------
@pytest.mark.parametrize("build", ["resnet20_mixed", "mobilenet_tiny_mixed"])
def test_mixed_precision_networks_compile_for_the_cpu_and_match_onnxruntime(build):
    q = getattr(quantize, build)()
    mod, _ = load_onnx(q)
    _, report = canonicalize(mod)
    ws = {r.detail["bits"]["w"] for r in report if r.detail.get("bits", {}).get("w")}
    os_ = {r.detail["bits"]["o"] for r in report if "bits" in r.detail}
    assert 4 in os_ and 8 in os_ and min(ws) < 8
    if build == "resnet20_mixed":
        assert {2, 3, 6, 8} <= ws
    else:
        assert any(r.detail.get("groups", 1) > 1 for r in report)  # depthwise layers
    lsb = _lsb_vs_ort(q)
    print(f"{build} vs onnxruntime: {lsb} LSB")
    assert lsb <= LSB_BOUND


def test_marsellus_runs_a_precision_config_sub8bit_output_bit_exact():
    """The issue-12 case: ``{"o": 4}`` on a layer of an 8-bit model: the 4-bit output and the
    conv reading it run on the RBE, bit-exact, with uint8 activations (zero point 0) and with
    asymmetric int8 ones (zero point -128, which the widened 4-bit scale maps to -8). Clipped at
    its scale (``keep_scale``) the int8 tensor's 4-bit range cannot hold the zero point: refused
    in one line instead of crashing the encoder."""
    import tvm_marsellus

    bits = {"layers": {"block1.conv1": {"w": 4, "o": 4}}}
    x = zoo.random_input(models.quantized("tiny_cnn"), 0)[0]
    for act in ("uint8", "int8"):
        mod, _ = load_onnx(models.quantized("tiny_cnn", activation_type=act))
        ex, report = compile_model(mod, tvm_marsellus.TARGET, precision=bits)
        where = {r.layer: r.placement for r in report.offloads}
        assert where["block1.conv1"] == where["block1.conv2"] == "marsellus"
        ref = compile_reference(mod, tvm_marsellus.TARGET, precision=bits)
        np.testing.assert_array_equal(_run(ex, x), _run(ref, x))
    keep = {"layers": {"block1.conv1": {"w": 4, "o": 4, "keep_scale": True}}}
    with pytest.raises(ConfigError, match=r"layers\.block1\.conv1\.o: the 4-bit int8 range "
                                          r"\[-8, 7\] excludes the tensor's zero point -128"):
        compile_model(mod, tvm_marsellus.TARGET, precision=keep)
