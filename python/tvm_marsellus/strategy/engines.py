"""Engine stage: the engine of every layer (RBE or the cluster; the global knob ``objective``
says whether the choice minimises estimated energy or time) and from it the L2 layout of every
tensor (``docs/marsellus.md``, Engines and layouts)."""

from __future__ import annotations

from tvm_accel.errors import MappingError
from tvm_accel.layers import AddLayer, ConvLayer, LutLayer, MulLayer, PoolLayer
from tvm_marsellus.strategy.layers import (
    RBE_NO_KIN,
    _clip_mode,
    _geometry,
    _rng,
    add_rbe_reasons,
    layer_reads,
    rbe_reasons,
)
from tvm_marsellus.strategy.tiling import _Layer, use_pairs

#: the cores take an RBE-capable conv only when their estimated time is below this share of
#: the RBE's (the RBE is the engine the design is built around; similar power, Sec. III)
CLUSTER_WINS = 0.5


#: values of the global knob ``objective``: what the engine choice of a residual add minimises
OBJECTIVES = ("energy", "latency")


class EngineChoice:
    """Planner stage: the engine of every layer and the layout of every tensor."""

    def _kind(self, layer) -> str:
        if isinstance(layer, ConvLayer):
            if layer.is_dense:
                return "fc"
            if layer.groups == 1:
                return "conv"
            if layer.is_depthwise and layer.weight.shape[0] == layer.groups:
                return "dw"
            raise MappingError(f"layer {layer.name}: grouped conv other than depthwise")
        if isinstance(layer, AddLayer):
            return "add"
        if isinstance(layer, PoolLayer):
            return "pool"
        if isinstance(layer, LutLayer):
            return "lut"
        if isinstance(layer, MulLayer):
            return "mul"
        raise MappingError(f"layer {layer.name}: {type(layer).__name__} has no MARSELLUS kernel")

    def _cluster_much_faster(self, ly: ConvLayer) -> bool:
        """Default engine rule: the RBE unless the cores' estimated time is below
        ``CLUSTER_WINS`` x the RBE's (e.g. a stem conv with 3 input channels, which fills 3 of
        the RBE's 32 BinConv channels). The RBE estimate includes HWC marshaling on both sides,
        which a conv inside an RBE chain does not pay: the rule is conservative for the cores
        only where that marshaling dominates (small outputs of host tensors)."""
        tin, tout = self.t[ly.input], self.t[ly.output]
        try:
            _clip_mode(ly, tout, tout.cbits)
        except MappingError:
            return False
        geo = _geometry(ly, tin, tout)
        cost = {}
        for eng in ("rbe", "cluster"):
            try:
                cost[eng] = _Layer(ly, "conv", eng, geo, [tin], tout,
                                   self.cfg).solve_width()[2]
            except MappingError:
                cost[eng] = float("inf")
        return cost["cluster"] < CLUSTER_WINS * cost["rbe"]

    def _choose(self) -> None:
        """Engines, then layouts. A conv the RBE can run but whose cores are much faster
        (:meth:`_cluster_much_faster`) goes back to the RBE under ``objective: energy`` when
        that costs less estimated energy over it and its neighbours (:meth:`_near_cost`: its
        RBE readers then need no marshaling, but the RBE's power is mostly time-proportional,
        so ResNet-20's 3-channel stem stays on the faster cores)."""
        faster: list = []
        consumers: dict[str, list] = {}
        for ly in self.g.layers:
            ins = layer_reads(ly)
            for n in ins:
                consumers.setdefault(n, []).append(ly)
        for ly in self.g.layers:
            kind = self._kind(ly)
            self.kinds[ly.name] = kind
            eng = "cluster"
            user = self.user.get(ly.name, {})
            if kind == "conv":
                reasons = rbe_reasons(ly, self.t[ly.input], self.t[ly.output], self.cfg)
                tc = user.get("tile_c")
                if isinstance(tc, int) and tc < self.t[ly.input].c:  # Kin tiling asked for
                    reasons.append(RBE_NO_KIN)
                want = user.get("engine")
                if want is None:
                    want = "cluster" if reasons or self._cluster_much_faster(ly) else "rbe"
                    if want == "cluster" and not reasons:
                        faster.append(ly)
                if want == "rbe" and reasons:
                    if "engine" in user:
                        raise MappingError(f"layer {ly.name}: engine rbe: {reasons[0]}")
                else:
                    eng = want
            self.engines[ly.name] = eng
        self.consumers = consumers
        self._choose_adds()
        if self.objective == "energy":
            moved = [ly for ly in faster
                     if self._near_cost(ly, "rbe") < self._near_cost(ly, "cluster")]
            for ly in moved:
                self.engines[ly.name] = "rbe"
            if moved:
                self._choose_adds()
        io = set(self.g.inputs) | set(self.g.outputs)
        # biased HWC: a signed tensor between kernels that all fold an offset (not max pool,
        # whose clamp cannot subtract it) is stored unsigned, so the RBE reads it without the
        # CL.ADD marshaling step
        for ly in self.g.layers:
            t = self.t[ly.output]
            if t.layout != "hwc" or not t.signed or ly.output in io or not consumers.get(
                    ly.output):
                continue
            if self.kinds[ly.name] == "lut" or (self.kinds[ly.name] == "pool" and ly.kind == "max"):
                continue
            if any(self.kinds[c.name] == "pool" and c.kind == "max" for c in consumers[ly.output]):
                continue
            lo, hi = _rng(t.bits, True)
            if (ly.requant.qmin, ly.requant.qmax) != (lo, hi):
                continue
            if self.engines[ly.name] != "rbe" and t.bits != t.cbits:
                continue
            if self.user.get("biased_hwc", True):
                t.biased = True

    def _layouts(self) -> None:
        """Tensor layouts from the engines: ``rbe`` when produced by the RBE, read only by the
        RBE, not a function input or output, and clipped to its full range; else ``hwc``."""
        io = set(self.g.inputs) | set(self.g.outputs)
        for t in self.t.values():
            t.layout = "hwc"
        for ly in self.g.layers:
            out, cons = ly.output, self.consumers.get(ly.output)
            if ((self.engines[ly.name] == "rbe" or self._cluster_marshals(ly)) and out not in io
                    and cons and all(self.engines[c.name] == "rbe" for c in cons)):
                rq = ly.requant
                lo, hi = _rng(self.t[out].bits, self.t[out].signed)
                if rq.qmin == lo and rq.qmax == hi:
                    self.t[out].layout = "rbe"

    def _cluster_marshals(self, ly) -> bool:
        """A cluster conv, depthwise conv or ADD whose output only RBE layers read writes it in
        the RBE layout (``CL.HWC2RBE`` on its output tile): marshaled once, where the readers
        would each marshal it again, with their halos. Its container must be the tensor's width
        (a cluster kernel clamps to its container) and inside the RBE's precisions."""
        t = self.t[ly.output]
        return (self.engines[ly.name] == "cluster" and self.kinds[ly.name] in ("conv", "dw", "add")
                and not t.dense and t.bits == t.cbits
                and self.cfg.RBE_MIN_BITS <= t.bits <= self.cfg.RBE_MAX_BITS
                and self.user.get("cluster_marshals_out", True))

    def _choose_adds(self) -> None:
        """Engines of the residual adds, then the layouts. An add runs on the RBE (a 1x1
        BinConv over its operands stacked along Kin, ``numerics.add_recipe``) when the recipe
        allows it and both operands end up in the RBE layout (they are produced by the RBE and
        read only by it), unless the knob ``engine`` says otherwise or the cost model finds the
        cluster ADD cheaper under the global knob ``objective`` (estimated energy by default,
        or estimated time with ``latency``): the add with the layer(s) producing its operands,
        those reading them and those reading its output, whose layouts (and marshaling) change
        with the add's engine (:meth:`_near_cost`)."""
        adds = [ly for ly in self.g.layers if self.kinds[ly.name] == "add"]
        for ly in adds:
            a, b = (self.t[n] for n in ly.inputs)
            r = add_rbe_reasons(ly, a, b, self.t[ly.output], self.cfg)
            want = self.user.get(ly.name, {}).get("engine")
            if want == "rbe" and r:
                raise MappingError(f"layer {ly.name}: engine rbe: {r[0]}")
            self.add_reasons[ly.name] = r
            self.engines[ly.name] = "rbe" if not r and want != "cluster" else "cluster"
        self._settle_adds(adds)
        for ly in adds:
            if self.engines[ly.name] != "rbe" or "engine" in self.user.get(ly.name, {}):
                continue
            if self._near_cost(ly, "cluster") < self._near_cost(ly, "rbe"):
                self.engines[ly.name] = "cluster"
                self._settle_adds(adds)
        self._layouts()

    def _settle_adds(self, adds: list) -> None:
        """Move to the cluster every RBE add with an operand that is not in the RBE layout
        (until none is left: an add's output may be another add's operand)."""
        while True:
            self._layouts()
            bad = [ly for ly in adds if self.engines[ly.name] == "rbe"
                   and any(self.t[n].layout != "rbe" for n in ly.inputs)]
            if not bad:
                return
            for ly in bad:
                n = next(n for n in ly.inputs if self.t[n].layout != "rbe")
                why = (f"operand {n} is not in the RBE layout (a function input or output, made "
                       "by the cluster, or also read by the cluster)")
                if self.user.get(ly.name, {}).get("engine") == "rbe":
                    raise MappingError(f"layer {ly.name}: engine rbe: {why}")
                self.add_reasons[ly.name].append(why)
                self.engines[ly.name] = "cluster"

    def _near_cost(self, layer, eng: str) -> float:
        """Estimated energy (pJ) of a layer and of the layers whose layouts depend on its
        engine (its inputs' producers and readers, its output's readers), with the layer on
        ``eng`` (each at its own best tile); their estimated cycles under ``objective:
        latency``."""
        saved = self.engines[layer.name]
        self.engines[layer.name] = eng
        self._layouts()
        names = set(layer_reads(layer)) | {
            layer.output}
        near = [ly for ly in self.g.layers if ly.output in names or any(
            n in names for n in (layer_reads(ly)))]
        total = 0.0
        for ly in near:
            ins = layer_reads(ly)
            tins = [self.t[n] for n in ins]
            lay = _Layer(ly, self.kinds[ly.name], self.engines[ly.name],
                         _geometry(ly, tins[0], self.t[ly.output]), tins, self.t[ly.output],
                         self.cfg)
            try:
                lay.pair = use_pairs(lay, self.user)
                th, kt, cycles = lay.solve_width()
                total += cycles if self.objective == "latency" else lay.energy(th, kt,
                                                                               self.coef)
            except MappingError:
                total = float("inf")
                break
        self.engines[layer.name] = saved
        self._layouts()
        return total
