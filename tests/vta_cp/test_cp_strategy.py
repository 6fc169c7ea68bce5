"""The CP strategy on VTA: candidates from embeddings, layout rewrites on the host, bit-exact
end to end, strategy options and their errors."""

import numpy as np
import pytest

import tvm_vta_cp
from helpers import models
from tvm_accel.errors import AccelError
from tvm_accel.layers import ConvLayer, Requant
from tvm_vta_cp.codegen import load_blob
from tvm_vta_cp.embedding import candidates, check_weights, choose


def _layer(c, k, kh, kw, stride, pad, groups=1):
    rng = np.random.default_rng(0)
    w = rng.integers(-5, 6, size=(k, c // groups, kh, kw))
    rq = Requant(0, np.full(k, 3, dtype=np.int64), np.full(k, 1 << 7), 8, 0, -128, 127)
    return ConvLayer("conv", "x", "y", w, np.zeros(k, dtype=np.int64), 0, (stride, stride),
                     (pad,) * 4, rq, groups=groups)


def test_grouped_conv_embedding_is_the_static_template_and_depthwise_padding_is_refused():
    """Linear access per group: a grouped conv with whole channel blocks per group gets the
    static template's per-group embedding as its candidate (no rewrite); a depthwise conv's
    per-group padded embedding has no rule (the template runs it block-diagonally)."""
    cfg = tvm_vta_cp.load_config("vta_1x16x16")
    grouped = candidates(_layer(64, 64, 3, 3, 1, 1, groups=4), (1, 64, 8, 8), cfg)
    assert [(c.name, c.embedding.describe()) for c in grouped.candidates] == [
        ("static", "x=1 y=k16 z=c16")]
    dw = candidates(_layer(32, 32, 3, 3, 1, 1, groups=32), (1, 32, 8, 8), cfg)
    assert not dw.candidates
    assert any("per-group channel padding" in why for _, why in dw.rejected)


def test_single_channel_speech_layer_gets_stencil_candidates_that_beat_padding():
    cfg = tvm_vta_cp.load_config("vta_1x16x16")
    layer = _layer(1, 32, 20, 5, 2, 0)
    cs = candidates(layer, (1, 1, 60, 40), cfg)
    names = [c.name for c in cs.candidates]
    assert "im2col(h,w)" in names and cs.static.o_mac > min(c.o_mac for c in cs.candidates)
    cp = choose(layer, (1, 1, 60, 40), "int8", "int8", cfg, "cp")
    static = choose(layer, (1, 1, 60, 40), "int8", "int8", cfg, "static", embedding="static")
    assert cp.chosen.rewrite.unroll
    assert cp.chosen.cycles < static.chosen.cycles


@pytest.mark.parametrize("config, kw", [
    ("vta_1x16x16", dict(cin=1, cout=32, k=5, stride=2, pad=0, hw=20)),
    ("vta_1x16x16", dict(cin=1, cout=16, k=3, stride=1, pad=1, hw=12)),
])
def test_cp_strategy_is_bit_exact_end_to_end(compare, config, kw):
    r = compare(models.quantized("single_conv", **kw), config,
                knobs=tvm_vta_cp.strategy_knobs(None, "cp"))
    assert [o.op for o in r.offloaded] == ["conv2d"]
    assert len(r.report.layouts) == 1
    r.assert_bit_exact()


def test_forced_image_pack_on_8x8x8_is_bit_exact(compare):
    model = models.quantized("single_conv", cin=16, cout=16, k=3, stride=1, pad=1, hw=8)
    knobs = tvm_vta_cp.strategy_knobs({"conv": {"embedding": "pack 8x1"}}, "cp")
    r = compare(model, "vta_8x8x8", knobs=knobs)
    assert r.report.layouts[0].chosen.name == "pack 8x1"
    assert [o.op for o in r.offloaded] == ["conv2d"]
    # the blocking is fused into both host functions: the pack writes the blocked tensor
    program, _, _ = load_blob(r.report.functions[0].blob)
    p_in = program.tensors[program.inputs[0]]
    host = {h["op"]: h for h in r.report.host_functions}
    assert host["pack"]["blocked"] and host["unpack"]["blocked"]
    assert host["pack"]["written"] == p_in.nbytes
    r.assert_bit_exact()


def test_bad_strategy_options_are_one_clear_error():
    with pytest.raises(AccelError, match="unknown VTA strategy"):
        choose(_layer(16, 16, 3, 3, 1, 1), (1, 16, 8, 8), "int8", "int8",
               tvm_vta_cp.load_config(None), "fastest")
    with pytest.raises(AccelError, match="embedding weights"):
        check_weights([1, -1])
    with pytest.raises(AccelError, match="not a candidate"):
        choose(_layer(16, 16, 3, 3, 1, 1), (1, 16, 8, 8), "int8", "int8",
               tvm_vta_cp.load_config(None), "cp", embedding="im2col(q)")


def test_embedding_is_a_declared_knob_whose_options_each_force_that_layout():
    from tvm_vta_cp.embedding import embedding_space

    cfg = tvm_vta_cp.load_config("vta_8x8x8")
    layer = _layer(16, 16, 3, 3, 1, 1)
    space = embedding_space(layer, (1, 16, 8, 8), "int8", "int8", cfg)
    knob = space["embedding"]
    assert "static" in knob.options and any(o.startswith("pack") for o in knob.options)
    auto = choose(layer, (1, 16, 8, 8), "int8", "int8", cfg, "auto")
    assert knob.default == auto.chosen.name
    for name in knob.options:
        forced = choose(layer, (1, 16, 8, 8), "int8", "int8", cfg, "auto", embedding=name)
        assert forced.chosen.name == name
        assert forced.chosen.combined(cfg) >= auto.chosen.combined(cfg)


def test_image_pack_search_yields_only_ordered_covering_packs():
    cfg = tvm_vta_cp.load_config("vta_8x8x8")
    cs = candidates(_layer(16, 16, 3, 3, 1, 1), (1, 16, 7, 7), cfg, top_k=50)
    packs = [e for e in cs.embeddings if any(d in ("oh", "ow") for d in e.dims("x"))]
    assert packs and not [why for _, why in cs.rejected if "adjacent" in why]
    assert {c.rewrite.pack for c in cs.candidates} >= {(8, 1), (1, 8), (2, 4), (4, 2)}


def test_a_knob_for_a_layer_the_model_does_not_have_is_an_error_naming_the_nearest():
    import tvm

    from tvm_accel.frontend import load_onnx

    mod, _ = load_onnx(models.quantized("conv_residual", c=16, hw=8))
    with pytest.raises(AccelError, match=r"no layer named 'convv'.*nearest: conv"):
        tvm.compile(mod, target="llvm",
                    relax_pipeline=tvm_vta_cp.pipeline(knobs={"convv": {"tile_h": 2}}))
    # the target's global options are not layer names
    tvm.compile(mod, target="llvm", relax_pipeline=tvm_vta_cp.pipeline(strategy="static"))
