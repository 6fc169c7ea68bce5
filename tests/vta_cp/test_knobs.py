"""Knob spaces of the static template: declared knobs, defaults, and bad knob values failing
with an error that names the knob."""

import pytest

from tvm_accel.knobs import Knob, KnobSpace
from tvm_vta_cp.hw_config import load_config
from tvm_vta_cp.strategy import plan
from tvm_vta_cp.strategy.knobs import default_knobs, knob_space

from .test_strategy import single_conv


def test_invalid_knobs_raise_value_error_naming_the_knob():
    cfg = load_config("vta_1x16x16")
    graph, _ = single_conv(17, 1, 64, 56, 56, 64, 3, 1, 1)
    with pytest.raises(ValueError, match="tile_h"):
        plan(graph, cfg, {"conv": {"tile_h": 13}})  # not a near-equal split of 56
    with pytest.raises(ValueError, match="tile_h"):
        plan(graph, cfg, {"conv": {"tile_h": 56, "tile_w": 56, "tile_ci": 4}})  # INP overflow
    with pytest.raises(ValueError, match="h_nthread"):
        plan(graph, cfg, {"conv": {"oc_nthread": 2, "h_nthread": 2}})
    with pytest.raises(ValueError, match="bogus"):
        plan(graph, cfg, {"conv": {"bogus": 1}})


def test_knob_space_declares_defaults_sizes_and_validation():
    cfg = load_config("vta_1x16x16")
    graph, _ = single_conv(19, 1, 64, 28, 28, 128, 3, 1, 1)
    layer = graph.layers[0]
    space = knob_space(layer, (1, 64, 28, 28), cfg)
    assert space.names == ["tile_b", "tile_h", "tile_w", "tile_ci", "tile_co", "oc_nthread",
                           "h_nthread"]
    d = default_knobs(layer, (1, 64, 28, 28), cfg)
    assert d == space.default() and space.is_valid(d)
    assert space.size == len(space) == sum(1 for _ in space)
    assert space.point(space.index_of(d)) == d
    assert len(space.features(d)) == len(space.names)
    with pytest.raises(ValueError, match="tile_co"):
        space.validate({"tile_co": 5})
    generic = KnobSpace([Knob("a", (1, 2, 3), 2), Knob("b", ("x", "y"), "x")])
    assert generic.size == 6 and generic.default() == {"a": 2, "b": "x"}
    assert generic.features({"a": 3, "b": "y"}) == [3.0, 1.0]
    with pytest.raises(ValueError, match="default"):
        Knob("c", (1, 2), 5)
