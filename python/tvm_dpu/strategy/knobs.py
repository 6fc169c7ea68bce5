"""Knob spaces of layers and fused groups (tiling, weight tiling, format unit, pipelining)
with heuristic defaults and the FM/PM feasibility checks."""

from __future__ import annotations

from tvm_accel.errors import MappingError
from tvm_accel.knobs import Knob, KnobSpace
from tvm_accel.layers import (
    ConvLayer,
    PoolLayer,
    UpsampleLayer,
    pool_output_shape,
)
from tvm_dpu import codegen as cg
from tvm_dpu.hw_config import DPUConfig
from tvm_dpu.strategy.chains import _chain_knob_space
from tvm_dpu.strategy.list_schedule import insn_cycles
from tvm_dpu.strategy.tiling import (
    _cdiv,
    _conv_geometry,
    _in_window,
    _options,
    _param_bytes,
    _pm_bytes,
    _pool_window,
    _subsamples,
    conv_span,
    format_applies,
)


def _check_conv(layer: ConvLayer, in_shape, cfg: DPUConfig, kn: dict) -> None:
    c, k, ho, wo, _, kw = _conv_geometry(layer, in_shape)
    sph, spw = conv_span(layer)  # the window a tile reads grows with the dilation
    half = cfg.fm_memory_bytes // 2
    kt, th, tw = kn["oc_tile"], kn["tile_h"], kn["tile_w"]
    pm = _pm_bytes(_param_bytes(layer, kt, c))
    if pm > cfg.PM_BYTES:
        raise ValueError(f"oc_tile {kt}: parameters of {pm} bytes exceed the PM "
                         f"({cfg.PM_BYTES})")
    rows = (th - 1) * layer.strides[0] + sph
    cols = (tw - 1) * layer.strides[1] + spw
    if _subsamples(layer, bool(kn.get("format"))):
        rows, cols = th, tw
    if not kn.get("format"):  # the LOAD brings real rows only; the CONV pads the window
        rows, cols = min(rows, in_shape[2]), min(cols, in_shape[3])
    (pt, pl, _, _), (sh, sw) = layer.padding, layer.strides
    if any(_in_window(y, min(th, ho - y), sh, pt, sph, in_shape[2])[1] < 1
           for y in range(0, ho, th)) or any(
            _in_window(x, min(tw, wo - x), sw, pl, spw, in_shape[3])[1] < 1
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
    """Declared knobs of a layer with heuristic defaults (see ``docs/dpu.md``, Tiling)."""
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


def fused_knob_space(template: str, layers: list, in_shape, cfg: DPUConfig,
                     halo: str | None = None) -> KnobSpace:
    """Knobs of a fused group (``tvm_dpu.fusion`` templates) with heuristic defaults.

    ``conv+add``: the conv's knobs (the other operand's tile is the size of the output tile).
    ``conv+pool``: the conv's ``oc_tile``/``format``, ``tile_h``/``tile_w`` in pool output
    rows/columns and ``halo``: ``keep`` (default when it fits: the conv and the pool as an
    on-chip chain, :func:`~tvm_dpu.strategy.chains._chain_plan`, whose full-width conv bands are
    aligned to the CONV's
    8-row passes and whose pool-window halo rows are kept in FM by a MISC COPY) or
    ``recompute`` (each tile computes the conv rows its pool windows read, overlapping windows
    recompute a row band; W-split and weight tiling allowed; the default minimizes CONV row
    passes per output row; ``halo="recompute"`` makes it the default form).
    ``pool+conv``: the conv's ``oc_tile``, ``tile_h``/``tile_w`` in conv output rows/columns
    (each tile pools the input window its conv window reads).
    ``horizontal``: ``tile_h``/``tile_w`` shared by the convs (all output channels of every
    conv stay in the PM).
    ``chain``: ``tile_h`` in output rows of the chain's last layer
    (:func:`~tvm_dpu.strategy.chains._chain_plan`)."""
    if template == "chain":
        return _chain_knob_space(layers, in_shape, cfg)
    if template == "pool+conv":
        return _pool_conv_space(layers, in_shape, cfg)
    conv = layers[0]
    base = knob_space(conv, in_shape, cfg)
    if template == "conv+add":
        return base
    if template.startswith("conv+") and template.endswith("pool"):
        knobs, check, ths, tws, th, tw = _conv_pool_knobs(layers, in_shape, cfg, base, halo)
    elif template == "horizontal":
        knobs, check, ths, tws, th, tw = _horizontal_knobs(layers, in_shape, cfg)
    else:
        raise MappingError(f"unknown fusion template {template}")
    return KnobSpace([*knobs, Knob("tile_h", tuple(ths), th), Knob("tile_w", tuple(tws), tw),
                      Knob("pipeline", (True, False), True)], check=check,
                     name="+".join(ly.name for ly in layers))


def _pool_conv_space(layers: list, in_shape, cfg: DPUConfig) -> KnobSpace:
    """``pool+conv``: the conv's ``oc_tile``, tiles in conv output rows/columns."""
    half = cfg.fm_memory_bytes // 2
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


def _conv_pool_knobs(layers: list, in_shape, cfg: DPUConfig, base: KnobSpace,
                     halo: str | None):
    """``conv+pool``: ``(knobs, check, tile_h options, tile_w options, default tile_h,
    default tile_w)``; the recompute form's tiles, then the halo-keep chain when it fits."""
    half = cfg.fm_memory_bytes // 2
    conv = layers[0]
    c, k, hc, wc, kh, kw = _conv_geometry(conv, in_shape)
    d = base.default()
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
    return knobs, check, ths, tws, th, tw


def _horizontal_knobs(layers: list, in_shape, cfg: DPUConfig):
    """``horizontal``: tiles shared by the convs (every conv's output channels in the PM)."""
    half = cfg.fm_memory_bytes // 2
    conv = layers[0]
    c, k, hc, wc, _, _ = _conv_geometry(conv, in_shape)
    kh, kw = conv_span(conv)
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
    return knobs, check, ths, tws, th, tw
