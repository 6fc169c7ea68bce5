"""DPU operator coverage beyond the plain conv / pool: dilated convs (DeepLab's ASPP head) on the
CONV engine, bit-exact against the CPU reference and within 1 LSB of onnxruntime."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from helpers import models
from tvm_accel.quantize import ort_quantize


def pow2(name, **kw):
    return models.quantized(name, power_of_two=True, **kw)


def _ort(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {m.graph.input[0].name: x})[0]


def _output_lsb(m: onnx.ModelProto) -> float:
    """Scale of the model output's last QuantizeLinear (one int8 step)."""
    q = [n for n in m.graph.node if n.op_type == "QuantizeLinear"][-1]
    init = {t.name: t for t in m.graph.initializer}
    return float(onnx.numpy_helper.to_array(init[q.input[1]]))


@pytest.mark.parametrize("dilations, batch", [((2, 6, 12), 1), ((2, 6, 12), 3)])
def test_aspp_head_runs_its_dilated_branches_on_the_dpu(compare, dilations, batch):
    m = pow2("aspp_head", dilations=dilations, batch=batch)
    r = compare(m)
    placed = {o.layer: o.placement for o in r.report.offloads}
    assert placed == {"aspp_1x1": "dpu", **{f"aspp_d{d}": "dpu" for d in dilations},
                      "aspp_concat": "dpu", "aspp_project": "dpu"}
    r.assert_bit_exact()
    diff = np.abs(_ort(m, r.inputs[0]) - r.outputs[0]).max()
    assert diff <= _output_lsb(m) + 1e-6


def test_dilation_differing_between_h_and_w_falls_back_with_its_reason(compare):
    m = models.single_conv(cin=8, cout=8, k=3, pad=(1, 2, 1, 2), hw=10)
    conv = next(n for n in m.graph.node if n.op_type == "Conv")
    conv.attribute.append(onnx.helper.make_attribute("dilations", [1, 2]))
    r = compare(ort_quantize(m, power_of_two=True))
    row = next(o for o in r.report.offloads if o.op == "conv2d")
    assert row.placement == "cpu"
    assert "dilation differs between H and W" in row.reason
    r.assert_bit_exact()
