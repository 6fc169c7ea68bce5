"""VTA target: a VTA-style GEMM accelerator as a TVM BYOC target named ``vta``.

Stages, one module each: ``hw_config`` (JSON config), ``patterns`` (pattern table with named
checks), ``numerics`` (requantize recipe on the ALU), ``program`` (what the strategy hands
codegen), ``layout`` (NCHWnc / OIHWoi packing, uint8 shift, halo), ``strategy/`` (TVM's static
conv2d/dense template: placement, geometry, ALU tail, knobs, emitter, one schedule per
operator), ``embedding`` + ``rewrite`` + ``blocking`` (the CP paper's strategy: GEMM embeddings
found by constraint programming, turned into host-side layout rewrites that also do the
blocking), ``propagate`` (residual adds in their operands' image-pack layout), ``carry``
(consecutive calls exchange their blocked form), ``joint`` (the measured embeddings
re-picked for the network: the host passes neighbours share or add), ``host_cost`` (the host
passes' modelled cycles), ``codegen`` (128-bit ISA encoder, blob), ``runtime``
(``tvm_vta_cp.run`` on the C simulator), ``simulator`` (ctypes binding), ``tuning``. Design
notes: ``docs/vta.md``.

Strategy options (``pipeline(..., strategy=...)``, ``tvmc --target-vta-strategy``): ``static``
(TVM's template), ``cp`` (the best of the top-k CP candidates by simulated combined time:
accelerator cycles plus the modelled host cost of the rewrite), ``auto`` (the best of both,
the default) and ``tvm-reference`` (the CP paper's baseline: the template with dilation by
zero-inflated kernels). ``cp`` and ``auto`` then re-pick the measured candidates for the
network (``layout_choice="joint"``, the default; ``"per-layer"`` keeps each layer's own best,
``tvmc --target-vta-layout-choice``). The options travel in the knob dict under
:data:`STRATEGY_KNOB`; a layer's knob ``embedding`` (a candidate name such as
``"im2col(h,w)"`` or ``"static"``) forces a candidate.

Importing this package registers the target, its runtime function and the ``vta`` Relax pipeline,
so ``tvm.compile(mod, target="llvm", relax_pipeline="vta")`` works.
"""

from __future__ import annotations

import numpy as np
import tvm

from tvm_accel.errors import AccelError
from tvm_accel.layers import LayerGraph, Requant
from tvm_accel.pipeline import (
    canonicalize_for,
    offload,
    register_target_pipeline,
    target_pipeline,
)
from tvm_accel.target import AccelTarget, TargetOption, register_target
from tvm_vta_cp import hw_config, patterns
from tvm_vta_cp.hw_config import VTAConfig, load_config

#: key of the knob dict holding the strategy options (``strategy``, ``weights``, ``top_k``,
#: ``time_limit``, ``tune``)
STRATEGY_KNOB = "__vta_strategy__"
#: the CP paper's baseline: TVM's VTA conv template as the paper measured it
REFERENCE_STRATEGY = "tvm-reference"
#: per-layer knob naming the chosen embedding candidate
EMBEDDING_KNOB = "embedding"
_DECISIONS: dict = {}  # (layer signature, config, options) -> Decision, per process
_TUNED: dict = {}  # workload of a conv VTA runs -> knobs its cp/auto decision measured best


def _workload(layer, in_shape, in_dtype: str, out_dtype: str, config: VTAConfig) -> tuple:
    """What a conv's tuned knobs depend on: shapes, conv parameters, dtypes and config."""
    return (tuple(int(s) for s in in_shape), tuple(layer.weight.shape), tuple(layer.strides),
            tuple(layer.padding), tuple(layer.dilation), int(layer.groups), in_dtype, out_dtype,
            config.fingerprint)


