"""Concat on MARSELLUS without a copy through the host: each input lives in its channel slice of
the concatenated tensor (``views``), so its producer's stores write there and its readers read
from there, as the DPU's concat by placement does.

An input that cannot live there is copied into its slice on the cores instead, by a 1x1
``CL.AVGPOOL`` (one multiply-add and NormQuant per value): an input whose quantization
changes (the copy applies the concat's rescale: kappa = its 16-bit multiplier, the zero points
and rounding in lambda; onnxruntime's QDQ concat rescales every input but one), a function input
or output (the host packs / reads whole tensors), one that already lives in another slice (the
same tensor twice, or a concat's output) or of another precision. A slice needs whole bytes
per pixel and at its first channel (HWC at 2 / 4 / 8 bits); otherwise the concat is a mapping
error and runs on the CPU with that reason."""

from __future__ import annotations

from dataclasses import dataclass

from tvm_accel.errors import MappingError
from tvm_accel.layers import DTYPE_RANGE, ConcatLayer, LayerGraph, PoolLayer, Requant, Tensor
from tvm_marsellus.strategy.layers import cluster_bits


@dataclass
class SliceCopy(PoolLayer):
    """A 1x1 average pool that writes (and rescales) one input of the concat ``parent`` into
    its channel slice."""

    parent: str = ""


def identity_requant(z: int, dtype: str, bits: int) -> Requant:
    """The requant of a plain copy of a ``bits``-bit tensor with zero point ``z``."""
    lo, hi = DTYPE_RANGE[dtype]
    if bits < 8:
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if dtype == "int8" else (
            0, (1 << bits) - 1)
    return Requant(0, [1], [0], 0, z, lo, hi)


def expand_concats(graph: LayerGraph) -> tuple[LayerGraph, dict[str, tuple[str, int]],
                                                dict[str, ConcatLayer]]:
    """``graph`` without its concats: the inputs that can live in their slice of the output
    become slices (``{input: (concat output, first channel)}``), the others get a
    :class:`SliceCopy` into a new slice tensor. Returns the graph, the slices and the concats
    by name. MappingError when a slice would split a byte."""
    concats = [ly for ly in graph.layers if isinstance(ly, ConcatLayer)]
    if not concats:
        return graph, {}, {}
    produced = {ly.output: ly for ly in graph.layers}
    io = set(graph.inputs) | set(graph.outputs)
    tensors, layers, slices = dict(graph.tensors), [], {}
    for ly in graph.layers:
        if not isinstance(ly, ConcatLayer):
            layers.append(ly)
            continue
        out = graph.tensors[ly.output]
        if ly.axis % 4 != 1 or len(out.shape) != 4:
            raise MappingError(f"layer {ly.name}: concat along axis {ly.axis} (the slices are "
                               "channel ranges of NCHW tensors)")
        cb, c0 = cluster_bits(out.bits), 0
        for i, (name, z, rq) in enumerate(zip(ly.inputs, ly.input_zero_points, ly.requants,
                                              strict=True)):
            t = graph.tensors[name]
            c = int(t.shape[1])
            if (c0 * cb) % 8 or (c * cb) % 8:
                raise MappingError(f"layer {ly.name}: input {name} at channels {c0}..{c0 + c - 1}"
                                   f" splits a byte of the {cb}-bit HWC output (a slice is "
                                   "whole bytes)")
            placeable = (rq is None and name not in io and name not in slices
                         and not isinstance(produced.get(name), (ConcatLayer, type(None)))
                         and (t.dtype, t.bits) == (out.dtype, out.bits))
            if placeable:
                slices[name] = (ly.output, c0)
            else:
                copy = f"{ly.name}_in{i}"
                tensors[copy] = Tensor(copy, tuple(t.shape), out.dtype, out.bits)
                layers.append(SliceCopy(
                    f"{ly.name}_copy{i}", name, copy, "avg", (1, 1), (1, 1), (0, 0, 0, 0), z,
                    rq or identity_requant(z, out.dtype, out.bits), op_name="concat",
                    parent=ly.name))
                slices[copy] = (ly.output, c0)
            c0 += c
    return (LayerGraph(tensors, layers, graph.inputs, graph.outputs), slices,
            {ly.name: ly for ly in concats})
