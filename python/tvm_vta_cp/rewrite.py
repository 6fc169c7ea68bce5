"""Host-side data-layout rewrites around an offloaded convolution (the paper's Table 2 rules).

The CP embedding may ask for a conv's data to be laid out differently so the GEMM intrinsic
fills better: *stencil unroll* (kernel taps folded into the channel axis, im2col when both axes)
and *image pack* (output pieces folded into the batch). They run as plain Relax ops in host
functions around the accelerator call, while the conv keeps the exact canonical form, so VTA
still offloads it and the result is bit-exact. This module resolves a rewrite against a conv
(geometry, host bytes, weight order) and applies it as a module pass; the rules and the cost
model are in ``docs/vta.md``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from tvm_accel.frontend import sanitize_name
from tvm_accel.layers import ConvLayer, layer_shape_text
from tvm_accel.partition import (
    HOST_FUNCTION_ATTR,
    dtype_of,
    layer_name,
    module_layer_names,
    qlinear_pattern,
    static_shape,
)

R = relax.op
#: prefix of the host functions holding the rewrites (what ``tvmc run --profile`` times)
HOST_PREFIX = "vta_host_"
_AXES = ("h", "w")

__all__ = ["HOST_PREFIX", "RECIPE_ATTR", "ConvGeometry", "ConvInfo", "HostFunction",
           "LayoutRewrite", "ResolvedLayout", "apply_layout_rewrites", "conv_infos", "host_bytes",
           "host_function", "host_parts", "host_symbol", "input_steps", "layout_rewrite_pass",
           "resolve_layout", "rewrite_weight", "rewritten_conv_geometry", "unpack_steps",
           "var_users"]


#: (layer, the input shape VTA runs it at after a layout rewrite) -> the layer's own shape
#: text, for the reports (:func:`own_shape`); per process, like the strategy's decisions
OWN_SHAPES: dict[tuple[str, tuple[int, ...]], str] = {}


def note_own_shape(layer: str, run_shape, own_in, own_out, window=None) -> None:
    """Remember that ``layer``, run at input shape ``run_shape`` after a layout rewrite, is
    the layer ``own_in -> own_out`` of the model (``window``: its conv, for the kernel)."""
    OWN_SHAPES[(sanitize_name(layer), tuple(int(s) for s in run_shape))] = layer_shape_text(
        window, [own_in] * (1 if window is not None else 2), own_out)


def own_shape(layer: str, run_shape) -> str | None:
    """The shape text of ``layer`` as the model states it, when VTA runs it rewritten to input
    shape ``run_shape`` (None: not rewritten)."""
    return OWN_SHAPES.get((sanitize_name(layer), tuple(int(s) for s in run_shape)))


@dataclass(frozen=True)
class LayoutRewrite:
    """Host-side data-layout rewrite of one conv (the paper's Table 2 rules)."""

    unroll: tuple[str, ...] = ()     # stencil unroll (im2col): kernel axes folded into the
    #                                  channel axis, a subset of ("h", "w")
    pack: tuple[int, int] = (1, 1)   # image pack: the output image split into pack[0] x pack[1]
    #                                  pieces (rows x cols) folded into the batch

    def __post_init__(self):
        unroll = (self.unroll,) if isinstance(self.unroll, str) else tuple(self.unroll)
        if set(unroll) - set(_AXES) or len(set(unroll)) != len(unroll):
            raise ValueError(f"unroll must be a subset of ('h', 'w'), got {self.unroll!r}")
        pack = tuple(int(p) for p in self.pack)
        if len(pack) != 2 or min(pack) < 1:
            raise ValueError(f"pack must be two positive integers, got {self.pack!r}")
        object.__setattr__(self, "unroll", tuple(a for a in _AXES if a in unroll))
        object.__setattr__(self, "pack", pack)

    @property
    def is_identity(self) -> bool:
        return not self.unroll and self.pack == (1, 1)

    def describe(self) -> str:
        """Short label: ``"im2col(h,w)"``, ``"unroll(w)"``, ``"pack 1x8"``,
        ``"im2col(h,w)+pack 2x4"``, ``""`` for the identity."""
        parts = []
        if self.unroll:
            kind = "im2col" if len(self.unroll) == 2 else "unroll"
            parts.append(f"{kind}({','.join(self.unroll)})")
        if self.pack != (1, 1):
            parts.append(f"pack {self.pack[0]}x{self.pack[1]}")
        return "+".join(parts)


# --- geometry (pure python) ------------------------------------------------------------------
@dataclass(frozen=True)
class _Axis:
    """One spatial axis of a conv."""

    extent: int
    kernel: int
    stride: int
    pad: tuple[int, int]
    dilation: int

    @property
    def out(self) -> int:
        span = self.extent + self.pad[0] + self.pad[1] - (self.kernel - 1) * self.dilation - 1
        return span // self.stride + 1


def _rewrite_axis(ax: _Axis, unroll: bool, pieces: int) -> tuple[_Axis, np.ndarray]:
    """The axis of the rewritten conv and its gather: ``index[tap, piece, i]`` is the position
    along the original axis that rewritten position ``i`` of ``piece`` holds for ``tap`` (-1:
    padding, i.e. ``zx``)."""
    if unroll:
        idx = (np.arange(ax.out)[None, :] * ax.stride
               + np.arange(ax.kernel)[:, None] * ax.dilation - ax.pad[0])
        idx = np.where((idx >= 0) & (idx < ax.extent), idx, -1)
        cur = _Axis(ax.out, 1, 1, (0, 0), 1)
    else:
        idx = np.arange(ax.extent)[None, :]
        cur = ax
    if pieces == 1:
        return cur, idx[:, None, :]
    p = -(-cur.out // pieces)
    win = (p - 1) * cur.stride + (cur.kernel - 1) * cur.dilation + 1
    pos = np.arange(pieces)[:, None] * (p * cur.stride) + np.arange(win)[None, :] - cur.pad[0]
    inside = (pos >= 0) & (pos < cur.extent)
    idx = np.where(inside[None], idx[:, np.clip(pos, 0, cur.extent - 1)], -1)
    return _Axis(win, cur.kernel, cur.stride, (0, 0), cur.dilation), idx


@dataclass(frozen=True)
class ConvGeometry:
    """Shapes and attributes of the conv that runs on the accelerator after a rewrite."""

    input_shape: tuple[int, int, int, int]    # rewritten input (N', C', H', W')
    weight_shape: tuple[int, int, int, int]   # (K, C', KH', KW')
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]        # (top, left, bottom, right)
    dilation: tuple[int, int]
    output_shape: tuple[int, int, int, int]   # conv output before the unpack (N', K, Ho', Wo')
    final_shape: tuple[int, int, int, int]    # (N, K, Ho, Wo) after unpack and crop

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the rewritten conv (computed padding/crop included)."""
        n, k, ho, wo = self.output_shape
        return n * k * ho * wo * int(np.prod(self.weight_shape[1:]))


@dataclass(frozen=True)
class ResolvedLayout:
    """A rewrite resolved against one conv: geometry plus the per-axis gathers."""

    spec: LayoutRewrite
    geometry: ConvGeometry
    index_h: np.ndarray  # (taps, pieces, H')
    index_w: np.ndarray  # (taps, pieces, W')
    source_hw: tuple[int, int]

    @property
    def taps(self) -> tuple[int, int]:
        return self.index_h.shape[0], self.index_w.shape[0]

    @property
    def input_is_identity(self) -> bool:
        """No host op on the input: one tap, one piece and ``arange`` on both axes."""
        return all(ix.shape[:2] == (1, 1) and np.array_equal(ix[0, 0], np.arange(n))
                   for ix, n in ((self.index_h, self.source_hw[0]),
                                 (self.index_w, self.source_hw[1])))

    @property
    def packed(self) -> bool:
        return self.spec.pack != (1, 1)


def _ints(v, n: int, what: str) -> tuple[int, ...]:
    t = tuple(int(x) for x in v)
    if len(t) != n:
        raise ValueError(f"{what} must have {n} values, got {v!r}")
    return t


def resolve_layout(spec: LayoutRewrite, input_shape, weight_shape, strides, padding,
            dilation) -> ResolvedLayout:
    n, c, h, w = _ints(input_shape, 4, "input_shape")
    k, cw, kh, kw = _ints(weight_shape, 4, "weight_shape")
    if cw != c:
        raise ValueError(f"weight {weight_shape} does not read {c} input channels (groups 1)")
    sh, sw = _ints(strides, 2, "strides")
    pt, pl, pb, pr = _ints(padding, 4, "padding")
    dh, dw = _ints(dilation, 2, "dilation")
    ax_h, ax_w = _Axis(h, kh, sh, (pt, pb), dh), _Axis(w, kw, sw, (pl, pr), dw)
    if ax_h.out < 1 or ax_w.out < 1:
        raise ValueError("the conv has an empty output")
    new_h, idx_h = _rewrite_axis(ax_h, "h" in spec.unroll, spec.pack[0])
    new_w, idx_w = _rewrite_axis(ax_w, "w" in spec.unroll, spec.pack[1])
    batch = n * spec.pack[0] * spec.pack[1]
    cin = idx_h.shape[0] * idx_w.shape[0] * c
    geo = ConvGeometry(
        input_shape=(batch, cin, new_h.extent, new_w.extent),
        weight_shape=(k, cin, new_h.kernel, new_w.kernel),
        strides=(new_h.stride, new_w.stride),
        padding=(new_h.pad[0], new_w.pad[0], new_h.pad[1], new_w.pad[1]),
        dilation=(new_h.dilation, new_w.dilation),
        output_shape=(batch, k, new_h.out, new_w.out),
        final_shape=(n, k, ax_h.out, ax_w.out))
    return ResolvedLayout(spec, geo, idx_h, idx_w, (h, w))


def rewritten_conv_geometry(spec: LayoutRewrite, input_shape: tuple[int, int, int, int],
                            weight_shape: tuple[int, int, int, int],
                            strides: tuple[int, int] = (1, 1),
                            padding: tuple[int, int, int, int] = (0, 0, 0, 0),
                            dilation: tuple[int, int] = (1, 1)) -> ConvGeometry:
    """The conv that ``spec`` turns an (N, C, H, W) x (K, C, KH, KW) conv into (no TVM
    needed). ``padding`` is (top, left, bottom, right) like Relax's conv2d."""
    return resolve_layout(spec, input_shape, weight_shape, strides, padding, dilation).geometry


def host_parts(spec: LayoutRewrite, input_shape: tuple[int, int, int, int],
               weight_shape: tuple[int, int, int, int], strides: tuple[int, int] = (1, 1),
               padding: tuple[int, int, int, int] = (0, 0, 0, 0),
               dilation: tuple[int, int] = (1, 1), input_itemsize: int = 1,
               output_itemsize: int = 1) -> dict[str, tuple[int, int]]:
    """``{host op: (read, written)}`` bytes of each host function of the rewrite: the input
    rewrite (``im2col`` or ``pack``) and the output ``unpack`` (counting rule in
    ``docs/vta.md``, Host cost); empty for the identity."""
    lay = resolve_layout(spec, input_shape, weight_shape, strides, padding, dilation)
    geo = lay.geometry
    parts = {}
    if not lay.input_is_identity:
        n, c = int(input_shape[0]), int(input_shape[1])
        copied = n * c * int(np.count_nonzero(lay.index_h >= 0)) * int(
            np.count_nonzero(lay.index_w >= 0))
        parts["pack" if lay.packed else "im2col"] = (
            copied * input_itemsize, int(np.prod(geo.input_shape)) * input_itemsize)
    if lay.packed:
        out = int(np.prod(geo.final_shape)) * output_itemsize
        parts["unpack"] = (out, out)
    return parts


def host_bytes(spec: LayoutRewrite, input_shape: tuple[int, int, int, int],
               weight_shape: tuple[int, int, int, int], strides: tuple[int, int] = (1, 1),
               padding: tuple[int, int, int, int] = (0, 0, 0, 0),
               dilation: tuple[int, int] = (1, 1), input_itemsize: int = 1,
               output_itemsize: int = 1) -> tuple[int, int]:
    """``(read, written)`` host bytes of the input rewrite plus the output unpack (the counting
    rule is in ``docs/vta.md``, Host cost); ``(0, 0)`` for the identity."""
    parts = host_parts(spec, input_shape, weight_shape, strides, padding, dilation,
                       input_itemsize, output_itemsize).values()
    return sum(r for r, _ in parts), sum(w for _, w in parts)


def rewrite_weight(spec: LayoutRewrite, weight: np.ndarray) -> np.ndarray:
    """(K, C, KH, KW) weight in the channel order of the unrolled input (pack keeps it)."""
    uh, uw = "h" in spec.unroll, "w" in spec.unroll
    perm = [0] + [2] * uh + [3] * uw + [1] + [2] * (not uh) + [3] * (not uw)
    k, c, kh, kw = weight.shape
    taps = (kh if uh else 1) * (kw if uw else 1)
    return np.ascontiguousarray(weight.transpose(perm)).reshape(
        k, taps * c, 1 if uh else kh, 1 if uw else kw)


# --- matching canonical convs ------------------------------------------------------------------
@dataclass
class ConvInfo:
    """A canonical conv2d (groups 1) as offered to ``decide``."""

    name: str                                  # layer name (``<name>_acc`` is its conv2d)
    function: str                              # the Relax function holding it
    input_shape: tuple[int, int, int, int]
    input_dtype: str
    output_dtype: str
    weight_shape: tuple[int, int, int, int]
    strides: tuple[int, int]
    padding: tuple[int, int, int, int]
    dilation: tuple[int, int]
    input_zero_point: int
    layer: ConvLayer | None = None             # None when ConvLayer cannot express it

    def geometry(self, spec: LayoutRewrite) -> ConvGeometry:
        return rewritten_conv_geometry(spec, self.input_shape, self.weight_shape,
                                       self.strides, self.padding, self.dilation)

    def host_bytes(self, spec: LayoutRewrite) -> tuple[int, int]:
        return host_bytes(spec, self.input_shape, self.weight_shape, self.strides,
                          self.padding, self.dilation,
                          np.dtype(self.input_dtype).itemsize,
                          np.dtype(self.output_dtype).itemsize)

    def host_functions(self, spec: LayoutRewrite) -> list[HostFunction]:
        """The host functions ``spec`` adds around this conv, with their bytes."""
        parts = host_parts(spec, self.input_shape, self.weight_shape, self.strides,
                           self.padding, self.dilation, np.dtype(self.input_dtype).itemsize,
                           np.dtype(self.output_dtype).itemsize)
        return [HostFunction(host_symbol(self.name, op), self.name, op, r, w)
                for op, (r, w) in parts.items()]


@dataclass(frozen=True)
class HostFunction:
    """One host function of a layout rewrite (a private Relax function called around the
    accelerator call, so the VM can time it): its symbol, layer, op and modelled bytes."""

    symbol: str
    layer: str
    op: str        # im2col, pack or unpack
    read: int
    written: int


def host_symbol(layer: str, op: str) -> str:
    """Global name of the host function doing ``op`` for ``layer`` (an identifier: the ONNX
    name's dots become underscores)."""
    return f"{HOST_PREFIX}{sanitize_name(layer)}_{op}"


@dataclass
class _Match:
    """One canonical conv chain in a function: its bindings from ``astype(x)`` to the root."""

    info: ConvInfo
    data: relax.Expr
    chain: list[tuple[relax.Var, relax.Call]]
    conv_index: int


def _conv_layer(ann: dict, name: str, data_name: str, dilation: tuple[int, int]):
    from tvm_accel.lower import _requant, _scalar

    fields = ConvLayer.__dataclass_fields__
    if dilation != (1, 1) and "dilation" not in fields:
        return None
    core = ann["core"]
    w = ann["weight"].value.numpy().astype(np.int64)
    k = int(w.shape[0])
    rq = _requant(ann, k, _scalar(ann["pre_shift"]),
                  ann["multiplier"].value.numpy().astype(np.int64).reshape(-1))
    extra = {"dilation": dilation} if "dilation" in fields else {}
    return ConvLayer(name=name, input=data_name, output=name, weight=w,
                     bias=ann["bias"].value.numpy().astype(np.int64).reshape(-1),
                     input_zero_point=_scalar(ann["input_zero_point"]),
                     strides=tuple(int(s) for s in core.attrs.strides),
                     padding=tuple(int(p) for p in core.attrs.padding), requant=rq,
                     **extra)


def var_users(func: relax.Function) -> dict[relax.Var, set]:
    """Var -> the binding vars (or ``"return"``) whose value reads it."""
    users: dict[relax.Var, set] = {}
    for block in func.body.blocks:
        for b in block.bindings:
            for v in relax.analysis.free_vars(b.value):
                users.setdefault(v, set()).add(b.var)
    for v in relax.analysis.free_vars(func.body.body):
        users.setdefault(v, set()).add("return")
    return users


def _find_convs(fname: str, func: relax.Function, onnx_names: Mapping[str, str]
                ) -> list[_Match]:
    """The canonical convs of ``func`` that VTA offloads (a conv failing a check of VTA's
    pattern table stays on the CPU, so rewriting its layout would only cost host time), named
    by their ONNX nodes (``onnx_names``: var name -> ONNX name where they differ)."""
    from tvm_vta_cp.patterns import pattern_table

    checks = next(p for p in pattern_table() if p.op == "conv2d")
    pattern, ann_pats = qlinear_pattern("conv2d")
    var2val = relax.analysis.get_var2val(func)
    bound = {val.__chandle__(): var for var, val in var2val.items()}
    users = var_users(func)
    found = []
    for block in func.body.blocks:
        for b in block.bindings:
            if not isinstance(b, relax.VarBinding) or not isinstance(b.value, relax.Call):
                continue
            m = pattern.extract_matched_expr(b.value, var2val)
            if m is None:
                continue
            ann = {k: m[p] for k, p in ann_pats.items() if p in m}
            if not checks.failed_checks(ann):
                found.append(_match(fname, b, ann, bound, users, var2val, onnx_names))
    return [f for f in found if f is not None]


def _match(fname, binding, ann, bound, users, var2val, onnx_names) -> _Match | None:
    core, data = ann["core"], ann["data"]
    a = core.attrs
    xshape, wshape = static_shape(data), static_shape(ann["weight"])
    if (int(a.groups) != 1 or a.data_layout != "NCHW" or a.kernel_layout != "OIHW"
            or (a.out_layout or "NCHW") != "NCHW" or xshape is None or len(xshape) != 4
            or wshape is None or static_shape(core) is None):
        return None
    chain, e = [], binding.value
    var = binding.var
    while True:
        chain.append((var, e))
        prev = e.args[0]
        if prev.same_as(data) or (prev in var2val and var2val[prev].same_as(data)):
            data = prev  # the matcher may hand back the value bound to the input var
            break
        if not isinstance(prev, relax.Var) or prev not in var2val:
            return None  # a nested call: not the canonical one-op-per-binding form
        var, e = prev, var2val[prev]
    chain.reverse()
    own = {v for v, _ in chain}
    if any(u not in own for v, _ in chain[:-1] for u in users.get(v, ())):
        return None  # an intermediate is used outside the layer
    conv_index = next(i for i, (_, c) in enumerate(chain) if c.same_as(core))
    core_var = bound.get(core.__chandle__())
    name = layer_name(core_var.name if core_var is not None else binding.var.name)
    name = onnx_names.get(name, name)
    dilation = tuple(int(d) for d in a.dilation)
    zx = int(ann["input_zero_point"].value.numpy().reshape(-1)[0])
    data_name = data.name if isinstance(data, relax.Var) else "input"
    info = ConvInfo(name=name, function=fname, input_shape=xshape, input_dtype=dtype_of(data),
                    output_dtype=str(ann["root"].attrs.dtype), weight_shape=wshape,
                    strides=tuple(int(s) for s in a.strides),
                    padding=tuple(int(p) for p in a.padding), dilation=dilation,
                    input_zero_point=zx,
                    layer=_conv_layer(ann, name, data_name, dilation))
    return _Match(info, data, chain, conv_index)


# --- emitting the rewritten conv ---------------------------------------------------------------
def _regroup(dims: list[tuple[str, int]], order: list[str],
             shape: tuple[int, ...]) -> list[tuple[str, Callable]]:
    """Steps that reshape to ``dims`` (size-1 dims dropped), permute them into ``order`` and
    reshape to ``shape``; a single reshape when no permutation is needed."""
    kept = [(lbl, s) for lbl, s in dims if s > 1]
    labels = [lbl for lbl, _ in kept]
    perm = [labels.index(lbl) for lbl in order if lbl in labels]
    if perm == sorted(perm):
        return [("merge", lambda t: R.reshape(t, shape))]
    return [("split", lambda t: R.reshape(t, [s for _, s in kept])),
            ("tr", lambda t: R.permute_dims(t, perm)),
            ("merge", lambda t: R.reshape(t, shape))]


def input_steps(lay: ResolvedLayout, x_shape, zx: int) -> list[tuple[str, Callable]]:
    n, c, h, w = x_shape
    steps: list[tuple[str, Callable]] = []
    pads = [int(np.any(ix < 0)) for ix in (lay.index_h, lay.index_w)]
    if any(pads):
        steps.append(("pad", lambda t: R.nn.pad(t, [0, 0, 0, 0, 0, pads[0], 0, pads[1]],
                                                pad_value=float(zx))))
    for axis, ix, extent, label in ((2, lay.index_h, h, "rows"), (3, lay.index_w, w, "cols")):
        flat = np.where(ix < 0, extent, ix).reshape(-1).astype(np.int64)
        if flat.size == extent + pads[axis - 2] and np.array_equal(flat, np.arange(flat.size)):
            continue
        idx = relax.const(flat, "int64")
        steps.append((label, lambda t, idx=idx, axis=axis: R.take(t, idx, axis, mode="clip")))
    (th, ph, hh), (tw, pw, ww) = lay.index_h.shape, lay.index_w.shape
    dims = [("n", n), ("c", c), ("th", th), ("ph", ph), ("h", hh), ("tw", tw), ("pw", pw),
            ("w", ww)]
    if (th, ph, tw, pw) != (1, 1, 1, 1):
        steps += _regroup(dims, ["n", "ph", "pw", "th", "tw", "c", "h", "w"],
                          lay.geometry.input_shape)
    return steps


def unpack_steps(lay: ResolvedLayout) -> list[tuple[str, Callable]]:
    ph, pw = lay.spec.pack
    _, k, oh, ow = lay.geometry.output_shape
    n, _, ho, wo = lay.geometry.final_shape
    dims = [("n", n), ("ph", ph), ("pw", pw), ("k", k), ("h", oh), ("w", ow)]
    steps = _regroup(dims, ["n", "k", "ph", "h", "pw", "w"], (n, k, ph * oh, pw * ow))
    if (ph * oh, pw * ow) != (ho, wo):
        steps.append(("crop", lambda t: R.strided_slice(t, [2, 3], [0, 0], [ho, wo])))
    return steps


#: attribute of a host function naming the rewrite it performs (JSON: the rule and the conv)
RECIPE_ATTR = "vta_layout_rewrite"


def _recipe(info: ConvInfo, spec: LayoutRewrite) -> str:
    return json.dumps({"unroll": list(spec.unroll), "pack": list(spec.pack),
                       "input_shape": list(info.input_shape),
                       "weight_shape": list(info.weight_shape), "strides": list(info.strides),
                       "padding": list(info.padding), "dilation": list(info.dilation),
                       "zero_point": info.input_zero_point})


def host_function(symbol: str, param_ty, steps, recipe: str) -> relax.Function:
    """A host function of one parameter applying ``steps`` (intermediates named by their
    suffix); ``recipe`` (:data:`RECIPE_ATTR`) says which rewrite it is, so it can be rebuilt."""
    fb = relax.BlockBuilder()
    x = relax.Var("x", param_ty)
    with fb.function(symbol, [x], attrs={HOST_FUNCTION_ATTR: 1, RECIPE_ATTR: recipe}):
        u = x
        for suffix, make in steps:
            u = fb.emit(make(u), suffix)
        fb.emit_func_output(u)
    return fb.get()[symbol]


def _host_call(bb: relax.BlockBuilder, t, steps, layer: str, op: str, recipe: str,
               output: bool = False):
    """Emit ``steps`` as the host function :func:`host_symbol` ``(layer, op)`` and bind its
    call to ``<layer>_<op>``."""
    symbol = host_symbol(layer, op)
    gv = bb.add_func(host_function(symbol, t.ty, steps, recipe), symbol)
    call, name = relax.Call(gv, [t]), f"{sanitize_name(layer)}_{op}"
    return bb.emit_output(call, name) if output else bb.emit(call, name)


class _Edit:
    """Emits one rewritten conv in place of its canonical chain."""

    def __init__(self, match: _Match, spec: LayoutRewrite):
        self.match, self.spec = match, spec
        i = match.info
        self.layout = resolve_layout(spec, i.input_shape, i.weight_shape, i.strides, i.padding,
                              i.dilation)

    def emit(self, bb: relax.BlockBuilder, look: Callable, output: bool):
        info, lay = self.match.info, self.layout
        geo = lay.geometry
        recipe = _recipe(info, self.spec)
        t = look(self.match.data)
        if not lay.input_is_identity:
            t = _host_call(bb, t, input_steps(lay, info.input_shape, info.input_zero_point),
                           info.name, "pack" if lay.packed else "im2col", recipe)
        chain = self.match.chain
        for i, (var, call) in enumerate(chain):
            args = [t] + [look(a) for a in call.args[1:]]
            if i == self.match.conv_index:
                a = call.attrs
                w = rewrite_weight(self.spec, call.args[1].value.numpy())
                expr = R.nn.conv2d(args[0], relax.const(w, str(call.args[1].ty.dtype)),
                                   strides=geo.strides, padding=geo.padding,
                                   dilation=geo.dilation, groups=1,
                                   data_layout=a.data_layout, kernel_layout=a.kernel_layout,
                                   out_layout=a.out_layout or "NCHW",
                                   out_dtype=str(a.out_dtype))
            else:
                expr = relax.Call(call.op, args, call.attrs, call.ty_args)
            last = i == len(chain) - 1 and not lay.packed
            t = bb.emit_output(expr, var.name) if last and output else bb.emit(expr, var.name)
        if lay.packed:
            t = _host_call(bb, t, unpack_steps(lay), info.name, "unpack", recipe, output)
        return t


@relax.expr_functor.mutator
class _Mutator(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, edits: dict, drop: set):
        super().__init__(mod)
        self.edits, self.drop = edits, drop

    def visit_var_binding_(self, binding):
        if binding.var in self.drop:
            return
        edit = self.edits.get(binding.var)
        if edit is None:
            return super().visit_var_binding_(binding)
        output = (not isinstance(binding.var, relax.DataflowVar)
                  and self.builder_.current_block_is_dataflow())
        self.set_var_remap(binding.var, edit.emit(self.builder_, self.visit_expr, output))


Decide = Callable[[ConvInfo], LayoutRewrite | None] | Mapping[str, LayoutRewrite]


def _conv_matches(mod: tvm.IRModule):
    """``(gv, function, its canonical conv2d matches)`` of every plain Relax function of
    ``mod`` (offloaded ``Codegen`` and composite functions left out)."""
    names = module_layer_names(mod)
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function) or (func.attrs is not None and any(
                k in func.attrs for k in ("Codegen", "Composite", "Primitive"))):
            continue
        yield gv, func, list(_find_convs(gv.name_hint, func, names))


