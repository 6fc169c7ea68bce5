"""Knob spaces of the static template (tile sizes, tile order, virtual threads) and the cost
model that picks their defaults: a small model of the simulator's timing rules searched over
the tilings that fit the SRAM buffers."""

from __future__ import annotations

from tvm_accel.errors import MappingError
from tvm_accel.knobs import Knob, KnobSpace, validate_knobs
from tvm_accel.layers import AddLayer, ConvLayer
from tvm_vta_cp.hw_config import VTAConfig
from tvm_vta_cp.layout import cdiv, dims4
from tvm_vta_cp.strategy.alu_tail import (
    AluOp,
    add_numerics,
    alu_ops,
    conv_numerics,
    gemm_bias,
    n_vec,
)
from tvm_vta_cp.strategy.geometry import ConvGeom, conv_geom, tile_options


def threads(kn: dict) -> tuple[int, str]:
    """(virtual threads, the axis they alternate along: ``"co"``, ``"h"`` or ``""``)."""
    oc, hn = int(kn.get("oc_nthread", 1)), int(kn.get("h_nthread", 1))
    if oc == 2:
        return 2, "co"
    if hn == 2:
        return 2, "h"
    return 1, ""


def conv_tile_extents(g: ConvGeom, kn: dict) -> tuple[int, int, int, int, int]:
    """(tile_b, tile_co, tile_ci, tile_h, tile_w) of a conv's knobs; 1 x 1 pixels for dense."""
    tb, tco, tci = kn["tile_b"], kn["tile_co"], kn["tile_ci"]
    th, tw = (1, 1) if g.dense else (kn["tile_h"], kn["tile_w"])
    return tb, tco, tci, th, tw


def _check_conv(g: ConvGeom, cfg: VTAConfig, nvec: int, kn: dict, gbias: bool = False) -> None:
    """Raise ValueError naming the knob when a tiling does not fit the SRAM buffers (with
    ``gbias`` each half also holds the bias lanes' INP entry and ``tile_co`` WGT blocks)."""
    if kn.get("oc_nthread", 1) == 2 and kn.get("h_nthread", 1) == 2:
        raise ValueError("h_nthread: oc_nthread and h_nthread cannot both be 2 (VTA interleaves "
                         "two virtual threads)")
    nthr, _ = threads(kn)
    tb, tco, tci, th, tw = conv_tile_extents(g, kn)
    R, Cc = g.in_rows(th), g.in_cols(tw)
    ib, wb = g.tile_blocks(tco, tci)
    inp = tb * ib * R * Cc + int(gbias)
    if inp > cfg.inp_depth // nthr:
        knob = "tile_ci" if g.dense else "tile_h"
        raise ValueError(f"{knob}: the input tile (tile_b {tb} x {ib} channel blocks x {R} rows "
                         f"x {Cc} cols = {inp} entries) exceeds the {cfg.inp_depth // nthr} INP "
                         f"entries available per thread")
    wgt = wb * g.KK + (tco if gbias else 0)
    if wgt > cfg.wgt_depth // nthr:
        raise ValueError(f"tile_co: the weight tile ({wb} blocks (tile_co {tco}, tile_ci "
                         f"{tci}) x {g.KH}x{g.KW} = {wgt} entries) exceeds the "
                         f"{cfg.wgt_depth // nthr} WGT entries available per thread")
    acc = tb * tco * th * tw + nvec * tco
    if acc > cfg.acc_depth // nthr:
        knob = "tile_co" if g.dense else "tile_w"
        raise ValueError(f"{knob}: the output tile ({tb * tco * th * tw} entries) plus "
                         f"{nvec * tco} requantize vector entries exceeds the "
                         f"{cfg.acc_depth // nthr} ACC entries available per thread")
    nu = g.gemm_uops(tb, tco, tci, th, tw)
    if nu > cfg.uop_depth // 4:
        raise ValueError(f"tile_ci: the GEMM micro-op kernel would need {nu} micro-ops (limit "
                         f"{cfg.uop_depth // 4}); use a smaller tile_ci or tile_co")


def _check_add(shape, cfg: VTAConfig, nvec: int, kn: dict) -> None:
    tb, tc, th, tw = kn["tile_b"], kn["tile_co"], kn["tile_h"], kn["tile_w"]
    n = tb * tc * th * tw
    if 2 * n + nvec * tc > cfg.acc_depth:
        raise ValueError(f"tile_w: the add tile (2 operands x {n} entries + {nvec * tc} vector "
                         f"entries) exceeds the {cfg.acc_depth} ACC entries")


