"""``tvmc compare`` / :func:`tvm_accel.compare.compare_layers` (issue 21, item 2): every layer's
integer output against onnxruntime's, worst first, from what runs on the simulator."""

import numpy as np
import onnx
import pytest

from helpers import models
from helpers.cli import tvmc
from tvm_accel.compare import (
    compare_layers,
    cut_at_layer_outputs,
    expose_layer_outputs,
    layer_outputs,
    ort_session,
    output_lsb,
)
from tvm_accel.frontend import load_onnx, random_inputs


@pytest.fixture(scope="module")
def residual():
    return models.quantized("conv_residual", c=16, hw=8)


def test_exposed_model_returns_every_layer_output_after_the_model_outputs(residual):
    exposed = expose_layer_outputs(residual)
    names = [o.name for o in exposed.graph.output]
    assert names[:len(residual.graph.output)] == [o.name for o in residual.graph.output]
    assert names[len(residual.graph.output):] == layer_outputs(residual)
    onnx.checker.check_model(exposed)
    x = random_inputs(load_onnx(residual)[1])
    outs = ort_session(exposed).run(None, x)
    assert all(o.dtype == np.int8 for o in outs[1:])


def test_cut_model_fed_onnxruntimes_own_values_reproduces_its_run(residual):
    exposed = expose_layer_outputs(residual)
    x = random_inputs(load_onnx(residual)[1], seed=3)
    names = [o.name for o in exposed.graph.output]
    full = dict(zip(names, ort_session(exposed).run(None, x), strict=True))
    cut = cut_at_layer_outputs(exposed, {t: full[t] for t in layer_outputs(residual)})
    feed = {i.name: full[i.name.removesuffix(".ours")] if i.name.endswith(".ours") else x[i.name]
            for i in cut.graph.input}
    again = dict(zip(names, ort_session(cut).run(None, feed), strict=True))
    assert all(np.array_equal(full[t], again[t]) for t in names)
    # and fed other values, the next layer follows them: the cut is real
    shifted = {t: np.clip(full[t].astype(np.int16) + 5, -128, 127).astype(np.int8)
               for t in layer_outputs(residual)}
    feed = {k: shifted[k.removesuffix(".ours")] if k.endswith(".ours") else v
            for k, v in feed.items()}
    moved = dict(zip(names, ort_session(cut).run(None, feed), strict=True))
    assert not np.array_equal(moved[names[0]], full[names[0]])


def test_compare_reports_each_layer_with_its_placement_worst_first(residual):
    rep = compare_layers(residual, "vta", seed=1)
    by = {r.layer: r for r in rep.layers}
    assert set(by) == {"input_QuantizeLinear", "conv", "add"}
    assert by["conv"].placement == by["add"].placement == "vta"
    assert by["conv"].op == "conv2d" and by["add"].op == "add"
    assert by["input_QuantizeLinear"].placement == "cpu"
    assert all(r.elements == 16 * 8 * 8 for r in rep.layers)
    keys = [(r.max_lsb, r.share_differ) for r in rep.layers]
    assert keys == sorted(keys, reverse=True) and rep.max_lsb == keys[0][0]
    # each layer alone is off by at most the rounding of a tie or of float32 (docs, section 14)
    assert rep.local_max_lsb <= 1
    text = rep.format()
    assert text.splitlines()[0].split()[:6] == ["layer", "op", "placement", "max", "LSB", "%"]
    assert "worst" in text.splitlines()[-1]


def test_offloaded_layer_values_come_from_the_simulator(residual):
    from tvm_accel.profiler import profiling

    with profiling() as prof:
        rep = compare_layers(residual, "vta")
    simulated = {r.layer for r in prof.records}
    assert {r.layer for r in rep.layers if r.placement == "vta"} <= simulated
    assert simulated


@pytest.mark.parametrize("target, name, kw", [
    ("vta", "conv_residual", {}), ("dpu", "conv_pool", {"power_of_two": True}),
    ("marsellus", "conv_flatten_dense", {"activation_type": "uint8"})])
def test_exposing_layer_outputs_leaves_the_model_outputs_unchanged(target, name, kw):
    import tvm
    from tvm import relax

    from tvm_accel.package import outputs_to_numpy
    from tvm_accel.pipeline import compile_model
    from tvm_accel.target import get_target

    model = models.quantized(name, **kw)
    runs = []
    for m in (model, expose_layer_outputs(model)):
        mod, info = load_onnx(m)
        ex, report = compile_model(mod, get_target(target))
        assert any(r.placement == target for r in report.offloads)
        vm = relax.VirtualMachine(ex, tvm.cpu())
        x = random_inputs(info, seed=2)
        runs.append(outputs_to_numpy(vm["main"](*[tvm.runtime.tensor(v) for v in x.values()])))
    n = len(model.graph.output)
    assert len(runs[1]) == n + len(layer_outputs(model))
    assert all(np.array_equal(a, b) for a, b in zip(runs[0], runs[1][:n], strict=True))


