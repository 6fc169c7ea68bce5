"""Layouts carried across the network: consecutive VTA calls exchange their DRAM form.

After :func:`~tvm_vta_cp.blocking.fuse_blocking` a tensor going from one VTA call to the next
still crosses the host twice: the producer's output is unblocked to NCHW (by the runtime, or by
an image pack's ``unpack`` host function) and the consumer's input is blocked again (by the
runtime, or by its ``im2col`` / ``pack`` host function). :func:`carry_layouts` makes the producer
hand over its blocked form and the consumer take its blocked form, with at most one host pass
in between:

- none when the consumer's placement equals the producer's (shape, dtype, halo, fill): the
  blocked array is passed as it is (padded lanes hold whatever the producer computed there,
  which the consumer never uses: its padded weight lanes are zero, its padded output lanes are
  discarded);
- else one ``relayout`` host function (unblock, the producer's unpack if any, block), or the
  consumer's rewrite function rebuilt to read the blocked source (unblock, unpack, then its
  gather and blocking).

Users of the NCHW value that remain (CPU operators, the function's result) read it from an
``unblock`` host function, the pass the runtime did before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from tvm_accel.frontend import sanitize_name
from tvm_accel.partition import HOST_FUNCTION_ATTR
from tvm_vta_cp.blocking import block_steps, layout_of_recipe, unblock_steps
from tvm_vta_cp.codegen import build_blob, load_blob
from tvm_vta_cp.layout import dims4
from tvm_vta_cp.rewrite import (
    HOST_PREFIX,
    RECIPE_ATTR,
    host_function,
    input_steps,
    unpack_steps,
    var_users,
)

__all__ = ["carry_layouts", "same_layout"]


def same_layout(a, b) -> bool:
    """Two placements whose DRAM forms are interchangeable (the blocked array of one is the
    other's)."""
    return (dims4(a.shape) == dims4(b.shape) and a.dtype == b.dtype
            and tuple(a.halo) == tuple(b.halo) and int(a.fill) == int(b.fill))


def _logical_bytes(shape, dtype: str) -> int:
    return int(np.prod(shape)) * np.dtype(dtype).itemsize


@dataclass
class _Call:
    """One ``tvm_vta_cp.run`` binding: its decoded blob and its tensor arguments."""

    var: relax.Var
    program: object
    cfg: object
    name: str
    args: list
    block_output: bool = False
    blocked_inputs: set = field(default_factory=set)

    @property
    def output(self):
        return self.program.tensors[self.program.outputs[0]]


@dataclass(frozen=True)
class _Source:
    """Where a consumer's NCHW value comes from: the blocked output of ``producer``, unblocked
    (``unpack`` None) or unblocked and unpacked by the host function ``unpack``."""

    producer: relax.Var
    unpack: str | None = None
    repack: str | None = None  # then brought into another packed layout (``propagate``)


def _is_run_call(v, runtime_func: str) -> bool:
    return (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)
            and v.op.name == "relax.call_dps_packed"
            and isinstance(v.args[0], relax.ExternFunc)
            and v.args[0].global_symbol == runtime_func)


def _host_op(val, hosts: dict) -> str | None:
    """The host function symbol ``val`` calls, if it is one of ``hosts``."""
    if isinstance(val, relax.Call) and isinstance(val.op, tvm.ir.GlobalVar) \
            and val.op.name_hint in hosts:
        return val.op.name_hint
    return None


class _Plan:
    """What to change in one caller function."""

    def __init__(self, func: relax.Function, hosts: dict, runtime_func: str):
        self.hosts = hosts
        self.var2val = relax.analysis.get_var2val(func)
        self.users = var_users(func)
        self.calls: dict[relax.Var, _Call] = {}
        for block in func.body.blocks:
            for b in block.bindings:
                if _is_run_call(b.value, runtime_func):
                    blob, *args = b.value.args[1].fields
                    program, cfg, name = load_blob(blob.value.numpy().tobytes())
                    self.calls[b.var] = _Call(b.var, program, cfg, name, list(args))
        self.relayout: dict[tuple[relax.Var, int], _Source] = {}
        self.rebuild: dict[relax.Var, tuple[str, _Source, _Call, str]] = {}
        for c in self.calls.values():
            for i, (tname, a) in enumerate(zip(c.program.inputs, c.args, strict=True)):
                if isinstance(a, relax.Var):
                    self._consumer(c, i, tname, a)
        for src in [*self.relayout.values(), *(r[1] for r in self.rebuild.values())]:
            if not self.calls[src.producer].output.blocked:
                self.calls[src.producer].block_output = True

    def source(self, v) -> _Source | None:
        """The blocked producer behind the NCHW value ``v``, if any."""
        c = self.calls.get(v)
        if c is not None:
            single = len(c.program.outputs) == 1 and not c.output.blocked
            return _Source(v) if single else None
        val = self.var2val.get(v)
        sym = _host_op(val, self.hosts)
        if sym is None or not sym.endswith("_unpack"):
            return None
        b = val.args[0]
        c = self.calls.get(b)
        if c is None or len(c.program.outputs) != 1:
            return None
        return _Source(b, sym)

    def _repacked(self, a: relax.Var) -> _Source | None:
        """The source behind a ``repack`` host function's result ``a``."""
        val = self.var2val.get(a)
        sym = _host_op(val, self.hosts)
        if sym is None or json.loads(str(self.hosts[sym].attrs[RECIPE_ATTR])).get(
                "op") != "repack" or not isinstance(val.args[0], relax.Var):
            return None
        src = self.source(val.args[0])
        return None if src is None else _Source(src.producer, src.unpack, sym)

    def _consumer(self, c: _Call, i: int, tname: str, a: relax.Var) -> None:
        if not c.program.tensors[tname].blocked:
            src = self.source(a) or self._repacked(a)
            if src is not None:
                self.relayout[(c.var, i)] = src
                c.blocked_inputs.add(tname)
            return
        val = self.var2val.get(a)  # blocked already: written by its rewrite function
        sym = _host_op(val, self.hosts)
        if sym is None or self.users.get(a) != {c.var} or not isinstance(val.args[0],
                                                                          relax.Var):
            return
        src = self.source(val.args[0])
        if src is not None:
            self.rebuild[a] = (sym, src, c, tname)

    @property
    def empty(self) -> bool:
        return not self.relayout and not self.rebuild


