"""Average pools: the window-sum form, ceil mode, and the stepped global average pool.

An average pool's canonical form sums each window exactly (int64 ``avg_pool2d`` of values
pre-multiplied by the window) and requantizes the sum (:func:`emit_window_sum_pool`), so every
window must have the same divisor: a ceil-mode pool qualifies when its last windows do not
overhang the padded input (:func:`ceil_mode_is_floor`). Otherwise onnxruntime divides those
windows by their clipped size (and padding left out of the count clips the first ones): the
pool becomes one plain pool per region of equal divisor, concatenated back
(:func:`clipped_window_pool`). A target
whose pooling window is smaller than a global pool's input (``AccelTarget.global_pool_steps``)
gets the global average pool in steps: average pools with stride = window down to a map its
window holds, each step's average requantized to the input's quantization, then the global pool
of the rest (:func:`stepped_global_pool`). The intermediate values are 8-bit, so no split equals
the one-step average bit for bit; the stepped form *is* that target's recipe (the reference
computes it too) and its record carries the extra rounding (half an input LSB per intermediate
step, in output LSBs); beyond ``max_requant_error`` the layer keeps the one-step form.
"""

from __future__ import annotations

from tvm import relax

from tvm_accel import numerics
from tvm_accel.canonicalize.graph import _ints, _Out, _Plan, _QAct, _shape
from tvm_accel.layers import DTYPE_RANGE

R = relax.op


def emit_window_sum_pool(bb, v, zp: int, kernel: tuple[int, int], strides, padding,
                         rq, out_dtype: str, name: str):
    """``avg_pool2d`` of ``(v - zp) * KH*KW`` in int64 with ``count_include_pad`` (exactly the
    window sum; TVM keeps int64 pools in int64), then the requant chain to ``out_dtype``."""
    kh, kw = kernel
    t = bb.emit(R.astype(v, "int64"), name_hint=f"{name}_x64")
    t = bb.emit(R.subtract(t, relax.const(zp, "int64")), name_hint=f"{name}_xc")
    t = bb.emit(R.multiply(t, relax.const(kh * kw, "int64")), name_hint=f"{name}_xn")
    acc = bb.emit(R.nn.avg_pool2d(t, pool_size=(kh, kw), strides=tuple(strides),
                                  padding=tuple(padding), count_include_pad=True,
                                  layout="NCHW"), name_hint=f"{name}_acc")
    return numerics.emit_requant(bb, acc, rq, out_dtype, 1, name=f"{name}_rq", out_name=name)


def ceil_mode_is_floor(c) -> bool:
    """A ceil-mode pool call whose output is the floor-mode one (no window overhangs the
    padded input, e.g. a 3x3 stride-1 or a 2x2 stride-2 pool on an even map): the same pool
    with every window whole. False if a shape is not static."""
    ishape, oshape = _shape(c.args[0]), _shape(c)
    if ishape is None or oshape is None or len(ishape) != 4:
        return False
    a = c.attrs
    k, s, d, p = _ints(a.pool_size), _ints(a.strides), _ints(a.dilation), _ints(a.padding)
    return all((ishape[2 + i] + p[i] + p[2 + i] - (k[i] - 1) * d[i] - 1) // s[i] + 1
               == oshape[2 + i] for i in range(2))


def _valid_steps(steps, h: int, w: int) -> bool:
    if not steps or len(steps) < 2:
        return False
    ph = pw = 1
    for kh, kw in steps:
        if int(kh) < 1 or int(kw) < 1:
            return False
        ph, pw = ph * int(kh), pw * int(kw)
    return (ph, pw) == (h, w)