def _guess_dtype(zero_point: int, hi: int = 0) -> str:
    return "uint8" if zero_point > 127 or hi > 127 else "int8"


def _layer_ctx(layer, in_shape, cfg, dtypes=None):
    """Geometry and ALU tail of a layer for knob handling. Without ``dtypes`` the tensor types
    are inferred from the zero points (uint8 when a zero point or qmax exceeds 127)."""
    dout = _guess_dtype(int(layer.requant.zero_point), int(layer.requant.qmax))
    if isinstance(layer, ConvLayer):
        g = conv_geom(layer, in_shape, cfg)
        din, dout = dtypes or (_guess_dtype(int(layer.input_zero_point)), dout)
        _, ops = conv_numerics(layer, din, dout, cfg)
        return g, ops
    k = dims4(tuple(in_shape))[1]
    da, db, dout = dtypes or (_guess_dtype(int(layer.a_zero_point)),
                              _guess_dtype(int(layer.b_zero_point)), dout)
    _, _, ops = add_numerics(layer, (da, db), dout, k)
    return None, ops


def knob_space(layer: ConvLayer | AddLayer, in_shape: tuple[int, ...], cfg: VTAConfig,
               dtypes: tuple[str, ...] | None = None,
               _ctx: tuple[ConvGeom | None, list[AluOp]] | None = None) -> KnobSpace:
    """Declared knobs of a layer: conv ``tile_b, tile_h, tile_w, tile_ci, tile_co, oc_nthread,
    h_nthread``; dense ``tile_b, tile_ci, tile_co, oc_nthread``; add ``tile_b, tile_co, tile_h,
    tile_w``. ``tile_b``/``tile_ci``/``tile_co`` count blocks (BATCH / BLOCK), ``tile_h``/``tile_w``
    output rows/columns. Options are every near-equal split of the dimension. ``dtypes``
    (conv: ``(in, out)``, add: ``(a, b, out)``) refines the ACC budget of requantize vectors;
    by default they are inferred from the zero points."""
    g, ops = _ctx or _layer_ctx(layer, in_shape, cfg, dtypes)
    nvec = n_vec(ops)
    if isinstance(layer, ConvLayer):
        gb = gemm_bias(ops) is not None
        d = _default_conv(g, cfg, nvec, len(alu_ops(ops)), gbias=gb)
        knobs = [Knob("tile_b", tuple(tile_options(g.NB)), d["tile_b"])]
        if not g.dense:
            knobs += [Knob("tile_h", tuple(tile_options(g.Ho)), d["tile_h"]),
                      Knob("tile_w", tuple(tile_options(g.Wo)), d["tile_w"])]
        knobs += [Knob("tile_ci", tuple(tile_options(g.CB)), d["tile_ci"]),
                  Knob("tile_co", tuple(tile_options(g.KB)), d["tile_co"]),
                  Knob("oc_nthread", (1, 2), d["oc_nthread"])]
        if not g.dense:
            knobs.append(Knob("h_nthread", (1, 2), d["h_nthread"]))
        return KnobSpace(knobs, check=lambda kn: _check_conv(g, cfg, nvec, kn, gb),
                         name=f"vta.{'dense' if g.dense else 'conv2d'}:{layer.name}")
    N, C, H, W = dims4(tuple(in_shape))
    NB, CB = cdiv(N, cfg.batch), cdiv(C, cfg.block_out)
    d = _default_add((NB, CB, H, W), cfg, nvec, len(ops))
    knobs = [Knob("tile_b", tuple(tile_options(NB)), d["tile_b"]),
             Knob("tile_co", tuple(tile_options(CB)), d["tile_co"]),
             Knob("tile_h", tuple(tile_options(H)), d["tile_h"]),
             Knob("tile_w", tuple(tile_options(W)), d["tile_w"])]
    return KnobSpace(knobs, check=lambda kn: _check_add((NB, CB, H, W), cfg, nvec, kn),
                     name=f"vta.add:{layer.name}")


