"""``tvmc`` conventions (issue 12, items 5-8): one layer name (the ONNX node's) in every report
and input, every operator of the model visible in ``--dump-offloads``, ``--input-shapes`` for
dynamic models, full host target strings, progress lines on long compiles, ``tvmc timeline``
for any package and ``tvmc zoo`` as the source of the README's models."""

import csv
import json
import tarfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from helpers import models
from helpers.cli import table_rows, tvmc
from tvm_accel import cli, quantize
from tvm_accel.pipeline import host_target


def _rows(text: str) -> dict[str, list[str]]:
    """``--dump-offloads`` table -> layer -> cells (layer, op, shape, placement, ...)."""
    return table_rows(text)


def _dotted_model() -> onnx.ModelProto:
    """conv -> relu -> Sigmoid -> conv -> maxpool, nodes named like PyTorch exports them
    (``block.conv1``), float: quantized by the test with ``tvmc quantize``."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * .2,
                                 "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * .2,
                                 "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="block.conv1", pads=[1] * 4),
             helper.make_node("Sigmoid", ["c1"], ["s1"], name="block.gate"),
             helper.make_node("Conv", ["s1", "w2"], ["c2"], name="block.conv2", pads=[1] * 4),
             helper.make_node("Relu", ["c2"], ["r2"], name="block.relu2"),
             helper.make_node("MaxPool", ["r2"], ["y"], name="pool1", kernel_shape=[2, 2],
                              strides=[2, 2])]
    graph = helper.make_graph(
        nodes, "dotted", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 4, 4])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def dotted(tmp_path_factory):
    """The dotted model quantized with symmetric activations (the Relu stays a node) and
    compiled for VTA; returns (dir, model path, package path, dump text)."""
    d = tmp_path_factory.mktemp("conventions")
    q = quantize.ort_quantize(_dotted_model(), symmetric_activations=True, cache=False)
    onnx.save(q, d / "m.onnx")
    dump = d / "offloads.txt"
    assert tvmc("compile", d / "m.onnx", "--target", "vta, llvm", "-o", d / "m.tar",
                 "--dump-offloads", dump) == 0
    return d, d / "m.onnx", d / "m.tar", dump.read_text()


def test_reports_and_knobs_use_the_onnx_node_names(dotted, capsys):
    d, model, package, dump = dotted
    rows = _rows(dump)
    assert rows["block.conv1"][3] == "vta" and rows["block.conv2"][3] == "vta"
    assert "block_conv1" not in dump
    capsys.readouterr()
    assert tvmc("run", package, "--profile-csv", d / "p.csv") == 0
    with open(d / "p.csv") as f:
        layers = [r["layer"] for r in csv.DictReader(f)]
    assert {"block.conv1", "block.conv2"} <= set(layers)
    capsys.readouterr()
    knobs = {"block.conv1": {"tile_h": 2}}
    import tvm_vta_cp
    from tvm_accel.frontend import load_onnx
    from tvm_accel.pipeline import compile_model

    mod, _ = load_onnx(str(model))
    _, report = compile_model(mod, tvm_vta_cp.TARGET, None, knobs)
    assert any(r.layer == "block.conv1" and r.placement == "vta" for r in report.offloads)
    with pytest.raises(Exception, match=r"no layer named 'block_conv1'.*nearest: block\.conv1"):
        compile_model(mod, tvm_vta_cp.TARGET, None, {"block_conv1": {"tile_h": 2}})


def test_every_operator_of_the_model_has_a_row(dotted):
    _, _, _, dump = dotted
    rows = _rows(dump)
    assert rows["block.gate"][1:4] == ["lut", "1x16x8x8 -> 1x16x8x8", "cpu"]  # an integer table
    assert "VTA's ALU has no lookup" in " ".join(rows["block.gate"])
    # symmetric activations keep the ReLU between its own Q/DQ: an integer max on the host
    assert rows["block.relu2"][1:4] == ["relu", "1x16x8x8 -> 1x16x8x8", "cpu"]
    assert rows["pool1"][1] == "max_pool2d"
    assert not any("DequantizeLinear" in k and "w1" in k for k in rows)  # weights: folded


def test_dump_offloads_all_lists_the_folded_qdq_nodes(dotted, capsys):
    d, model, _, _ = dotted
    capsys.readouterr()
    assert tvmc("compile", model, "--target", "vta, llvm", "-o", d / "a.tar",
                 "--dump-offloads", "all", "--wide") == 0
    rows = _rows(capsys.readouterr().out)
    weight_dq = [r for k, r in rows.items() if k.startswith("w1") and "Dequantize" in k]
    assert weight_dq and "constant: folded into the layer using it" in " ".join(weight_dq[0])


def test_a_fused_pool_keeps_its_name_in_the_profile(tmp_path, capsys):
    onnx.save(models.quantized("conv_pool", power_of_two=True), tmp_path / "cp.onnx")
    assert tvmc("compile", tmp_path / "cp.onnx", "--target", "dpu, llvm", "-o",
                 tmp_path / "cp.tar", "--dump-offloads") == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["conv_relu"][3] == "dpu" and "fused into conv" in " ".join(rows["conv_relu"])
    assert tvmc("run", tmp_path / "cp.tar", "--profile") == 0
    out = capsys.readouterr().out
    assert "conv+maxpool" in out and "conv_maxpool" not in out


def test_input_shapes_make_a_dynamic_model_compile_and_run(tmp_path, capsys):
    model = models.quantized("single_conv", cin=16, cout=16, hw=8)
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    dim.ClearField("dim_value")
    dim.dim_param = "batch"
    onnx.save(model, tmp_path / "dyn.onnx")
    base = ["compile", tmp_path / "dyn.onnx", "--target", "vta, llvm", "-o", tmp_path / "d.tar"]
    assert tvmc(*base) == 2
    err = capsys.readouterr().err
    assert '--input-shapes "input:[1,16,8,8]"' in err
    assert tvmc(*base, "--input-shapes", "input:[2,16,8,8]") == 0
    with tarfile.open(tmp_path / "d.tar") as tar:
        meta = json.load(tar.extractfile("metadata.json"))
    assert meta["inputs"][0]["shape"] == [2, 16, 8, 8]
    capsys.readouterr()
    assert tvmc("run", tmp_path / "d.tar") == 0
    assert "shape [2, 16, 8, 8]" in capsys.readouterr().out


def test_host_target_reads_the_command_line_form():
    t = host_target("llvm -opt-level=2 -mattr=+sse2,+sse4.1 -num-cores=2")
    assert t.kind.name == "llvm" and list(t.attrs["mattr"]) == ["+sse2", "+sse4.1"]
    assert int(t.attrs["num-cores"]) == 2
    assert cli.parse_target("vta, llvm -mattr=+sse2,+sse4.1") == ("vta",
                                                                  "llvm -mattr=+sse2,+sse4.1")


def test_c_and_llvm_hosts_give_the_same_outputs(dotted, capsys):
    d, model, package, _ = dotted
    assert tvmc("compile", model, "--target", "vta, c", "-o", d / "c.tar") == 0
    assert tvmc("compile", model, "--target", "vta, llvm -opt-level=2", "-o",
                 d / "o.tar") == 0
    outs = []
    for pkg in (package, d / "c.tar", d / "o.tar"):
        assert tvmc("run", pkg, "--outputs", d / "out.npz") == 0
        outs.append(np.load(d / "out.npz")["y"])
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], outs[2])


def test_long_compiles_print_a_progress_line_per_function(dotted, capsys, monkeypatch):
    d, model, _, _ = dotted
    monkeypatch.setattr(cli.compiler._ProgressLines, "AFTER", 0.0)
    capsys.readouterr()
    assert tvmc("compile", model, "--target", "vta, llvm", "-o", d / "p.tar") == 0
    err = capsys.readouterr().err.splitlines()
    assert any(ln.strip().startswith("[lower 1/") for ln in err), err
    assert any(ln.strip().startswith("[embedding 1/") and "block.conv1" in ln for ln in err)


def test_timeline_draws_a_package_of_any_target(tmp_path, capsys):
    onnx.save(models.quantized("single_conv", cin=32, cout=32, hw=8), tmp_path / "m.onnx")
    assert tvmc("compile", tmp_path / "m.onnx", "--target", "marsellus, llvm", "-o",
                 tmp_path / "m.tar", "--target-marsellus-objective", "latency") == 0
    assert '"objective": "latency"' in capsys.readouterr().out  # echoed with the knobs
    assert tvmc("timeline", tmp_path / "m.tar", "-o", tmp_path / "t.png") == 0
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("name") == "RBE" for e in trace["traceEvents"])


def test_zoo_writes_the_readme_model_and_calibration_data(tmp_path, capsys):
    assert tvmc("zoo") == 0
    assert "resnet20" in capsys.readouterr().out
    assert tvmc("zoo", "tiny_cnn", "-o", tmp_path / "m_fp32.onnx", "--calibration-out",
                 tmp_path / "inputs.npz", "--samples", "3") == 0
    m = onnx.load(tmp_path / "m_fp32.onnx")
    assert m.graph.node[0].op_type == "Conv"
    cal = np.load(tmp_path / "inputs.npz")
    assert cal["input"].shape == (3, 3, 32, 32)
    assert tvmc("quantize", tmp_path / "m_fp32.onnx", "-o", tmp_path / "m.onnx",
                 "--calibration", tmp_path / "inputs.npz") == 0
    assert tvmc("compile", tmp_path / "m.onnx", "--target", "vta, llvm", "-o",
                 tmp_path / "m.tar") == 0
