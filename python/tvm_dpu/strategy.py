"""DPU strategy: a layer graph -> DPU instruction streams, DDR map and PM parameters.

XGraph view (see :mod:`tvm_dpu.xgraph`): one node per layer, parameters folded in. Each layer
(or fused group) is first scheduled as its own stream that reads its inputs from DDR and writes
its output to DDR (function inputs in INPUT, outputs in OUTPUT, intermediates in SWAP, weights
and biases in PARAM). The streams of a function are then merged into **one** instruction stream
(:func:`merge_streams`, DPUV3INT8's whole-network schedule): each group keeps its dependencies
and, across groups, an instruction waits by byte range for the earlier groups' accesses, so the
next group's weights and first input band load during the current group's tail; a list
scheduler on the cycle model (:func:`list_schedule`) then orders every unit's queue, filling
the idle units of one group with the work of the next ones. With
``{"@fusion": {"overlap": False}}`` every group stays a stream of its own (ending in END) and
the runtime runs the streams one after the other.

Data layout. A tensor is stored per image as H x W x C bytes (channels innermost, the FM
layout), images ``img_stride = H*W*C`` apart; a dense tensor (N, C) is 1 x 1 x C. The batch is
split over the ``NUM_PE`` PEs (PE p of group g runs image ``g*NUM_PE + p``); tensors are
allocated for the batch rounded up to a multiple of ``NUM_PE``, the extra images are don't-care.

Tiling (knobs per layer, :func:`knob_space`):

- ``oc_tile`` -- weight tiling over output channels (multiple of ``CONV_OC_PAR``) when a
  layer's int8 weights + int32 biases exceed the PM, or exceed half of it and take longer to
  load than to convolve (a dense layer: its first chunk loads beside the previous group);
  chunks that fit half the PM alternate between the two halves (double buffering), larger
  ones use the whole PM.
- ``tile_h`` -- H-split: output rows per tile; options are multiples of the preferred height
  (``CONV_ROW_PAR`` = 8 for conv, ``MISC_ROW_PAR`` = 2 for pool/eltwise) plus the full height;
  default: the largest that fits, at most about a quarter of the height.
- ``tile_w`` -- W-split: output columns per tile, the input windows of neighbouring tiles overlap
  by ``kernel - stride`` columns (and rows likewise for the H-split); the default is the full
  width unless a band of the preferred height does not fit the FM.
- ``format`` -- convs with at most ``FORMAT_MAX_CHANNELS`` input channels (an RGB first layer)
  use the format unit: the LOAD pads and gathers ``kw`` neighbouring pixels into one (W-direction
  im2col) and the CONV runs a ``kh x 1`` kernel on ``kw * c`` channels (same weight bytes).
- ``pipeline`` -- software pipelining on (default) or off (serial: each tile waits for the
  previous tile's SAVE).

On-chip chains (fusion template ``chain``, :func:`_chain_plan`, :meth:`_Planner.chain`): convs
each reading the previous one's output, optionally closed by an add or a pool, run as one
stream of row bands that line up across the chain (halo keep: the rows a consumer reads again
are COPYed to its next band's buffer); their windows are packed first-fit into the FM memories;
weights that exceed the PM stream through its two halves in output-channel chunks.

FM allocation. FM memory 0 holds the input tile (memory 2 the second add operand), memory 1 the
output tile; each memory is split into two halves (ping-pong buffers, tile ``i`` uses half
``i % 2``) that every tile must fit; the addresses stay inside the circular memory.

Software pipelining, purely with DPON/DPBY. :func:`schedule` states dependencies by buffer --
a tile's LOAD waits for the last compute (CONV or MISC) that read its input buffer, the compute
for its LOADs and for the last SAVE of its output buffer, the SAVE for the compute, a PM LOAD
for the last CONV of its PM half -- and :func:`resolve_tokens` turns them into tokens (one
counting FIFO per unit pair: the k-th pop matches the k-th push, redundant waits dropped). With
two buffers this gives LOAD(i+1) overlapping CONV(i) and SAVE(i-1): a head (the first two LOADs
wait for nothing), a steady state (LOAD(i) DPON=CONV, CONV(i) DPON=LOAD|SAVE) and a tail (the
last two computes and SAVEs push no tokens), balanced at END without bubbles. Weight chunks,
concat inputs and deconv phases follow each other in the same pipeline.

MISC layers: max / average pool (MAXPOOL / AVGPOOL), nearest upsample (UPSAMPLE, tiles over input
rows), concat by placement (COPY, each input's SAVE writes its channel range of the output),
residual add (ELTADD). Transpose convolution runs as the stride-1 sub-convolutions of
``tvm_accel.layers.deconv_subconvs``; their SAVEs scatter every tile to every SH-th row and SW-th
column of the output (the shuffle is DDR placement).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import numpy as np

from tvm_accel import errors
from tvm_accel.knobs import Knob, KnobSpace
from tvm_accel.layers import (
    AddLayer,
    ConcatLayer,
    ConvLayer,
    DeconvLayer,
    LayerGraph,
    PoolLayer,
    UpsampleLayer,
    conv_output_shape,
    deconv_subconvs,
    pool_output_shape,
)
from tvm_dpu import codegen as cg
from tvm_dpu.hw_config import REGION_NAMES, DPUConfig
from tvm_dpu.xgraph import XGraphError, fold_add, fold_conv


class MappingError(errors.MappingError):
    """A layer cannot be mapped onto the DPU (should have been rejected by a pattern check)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class TensorPlacement:
    """A tensor in DDR: ``region`` + ``offset``, ``n_alloc`` images of ``h x w x c`` bytes.

    ``pix_stride`` > 0 makes it a channel slice of a wider tensor (a concat input placed in its
    concat's output): pixels are ``pix_stride`` bytes apart and images ``h x w x pix_stride``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    region: str
    offset: int
    n_alloc: int
    pix_stride: int = 0

    @property
    def hwc(self) -> tuple[int, int, int]:
        s = self.shape
        return (s[2], s[3], s[1]) if len(s) == 4 else (1, 1, s[1])

    @property
    def pstride(self) -> int:
        return self.pix_stride or self.hwc[2]

    @property
    def img_stride(self) -> int:
        h, w, _ = self.hwc
        return h * w * self.pstride

    @property
    def nbytes(self) -> int:
        """Bytes from ``offset`` to the end of the last image's last pixel."""
        h, w, c = self.hwc
        return (self.n_alloc * h * w - 1) * self.pstride + c


@dataclass
class LayerProgram:
    name: str
    op: str
    insns: bytes
    n_insns: int
    macs: int
    shape: str
    knobs: dict = field(default_factory=dict)
    #: None: the layer's own stream (ending in END); k: part of the function's stream k, whose
    #: layers are consecutive and whose last layer ends in END (:func:`merge_streams`)
    stream: int | None = None


@dataclass
class DPUProgram:
    tensors: dict[str, TensorPlacement]
    inputs: list[str]
    outputs: list[str]
    region_sizes: dict[str, int]
    params: bytes
    layers: list[LayerProgram]
    fusion: object = None  # FusionReport of the compile (not serialized)


# --- knobs ---------------------------------------------------------------------------------------
def _options(n: int, pref: int) -> list[int]:
    opts = sorted({min(n, m) for m in range(pref, n + pref, pref)} | ({n} if n < pref else set()))
    return opts


def _conv_geometry(layer: ConvLayer, in_shape):
    n, k, ho, wo = conv_output_shape(layer, in_shape)
    c = in_shape[1]
    kh, kw = layer.kernel
    return c, k, ho, wo, kh, kw