def stepped_global_pool(cz, core, out: _Out, x: _QAct, shape) -> _Plan | None:
    """The stepped form of a global average pool (``mean`` over H, W with keepdims) for a
    target that asks for it, or None (one step)."""
    steps_of = getattr(cz.rc.target, "global_pool_steps", None)
    h, w = int(shape[2]), int(shape[3])
    steps = steps_of(h, w, x.dtype, (x.zp, out.zp)) if steps_of is not None else None
    if steps is None or not _valid_steps(steps, h, w):
        return None
    steps = [(int(kh), int(kw)) for kh, kw in steps]
    lo, hi = DTYPE_RANGE[x.dtype]
    inter = _Out(x.scale, x.zp, x.dtype, lo, hi)  # each step averages back to x's grid
    rqs, rel, carried = [], 0.0, 0.0  # carried: error of the intermediate, in x's LSBs
    for kh, kw in steps[:-1]:
        bound = kh * kw * x.reach
        rq = cz._rescale_rq("avg_pool2d", x, inter, 1.0 / (kh * kw), bound)
        e = numerics.recipe_error(rq, bound)
        rel = max(rel, e.max_rel_error)
        carried += e.max_lsb_error + 0.5  # the average of errors is within their bound
        rqs.append(rq)
    kh, kw = steps[-1]
    bound = kh * kw * x.reach
    rq = cz._rescale_rq("global_avg_pool2d", x, out, 1.0 / (kh * kw), bound)
    e = numerics.recipe_error(rq, bound)
    lsb = e.max_lsb_error + carried * x.scale / out.scale
    if lsb > cz.rc.max_requant_error:
        return None
    err = numerics.ApproximationError(max(rel, e.max_rel_error), lsb)
    _, detail = cz._rq_error(rq, bound)
    name, onnx_name = cz.g.layer_name([core], "global_avg_pool2d")
    step_names = [cz.g.claim(f"{name}_step{i + 1}") for i in range(len(steps) - 1)]
    name = cz.g.claim(name)

    def emit(bb, look):
        v = look(x.var)
        for (sh, sw), srq, sname in zip(steps[:-1], rqs, step_names, strict=True):
            v = emit_window_sum_pool(bb, v, x.zp, (sh, sw), (sh, sw), (0, 0, 0, 0), srq,
                                     x.dtype, sname)
        xi = bb.emit(R.astype(v, "int32"), name_hint=f"{name}_xi")
        xc = bb.emit(R.subtract(xi, relax.const(x.zp, "int32")), name_hint=f"{name}_xc")
        acc = bb.emit(R.sum(xc, axis=[2, 3], keepdims=True), name_hint=f"{name}_acc")
        return numerics.emit_requant(bb, acc, rq, out.dtype, 1, name=f"{name}_rq",
                                     out_name=name)

    rec = cz._record(name, onnx_name, "global_avg_pool2d", out, err, window=h * w,
                     steps=[list(s) for s in steps], step_layers=step_names,
                     input_scale=x.scale, bits=cz._bits(out, [x]), input_zero_point=x.zp,
                     input_dtype=x.dtype, **detail)
    return _Plan(rec, emit)


def _divisor_runs(size: int, out: int, k: int, s: int, p0: int, p1: int,
                  include_pad: bool) -> list[tuple[int, int, int]]:
    """Along one axis, the outputs in runs ``(first, end, divisor)`` of equal divisor, as
    onnxruntime divides: the window clipped to the padded input (``count_include_pad``) or
    to the input itself; a ceil-mode window past the padded input never counts its overhang."""
    runs: list[tuple[int, int, int]] = []
    for i in range(out):
        lo = i * s - p0
        hi = min(lo + k, size + p1)
        n = hi - lo if include_pad else min(hi, size) - max(lo, 0)
        if runs and runs[-1][2] == n:
            runs[-1] = (runs[-1][0], i + 1, n)
        else:
            runs.append((i, i + 1, n))
    return runs


def _region_window(first: int, end: int, size: int, k: int, s: int, p0: int):
    """The input slice ``(begin, stop)`` and the ``(before, after)`` zero padding a plain
    pool reads to give the outputs ``first .. end - 1`` of one axis."""
    lo, hi = first * s - p0, (end - 1) * s + k - p0
    return (max(lo, 0), min(hi, size)), (max(0, -lo), max(0, hi - size))


