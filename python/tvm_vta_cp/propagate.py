"""The image-pack layout propagated through residual adds (a layout choice that accounts for
the neighbours).

An image-packed conv's output leaves its call as ``(N * ph * pw, K, Ph, Pw)`` (the pieces in the
batch) and is unpacked on the host. A residual add reading it on the NCHW tensor runs with one
batch lane of ``BATCH`` (1 of 8 on ``vta_8x8x8``) and needs the unpack first. The add is
element-wise, so ``add(unpack(a), unpack(b)) == unpack(add(a, b))`` exactly when both operands
are packed alike: :func:`propagate_pack` makes such an add run on the packed operands (every
batch lane busy) and unpacks its result instead. An operand that is not packed alike is
brought into that layout by a ``repack`` host function (pad to whole pieces, regroup: a copy).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import tvm
from tvm import relax

from tvm_accel.frontend import sanitize_name
from tvm_accel.partition import layer_name, module_layer_names, qadd_pattern, static_shape
from tvm_vta_cp.blocking import layout_of_recipe
from tvm_vta_cp.rewrite import (
    RECIPE_ATTR,
    HostFunction,
    _regroup,
    host_function,
    host_symbol,
    note_own_shape,
    unpack_steps,
    var_users,
)

R = relax.op

__all__ = ["PackedGeometry", "propagate_pack", "repack_steps"]


@dataclass(frozen=True)
class PackedGeometry:
    """The packed output layout of an image pack: ``(N', K, Ph, Pw)`` holding ``pack`` pieces
    of the ``(N, K, Ho, Wo)`` image."""

    output_shape: tuple[int, int, int, int]
    pack: tuple[int, int]
    final_shape: tuple[int, int, int, int]

    @classmethod
    def of_recipe(cls, recipe: str) -> PackedGeometry:
        lay, _, _ = layout_of_recipe(recipe)
        return cls(tuple(lay.geometry.output_shape), tuple(lay.spec.pack),
                   tuple(lay.geometry.final_shape))


def repack_steps(g: PackedGeometry) -> list:
    """(N, K, Ho, Wo) -> the packed ``(N', K, Ph, Pw)`` of ``g`` (the inverse of the unpack; the
    cropped-away positions hold 0, never read back)."""
    (ph, pw), (_, k, oh, ow) = g.pack, g.output_shape
    n, _, ho, wo = g.final_shape
    steps = []
    if (ph * oh, pw * ow) != (ho, wo):
        widths = [0, 0, 0, 0, 0, ph * oh - ho, 0, pw * ow - wo]
        steps.append(("whole", lambda t: R.nn.pad(t, widths, pad_value=0.0)))
    dims = [("n", n), ("k", k), ("ph", ph), ("h", oh), ("pw", pw), ("w", ow)]
    return steps + _regroup(dims, ["n", "ph", "pw", "k", "h", "w"], g.output_shape)


def _recipe_of(gv_call, hosts: dict) -> str | None:
    if isinstance(gv_call, relax.Call) and isinstance(gv_call.op, tvm.ir.GlobalVar):
        f = hosts.get(gv_call.op.name_hint)
        if f is not None and gv_call.op.name_hint.endswith("_unpack"):
            return str(f.attrs[RECIPE_ATTR])
    return None


@dataclass
class _AddEdit:
    """One add to run packed: its chain of bindings and its operands' packed forms."""

    name: str
    chain: list            # [(var, call)] from the operands to the root, in order
    lhs: relax.Var
    rhs: relax.Var
    packed: dict           # operand var -> its packed var, or None (needs a repack)
    recipe: str            # the unpack recipe of the adopted layout
    geometry: PackedGeometry
    #: operands that are the result of an earlier packed add (its packed value is used)
    from_add: frozenset = frozenset()


def _chain(root_var, root, stops: set, var2val: dict, order: dict):
    """The bindings of the add from its operands (``stops``) to ``root``, in order; None when
    one of them is a nested call."""
    out, todo, seen = [], [(root_var, root)], set()
    while todo:
        var, e = todo.pop()
        if var in seen:
            continue
        seen.add(var)
        out.append((var, e))
        for a in e.args:
            if isinstance(a, relax.Var) and a not in stops and a in var2val \
                    and isinstance(var2val[a], relax.Call):
                todo.append((a, var2val[a]))
            elif isinstance(a, relax.Call):
                return None
    return sorted(out, key=lambda ve: order[ve[0]])


def binding_order(func: relax.Function) -> dict:
    """Each binding var of ``func`` -> its position in program order."""
    return {b.var: i for i, b in enumerate(b for blk in func.body.blocks for b in blk.bindings)}


def residual_adds(func: relax.Function, var2val: dict):
    """``(binding, core, lhs, rhs)`` of every quantized residual add of ``func`` in program
    order: ``core`` the matched add itself, ``lhs`` / ``rhs`` the vars bound to its operands
    (the matcher hands back the values), or the operand expressions where no var holds them."""
    pattern, ann_pats = qadd_pattern()
    bound = {val.__chandle__(): var for var, val in var2val.items()}
    for block in func.body.blocks:
        for b in block.bindings:
            if not isinstance(b.value, relax.Call):
                continue
            m = pattern.extract_matched_expr(b.value, var2val)
            if m is not None:
                lhs, rhs = (bound.get(m[ann_pats[k]].__chandle__(), m[ann_pats[k]])
                            for k in ("lhs", "rhs"))
                yield b, m[ann_pats["core"]], lhs, rhs


def _find_adds(func: relax.Function, hosts: dict, names: dict) -> list[_AddEdit]:
    var2val = relax.analysis.get_var2val(func)
    users = var_users(func)
    order = binding_order(func)
    edits = []
    earlier: dict = {}  # result var of an add run packed -> (its unpack recipe, geometry)
    for b, core, lhs, rhs in residual_adds(func, var2val):
        if not (isinstance(lhs, relax.Var) and isinstance(rhs, relax.Var)):
            continue
        recipes = {v: earlier[v][0] if v in earlier else _recipe_of(var2val.get(v), hosts)
                   for v in (lhs, rhs)}
        geos = {v: earlier[v][1] if v in earlier else PackedGeometry.of_recipe(r)
                for v, r in recipes.items() if r}
        if not geos:
            continue
        first = lhs if lhs in geos else rhs
        g = geos[first]
        if any(static_shape(v) != g.final_shape for v in (lhs, rhs)):
            continue  # a broadcasting add: the operands are not both the image
        chain = _chain(b.var, b.value, {lhs, rhs}, var2val, order)
        if chain is None:
            continue
        own = {v for v, _ in chain}
        if any(u not in own for v, _ in chain[:-1] for u in users.get(v, ())):
            continue
        from_add = frozenset(v for v in (lhs, rhs) if v in earlier and geos[v] == g)
        packed = {v: (v if v in from_add else var2val[v].args[0]) if geos.get(v) == g
                  else None for v in (lhs, rhs)}
        core_var = next((v for v, e in chain if e.same_as(core)), b.var)
        name = layer_name(core_var.name)
        edits.append(_AddEdit(names.get(name, name), chain, lhs, rhs, packed,
                              recipes[first], g, from_add))
        earlier[b.var] = (recipes[first], g)
        note_own_shape(name, g.output_shape, g.final_shape, g.final_shape)
    return edits


@relax.expr_functor.mutator
class _Mutator(relax.PyExprMutator):
    def __init__(self, mod, edits: dict, drop: set, meta: list):
        super().__init__(mod)
        self.edits, self.drop, self.meta = edits, drop, meta
        self.packed_result: dict = {}  # an add run packed -> its packed result (before unpack)

    def _host(self, t, steps, layer: str, op: str, recipe: str, name: str, output=False):
        sym = host_symbol(layer, op)
        gv = self.builder_.add_func(host_function(sym, t.ty, steps, recipe), sym)
        call = relax.Call(gv, [t])
        return self.builder_.emit_output(call, name) if output else self.builder_.emit(call,
                                                                                      name)

    def visit_var_binding_(self, binding):
        if binding.var in self.drop:
            return
        e = self.edits.get(binding.var)
        if e is None:
            return super().visit_var_binding_(binding)
        g = e.geometry
        remap = {}
        for side, v in (("lhs", e.lhs), ("rhs", e.rhs)):
            if v in remap:
                continue
            src = e.packed[v]
            if v in e.from_add:
                remap[v] = self.packed_result[v]
                continue
            if src is not None:
                remap[v] = self.visit_expr(src)
                continue
            recipe = json.dumps({"op": "repack", "output_shape": list(g.output_shape),
                                 "pack": list(g.pack), "final_shape": list(g.final_shape)})
            remap[v] = self._host(self.visit_expr(v), repack_steps(g), e.name, f"repack_{side}",
                                  recipe, f"{sanitize_name(e.name)}_repack_{side}")
            n, k, ho, wo = g.final_shape
            self.meta.append(HostFunction(host_symbol(e.name, f"repack_{side}"), e.name,
                                          "repack", n * k * ho * wo,
                                          int(_prod(g.output_shape))))
        t = None
        for var, call in e.chain:
            args = [remap.get(a, a) if isinstance(a, relax.Var) and a in remap
                    else self.visit_expr(a) for a in call.args]
            t = self.builder_.emit(relax.Call(call.op, args, call.attrs, call.ty_args),
                                   var.name)
            remap[var] = t
        self.packed_result[binding.var] = t
        output = (not isinstance(binding.var, relax.DataflowVar)
                  and self.builder_.current_block_is_dataflow())
        n, k, ho, wo = g.final_shape
        self.meta.append(HostFunction(host_symbol(e.name, "unpack"), e.name, "unpack",
                                      n * k * ho * wo, n * k * ho * wo))
        self.set_var_remap(binding.var, self._host(
            t, _unpack_of(e.recipe), e.name, "unpack", e.recipe,
            f"{sanitize_name(e.name)}_unpack", output))


def _prod(shape) -> int:
    out = 1
    for s in shape:
        out *= int(s)
    return out


def _unpack_of(recipe: str) -> list:
    lay, _, _ = layout_of_recipe(recipe)
    return unpack_steps(lay)


def propagate_pack(mod: tvm.IRModule) -> tuple[tvm.IRModule, list[HostFunction]]:
    """Run each quantized add with an image-packed operand on the packed layout (module
    docstring). Returns the module and the host functions added (``unpack`` of each such add,
    ``repack`` of an operand packed otherwise)."""
    hosts = {gv.name_hint: f for gv, f in mod.functions_items()
             if isinstance(f, relax.Function) and f.attrs is not None and RECIPE_ATTR in f.attrs}
    if not hosts:
        return mod, []
    meta: list[HostFunction] = []
    out = mod
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or (func.attrs is not None and any(
                k in func.attrs for k in ("Codegen", "Composite", "Primitive", RECIPE_ATTR))):
            continue
        edits = _find_adds(func, hosts, module_layer_names(mod))
        if not edits:
            continue
        mutator = _Mutator(out, {e.chain[-1][0]: e for e in edits},
                           {v for e in edits for v, _ in e.chain[:-1]}, meta)
        new = mutator.visit_expr(out[gv])
        out = mutator.builder_.get()
        out[gv] = relax.analysis.remove_all_unused(new)
    relax.analysis.well_formed(out)
    return out, meta
