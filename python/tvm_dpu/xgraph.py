"""XGraph-style IR of an offloaded function: one node per (op, output tensor), parameters folded.

Built from the core's :class:`~tvm_accel.layers.LayerGraph` (DNNVM's XGraph: nodes are
operations with their output feature map; constants are folded into the node, so the strategy
sees exactly what the hardware consumes):

- conv / dense / depthwise: ``weight`` int8 ``[oc][kh][kw][ic]`` (depthwise ``[oc][kh][kw]``),
  ``bias`` int32 with the input zero point (``- zx * sum(w)``) and the output zero point
  (``+ zp << shift``) folded in, so ``out = clip((acc + bias + 2^(shift-1)) >> shift)`` with
  ``pad_value = zx``; ``shift``, ``clip``;
- add: ``shift_a``/``shift_b`` (log2 of the power-of-two multipliers), ``shift``, ``clip``;
- pool / upsample / concat: their attributes (see ``strategy``).

:func:`build_xgraph` raises :class:`~tvm_accel.errors.MappingError` for anything the pattern
checks should have kept on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tvm_accel.errors import AccelError
from tvm_accel.layers import AddLayer, ConvLayer, LayerGraph
from tvm_dpu.numerics import leaky_mismatch


class XGraphError(AccelError):
    """A layer has no DPU form (a pattern check should have kept it on the CPU)."""


@dataclass
class XNode:
    name: str
    op: str
    inputs: list[str]
    output: str
    out_shape: tuple[int, ...]
    attrs: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)
    layer: object = None


@dataclass
class XGraph:
    nodes: list[XNode]
    inputs: list[str]
    outputs: list[str]

    def __str__(self) -> str:
        lines = []
        for n in self.nodes:
            p = ", ".join(f"{k}{list(v.shape)}" if isinstance(v, np.ndarray) else f"{k}={v}"
                          for k, v in n.params.items())
            lines.append(f"{n.output}{list(n.out_shape)} = {n.op}({', '.join(n.inputs)}) {p}")
        return "\n".join(lines)


def fold_conv(layer: ConvLayer) -> dict:
    """Hardware parameters of a conv: int8 weights, int32 folded bias, shift, clip, pad value."""
    rq = layer.requant
    if rq.pre_shift != 0 or np.any(np.asarray(rq.multiplier) != 1) or not 0 <= rq.shift <= 31:
        raise XGraphError(f"layer {layer.name}: requantize is not a right shift")
    w = layer.weight.astype(np.int64)
    if w.size and (w.min() < -128 or w.max() > 127):
        raise XGraphError(f"layer {layer.name}: weights do not fit int8")
    zx = int(layer.input_zero_point)
    if not -128 <= zx <= 127:
        raise XGraphError(f"layer {layer.name}: input zero point {zx} does not fit int8")
    bias = (layer.bias.astype(np.int64).reshape(-1) - zx * w.sum(axis=(1, 2, 3))
            + (int(rq.zero_point) << rq.shift))
    if bias.size and np.abs(bias).max() >= 2**31:
        raise XGraphError(f"layer {layer.name}: folded bias overflows int32")
    if layer.lut is not None:
        bad = leaky_mismatch(layer.lut, layer.lut_lo, int(rq.qmin), int(rq.qmax))
        if bad:
            raise XGraphError(f"layer {layer.name}: the fused activation is not the DPU's "
                              f"LeakyReLU ({bad})")
    wt = np.transpose(w, (0, 2, 3, 1)).astype(np.int8)  # [oc][kh][kw][ic]
    return {"weight": wt, "bias": bias.astype(np.int32), "shift": int(rq.shift),
            "clip": (int(rq.qmin), int(rq.qmax)), "pad_value": zx}


def clip_fields(layer: ConvLayer) -> dict:
    """CONV ``leaky`` / ``clip_lo`` / ``clip_hi``: the requantize's clip, or, with a fused
    LeakyReLU table (checked by :func:`fold_conv`), the nonlinear module on the int8 result."""
    if layer.lut is not None:
        return {"leaky": True, "clip_lo": -128, "clip_hi": 127}
    return {"leaky": False, "clip_lo": int(layer.requant.qmin), "clip_hi": int(layer.requant.qmax)}


def fold_add(layer: AddLayer) -> dict:
    if layer.a_zero_point or layer.b_zero_point or layer.requant.zero_point:
        raise XGraphError(f"layer {layer.name}: ELTADD needs zero points 0")
    shifts = []
    for m in (layer.a_multiplier, layer.b_multiplier):
        if m < 1 or m & (m - 1) or m.bit_length() > 32:
            raise XGraphError(f"layer {layer.name}: add multiplier {m} is not 2^0..2^31")
        shifts.append(m.bit_length() - 1)
    rq = layer.requant
    return {"shift_a": shifts[0], "shift_b": shifts[1], "shift": int(rq.shift),
            "clip": (int(rq.qmin), int(rq.qmax))}


def build_xgraph(graph: LayerGraph) -> XGraph:
    nodes = []
    for ly in graph.layers:
        out = graph.tensors[ly.output]
        ins = list(getattr(ly, "inputs", None) or [ly.input])
        params: dict = {}
        attrs: dict = {}
        if isinstance(ly, ConvLayer):
            params = fold_conv(ly)
            attrs = {"kernel": ly.kernel, "strides": tuple(ly.strides),
                     "padding": tuple(ly.padding), "depthwise": ly.is_depthwise,
                     "dilation": tuple(int(d) for d in ly.dilation)}
        elif isinstance(ly, AddLayer):
            params = fold_add(ly)
        nodes.append(XNode(ly.name, ly.op_name, ins, ly.output, tuple(out.shape), attrs, params,
                           ly))
    return XGraph(nodes, list(graph.inputs), list(graph.outputs))