def modelled_cycles(layer: ConvLayer, in_shape: tuple[int, ...], cfg: VTAConfig,
                    dtypes: tuple[str, str] | None = None, knobs: dict | None = None) -> float:
    """The cost model's cycles of a conv/dense layer with ``knobs`` (default: its default
    knobs): GEMM, requantize tail and DMA with their overlap, as the defaults are chosen."""
    g, ops = _layer_ctx(layer, in_shape, cfg, dtypes)
    kn = knob_space(layer, in_shape, cfg, _ctx=(g, ops)).complete(knobs)
    nthr, axis = threads(kn)
    orders = {"co": ("co_inner",), "h": ("h_inner",)}.get(axis, ("co_outer", "co_inner"))
    gb = gemm_bias(ops) is not None
    return min(conv_cost(g, cfg, len(alu_ops(ops)), n_vec(ops), *conv_tile_extents(g, kn), nthr,
                         o, gbias=gb) for o in orders)


def default_alternatives(layer: ConvLayer, in_shape: tuple[int, ...], cfg: VTAConfig,
                         dtypes: tuple[str, str] | None = None) -> list[dict]:
    """The distinct default knobs of a conv under each start rule of the cost model
    (:data:`START_RULES`), the default first: the tilings worth measuring when the choice is
    made on the simulator (the model's start term is its least certain part). With the bias
    lanes, also the (feasible) defaults of the same tail with its ADD on the ALU (its vector
    too): the tilings the model chose before the lanes existed, measured on the new tail."""
    g, ops = _layer_ctx(layer, in_shape, cfg, dtypes)
    space = knob_space(layer, in_shape, cfg, _ctx=(g, ops))
    out = [space.default()]
    gb_op, nalu = gemm_bias(ops), len(alu_ops(ops))
    gb = gb_op is not None
    for rule in START_RULES[1:]:
        kn = _default_conv(g, cfg, n_vec(ops), nalu, rule, gbias=gb)
        if kn not in out:
            out.append(kn)
    if gb:
        for rule in START_RULES:
            kn = _default_conv(g, cfg, n_vec(ops) + int(not gb_op.is_imm), nalu + 1, rule)
            if kn not in out and space.is_valid(kn):
                out.append(kn)
    return out


def default_knobs(layer: ConvLayer | AddLayer, in_shape: tuple[int, ...], cfg: VTAConfig,
                  dtypes: tuple[str, ...] | None = None) -> dict:
    """Heuristic default (cost-model search over tile sizes that fit the buffers)."""
    return knob_space(layer, in_shape, cfg, dtypes).default()


# --- cost model for the defaults ----------------------------------------------------------------
#: how the two-thread cost charges the unhidden start: the first chunk's full load for
#: one-chunk tilings and the whole tile's loads otherwise (the default), one chunk's always,
#: or the whole tile's always (the model before the start term was analysed)
START_RULES = ("mixed", "chunk", "tile")


