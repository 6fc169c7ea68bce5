"""VTA's cost-aware requantize recipe and the identity ops the ALU tail drops."""

from __future__ import annotations

import numpy as np
import pytest

from tvm_accel.layers import LayerGraph, Requant, Tensor, conv_output_shape
from tvm_accel.numerics import check_limits, recipe_error, solve_requant
from tvm_vta_cp.codegen import ALU_ADD, ALU_MAX, ALU_MIN, ALU_MUL, ALU_SHR
from tvm_vta_cp.hw_config import load_config
from tvm_vta_cp.numerics import (
    CHEAP_RECIPE_BUDGET_LSB,
    VTA_LIMITS,
    requant_recipe,
    round_before_multiply,
    rounds_before_multiply,
    tail_alu_ops,
)
from tvm_vta_cp.strategy.alu_tail import alu_ops, bias_lanes, conv_numerics

from .test_strategy import conv_layer, random_input, run_exact


def _err(rq: Requant, bound) -> float:
    return recipe_error(rq, bound).max_lsb_error


def test_small_accumulators_drop_the_pre_shift():
    # 3x3x16 conv: |acc| < 2^19 leaves a 12-bit multiplier without a pre-shift
    bound = np.full(16, 300_000)
    scale = np.linspace(1.1e-4, 2.3e-4, 16)
    best = solve_requant(scale, bound, 0, -128, 127, VTA_LIMITS)
    rq = requant_recipe(scale, bound, 0, -128, 127)
    assert best.pre_shift > 0 and rq.pre_shift == 0
    # no pre-shift (-2 ops) and the constant added before the multiply, by the GEMM (-1)
    assert rounds_before_multiply(rq) and not rounds_before_multiply(best)
    assert tail_alu_ops(rq) == tail_alu_ops(best) - 3
    assert _err(rq, bound) <= CHEAP_RECIPE_BUDGET_LSB


def test_pre_shift_is_kept_when_dropping_it_costs_more_than_the_budget():
    # |acc| ~ 2^29: without a pre-shift the multiplier has 2 bits
    bound = np.full(8, 1 << 29)
    scale = np.linspace(2.0e-7, 3.9e-7, 8)
    rq = requant_recipe(scale, bound, 0, -128, 127)
    best = solve_requant(scale, bound, 0, -128, 127, VTA_LIMITS)
    # the most accurate multiplier and pre-shift, only its rounding moved before the multiply
    assert rq.pre_shift == best.pre_shift > 0 and rounds_before_multiply(rq)
    np.testing.assert_array_equal(rq.multiplier, best.multiplier)
    assert _err(rq, bound) <= CHEAP_RECIPE_BUDGET_LSB


def test_power_of_two_scales_requantize_by_shifting_only():
    bound = np.full(4, 1 << 24)
    rq = requant_recipe(np.full(4, 2.0 ** -17), bound, 3, -128, 127)
    assert (rq.pre_shift, rq.shift) == (0, 17) and np.all(rq.multiplier == 1)
    assert _err(rq, bound) == 0 and tail_alu_ops(rq) == 3  # ADD on the GEMM, SHR, MAX, MIN


def test_a_zero_budget_keeps_the_most_accurate_error():
    bound = np.full(16, 300_000)
    scale = np.linspace(1.1e-4, 2.3e-4, 16)
    rq = requant_recipe(scale, bound, 0, -128, 127, budget_lsb=0.0)
    best = solve_requant(scale, bound, 0, -128, 127, VTA_LIMITS)
    assert _err(rq, bound) <= _err(best, bound)


def test_a_guard_limit_below_the_budget_caps_it():
    bound = np.full(16, 300_000)
    scale = np.linspace(1.1e-4, 2.3e-4, 16)
    loose = requant_recipe(scale, bound, 0, -128, 127)
    tight = requant_recipe(scale, bound, 0, -128, 127, max_error=_err(loose, bound) / 2)
    assert tight.pre_shift > 0 and _err(tight, bound) <= _err(loose, bound) / 2


