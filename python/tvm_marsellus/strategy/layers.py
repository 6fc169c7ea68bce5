"""The strategy's view of a layer graph: tensors (NHWC geometry, precision, L2 layout), layer
geometry and tile windows, and the rules that say which layers the RBE can run (shared by every
stage)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tvm_accel.errors import MappingError
from tvm_accel.layers import AddLayer, ConvLayer, LayerGraph, MulLayer, PoolLayer
from tvm_marsellus.hw_config import RBE_CHANNELS, MarsellusConfig
from tvm_marsellus.numerics import add_factors
from tvm_marsellus.program import TensorPlacement

ALIGN = 8


#: why a split reduction (Kin tiling) never runs on the RBE (docs/marsellus.md)
RBE_NO_KIN = ("the RBE cannot split the input channels (tile_c): its 32-bit accumulators live "
              "inside a job and NormQuant always saturates them to O <= 8 bits, so no partial "
              "sum leaves or enters a job; Kin tiling runs on the cluster")


def cluster_bits(bits: int) -> int:
    """Cluster container width (2, 4 or 8) holding ``bits``-bit values."""
    return 2 if bits <= 2 else 4 if bits <= 4 else 8


def _al(n: int, a: int = ALIGN) -> int:
    return -(-int(n) // a) * a


def _rng(bits: int, signed: bool) -> tuple[int, int]:
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


@dataclass
class TensorInfo:
    """A tensor as the strategy stores it: NHWC geometry, precision and L2 layout."""

    name: str
    n: int
    h: int
    w: int
    c: int
    bits: int
    signed: bool
    layout: str = "hwc"
    offset: int = 0
    dense: bool = False
    #: a signed ``hwc`` tensor stored unsigned with the offset 2^(bits-1) (docs/marsellus.md)
    biased: bool = False
    mem: str = "L2"  # "L3" when L2 cannot hold it (docs/marsellus.md, L3)

    @property
    def cbits(self) -> int:
        return cluster_bits(self.bits)

    @property
    def offset_value(self) -> int:
        """Unsigned storage offset (2^(bits-1) of a signed ``rbe`` or biased tensor, else 0)."""
        return (1 << (self.bits - 1)) if self.signed and (
            self.layout == "rbe" or self.biased) else 0

    @property
    def stored_signed(self) -> bool:
        """The stored values are two's complement (signed and not offset)."""
        return self.signed and not self.offset_value

    def pix_bytes(self) -> float:
        if self.layout == "rbe":
            return -(-self.c // RBE_CHANNELS) * self.bits * 4
        return self.c * self.cbits / 8

    @property
    def nbytes(self) -> int:
        return int(np.ceil(self.n * self.h * self.w * self.pix_bytes()))

    def placement(self) -> TensorPlacement:
        shape = ((self.n, self.c) if self.dense else (self.n, self.h, self.w, self.c))
        if self.layout == "rbe":
            shape = (self.n * self.h, self.w, self.c)
        return TensorPlacement(self.name, shape, self.mem, self.offset, self.layout,
                                  self.bits if self.layout == "rbe" else self.cbits,
                                  self.stored_signed)


@dataclass
class Geometry:
    """Spatial geometry of a layer: input (H, W, C), output (Ho, Wo, K), window and padding."""

    h: int
    w: int
    c: int
    ho: int
    wo: int
    k: int
    kh: int
    kw: int
    sh: int
    sw: int
    pads: tuple[int, int, int, int]  # top, left, bottom, right

    def in_rows(self, ho0: int, th: int) -> tuple[int, int, int, int]:
        """Loaded input rows ``[lo, hi)`` and the tile's (top, bottom) padding."""
        return _window(ho0 * self.sh - self.pads[0], (th - 1) * self.sh + self.kh, self.h)

    def in_cols(self, wo0: int, tw: int) -> tuple[int, int, int, int]:
        """Loaded input columns ``[lo, hi)`` and the tile's (left, right) padding."""
        return _window(wo0 * self.sw - self.pads[1], (tw - 1) * self.sw + self.kw, self.w)

    def window_fraction(self) -> float:
        """Share of the output pixels whose window reads the input: the cluster kernels skip
        the others (padding only: their value is NormQuant of the padding taps)."""
        def n(out: int, size: int, k: int, s: int, pad: int) -> int:
            return sum(1 for o in range(out) if o * s - pad < size and o * s - pad + k > 0)

        return n(self.ho, self.h, self.kh, self.sh, self.pads[0]) * \
            n(self.wo, self.w, self.kw, self.sw, self.pads[1]) / (self.ho * self.wo)


def _window(r0: int, extent: int, size: int) -> tuple[int, int, int, int]:
    """The input range ``[lo, hi)`` a tile loads for its window ``[r0, r0 + extent)`` over an
    axis of ``size``, and the (before, after) padding of the kernel command. A window lying in
    the padding only (padding not smaller than the kernel) still loads one element, which no
    tap reads: before a tensor the padding puts every tap at a negative index; after it the
    padding before is the whole extent, so every tap again falls before the loaded element.
    Those outputs are NormQuant of the padding taps alone (the bias-only value)."""
    r1 = r0 + extent
    lo, hi = max(r0, 0), min(r1, size)
    if hi > lo:
        return lo, hi, lo - r0, r1 - hi
    if r1 <= 0:
        return 0, 1, -r0, 0
    return size - 1, size, extent, 0


def layer_reads(layer) -> tuple[str, ...]:
    """The tensors a layer reads, in the order its kernel takes them (a product: its feature
    map, then its per-channel vector, see :func:`maps_first`)."""
    if isinstance(layer, (AddLayer, MulLayer)):
        return tuple(layer.inputs)
    return (layer.input,)


def maps_first(graph: LayerGraph) -> LayerGraph:
    """The graph with every product's operands in the cluster MUL's order: the feature map,
    then the (N, C, 1, 1) vector (the multiplication commutes; the zero points follow)."""
    layers = []
    for ly in graph.layers:
        if isinstance(ly, MulLayer):
            a, b = (graph.tensors[n].shape for n in ly.inputs)
            if tuple(a[2:]) == (1, 1) and tuple(b[2:]) != (1, 1):
                ly = replace(ly, inputs=(ly.inputs[1], ly.inputs[0]),
                             a_zero_point=ly.b_zero_point, b_zero_point=ly.a_zero_point)
        layers.append(ly)
    return replace(graph, layers=layers)


def _tensor_infos(graph: LayerGraph) -> dict[str, TensorInfo]:
    out = {}
    for name, t in graph.tensors.items():
        s = tuple(int(x) for x in t.shape)
        if len(s) == 2:
            ti = TensorInfo(name, s[0], 1, 1, s[1], int(t.bits), t.dtype == "int8", dense=True)
        elif len(s) == 4:
            ti = TensorInfo(name, s[0], s[2], s[3], s[1], int(t.bits), t.dtype == "int8")
        else:
            raise MappingError(f"tensor {name}: shape {s} is neither NCHW nor NC")
        out[name] = ti
    return out


def _geometry(layer, tin: TensorInfo, tout: TensorInfo) -> Geometry:
    if hasattr(layer, "geometry"):  # a phase conv: its input / output views (``phases``)
        return layer.geometry(tin, tout)
    if isinstance(layer, ConvLayer):
        kh, kw = layer.kernel
        pt, pl, pb, pr = layer.padding
        return Geometry(tin.h, tin.w, tin.c, tout.h, tout.w, tout.c, kh, kw, *layer.strides,
                        (pt, pl, pb, pr))
    if isinstance(layer, PoolLayer):
        pt, pl, pb, pr = layer.padding
        return Geometry(tin.h, tin.w, tin.c, tout.h, tout.w, tout.c, *layer.kernel,
                        *layer.strides, (pt, pl, pb, pr))
    return Geometry(tin.h, tin.w, tin.c, tout.h, tout.w, tout.c, 1, 1, 1, 1, (0, 0, 0, 0))


def rbe_reasons(layer: ConvLayer, tin: TensorInfo, tout: TensorInfo,
                cfg: MarsellusConfig) -> list[str]:
    """Why a conv layer cannot run on the RBE (empty = it can)."""
    r = []
    kh, kw = layer.kernel
    if layer.is_dense or layer.groups != 1:
        r.append("dense / grouped layers run on the cluster")
    if (kh, kw) not in ((3, 3), (1, 1)):
        r.append(f"kernel {kh}x{kw} is not 3x3 or 1x1")
    if layer.strides[0] != layer.strides[1] or layer.strides[0] not in (1, 2):
        r.append(f"stride {layer.strides} is not 1 or 2")
    if max(layer.padding) > 15:
        r.append("padding above 15")
    pt, pl, pb, pr = layer.padding
    if max(pt, pb) >= kh or max(pl, pr) >= kw:
        r.append(f"padding {layer.padding} not smaller than the kernel (outputs that read "
                 "padding only run on the cluster)")
    lo, hi = cfg.RBE_MIN_BITS, cfg.RBE_MAX_BITS
    for what, b in (("W", layer.weight_bits), ("I", tin.bits), ("O", tout.bits)):
        if not lo <= b <= hi:
            r.append(f"{what} = {b} bits outside {lo}..{hi}")
    return r


def add_rbe_reasons(layer: AddLayer, ta: TensorInfo, tb: TensorInfo, tout: TensorInfo,
                    cfg: MarsellusConfig) -> list[str]:
    """Why a residual add cannot run on the RBE as a 1x1 BinConv over its operands stacked
    along the input channels (empty = it can, once both operands are in the RBE layout)."""
    r = []
    if ta.bits != tb.bits:
        r.append(f"operands of {ta.bits} and {tb.bits} bits (one input precision per RBE job)")
    lo, hi = cfg.RBE_MIN_BITS, cfg.RBE_MAX_BITS
    for what, b in (("I", ta.bits), ("O", tout.bits)):
        if not lo <= b <= hi:
            r.append(f"{what} = {b} bits outside {lo}..{hi}")
    wa, wb, kappa, wbits = add_factors(layer.a_multiplier, layer.b_multiplier)
    if wbits > hi or kappa > 0xFFFF:
        r.append(f"multipliers {layer.a_multiplier}, {layer.b_multiplier} need {wbits}-bit "
                 "weights (the recipe fell back to the cluster ADD's 16-bit multipliers)")
    if ta.dense or tb.dense:
        r.append("operands are not 4-D")
    return r


def _clip_mode(layer, tout: TensorInfo, cbits: int | None = None) -> tuple[bool, bool]:
    """``(relu, full)`` of the output clip at ``cbits`` (default the tensor's bits); MappingError
    when NormQuant cannot clamp to ``[qmin, qmax]``."""
    rq = layer.requant
    bits = cbits or tout.bits
    lo, hi = _rng(bits, tout.signed)
    if rq is None:
        return False, True
    if rq.qmax == hi and rq.qmin == lo:
        return False, True
    if tout.signed and rq.qmax == hi and rq.qmin == 0:
        return True, False
    raise MappingError(f"layer {layer.name}: clip [{rq.qmin}, {rq.qmax}] is not the {bits}-bit "
                       f"{'signed' if tout.signed else 'unsigned'} range (NormQuant clamps to "
                       "the O-bit range, optionally ReLU)")
