"""Transpose conv on VTA: its stride-1 sub-convolutions (phases), each the conv template on its
output window, one after the other in one stream; their STOREs interleave the phases into the
output (no intermediate tensor)."""

from __future__ import annotations

from tvm_accel.errors import KnobError
from tvm_accel.layers import DeconvLayer, deconv_output_shape, layer_shape_text
from tvm_vta_cp.layout import dims4
from tvm_vta_cp.program import LayerProgram
from tvm_vta_cp.strategy.conv import conv_body, conv_macs
from tvm_vta_cp.strategy.emitter import Emitter, emit_layer
from tvm_vta_cp.strategy.geometry import deconv_phases
from tvm_vta_cp.strategy.placement import PlanContext


def deconv(ctx: PlanContext, layer: DeconvLayer, user_knobs: dict | None,
           use_halo: bool) -> LayerProgram:
    """A transpose conv as its ``deconv_subconvs`` phases, one after the other in one
    stream: each phase is the static conv template on its output window, its STOREs
    interleave it into the output (:meth:`DramTensor.scatter`). ``user_knobs`` maps phase names
    (``<layer>_sub<rh><rw>``) to the conv knobs of that phase."""
    cfg, pin = ctx.cfg, ctx.placements[layer.input]
    user_knobs = user_knobs or {}
    subs = deconv_phases(layer, pin.shape)
    unknown = sorted(set(user_knobs) - {sc.conv.name for sc in subs})
    if unknown:
        raise KnobError(f"layer {layer.name}: knobs are per phase "
                       f"({', '.join(sc.conv.name for sc in subs)}), not {unknown[0]!r}")
    strides = tuple(int(s) for s in layer.strides)
    parts = [conv_body(ctx, sc.conv, user_knobs.get(sc.conv.name), use_halo, layer.output,
                       sc, strides) for sc in subs]

    def body(em: Emitter):
        for i, (_, _, phase) in enumerate(parts):
            if i:
                em.new_phase()
            phase(em)

    insns = emit_layer(cfg, ctx.isa, ctx.dram, layer.name, body)
    macs, padded = (sum(v) for v in zip(*(conv_macs(g, cfg) for g, _, _ in parts),
                                        strict=True))
    n, c, h, w = dims4(tuple(pin.shape))
    _, k, ho, wo = deconv_output_shape(layer, (n, c, h, w))
    shape = layer_shape_text(layer, [(n, c, h, w)], (n, k, ho, wo), f"({len(subs)} phases)")
    return LayerProgram(layer.name, "conv2d_transpose", insns, len(insns) // 16, int(macs),
                        int(padded), shape,
                        {sc.conv.name: dict(kn) for sc, (_, kn, _) in zip(subs, parts,
                                                                           strict=True)})
