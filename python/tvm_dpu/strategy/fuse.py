"""Fusion stage of the plan: the ``@fusion`` knob's options, DNNVM's fusion search and the
concurrent pool / conv streams (:mod:`tvm_dpu.fusion`, measured with planners of this package),
and the concats whose producers write straight into their output."""

from __future__ import annotations

from dataclasses import dataclass

from tvm_accel.errors import MappingError
from tvm_accel.layers import LayerGraph
from tvm_dpu import fusion
from tvm_dpu.fusion import FUSION_KNOB, FusionReport
from tvm_dpu.hw_config import DPUConfig
from tvm_dpu.strategy.planner import Planner


@dataclass(frozen=True)
class FusionOptions:
    """``knobs["@fusion"]``: search on/off, concurrent streams, one merged stream, and the
    candidates forced (True) or forbidden (False) by name."""

    enabled: bool
    parallel: bool
    overlap: bool
    forced: dict[str, bool]


def fusion_options(knobs: dict) -> FusionOptions:
    """The checked ``@fusion`` options of ``knobs`` (all true/false values)."""
    fk = dict(knobs.get(FUSION_KNOB) or {})
    enabled = fk.pop("enabled", True)
    par = fk.pop("parallel", True)
    overlap = fk.pop("overlap", True)
    if not isinstance(enabled, bool) or any(not isinstance(v, bool)
                                             for v in [par, overlap, *fk.values()]):
        raise MappingError(f"{FUSION_KNOB}: expected true/false values, got {knobs[FUSION_KNOB]}")
    return FusionOptions(enabled, par, overlap, fk)


def fuse(graph: LayerGraph, cfg: DPUConfig, knobs: dict, options: FusionOptions
         ) -> tuple[list, FusionReport | None, dict, set[str], dict[str, tuple[str, int]]]:
    """The groups to plan (``(template or None, layer names)``, ``("parallel", (a, b))`` for a
    concurrent pair), the search's report, the knobs completed with the tuned ones, the tensors
    kept on chip and the concat inputs placed in their concat's output."""
    groups = [(None, (ly.name,)) for ly in graph.layers]
    report = None
    if options.enabled:
        groups, report, tuned = fusion.search(Planner(graph, cfg), graph, cfg, knobs,
                                              options.forced)
        knobs = {**tuned, **knobs}
    by = {ly.name: ly for ly in graph.layers}
    if options.enabled and options.parallel:
        groups, parallel = fusion.parallel_pass(lambda: Planner(graph, cfg), graph, cfg, knobs,
                                                groups)
        if report is not None:
            report.parallel = parallel
    flat = [x for t, g in groups for x in (g if t == "parallel" else [(t, g)])]
    on_chip = {by[n].output for t, g in flat if t is not None and t != "horizontal"
               for n in g[:-1]}
    views = fusion.concat_in_place(graph, flat, on_chip) if options.enabled else {}
    if views:
        placed = {whole for whole, _ in views.values()}
        groups = [(t, g) for t, g in groups
                  if not (t is None and by[g[0]].output in placed)]
    return groups, report, knobs, on_chip, views


def fusion_candidates(graph: LayerGraph, cfg: DPUConfig) -> tuple[LayerGraph, list[tuple]]:
    """The graph as the planner sees it (after the W space-to-depth rewrite) and its fusion
    candidates (:func:`tvm_dpu.fusion.find_candidates`) that fit the hardware with default
    knobs, each with its layers: what the fusion search considers, for tuning tasks."""
    p = Planner(graph, cfg)
    by = {ly.name: ly for ly in p.g.layers}

    def fits(c) -> bool:
        try:
            p.group(c.template, [by[n] for n in c.layers], None)
            return True
        except MappingError:
            return False

    return p.g, [(c, [by[n] for n in c.layers]) for c in fusion.find_candidates(p.g, fits)]
