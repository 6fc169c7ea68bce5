"""DPU knob spaces: default tiles, W-split, weight tiling, knobs that do not fit."""

import pytest

from tvm_accel.errors import MappingError
from tvm_dpu import codegen as cg
from tvm_dpu.strategy import plan
from tvm_dpu.strategy.knobs import knob_space

from .test_dpu_strategy import _run, _single, _small_cfg


def test_default_knobs_split_h_by_the_preferred_conv_height(cfg):
    g = _single(hw=40)
    sp = knob_space(g.layers[0], (1, 16, 40, 40), cfg)
    d = sp.default()
    assert d["tile_h"] % cfg.CONV_ROW_PAR == 0 and d["tile_h"] < 40
    assert d["tile_w"] == 40 and d["oc_tile"] == 24 and d["pipeline"] is True
    prog, _ = _run(g, cfg)
    n_conv = sum(isinstance(i, cg.Conv) for i in cg.decode_stream(prog.layers[0].insns))
    assert n_conv == -(-40 // d["tile_h"])


def test_w_split_when_a_row_band_does_not_fit_the_fm():
    small = _small_cfg(FM_BANK_BYTES=512)  # 4 KiB memories: 2 KiB ping-pong halves
    g = _single(c=32, k=16, hw=24)
    d = knob_space(g.layers[0], (1, 32, 24, 24), small).default()
    assert d["tile_w"] < 24
    _run(g, small)


def test_weight_tiling_over_output_channels_when_parameters_exceed_the_pm():
    small = _small_cfg(PM_BYTES=8192)
    g = _single(c=32, k=64, hw=8)  # 64 x 3 x 3 x 32 = 18 KiB of weights
    d = knob_space(g.layers[0], (1, 32, 8, 8), small).default()
    assert d["oc_tile"] < 64 and d["oc_tile"] % small.CONV_OC_PAR == 0
    prog, _ = _run(g, small)
    pm_loads = [i for i in cg.decode_stream(prog.layers[0].insns)
                if isinstance(i, cg.Load) and i.to_pm]
    assert len(pm_loads) == -(-64 // d["oc_tile"])
    with pytest.raises(MappingError, match="oc_tile"):
        plan(g, small, {"conv": {"oc_tile": 64}})


def test_knobs_that_do_not_fit_are_rejected_naming_the_knob():
    small = _small_cfg(FM_BANK_BYTES=512)
    with pytest.raises(MappingError, match="tile_h"):
        plan(_single(c=32, k=16, hw=24), small, {"conv": {"tile_h": 24, "tile_w": 24}})