def conv_cost(g: ConvGeom, cfg: VTAConfig, nops: int, nvec: int, tb, tco, tci, th, tw,
              nthr: int, order: str, start: str = "mixed", gbias: bool = False) -> float:
    """Rough cycle estimate of a tiling (same cost rules as the simulator's timing model);
    ``nops`` ALU ops of the tail, ``gbias``: one more GEMM pass adds the bias lanes;
    ``start`` is one of :data:`START_RULES`."""
    lat, bpc, pl = cfg.DRAM_LATENCY_CYCLES, cfg.DRAM_BYTES_PER_CYCLE, cfg.PIPELINE_LATENCY_CYCLES
    nB, nCO, nCI = cdiv(g.NB, tb), cdiv(g.KB, tco), cdiv(g.CB, tci)
    nH, nW = cdiv(g.Ho, th), cdiv(g.Wo, tw)
    # average tile extents
    atb, atco, atci = g.NB / nB, g.KB / nCO, g.CB / nCI
    ath, atw = g.Ho / nH, g.Wo / nW
    tiles = nB * nCO * nH * nW
    n = atb * atco * ath * atw
    R = ath if g.rstep > 1 else (ath - 1) * g.sh + g.in_rows(1)
    Cc = (atw - 1) * g.sw + g.in_cols(1)
    full_plane = R >= g.H + g.pad[0] + g.pad[2] and Cc >= g.W + g.pad[1] + g.pad[3]
    full_h = R >= g.H + g.pad[0] + g.pad[2]
    if g.grouped:  # chunks clipped to the groups' input blocks, only non-zero weight blocks
        _, _, nCI, atci, apairs = g.chunk_stats(tco, tci)
    n_inp_insn = 1 if full_plane and max(g.pad) == 0 else (atb if full_h else atb * atci)
    inp_cost = n_inp_insn * lat + atb * atci * R * Cc * cfg.inp_entry_bytes / bpc
    if g.grouped:
        wgt_cost = lat + apairs * g.KK * cfg.wgt_entry_bytes / bpc
        gemm = atb * apairs * ath * atw * g.KK * cfg.GEMM_CYCLES_PER_UOP + pl
    else:
        wgt_cost = lat + atco * atci * g.KK * cfg.wgt_entry_bytes / bpc
        gemm = atb * atco * atci * ath * atw * g.KK * cfg.GEMM_CYCLES_PER_UOP + pl
    alu = nops * (n * cfg.ALU_CYCLES_PER_UOP + pl) + n + pl  # + reset
    if gbias:
        alu += n * cfg.GEMM_CYCLES_PER_UOP + pl
    if nvec:
        alu += lat + nvec * atco * cfg.acc_entry_bytes / bpc
    out_full = ath >= g.Ho
    n_st = atb if out_full else atb * atco
    if g.osw > 1 and atw > 1:  # interleaved columns: one STORE per row (see DramTensor.scatter)
        n_st = atb * atco * ath
    elif g.osh > 1 or g.osw > 1:
        n_st = atb * atco
    store = n_st * lat + n * cfg.out_entry_bytes / bpc
    # how often inputs / weights are (re)loaded per (tile, chunk)
    if nCI > 1:
        w_frac, i_frac = 1.0, 1.0
    elif g.grouped:  # each co tile reads its own input blocks
        w_frac, i_frac = min(1.0, nCO * nthr / tiles), 1.0
    elif order == "co_inner":
        w_frac = 1.0 if nCO > nthr else min(1.0, nthr / tiles)
        i_frac = min(1.0, nthr / max(nCO, 1)) if nCO > 1 else 1.0
    else:
        w_frac = min(1.0, nCO * nthr / tiles)
        i_frac = 1.0
    load = nCI * (inp_cost * i_frac + wgt_cost * w_frac)
    if gbias:  # the bias lanes' weight blocks, with the first chunk of a new co tile
        load += atco * cfg.wgt_entry_bytes / bpc * w_frac
    comp = nCI * gemm + alu
    if nthr == 2:
        per = max(comp, load, store)
        # the first load is never hidden; a weight tile kept resident in its half (one chunk)
        # is loaded in full there, ``w_frac`` only amortizes it over the tiles
        one_chunk = start == "chunk" or (start == "mixed" and nCI == 1)
        first = inp_cost + wgt_cost if one_chunk else load
        total = tiles * per + first + store
    else:
        total = tiles * (comp + max(load, store + alu * 0.0)) + store
    return total + tiles * nCI * 2.0  # a little per-instruction overhead favours big tiles


def _largest_fit(opts: list[int], pred) -> int | None:
    """Largest option satisfying a predicate that is monotone (true up to some option)."""
    lo, hi = 0, len(opts)  # pred true for opts[:lo], unknown in [lo, hi)
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(opts[mid]):
            lo = mid + 1
        else:
            hi = mid
    return opts[lo - 1] if lo else None


