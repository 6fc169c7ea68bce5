"""On-chip chains: the row bands of convs each reading the previous one's output (optionally
closed by an add or a pool), lined up across the chain and packed into the FM memories."""

from __future__ import annotations

from dataclasses import dataclass

from tvm_accel.knobs import Knob, KnobSpace
from tvm_accel.layers import (
    AddLayer,
    ConvLayer,
    PoolLayer,
    conv_output_shape,
    pool_output_shape,
)
from tvm_dpu.hw_config import DPUConfig
from tvm_dpu.strategy.tiling import _cdiv, _in_window, _options, _param_bytes, _pm_bytes


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
    :meth:`~tvm_dpu.strategy.emit_chain.ChainEmitter.chain`). Default: the band with the fewest CONV
    row passes over the chain
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
