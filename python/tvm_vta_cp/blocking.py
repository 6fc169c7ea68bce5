"""The runtime's NCHWnc blocking folded into the layout-rewrite host functions.

After lowering, where a VTA call's input comes only from a rewrite (``im2col``/``pack``) and its
single output goes only to an ``unpack``, the host function is rebuilt from its recipe
(:data:`~tvm_vta_cp.rewrite.RECIPE_ATTR`) to write (read) the tensor's DRAM form, so the
rewrite and the blocking are one host pass instead of two.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from tvm_accel.partition import HOST_FUNCTION_ATTR
from tvm_vta_cp.codegen import build_blob, load_blob
from tvm_vta_cp.layout import packed_shape
from tvm_vta_cp.rewrite import (
    RECIPE_ATTR,
    LayoutRewrite,
    ResolvedLayout,
    host_function,
    input_steps,
    resolve_layout,
    unpack_steps,
    var_users,
)

R = relax.op

__all__ = ["BlockedTensor", "block_steps", "fuse_blocking", "layout_of_recipe", "unblock_steps"]


def layout_of_recipe(recipe: str) -> tuple[ResolvedLayout, tuple[int, ...], int]:
    """(layout, source input shape, input zero point) of a host function's recipe."""
    r = json.loads(recipe)
    spec = LayoutRewrite(tuple(r["unroll"]), tuple(r["pack"]))
    return (resolve_layout(spec, r["input_shape"], r["weight_shape"], r["strides"], r["padding"],
                           r["dilation"]), tuple(r["input_shape"]), int(r["zero_point"]))


def block_steps(p, cfg) -> list[tuple[str, Callable]]:
    """(N, C, H, W) of ``p.dtype`` -> ``p``'s DRAM form: stored int8 (uint8 as value-128),
    batch and channels padded to the GEMM block and the halo added, both with ``p.fill``, and
    ``(NB, CB, H', W', BATCH, BLOCK)`` order (what :func:`~tvm_vta_cp.layout.pack_tensor`
    does in the runtime)."""
    nb, cb, hp, wp, b, blk = packed_shape(p, cfg)
    n, c, _, _ = p.shape
    ht, hl, hb, hr = p.halo
    steps: list[tuple[str, Callable]] = []
    if p.dtype == "uint8":
        steps.append(("stored", lambda t: R.astype(
            R.subtract(R.astype(t, "int16"), relax.const(128, "int16")), "int8")))
    widths = [0, nb * b - n, 0, cb * blk - c, ht, hb, hl, hr]
    if any(widths):
        steps.append(("blockpad", lambda t: R.nn.pad(t, widths, pad_value=float(p.fill))))
    steps += [("lanes", lambda t: R.reshape(t, [nb, b, cb, blk, hp, wp])),
              ("blocked", lambda t: R.permute_dims(t, [0, 2, 4, 5, 1, 3]))]
    return steps


def unblock_steps(p, cfg) -> list[tuple[str, Callable]]:
    """``p``'s DRAM form -> (N, C, H, W) of ``p.dtype`` (the runtime's unpack)."""
    nb, cb, hp, wp, b, blk = packed_shape(p, cfg)
    n, c, h, w = p.shape
    ht, hl, _, _ = p.halo
    steps: list[tuple[str, Callable]] = [
        ("lanes", lambda t: R.permute_dims(t, [0, 4, 1, 5, 2, 3])),
        ("nchw", lambda t: R.reshape(t, [nb * b, cb * blk, hp, wp]))]
    if (nb * b, cb * blk, hp, wp) != (n, c, h, w):
        steps.append(("interior", lambda t: R.strided_slice(
            t, [0, 1, 2, 3], [0, 0, ht, hl], [n, c, ht + h, hl + w])))
    if p.dtype == "uint8":
        steps.append(("value", lambda t: R.astype(
            R.add(R.astype(t, "int16"), relax.const(128, "int16")), "uint8")))
    return steps


@dataclass(frozen=True)
class BlockedTensor:
    """A VTA call input or output whose NCHWnc blocking a host function does."""

    function: str   # blob (offloaded function) name
    tensor: str     # the program tensor
    symbol: str     # the host function
    nbytes: int     # bytes of the blocked form


def _host_of(var2val: dict, hosts: dict, var, ops: tuple[str, ...]) -> str | None:
    """The host function (one of ``ops``) whose call ``var`` is bound to, if any."""
    v = var2val.get(var)
    if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.GlobalVar) \
            and v.op.name_hint in hosts and v.op.name_hint.rsplit("_", 1)[-1] in ops:
        return v.op.name_hint
    return None