def conv_infos(mod: tvm.IRModule) -> list[ConvInfo]:
    """The convs :func:`apply_layout_rewrites` asks ``decide`` about (those a
    :class:`ConvLayer` expresses), in order."""
    return [m.info for _, _, ms in _conv_matches(mod) for m in ms if m.info.layer is not None]


def conv_layers(mod: tvm.IRModule) -> list[str]:
    """The layers :func:`apply_layout_rewrites` asks ``decide`` about, in order: the total of
    a compile's ``[embedding i/N]`` progress lines."""
    return [info.name for info in conv_infos(mod)]


def apply_layout_rewrites(mod: tvm.IRModule, decide: Decide
                          ) -> tuple[tvm.IRModule, list[tuple[str, LayoutRewrite]]]:
    """Rewrite every canonical conv2d (groups 1, static NCHW shapes) of every plain Relax
    function of ``mod`` as ``decide(info)`` says (a :class:`LayoutRewrite`, or None / the
    identity to leave it); ``decide`` may also be a mapping layer name -> rewrite. Offloaded
    (``Codegen``) and composite functions are left alone, and so is a conv whose intermediate
    values are used outside the layer. Returns the new module and the ``(layer, rewrite)``
    pairs applied, in program order."""
    choose = decide.get if isinstance(decide, Mapping) else None
    records: list[tuple[str, LayoutRewrite]] = []
    out = mod
    for gv, func, matches in _conv_matches(mod):
        edits, drop = {}, set()
        for match in matches:
            spec = choose(match.info.name) if choose else decide(match.info)
            if spec is None or spec.is_identity:
                continue
            edits[match.chain[-1][0]] = _Edit(match, spec)
            drop.update(v for v, _ in match.chain[:-1])
            records.append((match.info.name, spec))
        if edits:
            out = _replace(out, gv, func, edits, drop)
    if records:
        relax.analysis.well_formed(out)  # raises on the first violation
    return out, records


def _replace(mod: tvm.IRModule, gv, func, edits, drop) -> tvm.IRModule:
    mutator = _Mutator(mod, edits, drop)
    new = mutator.visit_expr(func)
    built = mutator.builder_.get()  # the module with the added host functions
    out = tvm.IRModule({g: f for g, f in built.functions_items() if not g.same_as(gv)},
                       attrs=mod.attrs)
    out[gv] = new
    return out


def layout_rewrite_pass(decide: Decide, records: list | None = None) -> tvm.transform.Pass:
    """:func:`apply_layout_rewrites` as a module pass; the applied ``(layer, rewrite)`` pairs
    are appended to ``records`` when given."""

    @tvm.transform.module_pass(opt_level=0, name="VTALayoutRewrite")
    def _pass(mod: tvm.IRModule, ctx) -> tvm.IRModule:
        mod, applied = apply_layout_rewrites(mod, decide)
        if records is not None:
            records.extend(applied)
        return mod

    return _pass
