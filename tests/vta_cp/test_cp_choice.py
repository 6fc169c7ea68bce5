"""How the CP strategy nominates and tunes candidates: the cycle model nominates beside the
paper's overhead metric, and a tuning budget tunes the best candidates' tile knobs on the
simulator, with the tuned knobs reaching the compiled program."""

import numpy as np
import pytest

import tvm_vta_cp
from helpers import models
from tvm_vta_cp.codegen import load_blob
from tvm_vta_cp.embedding import candidates, choose, measure, rewritten_layer

from .test_cp_strategy import _layer


def test_candidates_nominated_by_the_cycle_model_are_measured_too():
    cfg = tvm_vta_cp.load_config("vta_1x16x16")
    layer = _layer(1, 32, 20, 5, 2, 0)
    by_score = candidates(layer, (1, 1, 60, 40), cfg, top_k=1)
    assert by_score.static.model_cycles > 0
    finite = [c for c in by_score.candidates if np.isfinite(c.model_cycles)]
    best_model = min(finite, key=lambda c: c.modelled_combined(cfg))
    best_score = min(by_score.candidates, key=lambda c: c.score)
    assert {best_model.name, best_score.name} <= {c.name for c in by_score.candidates}
    assert len(by_score.candidates) <= 2


@pytest.mark.slow
def test_tuning_budget_never_makes_the_choice_slower_and_keeps_its_knobs():
    cfg = tvm_vta_cp.load_config("vta_8x8x8")
    layer = _layer(32, 32, 3, 3, 1, 1)
    shape = (1, 32, 12, 12)
    plain = choose(layer, shape, "int8", "int8", cfg, "auto", top_k=2)
    tuned = choose(layer, shape, "int8", "int8", cfg, "auto", top_k=2, tune=4)
    assert tuned.chosen.combined(cfg) <= plain.chosen.combined(cfg)
    for c in tuned.options:
        if c.knobs is not None:  # the tuned knobs measure what the candidate records
            new, s = rewritten_layer(layer, shape, c.rewrite)
            assert measure(new, s, "int8", "int8", cfg, c.knobs) == c.cycles


@pytest.mark.slow
def test_tuned_knobs_reach_the_compiled_program_bit_exactly(compare):
    model = models.quantized("single_conv", cin=16, cout=32, k=3, stride=1, pad=1, hw=12)
    r = compare(model, "vta_8x8x8", knobs=tvm_vta_cp.strategy_knobs(None, "auto", tune=3))
    dec = r.report.layouts[0]
    program, _, _ = load_blob(r.report.functions[0].blob)
    assert dec.chosen.knobs is not None  # the tuner beat the defaults here
    assert program.layers[0].knobs == dec.chosen.knobs
    r.assert_bit_exact()
