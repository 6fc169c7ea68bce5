"""``tvmc quantize`` folds a BatchNormalization into the Conv before it (onnxruntime's
quantization pre-processing, issue 24 item 5), for every scheme: the power-of-two scheme no
longer fails on the BN's bias, and the other schemes no longer leave the BN in float; the
quantized Conv-BN-ReLU compiles with the conv offloaded on every target and agrees with
onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import run_vm
from onnx import TensorProto, helper, numpy_helper

from tvm_accel.frontend import load_onnx
from tvm_accel.pipeline import compile_model
from tvm_accel.quantize import quantize_model
from tvm_accel.target import get_target


def _conv_bn_relu(c: int = 8, hw: int = 8) -> onnx.ModelProto:
    """Conv 3x3 (no bias) -> BatchNormalization -> Relu, float, as a training export has it."""
    rng = np.random.default_rng(0)

    def init(name, value):
        return numpy_helper.from_array(np.asarray(value, np.float32), name)

    nodes = [helper.make_node("Conv", ["input", "w"], ["c"], name="conv", pads=[1] * 4),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"],
                              ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["out"], name="relu")]
    graph = helper.make_graph(
        nodes, "conv_bn_relu",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, c, hw, hw])],
        [init("w", rng.normal(0, .3, (c, 3, 3, 3))), init("gamma", rng.uniform(.5, 1.5, c)),
         init("beta", rng.normal(0, .2, c)), init("mean", rng.normal(0, .2, c)),
         init("var", rng.uniform(.5, 2, c))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


#: scheme, activation type, the target that takes such a model
CASES = [("per-channel", "int8", "vta"), ("per-tensor", "int8", "vta"),
         ("power-of-two", "int8", "dpu"), ("per-channel", "uint8", "marsellus"),
         ("per-tensor", "uint8", "marsellus")]


@pytest.mark.parametrize(("scheme", "act", "target"), CASES,
                         ids=[f"{s}-{a}-{t}" for s, a, t in CASES])
def test_batchnorm_is_folded_and_the_conv_runs_on_the_target_like_onnxruntime(scheme, act,
                                                                               target):
    rng = np.random.default_rng(1)
    calib = {"input": rng.standard_normal((4, 3, 8, 8)).astype(np.float32)}
    q = quantize_model(_conv_bn_relu(), calib, scheme=scheme, activation_type=act)
    ops = [n.op_type for n in q.graph.node]
    assert "BatchNormalization" not in ops and ops.count("Conv") == 1
    assert next(n.name for n in q.graph.node if n.op_type == "Conv") == "conv"

    mod, _ = load_onnx(q)
    ex, report = compile_model(mod, get_target(target))
    conv = next(r for r in report.offloads if r.layer == "conv")
    assert conv.placement == target, conv.reason
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    (ours,) = run_vm(ex, [x])
    (theirs,) = ort.InferenceSession(q.SerializeToString(),
                                     providers=["CPUExecutionProvider"]).run(None, {"input": x})
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    last_dq = [n for n in q.graph.node if n.op_type == "DequantizeLinear"][-1]
    lsb = float(inits[last_dq.input[1]])
    assert np.abs(ours - theirs).max() <= 1 * lsb + 1e-6, np.abs(ours - theirs).max() / lsb


def test_pre_processing_keeps_the_node_names_of_a_zoo_network():
    from tvm_accel import zoo
    from tvm_accel.quantize.ort import pre_process

    model = zoo.resnet20()
    assert [n.name for n in pre_process(model).graph.node] == [n.name for n in model.graph.node]


def test_a_node_the_optimiser_fuses_keeps_its_name():
    """onnxruntime fuses MatMul + Add into a Gemm named ``fc/MatMulAddFusion``."""
    from tvm_accel.quantize.ort import pre_process

    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="fc"),
             helper.make_node("Add", ["mm", "b"], ["y"], name="fc_bias")]
    graph = helper.make_graph(
        nodes, "fc", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(rng.normal(size=(16, 10)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.normal(size=10).astype(np.float32), "b")])
    pre = pre_process(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert [(n.op_type, n.name) for n in pre.graph.node] == [("Gemm", "fc")]