@pytest.mark.parametrize("budget", [0.0, 0.25, CHEAP_RECIPE_BUDGET_LSB, 2.0])
def test_chosen_recipe_is_never_costlier_nor_beyond_the_budget(budget):
    rng = np.random.default_rng(23)
    for _ in range(60):
        k = int(rng.integers(1, 40))
        bound = (2.0 ** rng.uniform(8, 30) * rng.uniform(0.5, 1, k)).astype(np.int64)
        scale = 2.0 ** rng.uniform(6, 9) / bound.max() * rng.uniform(1, 2, k)
        zp = int(rng.integers(-20, 20))
        best = solve_requant(scale, bound, zp, -128, 127, VTA_LIMITS)
        rq = requant_recipe(scale, bound, zp, -128, 127, budget_lsb=budget)
        assert not check_limits(rq, bound, VTA_LIMITS)
        assert tail_alu_ops(rq) <= tail_alu_ops(best)
        assert _err(rq, bound) <= max(_err(best, bound), budget)


def _single(rng, rq_of, cin=16, cout=24, hw=6, relu=False):
    layer = conv_layer(rng, "conv", "x", "y", cin, cout, 3, pad=1, relu=relu)
    layer.requant = rq_of(layer)
    shape = (1, cin, hw, hw)
    graph = LayerGraph({"x": Tensor("x", shape, "int8"),
                        "y": Tensor("y", conv_output_shape(layer, shape), "int8")},
                       [layer], ["x"], ["y"])
    return graph, {"x": random_input(rng, shape, "int8")}


def _opcodes(graph) -> list[int]:
    _, ops = conv_numerics(graph.layers[0], "int8", "int8", load_config("vta_1x16x16"))
    return [op.opcode for op in ops]


def _pow2_multiplier(layer) -> Requant:
    rq = layer.requant
    return Requant(0, np.full(len(layer.weight), 1 << 4), np.full(len(layer.weight), 1 << 12),
                   13, rq.zero_point, rq.qmin, rq.qmax)


def _pre_shift_without_multiplier(layer) -> Requant:
    rq = layer.requant
    return Requant(7, np.ones(len(layer.weight), np.int64), np.full(len(layer.weight), 2), 2,
                   rq.zero_point, rq.qmin, rq.qmax)


@pytest.mark.parametrize("cfg_name", ["vta_1x16x16", "vta_8x8x8"])
@pytest.mark.parametrize("form", [_pow2_multiplier, _pre_shift_without_multiplier])
def test_identity_multiplies_and_pre_shifts_are_dropped_bit_exactly(cfg_name, form):
    graph, inputs = _single(np.random.default_rng(4), form)
    codes = _opcodes(graph)
    assert ALU_MUL not in codes
    assert codes[:2] == [ALU_ADD, ALU_SHR] and codes.count(ALU_SHR) == 1
    run_exact(graph, inputs, cfg_name)


def test_cheap_recipe_runs_bit_exact_with_five_alu_ops():
    rng = np.random.default_rng(9)

    def cheap(layer) -> Requant:
        w = np.abs(layer.weight.astype(np.int64)).reshape(len(layer.weight), -1).sum(1)
        bound = w * 128 + np.abs(layer.bias)
        rq = requant_recipe(2.0 ** 9 / bound * np.linspace(1, 2, len(w)), bound,
                            layer.requant.zero_point, layer.requant.qmin, layer.requant.qmax)
        assert rq.pre_shift == 0
        return rq

    graph, inputs = _single(rng, cheap, relu=True)
    assert len(_opcodes(graph)) == 5
    run_exact(graph, inputs, "vta_1x16x16")


