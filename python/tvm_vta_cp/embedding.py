"""The CP strategy of the VTA target: embeddings of the GEMM intrinsic -> layout rewrites ->
candidates -> the best program (the CP paper, sections 4.4, 5 and 6).

For a conv/dense layer, :func:`candidates` enumerates the embeddings of the config's GEMM
intrinsic under the strict and the relaxed constraint sets, maps each through the Table 2
rewrite rules (:func:`rewrite_of`) and ranks the implementable ones by MAC and data-movement
overhead; :func:`choose` measures the top ``k`` on the simulator (accelerator cycles plus the
modelled host cost of the rewrite) beside the static template and returns the best. The rules
and the host cost model are in ``docs/vta.md``.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

from tvm_accel.cp import Embedding, Options, conv2d_op, dense_op, enumerate_embeddings
from tvm_accel.cp.embedding import IMAGE_DIMS
from tvm_accel.cp.intrinsic import InstructionDFG, gemm_intrinsic
from tvm_accel.cp.operator import TensorOp
from tvm_accel.errors import AccelError
from tvm_accel.knobs import Knob, KnobSpace
from tvm_accel.layers import ConvLayer, conv_output_shape
from tvm_vta_cp import host_cost
from tvm_vta_cp.hw_config import VTAConfig
from tvm_vta_cp.rewrite import LayoutRewrite, host_parts, rewrite_weight, rewritten_conv_geometry

__all__ = ["Candidate", "CandidateSet", "Decision", "Footprint", "STRATEGIES", "candidates",
           "choose", "embedding_space", "footprint", "gemm_of", "operator_of", "rewrite_of"]

STRATEGIES = ("static", "cp", "auto", "tvm-reference")
#: what VTA's rewrite rules can implement, posted as lane restrictions so the search never
#: enumerates embeddings no rule implements: y lanes are output channels; x lanes are the
#: batch or image-pack pieces of the output image (never both, never adjacent pixels)
Y_DIMS = ("k", "g")
IDENTITY = LayoutRewrite()


def gemm_of(cfg: VTAConfig) -> InstructionDFG:
    """VTA's GEMM intrinsic as a DFG, from the config's shape."""
    return gemm_intrinsic(cfg.batch, cfg.block_out, cfg.block_in, name=f"vta.gemm:{cfg.name}")


def _dims(in_shape) -> tuple[int, int, int, int]:
    s = tuple(int(v) for v in in_shape)
    return s if len(s) == 4 else (s[0], s[1], 1, 1)


def operator_of(layer: ConvLayer, in_shape) -> TensorOp:
    """The layer's operator model (conv2d with its groups and dilation, or dense)."""
    n, c, h, w = _dims(in_shape)
    k = int(layer.weight.shape[0])
    if layer.is_dense:
        return dense_op(n, c, k)
    kh, kw = layer.kernel
    return conv2d_op(n, c, h, w, k, kh, kw, tuple(layer.strides), tuple(layer.padding),
                     tuple(getattr(layer, "dilation", (1, 1))), int(layer.groups))


