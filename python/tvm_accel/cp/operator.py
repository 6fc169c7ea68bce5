"""Operators as polyhedral instance sets with affine access relations (the CP paper, section 3.2).

An operator is the set of its dynamic multiply instances ``S = {[d0, ..., dn] : 0 <= di < Ei}``
over named loop dimensions, plus one affine access relation per tensor (``S -> In``,
``S -> Wgt``, ``S -> Out``). The data-dependence relations of the paper follow from them:
``R1: * -> +`` is the identity on ``S`` (the add of an instance consumes its own product),
``R2: + -> +'`` keeps the output coordinates and steps the reduction dimensions (strictly to the
lexicographic successor, or to any other reduction point when the reduction is treated as
commutative), and the output relation is the ``Out`` access of the last add.

Two representations of the same model, on purpose:

- :meth:`TensorOp.isl_instance_set` / :meth:`TensorOp.isl_access` / :meth:`TensorOp.isl_dataflow`
  give the sets and relations as ``islpy`` objects (isl's own notation, printable, usable for
  set algebra and for enumerating small instance sets in tests);
- the constraint search evaluates the same affine maps in closed form on Python integers
  (:class:`Access`), because it applies them millions of times and must never hit a 32-bit
  limit (the paper's Gecode solver lost 28 DeepBench layers to 32-bit domains).

The input tensor of a convolution is the *padded* input (``H + pt + pb`` rows): spatial padding
is data, not a change of the iteration domain. Extent-1 dimensions are dropped (a depthwise
conv has no ``c`` dimension, a batch-1 layer no ``n``), so every dimension can carry a mapping.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["LAYOUTS", "Access", "TensorOp", "conv2d_op", "conv_transpose2d_op", "dense_op"]

#: conv2d loop-dimension orders by operator layout (spatial dims first, then reduction)
LAYOUTS = {"NCHW": ("n", "g", "k", "oh", "ow", "c", "r", "s"),
           "NHWC": ("n", "oh", "ow", "g", "k", "r", "s", "c"),
           "HWNC": ("oh", "ow", "n", "g", "k", "r", "s", "c")}


@dataclass(frozen=True)
class Access:
    """Affine access ``tensor[i] = sum_d coeffs[i][d] * x[d] + offsets[i]`` of loop point ``x``.

    ``fn`` is the map compiled to one Python expression (the search calls it millions of
    times); ``terms[i]`` lists the ``(dim, coeff)`` pairs of row ``i`` with a non-zero coeff."""

    tensor: str
    coeffs: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    fn: Callable = field(init=False, repr=False, compare=False)
    terms: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        terms = tuple(tuple((d, int(c)) for d, c in enumerate(row) if c) for row in self.coeffs)
        exprs = []
        for row, off in zip(terms, self.offsets, strict=True):
            parts = [f"p[{d}]" if c == 1 else f"{c}*p[{d}]" for d, c in row]
            if off or not parts:
                parts.append(str(int(off)))
            exprs.append(" + ".join(parts))
        object.__setattr__(self, "terms", terms)
        object.__setattr__(self, "fn", eval(f"lambda p: ({', '.join(exprs)},)"))  # noqa: S307

    def apply(self, p: tuple[int, ...]) -> tuple[int, ...]:
        return self.fn(p)

    def iterators(self, coord: int) -> tuple[int, ...]:
        """Loop dimensions that tensor coordinate ``coord`` depends on."""
        return tuple(d for d, c in enumerate(self.coeffs[coord]) if c)

    def is_linear(self, coord: int, per: tuple[int, ...] = ()) -> bool:
        """The coordinate is one iterator times a constant stride (the paper's "linear memory
        access", section 4.2.3); a stencil ``oh * sh + r * dh`` is not. Iterators in ``per``
        are held fixed (an offset): ``per=(g,)`` is linear access within one group, where the
        input channel ``g * cg + c`` is linear in ``c``."""
        return sum(d not in per for d in self.iterators(coord)) <= 1


@dataclass(frozen=True)
class TensorOp:
    """A tensor operator: loop dimensions, their extents, the reduction subset and the
    ``in``/``wgt``/``out`` accesses with the tensors' shapes (axis names in ``axes``)."""

    kind: str
    dims: tuple[str, ...]
    extents: tuple[int, ...]
    reduction: frozenset[str]
    shapes: dict[str, tuple[int, ...]]
    axes: dict[str, tuple[str, ...]]
    access: dict[str, Access]
    params: dict = field(default_factory=dict, compare=False)

    @property
    def rank(self) -> int:
        return len(self.dims)

    def index(self, dim: str) -> int:
        return self.dims.index(dim)

    @property
    def spatial_dims(self) -> tuple[str, ...]:
        return tuple(d for d in self.dims if d not in self.reduction)

    @property
    def reduction_dims(self) -> tuple[str, ...]:
        return tuple(d for d in self.dims if d in self.reduction)

    @property
    def macs(self) -> int:
        return math.prod(self.extents)

    def tensor_elements(self, tensor: str) -> int:
        """Elements of a tensor the operator touches (the padded input counts its halo)."""
        return math.prod(self.shapes[tensor])

    # -- isl views -----------------------------------------------------------------------------
    def _bounds(self) -> str:
        return " and ".join(f"0 <= {d} < {e}" for d, e in zip(self.dims, self.extents,
                                                              strict=True))

    def isl_instance_set(self):
        """``S`` as an ``islpy.Set`` (named ``S``)."""
        import islpy as isl

        return isl.Set(f"{{ S[{', '.join(self.dims)}] : {self._bounds()} }}")

    def isl_access(self, tensor: str):
        """The access relation ``S -> tensor`` as an ``islpy.Map`` restricted to ``S``."""
        import islpy as isl

        acc = self.access[tensor]
        exprs = []
        for row, off in zip(acc.coeffs, acc.offsets, strict=True):
            terms = [f"{c}*{d}" if c != 1 else d for c, d in zip(row, self.dims, strict=True)
                     if c]
            if off or not terms:
                terms.append(str(off))
            exprs.append(" + ".join(terms))
        name = tensor.capitalize()
        return isl.Map(f"{{ S[{', '.join(self.dims)}] -> {name}[{', '.join(exprs)}] : "
                       f"{self._bounds()} }}")

    def isl_dataflow(self, commutative: bool = True) -> dict:
        """The dependence relations ``R1`` (mul -> add, identity) and ``R2`` (add -> add: same
        output point, next reduction point) as ``islpy.Map`` objects."""
        import islpy as isl

        src = ", ".join(self.dims)
        dst = ", ".join(f"{d}1" for d in self.dims)
        same = " and ".join(f"{d}1 = {d}" for d in self.spatial_dims) or "true"
        red = self.reduction_dims
        if commutative:
            step = " or ".join(f"{d}1 != {d}" for d in red) or "false"
        else:  # lexicographic successor of (r0, ..., rk) with the last dimension fastest
            alts = []
            for j, d in enumerate(red):
                hold = [f"{e}1 = {e}" for e in red[:j]]
                inc = [f"{d}1 = {d} + 1"]
                wrap = [f"{e}1 = 0 and {e} = {self.extents[self.index(e)] - 1}"
                        for e in red[j + 1:]]
                alts.append("(" + " and ".join(hold + inc + wrap) + ")")
            step = " or ".join(alts) or "false"
        b1 = " and ".join(f"0 <= {d}1 < {e}" for d, e in zip(self.dims, self.extents,
                                                             strict=True))
        r1 = isl.Map(f"{{ S[{src}] -> S[{src}] : {self._bounds()} }}")
        r2 = isl.Map(f"{{ S[{src}] -> S[{dst}] : {self._bounds()} and {b1} and {same} "
                     f"and ({step}) }}")
        return {"R1": r1, "R2": r2}


def _op(kind: str, dims: dict[str, int], reduction: set[str], tensors: dict, params: dict
        ) -> TensorOp:
    """Build a TensorOp from ``tensors[name] = (axes, shape, [{dim: coeff, "": offset}])``,
    dropping extent-1 loop dimensions."""
    keep = [d for d, e in dims.items() if e > 1]
    shapes, axes, access = {}, {}, {}
    for t, (names, shape, exprs) in tensors.items():
        rows = tuple(tuple(int(ex.get(d, 0)) for d in keep) for ex in exprs)
        offs = tuple(int(ex.get("", 0)) for ex in exprs)
        access[t] = Access(t, rows, offs)
        shapes[t] = tuple(int(s) for s in shape)
        axes[t] = tuple(names)
    return TensorOp(kind, tuple(keep), tuple(dims[d] for d in keep),
                    frozenset(d for d in keep if d in reduction), shapes, axes, access, params)


def conv2d_op(n: int, c: int, h: int, w: int, k: int, kh: int, kw: int,
              strides: tuple[int, int] = (1, 1), padding: tuple[int, int, int, int] = (0,) * 4,
              dilation: tuple[int, int] = (1, 1), groups: int = 1, layout: str = "NCHW"
              ) -> TensorOp:
    """conv2d (NCHW / OIHW, any kernel, stride, padding, dilation, groups; depthwise when
    ``groups == c``) over the loop dimensions ``n, g, k, oh, ow`` (spatial) and ``c, r, s``
    (reduction), ``k`` and ``c`` counting channels within a group.

    ``layout`` (``NCHW``, ``NHWC`` or ``HWNC``) is the order of the instance set's dimensions,
    i.e. the lexicographic order the search traverses it in (the paper's Fig. 8 study); the
    tensors' index spaces stay NCHW / OIHW, so embeddings do not depend on it."""
    if layout not in LAYOUTS:
        raise ValueError(f"conv2d layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    sh, sw = strides
    dh, dw = dilation
    pt, pl, pb, pr = padding
    if c % groups or k % groups:
        raise ValueError(f"{c} input / {k} output channels do not split into {groups} groups")
    cg, kg = c // groups, k // groups
    ho = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    wo = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    if ho < 1 or wo < 1:
        raise ValueError("the kernel is larger than the padded input")
    ext = {"n": n, "g": groups, "k": kg, "oh": ho, "ow": wo, "c": cg, "r": kh, "s": kw}
    dims = {d: ext[d] for d in LAYOUTS[layout]}
    tensors = {
        "in": (("N", "C", "H", "W"), (n, c, h + pt + pb, w + pl + pr),
               [{"n": 1}, {"g": cg, "c": 1}, {"oh": sh, "r": dh}, {"ow": sw, "s": dw}]),
        "wgt": (("K", "C", "R", "S"), (k, cg, kh, kw),
                [{"g": kg, "k": 1}, {"c": 1}, {"r": 1}, {"s": 1}]),
        "out": (("N", "K", "H", "W"), (n, k, ho, wo),
                [{"n": 1}, {"g": kg, "k": 1}, {"oh": 1}, {"ow": 1}]),
    }
    kind = "depthwise_conv2d" if groups > 1 and cg == 1 else (
        "group_conv2d" if groups > 1 else "conv2d")
    params = dict(n=n, c=c, h=h, w=w, k=k, kh=kh, kw=kw, strides=(sh, sw),
                  padding=tuple(padding), dilation=(dh, dw), groups=groups, ho=ho, wo=wo,
                  layout=layout)
    return _op(kind, dims, {"c", "r", "s"}, tensors, params)


def conv_transpose2d_op(n: int, c: int, h: int, w: int, k: int, kh: int, kw: int,
                        strides: tuple[int, int] = (1, 1),
                        padding: tuple[int, int, int, int] = (0,) * 4,
                        output_padding: tuple[int, int] = (0, 0),
                        dilation: tuple[int, int] = (1, 1), groups: int = 1) -> TensorOp:
    """Transpose conv (ONNX ConvTranspose: weight ``(C, K/g, KH, KW)``) in its scatter form:
    ``full[n, g*kg + k, ih*sh + r*dh, iw*sw + s*dw] += in[n, g*cg + c, ih, iw] *
    wgt[g*cg + c, k, r, s]`` over the loop dimensions ``n, g, k, ih, iw, r, s`` (spatial: one
    point per product's output position) and ``c`` (reduction). Every access is affine, so no
    zero-inflated input and no sub-convolution; the output tensor is the uncropped ``full``
    (``max((h - 1) * sh + (kh - 1) * dh + 1, pt + Ho)`` rows, as ``deconv_accumulate``): the
    padding crops it and the output padding extends it, both outside the instance set. The
    output rows ``ih * sh + r * dh`` are a stencil (not linear access)."""
    sh, sw = strides
    dh, dw = dilation
    pt, pl, pb, pr = padding
    if c % groups or k % groups:
        raise ValueError(f"{c} input / {k} output channels do not split into {groups} groups")
    cg, kg = c // groups, k // groups
    ho = (h - 1) * sh - pt - pb + dh * (kh - 1) + output_padding[0] + 1
    wo = (w - 1) * sw - pl - pr + dw * (kw - 1) + output_padding[1] + 1
    if ho < 1 or wo < 1:
        raise ValueError("the padding crops the whole output")
    fh = max((h - 1) * sh + (kh - 1) * dh + 1, pt + ho)
    fw = max((w - 1) * sw + (kw - 1) * dw + 1, pl + wo)
    dims = {"n": n, "g": groups, "k": kg, "ih": h, "iw": w, "r": kh, "s": kw, "c": cg}
    tensors = {
        "in": (("N", "C", "H", "W"), (n, c, h, w),
               [{"n": 1}, {"g": cg, "c": 1}, {"ih": 1}, {"iw": 1}]),
        "wgt": (("C", "K", "R", "S"), (c, kg, kh, kw),
                [{"g": cg, "c": 1}, {"k": 1}, {"r": 1}, {"s": 1}]),
        "out": (("N", "K", "H", "W"), (n, k, fh, fw),
                [{"n": 1}, {"g": kg, "k": 1}, {"ih": sh, "r": dh}, {"iw": sw, "s": dw}]),
    }
    params = dict(n=n, c=c, h=h, w=w, k=k, kh=kh, kw=kw, strides=(sh, sw),
                  padding=tuple(padding), output_padding=tuple(output_padding),
                  dilation=(dh, dw), groups=groups, ho=ho, wo=wo)
    return _op("conv2d_transpose", dims, {"c"}, tensors, params)


def dense_op(n: int, c: int, k: int) -> TensorOp:
    """dense ``out[n, k] = sum_c in[n, c] * wgt[k, c]``."""
    tensors = {"in": (("N", "C"), (n, c), [{"n": 1}, {"c": 1}]),
               "wgt": (("K", "C"), (k, c), [{"k": 1}, {"c": 1}]),
               "out": (("N", "K"), (n, k), [{"n": 1}, {"k": 1}])}
    return _op("dense", {"n": n, "k": k, "c": c}, {"c"}, tensors, dict(n=n, c=c, k=k))
