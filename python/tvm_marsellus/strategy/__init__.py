"""MARSELLUS strategy: a :class:`~tvm_accel.layers.LayerGraph` to a
:class:`~tvm_marsellus.program.MarsProgram`, layer by layer, in four stages (the design, with
the paper's vocabulary, is in ``docs/marsellus.md``):

1. ``engines``: the engine of every layer (the RBE or the 16-core cluster) and from it the L2
   layout of every tensor (RBE bit planes or bit-packed HWC);
2. ``tiling``: the DORY-style L1 tile of every layer, its knob space, and its weights packed
   into the L2 image (``memory``);
3. ``memory``: the static L2 / L3 map (weights or weight slots, bounce slots, tensors), tiles
   chosen again when it puts anything in L3;
4. ``emit``: the double-buffered commands of every layer (``kernels``: the compute commands of
   one tile).

A batch whose tensors do not fit L2 / L3 runs in passes of the largest sub-batch that fits
(``batch``).

``layers`` holds what every stage shares: tensors, geometry, the RBE eligibility rules.
Transpose and dilated convs enter the stages as their phase convs (``phases``: ``deconv``,
``dilated``) and leave as one layer program each; a concat's inputs live in their channel
slices of its output (``concat``); ``views`` holds the DMA copies of both.
"""

from __future__ import annotations

from tvm_accel import errors
from tvm_accel.knobs import KnobSpace
from tvm_accel.layers import LayerGraph
from tvm_marsellus.energy import NOMINAL, OperatingPoint, energy_coefficients
from tvm_marsellus.hw_config import MarsellusConfig
from tvm_marsellus.program import MarsProgram
from tvm_marsellus.strategy.batch import plan_in_passes
from tvm_marsellus.strategy.concat import expand_concats
from tvm_marsellus.strategy.decompose import expand_phases
from tvm_marsellus.strategy.emit import Emit
from tvm_marsellus.strategy.engines import OBJECTIVES, EngineChoice
from tvm_marsellus.strategy.kernels import Kernels
from tvm_marsellus.strategy.layers import _tensor_infos, maps_first, rbe_reasons
from tvm_marsellus.strategy.memory import CapacityError, Memory
from tvm_marsellus.strategy.phases import merge_phases
from tvm_marsellus.strategy.tiling import Tiling, _Layer, knob_space
from tvm_marsellus.strategy.views import Views


class Planner(Views, EngineChoice, Tiling, Memory, Emit, Kernels):
    """The state the stages share while planning one layer graph: the tensors, each layer's
    kind, engine and tile, the L2 image and the memory map."""

    def __init__(self, graph: LayerGraph, cfg: MarsellusConfig, knobs: dict | None = None,
                 op: OperatingPoint | None = None):
        self.g, self.cfg, self.user = graph, cfg, dict(knobs or {})
        self.objective = self.user.get("objective", "energy")
        if self.objective not in OBJECTIVES:  # a user error, not a layer that cannot map
            raise errors.ConfigError(f"knob objective: {self.objective!r} is not one of "
                                     f"{', '.join(OBJECTIVES)}")
        self.coef = energy_coefficients(op or NOMINAL)
        self.add_reasons: dict[str, list[str]] = {}
        self.consumers: dict[str, list] = {}
        self.t = _tensor_infos(graph)
        self.image = bytearray()
        self.engines: dict[str, str] = {}
        self.layers: dict[str, _Layer] = {}
        self.kinds: dict[str, str] = {}
        self.wrange: dict[str, tuple[int, int]] = {}
        self.l3 = False
        self.bounce_in = self.bounce_out = (0, 0)  # L2 bounce slots of L3 tensors' tiles
        self.stage: tuple[int, ...] = ()  # L2 slots of weight groups staged from L3
        self.l3_costs = False  # the tile costs include the L3 transfers of the placement
        self.slices: dict[str, tuple[str, int]] = {}  # concat inputs in their output (views)


def plan(graph: LayerGraph, cfg: MarsellusConfig, knobs: dict | None = None,
         op: OperatingPoint | None = None) -> MarsProgram:
    """Compile a layer graph to a MARSELLUS program (``knobs``: ``{layer: {knob: value}}``, plus
    the globals ``"biased_hwc": False`` to store signed HWC tensors two's complement,
    ``"prefetch_weights": False`` to load every layer's weights in its own stream,
    ``"cluster_marshals_out": False`` and ``"objective"``: ``"energy"`` (default) or
    ``"latency"``, what a residual add's engine choice minimises; ``op``: the operating point
    whose energy that choice weighs, default nominal). A batch beyond L2 / L3 runs in passes
    of the largest sub-batch that fits (``MarsProgram.passes``)."""
    try:
        return _plan(graph, cfg, knobs, op)
    except CapacityError as e:
        return plan_in_passes(graph, e, lambda g: _plan(g, cfg, knobs, op))


def _plan(graph: LayerGraph, cfg: MarsellusConfig, knobs: dict | None,
          op: OperatingPoint | None) -> MarsProgram:
    """The four stages over the whole graph, one pass."""
    graph, knobs, parents = expand_phases(maps_first(graph), knobs)
    graph, slices, concats = expand_concats(graph)
    p = Planner(graph, cfg, knobs, op)
    p.slices = slices
    p._choose()  # 1. engines: the engine of every layer, the layout of every tensor
    progs = p.tile_layers()  # 2. tiling: tiles and knobs, the weights into the L2 image
    progs, l2_bytes, l3_bytes = p.place(progs)  # 3. memory: the L2 / L3 map
    return merge_phases(p.emit_program(progs, l2_bytes, l3_bytes), parents | concats,
                        graph)  # 4.


def layer_knob_spaces(graph: LayerGraph, cfg: MarsellusConfig) -> dict[str, KnobSpace]:
    """The knob space of every layer (defaults = the solver's choice). An add's ``engine`` is
    left out: a tuning task measures one layer alone, with HWC inputs, where the RBE add (whose
    gain is the marshaling it spares its neighbours) cannot run; set it in ``knobs``."""
    graph, slices, _ = expand_concats(expand_phases(maps_first(graph), None)[0])
    p = Planner(graph, cfg)
    p.slices = slices
    p._choose()
    out = {}
    for ly in p.g.layers:
        if getattr(ly, "parent", ""):  # knobs of a decomposed layer hold for all its parts
            continue
        p._layer(ly)
        lay = p.layers[ly.name]
        out[ly.name] = knob_space(lay, lay.kind == "conv" and not rbe_reasons(
            ly, lay.tin, lay.tout, cfg))
    return out
