"""The elementwise multiply on the DPU's MISC unit (ELTMUL, DPUCZDX8G's Elementwise-Multiply):
the squeeze-excitation gate (a feature map times a per-channel vector, read with zero strides)
and the product of two maps of one shape run on the DPU, bit-exact against the CPU reference
and within 2 LSB of onnxruntime; any other broadcast stays on the CPU with the reason."""

import numpy as np
import pytest

from helpers import models
from tvm_dpu.codegen import EltMul, decode_stream, load_blob


def _eltmuls(report) -> list[EltMul]:
    return [i for f in report.functions for ly in load_blob(f.blob)[0].layers
            for i in decode_stream(ly.insns) if isinstance(i, EltMul)]


def _rows(report) -> dict:
    return {o.layer: o for o in report.nodes if o.kind in ("layer", "fused")}


def _close_to_onnxruntime(m, r) -> None:
    diff = np.abs(models.ort_run(m, r.inputs[0]) - r.outputs[0]).max()
    assert diff <= 2 * models.output_step(m) + 1e-6


@pytest.mark.parametrize("batch, c, hw", [(1, 16, 8), (5, 24, 12)])
def test_squeeze_excitation_gate_runs_on_eltmul_with_zero_b_strides(compare, batch, c, hw):
    m = models.quantized("squeeze_excitation", power_of_two=True, batch=batch, c=c, hw=hw)
    r = compare(m)
    row = _rows(r.report)["se_scale"]
    assert (row.placement, row.reason) == ("dpu", "matched dpu.mul")
    muls = _eltmuls(r.report)
    assert muls and all((i.b_pix_stride, i.b_row_stride) == (0, 0) for i in muls)
    r.assert_bit_exact()
    _close_to_onnxruntime(m, r)


def test_product_of_two_maps_of_one_shape_runs_on_eltmul(compare):
    m = models.quantized("conv_product", power_of_two=True, batch=3, hw=10)
    r = compare(m)
    assert _rows(r.report)["product"].placement == "dpu"
    muls = _eltmuls(r.report)
    assert muls and all(i.b_pix_stride == i.chans for i in muls)
    r.assert_bit_exact()
    _close_to_onnxruntime(m, r)


def test_a_product_broadcast_over_the_channels_stays_on_the_cpu_with_the_reason(compare):
    m = models.quantized("conv_product", power_of_two=True, other="spatial")
    r = compare(m)
    row = _rows(r.report)["product"]
    assert row.placement == "cpu"
    assert row.reason.endswith("map of its shape or (N, C, 1, 1) vector")
    assert not _eltmuls(r.report)
    r.assert_bit_exact()