def _with_tuned(graph: LayerGraph, config: VTAConfig, knobs: dict | None) -> dict | None:
    """``knobs`` completed with the knobs the cp/auto choice measured best (a non-default
    start rule of the cost model, or tuned), for layers the user left unset."""
    from tvm_accel.layers import ConvLayer

    out = dict(knobs or {})
    for ly in graph.layers:
        if not isinstance(ly, ConvLayer) or ly.name in out:
            continue
        key = _workload(ly, graph.tensors[ly.input].shape, graph.tensors[ly.input].dtype,
                        graph.tensors[ly.output].dtype, config)
        if key in _TUNED:
            out[ly.name] = dict(_TUNED[key])
    return out


def _layer_knobs(knobs: dict | None) -> dict | None:
    """Knobs for the static template: the strategy options and embedding choices removed."""
    if not knobs:
        return knobs
    out = {}
    for k, v in knobs.items():
        if k == STRATEGY_KNOB:
            continue
        if isinstance(v, dict) and EMBEDDING_KNOB in v:
            v = {a: b for a, b in v.items() if a != EMBEDDING_KNOB}
        out[k] = v
    return out


class VTATarget(AccelTarget):
    name = "vta"
    package = "tvm_vta_cp"
    global_knobs = frozenset({STRATEGY_KNOB})

    def load_config(self, path_or_name=None) -> VTAConfig:
        return hw_config.load_config(path_or_name)

    def requant_recipe(self, scale: np.ndarray, acc_bound: np.ndarray, zero_point: int,
                       qmin: int, qmax: int, max_error: float | None = None) -> Requant:
        from tvm_vta_cp.numerics import requant_recipe

        return requant_recipe(scale, acc_bound, zero_point, qmin, qmax, max_error=max_error)

    def add_recipe(self, scale_a: float, scale_b: float, zero_point: int, qmin: int,
                   qmax: int) -> tuple[int, int, Requant]:
        from tvm_vta_cp.numerics import add_recipe

        return add_recipe(scale_a, scale_b, zero_point, qmin, qmax)

    def recipe_for(self, op: str):
        """VTA's recipe (a 16-bit multiplier and shifts, not the generic int64 CPU one) for
        what requantizes on its ALU: the pools and the upsample, the product of two tensors (a
        squeeze-excitation gate) and a concat's rescaled input (``strategy.pool``,
        ``strategy.upsample``, ``strategy.activation``, ``strategy.concat``)."""
        if op in ("max_pool2d", "avg_pool2d", "global_avg_pool2d", "upsample", "multiply",
                  "concat"):
            return self.requant_recipe
        return None

    def pattern_table(self):
        return patterns.pattern_table()

    def plan(self, graph: LayerGraph, config: VTAConfig, knobs: dict | None = None):
        from tvm_vta_cp import strategy

        opts = (knobs or {}).get(STRATEGY_KNOB) or {}
        layer_knobs = _layer_knobs(knobs)
        if opts.get("strategy", "auto") in ("cp", "auto"):
            layer_knobs = _with_tuned(graph, config, layer_knobs)
        from tvm_vta_cp.rewrite import own_shape

        prog = strategy.plan(graph, config, layer_knobs,
                             reference=opts.get("strategy") == REFERENCE_STRATEGY)
        layers = {ly.name: ly for ly in graph.layers}
        for lp in prog.layers:  # a layer run in a rewritten layout reports its own shape
            ly = layers.get(lp.name)
            src = (getattr(ly, "inputs", None) or [getattr(ly, "input", None)])[0]
            own = own_shape(lp.name, graph.tensors[src].shape) if src in graph.tensors else None
            lp.shape = own or lp.shape
        return prog

    def execute(self, program, inputs, config: VTAConfig, trace_path: str | None = None):
        from tvm_vta_cp.runtime import execute_program

        return execute_program(program, inputs, config, trace_path)

    def compile_function(self, graph: LayerGraph, config: VTAConfig, knobs: dict | None = None,
                         name: str = "") -> bytes:
        from tvm_vta_cp import codegen

        return codegen.build_blob(self.plan(graph, config, knobs), config, name)

    def options(self) -> list[TargetOption]:
        return [
            TargetOption("config", "VTA hardware config JSON or bundled name (vta_1x16x16, "
                         "vta_8x8x8)", metavar="FILE"),
            TargetOption("strategy", "VTA strategy: TVM's static template, the CP embedding with "
                         "layout rewrites, the best of both by simulated combined time "
                         "(default auto), or the CP paper's TVM baseline (tvm-reference: "
                         "dilation by zero-inflated kernels)",
                         choices=("static", "cp", "auto", REFERENCE_STRATEGY)),
            TargetOption("embedding-weights", "weights of the MAC and data-movement overheads "
                         "when ranking CP embeddings (default 1,1)", metavar="MAC,DATA"),
            TargetOption("top-k", "CP candidates measured per layer (default 5)", type=int,
                         metavar="K"),
            TargetOption("layout-choice", "how cp/auto pick each conv's layout among its "
                         "measured candidates: for the network, counting the host passes "
                         "neighbouring VTA calls share or add (default joint), or each layer "
                         "alone (per-layer)", choices=("joint", "per-layer")),
            TargetOption("tune-trials", "tuning budget of the embedding choice: the 5 best "
                         "measured candidates get their tile knobs tuned with N simulator "
                         "measurements each (default 0)", type=int, metavar="N"),
        ]

    def knobs_from_options(self, values: dict) -> dict | None:
        text = values.get("embedding-weights")
        weights = None
        if text is not None:
            try:
                weights = [float(v) for v in text.split(",")]
            except ValueError:
                raise AccelError("--target-vta-embedding-weights: expected two numbers "
                                 f"'MAC,DATA', got {text!r}") from None
        top_k = values.get("top-k")
        if top_k is not None and top_k < 1:
            raise AccelError(f"--target-vta-top-k {top_k}: give at least 1 CP candidate to "
                             "measure per layer")
        return strategy_knobs(None, values.get("strategy"), weights, values.get("top-k"),
                              tune=values.get("tune-trials"),
                              layout_choice=values.get("layout-choice"))

    def prepare_offload(self, mod, config, knobs=None, report=None):
        """Layout rewrites of the CP strategy (``cp``/``auto``): every conv2d (groups 1) gets
        the layout its decision picks; host ops around it do the rewrite."""
        opts = dict((knobs or {}).get(STRATEGY_KNOB) or {})
        strat = opts.get("strategy", "auto")
        from tvm_vta_cp.embedding import STRATEGIES, check_weights, choose

        if strat not in STRATEGIES:
            raise AccelError(f"unknown VTA strategy {strat!r} (choose from "
                             f"{', '.join(STRATEGIES)})")
        weights = check_weights(opts.get("weights", (1.0, 1.0)))
        top_k, limit = int(opts.get("top_k", 5)), float(opts.get("time_limit", 10.0))
        tune = int(opts.get("tune", 0))
        if top_k < 1 or not limit > 0 or tune < 0:
            raise AccelError(f"VTA strategy: top_k must be >= 1, time_limit > 0 and tune >= 0 "
                             f"(got {top_k}, {limit}, {tune})")
        from tvm_vta_cp.joint import JOINT, LAYOUT_CHOICES, choose_jointly, network_graph

        choice = opts.get("layout_choice", JOINT)
        if choice not in LAYOUT_CHOICES:
            raise AccelError(f"unknown VTA layout choice {choice!r} (choose from "
                             f"{', '.join(LAYOUT_CHOICES)})")
        forced = {n: v[EMBEDDING_KNOB] for n, v in (knobs or {}).items()
                  if isinstance(v, dict) and EMBEDDING_KNOB in v}
        if strat in ("static", REFERENCE_STRATEGY) and not forced:
            return mod
        import time

        from tvm_accel.lower import report_progress
        from tvm_vta_cp.host_cost import host_metadata
        from tvm_vta_cp.rewrite import apply_layout_rewrites, conv_infos

        infos = conv_infos(mod)
        decisions: dict = {}
        for i, info in enumerate(infos):
            t0 = time.perf_counter()
            key = (info.input_shape, info.input_dtype, info.output_dtype, info.weight_shape,
                   info.strides, info.padding, info.dilation, config.fingerprint, strat,
                   weights, top_k, forced.get(info.name), tune)
            dec = _DECISIONS.get(key)
            if dec is None:
                dec = choose(info.layer, info.input_shape, info.input_dtype, info.output_dtype,
                             config, strat, weights, top_k, limit, forced.get(info.name), tune)
                _DECISIONS[key] = dec
            decisions[info.name] = dec
            report_progress("embedding", i + 1, len(infos), info.name, time.perf_counter() - t0)
        if choice == JOINT:
            decisions = choose_jointly(network_graph(mod), decisions, config)

        def decide(info):
            dec = decisions.get(info.name) if info.layer is not None else None
            if dec is None:
                return None
            if dec.chosen.knobs:
                from tvm_vta_cp.embedding import rewritten_layer

                new, shape = rewritten_layer(info.layer, info.input_shape, dec.rewrite)
                _TUNED[_workload(new, shape, info.input_dtype, info.output_dtype,
                                 config)] = dec.chosen.knobs
            if not dec.rewrite.is_identity:
                from tvm_accel.layers import conv_output_shape
                from tvm_vta_cp.rewrite import note_own_shape

                note_own_shape(info.name, info.geometry(dec.rewrite).input_shape,
                               info.input_shape,
                               conv_output_shape(info.layer, info.input_shape), info.layer)
            if report is not None:
                from dataclasses import asdict, replace

                report.layouts.append(replace(dec, layer=info.name))
                if not dec.rewrite.is_identity:
                    report.host_functions += [host_metadata(config, asdict(h))
                                              for h in info.host_functions(dec.rewrite)]
            return None if dec.rewrite.is_identity else dec.rewrite

        mod, _ = apply_layout_rewrites(mod, decide)
        from tvm_vta_cp.propagate import propagate_pack

        mod, added = propagate_pack(mod)
        if report is not None:
            from dataclasses import asdict

            report.host_functions += [host_metadata(config, asdict(h)) for h in added]
        return mod

    def finish_offload(self, mod, config, report=None):
        """The runtime's NCHWnc blocking of a rewritten conv's input (and of a packed conv's
        output) moves into its layout-rewrite host function: one host pass per direction
        (:func:`tvm_vta_cp.blocking.fuse_blocking`); then consecutive VTA calls exchange their
        blocked form with at most one host pass between them
        (:func:`tvm_vta_cp.carry.carry_layouts`). The report's blobs and host functions (and
        their modelled bytes) follow."""
        from tvm_vta_cp.blocking import fuse_blocking
        from tvm_vta_cp.carry import carry_layouts
        from tvm_vta_cp.host_cost import host_metadata

        mod, fused, blobs = fuse_blocking(mod, self.runtime_func)
        if report is not None and fused:
            for fn in report.functions:
                if fn.name in blobs:
                    fn.blob = blobs[fn.name]
            written = {b.symbol: b.nbytes for b in fused}
            for h in report.host_functions:
                if h["symbol"] in written:
                    h["blocked"] = True
                    if h["op"] != "unpack":
                        h["written"] = written[h["symbol"]]
                    host_metadata(config, h)
        mod, added, blobs = carry_layouts(mod, self.runtime_func)
        if report is not None:
            for fn in report.functions:
                if fn.name in blobs:
                    fn.blob = blobs[fn.name]
            present = {gv.name_hint for gv in mod.get_global_vars()}
            report.host_functions[:] = [h for h in report.host_functions
                                        if h["symbol"] in present]
            report.host_functions += [host_metadata(config, h) for h in added]
        return mod

    def tuning_tasks(self, graph: LayerGraph, config: VTAConfig) -> list:
        from tvm_vta_cp.tuning import tuning_tasks

        return tuning_tasks(graph, config)

    def disassemble(self, blob: bytes, layer: str | None = None, limit: int = 0) -> str:
        from tvm_vta_cp.codegen import ISA, load_blob

        program, cfg, name = load_blob(blob)
        isa = ISA(cfg)
        lines = [f"; vta function {name}  config {cfg.name}  dram {program.dram_size} bytes"]
        for t in program.tensors.values():
            lines.append(f"; tensor {t.name} {t.dtype}{list(t.shape)} @ {t.offset} "
                         f"halo {list(t.halo)} fill {t.fill}")
        for ly in program.layers:
            if layer is not None and ly.name != layer:
                continue
            lines.append(f"\n{ly.name}:  ; {ly.op} {ly.shape}  {ly.n_insns} insns  "
                         f"knobs {ly.knobs}")
            body = isa.disassemble(ly.insns)
            if limit and len(body) > limit:
                body = body[:limit] + [f"  ... {len(body) - limit} more"]
            lines += body
        return "\n".join(lines)


