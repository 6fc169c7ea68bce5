"""``tvmc quantize`` (issue 11, item 4; issue 12, item 6): a float model quantized with each
scheme, with and without calibration data; the power-of-two result compiled for the DPU puts
every conv, dense and add on the DPU and runs within 2 LSB of onnxruntime on the quantized
model; bad inputs are one stderr line and exit 2; a float model compiled for an accelerator
says it is not quantized and points to ``tvmc quantize``."""

import json
import tarfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_accel import quantize, zoo
from tvm_accel.cli import main
from tvm_accel.quantize import (
    PROVENANCE_KEY,
    CalibrationError,
    CalibrationWarning,
    is_quantized,
    quantize_model,
    quantized_nodes,
)

SCHEMES = ("per-channel", "per-tensor", "power-of-two")


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """A float tiny CNN (conv, maxpool, residual block, conv/2, GAP, FC), 6 calibration
    samples stacked along the batch axis, and one test input."""
    root = tmp_path_factory.mktemp("quantize")
    onnx.save(zoo.tiny_cnn(), str(root / "float.onnx"))
    rng = np.random.default_rng(7)
    np.savez(root / "cal.npz", input=rng.standard_normal((6, 3, 32, 32)).astype(np.float32))
    np.savez(root / "x.npz", input=rng.standard_normal((1, 3, 32, 32)).astype(np.float32))
    return root


def _tvmc(capsys, *argv):
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out.strip().splitlines(), err.strip().splitlines()


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _is_pow2(a: np.ndarray) -> bool:
    a = np.asarray(a, np.float64).ravel()
    return bool(np.all(np.exp2(np.round(np.log2(a))) == a))


