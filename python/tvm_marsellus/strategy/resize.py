"""Nearest upsample (ONNX Resize / Upsample, nearest, integer scales) on MARSELLUS as data
movement: output phase ``(a, b)`` (rows ``a, a + S, ...``, columns ``b, b + S', ...``) is the
input itself, so the layer is ``S x S'`` copies of the input, each a 1x1 ``CL.AVGPOOL`` on the
cores (one multiply-add and NormQuant per value: the rescale when the quantization changes, a
plain copy otherwise) whose DMA_OUT scatters it into its phase (``views``)."""

from __future__ import annotations

from dataclasses import dataclass

from tvm_accel.layers import LayerGraph, PoolLayer, UpsampleLayer
from tvm_marsellus.strategy.concat import identity_requant
from tvm_marsellus.strategy.layers import Geometry, TensorInfo


@dataclass
class PhaseCopy(PoolLayer):
    """One output phase of the upsample ``parent``: the whole input copied (rescaled) into
    rows ``out_phase[0] + m * out_step[0]`` and the columns likewise of the output."""

    parent: str = ""
    out_phase: tuple[int, int] = (0, 0)
    out_step: tuple[int, int] = (1, 1)

    def geometry(self, tin: TensorInfo, tout: TensorInfo) -> Geometry:
        """A 1x1 window over the input, the output phase the input's size."""
        return Geometry(tin.h, tin.w, tin.c, tin.h, tin.w, tout.c, 1, 1, 1, 1, (0, 0, 0, 0))


def upsample_phases(layer: UpsampleLayer, graph: LayerGraph) -> list[PhaseCopy]:
    """The ``S x S'`` phase copies of a nearest upsample."""
    out = graph.tensors[layer.output]
    rq = layer.requant or identity_requant(0, out.dtype, out.bits)
    zp = layer.input_zero_point if layer.requant is not None else 0
    sh, sw = (int(s) for s in layer.scale)
    return [PhaseCopy(f"{layer.name}_ph{a}_{b}", layer.input, layer.output, "avg", (1, 1),
                      (1, 1), (0, 0, 0, 0), zp, rq, op_name="upsample", parent=layer.name,
                      out_phase=(a, b), out_step=(sh, sw))
            for a in range(sh) for b in range(sw)]