TARGET = register_target(VTATarget())
register_target_pipeline(TARGET)


def strategy_knobs(knobs: dict | None = None, strategy: str | None = None,
                   weights=None, top_k: int | None = None, time_limit: float | None = None,
                   tune: int | None = None, layout_choice: str | None = None) -> dict | None:
    """``knobs`` with the strategy options added (unchanged when none is given); ``tune`` is
    the tuning budget of the embedding choice (measurements per candidate); ``layout_choice``
    ``"joint"`` (the default: the measured candidates re-picked for the network,
    :mod:`tvm_vta_cp.joint`) or ``"per-layer"``."""
    opts = {k: v for k, v in (("strategy", strategy), ("weights", weights), ("top_k", top_k),
                              ("time_limit", time_limit), ("tune", tune),
                              ("layout_choice", layout_choice)) if v is not None}
    if not opts:
        return knobs
    out = dict(knobs or {})
    out[STRATEGY_KNOB] = {**out.get(STRATEGY_KNOB, {}), **opts}
    return out


def pipeline(config: str | VTAConfig | None = None, knobs: dict | None = None,
             strategy: str | None = None, weights=None, top_k: int | None = None,
             tune: int | None = None, layout_choice: str | None = None):
    """The ``vta`` pipeline for a non-default config, knobs or strategy (``static``, ``cp``,
    ``auto``, ``tvm-reference``; ``weights`` = the overhead weight vector [MAC, data],
    ``top_k`` candidates, ``tune`` measurements per tuned candidate, ``layout_choice``
    ``joint`` or ``per-layer``): ``relax_pipeline=pipeline(...)``."""
    return target_pipeline(TARGET, config,
                           strategy_knobs(knobs, strategy, weights, top_k, tune=tune,
                                          layout_choice=layout_choice))


def partition_for_vta(mod: tvm.IRModule) -> tvm.IRModule:
    """Canonicalize (VTA recipe) and partition: the IR just before lowering."""
    from tvm_accel.partition import partition

    return partition(canonicalize_for(mod, TARGET), TARGET.pattern_table())


def lower_vta(mod: tvm.IRModule, config: str | VTAConfig | None = None,
              knobs: dict | None = None) -> tvm.IRModule:
    """Canonicalize, partition and lower to ``tvm_vta_cp.run`` calls (host ops untouched)."""
    return offload(canonicalize_for(mod, TARGET), TARGET, load_config(config), knobs)


from tvm_vta_cp import runtime as _runtime  # noqa: E402,F401  (registers tvm_vta_cp.run)

__all__ = ["EMBEDDING_KNOB", "REFERENCE_STRATEGY", "STRATEGY_KNOB", "TARGET", "VTAConfig",
           "load_config", "lower_vta", "partition_for_vta", "pipeline", "strategy_knobs"]