def _default_conv(g: ConvGeom, cfg: VTAConfig, nvec: int, nops: int,
                  start: str = "mixed", gbias: bool = False) -> dict:
    b_opts, co_opts, ci_opts = tile_options(g.NB), tile_options(g.KB), tile_options(g.CB)
    h_opts = [1] if g.dense else tile_options(g.Ho)
    w_opts = [1] if g.dense else tile_options(g.Wo)
    best = None
    for nthr in (2, 1):
        inp_d, wgt_d, acc_d = cfg.inp_depth // nthr, cfg.wgt_depth // nthr, cfg.acc_depth // nthr
        inp_d -= int(gbias)  # the bias lanes' INP entry
        for tb in b_opts:
            for tci in ci_opts[::-1]:
                if not g.grouped and tb * tci * g.KK > inp_d:
                    continue
                for tco in co_opts:
                    ib, wb = g.tile_blocks(tco, tci)
                    if (tb * ib * g.KK > inp_d or wb * g.KK + tco * gbias > wgt_d
                            or tb * tco + nvec * tco > acc_d):
                        continue
                    for tw in w_opts[::-1]:
                        Cc = g.in_cols(tw)
                        if (tb * ib * g.in_rows(1) * Cc > inp_d
                                or tb * tco * tw + nvec * tco > acc_d):
                            continue

                        def fits(th, tb=tb, tci=tci, tco=tco, tw=tw, Cc=Cc, ib=ib, inp_d=inp_d,
                                 acc_d=acc_d):
                            R = g.in_rows(th)
                            return (tb * ib * R * Cc <= inp_d
                                    and tb * tco * th * tw + nvec * tco <= acc_d
                                    and g.gemm_uops(tb, tco, tci, th, tw) <= cfg.uop_depth // 4)

                        th = _largest_fit(h_opts, fits)
                        if th is None:
                            continue
                        tiles = (cdiv(g.NB, tb) * cdiv(g.KB, tco) * cdiv(g.Ho, th)
                                 * cdiv(g.Wo, tw))
                        if nthr == 2 and tiles < 2:
                            continue
                        if nthr == 2:
                            axes = []
                            if cdiv(g.KB, tco) >= 2:
                                axes.append(("co", "co_inner"))
                            if not g.dense:
                                axes.append(("h", "h_inner"))
                            if not axes:
                                axes.append(("co", "co_inner"))
                        else:
                            axes = [("", "co_outer"), ("", "co_inner")]
                        for axis, order in axes:
                            c = conv_cost(g, cfg, nops, nvec, tb, tco, tci, th, tw, nthr, order,
                                          start, gbias)
                            if best is None or c < best[0] - 1e-9:
                                best = (c, tb, tco, tci, th, tw, nthr, axis)
    if best is None:
        raise MappingError("no tiling fits the VTA buffers (kernel too large for the INP/WGT "
                           "buffer even with 1x1 tiles)")
    _, tb, tco, tci, th, tw, nthr, axis = best
    d = {"tile_b": tb, "tile_h": th, "tile_w": tw, "tile_ci": tci, "tile_co": tco,
         "oc_nthread": 2 if axis == "co" and nthr == 2 else 1,
         "h_nthread": 2 if axis == "h" and nthr == 2 else 1}
    if g.dense:
        del d["tile_h"], d["tile_w"], d["h_nthread"]
    return d


def _default_add(dims, cfg: VTAConfig, nvec: int, nops: int) -> dict:
    NB, CB, H, W = dims
    lat, bpc = cfg.DRAM_LATENCY_CYCLES, cfg.DRAM_BYTES_PER_CYCLE
    half = cfg.acc_depth // 2
    best = None
    for tw in tile_options(W)[::-1]:
        for th in tile_options(H)[::-1]:
            if 2 * th * tw > half:
                continue
            for tc in tile_options(CB)[::-1]:
                tb_ok = [tb for tb in tile_options(NB)
                         if 2 * tb * tc * th * tw + nvec * tc <= half]
                if not tb_ok:
                    continue
                tb = tb_ok[-1]
                n = tb * tc * th * tw
                tiles = cdiv(NB, tb) * cdiv(CB, tc) * cdiv(H, th) * cdiv(W, tw)
                n_ld = 1 if (th == H and tw == W) else (tb if th == H else tb * tc)
                cost = tiles * (2 * (n_ld * lat + n * cfg.out_entry_bytes / bpc)
                                + (nops + 3) * (2 * n + 4) + 8)
                if best is None or cost < best[0]:
                    best = (cost, tb, tc, th, tw)
                break  # larger tc first: the first fitting one is the best for this (th, tw)
    if best is None:
        raise MappingError("the add layer does not fit the ACC buffer")
    _, tb, tc, th, tw = best
    return {"tile_b": tb, "tile_co": tc, "tile_h": th, "tile_w": tw}


def layer_knobs(space: KnobSpace, user: dict | None, layer: str) -> dict:
    """A layer's knobs: ``user`` completed with the defaults and validated (KnobError). Setting
    one virtual-thread knob to 2 switches the other (left unset) to 1."""
    if not user:  # the defaults fit by construction
        return space.default()
    user = dict(user)
    for a, b in (("oc_nthread", "h_nthread"), ("h_nthread", "oc_nthread")):
        if user.get(a) == 2 and b in space and b not in user:
            user[b] = 1
    return validate_knobs(space, user, layer)
