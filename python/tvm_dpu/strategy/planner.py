"""The planner: one stream per layer, fused group or concurrent pair of streams."""

from __future__ import annotations

import dataclasses

from tvm_accel.errors import MappingError
from tvm_accel.knobs import KnobSpace
from tvm_accel.layers import (
    AddLayer,
    ConcatLayer,
    ConvLayer,
    DeconvLayer,
    LayerGraph,
    MulLayer,
    PoolLayer,
    UpsampleLayer,
)
from tvm_dpu import codegen as cg
from tvm_dpu.program import DPUProgram, LayerProgram
from tvm_dpu.strategy.dependencies import resolve_tokens
from tvm_dpu.strategy.emit import _relocate
from tvm_dpu.strategy.emit_fused import FusedEmitter
from tvm_dpu.strategy.emit_misc import MiscEmitter
from tvm_dpu.strategy.knobs import fused_knob_space
from tvm_dpu.strategy.list_schedule import list_schedule, reorder
from tvm_dpu.strategy.tiling import _cdiv


class Planner(FusedEmitter, MiscEmitter):
    """Every emitter of the DPU strategy, with the dispatch by layer type and fusion template."""

    def layer(self, layer, user: dict | None) -> LayerProgram:
        """The stream of one layer on its own."""
        for kind, fn in ((ConvLayer, self.conv), (AddLayer, self.add), (PoolLayer, self.pool),
                         (DeconvLayer, self.deconv), (UpsampleLayer, self.upsample),
                         (ConcatLayer, self.concat), (MulLayer, self.mul)):
            if isinstance(layer, kind):
                return fn(layer, user)
        raise MappingError(f"layer {layer.name}: {type(layer).__name__} is not supported on the "
                           "DPU yet")

    def group(self, template: str, layers: list, user: dict | None) -> LayerProgram:
        """The stream of a fused group: intermediate tensors stay in FM."""
        if template == "conv+add":
            return self.conv_add(layers[0], layers[1], user)
        if template == "horizontal":
            return self.conv_horizontal(layers, user)
        if template == "pool+conv":
            return self.pool_conv(layers[0], layers[1], user)
        if template == "chain":
            return self.chain(layers, user)
        return self.conv_pool(layers[0], layers[1], template, user)

    def spec(self, spec: tuple, knobs: dict) -> LayerProgram:
        """The stream of ``(template or None, layer names)``: one layer or a fused group."""
        tpl, names = spec
        by = {ly.name: ly for ly in self.g.layers}
        if tpl is None:
            return self.layer(by[names[0]], knobs.get(names[0]))
        return self.group(tpl, [by[n] for n in names], knobs.get("+".join(names)))

    def parallel(self, a: tuple, b: tuple, knobs: dict) -> LayerProgram:
        """Two independent streams run concurrently (DPUV3INT8's parallel schedule of, e.g., an
        Inception max pool on MISC beside a convolution on CONV): each is planned for half of
        every FM memory and half the PM, ``b``'s addresses move to the upper halves, and the two
        dependency lists are merged by :func:`~tvm_dpu.strategy.list_schedule.list_schedule` and
        turned into one set of tokens."""
        cfg = self.cfg
        half_cfg = dataclasses.replace(cfg, FM_BANKS=cfg.FM_BANKS // 2, PM_BYTES=cfg.PM_BYTES // 2)
        self.cfg = half_cfg
        try:
            pa = self.spec(a, knobs)
            items_a = self.last_items
            pb = self.spec(b, knobs)
            items_b = self.last_items
        finally:
            self.cfg = cfg
        fm_off, pm_off = half_cfg.fm_memory_bytes, half_cfg.PM_BYTES
        for insn, _ in items_b:
            _relocate(insn, fm_off, pm_off)
        both = [*items_a, *[(insn, [len(items_a) + d for d in deps]) for insn, deps in items_b]]
        sides = [0] * len(items_a) + [1] * len(items_b)
        order = list_schedule(both, [0] * len(both), cfg, sides)
        merged, _ = reorder(both, order)
        self.last_sides = [sides[i] for i in order]
        insns = [*resolve_tokens(merged), cg.End()]
        self.last_items = merged
        return LayerProgram(f"{pa.name}||{pb.name}", f"{pa.op} || {pb.op}",
                            cg.encode_stream(insns), len(insns), pa.macs + pb.macs,
                            f"{pa.shape} || {pb.shape}", {pa.name: pa.knobs, pb.name: pb.knobs})

    def group_knob_space(self, template: str, layers: list, halo: str | None = None) -> KnobSpace:
        """:func:`~tvm_dpu.strategy.knobs.fused_knob_space` of a group of this function."""
        return fused_knob_space(template, layers, self._in_shape(layers[0].input), self.cfg, halo)

    def streams(self, groups: list, knobs: dict) -> tuple[list[LayerProgram], list, list]:
        """The stream of every group in order, with its dependency list and, for a concurrent
        pair, the side of each instruction (the inputs of
        :func:`~tvm_dpu.strategy.merge.merge_streams`)."""
        layers, parts, sides = [], [], []
        for tpl, names in groups:
            if tpl == "parallel":
                layers.append(self.parallel(names[0], names[1], knobs))
            else:
                layers.append(self.spec((tpl, names), knobs))
            parts.append(self.last_items)
            sides.append(self.last_sides)
        return layers, parts, sides

    def program(self, graph: LayerGraph, layers: list[LayerProgram], report) -> DPUProgram:
        """The function's program: DDR region sizes (4 KiB multiples), PARAM image, streams."""
        sizes = {r: max(64, _cdiv(v, 4096) * 4096) for r, v in self.region_use.items()}
        sizes["PARAM"] = max(64, _cdiv(len(self.params), 4096) * 4096)
        sizes["INSN"] = max(64, _cdiv(sum(len(ly.insns) for ly in layers), 4096) * 4096)
        return DPUProgram(tensors=self.tensors, inputs=list(graph.inputs),
                          outputs=list(graph.outputs), region_sizes=sizes,
                          params=bytes(self.params), layers=layers, fusion=report)