def test_rounding_before_the_multiply_moves_the_rounding_point_by_at_most_half_a_multiplier():
    bound = np.full(16, 300_000)
    scale = np.linspace(1.1e-4, 2.3e-4, 16)
    for zp in (0, 7, -5):
        rq = solve_requant(scale, bound, zp, -128, 127, VTA_LIMITS)
        moved = round_before_multiply(rq, bound)
        m = np.asarray(moved.multiplier)
        assert rounds_before_multiply(moved) and not check_limits(moved, bound, VTA_LIMITS)
        assert np.all(np.abs(moved.round_add - rq.round_add) <= m // 2)
        assert _err(moved, bound) == pytest.approx(
            _err(rq, bound) + np.abs(moved.round_add - rq.round_add).max() / 2.0 ** rq.shift)


def test_bias_lanes_hold_any_constant_within_their_reach_and_refuse_the_rest():
    rng = np.random.default_rng(5)
    for block_in in (8, 16):
        reach = 127 * 128 * (block_in - 1)
        v = np.concatenate([rng.integers(-reach, reach, 200), [0, 127, -128, reach - 1, -reach]])
        w = bias_lanes(v, block_in)
        x = np.full(block_in, -128, dtype=np.int64)
        x[0] = 1
        assert w.dtype == np.int8
        np.testing.assert_array_equal(w.astype(np.int64) @ x, v)
        assert bias_lanes(np.array([0, 130 * 128 * block_in]), block_in) is None


@pytest.mark.parametrize("cfg_name", ["vta_1x16x16", "vta_8x8x8"])
def test_the_tail_constant_rides_on_the_gemm_bit_exactly(cfg_name):
    cfg = load_config(cfg_name)

    def cheap(layer) -> Requant:
        w = np.abs(layer.weight.astype(np.int64)).reshape(len(layer.weight), -1).sum(1)
        bound = w * 128 + np.abs(layer.bias)
        return requant_recipe(2.0 ** 9 / bound * np.linspace(1, 2, len(w)), bound,
                              layer.requant.zero_point, layer.requant.qmin, layer.requant.qmax)

    graph, inputs = _single(np.random.default_rng(9), cheap, relu=True)
    _, ops = conv_numerics(graph.layers[0], "int8", "int8", cfg)
    assert ops[0].on_gemm and ops[0].opcode == ALU_ADD
    assert [op.opcode for op in alu_ops(ops)] == [ALU_MUL, ALU_SHR, ALU_MAX, ALU_MIN]
    prog, stats = run_exact(graph, inputs, cfg_name)
    st = stats[0][1]
    # per output entry: the reset and the bias lanes on the GEMM, four ALU ops
    assert st.alu_uop_iters == 4 * st.gemm_reset_iters


def test_a_pre_shift_recipe_rounding_before_the_multiply_runs_bit_exact():
    def pre_shifted(layer) -> Requant:
        w = np.abs(layer.weight.astype(np.int64)).reshape(len(layer.weight), -1).sum(1)
        bound = w * 128 + np.abs(layer.bias)
        rq = solve_requant(2.0 ** 9 / bound * np.linspace(1, 2, len(w)), bound,
                           layer.requant.zero_point, layer.requant.qmin, layer.requant.qmax,
                           VTA_LIMITS)
        assert rq.pre_shift > 0
        return round_before_multiply(rq, bound)

    graph, inputs = _single(np.random.default_rng(11), pre_shifted)
    _, ops = conv_numerics(graph.layers[0], "int8", "int8", load_config("vta_1x16x16"))
    assert ops[0].on_gemm
    assert [op.opcode for op in alu_ops(ops)][:3] == [ALU_SHR, ALU_MUL, ALU_SHR]
    run_exact(graph, inputs, "vta_1x16x16")


def test_a_constant_beyond_the_bias_lanes_stays_an_alu_add_bit_exactly():
    def far(layer) -> Requant:
        layer.bias = np.full(len(layer.weight), 3_000_000, dtype=np.int64)
        return layer.requant

    graph, inputs = _single(np.random.default_rng(12), far)
    _, ops = conv_numerics(graph.layers[0], "int8", "int8", load_config("vta_1x16x16"))
    assert not any(op.on_gemm for op in ops) and ALU_ADD in [op.opcode for op in ops]
    run_exact(graph, inputs, "vta_1x16x16")


@pytest.mark.parametrize("cfg_name", ["vta_1x16x16", "vta_8x8x8"])
def test_a_tail_left_only_on_the_gemm_runs_bit_exact(cfg_name):
    def constant(layer) -> Requant:
        k = len(layer.weight)
        layer.weight = np.zeros_like(layer.weight)
        layer.bias = np.arange(k, dtype=np.int64) - 9
        return Requant(0, np.ones(k, np.int64), np.zeros(k, np.int64), 0, 0, -128, 127)

    graph, inputs = _single(np.random.default_rng(13), constant)
    _, ops = conv_numerics(graph.layers[0], "int8", "int8", load_config(cfg_name))
    assert len(ops) == 1 and ops[0].on_gemm and not alu_ops(ops)
    run_exact(graph, inputs, cfg_name)