def clipped_window_pool(cz, core, out: _Out, x: _QAct, c) -> _Plan | None:
    """An average pool whose windows have different divisors (a ceil-mode pool whose last
    windows overhang the input, or padding left out of the count) as plain pools, one per
    region of equal divisor (the inner windows, the last row / column, the corner, ...):
    each the window-sum form of its own input slice and padding with its own requantize,
    concatenated back along W, then H. Exact: the window sums are exact and each region
    divides by its own count, as onnxruntime does. None if a shape is not static."""
    ishape, oshape = _shape(c.args[0]), _shape(c)
    if ishape is None or oshape is None or len(ishape) != 4:
        return None
    a = c.attrs
    k, s, p = _ints(a.pool_size), _ints(a.strides), _ints(a.padding)
    include = bool(a.count_include_pad)
    runs = [_divisor_runs(ishape[2 + i], oshape[2 + i], k[i], s[i], p[i], p[2 + i], include)
            for i in range(2)]
    if any(n < 1 for axis in runs for _, _, n in axis):
        return None  # a window wholly in the padding: onnxruntime divides by zero
    regions = []  # (row run, column run, requant, bound)
    rel = lsb = 0.0
    detail: dict = {}
    for rr in runs[0]:
        for cr in runs[1]:
            bound = k[0] * k[1] * x.reach
            rq = cz._rescale_rq("avg_pool2d", x, out, 1.0 / (rr[2] * cr[2]), bound)
            e, d = cz._rq_error(rq, bound)
            rel, lsb = max(rel, e.max_rel_error), max(lsb, e.max_lsb_error)
            detail = detail or d
            regions.append((rr, cr, rq))
    name, onnx_name = cz.g.layer_name([core], "avg_pool2d")
    biggest = max(range(len(regions)), key=lambda j: (regions[j][0][1] - regions[j][0][0])
                  * (regions[j][1][1] - regions[j][1][0]))
    names = [name if j == biggest else f"{name}_part{j}" for j in range(len(regions))]
    names = [cz.g.claim(n) for n in names]
    cat_name = cz.g.claim(f"{name}_cat")

    def emit(bb, look):
        v = look(x.var)
        rows = []
        for j, (rr, cr, rq) in enumerate(regions):
            (h0, h1), (pt, pb) = _region_window(rr[0], rr[1], ishape[2], k[0], s[0], p[0])
            (w0, w1), (pl, pr) = _region_window(cr[0], cr[1], ishape[3], k[1], s[1], p[1])
            xs = v
            if (h0, h1, w0, w1) != (0, ishape[2], 0, ishape[3]):
                xs = bb.emit(R.strided_slice(v, axes=[2, 3], begin=[h0, w0], end=[h1, w1]),
                             name_hint=f"{names[j]}_in")
            part = emit_window_sum_pool(bb, xs, x.zp, (k[0], k[1]), s, (pt, pl, pb, pr), rq,
                                        out.dtype, names[j])
            if cr is runs[1][0]:
                rows.append([])
            rows[-1].append(part)
        rows = [r[0] if len(r) == 1 else bb.emit(R.concat(r, axis=3),
                                                 name_hint=f"{cat_name}_row{i}")
                for i, r in enumerate(rows)]
        return rows[0] if len(rows) == 1 else bb.emit(R.concat(rows, axis=2),
                                                      name_hint=cat_name)

    rec = cz._record(names[biggest], onnx_name, "avg_pool2d", out,
                     numerics.ApproximationError(rel, lsb), window=k[0] * k[1],
                     bits=cz._bits(out, [x]), pool_size=k, strides=s, padding=p,
                     ceil_mode=bool(a.ceil_mode), count_include_pad=include,
                     divisors=[[rr[2] * cr[2] for cr in runs[1]] for rr in runs[0]],
                     part_layers=[n for j, n in enumerate(names) if j != biggest],
                     input_scale=x.scale, input_zero_point=x.zp, input_dtype=x.dtype,
                     **detail)
    return _Plan(rec, emit)