def rewrite_of(emb: Embedding) -> tuple[LayoutRewrite | None, str]:
    """Table 2: the layout rewrite implementing an embedding, or None with the reason."""
    op = emb.op
    y = emb.dims("y")
    if any(d != "k" for d in y):
        return None, f"no rewrite rule for y over {'*'.join(y)} (VTA's y lanes are channels)"
    z = set(emb.dims("z"))
    unroll = tuple(a for a, d in (("h", "r"), ("w", "s")) if d in z)
    pieces = {"oh": 1, "ow": 1}
    xs = emb.axes["x"]
    if any(d == "n" for d, _, _ in xs) and len(xs) > 1:
        return None, "no rewrite rule for x over batch and pixels together"
    for d, size, stride in xs:
        if d == "n":
            continue
        if d not in pieces:
            return None, f"no rewrite rule for x over {d}"
        extent = op.extents[op.index(d)]
        if stride != -(-extent // size):
            return None, (f"no rewrite rule for x on {size} adjacent {d} positions (a per-lane "
                          "stencil copy)")
        pieces[d] = size
    if op.params.get("groups", 1) > 1:
        if unroll or pieces != {"oh": 1, "ow": 1}:
            return None, "rewrites of grouped convolutions are not implemented"
        if any(d in ("k", "c") for d, _, _ in emb.padded):
            return None, ("no rewrite rule for per-group channel padding (the static template "
                          "runs a grouped conv block-diagonally)")
    if op.kind == "dense":
        return IDENTITY, ""
    return LayoutRewrite(unroll=unroll, pack=(pieces["oh"], pieces["ow"])), ""


@dataclass
class Candidate:
    """One implementable layout for a layer, with its overheads (section 4.4)."""

    rewrite: LayoutRewrite
    embedding: Embedding | None
    o_mac: int
    o_data: int
    score: float
    host_read: int = 0
    host_written: int = 0
    pack_bytes: int = 0  # host bytes of the NCHWnc padding + blocking (the runtime's pack)
    cycles: int | None = None  # measured on the simulator (accelerator only)
    gather_bytes: int = 0  # the part of the host bytes moved by gathers (``host_cost``)
    model_cycles: float = math.inf  # the tiling cost model's cycles with the default knobs
    knobs: dict | None = None  # measured-best knobs of the rewritten conv (None: defaults)
    output_bytes: int = 0  # the part of the host bytes on the output side (unpack / unblock)

    @property
    def name(self) -> str:
        return self.rewrite.describe() or "static"

    @property
    def transform_bytes(self) -> int:
        """Host bytes read plus written around the call: the rewrite and the blocking."""
        return self.host_read + self.host_written + self.pack_bytes

    def host_cycles(self, cfg: VTAConfig) -> float:
        return host_cost.cycles(cfg, self.transform_bytes - self.gather_bytes,
                                self.gather_bytes)

    def input_host_cycles(self, cfg: VTAConfig) -> float:
        """Modelled cycles of the input-side pass: the rewrite's gather or the blocking."""
        return self.host_cycles(cfg) - self.output_host_cycles(cfg)

    def output_host_cycles(self, cfg: VTAConfig) -> float:
        """Modelled cycles of the output-side pass: the unpack or the unblocking (copies)."""
        return host_cost.cycles(cfg, self.output_bytes)

    def combined(self, cfg: VTAConfig) -> float | None:
        return None if self.cycles is None else self.cycles + self.host_cycles(cfg)

    def modelled_combined(self, cfg: VTAConfig) -> float:
        """Modelled compute-module cycles (GEMM + requantize tail + DMA overlap) plus host."""
        return self.model_cycles + self.host_cycles(cfg)


@dataclass
class CandidateSet:
    candidates: list[Candidate]
    embeddings: list[Embedding]
    rejected: list[tuple[str, str]]
    nodes: int
    seconds: float
    reason: str = ""
    static: Candidate | None = None
    #: every implementable rewrite found (the nominated ``candidates`` are among them)
    implementable: list[Candidate] = field(default_factory=list)


def _up(a: int, b: int) -> int:
    return -(-a // b) * b


@dataclass(frozen=True)
class Footprint:
    """What running a layer with one rewrite costs beside the operator's minimum (section 4.4):
    MACs and tensor elements moved on VTA's padded NCHWnc layout, the host bytes (read,
    written) of the rewrite's host functions (which write / read the blocked tensors), the
    bytes of the runtime's padding + blocking of the tensors they do not cover, and the DRAM
    bytes of the packed data tensors and weights (the paper's memory columns)."""

    macs: int
    data: int
    host: tuple[int, int]
    pack: int
    data_bytes: int
    weight_bytes: int
    gather: int = 0  # bytes of the host passes that gather (the input rewrite)
    output: int = 0  # bytes of the output-side pass (the unpack or the unblocking)


def footprint(layer: ConvLayer, in_shape, rw: LayoutRewrite, cfg: VTAConfig) -> Footprint:
    """The :class:`Footprint` of ``layer`` under rewrite ``rw`` (int8 tensors)."""
    n, c, h, w = _dims(in_shape)
    k = int(layer.weight.shape[0])
    nb, kb = _up(n, cfg.batch), _up(k, cfg.block_out)
    if layer.is_dense:
        cb = _up(c, cfg.block_in)
        pack = n * c + nb * cb + nb * kb + n * k
        return Footprint(nb * kb * cb, nb * cb + kb * cb + nb * kb, (0, 0), pack,
                         nb * cb + nb * kb, kb * cb, output=nb * kb + n * k)
    g = int(layer.groups)
    dil = tuple(getattr(layer, "dilation", (1, 1)))
    wshape = tuple(int(s) for s in layer.weight.shape)
    if g > 1:
        kh, kw = layer.kernel
        _, _, ho, wo = conv_output_shape(layer, (n, c, h, w))
        # block-diagonal: each output-channel block reads the input blocks of its groups
        cg, kg = c // g, k // g
        ci_blocks = 0
        for j in range(kb // cfg.block_out):
            k0, k1 = j * cfg.block_out, min(k, (j + 1) * cfg.block_out)
            c0, c1 = (k0 // kg) * cg, ((k1 - 1) // kg + 1) * cg
            ci_blocks += (c1 - 1) // cfg.block_in - c0 // cfg.block_in + 1
        macs = nb * ci_blocks * cfg.block_in * cfg.block_out * ho * wo * kh * kw
        x = nb * _up(c, cfg.block_in) * (h + sum(layer.padding[::2])) * (
            w + sum(layer.padding[1::2]))
        wgt, y = ci_blocks * cfg.block_in * cfg.block_out * kh * kw, nb * kb * ho * wo
        return Footprint(macs, x + wgt + y, (0, 0), n * c * h * w + x + y + n * k * ho * wo,
                         x + y, wgt, output=y + n * k * ho * wo)
    geo = rewritten_conv_geometry(rw, (n, c, h, w), wshape, tuple(layer.strides),
                                  tuple(layer.padding), dil)
    n2, c2, h2, w2 = geo.input_shape
    _, _, kh2, kw2 = geo.weight_shape
    _, _, ho2, wo2 = geo.output_shape
    pt, pl, pb, pr = geo.padding
    nb, cb = _up(n2, cfg.batch), _up(c2, cfg.block_in)
    x = nb * cb * (h2 + pt + pb) * (w2 + pl + pr)
    wgt, y = kb * cb * kh2 * kw2, nb * kb * ho2 * wo2
    parts = host_parts(rw, (n, c, h, w), wshape, tuple(layer.strides), tuple(layer.padding),
                       dil)
    rewrite_in = parts.get("im2col") or parts.get("pack")
    unpack = parts.get("unpack")
    read = written = pack = gather = 0
    if rewrite_in:  # one pass: the rewrite writes the blocked tensor (fuse_blocking)
        read, written = rewrite_in[0], x
        gather = read + written
    else:           # the runtime blocks the input
        pack += n2 * c2 * h2 * w2 + x
    if unpack:      # one pass: the unpack reads the blocked output
        read, written = read + unpack[0], written + unpack[1]
        output = unpack[0] + unpack[1]
    else:
        output = y + n2 * k * ho2 * wo2
        pack += output
    return Footprint(nb * kb * cb * ho2 * wo2 * kh2 * kw2, x + wgt + y, (read, written), pack,
                     x + y, wgt, gather, output)


def _candidate(layer: ConvLayer, in_shape, rw: LayoutRewrite, cfg: VTAConfig, op: TensorOp,
               emb: Embedding | None, weights: tuple[float, float]) -> Candidate:
    fp = footprint(layer, in_shape, rw, cfg)
    o_mac, o_data = fp.macs - op.macs, fp.data - _min_data(op)
    return Candidate(rw, emb, o_mac, o_data, _score(o_mac, o_data, weights), *fp.host, fp.pack,
                     gather_bytes=fp.gather, output_bytes=fp.output)


def _min_data(op: TensorOp) -> int:
    """Elements of the operator's tensors (input without its halo) moved once."""
    shp = op.shapes["in"]
    if len(shp) == 4:
        pt, pl, pb, pr = op.params["padding"]
        inp = shp[0] * shp[1] * (shp[2] - pt - pb) * (shp[3] - pl - pr)
    else:
        inp = math.prod(shp)
    return inp + math.prod(op.shapes["wgt"]) + math.prod(op.shapes["out"])


def _score(o_mac: int, o_data: int, weights: tuple[float, float]) -> float:
    return math.hypot(o_mac * weights[0], o_data * weights[1])


def check_weights(weights) -> tuple[float, float]:
    """A user weight vector ``[w_mac, w_data]``: two finite numbers >= 0, not both zero."""
    try:
        w = tuple(float(v) for v in weights)
    except (TypeError, ValueError):
        raise AccelError(f"embedding weights must be two numbers, got {weights!r}") from None
    if len(w) != 2 or not all(math.isfinite(v) and v >= 0 for v in w) or not any(w):
        raise AccelError(f"embedding weights must be two finite numbers >= 0 (not both 0), "
                         f"got {list(weights)}")
    return w  # type: ignore[return-value]


def candidates(layer: ConvLayer, in_shape, cfg: VTAConfig, weights=(1.0, 1.0), top_k: int = 5,
               time_limit: float = 10.0) -> CandidateSet:
    """Enumerate the layer's embeddings, map them to rewrites and keep the ``top_k`` best
    distinct rewrites by weighted overhead (plus the static template, always)."""
    weights = check_weights(weights)
    op = operator_of(layer, in_shape)
    dfg = gemm_of(cfg)
    t0 = time.monotonic()
    embs: list[Embedding] = []
    nodes, reasons = 0, []
    variants = [Options(padding=True, time_limit=time_limit, lane_dims=(("y", Y_DIMS),))]
    relaxed = dict(dense=False, linear_access=False, padding="fit", time_limit=time_limit,
                   max_solutions=64)
    variants.append(Options(**relaxed, lane_dims=(("x", ("n",)), ("y", Y_DIMS))))
    if dfg.x > 1 and not layer.is_dense:
        variants.append(Options(**relaxed, adjacent_pixels=False,
                                lane_dims=(("x", IMAGE_DIMS), ("y", Y_DIMS))))
    for opts in variants:
        res = enumerate_embeddings(op, dfg, opts)
        nodes += res.nodes
        embs += res.embeddings
        if res.reason:
            reasons.append(res.reason)
    by_rw: dict[LayoutRewrite, Candidate] = {}
    rejected = []
    for emb in embs:
        rw, why = rewrite_of(emb)
        if rw is None:
            rejected.append((emb.describe(), why))
            continue
        cand = _candidate(layer, in_shape, rw, cfg, op, emb, weights)
        if rw not in by_rw or cand.score < by_rw[rw].score:
            by_rw[rw] = cand
    for cand in by_rw.values():
        cand.model_cycles = _modelled(layer, in_shape, cand.rewrite, cfg)
    # the paper's overhead metric and the cycle model each nominate top_k; both are measured
    k = max(1, top_k)
    nominated = (sorted(by_rw.values(), key=lambda c: (c.score, c.name))[:k]
                 + sorted(by_rw.values(), key=lambda c: (c.modelled_combined(cfg), c.name))[:k])
    ranked = list({c.name: c for c in nominated}.values())
    static = _candidate(layer, in_shape, IDENTITY, cfg, op, None, weights)
    static.model_cycles = _modelled(layer, in_shape, IDENTITY, cfg)
    reason = "" if ranked else (reasons[-1] if reasons else "no embedding: no rewrite rule "
                                "implements the embeddings found")
    return CandidateSet(ranked, embs, rejected, nodes, time.monotonic() - t0, reason, static,
                        list(by_rw.values()))


def _modelled(layer: ConvLayer, in_shape, rw: LayoutRewrite, cfg: VTAConfig) -> float:
    """Modelled cycles of the conv VTA runs after ``rw`` (inf when it cannot be planned)."""
    from tvm_vta_cp.strategy.knobs import modelled_cycles

    try:
        new, shape = rewritten_layer(layer, in_shape, rw)
        return modelled_cycles(new, shape, cfg)
    except (AccelError, ValueError):
        return math.inf


@dataclass
class Decision:
    """What the strategy chose for one layer and why."""

    layer: str
    strategy: str
    chosen: Candidate
    options: list[Candidate] = field(default_factory=list)
    nodes: int = 0
    solve_seconds: float = 0.0
    reason: str = ""

    @property
    def rewrite(self) -> LayoutRewrite:
        return self.chosen.rewrite

    def summary(self) -> str:
        c = self.chosen
        emb = c.embedding.describe() if c.embedding is not None else "static template"
        s = f"{c.name}: {emb}; overhead MAC {c.o_mac:,} data {c.o_data:,}"
        if c.host_read or c.host_written:
            s += f"; host {c.host_read + c.host_written:,} B"
        if self.reason:
            s += f" ({self.reason})"
        return s


def rewritten_layer(layer: ConvLayer, in_shape, rw: LayoutRewrite
                    ) -> tuple[ConvLayer, tuple[int, ...]]:
    """The conv VTA runs after ``rw`` and its input shape (identity: the layer itself)."""
    if rw.is_identity or layer.is_dense:
        return layer, tuple(in_shape)
    dil = tuple(getattr(layer, "dilation", (1, 1)))
    geo = rewritten_conv_geometry(rw, _dims(in_shape), tuple(layer.weight.shape),
                                  tuple(layer.strides), tuple(layer.padding), dil)
    new = ConvLayer(layer.name, layer.input, layer.output, rewrite_weight(rw, layer.weight),
                    layer.bias, layer.input_zero_point, geo.strides, geo.padding,
                    layer.requant, groups=1)
    if hasattr(new, "dilation"):
        new.dilation = geo.dilation
    elif geo.dilation != (1, 1):
        raise AccelError(f"layer {layer.name}: the rewritten conv is dilated {geo.dilation}")
    return new, geo.input_shape


def measure(layer: ConvLayer, in_shape, in_dtype: str, out_dtype: str, cfg: VTAConfig,
            knobs: dict | None = None) -> int:
    """Simulated cycles of one conv layer on VTA (random data; timing does not depend on it)."""
    from tvm_accel.layers import LayerGraph, Tensor
    from tvm_accel.tuning.layer_tasks import measure_layer

    shape = tuple(int(s) for s in in_shape)
    out = conv_output_shape(layer, shape)
    if layer.is_dense:
        out = out[:2]
    graph = LayerGraph({layer.input: Tensor(layer.input, shape, in_dtype),
                        layer.output: Tensor(layer.output, tuple(out), out_dtype)},
                       [layer], [layer.input], [layer.output])
    return measure_layer(("vta", graph, cfg), knobs or {})[0]


def _measure_defaults(c: Candidate, layer: ConvLayer, in_shape, in_dtype: str, out_dtype: str,
                      cfg: VTAConfig) -> None:
    """Measure ``c`` with the default tilings of every start rule of the cost model
    (``knobs.default_alternatives``); the fastest sets ``c.cycles`` (and ``c.knobs`` when it
    is not the default)."""
    from tvm_vta_cp.strategy.knobs import default_alternatives

    new, shape = rewritten_layer(layer, in_shape, c.rewrite)
    alts = default_alternatives(new, shape, cfg, (in_dtype, out_dtype))
    c.cycles = measure(new, shape, in_dtype, out_dtype, cfg)
    for kn in alts[1:]:
        cyc = measure(new, shape, in_dtype, out_dtype, cfg, kn)
        if cyc < c.cycles:
            c.cycles, c.knobs = cyc, dict(kn)


#: candidates tuned when a tuning budget is given (the paper autotuned its top 5)
TUNE_TOP = 5


def tune_candidate(c: Candidate, layer: ConvLayer, in_shape, in_dtype: str, out_dtype: str,
                   cfg: VTAConfig, trials: int, seed: int = 0) -> None:
    """Tune ``c``'s tile knobs on the simulator with ``trials`` measurements: a first-improvement
    hill climb over the knob space from the defaults (one knob one step at a time, in a seeded
    order; a random feasible point when no neighbour is left). Keeps the best in ``c.knobs`` /
    ``c.cycles``."""
    from tvm_vta_cp.strategy.knobs import knob_space

    new, shape = rewritten_layer(layer, in_shape, c.rewrite)
    space = knob_space(new, shape, cfg, (in_dtype, out_dtype))
    rng = random.Random(seed)
    cur, best = space.complete(c.knobs), c.cycles
    seen = {tuple(sorted(cur.items()))}
    done = stall = 0
    while done < trials and stall < 50:
        nbrs = [n for n in space.neighbours(cur) if tuple(sorted(n.items())) not in seen]
        rng.shuffle(nbrs)
        if not nbrs:  # a local optimum: random feasible points
            try:
                nbrs = [space.sample(rng)]
            except ValueError:
                return
        improved = False
        for kn in nbrs:
            key = tuple(sorted(kn.items()))
            if key in seen or done >= trials:
                continue
            seen.add(key)
            if not space.is_valid(kn):
                continue
            done += 1
            try:
                cyc = measure(new, shape, in_dtype, out_dtype, cfg, kn)
            except (AccelError, ValueError):
                continue
            if best is None or cyc < best:
                best, cur, improved = cyc, kn, True
                c.cycles, c.knobs = cyc, dict(kn)
                break
        stall = 0 if improved else stall + 1


def choose(layer: ConvLayer, in_shape, in_dtype: str, out_dtype: str, cfg: VTAConfig,
           strategy: str = "auto", weights=(1.0, 1.0), top_k: int = 5,
           time_limit: float = 10.0, embedding: str | None = None,
           tune: int = 0) -> Decision:
    """The layer's layout: ``static`` (TVM's template), ``cp`` (the best CP candidate by
    simulated combined time) or ``auto`` (the best of both). ``embedding`` (a candidate name,
    the knob) forces one candidate. ``tune`` > 0: the :data:`TUNE_TOP` best measured
    candidates get their tile knobs tuned with that many measurements each before the
    choice (:func:`tune_candidate`)."""
    if strategy not in STRATEGIES:
        raise AccelError(f"unknown VTA strategy {strategy!r} (choose from "
                         f"{', '.join(STRATEGIES)})")
    if strategy in ("static", "tvm-reference") and embedding is None:  # no search
        static = _candidate(layer, in_shape, IDENTITY, cfg, operator_of(layer, in_shape), None,
                            check_weights(weights))
        return Decision(layer.name, strategy, static, [static])
    cs = candidates(layer, in_shape, cfg, weights, top_k, time_limit)
    static = cs.static
    pool = list(cs.candidates)
    if strategy == "auto" and all(c.rewrite != IDENTITY for c in pool):
        pool.append(static)
    if embedding is not None:
        pick = [c for c in pool + [static] + cs.implementable if c.name == embedding]
        if not pick:
            names = ", ".join(sorted({c.name for c in pool} | {"static"}))
            raise AccelError(f"layer {layer.name}: embedding {embedding!r} is not a candidate "
                             f"(candidates: {names})")
        pool = pick[:1]
    if not pool:
        return Decision(layer.name, strategy, static, [static], cs.nodes, cs.seconds,
                        f"{cs.reason}; static template used")
    for c in pool:
        if c.cycles is None:
            try:
                _measure_defaults(c, layer, in_shape, in_dtype, out_dtype, cfg)
            except (AccelError, ValueError) as e:
                c.cycles = None
                c.score = math.inf
                cs.rejected.append((c.name, str(e)))
    timed = [c for c in pool if c.cycles is not None]
    if not timed:
        return Decision(layer.name, strategy, static, pool, cs.nodes, cs.seconds,
                        "no candidate could be built; static template used")
    if tune > 0:
        for c in sorted(timed, key=lambda c: (c.combined(cfg), c.name))[:TUNE_TOP]:
            tune_candidate(c, layer, in_shape, in_dtype, out_dtype, cfg, tune)
    best = min(timed, key=lambda c: (c.combined(cfg), c.name))
    return Decision(layer.name, strategy, best, pool, cs.nodes, cs.seconds)


def embedding_space(layer: ConvLayer, in_shape, in_dtype: str, out_dtype: str, cfg: VTAConfig,
                    weights=(1.0, 1.0), top_k: int = 5, time_limit: float = 10.0) -> KnobSpace:
    """The layer's embedding choice as a declared knob space (one knob, ``embedding``): the
    static template and the top-k CP candidates by name, default the ``auto`` choice. A tuner
    sets the knob per layer (``knobs={layer: {"embedding": name}}``); the tile knobs of the
    chosen layout are :func:`tvm_vta_cp.strategy.knobs.knob_space` of :func:`rewritten_layer`."""
    dec = choose(layer, in_shape, in_dtype, out_dtype, cfg, "auto", weights, top_k, time_limit)
    names = tuple(dict.fromkeys(["static", *(c.name for c in dec.options)]))
    return KnobSpace([Knob("embedding", names, dec.chosen.name)], name=layer.name)