def _fuse_call(b, users_of: Callable, host_of: Callable, hosts: dict, new_funcs: dict):
    """One VTA call ``b``: rebuild (into ``new_funcs``) the rewrite function that alone feeds
    an input and the unpack that alone reads its single output, mark those tensors blocked;
    returns ``(re-encoded blob, output type, [BlockedTensor])`` or None when nothing fuses."""
    blob, *args = b.value.args[1].fields
    program, cfg, name = load_blob(blob.value.numpy().tobytes())

    def rebuild(sym: str, tname: str, param_ty, steps) -> BlockedTensor:
        program.tensors[tname].blocked = True
        new_funcs[sym] = host_function(sym, param_ty, steps, hosts[sym][1].attrs[RECIPE_ATTR])
        return BlockedTensor(name, tname, sym, program.tensors[tname].nbytes)

    changed = []
    for tname, a in zip(program.inputs, args, strict=True):
        sym = host_of(a, ("im2col", "pack")) if isinstance(a, relax.Var) else None
        if sym is not None and users_of(a) == {b.var} and sym not in new_funcs:
            lay, x_shape, zx = layout_of_recipe(hosts[sym][1].attrs[RECIPE_ATTR])
            steps = input_steps(lay, x_shape, zx) + block_steps(program.tensors[tname], cfg)
            changed.append(rebuild(sym, tname, hosts[sym][1].params[0].ty, steps))
    out_ty = b.value.ty_args[0]
    outs = users_of(b.var) or set()
    if len(program.outputs) == 1 and len(outs) == 1 and "return" not in outs:
        (u,) = outs
        sym, tname = host_of(u, ("unpack",)), program.outputs[0]
        if sym is not None and sym not in new_funcs:
            lay, _, _ = layout_of_recipe(hosts[sym][1].attrs[RECIPE_ATTR])
            p = program.tensors[tname]
            p.blocked = True  # the output type is the blocked form
            out_ty = relax.TensorType(p.io_shape(cfg), "int8")
            changed.append(rebuild(sym, tname, out_ty,
                                   unblock_steps(p, cfg) + unpack_steps(lay)))
    if not changed:
        return None
    return build_blob(program, cfg, name), out_ty, changed


def _is_run_call(v, runtime_func: str) -> bool:
    return (isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)
            and v.op.name == "relax.call_dps_packed"
            and isinstance(v.args[0], relax.ExternFunc)
            and v.args[0].global_symbol == runtime_func)


def fuse_blocking(mod: tvm.IRModule, runtime_func: str = "tvm_vta_cp.run"
                  ) -> tuple[tvm.IRModule, list[BlockedTensor], dict[str, bytes]]:
    """Fold the runtime's NCHWnc blocking into the layout-rewrite host functions: where a VTA
    call's input comes only from a rewrite (``im2col``/``pack``) and where its single output
    goes only to an ``unpack``, the host function is rebuilt to write (read) the tensor's DRAM
    form, the blob marks the tensor ``blocked`` and the call passes the blocked array, so each
    direction is one host pass (TVM fuses the ops of a host function into one loop nest)
    instead of a rewrite pass plus the runtime's pack. Returns the module, the blocked
    tensors and the re-encoded blob of each function that changed, by name."""
    hosts = {gv.name_hint: (gv, f) for gv, f in mod.functions_items()
             if isinstance(f, relax.Function) and f.attrs is not None and RECIPE_ATTR in f.attrs}
    if not hosts:
        return mod, [], {}
    new_funcs: dict[str, relax.Function] = {}
    calls: dict = {}  # call_dps_packed binding var -> (new blob, new out type)
    fused: list[BlockedTensor] = []
    blobs: dict[str, bytes] = {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function) or (func.attrs is not None and (
                HOST_FUNCTION_ATTR in func.attrs or "Codegen" in func.attrs)):
            continue
        var2val, users = relax.analysis.get_var2val(func), var_users(func)
        host_of = functools.partial(_host_of, var2val, hosts)

        for block in func.body.blocks:
            for b in block.bindings:
                if not _is_run_call(b.value, runtime_func):
                    continue
                found = _fuse_call(b, users.get, host_of, hosts, new_funcs)
                if found is not None:
                    data, out_ty, changed = found
                    calls[b.var] = (relax.const(np.frombuffer(data, dtype=np.uint8), "uint8"),
                                    out_ty)
                    blobs[changed[0].function] = data
                    fused += changed
    if not fused:
        return mod, [], {}
    base = tvm.IRModule({g: f for g, f in mod.functions_items() if g.name_hint not in new_funcs},
                        attrs=mod.attrs)
    bb = relax.BlockBuilder(base)
    remap = {sym: bb.add_func(relax.transform.ConvertToDataflow()(
        tvm.IRModule({hosts[sym][0]: f}))[hosts[sym][0]], sym) for sym, f in new_funcs.items()}
    out = bb.get()
    callers = [gv for gv, f in out.functions_items()
               if isinstance(f, relax.Function) and gv.name_hint not in hosts
               and (f.attrs is None or "Codegen" not in f.attrs)]
    for gv in callers:
        mutator = _Recall(out, calls, remap, runtime_func)
        new = mutator.visit_expr(out[gv])
        out = mutator.builder_.get()
        out[gv] = new
    relax.analysis.well_formed(out)
    return out, fused, blobs


@relax.expr_functor.mutator
class _Recall(relax.PyExprMutator):
    """Calls the rebuilt host functions and passes the re-encoded blobs and blocked types."""

    def __init__(self, mod: tvm.IRModule, calls: dict, remap: dict, runtime_func: str):
        super().__init__(mod)
        self.calls, self.remap, self.runtime_func = calls, remap, runtime_func

    def visit_call_(self, call):
        if isinstance(call.op, tvm.ir.GlobalVar) and call.op.name_hint in self.remap:
            return relax.Call(self.remap[call.op.name_hint],
                              [self.visit_expr(a) for a in call.args])
        return super().visit_call_(call)

    def visit_var_binding_(self, binding):
        if binding.var not in self.calls:
            return super().visit_var_binding_(binding)
        blob, ty = self.calls[binding.var]
        args = [self.visit_expr(a) for a in binding.value.args[1].fields[1:]]
        if isinstance(ty, relax.TupleType):  # several outputs: one DPS buffer each
            ty = list(ty.fields)
        call = relax.call_dps_packed(self.runtime_func, [blob, *args], ty)
        output = (not isinstance(binding.var, relax.DataflowVar)
                  and self.builder_.current_block_is_dataflow())
        emit = self.builder_.emit_output if output else self.builder_.emit
        self.set_var_remap(binding.var, emit(call, binding.var.name))
