"""The CP paper's baseline strategy ``tvm-reference``: TVM's VTA template with dilation by
zero-inflated kernels; bit-exact, and the inflated taps cost GEMM work."""

from __future__ import annotations

import numpy as np
import pytest

import tvm_vta_cp
from tvm_accel import quantize
from tvm_accel.layers import reference_execute
from tvm_vta_cp.hw_config import load_config
from tvm_vta_cp.runtime import execute_program
from tvm_vta_cp.strategy import plan
from tvm_vta_cp.strategy.reference import zero_inflated

from .test_static_dilation_groups import CONFIGS, conv_model, grouped_conv
from .test_strategy import run_exact


def test_zero_inflated_kernel_keeps_the_taps_on_the_dilated_grid():
    graph, _ = grouped_conv(0, 1, 16, 11, 8, (3, 2), 1, 2, dilation=(2, 3))
    layer = graph.layers[0]
    inflated = zero_inflated(layer)
    assert inflated.weight.shape == (8, 16, 5, 4) and tuple(inflated.dilation) == (1, 1)
    np.testing.assert_array_equal(inflated.weight[:, :, ::2, ::3], layer.weight)
    assert np.count_nonzero(inflated.weight) == np.count_nonzero(layer.weight)
    undilated, _ = grouped_conv(0, 1, 16, 8, 8, 3, 1, 1)
    assert zero_inflated(undilated.layers[0]) is undilated.layers[0]


@pytest.mark.parametrize("cfg_name", CONFIGS)
def test_reference_plan_of_a_dilated_conv_is_bit_exact_and_pays_for_the_zero_taps(cfg_name):
    cfg = load_config(cfg_name)
    graph, inputs = grouped_conv(2, 2, 24, (13, 10), 20, 3, 2, 4, 1, 4, "uint8", 131)
    _, static = run_exact(graph, inputs, cfg_name)
    prog = plan(graph, cfg, reference=True)
    outs, stats = execute_program(prog, inputs, cfg)
    np.testing.assert_array_equal(outs["y"], reference_execute(graph, inputs)["y"])
    assert prog.layers[0].shape.endswith("k9x9 s2 p4")  # 3x3 dilated 4 -> 9x9 dense
    assert stats[0][1].gemm_uop_iters > static[0][1].gemm_uop_iters


def test_tvm_reference_strategy_compiles_end_to_end_bit_exactly(compare):
    r = compare(quantize.ort_quantize(conv_model(16, 16, 3, 1, 2, 2, 1, 10)), None,
                tvm_vta_cp.strategy_knobs(None, tvm_vta_cp.REFERENCE_STRATEGY))
    assert [o.op for o in r.offloaded] == ["conv2d"]
    assert " k5x5 " in tvm_vta_cp.TARGET.disassemble(r.report.functions[0].blob)
    r.assert_bit_exact()