def _symbol(function: str, tensor: str, op: str, taken) -> str:
    base = f"{HOST_PREFIX}{sanitize_name(function)}_{sanitize_name(tensor)}_{op}"
    sym, k = base, 1
    while sym in taken:
        sym, k = f"{base}{k}", k + 1
    return sym


@relax.expr_functor.mutator
class _Carry(relax.PyExprMutator):
    """Emits the blocked calls, the relayout / unblock calls and the rebuilt rewrite calls."""

    def __init__(self, mod: tvm.IRModule, plan: _Plan, hosts: dict, new_funcs: dict,
                 meta: list, blobs: dict):
        super().__init__(mod)
        self.plan, self.hosts, self.new_funcs = plan, hosts, new_funcs
        self.meta, self.blobs = meta, blobs
        self.blocked: dict[relax.Var, relax.Var] = {}  # producer call var -> its blocked var
        self.gvs: dict[str, tvm.ir.GlobalVar] = {}

    def _func(self, sym: str, param_ty, steps, recipe: str) -> tvm.ir.GlobalVar:
        f = host_function(sym, param_ty, steps, recipe)
        f = relax.transform.ConvertToDataflow()(tvm.IRModule({sym: f}))[sym]
        self.new_funcs[sym] = f
        if sym not in self.gvs:
            self.gvs[sym] = self.builder_.add_func(f, sym)
        return self.gvs[sym]

    def _blocked_source(self, src: _Source) -> relax.Var:
        if src.producer in self.blocked:  # made blocked by this pass
            return self.blocked[src.producer]
        return self.visit_expr(src.producer)  # blocked by fuse_blocking

    def _source_steps(self, src: _Source):
        """Steps from the producer's blocked output to the NCHW value, and their kind."""
        c = self.plan.calls[src.producer]
        steps, shape = unblock_steps(c.output, c.cfg), dims4(c.output.shape)
        if src.unpack is not None:
            lay, _, _ = layout_of_recipe(self.hosts[src.unpack].attrs[RECIPE_ATTR])
            steps, shape = steps + unpack_steps(lay), lay.geometry.final_shape
        if src.repack is not None:
            from tvm_vta_cp.propagate import PackedGeometry, repack_steps

            r = json.loads(str(self.hosts[src.repack].attrs[RECIPE_ATTR]))
            steps = steps + repack_steps(PackedGeometry(
                tuple(r["output_shape"]), tuple(r["pack"]), tuple(r["final_shape"])))
        return steps, shape

    def _emit(self, expr, name: str, output: bool):
        return self.builder_.emit_output(expr, name) if output else self.builder_.emit(expr,
                                                                                       name)

    def visit_var_binding_(self, binding):
        var = binding.var
        output = (not isinstance(var, relax.DataflowVar)
                  and self.builder_.current_block_is_dataflow())
        if var in self.plan.rebuild:
            sym, src, c, tname = self.plan.rebuild[var]
            recipe = self.hosts[sym].attrs[RECIPE_ATTR]
            lay, x_shape, zx = layout_of_recipe(recipe)
            steps, _ = self._source_steps(src)
            steps = steps + input_steps(lay, x_shape, zx) + block_steps(
                c.program.tensors[tname], c.cfg)
            source = self._blocked_source(src)
            gv = self._func(sym, source.ty, steps, recipe)
            self.set_var_remap(var, self._emit(relax.Call(gv, [source]), var.name, output))
            return
        c = self.plan.calls.get(var)
        if c is None or not (c.block_output or c.blocked_inputs):
            return super().visit_var_binding_(binding)
        args = []
        for i, (tname, a) in enumerate(zip(c.program.inputs, c.args, strict=True)):
            src = self.plan.relayout.get((var, i))
            args.append(self.visit_expr(a) if src is None else self._relayout(c, tname, src))
        for tname in c.blocked_inputs:
            c.program.tensors[tname].blocked = True
        out = c.output
        if c.block_output:
            out.blocked = True
        data = build_blob(c.program, c.cfg, c.name)
        self.blobs[c.name] = data
        out_ty = relax.TensorType(out.io_shape(c.cfg), out.io_dtype) \
            if len(c.program.outputs) == 1 else binding.value.ty_args[0]
        if isinstance(out_ty, relax.TupleType):
            out_ty = list(out_ty.fields)
        call = relax.call_dps_packed(binding.value.args[0].global_symbol,
                                     [relax.const(np.frombuffer(data, dtype=np.uint8), "uint8"),
                                      *args], out_ty)
        if not c.block_output:
            self.set_var_remap(var, self._emit(call, var.name, output))
            return
        b = self.builder_.emit(call, f"{var.name}_blocked")
        self.blocked[var] = b
        sym = _symbol(c.name, c.program.outputs[0], "unblock", self.new_funcs)
        gv = self._func(sym, b.ty, unblock_steps(out, c.cfg),
                        json.dumps({"op": "unblock", "tensor": out.name}))
        nbytes = _logical_bytes(dims4(out.shape), out.dtype)
        self.meta.append({"symbol": sym, "layer": c.name, "op": "unblock", "read": nbytes,
                          "written": nbytes, "kind": "copy", "blocked": True})
        self.set_var_remap(var, self._emit(relax.Call(gv, [b]), var.name, output))

    def _relayout(self, c: _Call, tname: str, src: _Source):
        """The blocked argument for ``c``'s input ``tname`` from ``src``: the source itself when
        the layouts agree, else a relayout host function's result."""
        p = c.program.tensors[tname]
        source = self._blocked_source(src)
        producer = self.plan.calls[src.producer].output
        if src.unpack is None and src.repack is None and same_layout(producer, p):
            return source
        steps, shape = self._source_steps(src)
        sym = _symbol(c.name, tname, "relayout", self.new_funcs)
        gv = self._func(sym, source.ty, steps + block_steps(p, c.cfg),
                        json.dumps({"op": "relayout", "tensor": tname}))
        self.meta.append({"symbol": sym, "layer": c.name, "op": "relayout",
                          "read": _logical_bytes(shape, p.dtype),
                          "written": int(p.nbytes), "kind": "copy", "blocked": True})
        return self.builder_.emit(relax.Call(gv, [source]), f"{sanitize_name(tname)}_relayout")