@pytest.mark.parametrize("calibrated", [True, False], ids=["npz", "random"])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantize_each_scheme(ws, capsys, scheme, calibrated):
    out = ws / f"q_{scheme}_{calibrated}.onnx"
    cal = ["--calibration", ws / "cal.npz"] if calibrated else []
    rc, stdout, err = _tvmc(capsys, "quantize", ws / "float.onnx", "-o", out, "--scheme", scheme,
                            *cal)
    assert rc == 0, err
    assert len(stdout) == 1 and stdout[0].startswith("quantized ")
    assert f"scheme {scheme}" in stdout[0] and str(out) in stdout[0]
    assert ("6 sample(s) of" if calibrated else "4 random sample(s)") in stdout[0]
    if calibrated:
        assert err == []
    else:  # random calibration: one warning line
        assert len(err) == 1 and "warning" in err[0] and "not representative" in err[0]
    q = onnx.load(str(out))
    onnx.checker.check_model(q)
    nodes = quantized_nodes(q)
    assert nodes["Conv"] == 4 and nodes["Gemm"] == 1 and nodes["Add"] == 1
    assert f"{sum(nodes.values())} node(s)" in stdout[0]
    how = json.loads({p.key: p.value for p in q.metadata_props}[PROVENANCE_KEY])
    assert how["scheme"] == scheme and how["samples"] == (6 if calibrated else 4)
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    w_scales = [inits[n.input[1]] for n in q.graph.node if n.op_type == "DequantizeLinear"
                and inits.get(n.input[0]) is not None and inits[n.input[0]].dtype == np.int8
                and inits[n.input[0]].ndim == 4]
    assert len(w_scales) == 4
    if scheme == "per-channel":
        assert all(s.size > 1 for s in w_scales)
    else:
        assert all(s.size == 1 for s in w_scales)
    if scheme == "power-of-two":
        scales = [inits[n.input[1]] for n in q.graph.node
                  if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
        assert all(_is_pow2(s) for s in scales)
    # the quantized model computes about what the float one does
    x = np.load(ws / "x.npz")["input"]
    yf = _ort(zoo.tiny_cnn(), {"input": x})[0]
    yq = _ort(q, {"input": x})[0]
    assert np.linalg.norm(yq - yf) / np.linalg.norm(yf) < 0.25


def test_calibration_data_decides_the_scales_and_runs_are_deterministic(ws):
    a = quantize_model(ws / "float.onnx", ws / "cal.npz", scheme="per-tensor")
    b = quantize_model(ws / "float.onnx", ws / "cal.npz", scheme="per-tensor")
    assert a.SerializeToString() == b.SerializeToString()
    with pytest.warns(CalibrationWarning, match="not representative"):
        r = quantize_model(ws / "float.onnx", scheme="per-tensor", seed=3)
    assert r.SerializeToString() != a.SerializeToString()
    # --samples takes the first N samples: 2 of the file == the first 2 rows as a mapping
    cal = np.load(ws / "cal.npz")["input"]
    c = quantize_model(ws / "float.onnx", ws / "cal.npz", scheme="per-tensor", samples=2)
    d = quantize_model(ws / "float.onnx", {"input": cal[:2]}, scheme="per-tensor")
    assert c.graph == d.graph


def test_power_of_two_model_runs_on_the_dpu_within_2_lsb_of_onnxruntime(ws, capsys):
    q_path, pkg, y_path = ws / "pow2.onnx", ws / "pow2.tar", ws / "y.npz"
    rc, _, err = _tvmc(capsys, "quantize", ws / "float.onnx", "-o", q_path,
                       "--calibration", ws / "cal.npz", "--scheme", "power-of-two")
    assert rc == 0, err
    rc, stdout, err = _tvmc(capsys, "compile", q_path, "--target", "dpu, llvm", "-o", pkg,
                            "--dump-offloads")
    assert rc == 0, err
    assert not any("not quantized" in line for line in stdout)
    with tarfile.open(pkg) as t:
        meta = json.load(t.extractfile("metadata.json"))
    layers = [r for r in meta["offloads"] if r["op"] in ("conv2d", "dense", "add")]
    assert sorted(r["op"] for r in layers) == ["add"] + ["conv2d"] * 4 + ["dense"]
    assert all(r["placement"] == "dpu" for r in layers), layers
    rc, _, err = _tvmc(capsys, "run", pkg, "--inputs", ws / "x.npz", "--outputs", y_path)
    assert rc == 0, err
    y = np.load(y_path)[meta["outputs"][0]["name"]]
    q = onnx.load(str(q_path))
    ref = _ort(q, {"input": np.load(ws / "x.npz")["input"]})[0]
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    last = next(n for n in q.graph.node if n.output[0] == q.graph.output[0].name)
    assert last.op_type == "DequantizeLinear"
    lsb = float(inits[last.input[1]])
    assert y.shape == ref.shape
    assert np.abs(y - ref).max() <= 2 * lsb + 1e-6, np.abs(y - ref).max() / lsb


def test_float_model_compiled_for_vta_says_it_is_not_quantized(ws, capsys):
    rc, stdout, err = _tvmc(capsys, "compile", ws / "float.onnx", "--target", "vta, llvm",
                            "-o", ws / "float_vta.tar", "--dump-offloads", "--wide")
    assert rc == 0, err
    assert "0 of " in stdout[0] and " layers on vta" in stdout[0]
    assert "not quantized" in stdout[1] and "tvmc quantize" in stdout[1]
    rows = [line for line in stdout[2:] if " cpu " in line]
    assert rows and all("not quantized" in r and "tvmc quantize" in r for r in rows)
    assert not any("no vta pattern" in line for line in stdout)


def test_non_power_of_two_scales_on_the_dpu_point_to_the_power_of_two_scheme(ws, capsys):
    q_path = ws / "pt.onnx"
    rc, _, _ = _tvmc(capsys, "quantize", ws / "float.onnx", "-o", q_path, "--scheme",
                     "per-tensor", "--calibration", ws / "cal.npz")
    assert rc == 0
    rc, stdout, err = _tvmc(capsys, "compile", q_path, "--target", "dpu, llvm", "-o",
                            ws / "pt.tar", "--dump-offloads", "--wide")
    assert rc == 0, err
    convs = [line for line in stdout if " conv2d " in line]
    assert convs and all("not a power of two" in c and "tvmc quantize --scheme power-of-two"
                         in c for c in convs)
    notes = [line for line in stdout if line.startswith("note:")]
    assert notes and "not quantized" not in notes[0]  # it is quantized: the fallback's fix
    assert "tvmc quantize --scheme power-of-two" in notes[0]


def _two_input_model() -> onnx.ModelProto:
    """conv(a) + conv(b): two float inputs of shape (2, 4, 6, 6) (batch 2)."""
    rng = np.random.default_rng(0)
    w = [numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), f"w{i}")
         for i in range(2)]
    nodes = [helper.make_node("Conv", ["a", "w0"], ["ca"], name="conv_a", pads=[1] * 4),
             helper.make_node("Conv", ["b", "w1"], ["cb"], name="conv_b", pads=[1] * 4),
             helper.make_node("Add", ["ca", "cb"], ["y"], name="add")]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 4, 6, 6]) for n in "ab"]
    g = helper.make_graph(nodes, "two_inputs", vi,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 6, 6])],
                          w)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_two_inputs_with_samples_stacked_along_the_batch_axis():
    m = _two_input_model()
    rng = np.random.default_rng(1)
    cal = {"a": rng.standard_normal((6, 4, 6, 6)), "b": rng.standard_normal((6, 4, 6, 6))}
    q = quantize_model(m, cal, scheme="power-of-two")       # 3 samples of batch 2, float64 ok
    assert is_quantized(q) and quantized_nodes(q)["Conv"] == 2
    how = json.loads({p.key: p.value for p in q.metadata_props}[PROVENANCE_KEY])
    assert how["samples"] == 3
    with pytest.warns(CalibrationWarning):
        assert is_quantized(quantize_model(m, samples=2))
    with pytest.raises(CalibrationError, match=r"'a' 3, 'b' 2"):
        quantize_model(m, {"a": cal["a"], "b": cal["b"][:4]})
    with pytest.raises(CalibrationError, match=r"5 rows .* batch 2"):
        quantize_model(m, {"a": cal["a"][:5], "b": cal["b"][:5]})