def w_space_to_depth_factor(kernel: tuple[int, int], stride_w: int, width: int,
                            pad_l: int, pad_r: int, groups: int = 1,
                            dilation: tuple[int, int] = (1, 1)) -> int | None:
    """The factor ``f`` of the W space-to-depth that brings a kernel wider than the CONV's
    4-bit field (``kw > 15``) within it, or None. In the DPU's HWC DDR layout an ``(H, W, C)``
    tensor *is* the ``(H, W / f, f * C)`` tensor whose pixel ``w'`` holds the pixels ``f w' ..
    f w' + f - 1``: the conv then runs on ``f C`` channels with a ``ceil(kw / f)``-wide kernel
    and W stride ``stride_w / f``, the same sums, so it needs no data movement at all. Needs
    ``f | stride_w`` (the DeepBench speech layers: 20 wide, stride 2), ``f | width`` and ``f``
    dividing both W paddings, groups 1 and no dilation; the smallest such ``f`` is used."""
    kh, kw = kernel
    if kw <= 15 or kh > 15 or groups != 1 or tuple(dilation) != (1, 1):
        return None
    for f in range(2, stride_w + 1):
        if (stride_w % f == 0 and width % f == 0 and pad_l % f == 0 and pad_r % f == 0
                and -(-kw // f) <= 15):
            wo = (width + pad_l + pad_r - kw) // stride_w + 1
            if (width + pad_l + pad_r) // f - (-(-kw // f)) == (wo - 1) * (stride_w // f):
                return f
    return None


#: suffix of the tensor a W space-to-depth conv reads (an alias of its input's DDR bytes)
S2D_SUFFIX = "@s2d"


def space_to_depth(graph: LayerGraph) -> tuple[LayerGraph, dict[str, str]]:
    """``graph`` with every conv wider than the CONV fields rewritten by
    :func:`w_space_to_depth_factor` (weights re-laid ``[o][r C + c][ky][j] = w[o][c][ky][f j +
    r]``, zero past ``kw``), reading the alias tensor ``<input>@s2d<f>`` of shape ``(N, f C, H,
    W / f)``; returns it and the aliases (alias -> tensor). A conv that cannot be rewritten is
    left as it is (the pattern table keeps it on the CPU)."""
    aliases: dict[str, str] = {}
    tensors, layers = dict(graph.tensors), []
    for ly in graph.layers:
        if not isinstance(ly, ConvLayer) or ly.is_dense or ly.kernel[1] <= 15:
            layers.append(ly)
            continue
        n, c, h, w = graph.tensors[ly.input].shape
        f = w_space_to_depth_factor(ly.kernel, ly.strides[1], w, ly.padding[1], ly.padding[3],
                                    ly.groups, getattr(ly, "dilation", (1, 1)))
        if f is None:
            layers.append(ly)
            continue
        k, _, kh, kw = ly.weight.shape
        kw2 = -(-kw // f)
        wt = np.zeros((k, c, kh, kw2 * f), dtype=ly.weight.dtype)
        wt[..., :kw] = ly.weight
        # [o][c][ky][j * f + r] -> [o][r * C + c][ky][j]
        wt = wt.reshape(k, c, kh, kw2, f).transpose(0, 4, 1, 2, 3).reshape(k, f * c, kh, kw2)
        alias = f"{ly.input}{S2D_SUFFIX}{f}"
        t = graph.tensors[ly.input]
        tensors[alias] = dataclasses.replace(t, name=alias, shape=(n, f * c, h, w // f))
        aliases[alias] = ly.input
        pt, pl, pb, pr = ly.padding
        layers.append(dataclasses.replace(
            ly, input=alias, weight=wt, strides=(ly.strides[0], ly.strides[1] // f),
            padding=(pt, pl // f, pb, pr // f)))
    if not aliases:
        return graph, {}
    return LayerGraph(tensors, layers, list(graph.inputs), list(graph.outputs)), aliases


def _param_bytes(layer: ConvLayer, kt: int, ic: int) -> int:
    kh, kw = layer.kernel
    per = kh * kw * (1 if layer.is_depthwise else ic)
    return kt * per + 4 * kt


def _pm_block(nbytes: int) -> tuple[int, int, int]:
    """PM LOAD shape (rows, cols, chans) covering ``nbytes`` (padded by at most rows x 64)."""
    units = _cdiv(max(1, nbytes), 64)
    rows = _cdiv(units, 4095)
    return rows, _cdiv(units, rows), 64


def _pm_bytes(nbytes: int) -> int:
    r, c, ch = _pm_block(nbytes)
    return r * c * ch


def _in_window(y0: int, n: int, stride: int, pad: int, k: int, size: int):
    start = y0 * stride - pad
    end = (y0 + n - 1) * stride - pad + k
    a, b = max(0, start), min(size, end)
    return a, b - a, a - start, end - b


def _check_conv(layer: ConvLayer, in_shape, cfg: DPUConfig, kn: dict) -> None:
    c, k, ho, wo, kh, kw = _conv_geometry(layer, in_shape)
    half = cfg.fm_memory_bytes // 2
    kt, th, tw = kn["oc_tile"], kn["tile_h"], kn["tile_w"]
    pm = _pm_bytes(_param_bytes(layer, kt, c))
    if pm > cfg.PM_BYTES:
        raise ValueError(f"oc_tile {kt}: parameters of {pm} bytes exceed the PM "
                         f"({cfg.PM_BYTES})")
    rows = (th - 1) * layer.strides[0] + kh
    cols = (tw - 1) * layer.strides[1] + kw
    if _subsamples(layer, bool(kn.get("format"))):
        rows, cols = th, tw
    if not kn.get("format"):  # the LOAD brings real rows only; the CONV pads the window
        rows, cols = min(rows, in_shape[2]), min(cols, in_shape[3])
    (pt, pl, _, _), (sh, sw) = layer.padding, layer.strides
    if any(_in_window(y, min(th, ho - y), sh, pt, kh, in_shape[2])[1] < 1
           for y in range(0, ho, th)) or any(
            _in_window(x, min(tw, wo - x), sw, pl, kw, in_shape[3])[1] < 1
            for x in range(0, wo, tw)):
        raise ValueError(f"tile_h {th} x tile_w {tw}: a tile's windows read padding only")
    ic = kt if layer.is_depthwise else c
    if kn.get("format"):
        if not format_applies(layer, c, cfg):
            raise ValueError("format: the format unit needs <= FORMAT_MAX_CHANNELS input "
                             "channels and a kernel width <= FORMAT_MAX_FACTOR")
        ic *= kw  # every formatted pixel holds kw pixels
    if rows * cols * ic > half or cols > 4095 or rows > 4095:
        raise ValueError(f"tile_h {th} x tile_w {tw}: input tile of {rows}x{cols}x{ic} bytes "
                         f"exceeds half an FM memory ({half})")
    if th * tw * kt > half or tw * kt > 4095 * 256:
        raise ValueError(f"tile_h {th} x tile_w {tw}: output tile of {th}x{tw}x{kt} bytes "
                         f"exceeds half an FM memory ({half})")


def _subsamples(layer: ConvLayer, fmt: bool) -> bool:
    """A strided 1x1 conv without padding (a ResNet projection shortcut) reads only every
    stride-th row and column: its LOAD takes just those (DDR strides times the conv's strides)
    and the CONV runs with stride 1, so the input tile and its DDR traffic shrink by the
    strides' product."""
    return (tuple(layer.kernel) == (1, 1) and tuple(layer.strides) != (1, 1) and not fmt
            and not any(layer.padding) and not layer.is_dense)


def format_applies(layer: ConvLayer, c: int, cfg: DPUConfig) -> bool:
    """The format unit (W-direction im2col on LOAD) can feed this conv: few input channels
    (e.g. an RGB first layer) and a kernel width it can gather."""
    kw = layer.kernel[1]
    return (cfg.format_unit and not layer.is_depthwise and layer.groups == 1 and kw > 1
            and c <= cfg.FORMAT_MAX_CHANNELS and kw <= cfg.FORMAT_MAX_FACTOR
            and c * kw <= 4095)


def _check_add(shape, cfg: DPUConfig, kn: dict) -> None:
    _, c, _, w = shape
    half = cfg.fm_memory_bytes // 2
    if kn["tile_h"] * kn["tile_w"] * c > half:
        raise ValueError(f"tile_h {kn['tile_h']} x tile_w {kn['tile_w']}: tile of "
                         f"{kn['tile_h'] * kn['tile_w'] * c} bytes exceeds half an FM memory")


def _default_tile(ths: list[int], tws: list[int], ho: int, wo: int, pref: int, fits,
                  cost=None) -> tuple[int, int]:
    """Default (tile_h, tile_w): full width and the largest band of the listed heights that
    fits, at most ~1/4 of the height (so LOAD/compute/SAVE overlap) but at least the preferred
    height; ``cost(th)``, when given, is minimized first (ties: the larger band). A W-split when
    no band fits at full width."""
    target = max(pref, _cdiv(_cdiv(ho, 4), pref) * pref)

    def best(ok: list[int]) -> int:
        return min(ok, key=lambda t: (cost(t) if cost else 0, -t))
    ok = [t for t in ths if t <= target and fits(t, wo)]
    if ok:
        return best(ok), wo
    # W-split: the preferred band (the cheapest one when costed) with the widest tile that fits
    ok = [t for t in ths if t <= target and fits(t, 1)] if cost else []
    th = best(ok) if ok else ths[0]
    return th, max([t for t in tws if fits(th, t)] or [1])


def knob_space(layer, in_shape, cfg: DPUConfig) -> KnobSpace:
    """Declared knobs of a layer with heuristic defaults (see the module docstring)."""
    if isinstance(layer, ConvLayer):
        c, k, ho, wo, kh, kw = _conv_geometry(layer, in_shape)
        kts = _options(k, cfg.CONV_OC_PAR)
        fit = [t for t in kts if _pm_bytes(_param_bytes(layer, t, c)) <= cfg.PM_BYTES]
        half_fit = [t for t in fit if _pm_bytes(_param_bytes(layer, t, c)) <= cfg.PM_BYTES // 2]
        # all channels at once if they fit; else chunks that double-buffer in the PM halves.
        # Also in chunks when loading the weights takes longer than the convolution (a dense
        # layer): the first chunk then loads while the previous group still uses the other half
        whole_conv = cg.Conv(out_h=ho, out_w=wo, oc=k, ic=c, kernel_h=kh, kernel_w=kw,
                             depthwise=layer.is_depthwise)
        load_bound = _param_bytes(layer, k, c) > insn_cycles(whole_conv, cfg) * \
            cfg.DDR_BYTES_PER_CYCLE
        whole = k in (half_fit if load_bound and half_fit else fit)
        kt = k if whole else max(half_fit or fit or [kts[0]])
        ths, tws = _options(ho, cfg.CONV_ROW_PAR), list(range(1, wo + 1))
        pref = cfg.CONV_ROW_PAR

        def fits(th, tw):
            try:
                _check_conv(layer, in_shape, cfg, {"oc_tile": kt, "tile_h": th, "tile_w": tw,
                                                   "format": fmt})
                return True
            except ValueError:
                return False
        def check(kn):
            _check_conv(layer, in_shape, cfg, kn)

        fmt = format_applies(layer, c, cfg)
        knobs_extra = [Knob("oc_tile", tuple(kts), kt),
                       Knob("format", (True, False) if fmt else (False,), fmt)]
    elif isinstance(layer, (PoolLayer, UpsampleLayer)):
        n, c, h, w = in_shape
        half = cfg.fm_memory_bytes // 2
        if isinstance(layer, PoolLayer):
            _, _, ho, wo = pool_output_shape(layer, in_shape)
            (kh, kw), (sh, sw) = layer.kernel, layer.strides
        else:
            ho, wo = h, w  # tiles over input rows/cols; outputs are scale x larger
            (kh, kw), (sh, sw) = (1, 1), (1, 1)
        up = layer.scale if isinstance(layer, UpsampleLayer) else (1, 1)
        ths, tws = _options(ho, cfg.MISC_ROW_PAR), list(range(1, wo + 1))
        pref = cfg.MISC_ROW_PAR

        def _misc_check(th, tw):
            rows, cols = (th - 1) * sh + kh, (tw - 1) * sw + kw
            if rows * cols * c > half or th * up[0] * tw * up[1] * c > half:
                raise ValueError(f"tile_h {th} x tile_w {tw}: tile of {c} channels exceeds "
                                 f"half an FM memory ({half})")

        def fits(th, tw):
            try:
                _misc_check(th, tw)
                return True
            except ValueError:
                return False

        def check(kn):
            _misc_check(kn["tile_h"], kn["tile_w"])

        knobs_extra = []
    else:
        n, c, ho, wo = in_shape
        ths, tws = _options(ho, cfg.MISC_ROW_PAR), list(range(1, wo + 1))
        pref = cfg.MISC_ROW_PAR

        def fits(th, tw):
            return th * tw * c <= cfg.fm_memory_bytes // 2
        def check(kn):
            _check_add(in_shape, cfg, kn)

        knobs_extra = []
    th, tw = _default_tile(ths, tws, ho, wo, pref, fits)
    return KnobSpace([*knobs_extra, Knob("tile_h", tuple(ths), th),
                      Knob("tile_w", tuple(tws), tw), Knob("pipeline", (True, False), True)],
                     check=check, name=layer.name)


def _pool_window(pool: PoolLayer, th: int, tw: int, hc: int, wc: int) -> tuple[int, int]:
    """Conv output rows x columns a ``th x tw`` pool output tile reads (at most)."""
    (kh, kw), (sh, sw) = pool.kernel, pool.strides
    return min(hc, (th - 1) * sh + kh), min(wc, (tw - 1) * sw + kw)


def fused_knob_space(template: str, layers: list, in_shape, cfg: DPUConfig,
                     halo: str | None = None) -> KnobSpace:
    """Knobs of a fused group (``tvm_dpu.fusion`` templates) with heuristic defaults.

    ``conv+add``: the conv's knobs (the other operand's tile is the size of the output tile).
    ``conv+pool``: the conv's ``oc_tile``/``format``, ``tile_h``/``tile_w`` in pool output
    rows/columns and ``halo``: ``keep`` (default when it fits: the conv and the pool as an
    on-chip chain, :func:`_chain_plan`, whose full-width conv bands are aligned to the CONV's
    8-row passes and whose pool-window halo rows are kept in FM by a MISC COPY) or
    ``recompute`` (each tile computes the conv rows its pool windows read, overlapping windows
    recompute a row band; W-split and weight tiling allowed; the default minimizes CONV row
    passes per output row; ``halo="recompute"`` makes it the default form).
    ``pool+conv``: the conv's ``oc_tile``, ``tile_h``/``tile_w`` in conv output rows/columns
    (each tile pools the input window its conv window reads).
    ``horizontal``: ``tile_h``/``tile_w`` shared by the convs (all output channels of every
    conv stay in the PM).
    ``chain``: ``tile_h`` in output rows of the chain's last layer (:func:`_chain_plan`)."""
    half = cfg.fm_memory_bytes // 2
    if template == "chain":
        return _chain_knob_space(layers, in_shape, cfg)
    if template == "pool+conv":
        pool, conv = layers
        c = in_shape[1]
        _, _, hp, wp = pool_output_shape(pool, in_shape)
        p_shape = (in_shape[0], c, hp, wp)
        base = knob_space(conv, p_shape, cfg)
        _, k, ho, wo, kh, kw = _conv_geometry(conv, p_shape)
        (pkh, pkw), (psh, psw) = pool.kernel, pool.strides

        def check(kn):
            _check_conv(conv, p_shape, cfg, kn)
            rows = (min(hp, (kn["tile_h"] - 1) * conv.strides[0] + kh) - 1) * psh + pkh
            cols = (min(wp, (kn["tile_w"] - 1) * conv.strides[1] + kw) - 1) * psw + pkw
            if rows * cols * c > half:
                raise ValueError(f"tile_h {kn['tile_h']} x tile_w {kn['tile_w']}: pool input "
                                 f"window of {rows}x{cols}x{c} exceeds half an FM memory")
        d = base.default()
        ths, tws = _options(ho, cfg.CONV_ROW_PAR), list(range(1, wo + 1))

        def fits(th, tw):
            try:
                check({**d, "tile_h": th, "tile_w": tw})
                return True
            except ValueError:
                return False
        th, tw = _default_tile(ths, tws, ho, wo, cfg.CONV_ROW_PAR, fits)
        knobs = [base["oc_tile"]]
        return KnobSpace([*knobs, Knob("tile_h", tuple(ths), th), Knob("tile_w", tuple(tws), tw),
                          Knob("pipeline", (True, False), True)], check=check,
                         name="+".join(ly.name for ly in layers))
    conv = layers[0]
    base = knob_space(conv, in_shape, cfg)
    if template == "conv+add":
        return base
    c, k, hc, wc, kh, kw = _conv_geometry(conv, in_shape)
    d = base.default()
    if template.startswith("conv+") and template.endswith("pool"):
        pool = layers[1]
        _, _, ho, wo = pool_output_shape(pool, (in_shape[0], k, hc, wc))

        def check(kn):
            rows, cols = _pool_window(pool, kn["tile_h"], kn["tile_w"], hc, wc)
            _check_conv(conv, in_shape, cfg, {**kn, "tile_h": rows, "tile_w": cols})
            if kn["tile_h"] * kn["tile_w"] * kn["oc_tile"] > half:
                raise ValueError(f"tile_h {kn['tile_h']} x tile_w {kn['tile_w']}: pool output "
                                 f"tile exceeds half an FM memory ({half})")
        ths, tws = list(range(1, ho + 1)), list(range(1, wo + 1))
        kt, fmt = d["oc_tile"], d["format"]

        def fits(th, tw):
            try:
                check({"oc_tile": kt, "format": fmt, "tile_h": th, "tile_w": tw})
                return True
            except ValueError:
                return False

        ic = 1 if conv.is_depthwise else (c * kw if fmt else c)
        per_col = (_cdiv(kt, cfg.CONV_OC_PAR) * _cdiv(ic, cfg.CONV_IC_PAR) * kh
                   * (1 if fmt else kw))

        def conv_cycles(th, tw):  # the CONV cycle model over the whole output (one oc chunk)
            rows, cols = _pool_window(pool, th, tw, hc, wc)
            n_tiles = _cdiv(ho, th) * _cdiv(wo, tw)
            return n_tiles * (_cdiv(rows, cfg.CONV_ROW_PAR) * cols * per_col
                              + cfg.CONV_LATENCY_CYCLES)
        # default: the tile with the fewest CONV cycles (overlap recompute and row passes
        # counted), at most ~1/4 of the output rows (so LOAD/CONV/MISC/SAVE overlap) unless
        # that is less than one full CONV row pass
        target = max(_cdiv(ho, 4), _cdiv(cfg.CONV_ROW_PAR, pool.strides[0]))
        shapes = [(t, w) for t in ths if t <= target for w in tws if fits(t, w)]
        th, tw = min(shapes, key=lambda s: (conv_cycles(*s), -s[0] * s[1]),
                     default=(1, 1))
        knobs = [base["oc_tile"], base["format"]]
        # halo keep (an on-chip chain of the conv and the pool, full-width bands, all weights
        # in the PM) when it fits: the default; recompute (the W-split / weight-tiled tiles
        # above) otherwise
        try:
            chain_space = _chain_knob_space(layers, in_shape, cfg)
            keep_th = chain_space.validate({})["tile_h"]
        except (ValueError, MappingError):
            chain_space = keep_th = None
        if chain_space is not None:
            recompute_check = check

            def check(kn):
                if kn.get("halo") == "keep":
                    chain_space.validate({"tile_h": kn["tile_h"]})
                else:
                    recompute_check(kn)
            if halo != "recompute":
                th = keep_th
            knobs.append(Knob("halo", ("keep", "recompute"),
                              "recompute" if halo == "recompute" else "keep"))
    elif template == "horizontal":
        ks = [ly.weight.shape[0] for ly in layers]

        def check(kn):
            th, tw = kn["tile_h"], kn["tile_w"]
            rows = (th - 1) * conv.strides[0] + kh
            cols = (tw - 1) * conv.strides[1] + kw
            if rows * cols * c > half or th * tw * sum(ks) > half:
                raise ValueError(f"tile_h {th} x tile_w {tw}: the shared input tile or the "
                                 f"{len(ks)} output tiles exceed half an FM memory ({half})")
        ths, tws = _options(hc, cfg.CONV_ROW_PAR), list(range(1, wc + 1))

        def fits(th, tw):
            try:
                check({"tile_h": th, "tile_w": tw})
                return True
            except ValueError:
                return False
        th, tw = _default_tile(ths, tws, hc, wc, cfg.CONV_ROW_PAR, fits)
        knobs = []
    else:
        raise MappingError(f"unknown fusion template {template}")
    return KnobSpace([*knobs, Knob("tile_h", tuple(ths), th), Knob("tile_w", tuple(tws), tw),
                      Knob("pipeline", (True, False), True)], check=check,
                     name="+".join(ly.name for ly in layers))


def _validate_knobs(space: KnobSpace, user: dict | None, layer: str) -> dict:
    try:
        return space.validate(user or {})
    except ValueError as e:
        raise MappingError(f"layer {layer}: {e}") from None


# --- on-chip chains ------------------------------------------------------------------------------
@dataclass
class _Window:
    """An FM-resident tensor of a chain. At step ``j`` its buffer holds rows ``[a[j], e[j])``;
    rows ``[s[j], e[j])`` are new (computed by member ``producer``, or LOADed from DDR when it is
    None), rows ``[a[j], s[j])`` are the halo kept from step ``j - 1`` (COPY)."""

    name: str
    hwc: tuple[int, int, int]
    producer: int | None
    a: list[int]
    s: list[int]
    e: list[int]

    @property
    def row_bytes(self) -> int:
        return self.hwc[1] * self.hwc[2]

    @property
    def rows(self) -> int:
        return max(e - a for a, e in zip(self.a, self.e, strict=True))


@dataclass
class _ChainPlan:
    """Row bands of an on-chip chain (see :func:`_chain_plan`)."""

    layers: list
    s: list[list[int]]  # member i computes its output rows [s[i][j], e[i][j]) at step j
    e: list[list[int]]
    reads: list[list]  # member i's input rows at step j: _in_window tuple, or None (idle)
    windows: dict[str, _Window]
    final: str  # the window the SAVEs read (the last conv's; the closing add works in place)
    place: dict[tuple[str, int], tuple[int, int]]  # (window, ping-pong half) -> (memory, address)


#: rows per LOAD / SAVE / closing ELTADD piece of a chain step (the MISC's rows per pass)
CHAIN_PIECE_ROWS = 2


def _pieces(r0: int, r1: int, split: bool = True) -> list[tuple[int, int]]:
    """Rows ``[r0, r1)`` in pieces of ``CHAIN_PIECE_ROWS`` aligned to even rows (one piece when
    not ``split``): at the boundaries of a chain in one merged stream its first input rows
    then wait only for the SAVE of the rows they read, and its last output rows reach DDR (and
    the next group) a piece at a time. Inner steps move whole bands (fewer instructions)."""
    if not split:
        return [(r0, r1)] if r1 > r0 else []
    cuts = [r0, *range((r0 // CHAIN_PIECE_ROWS + 1) * CHAIN_PIECE_ROWS, r1, CHAIN_PIECE_ROWS),
            r1]
    return [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def _chain_inputs(layers: list) -> list[list[str]]:
    return [list(ly.inputs) if isinstance(ly, AddLayer) else [ly.input] for ly in layers]


def _chain_shapes(layers: list, in_shape) -> dict[str, tuple[int, int, int, int]]:
    """NCHW shapes of the tensors a chain touches, from its input's shape."""
    shapes = {layers[0].input: tuple(in_shape)}
    for ly in layers:
        if isinstance(ly, AddLayer):
            shapes[ly.output] = shapes[ly.inputs[0] if ly.inputs[0] in shapes else ly.inputs[1]]
            for t in ly.inputs:
                shapes.setdefault(t, shapes[ly.output])
        elif isinstance(ly, PoolLayer):
            shapes[ly.output] = pool_output_shape(ly, shapes[ly.input])
        else:
            shapes[ly.output] = conv_output_shape(ly, shapes[ly.input])
    return shapes


def _chain_ends(layers: list, h_of: dict, th: int, first: int) -> list[list[int]]:
    """``e[i][j]``: the rows of member ``i`` made by the end of step ``j`` when step 0 computes
    ``first`` rows of the last layer and every later step ``th`` more, each earlier member
    exactly the rows its consumer needs by then."""
    hf = h_of[layers[-1].output]
    nb = 1 + _cdiv(max(0, hf - first), th)
    e = [[0] * nb for _ in layers]
    for j in range(nb):
        e[-1][j] = min(hf, first + j * th)
    ins = _chain_inputs(layers)
    for i in range(len(layers) - 2, -1, -1):
        h_i = h_of[layers[i].output]
        for j in range(nb):
            end = 0
            for c in range(i + 1, len(layers)):  # every consumer of member i in the chain
                nxt, need = layers[c], e[c][j]
                if layers[i].output not in ins[c]:
                    continue
                if need and not isinstance(nxt, AddLayer):
                    need = min(h_i, (need - 1) * nxt.strides[0] - nxt.padding[0]
                               + nxt.kernel[0])
                end = max(end, need)
            e[i][j] = max(e[i][j - 1] if j else 0, end)
    return e


def _chain_passes(layers: list, e: list[list[int]], cfg: DPUConfig) -> tuple[int, int]:
    """CONV row passes of a chain's bands, weighted by each conv's cycles per pass (output
    columns x channel groups x kernel taps), then the number of steps."""
    total = 0
    for i, ly in enumerate(layers):
        if isinstance(ly, ConvLayer):
            k, c = ly.weight.shape[0], ly.weight.shape[1]
            per = _cdiv(k, cfg.CONV_OC_PAR) * _cdiv(c, cfg.CONV_IC_PAR) * ly.kernel[0] \
                * ly.kernel[1]
            prev = 0
            for end in e[i]:
                total += _cdiv(end - prev, cfg.CONV_ROW_PAR) * per
                prev = end
    return total, len(e[-1])


def _chain_plan(layers: list, shapes: dict, th: int, cfg: DPUConfig) -> _ChainPlan:
    """Row bands of an on-chip chain (convs or pools, each reading the previous one's output,
    optionally closed by an add reading the last conv): step ``j`` computes ``th`` output rows
    of the last layer (the first step ``first <= th`` of them, chosen so that the lagging bands
    of the convs line up with the CONV's 8-row passes, e.g. a conv before a 3x3 pool computes
    rows 0-7, 8-15, ... while the pool lags one row behind) and, going backwards, exactly the
    rows of every earlier layer that its consumer needs by then and has not had yet. The
    H-split tiles line up across the chain with
    **halo keep**: a consumer with a ``kh``-row kernel lags its producer by the kernel's reach,
    the ``kh - stride`` rows it reads again at the next step stay in FM and are copied (MISC
    COPY) to the top of the next step's buffer instead of being recomputed. Halo keep because
    the CONV engine computes ``CONV_ROW_PAR`` = 8 rows per pass: recomputing the 2-row halo of a
    3x3 consumer on an 8-row band costs a whole extra row pass of its producer on every band
    (2x for a 1x1 producer), while keeping it costs a 2-row COPY on the otherwise idle MISC unit
    and one band of FM. The chain's input (and the add's other operand) are LOADed the same way
    (new rows from DDR, halo rows copied), so an identity shortcut is **kept on chip**: the add
    reads it from the input window the first conv read (no second DDR read). Every window is
    ping-ponged (two buffers) and the buffers are packed first-fit into the FM memories; raises
    ValueError when they do not fit or a tile exceeds the ISA fields."""
    n = len(layers)
    ins = _chain_inputs(layers)
    h_of = {t: sh[2] for t, sh in shapes.items()}
    e = min((_chain_ends(layers, h_of, th, first) for first in range(th, 0, -1)),
            key=lambda ends: _chain_passes(layers, ends, cfg))
    nb = len(e[-1])
    s = [[row[j - 1] if j else 0 for j in range(nb)] for row in e]
    reads: list[list] = []
    for i, ly in enumerate(layers):
        rd = []
        for j in range(nb):
            cnt = e[i][j] - s[i][j]
            if cnt <= 0:
                rd.append(None)
            elif isinstance(ly, AddLayer):
                rd.append((s[i][j], cnt, 0, 0))
            else:
                rd.append(_in_window(s[i][j], cnt, ly.strides[0], ly.padding[0], ly.kernel[0],
                                     h_of[ly.input]))
        reads.append(rd)
    made = {ly.output: i for i, ly in enumerate(layers)}
    names = list(dict.fromkeys(t for x in ins for t in x))
    final = layers[-1].output
    if isinstance(layers[-1], AddLayer):
        final = layers[-2].output
    else:
        names.append(final)
    windows: dict[str, _Window] = {}
    for t in names:
        readers = [i for i in range(n) if t in ins[i]]
        p = made.get(t)
        if p is not None:
            et = list(e[p])
        else:
            et, top = [], 0
            for j in range(nb):
                for i in readers:
                    if reads[i][j] is not None:
                        top = max(top, reads[i][j][0] + reads[i][j][1])
                et.append(top)
        st = [et[j - 1] if j else 0 for j in range(nb)]
        at, nxt_read = [0] * nb, {i: None for i in readers}
        for j in reversed(range(nb)):  # a: the first row any reader still needs
            for i in readers:
                if reads[i][j] is not None:
                    nxt_read[i] = reads[i][j][0]
            at[j] = min([st[j], *[r for r in nxt_read.values() if r is not None]])
        if any(at[j] < at[j - 1] for j in range(1, nb)):
            raise ValueError(f"tile_h {th}: the rows of {t} do not advance monotonically")
        _, c, h, w = shapes[t]
        windows[t] = _Window(t, (h, w, c), p, at, st, et)
    cap = cfg.fm_memory_bytes
    used = [0] * cfg.FM_MEMORIES
    place: dict[tuple[str, int], tuple[int, int]] = {}
    steps = nb * _cdiv(shapes[layers[0].input][0], cfg.NUM_PE)
    halves = (0, 1) if steps > 1 else (0,)  # one step: no ping-pong
    blocks = sorted(((w.rows * w.row_bytes, t, q) for t, w in windows.items() for q in halves),
                    reverse=True)
    for size, t, q in blocks:
        h, wd, c = windows[t].hwc
        if wd > 4095 or c > 4095 or windows[t].rows > 4095 or wd * c >= 1 << 20:
            raise ValueError(f"tile_h {th}: a band of {t} exceeds the ISA's tile fields")
        mem = next((m for m in range(cfg.FM_MEMORIES) if used[m] + size <= cap), None)
        if mem is None:
            raise ValueError(f"tile_h {th}: the chain's ping-pong band buffers "
                             f"({2 * sum(w.rows * w.row_bytes for w in windows.values())} "
                             f"bytes) do not fit the {cfg.FM_MEMORIES} FM memories")
        place[(t, q)] = (mem, used[mem])
        used[mem] += _cdiv(size, 64) * 64
    return _ChainPlan(layers, s, e, reads, windows, final, place)


def _chain_knob_space(layers: list, in_shape, cfg: DPUConfig) -> KnobSpace:
    """Knobs of an on-chip chain: ``tile_h`` (output rows of the last layer per step, multiples
    of ``CONV_ROW_PAR`` and the full height) and ``pipeline``. The bands are full width. When
    the PM holds the whole chain's parameters they stay resident; otherwise they stream (see
    :meth:`_Planner.chain`). Default: the band with the fewest CONV row passes over the chain
    (lagging bands that straddle 8-row boundaries cost extra passes), the larger one on ties,
    at most about a quarter of the height; with streamed weights the largest band that fits
    (the weights are LOADed once per step)."""
    shapes = _chain_shapes(layers, in_shape)
    convs = [ly for ly in layers if isinstance(ly, ConvLayer)]
    stream = _chain_streams_weights(convs, shapes, cfg)
    hf = shapes[layers[-1].output][2]
    ths = _options(hf, cfg.CONV_ROW_PAR)

    def check(kn):
        if stream:
            for ly in convs:
                if _chain_chunk(ly, shapes[ly.input][1], cfg) < 1:
                    raise ValueError(f"{ly.name}: the parameters of {cfg.CONV_OC_PAR} output "
                                     f"channels exceed half the PM ({cfg.PM_BYTES // 2})")
        _chain_plan(layers, shapes, kn["tile_h"], cfg)

    def passes(th: int) -> float:
        plan_ = _chain_plan(layers, shapes, th, cfg)
        total = 0
        for i, ly in enumerate(layers):
            if not isinstance(ly, ConvLayer):
                continue
            _, k, _, wo = shapes[ly.output]
            ic = 1 if ly.is_depthwise else _cdiv(shapes[ly.input][1], cfg.CONV_IC_PAR)
            per = wo * _cdiv(k, cfg.CONV_OC_PAR) * ic * ly.kernel[0] * ly.kernel[1]
            total += sum(_cdiv(b - a, cfg.CONV_ROW_PAR) * per + cfg.CONV_LATENCY_CYCLES
                         for a, b in zip(plan_.s[i], plan_.e[i], strict=True) if b > a)
        return total

    probe = KnobSpace([Knob("tile_h", tuple(ths), ths[0])], check=check)
    ok = [th for th in ths if probe.is_valid({"tile_h": th})]
    target = max(cfg.CONV_ROW_PAR, _cdiv(_cdiv(hf, 4), cfg.CONV_ROW_PAR) * cfg.CONV_ROW_PAR)
    pick = [t for t in ok if t <= target] or ok or ths
    th = min(pick, key=lambda t: (passes(t) if t in ok else 0, -t))
    if stream and ok:  # the weights stream once per step: the fewest steps
        th = max(ok)
    return KnobSpace([Knob("tile_h", tuple(ths), th), Knob("pipeline", (True, False), True)],
                     check=check, name="+".join(ly.name for ly in layers))


def _chain_streams_weights(convs: list, shapes: dict, cfg: DPUConfig) -> bool:
    """The chain's parameters exceed the PM: they stream through its two halves."""
    return sum(_pm_bytes(_param_bytes(ly, ly.weight.shape[0], shapes[ly.input][1]))
               for ly in convs) > cfg.PM_BYTES


def _chain_chunk(ly: ConvLayer, c: int, cfg: DPUConfig) -> int:
    """Output channels per streamed weight chunk of a chain conv: the chunks fit half the PM
    and are balanced (multiples of ``CONV_OC_PAR``); 0 when even one group does not fit."""
    k, par = ly.weight.shape[0], cfg.CONV_OC_PAR
    fit = [t for t in range(par, _cdiv(k, par) * par + 1, par)
           if _pm_bytes(_param_bytes(ly, t, c)) <= cfg.PM_BYTES // 2]
    if not fit:
        return 0
    n = _cdiv(k, max(fit))
    return min(max(fit), _cdiv(_cdiv(k, n), par) * par)


# --- dependency scheduling ---------------------------------------------------------------------
@dataclass
class _Tile:
    """One step of a stream: its LOADs, its computes (CONV / MISC, in order) and its SAVEs."""

    loads: list
    computes: list
    saves: list


def resolve_tokens(items: list[tuple[object, list[int]]]) -> list:
    """DPON/DPBY for a stream given as ``(instruction, [indices of earlier instructions it must
    wait for])`` in program order.

    Per ordered unit pair (A, B) the FIFO is a counting semaphore whose k-th pop matches its k-th
    push, so for every B instruction (in order) we wait for the latest A instruction it needs,
    unless an earlier B instruction already waited for that one or a later one (then B's
    in-order execution covers it): the waited-for A instructions strictly increase, each pushes
    one token, and pops equal pushes (balanced at END). Dependencies on the same unit are
    program order. Every dependency points backwards, so the stream order is a valid schedule and
    the result cannot deadlock."""
    units = [cg.UNITS[cg.unit_of(i)] for i, _ in items]
    dpon = [set() for _ in items]
    dpby = [set() for _ in items]
    mark: dict[tuple[str, str], int] = {}
    for b, (_, deps) in enumerate(items):
        ub = units[b]
        latest: dict[str, int] = {}
        for d in deps:
            if d >= b:
                raise ValueError(f"dependency {d} of instruction {b} is not earlier")
            ua = units[d]
            if ua != ub and d > latest.get(ua, -1):
                latest[ua] = d
        for ua, a in latest.items():
            if a > mark.get((ua, ub), -1):
                dpon[b].add(ua)
                dpby[a].add(ub)
                mark[(ua, ub)] = a
    out = []
    for k, (insn, _) in enumerate(items):
        insn.dpon, insn.dpby = frozenset(dpon[k]), frozenset(dpby[k])
        out.append(insn)
    return out


def _buffers(insn, pm_keys: dict[int, list], fm_keys: dict[int, tuple[list, list]]
             ) -> tuple[list, list]:
    """``(read, written)`` buffer keys of an instruction: ``("FM", mem, base address)`` and
    ``("PM", slot)``. Buffers are identified by their base address (the planner never places two
    live buffers that overlap at different bases), unless ``fm_keys[id(insn)]`` names the FM
    buffers explicitly (a chain's band windows, written and read at row offsets)."""
    if id(insn) in fm_keys:
        reads, writes = fm_keys[id(insn)]
        if isinstance(insn, cg.Conv):
            reads = [*reads, *pm_keys.get(insn.param_addr, [("PM", insn.param_addr)])]
        return list(reads), list(writes)
    if isinstance(insn, cg.Load):
        if insn.to_pm:  # a PM LOAD inside a tile (not a segment's) is its own slot
            return [], pm_keys.setdefault(insn.dst_addr, [("PM", insn.dst_addr)])
        return [], [("FM", insn.fm_mem, insn.dst_addr)]
    if isinstance(insn, cg.Save):
        return [("FM", insn.fm_mem, insn.src_addr)], []
    reads = [("FM", insn.in_mem, insn.in_addr)]
    if isinstance(insn, cg.Conv):
        reads += pm_keys.get(insn.param_addr, [("PM", insn.param_addr)])
    elif isinstance(insn, cg.EltAdd):
        reads.append(("FM", insn.b_mem, insn.b_addr))
    return reads, [("FM", insn.out_mem, insn.out_addr)]


#: a chain window's buffer is keyed as two parts (halo rows, new rows) whose rows differ from
#: step to step: a write to one part also waits for the readers of the other (write after read)
_PARTS = {"halo": "new", "new": "halo"}


class _Stream(list):
    """A scheduled stream; ``items`` keeps ``(instruction, dependencies)`` for merging."""

    items: list


def schedule(segments: list[tuple[list, list[_Tile]]], unit: str, pipeline: bool,
             pm_half: int = 1 << 30, fm_keys: dict[int, tuple[list, list]] | None = None
             ) -> list:
    """Instruction stream for segments ``(pm_loads, tiles)`` with DPON/DPBY tokens (see the
    module docstring); returns the instructions including the final END.

    Dependencies are by buffer (FM memory + base address, PM slot): an instruction waits for
    the last writer of every buffer it reads (RAW) and for the last writer and the readers since
    of every buffer it writes (WAW, WAR). So a tile's LOAD waits for the last compute that read
    its buffer, a compute for its inputs and for the SAVE (or MISC) that last read its output
    buffer, a SAVE for its compute, a PM LOAD for the last CONV of its PM slot; fused computes
    chain through FM. A PM block larger than ``pm_half`` covers both slots. A segment
    ``(pm_loads, tiles, True)`` reads what earlier SAVEs wrote to DDR: its first tile's LOAD
    waits for the last SAVE so far (in-order units make that wait for every earlier SAVE).
    ``pipeline=False`` additionally makes every tile's first LOAD wait for the previous tile's
    last SAVE (serial). ``fm_keys`` overrides the FM buffers of some instructions
    (:func:`_buffers`)."""
    fm_keys = fm_keys or {}
    items: list[tuple[object, list[int]]] = []
    writer: dict[tuple, int] = {}
    readers: dict[tuple, list[int]] = {}
    pm_keys: dict[int, list] = {}
    prev_save = None

    def add(insn, extra: list[int]) -> int:
        reads, writes = _buffers(insn, pm_keys, fm_keys)
        deps = list(extra)
        deps += [writer[k] for k in reads if k in writer]
        for k in writes:
            deps += readers.get(k, [])
            if k in writer:
                deps.append(writer[k])
            if len(k) == 3 and k[2] in _PARTS:  # the rows of the other part may overlap
                deps += readers.get((*k[:2], _PARTS[k[2]]), [])
        items.append((insn, deps))
        i = len(items) - 1
        for k in reads:
            readers.setdefault(k, []).append(i)
        for k in writes:
            writer[k] = i
            readers[k] = []
        return i

    for seg in segments:
        pm_loads, tiles = seg[0], seg[1]
        ddr_barrier = len(seg) > 2 and seg[2] and prev_save is not None
        for ld in pm_loads:
            big = ld.rows * ld.cols * ld.chans > pm_half
            pm_keys[ld.dst_addr] = ([("PM", 0), ("PM", pm_half)] if big
                                    else [("PM", ld.dst_addr)])
            add(ld, [])
        for i, t in enumerate(tiles):
            for j, ld in enumerate(t.loads):
                serial = (not pipeline or (ddr_barrier and i == 0)) and prev_save is not None \
                    and j == 0
                add(ld, [prev_save] if serial else [])
            for c in t.computes:
                add(c, [])
            for sv in t.saves:
                prev_save = add(sv, [])
    out = _Stream([*resolve_tokens(items), cg.End()])
    out.items = items
    return out


def insn_cycles(insn, cfg: DPUConfig) -> int:
    """Cycles of one instruction on its unit, the cycle model of ``sim/dpu`` (see
    :mod:`tvm_dpu.hw_config`): what :func:`list_schedule` orders the units' queues by."""
    if isinstance(insn, (cg.Load, cg.Save)):
        moved = insn.rows * insn.cols * insn.chans
        if moved == 0:
            return 1
        if not (isinstance(insn, cg.Load) and insn.to_pm):
            moved *= cfg.NUM_PE
        lat = cfg.LOAD_LATENCY_CYCLES if isinstance(insn, cg.Load) else cfg.SAVE_LATENCY_CYCLES
        return max(1, lat + int(np.ceil(moved / cfg.DDR_BYTES_PER_CYCLE)))
    if isinstance(insn, cg.Conv):
        if insn.out_h * insn.out_w * insn.oc == 0:
            return 1
        steps = (_cdiv(insn.out_h, cfg.CONV_ROW_PAR) * insn.out_w * _cdiv(insn.oc, cfg.CONV_OC_PAR)
                 * (1 if insn.depthwise else _cdiv(insn.ic, cfg.CONV_IC_PAR))
                 * insn.kernel_h * insn.kernel_w)
        return max(1, steps + cfg.CONV_LATENCY_CYCLES)
    if isinstance(insn, cg.End) or insn.out_h * insn.out_w * insn.chans == 0:
        return 1
    taps = insn.kernel_h * insn.kernel_w if isinstance(insn, cg.Pool) else 1
    steps = _cdiv(insn.out_h, cfg.MISC_ROW_PAR) * insn.out_w * _cdiv(insn.chans, cfg.MISC_CH_PAR)
    return max(1, steps * taps + cfg.MISC_LATENCY_CYCLES)


def list_schedule(items: list[tuple[object, list[int]]], groups: list[int], cfg: DPUConfig,
                  sides: list[int] | None = None, window: int = 1) -> list[int]:
    """Reorder a stream the way DPUV3INT8's scheduler fills its parallel units: list scheduling
    on the cycle model (:func:`insn_cycles`).

    ``items`` are ``(instruction, dependencies)`` in a valid program order, ``groups[i]`` the
    (non-decreasing) group of item ``i`` and ``sides[i]`` its side within the group (the two
    independent streams of a parallel pair; default 0); the dependencies must hold every
    ordering that different groups and sides need from each other. A unit keeps the order of
    each queue: a side's PM LOADs (weights), its FM LOADs (feature maps, from read-only or
    already saved DDR) and its instructions of every other unit. Among the queue heads whose
    dependencies are placed, the one that could start first (on its unit, after its
    dependencies end) comes next (ties: the shorter, then program order), where a queue of a
    younger group than the oldest with work on that unit (at most ``window`` groups younger)
    only fills a gap: its instruction must end before the oldest group's next one there could
    start. So the CONVs of a pair's conv stream run while its pool stream's CONVs wait for
    their MAXPOOLs, a band's LOAD passes the next layer's weights, and the next group's work
    fills the idle units of the current group's tail. Returns the new order (item indices);
    every dependency still points backwards."""
    n_units = len(cg.UNITS)
    sides = sides or [0] * len(items)
    unit = [cg.unit_of(insn) for insn, _ in items]
    key = [(groups[i], sides[i], isinstance(insn, cg.Load) and insn.to_pm)
           for i, (insn, _) in enumerate(items)]
    queues: list[dict[tuple, list[int]]] = [{} for _ in range(n_units)]
    for i, u in enumerate(unit):
        queues[u].setdefault(key[i], []).append(i)
    order_of = [sorted(q) for q in queues]  # queues of each unit, oldest group first
    first = [0] * n_units  # first queue of order_of[u] with work left
    head = [dict.fromkeys(q, 0) for q in queues]
    users: list[list[int]] = [[] for _ in items]
    missing = [0] * len(items)
    for i, (_, deps) in enumerate(items):
        ds = set(deps)
        missing[i] = len(ds)
        for d in ds:
            users[d].append(i)
    ready = [0] * len(items)
    free = [0] * n_units
    cost = [insn_cycles(insn, cfg) for insn, _ in items]
    pos = [-1] * len(items)

    def earliest(i: int) -> int:
        """When item ``i`` could start at the earliest (exact once its dependencies are placed;
        else a lower bound over the unplaced ones)."""
        t = max(free[unit[i]], ready[i])
        if missing[i]:
            t = max([t, *(free[unit[d]] + cost[d] for d in items[i][1] if pos[d] < 0)])
        return t

    def heads_of(u: int) -> list[int]:
        """The next instruction of every queue of unit ``u`` within the window."""
        out: list[int] = []
        for k in order_of[u][first[u]:]:
            if out and k[0] > groups[out[0]] + window:
                break
            if head[u][k] < len(queues[u][k]):
                out.append(queues[u][k][head[u][k]])
        return out
    order: list[int] = []
    for _ in range(len(items)):
        best = None
        for u in range(n_units):
            heads = heads_of(u)
            if not heads:
                continue
            oldest = min(earliest(i) for i in heads if groups[i] == groups[heads[0]])
            for i in heads:
                t = earliest(i)
                fits = groups[i] == groups[heads[0]] or t + cost[i] <= oldest
                if not missing[i] and fits and (best is None or (t, cost[i], i) < best):
                    best = (t, cost[i], i)
        start, _, i = best
        u = unit[i]
        pos[i] = len(order)
        order.append(i)
        free[u] = end = start + cost[i]
        head[u][key[i]] += 1
        while first[u] < len(order_of[u]) and \
                head[u][order_of[u][first[u]]] >= len(queues[u][order_of[u][first[u]]]):
            first[u] += 1
        for j in users[i]:
            missing[j] -= 1
            ready[j] = max(ready[j], end)
    return order


def reorder(items: list[tuple[object, list[int]]], order: list[int]
            ) -> tuple[list[tuple[object, list[int]]], list[int]]:
    """``items`` in the new ``order`` with their dependencies renumbered, and where each went."""
    where = [0] * len(items)
    for k, i in enumerate(order):
        where[i] = k
    return [(items[i][0], [where[d] for d in items[i][1]]) for i in order], where


# --- one stream per function: overlap across groups -------------------------------------------
#: groups of the merged stream whose instructions :func:`list_schedule` may interleave on a unit
#: beyond the oldest one with work left there (0: every group keeps its place)
MERGE_WINDOW = 2
_GRAIN = 64  # bytes per entry of the footprint maps (buffers and PM blocks are 64-byte aligned)


class _Footprints:
    """Last writer and last reader per unit of every ``_GRAIN`` bytes of a memory (FM memory,
    PM, or a DDR region), as of the end of the groups merged so far. An access is one byte
    range ``[lo, hi)`` or, with arrays ``lo`` / ``hi``, several (a strided DDR access); ranges
    wrap around the memory (FM and PM are circular)."""

    def __init__(self, size: int):
        self.size = max(1, size)
        n = _cdiv(self.size, _GRAIN)
        self.writer = np.full(n, -1, dtype=np.int64)
        self.reader = np.full((len(cg.UNITS), n), -1, dtype=np.int64)

    def _grains(self, lo, hi) -> np.ndarray | slice:
        """Indices of the grains the ranges touch."""
        lo = np.maximum(np.atleast_1d(np.asarray(lo, dtype=np.int64)), 0)
        hi = np.maximum(np.atleast_1d(np.asarray(hi, dtype=np.int64)), lo + 1)
        if (hi - lo >= self.size).any():
            return slice(None)
        a, b = lo % self.size, (hi - 1) % self.size + 1
        wrap = a >= b
        a, b = np.concatenate([a, np.zeros(wrap.sum(), np.int64)]), \
            np.concatenate([np.where(wrap, self.size, b), b[wrap]])
        ga, gb = a // _GRAIN, -(-b // _GRAIN)
        n = gb - ga
        if len(n) == 1:
            return slice(int(ga[0]), int(gb[0]))
        return np.repeat(ga - np.cumsum(n) + n, n) + np.arange(n.sum())

    def conflicts(self, lo, hi, write: bool) -> list[int]:
        """Earlier instructions an access of bytes ``[lo, hi)`` must wait for: the last writer
        of every byte (read after write, write after write) and, for a write, its last reader
        of every unit (write after read). Every one of them, not only the latest: once
        :func:`list_schedule` interleaves the groups, an earlier writer of part of the range
        may end after a later one."""
        g = self._grains(lo, hi)
        out = set(np.unique(self.writer[g]).tolist())
        if write:
            out.update(np.unique(self.reader[:, g]).tolist())
        out.discard(-1)
        return sorted(out)

    def last_reader(self, lo, hi, unit: int) -> list[int]:
        """The last reader of ``unit`` of bytes ``[lo, hi)``: a new read of that unit keeps
        its place after it, so the write-after-read dependencies (on the last reader per unit)
        still cover every earlier reader once :func:`list_schedule` interleaves the groups."""
        r = int(self.reader[unit, self._grains(lo, hi)].max())
        return [r] if r >= 0 else []

    def record(self, lo, hi, write: bool, unit: int, idx: int) -> None:
        g = self._grains(lo, hi)
        if write:
            self.writer[g] = idx
            self.reader[:, g] = -1
        else:
            self.reader[unit, g] = idx


def _ext(rows: int, cols: int, pix: int, row: int, last: int) -> int:
    return (max(rows, 1) - 1) * row + (max(cols, 1) - 1) * pix + last


def _ddr_ranges(insn, cfg: DPUConfig) -> tuple[np.ndarray, np.ndarray]:
    """The DDR byte ranges ``(lo, hi)`` a LOAD / SAVE touches, of every PE's image: one per
    image when its rows are contiguous, else one per row, and one per pixel when the pixels
    are channel slices of wider ones (concat inputs saved in place), so that accesses to
    different channel slices of a tensor do not wait for each other."""
    rows, cols, pix, row = insn.rows, insn.cols, insn.ddr_pix_stride, insn.ddr_row_stride
    base = insn.ddr_offset + insn.img_stride * np.arange(cfg.NUM_PE, dtype=np.int64)
    if pix != insn.chans and cols > 1:
        starts = (base[:, None, None] + row * np.arange(rows)[None, :, None]
                  + pix * np.arange(cols)[None, None, :]).reshape(-1)
        return starts, starts + insn.chans
    if row != cols * pix and rows > 1:
        starts = (base[:, None] + row * np.arange(rows)[None, :]).reshape(-1)
        return starts, starts + _ext(1, cols, pix, row, insn.chans)
    return base, base + _ext(rows, cols, pix, row, insn.chans)


def _footprint(insn, cfg: DPUConfig) -> list[tuple[tuple, int, int, bool]]:
    """``(memory, lo, hi, write)`` byte ranges an instruction touches: ``("FM", mem)``, ``("PM",)``
    or ``("DDR", region)`` (DDR: one range per PE image; only regions a SAVE may write)."""
    out = []
    if isinstance(insn, (cg.Load, cg.Save)):
        if insn.rows * insn.cols * insn.chans == 0:
            return []
        if isinstance(insn, cg.Load) and insn.to_pm:
            return [(("PM",), insn.dst_addr, insn.dst_addr + insn.rows * insn.cols * insn.chans,
                     True)]
        if insn.region in (cg.REGION_OUTPUT, cg.REGION_SWAP):
            out.append((("DDR", insn.region), *_ddr_ranges(insn, cfg), isinstance(insn, cg.Save)))
        if isinstance(insn, cg.Load):
            rows = insn.rows + insn.pad_top + insn.pad_bottom
            cols = insn.cols + insn.pad_left + insn.pad_right
            pix = insn.chans * max(1, insn.fmt)
            out.append((("FM", insn.fm_mem), insn.dst_addr, insn.dst_addr
                        + _ext(rows, cols, max(pix, insn.fm_pix_stride), insn.fm_row_stride, pix),
                        True))
        else:
            out.append((("FM", insn.fm_mem), insn.src_addr, insn.src_addr
                        + _ext(insn.rows, insn.cols, insn.fm_pix_stride, insn.fm_row_stride,
                               insn.chans), False))
        return out
    if isinstance(insn, cg.End):
        return []
    if isinstance(insn, cg.Conv):
        chans_in, chans_out = insn.ic, insn.oc
    else:
        chans_in = chans_out = insn.chans
    if isinstance(insn, (cg.Conv, cg.Pool)):
        rows = (insn.out_h - 1) * insn.stride_h + insn.kernel_h - insn.pad_top - insn.pad_bottom
        cols = (insn.out_w - 1) * insn.stride_w + insn.kernel_w - insn.pad_left - insn.pad_right
    else:  # ELTADD / COPY read what they write; UPSAMPLE reads less (counted as much)
        rows, cols = insn.out_h, insn.out_w
    out.append((("FM", insn.in_mem), insn.in_addr, insn.in_addr
                + _ext(rows, cols, insn.in_pix_stride, insn.in_row_stride, chans_in), False))
    if isinstance(insn, cg.EltAdd):
        out.append((("FM", insn.b_mem), insn.b_addr, insn.b_addr
                    + _ext(rows, cols, insn.b_pix_stride, insn.b_row_stride, chans_in), False))
    if isinstance(insn, cg.Conv):
        per = insn.kernel_h * insn.kernel_w * (1 if insn.depthwise else insn.ic)
        out.append((("PM",), insn.param_addr, insn.param_addr + insn.oc * (per + 4), False))
    out.append((("FM", insn.out_mem), insn.out_addr, insn.out_addr
                + _ext(insn.out_h, insn.out_w, insn.out_pix_stride, insn.out_row_stride,
                       chans_out), True))
    return out


def _shift(insn, fm: int, pm: int, cfg: DPUConfig, mems: tuple[int, ...] | None = None) -> None:
    """Move an instruction's FM addresses by ``fm`` and PM addresses by ``pm`` and its FM
    memory ``m`` to ``mems[m]`` (the memories are alike and circular, so a whole stream moved
    alike computes the same)."""
    m, p = cfg.fm_memory_bytes, cfg.PM_BYTES
    mems = mems or tuple(range(cfg.FM_MEMORIES))
    if isinstance(insn, cg.Load):
        insn.dst_addr = (insn.dst_addr + (pm if insn.to_pm else fm)) % (p if insn.to_pm else m)
        if not insn.to_pm:
            insn.fm_mem = mems[insn.fm_mem]
    elif isinstance(insn, cg.Save):
        insn.src_addr = (insn.src_addr + fm) % m
        insn.fm_mem = mems[insn.fm_mem]
    elif not isinstance(insn, cg.End):
        insn.in_addr = (insn.in_addr + fm) % m
        insn.out_addr = (insn.out_addr + fm) % m
        insn.in_mem, insn.out_mem = mems[insn.in_mem], mems[insn.out_mem]
        if isinstance(insn, cg.Conv):
            insn.param_addr = (insn.param_addr + pm) % p
        elif isinstance(insn, cg.EltAdd):
            insn.b_addr = (insn.b_addr + fm) % m
            insn.b_mem = mems[insn.b_mem]


#: placements :func:`_place_next` tries for the next group: shifts by this fraction of an FM
#: memory and of the PM
PLACE_STEPS = 8
#: placements with the earliest leading LOADs whose group :func:`_place_next` estimates (with
#: the half-memory shifts), over its first ``PLACE_HORIZON`` instructions
PLACE_SHORTLIST = 16
PLACE_HORIZON = 64


def _place_next(part: list, maps: dict, cfg: DPUConfig, end: np.ndarray, free: list[int]
                ) -> None:
    """Place the next group's FM buffers and PM blocks where it can start early, given when
    the earlier instructions it would wait for end (``end``, estimated on the cycle model; the
    units are free at ``free``): e.g. in an FM memory, or part of one, and the part of the
    circular PM that the previous group's last tiles do not use. Of every permutation of the
    FM memories, FM shifts by ``1 / PLACE_STEPS`` of a memory and PM shifts by
    ``1 / PLACE_STEPS`` of the PM, the ``PLACE_SHORTLIST`` whose leading LOADs (weights and
    first input bands, before the first compute) finish first and the half-memory shifts are
    estimated over the group's first ``PLACE_HORIZON`` instructions; the earliest end wins."""
    head = part[:PLACE_HORIZON]
    n_lead = next((k for k, (insn, _) in enumerate(head) if not isinstance(insn, cg.Load)),
                  len(head))
    if n_lead == 0:
        return
    ident = tuple(range(cfg.FM_MEMORIES))
    fm_step, pm_step = cfg.fm_memory_bytes // PLACE_STEPS, cfg.PM_BYTES // PLACE_STEPS
    fm_opts = [(k * fm_step, mems) for mems in itertools.permutations(ident)
               for k in range(PLACE_STEPS)]
    pm_opts = [k * pm_step for k in range(PLACE_STEPS)]

    def latest(insn, kind: str) -> int:
        """When the earlier instructions an instruction's ``kind`` (FM, PM, DDR) accesses wait
        for end."""
        t = 0
        for mm, lo, hi, w in _footprint(insn, cfg):
            if mm[0] == kind and mm in maps:
                deps = maps[mm].conflicts(lo, hi, w)
                if deps:
                    t = max(t, int(end[deps].max()))
        return t
    cache: dict[tuple, int] = {}

    def wait(k: int, fo, po) -> int:
        """The cross-group wait of instruction ``k`` of the group placed at ``(fo, po)``: its
        DDR part does not move, its FM part depends on ``fo`` only, its PM part on ``po``."""
        insn = head[k][0]
        for kind, opt in (("DDR", None), ("FM", fo), ("PM", po)):
            if (k, kind, opt) not in cache:
                moved = dataclasses.replace(insn)
                if kind == "FM":
                    _shift(moved, opt[0], 0, cfg, opt[1])
                elif kind == "PM":
                    _shift(moved, 0, opt, cfg)
                cache[(k, kind, opt)] = latest(moved, kind)
        return max(cache[(k, "DDR", None)], cache[(k, "FM", fo)], cache[(k, "PM", po)])
    dur = [insn_cycles(insn, cfg) for insn, _ in head]

    def finish(fo, po, n: int) -> int:
        """Estimated end of the group's first ``n`` instructions placed at ``(fo, po)``."""
        at = list(free)
        ends: list[int] = []
        for k, (insn, deps) in enumerate(head[:n]):
            u = cg.unit_of(insn)
            at[u] = max([at[u], wait(k, fo, po), *(ends[d] for d in deps)]) + dur[k]
            ends.append(at[u])
        return max(ends)
    options = [(fo, po) for fo in fm_opts for po in pm_opts]
    ranked = sorted(options, key=lambda o: (finish(*o, n_lead), options.index(o)))
    halves = [o for o in options if o[0][0] % (cfg.fm_memory_bytes // 2) == 0
              and o[1] % (cfg.PM_BYTES // 2) == 0]
    shortlist = list(dict.fromkeys([*ranked[:PLACE_SHORTLIST], *halves]))
    (fm, mems), pm = min(shortlist, key=lambda o: (finish(*o, len(head)), options.index(o)))
    if fm or pm or mems != ident:
        for insn, _ in part:
            _shift(insn, fm, pm, cfg, mems)


def merge_streams(layers: list[LayerProgram], parts: list[list], cfg: DPUConfig,
                  region_sizes: dict[str, int], sides: list[list[int] | None] | None = None
                  ) -> None:
    """Compile the streams of consecutive layers / fused groups into **one** instruction stream
    (DPUV3INT8's whole-network schedule), in place: ``parts[i]`` is the ``(instruction,
    dependencies)`` list of ``layers[i]`` (:func:`schedule`). Each group keeps its own
    dependencies; across groups an instruction also waits, by byte range, for the earlier
    groups' last writer of every FM / PM / DDR byte it reads or writes and for their last
    reader (per unit) of every byte it writes (:class:`_Footprints`, 64-byte grain), and
    :func:`resolve_tokens` turns all of it into one set of DPON/DPBY tokens. So the next
    group's weight LOADs (into the PM half the current group does not use) and first input
    bands (into the FM buffer its last tiles do not use) are issued while the current group's
    tail (last CONVs, SAVEs) runs, and a group's first LOAD of a tensor waits only for the
    SAVE of the rows it reads (DDR ranges per pixel for channel slices, :func:`_ddr_ranges`).
    Each group is first placed in the FM memories and the PM where it starts earliest
    (:func:`_place_next`); then :func:`list_schedule` reorders the units' queues on the cycle
    model (a band's LOAD before the next layer's weights, a parallel pair's two sides
    interleaved, the next ``MERGE_WINDOW`` groups' work in the idle gaps of the current one).
    Every dependency points backwards, so the merged stream cannot deadlock. Each layer gets
    an instruction range (``stream`` = 0, END after the last) ending after its last
    instruction, which may hold a younger group's instructions issued early, so the runtime
    reports marginal cycles per layer / group (:func:`tvm_dpu.simulator.simulate_ranges`).
    ``sides[i]`` marks the two independent sides of a parallel pair (None: one side)."""
    fm = {("FM", m): _Footprints(cfg.fm_memory_bytes) for m in range(cfg.FM_MEMORIES)}
    maps = {**fm, ("PM",): _Footprints(cfg.PM_BYTES)}
    for name, r in (("OUTPUT", cg.REGION_OUTPUT), ("SWAP", cg.REGION_SWAP)):
        maps[("DDR", r)] = _Footprints(region_sizes.get(name, 64))
    merged: list[tuple[object, list[int]]] = []
    groups: list[int] = []
    side_of: list[int] = []
    bounds = []
    end = np.zeros(sum(len(part) for part in parts), dtype=np.int64)  # estimated, in order
    free = [0] * len(cg.UNITS)
    for g, part in enumerate(parts):
        base = len(merged)
        side_of += (sides[g] if sides and sides[g] else None) or [0] * len(part)
        if base:
            _place_next(part, maps, cfg, end, free)
        prints = []
        for insn, deps in part:
            u = cg.unit_of(insn)
            fp = [(m, maps[m], lo, hi, w) for m, lo, hi, w in _footprint(insn, cfg) if m in maps]
            cross = [d for _, mp, lo, hi, w in fp for d in mp.conflicts(lo, hi, w)]
            cross += [d for m, mp, lo, hi, w in fp if not w and m[0] != "DDR"
                      for d in mp.last_reader(lo, hi, u)]
            merged.append((insn, [base + d for d in deps] + cross))
            prints.append([x[1:] for x in fp])
            groups.append(len(bounds))
            deps_all = merged[-1][1]
            free[u] = max(free[u], int(end[deps_all].max()) if deps_all else 0) \
                + insn_cycles(insn, cfg)
            end[len(merged) - 1] = free[u]
        for k, fp in enumerate(prints):
            u = cg.unit_of(merged[base + k][0])
            for mp, lo, hi, w in sorted(fp, key=lambda x: x[3]):  # reads, then writes
                mp.record(lo, hi, w, u, base + k)
        bounds.append((base, len(merged)))
    # a group's range ends after its last instruction (and holds the younger groups'
    # instructions issued before that); should a range come out empty, keep the merged order
    scheduled, where = reorder(merged, list_schedule(merged, groups, cfg, side_of, MERGE_WINDOW))
    cuts: list[int] = []
    for a, b in bounds:
        cuts.append(max(cuts[-1] + 1 if cuts else 1, max(where[a:b]) + 1))
    if cuts[-1] == len(merged):
        merged, bounds = scheduled, list(zip([0, *cuts[:-1]], cuts, strict=True))
    insns = resolve_tokens(merged)
    for i, (ly, (a, b)) in enumerate(zip(layers, bounds, strict=True)):
        body = insns[a:b] + ([cg.End()] if i == len(layers) - 1 else [])
        ly.insns, ly.n_insns, ly.stream = cg.encode_stream(body), len(body), 0


def _pool_maker(layer: PoolLayer):
    """``make(pads, **geometry) -> cg.Pool`` for a pool layer (MAXPOOL pads with -128; AVGPOOL
    needs zero points 0, one 16-bit multiplier and a 0..31 shift)."""
    kh, kw = layer.kernel
    if layer.kind == "max":
        if layer.requant is not None:
            raise MappingError(f"layer {layer.name}: a rescaling max pool is not supported")
        extra = dict(op=cg.MISC_MAXPOOL, pad_value=-128, shift=0, mult=1)
        lo, hi = -128, 127
    else:
        rq = layer.requant
        m = int(np.asarray(rq.multiplier).reshape(-1)[0])
        if (layer.input_zero_point or rq.zero_point or rq.pre_shift
                or len(set(np.asarray(rq.multiplier).reshape(-1).tolist())) != 1
                or not 1 <= m < 1 << 16 or not 0 <= rq.shift <= 31):
            raise MappingError(f"layer {layer.name}: average pool recipe does not fit "
                               "AVGPOOL (zero points 0, 16-bit mult, shift 0..31)")
        extra = dict(op=cg.MISC_AVGPOOL, pad_value=0, shift=int(rq.shift), mult=m)
        lo, hi = int(rq.qmin), int(rq.qmax)

    def make(pads, **kw_):
        return cg.Pool(**kw_, kernel_h=kh, kernel_w=kw, stride_h=layer.strides[0],
                       stride_w=layer.strides[1], pad_top=pads[0], pad_bottom=pads[1],
                       pad_left=pads[2], pad_right=pads[3], clip_lo=lo, clip_hi=hi, **extra)
    return make


def _relocate(insn, fm_off: int, pm_off: int) -> None:
    """Move an instruction's FM addresses by ``fm_off`` and PM addresses by ``pm_off``."""
    if isinstance(insn, cg.Load):
        insn.dst_addr += pm_off if insn.to_pm else fm_off
    elif isinstance(insn, cg.Save):
        insn.src_addr += fm_off
    else:
        insn.in_addr += fm_off
        insn.out_addr += fm_off
        if isinstance(insn, cg.Conv):
            insn.param_addr += pm_off
        elif isinstance(insn, cg.EltAdd):
            insn.b_addr += fm_off


# --- planning ----------------------------------------------------------------------------------
class _Planner:
    def __init__(self, graph: LayerGraph, cfg: DPUConfig, on_chip: set[str] = frozenset(),
                 views: dict[str, tuple[str, int]] | None = None):
        """``on_chip``: tensors a fused group keeps in FM (no DDR placement); ``views``: tensor ->
        (concat output, first channel) for concat inputs written in place by their producers."""
        views = views or {}
        graph, aliases = space_to_depth(graph)
        self.g, self.cfg = graph, cfg
        self.P = cfg.NUM_PE
        self.params = bytearray()
        self._pm_seq = 0
        self.tensors: dict[str, TensorPlacement] = {}
        self.region_use = {"INPUT": 0, "OUTPUT": 0, "SWAP": 0}
        for name, t in graph.tensors.items():
            if t.dtype != "int8":
                raise MappingError(f"tensor {name}: dtype {t.dtype} is not supported on the DPU "
                                   "(int8 only)")
            if len(t.shape) not in (2, 4):
                raise MappingError(f"tensor {name}: shape {t.shape} is neither NCHW nor NC")
            if name in on_chip or name in views or name in aliases:
                continue
            region = ("INPUT" if name in graph.inputs else
                      "OUTPUT" if name in graph.outputs else "SWAP")
            n_alloc = _cdiv(int(t.shape[0]), self.P) * self.P
            off = self.region_use[region]
            p = TensorPlacement(name, tuple(int(s) for s in t.shape), t.dtype, region, off,
                                n_alloc)
            self.region_use[region] = off + _cdiv(p.nbytes, 64) * 64
            self.tensors[name] = p
        for name, (whole, ch0) in views.items():
            w = self.tensors[whole]
            self.tensors[name] = TensorPlacement(name, tuple(int(x) for x in
                                                            graph.tensors[name].shape),
                                                 "int8", w.region, w.offset + ch0, w.n_alloc,
                                                 pix_stride=w.hwc[2])
        for name, base in aliases.items():  # W space-to-depth: the same bytes, reshaped
            b = self.tensors.get(base)
            if b is None or b.pix_stride:
                raise MappingError(f"tensor {base}: a space-to-depth view needs it whole in "
                                   "DDR")
            self.tensors[name] = dataclasses.replace(
                b, name=name, shape=tuple(int(x) for x in graph.tensors[name].shape))

    def _schedule(self, *args, **kw) -> list:
        """:func:`schedule`, remembering the dependency list of the last stream."""
        insns = schedule(*args, **kw)
        self.last_items, self.last_sides = insns.items, None
        return insns

    def _grid(self, t: TensorPlacement, rows: tuple[int, int], cols: tuple[int, int], th: int,
              tw: int):
        """The tiles of a stream: ``(buf, g, y0, nh, x0, nw)`` over the PE groups of ``t``, rows
        ``rows = (start, count)`` in bands of ``th`` and columns likewise by ``tw``; consecutive
        tiles alternate between the two halves of the FM memories (ping-pong buffers)."""
        half = self.cfg.fm_memory_bytes // 2
        (ys, yn), (xs, xn) = rows, cols
        i = 0
        for g in range(t.n_alloc // self.P):
            for y0 in range(ys, ys + yn, th):
                for x0 in range(xs, xs + xn, tw):
                    yield (i % 2) * half, g, y0, min(th, ys + yn - y0), x0, min(tw, xs + xn - x0)
                    i += 1

    def _param(self, data: bytes) -> int:
        off = len(self.params)
        self.params += data
        self.params += bytes((-len(self.params)) % 64)
        return off

    @staticmethod
    def _region(p: TensorPlacement) -> int:
        return REGION_NAMES.index(p.region)

    def _load(self, t: TensorPlacement, mem: int, addr: int, g: int, r0: int, rows: int, c0: int,
              cols: int, ch0: int, chans: int) -> cg.Load:
        w, c = t.hwc[1], t.pstride
        return cg.Load(fm_mem=mem, dst_addr=addr, region=self._region(t),
                       ddr_offset=t.offset + g * self.P * t.img_stride + (r0 * w + c0) * c + ch0,
                       rows=rows, cols=cols, chans=chans, ddr_pix_stride=c, ddr_row_stride=w * c,
                       fm_pix_stride=chans, fm_row_stride=cols * chans, img_stride=t.img_stride)

    def _save(self, t: TensorPlacement, addr: int, g: int, r0: int, rows: int, c0: int, cols: int,
              ch0: int, chans: int, fm_mem: int = 1) -> cg.Save:
        w, c = t.hwc[1], t.pstride
        return cg.Save(fm_mem=fm_mem, src_addr=addr, region=self._region(t),
                       ddr_offset=t.offset + g * self.P * t.img_stride + (r0 * w + c0) * c + ch0,
                       rows=rows, cols=cols, chans=chans, fm_pix_stride=chans,
                       fm_row_stride=cols * chans, ddr_pix_stride=c, ddr_row_stride=w * c,
                       img_stride=t.img_stride)

    def conv(self, layer: ConvLayer, user: dict | None) -> LayerProgram:
        tin, tout = self.tensors[layer.input], self.tensors[layer.output]
        in_shape = (tin.shape[0], tin.hwc[2], tin.hwc[0], tin.hwc[1])
        c, k, ho, wo, kh, kw = _conv_geometry(layer, in_shape)
        kn = _validate_knobs(knob_space(layer, in_shape, self.cfg), user, layer.name)

        def tail(buf, g, y0, nh, x0, nw, k0, kk):
            return [], [], [self._save(tout, buf, g, y0, nh, x0, nw, k0, kk)]
        segments = self._conv_segments(layer, tin, kn, tail, (0, ho), (0, wo))
        insns = self._schedule(segments, "CONV", kn["pipeline"], self.cfg.PM_BYTES // 2)
        n = tin.shape[0]
        dw = layer.is_depthwise
        macs = n * k * ho * wo * kh * kw * (1 if dw else c)
        op = "dense" if layer.is_dense else ("depthwise_conv2d" if dw else "conv2d")
        return LayerProgram(layer.name, op, cg.encode_stream(insns), len(insns), int(macs),
                            f"{list(in_shape)}->{[n, k, ho, wo]} k{kh}x{kw} s{layer.strides[0]}",
                            kn)

    def _conv_params(self, layer: ConvLayer, in_c: int) -> dict:
        """Folded hardware parameters of a conv (``xgraph.fold_conv``), checked for the engine."""
        try:
            folded = fold_conv(layer)
        except XGraphError as e:
            raise MappingError(str(e)) from None
        if layer.groups != 1 and not (layer.is_depthwise and layer.groups == in_c
                                      == layer.weight.shape[0]):
            raise MappingError(f"layer {layer.name}: grouped conv is not supported")
        return folded

    def _pm_chunk(self, folded: dict, k0: int, kk: int,
                  pm_addr: int | None = None) -> tuple[cg.Load, int]:
        """PM LOAD of output channels ``k0 .. k0+kk`` (int8 weights then int32 biases); without
        ``pm_addr``, chunks that fit half the PM alternate between the halves (double
        buffering), larger ones start at 0."""
        cfg = self.cfg
        block = (folded["weight"][k0:k0 + kk].astype(np.int8).tobytes()
                 + folded["bias"][k0:k0 + kk].astype("<i4").tobytes())
        rows_pm, cols_pm, chans_pm = _pm_block(len(block))
        block += bytes(rows_pm * cols_pm * chans_pm - len(block))
        poff = self._param(block)
        if pm_addr is None:
            pm_addr = 0
            if len(block) <= cfg.PM_BYTES // 2:
                pm_addr = (self._pm_seq % 2) * (cfg.PM_BYTES // 2)
                self._pm_seq += 1
        ld = cg.Load(to_pm=True, dst_addr=pm_addr, region=cg.REGION_PARAM, ddr_offset=poff,
                     rows=rows_pm, cols=cols_pm, chans=chans_pm, ddr_pix_stride=chans_pm,
                     ddr_row_stride=cols_pm * chans_pm)
        return ld, pm_addr

    def _conv_tile(self, layer: ConvLayer, tin: TensorPlacement, folded: dict, fmt: bool,
                   buf: int, g: int, k0: int, kk: int, y0: int, nh: int, x0: int, nw: int,
                   out_mem: int, out_addr: int, pm_addr: int) -> tuple[cg.Load, cg.Conv]:
        """LOAD of the input window + CONV computing output rows ``y0 .. y0+nh``, columns
        ``x0 .. x0+nw`` and channels ``k0 .. k0+kk`` into ``out_mem`` at ``out_addr``."""
        h, w, c = tin.hwc
        kh, kw = layer.kernel
        sh, sw = layer.strides
        pt, pl, _, _ = layer.padding
        rq, zx, dw = layer.requant, folded["pad_value"], layer.is_depthwise
        sub = _subsamples(layer, fmt)
        if sub:  # a strided 1x1 conv reads every sh-th row / sw-th column: the LOAD skips the rest
            (r0, rows, ptop, pbot), (c0, cols, pleft, pright) = (y0 * sh, nh, 0, 0), \
                (x0 * sw, nw, 0, 0)
        else:
            r0, rows, ptop, pbot = _in_window(y0, nh, sh, pt, kh, h)
            c0, cols, pleft, pright = _in_window(x0, nw, sw, pl, kw, w)
        if rows < 1 or cols < 1:
            raise MappingError(f"layer {layer.name}: an output tile reads padding only")
        ic, ch0 = (kk, k0) if dw else (c, 0)
        ld = self._load(tin, 0, buf, g, r0, rows, c0, cols, ch0, ic)
        if sub:
            ld.ddr_pix_stride *= sw
            ld.ddr_row_stride *= sh
            sh = sw = 1
        geo = dict(in_pix_stride=ic, in_row_stride=cols * ic, ic=ic, kernel_w=kw, pad_top=ptop,
                   pad_bottom=pbot, pad_left=pleft, pad_right=pright)
        if fmt:  # LOAD pads and gathers kw pixels: a kh x 1 conv on kw*c
            width = pleft + cols + pright
            ld.pad_top, ld.pad_bottom = ptop, pbot
            ld.pad_left, ld.pad_right = pleft, pright
            ld.pad_value, ld.fmt = zx, kw
            ld.fm_pix_stride = kw * c
            ld.fm_row_stride = width * kw * c
            geo = dict(in_pix_stride=kw * c, in_row_stride=width * kw * c, ic=kw * c,
                       kernel_w=1, pad_top=0, pad_bottom=0, pad_left=0, pad_right=0)
        conv = cg.Conv(in_mem=0, in_addr=buf, out_mem=out_mem, out_addr=out_addr,
                       out_pix_stride=kk, out_row_stride=nw * kk, out_h=nh, out_w=nw, oc=kk,
                       kernel_h=kh, stride_h=sh, stride_w=sw, pad_value=zx, param_addr=pm_addr,
                       shift=int(rq.shift), clip_lo=int(rq.qmin), clip_hi=int(rq.qmax),
                       depthwise=dw, **geo)
        return ld, conv

    def _conv_segments(self, layer: ConvLayer, tin: TensorPlacement, kn: dict, tail,
                       out_rows: tuple[int, int], out_cols: tuple[int, int]) -> list:
        """Segments (one per output-channel chunk) computing output rows ``out_rows`` =
        (start, count) and columns ``out_cols`` of ``layer`` into FM 1; ``tail(buf, g, y0, nh,
        x0, nw, k0, kk)`` returns each tile's extra LOADs, extra computes (after the CONV) and
        SAVEs."""
        k = layer.weight.shape[0]
        folded = self._conv_params(layer, tin.hwc[2])
        kt, th, tw = kn["oc_tile"], kn["tile_h"], kn["tile_w"]
        grid = list(self._grid(tin, out_rows, out_cols, th, tw))
        # one tile and several weight chunks (e.g. ResNet-50's res5 1x1 convs): the input tile
        # stays in FM (LOADed once, input-stationary), the chunks' outputs ping-pong
        stationary = len(grid) == 1 and k > kt and not layer.is_depthwise
        half = self.cfg.fm_memory_bytes // 2
        segments = []
        for i, k0 in enumerate(range(0, k, kt)):
            kk = min(kt, k - k0)
            pm, pm_addr = self._pm_chunk(folded, k0, kk)
            tiles = []
            for buf, g, y0, nh, x0, nw in grid:
                obuf = (i % 2) * half if stationary else buf
                ld, conv = self._conv_tile(layer, tin, folded, bool(kn.get("format")),
                                           buf, g, k0, kk, y0, nh, x0, nw, 1, obuf,
                                           pm_addr)
                loads, computes, saves = tail(obuf, g, y0, nh, x0, nw, k0, kk)
                first = [ld] if not stationary or i == 0 else []
                tiles.append(_Tile([*first, *loads], [conv, *computes], saves))
            segments.append(([pm], tiles))
        return segments

    def deconv(self, layer: DeconvLayer, user: dict | None) -> LayerProgram:
        """Transpose conv. ``form`` knob: ``"subconv"`` (default, the DPU paper's optimal
        implementation, Fig. 15) runs SH x SW stride-1 sub-convolutions (``deconv_subconvs``)
        whose SAVEs scatter every tile to every SH-th row / SW-th column of the output (the
        shuffle is DDR placement); ``"upsample"`` (Fig. 14) builds the zero-inserted input in
        DDR and runs one stride-1 conv with the flipped kernel (:meth:`_deconv_upsample`)."""
        tin, tout = self.tensors[layer.input], self.tensors[layer.output]
        in_shape = (tin.shape[0], tin.hwc[2], tin.hwc[0], tin.hwc[1])
        user = dict(user or {})
        form = user.pop("form", "subconv")
        unknown = sorted(set(user) - {"pipeline"})
        if form not in ("subconv", "upsample") or unknown:
            raise MappingError(f"layer {layer.name}: knobs are form (subconv | upsample) and "
                               f"pipeline; got form={form!r} {unknown or ''}".rstrip())
        pipe = bool(user.get("pipeline", True))
        if form == "upsample":
            return self._deconv_upsample(layer, pipe)
        try:
            subs = deconv_subconvs(layer, in_shape)
        except ValueError as e:
            raise MappingError(str(e)) from None
        ho, wo, k = tout.hwc
        ps = tout.pstride
        sh, sw = layer.strides
        segments, macs = [], 0
        for sc in subs:
            kn = _validate_knobs(knob_space(sc.conv, in_shape, self.cfg), {"pipeline": pipe},
                                 layer.name)
            (qh, qw), (nh_t, nw_t), (oy, ox) = sc.crop, sc.count, sc.offset

            def tail(buf, g, y0, nh, x0, nw, k0, kk, qh=qh, qw=qw, oy=oy, ox=ox):
                r = oy + sh * (y0 - qh)
                col = ox + sw * (x0 - qw)
                return [], [], [cg.Save(fm_mem=1, src_addr=buf, region=self._region(tout),
                               ddr_offset=tout.offset + g * self.P * tout.img_stride
                               + (r * wo + col) * ps + k0,
                               rows=nh, cols=nw, chans=kk, fm_pix_stride=kk,
                               fm_row_stride=nw * kk, ddr_pix_stride=sw * ps,
                               ddr_row_stride=sh * wo * ps, img_stride=tout.img_stride)]
            segments += self._conv_segments(sc.conv, tin, kn, tail, (qh, nh_t), (qw, nw_t))
            skh, skw = sc.conv.kernel
            macs += tin.shape[0] * k * nh_t * nw_t * skh * skw * in_shape[1]
        insns = self._schedule(segments, "CONV", pipe, self.cfg.PM_BYTES // 2)
        return LayerProgram(layer.name, "conv2d_transpose", cg.encode_stream(insns), len(insns),
                            int(macs), f"{list(in_shape)}->{list(tout.shape)} "
                            f"k{layer.kernel[0]}x{layer.kernel[1]} s{sh}",
                            {"form": "subconv", "pipeline": pipe})

    def _deconv_upsample(self, layer: DeconvLayer, pipe: bool) -> LayerProgram:
        """Upsample + conv form of a transpose conv, one stream in three phases: SAVEs fill a
        SWAP tensor U of ``(H-1)*SH+1`` x ``(W-1)*SW+1`` pixels with the input zero point (from
        a constant block LOADed once from PARAM, the same for every PE), LOAD/SAVE pairs
        scatter the input pixels to every SH-th row / SW-th column of U, then a stride-1 conv
        of U with the spatially flipped kernel and padding ``K-1-pad`` computes the output; its
        first LOAD waits for the last SAVE (DDR read-after-write)."""
        tin, tout = self.tensors[layer.input], self.tensors[layer.output]
        n, h, w, c = tin.shape[0], *tin.hwc
        ho, wo, k = tout.hwc
        (kh, kw), (sh, sw) = layer.kernel, layer.strides
        pt, pl, _, _ = layer.padding
        if layer.groups != 1 or tuple(layer.dilation) != (1, 1) or pt > kh - 1 or pl > kw - 1:
            raise MappingError(f"layer {layer.name}: the upsample form needs groups 1, dilation "
                               "1 and padding below the kernel size")
        hu, wu = (h - 1) * sh + 1, (w - 1) * sw + 1
        ptc, plc = kh - 1 - pt, kw - 1 - pl
        pbc, prc = max(0, ho + kh - 1 - ptc - hu), max(0, wo + kw - 1 - plc - wu)
        u = self._scratch(f"{layer.name}_zero_insert", (n, c, hu, wu))
        zx = int(layer.input_zero_point)
        half = self.cfg.fm_memory_bytes // 2
        # phase 1: fill U with the zero point, bands of rows x the full width (or a W-chunk)
        cols_f = min(wu, max(1, half // c))
        rows_f = max(1, min(hu, half // (cols_f * c)))
        block = np.full(rows_f * cols_f * c, zx, dtype=np.int8).tobytes()
        const = cg.Load(fm_mem=1, dst_addr=0, region=cg.REGION_PARAM, ddr_offset=self._param(block),
                        rows=rows_f, cols=cols_f, chans=c, ddr_pix_stride=c,
                        ddr_row_stride=cols_f * c, fm_pix_stride=c, fm_row_stride=cols_f * c,
                        img_stride=0)
        fills = [self._save(u, 0, g, y0, min(rows_f, hu - y0), x0, min(cols_f, wu - x0), 0, c)
                 for g in range(u.n_alloc // self.P) for y0 in range(0, hu, rows_f)
                 for x0 in range(0, wu, cols_f)]
        tiles = [_Tile([const], [], fills)]
        # phase 2: scatter the input, bands of input rows
        cols_s = min(w, max(1, half // c))
        rows_s = max(1, min(h, half // (cols_s * c)))
        for buf, g, y0, nh, x0, nw in self._grid(tin, (0, h), (0, w), rows_s, cols_s):
            ld = self._load(tin, 0, buf, g, y0, nh, x0, nw, 0, c)
            sv = self._save(u, buf, g, y0 * sh, nh, x0 * sw, nw, 0, c, fm_mem=0)
            sv.ddr_pix_stride, sv.ddr_row_stride = sw * c, sh * wu * c
            tiles.append(_Tile([ld], [], [sv]))
        # phase 3: the stride-1 conv of U
        wt = layer.weight.astype(np.int64)[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
        conv = ConvLayer(name=layer.name, input=u.name, output=layer.output, weight=wt,
                         bias=layer.bias, input_zero_point=zx, strides=(1, 1),
                         padding=(ptc, plc, pbc, prc), requant=layer.requant)
        u_shape = (n, c, hu, wu)
        kn = _validate_knobs(knob_space(conv, u_shape, self.cfg), {"pipeline": pipe}, layer.name)

        def tail(buf, g, y0, nh, x0, nw, k0, kk):
            return [], [], [self._save(tout, buf, g, y0, nh, x0, nw, k0, kk)]
        conv_segs = self._conv_segments(conv, u, kn, tail, (0, ho), (0, wo))
        segments = [([], tiles), *[(pm, t, j == 0) for j, (pm, t) in enumerate(conv_segs)]]
        insns = self._schedule(segments, "CONV", pipe, self.cfg.PM_BYTES // 2)
        macs = n * c * h * w * k * kh * kw  # useful MACs: every input pixel x kernel
        return LayerProgram(layer.name, "conv2d_transpose", cg.encode_stream(insns), len(insns),
                            int(macs), f"{[n, c, h, w]}->{list(tout.shape)} k{kh}x{kw} s{sh} "
                            "upsample+conv", {"form": "upsample", "pipeline": pipe})

    def _scratch(self, name: str, shape: tuple[int, int, int, int]) -> TensorPlacement:
        """A SWAP tensor the program uses internally (e.g. a zero-inserted deconv input)."""
        n_alloc = _cdiv(int(shape[0]), self.P) * self.P
        p = TensorPlacement(name, tuple(shape), "int8", "SWAP", self.region_use["SWAP"], n_alloc)
        self.region_use["SWAP"] += _cdiv(p.nbytes, 64) * 64
        self.tensors[name] = p
        return p

    def add(self, layer: AddLayer, user: dict | None) -> LayerProgram:
        cfg = self.cfg
        ta, tb = (self.tensors[x] for x in layer.inputs)
        tout = self.tensors[layer.output]
        if ta.shape != tb.shape or ta.shape != tout.shape or len(ta.shape) != 4:
            raise MappingError(f"layer {layer.name}: operands differ in shape")
        try:
            shifts = [fold_add(layer)[k] for k in ("shift_a", "shift_b")]
        except XGraphError as e:
            raise MappingError(str(e)) from None
        rq = layer.requant
        h, w, c = ta.hwc
        in_shape = (ta.shape[0], c, h, w)
        kn = _validate_knobs(knob_space(layer, in_shape, cfg), user, layer.name)
        th, tw = kn["tile_h"], kn["tile_w"]
        tiles = []
        for buf, g, y0, nh, x0, nw in self._grid(ta, (0, h), (0, w), th, tw):
            la = self._load(ta, 0, buf, g, y0, nh, x0, nw, 0, c)
            lb = self._load(tb, 2, buf, g, y0, nh, x0, nw, 0, c)
            op = cg.EltAdd(in_mem=0, in_addr=buf, in_pix_stride=c, in_row_stride=nw * c,
                           out_mem=1, out_addr=buf, out_pix_stride=c,
                           out_row_stride=nw * c, out_h=nh, out_w=nw, chans=c,
                           b_mem=2, b_addr=buf, b_pix_stride=c, b_row_stride=nw * c,
                           shift_a=shifts[0], shift_b=shifts[1], shift=int(rq.shift),
                           clip_lo=int(rq.qmin), clip_hi=int(rq.qmax))
            sv = self._save(tout, buf, g, y0, nh, x0, nw, 0, c)
            tiles.append(_Tile([la, lb], [op], [sv]))
        insns = self._schedule([([], tiles)], "MISC", kn["pipeline"])
        return LayerProgram(layer.name, "add", cg.encode_stream(insns), len(insns), 0,
                            f"{list(in_shape)}", kn)

    def _misc_tiles(self, tin: TensorPlacement, tout: TensorPlacement, layer, kn, make,
                    window=((1, 1), (1, 1), (0, 0, 0, 0)), up=(1, 1), ch0=0):
        """Tiles LOAD (input window) -> MISC ``make(...)`` -> SAVE (output tile, channel offset
        ``ch0`` of the output: concat by placement)."""
        (kh, kw), (sh, sw), (pt, pl, pb, pr) = window
        h, w, c = tin.hwc
        ho, wo = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
        th, tw = kn["tile_h"], kn["tile_w"]
        tiles = []
        for buf, g, y0, nh, x0, nw in self._grid(tin, (0, ho), (0, wo), th, tw):
            r0, rows, ptop, pbot = _in_window(y0, nh, sh, pt, kh, h)
            c0, cols, pleft, pright = _in_window(x0, nw, sw, pl, kw, w)
            ld = self._load(tin, 0, buf, g, r0, rows, c0, cols, 0, c)
            oh, ow = nh * up[0], nw * up[1]
            op = make(in_mem=0, in_addr=buf, in_pix_stride=c, in_row_stride=cols * c,
                      out_mem=1, out_addr=buf, out_pix_stride=c, out_row_stride=ow * c,
                      out_h=oh, out_w=ow, chans=c,
                      pads=(ptop, pbot, pleft, pright))
            sv = self._save(tout, buf, g, y0 * up[0], oh, x0 * up[1], ow, ch0, c)
            tiles.append(_Tile([ld], [op], [sv]))
        return tiles

    def pool(self, layer: PoolLayer, user: dict | None) -> LayerProgram:
        tin, tout = self.tensors[layer.input], self.tensors[layer.output]
        h, w, c = tin.hwc
        in_shape = (tin.shape[0], c, h, w)
        kn = _validate_knobs(knob_space(layer, in_shape, self.cfg), user, layer.name)
        kh, kw = layer.kernel
        make = _pool_maker(layer)
        tiles = self._misc_tiles(tin, tout, layer, kn, make,
                                 (layer.kernel, layer.strides, layer.padding))
        insns = self._schedule([([], tiles)], "MISC", kn["pipeline"])
        return LayerProgram(layer.name, layer.op_name, cg.encode_stream(insns), len(insns), 0,
                            f"{list(in_shape)} k{kh}x{kw} s{layer.strides[0]}", kn)

    def upsample(self, layer: UpsampleLayer, user: dict | None) -> LayerProgram:
        tin, tout = self.tensors[layer.input], self.tensors[layer.output]
        h, w, c = tin.hwc
        in_shape = (tin.shape[0], c, h, w)
        if layer.requant is not None:
            raise MappingError(f"layer {layer.name}: a rescaling upsample is not supported")
        kn = _validate_knobs(knob_space(layer, in_shape, self.cfg), user, layer.name)
        fh, fw = layer.scale

        def make(pads, **kw_):
            return cg.Upsample(**kw_, factor_h=fh, factor_w=fw)
        tiles = self._misc_tiles(tin, tout, layer, kn, make, up=(fh, fw))
        insns = self._schedule([([], tiles)], "MISC", kn["pipeline"])
        return LayerProgram(layer.name, "upsample", cg.encode_stream(insns), len(insns), 0,
                            f"{list(in_shape)} x{fh}x{fw}", kn)

    def concat(self, layer: ConcatLayer, user: dict | None) -> LayerProgram:
        """Concat by placement: every input is copied tile by tile into its channel range of
        the output (SAVE with the output's pixel stride and a channel offset)."""
        tout = self.tensors[layer.output]
        if layer.axis != 1 or any(rq is not None for rq in layer.requants):
            raise MappingError(f"layer {layer.name}: only channel concat of identically "
                               "quantized inputs is supported")
        segments, ch0, kn0 = [], 0, None
        for name in layer.inputs:
            tin = self.tensors[name]
            h, w, c = tin.hwc
            kn = _validate_knobs(knob_space(PoolLayer(layer.name, name, layer.output, "max",
                                                      (1, 1), (1, 1), (0, 0, 0, 0)),
                                            (tin.shape[0], c, h, w), self.cfg),
                                 user, layer.name)
            kn0 = kn0 or kn

            def make(pads, **kw_):
                return cg.Copy(**kw_)
            segments.append(([], self._misc_tiles(tin, tout, layer, kn, make, ch0=ch0)))
            ch0 += c
        insns = self._schedule(segments, "MISC", kn0["pipeline"])
        return LayerProgram(layer.name, "concat", cg.encode_stream(insns), len(insns), 0,
                            f"{len(layer.inputs)} inputs -> {list(tout.shape)}", kn0)


    # --- fused groups (tvm_dpu.fusion templates) -------------------------------------------------
    def layer(self, layer, user: dict | None) -> LayerProgram:
        """The stream of one layer on its own."""
        for kind, fn in ((ConvLayer, self.conv), (AddLayer, self.add), (PoolLayer, self.pool),
                         (DeconvLayer, self.deconv), (UpsampleLayer, self.upsample),
                         (ConcatLayer, self.concat)):
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

    def chain(self, layers: list, user: dict | None) -> LayerProgram:
        """An on-chip chain (DPUV3INT8): convs each reading the previous one's output, optionally
        closed by an add or a pool, run band by band (:func:`_chain_plan`). When the PM holds
        all the chain's weights they are LOADed once (the first conv's at the head, the others
        behind the first input band, so they overlap the first CONVs); otherwise (e.g. a
        ResNet-50 res4 / res5 bottleneck, 1.1 / 4.5 MB) they **stream**: every conv's weights
        are cut into output-channel chunks that fit half the PM, LOADed into the two halves in
        turn (double buffering: chunk i+2 waits for the CONV of chunk i) once per step, each
        chunk's CONV writing its channel slice of the output band. Per step: LOAD the new rows
        of the chain's input (and of the add's other operand when that is not the input), one
        CONV per conv (or chunk) computing its new rows from its producer's window into its
        own, MAXPOOL / AVGPOOL likewise on MISC, each window's halo rows COPYed to the top of
        its next buffer, ELTADD in place, SAVE the last layer's rows. Only the chain's input,
        the add's other operand, its output (and streamed weights) move over DDR."""
        name = "+".join(ly.name for ly in layers)
        x = layers[0].input
        shapes = {t: tuple(int(v) for v in self.g.tensors[t].shape)
                  for ly in layers for t in [*_chain_inputs([ly])[0], ly.output]}
        if any(len(sh) != 4 for sh in shapes.values()):
            raise MappingError(f"{name}: an on-chip chain needs NCHW tensors")
        for ly in layers:
            if isinstance(ly, AddLayer):
                if len({shapes[t] for t in (*ly.inputs, ly.output)}) != 1:
                    raise MappingError(f"{name}: the add operands differ in shape")
            elif isinstance(ly, PoolLayer):
                if (ly is layers[0] or max(ly.kernel) > 15 or max(ly.strides) > 7
                        or max(ly.padding) > 15
                        or pool_output_shape(ly, shapes[ly.input]) != shapes[ly.output]):
                    raise MappingError(f"{name}: {ly.name} cannot run in an on-chip chain")
            elif (ly.is_dense or ly.kernel[0] > 15 or ly.kernel[1] > 15
                  or conv_output_shape(ly, shapes[ly.input]) != shapes[ly.output]):
                raise MappingError(f"{name}: {ly.name} cannot run in an on-chip chain")
        kn = _validate_knobs(_chain_knob_space(layers, shapes[x], self.cfg), user, name)
        try:
            cp = _chain_plan(layers, shapes, kn["tile_h"], self.cfg)
        except ValueError as e:
            raise MappingError(f"{name}: {e}") from None
        convs = [ly for ly in layers if isinstance(ly, ConvLayer)]
        stream = _chain_streams_weights(convs, shapes, self.cfg)
        pms, params, pm_at, chunks = [], {}, 0, {}
        for ly in layers:
            if isinstance(ly, ConvLayer) and stream:
                folded = self._conv_params(ly, shapes[ly.input][1])
                k, kt = ly.weight.shape[0], _chain_chunk(ly, shapes[ly.input][1], self.cfg)
                chunks[ly.name] = [(k0, min(kt, k - k0),
                                    self._pm_chunk(folded, k0, min(kt, k - k0), pm_addr=0)[0])
                                   for k0 in range(0, k, kt)]
                params[ly.name] = (folded, None)
            elif isinstance(ly, ConvLayer):
                folded = self._conv_params(ly, shapes[ly.input][1])
                ld, addr = self._pm_chunk(folded, 0, ly.weight.shape[0], pm_addr=pm_at)
                pm_at += ld.rows * ld.cols * ld.chans
                pms.append(ld)
                params[ly.name] = (folded, addr)
            elif isinstance(ly, PoolLayer):
                params[ly.name] = _pool_maker(ly)
            else:
                try:
                    params[ly.name] = fold_add(ly)
                except XGraphError as e:
                    raise MappingError(str(e)) from None
        if pm_at > self.cfg.PM_BYTES:
            raise MappingError(f"{name}: the chain's parameters ({pm_at} bytes) exceed the PM")
        keys: dict[int, tuple[list, list]] = {}
        tout = self.tensors[layers[-1].output]
        nb = len(cp.e[-1])
        groups = tout.n_alloc // self.P
        half = self.cfg.PM_BYTES // 2
        seq = [chunks[ly.name][ci][2] for _ in range(groups) for j in range(nb)
               for i, ly in enumerate(layers) if ly.name in chunks and cp.reads[i][j] is not None
               for ci in range(len(chunks[ly.name]))]
        stream_loads = [dataclasses.replace(ld, dst_addr=(u % 2) * half)
                        for u, ld in enumerate(seq)]
        tiles, step, uses, prev = [], 0, [0], None
        for g in range(groups):
            for j in range(nb):
                part = self._chain_step(cp, params, keys, g, j, step % 2, chunks,
                                        (uses, stream_loads))
                if prev is not None and len(prev) > 1:
                    # streamed weights: this step's input bands are LOADed during the previous
                    # step (after its first CONV), not behind its last weight chunks
                    bands = [ld for ld in part[0].loads if not ld.to_pm]
                    part[0].loads = [ld for ld in part[0].loads if ld.to_pm]
                    prev[1].loads += bands
                tiles += part
                prev = part
                step += 1
        tiles[0].loads += pms[1:]  # later convs' weights load behind the first input band
        # streamed: the first chunk in each PM half leads (in one merged stream they load
        # during the previous group's tail, ahead of the input bands that wait for its SAVEs)
        tiles[0].loads[:0] = stream_loads[:2]
        insns = self._schedule([(pms[:1], tiles)], "CONV", kn["pipeline"], fm_keys=keys)
        n = shapes[x][0]
        macs = sum(n * ly.weight.shape[0] * shapes[ly.output][2] * shapes[ly.output][3]
                   * ly.kernel[0] * ly.kernel[1] * (1 if ly.is_depthwise else shapes[ly.input][1])
                   for ly in layers if isinstance(ly, ConvLayer))
        ops = "+".join(ly.op_name for ly in layers)
        return LayerProgram(name, f"{ops} (on-chip chain)", cg.encode_stream(insns), len(insns),
                            int(macs), f"{list(shapes[x])}->{list(tout.shape)} {len(layers)} "
                            f"layers, bands of {kn['tile_h']} rows", kn)

    def _chain_step(self, cp: _ChainPlan, params: dict, keys: dict, g: int, j: int,
                    q: int, chunks: dict | None = None, streamed: tuple | None = None
                    ) -> list[_Tile]:
        """The instructions of step ``j`` of image group ``g`` of a chain, in ping-pong half
        ``q``; records each instruction's FM buffers in ``keys``: a window's buffer is two
        buffers for the dependencies, its halo rows and its new rows, so the COPY of the halo
        and the producer of the new rows do not wait for each other. The halo COPY of step
        ``j + 1`` is issued right after the producer of step ``j`` (it reads the rows just
        made), ahead of the MISC work of step ``j`` that the next CONVs do not need.
        Streamed weights (``chunks``, ``streamed`` = (use counter, the chain's PM LOADs in use
        order)): use ``u`` reads PM half ``u % 2``; the LOAD of use ``u + 2`` follows the CONV
        of use ``u`` in program order (it starts a new tile), so it waits for that CONV to be
        done with the half (write after read)."""
        loads, computes, saves = [], [], []
        out = [_Tile(loads, computes, [])]
        nb = len(cp.e[-1])

        def at(t: str, row: int) -> tuple[int, int]:
            w = cp.windows[t]
            mem, base = cp.place[(t, q)]
            return mem, base + (row - w.a[j]) * w.row_bytes

        def rows_keys(t: str, r0: int, r1: int, jj: int, qq: int) -> list:
            w = cp.windows[t]
            return ([(t, qq, "halo")] if r0 < w.s[jj] else []) + \
                ([(t, qq, "new")] if r1 > w.s[jj] else [])

        def next_halo(t: str) -> None:
            w = cp.windows[t]
            if j + 1 >= nb or w.a[j + 1] >= w.s[j + 1]:
                return
            h, wd, c = w.hwc
            mem_s, base_s = cp.place[(t, q)]
            mem_d, base_d = cp.place[(t, 1 - q)]
            op = cg.Copy(in_mem=mem_s, in_addr=base_s + (w.a[j + 1] - w.a[j]) * w.row_bytes,
                         in_pix_stride=c, in_row_stride=wd * c, out_mem=mem_d,
                         out_addr=base_d, out_pix_stride=c, out_row_stride=wd * c,
                         out_h=w.s[j + 1] - w.a[j + 1], out_w=wd, chans=c)
            keys[id(op)] = (rows_keys(t, w.a[j + 1], w.s[j + 1], j, q), [(t, 1 - q, "halo")])
            computes.append(op)

        last, sliced = len(cp.layers) - 1, False
        edge = j in (0, nb - 1)  # a boundary step of the chain: its input / output in pieces

        def eltadd(i: int, s0: int, cnt: int, ch0: int, nch: int | None) -> cg.EltAdd:
            """The closing add of rows ``s0 .. s0+cnt``, channels ``ch0 .. ch0+nch`` (all:
            None), in place in the window of the member before it."""
            ly = cp.layers[i]
            chained = cp.layers[i - 1].output
            (ma, aa), (mb, ba) = at(ly.inputs[0], s0), at(ly.inputs[1], s0)
            mo, ao = at(chained, s0)
            _, wd, c = cp.windows[chained].hwc
            rq = ly.requant
            op = cg.EltAdd(in_mem=ma, in_addr=aa + ch0, in_pix_stride=c, in_row_stride=wd * c,
                           out_mem=mo, out_addr=ao + ch0, out_pix_stride=c,
                           out_row_stride=wd * c, out_h=cnt, out_w=wd,
                           chans=c if nch is None else nch, b_mem=mb, b_addr=ba + ch0,
                           b_pix_stride=c, b_row_stride=wd * c,
                           shift_a=params[ly.name]["shift_a"],
                           shift_b=params[ly.name]["shift_b"], shift=int(rq.shift),
                           clip_lo=int(rq.qmin), clip_hi=int(rq.qmax))
            if nch is None:  # a row piece: its rows are its own buffer for the SAVE of them
                keys[id(op)] = ([k for t in ly.inputs for k in rows_keys(t, s0, s0 + cnt, j, q)],
                                [(chained, q, "new", "rows", s0)])
            else:  # a channel slice is its own buffer: the next chunk's CONV does not wait
                part = [(chained, q, "new", ch0)]
                keys[id(op)] = ([k for t in ly.inputs if t != chained
                                 for k in rows_keys(t, s0, s0 + cnt, j, q)] + part, part)
            return op

        def save_rows(r0: int, r1: int, ch0: int, nch: int | None) -> list:
            """SAVEs of the chain's output rows ``r0 .. r1``, channels ``ch0 .. ch0+nch``."""
            w, out_ = cp.windows[cp.final], []
            _, wd, c = w.hwc
            for s0, e0 in _pieces(r0, r1, edge):
                mem, addr = at(cp.final, s0)
                sv = self._save(self.tensors[cp.layers[-1].output], addr + ch0, g, s0, e0 - s0,
                                0, wd, ch0, c if nch is None else nch, fm_mem=mem)
                sv.fm_pix_stride, sv.fm_row_stride = c, wd * c
                if nch is not None:
                    reads = [(cp.final, q, "new", ch0)]
                elif isinstance(cp.layers[last], AddLayer):  # after the ELTADD of its rows
                    reads = [*rows_keys(cp.final, s0, e0, j, q), (cp.final, q, "new", "rows", s0)]
                else:
                    reads = rows_keys(cp.final, s0, e0, j, q)
                keys[id(sv)] = (reads, [])
                out_.append(sv)
            return out_

        for t, w in cp.windows.items():
            if w.producer is None and w.e[j] > w.s[j]:
                h, wd, c = w.hwc
                for r0, r1 in _pieces(w.s[j], w.e[j], edge):
                    mem, addr = at(t, r0)
                    ld = self._load(self.tensors[t], mem, addr, g, r0, r1 - r0, 0, wd, 0, c)
                    keys[id(ld)] = ([], [(t, q, "new")])
                    loads.append(ld)
        for t, w in cp.windows.items():
            if w.producer is None:
                next_halo(t)
        for i, ly in enumerate(cp.layers):
            rd = cp.reads[i][j]
            if rd is None:
                continue
            s0, cnt = cp.s[i][j], cp.e[i][j] - cp.s[i][j]
            if isinstance(ly, AddLayer):
                if not sliced:
                    for a, b in _pieces(s0, s0 + cnt, edge):
                        computes.append(eltadd(i, a, b - a, 0, None))
                continue
            if isinstance(ly, PoolLayer):
                r0, nr, ptop, pbot = rd
                _, wi, ci = cp.windows[ly.input].hwc
                _, wo, c = cp.windows[ly.output].hwc
                _, _, pleft, pright = _in_window(0, wo, ly.strides[1], ly.padding[1],
                                                 ly.kernel[1], wi)
                (mi, ai), (mo, ao) = at(ly.input, r0), at(ly.output, s0)
                op = params[ly.name](pads=(ptop, pbot, pleft, pright), in_mem=mi, in_addr=ai,
                                     in_pix_stride=ci, in_row_stride=wi * ci, out_mem=mo,
                                     out_addr=ao, out_pix_stride=c, out_row_stride=wo * c,
                                     out_h=cnt, out_w=wo, chans=c)
                keys[id(op)] = (rows_keys(ly.input, r0, r0 + nr, j, q), [(ly.output, q, "new")])
                computes.append(op)
                if ly.output in cp.windows and ly.output != cp.final:
                    next_halo(ly.output)
                continue
            folded, pm_addr = params[ly.name]
            r0, nr, ptop, pbot = rd
            _, wi, ci = cp.windows[ly.input].hwc
            _, wo, k = cp.windows[ly.output].hwc
            _, _, pleft, pright = _in_window(0, wo, ly.strides[1], ly.padding[1], ly.kernel[1],
                                             wi)
            mi, ai = at(ly.input, r0)
            mo, ao = at(ly.output, s0)
            rq = ly.requant
            parts = [(0, k, None)]
            if chunks and ly.name in chunks:  # streamed weights: one chunk per PM half in turn
                parts = [(k0, kk, None) for k0, kk, _ in chunks[ly.name]]
            # the chunks of the conv a closing add works on in place: each chunk's channels are
            # added and SAVEd as soon as its CONV is done (a short tail for the next group)
            closes = (isinstance(cp.layers[last], AddLayer) and i == last - 1
                      and cp.e[last][j] > cp.s[last][j])
            for k0, kk, addr in parts:
                use = None
                if chunks and ly.name in chunks:
                    use = streamed[0][0]
                    streamed[0][0] += 1
                    addr = streamed[1][use].dst_addr
                dw = ly.is_depthwise
                cv = cg.Conv(in_mem=mi, in_addr=ai + (k0 if dw else 0), in_pix_stride=ci,
                             in_row_stride=wi * ci, ic=kk if dw else ci, out_mem=mo,
                             out_addr=ao + k0, out_pix_stride=k, out_row_stride=wo * k,
                             out_h=cnt, out_w=wo, oc=kk, kernel_h=ly.kernel[0],
                             kernel_w=ly.kernel[1], stride_h=ly.strides[0],
                             stride_w=ly.strides[1], pad_top=ptop, pad_bottom=pbot,
                             pad_left=pleft, pad_right=pright,
                             pad_value=folded["pad_value"],
                             param_addr=pm_addr if addr is None else addr,
                             shift=int(rq.shift), clip_lo=int(rq.qmin), clip_hi=int(rq.qmax),
                             depthwise=dw)
                keys[id(cv)] = (rows_keys(ly.input, r0, r0 + nr, j, q),
                                [(ly.output, q, "new", k0) if closes and len(parts) > 1
                                 else (ly.output, q, "new")])
                computes.append(cv)
                if closes and len(parts) > 1:  # add and SAVE this chunk's channels now
                    sliced = True
                    computes.append(eltadd(last, s0, cnt, k0, kk))
                    out[-1].saves.extend(save_rows(s0, s0 + cnt, k0, kk))
                if use is not None and use + 2 < len(streamed[1]):
                    computes = []
                    out.append(_Tile([streamed[1][use + 2]], computes, []))
            if ly.output in cp.windows and ly.output != cp.final:
                next_halo(ly.output)
        if cp.e[last][j] > cp.s[last][j] and not sliced:
            saves += save_rows(cp.s[last][j], cp.e[last][j], 0, None)
        out[-1].saves.extend(saves)
        return out

    def pool_conv(self, pool: PoolLayer, conv: ConvLayer, user: dict | None) -> LayerProgram:
        """pool+conv: per conv output tile, LOAD the input window the pool windows read, MISC
        pools it into FM 1, CONV reads it there (padding by the CONV's pad fields) into FM 2,
        SAVE."""
        tin, tout = self.tensors[pool.input], self.tensors[conv.output]
        in_shape = self._in_shape(pool.input)
        n, c, h, w = in_shape
        _, _, hp, wp = pool_output_shape(pool, in_shape)
        p_shape = (n, c, hp, wp)
        _, k, ho, wo, kh, kw = _conv_geometry(conv, p_shape)
        name = f"{pool.name}+{conv.name}"
        if conv.is_depthwise or conv.groups != 1:
            raise MappingError(f"{name}: pool+conv needs a dense conv")
        kn = _validate_knobs(fused_knob_space("pool+conv", [pool, conv], in_shape, self.cfg),
                             user, name)
        folded = self._conv_params(conv, c)
        make = _pool_maker(pool)
        (pkh, pkw), (psh, psw), (ppt, ppl, _, _) = pool.kernel, pool.strides, pool.padding
        sh, sw = conv.strides
        pt, pl, _, _ = conv.padding
        rq, zx = conv.requant, folded["pad_value"]
        kt, th, tw = kn["oc_tile"], kn["tile_h"], kn["tile_w"]
        segments = []
        for k0 in range(0, k, kt):
            kk = min(kt, k - k0)
            pm, pm_addr = self._pm_chunk(folded, k0, kk)
            tiles = []
            for buf, g, y0, nh, x0, nw in self._grid(tin, (0, ho), (0, wo), th, tw):
                q0, rows, ctop, cbot = _in_window(y0, nh, sh, pt, kh, hp)
                r0, in_rows, ptop, pbot = _in_window(q0, rows, psh, ppt, pkh, h)
                p0, cols, cleft, cright = _in_window(x0, nw, sw, pl, kw, wp)
                c0, in_cols, pleft, pright = _in_window(p0, cols, psw, ppl, pkw, w)
                ld = self._load(tin, 0, buf, g, r0, in_rows, c0, in_cols, 0, c)
                op = make(pads=(ptop, pbot, pleft, pright), in_mem=0, in_addr=buf,
                          in_pix_stride=c, in_row_stride=in_cols * c, out_mem=1,
                          out_addr=buf, out_pix_stride=c, out_row_stride=cols * c,
                          out_h=rows, out_w=cols, chans=c)
                cv = cg.Conv(in_mem=1, in_addr=buf, in_pix_stride=c,
                             in_row_stride=cols * c, ic=c, out_mem=2, out_addr=buf,
                             out_pix_stride=kk, out_row_stride=nw * kk, out_h=nh,
                             out_w=nw, oc=kk, kernel_h=kh, kernel_w=kw, stride_h=sh,
                             stride_w=sw, pad_top=ctop, pad_bottom=cbot,
                             pad_left=cleft, pad_right=cright, pad_value=zx,
                             param_addr=pm_addr, shift=int(rq.shift),
                             clip_lo=int(rq.qmin), clip_hi=int(rq.qmax))
                sv = self._save(tout, buf, g, y0, nh, x0, nw, k0, kk, fm_mem=2)
                tiles.append(_Tile([ld], [op, cv], [sv]))
            segments.append(([pm], tiles))
        insns = self._schedule(segments, "CONV", kn["pipeline"], self.cfg.PM_BYTES // 2)
        macs = n * k * ho * wo * kh * kw * c
        return LayerProgram(name, f"{pool.op_name}+{conv.op_name}", cg.encode_stream(insns),
                            len(insns), int(macs), f"{list(in_shape)}->{list(tout.shape)} "
                            f"pool{pkh}x{pkw} k{kh}x{kw}", kn)

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
        dependency lists are merged by :func:`list_schedule` and turned into one set of tokens."""
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

    def _in_shape(self, name: str) -> tuple[int, int, int, int]:
        t = self.tensors[name]
        return (t.shape[0], t.hwc[2], t.hwc[0], t.hwc[1])

    def conv_pool(self, conv: ConvLayer, pool: PoolLayer, template: str,
                  user: dict | None) -> LayerProgram:
        """conv+pool: per pool output tile, LOAD the conv input window, CONV the conv rows the
        pool windows read into FM 1, MAXPOOL/AVGPOOL them into FM 2, SAVE."""
        tin, tout = self.tensors[conv.input], self.tensors[pool.output]
        in_shape = self._in_shape(conv.input)
        c, k, hc, wc, kh, kw = _conv_geometry(conv, in_shape)
        name = f"{conv.name}+{pool.name}"
        space = fused_knob_space(template, [conv, pool], in_shape, self.cfg)
        if user and "halo" in space and "halo" not in user and not space.is_valid(user):
            user = {**user, "halo": "recompute"}  # knobs of the recompute form (e.g. a W-split)
        kn = _validate_knobs(space, user, name)
        if kn.get("halo") == "keep":
            prog = self.chain([conv, pool], {"tile_h": kn["tile_h"],
                                             "pipeline": kn["pipeline"]})
            return dataclasses.replace(prog, op=f"{conv.op_name}+{pool.op_name}", knobs=kn)
        folded = self._conv_params(conv, c)
        make = _pool_maker(pool)
        (pkh, pkw), (psh, psw), (ppt, ppl, _, _) = pool.kernel, pool.strides, pool.padding
        _, _, ho, wo = pool_output_shape(pool, (in_shape[0], k, hc, wc))
        kt, th, tw = kn["oc_tile"], kn["tile_h"], kn["tile_w"]
        segments = []
        for k0 in range(0, k, kt):
            kk = min(kt, k - k0)
            pm, pm_addr = self._pm_chunk(folded, k0, kk)
            tiles = []
            for buf, g, y0, nh, x0, nw in self._grid(tin, (0, ho), (0, wo), th, tw):
                r0, rows, ptop, pbot = _in_window(y0, nh, psh, ppt, pkh, hc)
                c0, cols, pleft, pright = _in_window(x0, nw, psw, ppl, pkw, wc)
                ld, cv = self._conv_tile(conv, tin, folded, bool(kn["format"]), buf, g,
                                         k0, kk, r0, rows, c0, cols, 1, buf, pm_addr)
                op = make(pads=(ptop, pbot, pleft, pright), in_mem=1, in_addr=buf,
                          in_pix_stride=kk, in_row_stride=cols * kk, out_mem=2,
                          out_addr=buf, out_pix_stride=kk, out_row_stride=nw * kk,
                          out_h=nh, out_w=nw, chans=kk)
                sv = self._save(tout, buf, g, y0, nh, x0, nw, k0, kk, fm_mem=2)
                tiles.append(_Tile([ld], [cv, op], [sv]))
            segments.append(([pm], tiles))
        insns = self._schedule(segments, "CONV", kn["pipeline"], self.cfg.PM_BYTES // 2)
        macs = in_shape[0] * k * hc * wc * kh * kw * (1 if conv.is_depthwise else c)
        return LayerProgram(name, f"{conv.op_name}+{pool.op_name}", cg.encode_stream(insns),
                            len(insns), int(macs),
                            f"{list(in_shape)}->{list(tout.shape)} k{kh}x{kw} "
                            f"pool{pkh}x{pkw}", kn)

    def conv_add(self, conv: ConvLayer, add: AddLayer, user: dict | None) -> LayerProgram:
        """conv+add: per conv output tile, LOAD the conv input window and the other operand's
        tile (FM 2), CONV into FM 1, ELTADD in place in FM 1, SAVE."""
        tin, tout = self.tensors[conv.input], self.tensors[add.output]
        idx = add.inputs.index(conv.output)
        tb = self.tensors[add.inputs[1 - idx]]
        in_shape = self._in_shape(conv.input)
        c, k, ho, wo, kh, kw = _conv_geometry(conv, in_shape)
        name = f"{conv.name}+{add.name}"
        if tb.hwc != (ho, wo, k) or tout.hwc != (ho, wo, k):
            raise MappingError(f"{name}: the add operands differ in shape")
        try:
            shifts = [fold_add(add)[x] for x in ("shift_a", "shift_b")]
        except XGraphError as e:
            raise MappingError(str(e)) from None
        kn = _validate_knobs(fused_knob_space("conv+add", [conv, add], in_shape, self.cfg), user,
                             name)
        rq = add.requant

        def tail(buf, g, y0, nh, x0, nw, k0, kk):
            lb = self._load(tb, 2, buf, g, y0, nh, x0, nw, k0, kk)
            (ma, aa), (mb, ba) = [(1, buf), (2, buf)][:: 1 if idx == 0 else -1]
            op = cg.EltAdd(in_mem=ma, in_addr=aa, in_pix_stride=kk, in_row_stride=nw * kk,
                           out_mem=1, out_addr=buf, out_pix_stride=kk, out_row_stride=nw * kk,
                           out_h=nh, out_w=nw, chans=kk, b_mem=mb, b_addr=ba, b_pix_stride=kk,
                           b_row_stride=nw * kk, shift_a=shifts[0], shift_b=shifts[1],
                           shift=int(rq.shift), clip_lo=int(rq.qmin), clip_hi=int(rq.qmax))
            return [lb], [op], [self._save(tout, buf, g, y0, nh, x0, nw, k0, kk)]
        segments = self._conv_segments(conv, tin, kn, tail, (0, ho), (0, wo))
        insns = self._schedule(segments, "CONV", kn["pipeline"], self.cfg.PM_BYTES // 2)
        macs = in_shape[0] * k * ho * wo * kh * kw * (1 if conv.is_depthwise else c)
        return LayerProgram(name, f"{conv.op_name}+add", cg.encode_stream(insns), len(insns),
                            int(macs),
                            f"{list(in_shape)}->{list(tout.shape)} k{kh}x{kw} "
                            f"s{conv.strides[0]} +add", kn)

    def conv_horizontal(self, convs: list[ConvLayer], user: dict | None) -> LayerProgram:
        """Horizontal fusion: convs of one geometry on the same input; every input tile is
        loaded once and feeds one CONV per conv (all weights resident in the PM)."""
        tin = self.tensors[convs[0].input]
        in_shape = self._in_shape(convs[0].input)
        name = "+".join(ly.name for ly in convs)
        kn = _validate_knobs(fused_knob_space("horizontal", convs, in_shape, self.cfg), user,
                             name)
        c, _, ho, wo, kh, kw = _conv_geometry(convs[0], in_shape)
        th, tw = kn["tile_h"], kn["tile_w"]
        pms, members, pm_at, out_at = [], [], 0, 0
        for ly in convs:
            folded = self._conv_params(ly, c)
            k = ly.weight.shape[0]
            ld, addr = self._pm_chunk(folded, 0, k, pm_addr=pm_at)
            pm_at += ld.rows * ld.cols * ld.chans
            pms.append(ld)
            members.append((ly, folded, k, addr, out_at, self.tensors[ly.output]))
            out_at += th * tw * k
        if pm_at > self.cfg.PM_BYTES:
            raise MappingError(f"{name}: the parameters of the fused convs ({pm_at} bytes) "
                               f"exceed the PM ({self.cfg.PM_BYTES})")
        tiles = []
        for buf, g, y0, nh, x0, nw in self._grid(tin, (0, ho), (0, wo), th, tw):
            ld, computes, saves = None, [], []
            for ly, folded, k, addr, off, tout in members:
                ld_m, cv = self._conv_tile(ly, tin, folded, False, buf, g, 0, k, y0, nh,
                                           x0, nw, 1, buf + off, addr)
                ld = ld or ld_m
                computes.append(cv)
                saves.append(self._save(tout, buf + off, g, y0, nh, x0, nw, 0, k))
            tiles.append(_Tile([ld], computes, saves))
        insns = self._schedule([(pms, tiles)], "CONV", kn["pipeline"])
        macs = sum(in_shape[0] * k * ho * wo * kh * kw * c for _, _, k, _, _, _ in members)
        return LayerProgram(name, f"{len(convs)}x{convs[0].op_name} (horizontal)",
                            cg.encode_stream(insns), len(insns), int(macs),
                            f"{list(in_shape)} -> {len(convs)} convs k{kh}x{kw} "
                            f"s{convs[0].strides[0]}", kn)

FUSION_KNOB = "@fusion"


@dataclass
class FusionReport:
    """What the fusion search saw: every candidate with its measured cycles and the summed
    cycles of its layers alone, and the chosen groups."""

    candidates: list[tuple[str, str, int, int]]  # (name, template, fused, unfused) cycles
    chosen: list[str]
    search_cycles: int  # total measured cycles of the chosen strategy over the measured layers
    parallel: list = field(default_factory=list)  # (pair, sequential, parallel) cycles


def fusion_candidates(graph: LayerGraph, cfg: DPUConfig) -> tuple[LayerGraph, list[tuple]]:
    """The graph as the planner sees it (after :func:`space_to_depth`) and its fusion
    candidates (:func:`tvm_dpu.fusion.find_candidates`) that fit the hardware with default
    knobs, each with its layers: what the fusion search considers, for tuning tasks."""
    from tvm_dpu import fusion

    p = _Planner(graph, cfg)
    by = {ly.name: ly for ly in p.g.layers}

    def fits(c) -> bool:
        try:
            p.group(c.template, [by[n] for n in c.layers], None)
            return True
        except MappingError:
            return False

    return p.g, [(c, [by[n] for n in c.layers]) for c in fusion.find_candidates(p.g, fits)]


#: hill-climbing moves over ``tile_h`` per fusion candidate in the search (0: default knobs only)
LOCAL_SEARCH_MOVES = 3


def _fusion_search(graph: LayerGraph, cfg: DPUConfig, knobs: dict, forced: dict[str, bool]
                   ) -> tuple[list[tuple[str | None, tuple[str, ...]]], FusionReport, dict]:
    """DNNVM's search (``tvm_dpu.fusion``): candidates by subgraph isomorphism, each planned and
    simulated (cycles on a zeroed DDR image; the timing does not depend on the data) together
    with its layers alone, then the cheapest strategy between barriers. Each candidate without
    user knobs is measured in a good version, not only with the heuristic defaults: a small
    local search (hill climbing over the ``tile_h`` options, ``LOCAL_SEARCH_MOVES`` moves from
    the default, each point simulated) keeps its fastest knobs, which the chosen groups then
    compile with (returned as the third value)."""
    from tvm_dpu import fusion
    from tvm_dpu.simulator import simulate

    p = _Planner(graph, cfg)
    by = {ly.name: ly for ly in p.g.layers}
    progs: dict = {}

    def accept(c) -> bool:
        try:
            progs[c] = p.group(c.template, [by[n] for n in c.layers], knobs.get(c.name))
            return True
        except MappingError:
            if c.name in knobs:  # the user's knobs for this group are wrong: say so
                raise
            return False  # the group does not fit the hardware: not a candidate
    cands = fusion.find_candidates(p.g, accept)  # an alias input has no producer to fuse
    unknown = sorted(set(forced) - {c.name for c in cands})
    if unknown:
        raise MappingError(f"{FUSION_KNOB}: no fusion candidate named {unknown[0]} (candidates: "
                           f"{', '.join(c.name for c in cands) or 'none'})")
    if not cands:
        return [(None, (ly.name,)) for ly in graph.layers], FusionReport([], [], 0), {}
    names = sorted({n for c in cands for n in c.layers}, key=[ly.name for ly in graph.layers].index)
    singles = {n: p.layer(by[n], knobs.get(n)) for n in names}
    # the search's variants re-plan a candidate's parameters at the end of the PARAM image and
    # drop them after the run: room for the largest candidate's parameters
    room = max(_cdiv(sum(ld.rows * ld.cols * ld.chans for ld in cg.decode_stream(pr.insns)
                         if isinstance(ld, cg.Load) and ld.to_pm), 64) * 64
               for pr in progs.values())
    sizes = {r: max(64, v) for r, v in p.region_use.items()}
    sizes.update(PARAM=max(64, len(p.params) + room), INSN=64)
    layout = cfg.region_layout(sizes)
    ddr = np.zeros(cfg.ddr_bytes(layout), dtype=np.uint8)

    def cycles(prog: LayerProgram) -> int:
        return simulate(cfg, prog.insns, ddr, regions=layout).cycles
    single = {n: cycles(pr) for n, pr in singles.items()}
    fused, tuned = {}, {}
    for c in cands:
        fused[c], kn = _local_search(p, c, [by[n] for n in c.layers], cycles(progs[c]), cycles)
        if kn is not None and c.name not in knobs:
            tuned[c.name] = kn
    try:
        groups, total = fusion.choose(graph, cands, single, fused, forced)
    except ValueError as e:
        raise MappingError(f"{FUSION_KNOB}: {e}") from None
    template = {c.layers: c.template for c in cands}
    ordered = fusion.order_groups(graph, groups)
    report = FusionReport(
        [(c.name, c.template, fused[c], sum(single[n] for n in c.layers)) for c in cands],
        ["+".join(g) for g in ordered if len(g) > 1], int(total))
    chosen = {"+".join(g) for g in ordered}
    return ([(template.get(g) if len(g) > 1 else None, g) for g in ordered], report,
            {k: v for k, v in tuned.items() if k in chosen})


def _local_search(p: _Planner, c, layers: list, base: int, cycles) -> tuple[int, dict | None]:
    """Hill climbing over ``tile_h`` for fusion candidate ``c`` from its default knobs
    (measured at ``base`` cycles): try the neighbouring options, move to the fastest while it
    improves, at most ``LOCAL_SEARCH_MOVES`` moves. A conv+pool candidate first measures its
    other ``halo`` form (keep / recompute) at that form's default and climbs from the faster
    one (keep: over bands that are multiples of the CONV's row passes). Returns the best cycles
    and the knobs that gave them (None: the default is best or the space has no ``tile_h``)."""
    in_shape = p._in_shape(layers[0].input)
    try:
        space = fused_knob_space(c.template, layers, in_shape, p.cfg)
    except (MappingError, ValueError, KeyError):
        return base, None
    if "tile_h" not in space or LOCAL_SEARCH_MOVES <= 0:
        return base, None

    def measure(kn: dict) -> int | None:
        mark = len(p.params)
        try:
            return cycles(p.group(c.template, layers, kn))
        except MappingError:
            return None
        finally:
            del p.params[mark:]

    opts = space["tile_h"].options
    best_kn, best = space.default(), base
    found = None
    if "halo" in space:  # conv+pool: also measure the other halo form at its default tile
        kn = fused_knob_space(c.template, layers, in_shape, p.cfg, halo="recompute").default()
        cyc = measure(kn)
        if cyc is not None and cyc < best:
            best, best_kn, found = cyc, kn, kn
    if best_kn.get("halo") == "keep":  # bands aligned to the CONV's row passes
        opts = [t for t in opts if t % p.cfg.CONV_ROW_PAR == 0 or t in (opts[-1],
                                                                        best_kn["tile_h"])]
    i, tried = opts.index(best_kn["tile_h"]), {opts.index(best_kn["tile_h"])}
    for _ in range(LOCAL_SEARCH_MOVES):
        step = None
        for k in (i - 1, i + 1):
            if k in tried or not 0 <= k < len(opts):
                continue
            tried.add(k)
            kn = {**best_kn, "tile_h": opts[k]}
            cyc = measure(kn)
            if cyc is not None and cyc < best:
                best, step = cyc, (k, kn)
        if step is None:
            break
        i, best_kn = step
        found = best_kn
    return best, found


PARALLEL_WINDOW = 8  # partners of a pool stream are looked for this many streams around it


def _parallel_pass(graph: LayerGraph, cfg: DPUConfig, knobs: dict, specs: list
                   ) -> tuple[list, list[tuple[str, int, int]]]:
    """Pair a stream holding a pool (MISC-bound: an Inception max pool, alone or fused) with an
    independent stream holding a conv when running them concurrently (:meth:`_Planner.parallel`)
    measures faster than one after the other; greedy, most expensive pool stream first, partners
    within ``PARALLEL_WINDOW`` streams. Returns the new specs (a pair is ``("parallel", (a,
    b))``) and the accepted pairs ``(name, sequential cycles, parallel cycles)``."""
    from tvm_dpu import fusion
    from tvm_dpu.simulator import simulate

    by = {ly.name: ly for ly in graph.layers}
    n = len(specs)
    owner = {name: i for i, (_, g) in enumerate(specs) for name in g}
    producer = {ly.output: ly.name for ly in graph.layers}
    succ: list[set[int]] = [set() for _ in specs]
    for i, (_, g) in enumerate(specs):
        for name in g:
            for t in fusion.inputs_of(by[name]):
                if t in producer and owner[producer[t]] != i:
                    succ[owner[producer[t]]].add(i)
    reach = [set() for _ in specs]
    for i in reversed(range(n)):  # specs are in topological order
        for j in succ[i]:
            reach[i] |= {j} | reach[j]

    def has(i: int, kind) -> bool:
        return any(isinstance(by[name], kind) for name in specs[i][1])
    pools = [i for i in range(n) if has(i, PoolLayer)]
    pairs = [(i, j) for i in pools for j in range(max(0, i - PARALLEL_WINDOW),
                                                  min(n, i + PARALLEL_WINDOW + 1))
             if j != i and has(j, ConvLayer) and not has(j, PoolLayer)
             and j not in reach[i] and i not in reach[j]]
    if not pairs:
        return specs, []
    p = _Planner(graph, cfg)
    progs = {i: p.spec(specs[i], knobs) for i in {x for pr in pairs for x in pr}}
    merged = {}
    for i, j in pairs:
        try:
            merged[(i, j)] = p.parallel(specs[i], specs[j], knobs)
        except MappingError:
            continue
    sizes = {r: max(64, v) for r, v in p.region_use.items()}
    sizes.update(PARAM=max(64, len(p.params)), INSN=64)
    layout = cfg.region_layout(sizes)
    ddr = np.zeros(cfg.ddr_bytes(layout), dtype=np.uint8)

    def cycles(prog: LayerProgram) -> int:
        return simulate(cfg, prog.insns, ddr, regions=layout).cycles
    alone = {i: cycles(pr) for i, pr in progs.items()}
    both = {k: cycles(pr) for k, pr in merged.items()}
    used: set[int] = set()
    chosen = []
    for i in sorted(pools, key=lambda x: -alone.get(x, 0)):
        if i in used:
            continue
        best = None
        for (a, b), c in both.items():
            if a == i and b not in used and c < alone[a] + alone[b]:
                if best is None or alone[a] + alone[b] - c > best[0]:
                    best = (alone[a] + alone[b] - c, b, c)
        if best:
            used |= {i, best[1]}
            chosen.append((i, best[1], best[2]))
    if not chosen:
        return specs, []
    partner = {i: j for i, j, _ in chosen} | {j: i for i, j, _ in chosen}
    units = [[k] if k not in partner else sorted((k, partner[k])) for k in range(n)
             if k not in partner or k < partner[k]]
    flat = fusion.order_groups(graph, [tuple(x for k in u for x in specs[k][1]) for u in units])
    by_names = {tuple(x for k in u for x in specs[k][1]): u for u in units}
    out = []
    for names in flat:
        u = by_names[names]
        out.append(specs[u[0]] if len(u) == 1 else
                   ("parallel", (specs[u[0]], specs[u[1]]) if u[0] in pools
                    else (specs[u[1]], specs[u[0]])))
    report = [(merged[(i, j)].name, alone[i] + alone[j], c) for i, j, c in chosen]
    return out, report


def _concat_in_place(graph: LayerGraph, groups: list, on_chip: set[str]
                     ) -> dict[str, tuple[str, int]]:
    """Concats whose inputs their producers can write straight into the concat's output (DNNVM:
    reorganization fused into the SAVE of the previous operator): channel concat of identically
    quantized inputs, each input made by a DPU layer here (not a concat), read by nothing else,
    not a function input or output. Returns the input -> (output, first channel) placements."""
    single = {g[0] for t, g in groups if t is None}
    producer = {ly.output: ly for ly in graph.layers}
    readers: dict[str, int] = {}
    for ly in graph.layers:
        for t in getattr(ly, "inputs", None) or [ly.input]:
            readers[t] = readers.get(t, 0) + 1
    views: dict[str, tuple[str, int]] = {}
    for ly in graph.layers:
        if not isinstance(ly, ConcatLayer) or ly.name not in single:
            continue
        ins = list(ly.inputs)
        if (ly.axis != 1 or any(rq is not None for rq in ly.requants) or len(set(ins)) != len(ins)
                or len(graph.tensors[ly.output].shape) != 4):
            continue
        if all(t in producer and not isinstance(producer[t], ConcatLayer) and readers[t] == 1
               and t not in graph.outputs and t not in on_chip for t in ins):
            ch0 = 0
            for t in ins:
                views[t] = (ly.output, ch0)
                ch0 += int(graph.tensors[t].shape[1])
    return views


def plan(graph: LayerGraph, cfg: DPUConfig, knobs: dict[str, dict] | None = None) -> DPUProgram:
    """Compile a layer graph into DPU streams (one per layer or fused group), a DDR map and the
    PARAM image.

    ``knobs`` maps layer names (and fused group names ``a+b``) to (partial) knob dicts overriding
    the defaults; ``knobs["@fusion"]`` controls the fusion search: ``{"enabled": False}`` runs
    layer by layer, ``{"<candidate name>": False}`` forbids a candidate, ``True`` forces it,
    ``{"parallel": False}`` turns off the concurrent pool / conv streams (:func:`_parallel_pass`).
    With fusion on, a concat whose inputs can be written in place disappears: its producers
    save straight into their channel range of its output (:func:`_concat_in_place`)."""
    cfg.validate("DPU config")
    knobs = knobs or {}
    fk = dict(knobs.get(FUSION_KNOB) or {})
    enabled = fk.pop("enabled", True)
    par = fk.pop("parallel", True)
    overlap = fk.pop("overlap", True)
    if not isinstance(enabled, bool) or any(not isinstance(v, bool)
                                             for v in [par, overlap, *fk.values()]):
        raise MappingError(f"{FUSION_KNOB}: expected true/false values, got {knobs[FUSION_KNOB]}")
    groups = [(None, (ly.name,)) for ly in graph.layers]
    report = None
    if enabled:
        groups, report, tuned = _fusion_search(graph, cfg, knobs, fk)
        knobs = {**tuned, **knobs}
    by = {ly.name: ly for ly in graph.layers}
    parallel = []
    if enabled and par:
        groups, parallel = _parallel_pass(graph, cfg, knobs, groups)
        if report is not None:
            report.parallel = parallel
    flat = [x for t, g in groups for x in (g if t == "parallel" else [(t, g)])]
    on_chip = {by[n].output for t, g in flat if t is not None and t != "horizontal"
               for n in g[:-1]}
    views = _concat_in_place(graph, flat, on_chip) if enabled else {}
    if views:
        placed = {whole for whole, _ in views.values()}
        groups = [(t, g) for t, g in groups
                  if not (t is None and by[g[0]].output in placed)]
    p = _Planner(graph, cfg, on_chip, views)
    layers, parts, sides = [], [], []
    for tpl, names in groups:
        if tpl == "parallel":
            layers.append(p.parallel(names[0], names[1], knobs))
        else:
            layers.append(p.spec((tpl, names), knobs))
        parts.append(p.last_items)
        sides.append(p.last_sides)
    if overlap and len(layers) > 1:
        merge_streams(layers, parts, cfg, p.region_use, sides)
    sizes = {r: max(64, _cdiv(v, 4096) * 4096) for r, v in p.region_use.items()}
    sizes["PARAM"] = max(64, _cdiv(len(p.params), 4096) * 4096)
    sizes["INSN"] = max(64, _cdiv(sum(len(ly.insns) for ly in layers), 4096) * 4096)
    return DPUProgram(tensors=p.tensors, inputs=list(graph.inputs), outputs=list(graph.outputs),
                      region_sizes=sizes, params=bytes(p.params), layers=layers, fusion=report)