def _called(mod: tvm.IRModule) -> set[str]:
    """Names of the global functions some function of ``mod`` calls."""
    names: set[str] = set()

    @relax.expr_functor.visitor
    class _V(relax.PyExprVisitor):
        def visit_call_(self, call):
            if isinstance(call.op, tvm.ir.GlobalVar):
                names.add(call.op.name_hint)
            super().visit_call_(call)

    for f in mod.functions.values():
        if isinstance(f, relax.Function):
            _V().visit_expr(f)
    return names


def carry_layouts(mod: tvm.IRModule, runtime_func: str = "tvm_vta_cp.run"
                  ) -> tuple[tvm.IRModule, list[dict], dict[str, bytes]]:
    """Let consecutive VTA calls exchange their blocked DRAM form (module docstring); host
    functions no longer called are dropped. Returns the module, the metadata of the host
    functions it added (``symbol``, ``layer``, ``op``, ``read``, ``written``, ``kind``) and the
    re-encoded blob of each function that changed."""
    hosts = {gv.name_hint: f for gv, f in mod.functions_items()
             if isinstance(f, relax.Function) and f.attrs is not None and RECIPE_ATTR in f.attrs}
    meta: list[dict] = []
    blobs: dict[str, bytes] = {}
    out = mod
    callers = [gv for gv, f in mod.functions_items()
               if isinstance(f, relax.Function) and (f.attrs is None or (
                   HOST_FUNCTION_ATTR not in f.attrs and "Codegen" not in f.attrs))]
    for gv in callers:
        plan = _Plan(out[gv], hosts, runtime_func)
        if plan.empty:
            continue
        new_funcs: dict[str, relax.Function] = {}
        rebuilt = {sym for sym, *_ in plan.rebuild.values()}  # re-added under the same name
        base = tvm.IRModule({g: f for g, f in out.functions_items()
                             if g.name_hint not in rebuilt}, attrs=out.attrs)
        mutator = _Carry(base, plan, hosts, new_funcs, meta, blobs)
        new = relax.analysis.remove_all_unused(mutator.visit_expr(out[gv]))
        out = mutator.builder_.get()
        out[gv] = new
    called = _called(out)
    dead = [g for g, f in out.functions_items() if isinstance(f, relax.Function)
            and f.attrs is not None and HOST_FUNCTION_ATTR in f.attrs
            and g.name_hint.startswith(HOST_PREFIX) and g.name_hint not in called]
    if not blobs and not dead:
        return mod, [], {}
    for g in dead:
        del out[g]
    relax.analysis.well_formed(out)
    return out, [m for m in meta if m["symbol"] in called], blobs