def test_given_inputs_are_used_and_checked(residual):
    info = load_onnx(residual)[1]
    zeros = {k: np.zeros(s, np.float32) for k, (s, _) in info.inputs.items()}
    ones = compare_layers(residual, None, {k: v + 1 for k, v in zeros.items()})
    assert ones.target == "cpu" and all(r.placement == "cpu" for r in ones.layers)
    with pytest.raises(Exception, match="has shape"):
        compare_layers(residual, None, {k: v[..., :4] for k, v in zeros.items()})
    with pytest.raises(Exception, match="no array named"):
        compare_layers(residual, None, {"other": zeros[next(iter(zeros))]})


def test_cli_max_lsb_fails_with_exit_1_when_a_layer_differs_more(residual, tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(residual, path)
    rep = compare_layers(residual, "vta")
    assert rep.max_lsb >= 1  # round-half-up vs half-to-even at least somewhere
    capsys.readouterr()
    assert tvmc("compare", path, "--target", "vta, llvm", "--max-lsb", rep.max_lsb) == 0
    out = capsys.readouterr().out
    assert f"worst {rep.max_lsb} LSB" in out
    assert tvmc("compare", path, "--target", "vta, llvm", "--max-lsb", rep.max_lsb - 1,
                 "--top", 1) == 1
    cap = capsys.readouterr()
    assert len(cap.out.strip().splitlines()) == 4  # header, rule, one row, summary
    err = cap.err.strip().splitlines()
    assert len(err) == 1 and f"more than --max-lsb {rep.max_lsb - 1}" in err[0]


def test_cli_compare_reads_inputs_from_npz(residual, tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(residual, path)
    x = random_inputs(load_onnx(residual)[1], seed=7)
    np.savez(tmp_path / "x.npz", **x)
    assert tvmc("compare", path, "--target", "vta, llvm", "--inputs", tmp_path / "x.npz") == 0
    table = capsys.readouterr().out.strip().splitlines()[:-1]
    assert table == compare_layers(residual, "vta", x).format().splitlines()[:-1]
    assert table != compare_layers(residual, "vta", seed=8).format().splitlines()[:-1]


@pytest.mark.parametrize("make, args, needle", [
    (lambda d: onnx.save(models.single_conv(), d / "m.onnx"), [], "not quantized"),
    (lambda d: onnx.save(models.quantized("conv_residual", c=16, hw=8), d / "m.onnx"),
     ["--inputs", "x.npz"], "no array named 'input'"),
    (lambda d: onnx.save(models.quantized("conv_residual", c=16, hw=8), d / "m.onnx"),
     ["--max-lsb", "-1"], "--max-lsb -1"),
])
def test_cli_compare_user_errors_are_one_line_exit_2(tmp_path, capsys, monkeypatch, make, args,
                                                      needle):
    monkeypatch.chdir(tmp_path)
    make(tmp_path)
    np.savez(tmp_path / "x.npz", other=np.zeros(3, np.float32))
    assert tvmc("compare", "m.onnx", "--target", "vta, llvm", *args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tvmc compare: error:") and needle in err[0]


@pytest.mark.slow
@pytest.mark.parametrize("target, kw", [("vta", {}), ("dpu", {"power_of_two": True}),
                                        ("marsellus", {"activation_type": "uint8"})])
def test_resnet20_layers_alone_agree_with_onnxruntime_within_one_lsb(target, kw):
    rep = compare_layers(models.quantized("resnet20", **kw), target)
    assert len(rep.layers) == 34
    assert all(r.placement == target for r in rep.layers if r.op in ("conv2d", "add"))
    assert rep.local_max_lsb <= 1


def test_output_lsb_counts_steps_of_the_output_scale_through_a_flatten():
    q = models.quantized("conv_pool", kind="gap", c=8, hw=8)
    dq = next(n for n in q.graph.node if n.output[0] == q.graph.output[0].name)
    scale = float(onnx.numpy_helper.to_array(
        next(t for t in q.graph.initializer if t.name == dq.input[1])))
    flat = onnx.ModelProto()
    flat.CopyFrom(q)
    flat.graph.node.append(onnx.helper.make_node("Flatten", [dq.output[0]], ["flat"], axis=1))
    del flat.graph.output[:]
    flat.graph.output.append(onnx.helper.make_tensor_value_info("flat", onnx.TensorProto.FLOAT,
                                                                [1, 8]))
    (theirs,) = ort_session(flat).run(None, random_inputs(load_onnx(flat)[1]))
    ours = theirs.copy()
    ours[0, 3] += 2 * scale
    assert output_lsb(flat, [ours], [theirs]) == [2.0]
    same = theirs.reshape(1, 8, 1, 1)
    assert output_lsb(q, [same], [same]) == [0.0]
    float_model = models.single_conv(8, 8, 3, hw=4)
    assert output_lsb(float_model, [np.zeros(1)], [np.ones(1)]) == [None]