# --- bad inputs: exit 2, one stderr line naming the cause -----------------------------------
def _write(ws, name, data) -> str:
    p = ws / name
    if isinstance(data, dict):
        np.savez(p, **data)
    elif isinstance(data, onnx.ModelProto):
        onnx.save(data, str(p))
    elif isinstance(data, np.ndarray):
        np.save(p, data)
    else:
        p.write_bytes(data)
    return str(p)


def _exp_model() -> onnx.ModelProto:
    """One Exp: no operator onnxruntime's quantizer handles."""
    g = helper.make_graph([helper.make_node("Exp", ["x"], ["y"], name="exp")], "exp",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 10])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _int_input_model() -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT, name="cast"),
         helper.make_node("MatMul", ["f", "w"], ["y"], name="mm")], "ids",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.ones((8, 4), np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


X = (1, 3, 32, 32)
BAD = {
    "missing model": (lambda ws: [ws / "nope.onnx"], ["nope.onnx", "no such file"]),
    "not onnx": (lambda ws: [_write(ws, "junk.onnx", b"\x00\x01 not protobuf")],
                 ["junk.onnx", "not an ONNX model"]),
    "already quantized": (lambda ws: [_write(ws, "qdq.onnx",
                                             quantize.ort_quantize(zoo.tiny_cnn()))],
                          ["qdq.onnx", "already quantized", "QuantizeLinear"]),
    "npz missing input": (lambda ws: [ws / "float.onnx", "--calibration",
                                      _write(ws, "noin.npz", {"data": np.zeros(X)})],
                          ["noin.npz", "'input'", "data"]),
    "npz wrong shape": (lambda ws: [ws / "float.onnx", "--calibration",
                                    _write(ws, "shape.npz", {"input": np.zeros((4, 3, 16, 16))})],
                        ["shape.npz", "[4, 3, 16, 16]", "[1, 3, 32, 32]"]),
    "npz wrong rank": (lambda ws: [ws / "float.onnx", "--calibration",
                                   _write(ws, "rank.npz", {"input": np.zeros((2, *X))})],
                       ["rank.npz", "[2, 1, 3, 32, 32]", "[N, 3, 32, 32]"]),
    "npz wrong dtype": (lambda ws: [ws / "float.onnx", "--calibration",
                                    _write(ws, "int.npz", {"input": np.zeros(X, np.int32)})],
                        ["int.npz", "int32", "float32"]),
    "npz NaN": (lambda ws: [ws / "float.onnx", "--calibration",
                            _write(ws, "nan.npz", {"input": np.full(X, np.nan, np.float32)})],
                ["nan.npz", "NaN"]),
    "npy not npz": (lambda ws: [ws / "float.onnx", "--calibration",
                                _write(ws, "x.npy", np.zeros(X, np.float32))],
                    ["x.npy", ".npz"]),
    "calibration not npz": (lambda ws: [ws / "float.onnx", "--calibration",
                                        _write(ws, "cal.txt", b"1 2 3")],
                            ["cal.txt", "not a .npz"]),
    "missing calibration": (lambda ws: [ws / "float.onnx", "--calibration", ws / "none.npz"],
                            ["none.npz"]),
    "unknown scheme": (lambda ws: [ws / "float.onnx", "--scheme", "per-layer"],
                       ["--scheme", "per-layer", "power-of-two"]),
    "unknown activation type": (lambda ws: [ws / "float.onnx", "--activation-type", "int4"],
                                ["--activation-type", "int4"]),
    "power-of-two uint8": (lambda ws: [ws / "float.onnx", "--scheme", "power-of-two",
                                       "--activation-type", "uint8"],
                           ["--activation-type uint8", "int8"]),
    "zero samples": (lambda ws: [ws / "float.onnx", "--samples", "0"], ["--samples 0"]),
    "output is a directory": (lambda ws: [ws / "float.onnx", "-o", ws], ["is a directory"]),
    "output is the input": (lambda ws: [ws / "float.onnx", "-o", ws / "float.onnx"],
                            ["is the input model"]),
    "nothing to quantize": (lambda ws: [_write(ws, "exp.onnx", _exp_model())],
                            ["exp.onnx", "nothing to quantize", "Exp"]),
    "int input, random data": (lambda ws: [_write(ws, "ids.onnx", _int_input_model())],
                               ["ids.onnx", "'ids'", "int64", "--calibration"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_exit_2(ws, capfd, case):
    make, words = BAD[case]
    args = make(ws)
    rc, _, err = _tvmc(capfd, "quantize", *args[:1], "-o", ws / "bad_out.onnx", *args[1:])
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("tvmc quantize: error: "), err[0]
    for w in words:
        assert w in err[0], (w, err[0])
    assert not (ws / "bad_out.onnx").exists()
