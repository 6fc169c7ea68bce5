"""Layer kinds of a DPU-style target (pool, concat, upsample, deconv, grouped conv): the numpy
reference (``tvm_accel.layers``) against plain loops written straight from the docstrings."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from tvm_accel.layers import (
    DTYPE_RANGE,
    ConcatLayer,
    ConvLayer,
    DeconvLayer,
    LayerGraph,
    PoolLayer,
    Requant,
    Tensor,
    UpsampleLayer,
    conv_accumulate,
    deconv_accumulate,
    deconv_by_subconvs,
    deconv_output_shape,
    deconv_subconvs,
    reference_execute,
)


def _rq(k: int = 1, shift: int = 3, zp: int = 2, mult=None, qmin=-128, qmax=127) -> Requant:
    m = np.full(k, 5, dtype=np.int64) if mult is None else np.asarray(mult, dtype=np.int64)
    return Requant(pre_shift=1, multiplier=m, round_add=np.full(k, 1 << (shift - 1)),
                   shift=shift, zero_point=zp, qmin=qmin, qmax=qmax)


def _rq_scalar(rq: Requant, v: int, c: int = 0) -> int:
    """The requant chain on one integer, written out."""
    m = int(np.broadcast_to(rq.multiplier, (c + 1,))[c])
    r = int(np.broadcast_to(rq.round_add, (c + 1,))[c])
    t = ((v >> rq.pre_shift) * m + r) >> rq.shift
    return min(max(t + rq.zero_point, rq.qmin), rq.qmax)


def _x(rng, shape, dtype):
    lo, hi = DTYPE_RANGE[dtype]
    return rng.integers(lo, hi + 1, shape).astype(dtype)


# --- pooling ---------------------------------------------------------------------------------
POOL_CASES = [  # kernel, stride, padding (t, l, b, r)
    ((2, 2), (2, 2), (0, 0, 0, 0)),
    ((3, 3), (2, 2), (1, 1, 1, 1)),
    ((3, 3), (1, 1), (1, 1, 1, 1)),
    ((2, 2), (1, 1), (0, 0, 1, 1)),   # YOLOv3-tiny's last max pool
    ((3, 2), (1, 2), (2, 0, 1, 1)),
]


def _pool_loop(x, kind, kernel, strides, padding, zx, rq, dtype):
    n, c, h, w = x.shape
    kh, kw = kernel
    sh, sw = strides
    pt, pl, pb, pr = padding
    ho, wo = (h + pt + pb - kh) // sh + 1, (w + pl + pr - kw) // sw + 1
    out = np.zeros((n, c, ho, wo), dtype=np.int64)
    for b, ch, i, j in itertools.product(range(n), range(c), range(ho), range(wo)):
        vals = []
        for di, dj in itertools.product(range(kh), range(kw)):
            y, xx = i * sh + di - pt, j * sw + dj - pl
            inside = 0 <= y < h and 0 <= xx < w
            if kind == "max":
                vals.append(int(x[b, ch, y, xx]) if inside else DTYPE_RANGE[dtype][0])
            else:
                vals.append(int(x[b, ch, y, xx]) - zx if inside else 0)
        if kind == "max":
            v = max(vals)
            out[b, ch, i, j] = v if rq is None else _rq_scalar(rq, v - zx)
        else:
            out[b, ch, i, j] = _rq_scalar(rq, sum(vals))
    return out


@pytest.mark.parametrize("kernel,strides,padding", POOL_CASES)
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_max_pool_pads_with_the_dtype_minimum(kernel, strides, padding, dtype):
    rng = np.random.default_rng(1)
    x = _x(rng, (2, 3, 5, 6), dtype)
    x[0, 0] = DTYPE_RANGE[dtype][0] + 3          # all small: padding must never win
    layer = PoolLayer("p", "x", "y", "max", kernel, strides, padding)
    assert layer.op_name == "max_pool2d" and layer.window == kernel[0] * kernel[1]
    g = LayerGraph({"x": Tensor("x", x.shape, dtype), "y": Tensor("y", (), dtype)}, [layer],
                   ["x"], ["y"])
    got = reference_execute(g, {"x": x})["y"]
    want = _pool_loop(x, "max", kernel, strides, padding, 0, None, dtype)
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.dtype(dtype)
    # with a rescale (e.g. a folded ReLU or another output scale)
    rq = _rq(zp=-1)
    layer = PoolLayer("p", "x", "y", "max", kernel, strides, padding, input_zero_point=7,
                      requant=rq)
    got = reference_execute(g.__class__(g.tensors, [layer], ["x"], ["y"]), {"x": x})["y"]
    np.testing.assert_array_equal(got, _pool_loop(x, "max", kernel, strides, padding, 7, rq,
                                                  dtype).astype(dtype))


@pytest.mark.parametrize("kernel,strides,padding", POOL_CASES)
def test_avg_pool_sums_centred_values_and_requantizes(kernel, strides, padding):
    rng = np.random.default_rng(2)
    for dtype, zx in (("int8", -5), ("uint8", 131)):
        x = _x(rng, (1, 4, 6, 5), dtype)
        rq = _rq(zp=3)
        layer = PoolLayer("p", "x", "y", "avg", kernel, strides, padding, zx, rq)
        g = LayerGraph({"x": Tensor("x", x.shape, dtype), "y": Tensor("y", (), "int8")},
                       [layer], ["x"], ["y"])
        got = reference_execute(g, {"x": x})["y"]
        want = _pool_loop(x, "avg", kernel, strides, padding, zx, rq, dtype)
        np.testing.assert_array_equal(got, want)


def test_global_avg_pool_is_an_avg_pool_over_the_whole_map():
    rng = np.random.default_rng(3)
    x = _x(rng, (2, 5, 7, 7), "int8")
    rq = _rq(mult=[3], shift=6)
    layer = PoolLayer("gap", "x", "y", "avg", (7, 7), (1, 1), (0, 0, 0, 0), 4, rq,
                      op_name="global_avg_pool2d")
    g = LayerGraph({"x": Tensor("x", x.shape, "int8"), "y": Tensor("y", (2, 5, 1, 1), "int8")},
                   [layer], ["x"], ["y"])
    got = reference_execute(g, {"x": x})["y"]
    sums = (x.astype(np.int64) - 4).sum(axis=(2, 3), keepdims=True)
    want = np.vectorize(lambda v: _rq_scalar(rq, int(v)))(sums)
    np.testing.assert_array_equal(got, want)


def test_pool_layer_rejects_bad_kinds_and_an_avg_pool_without_requant():
    with pytest.raises(ValueError, match="pool kind"):
        PoolLayer("p", "x", "y", "min", (2, 2), (2, 2), (0, 0, 0, 0))
    with pytest.raises(ValueError, match="needs a requant"):
        PoolLayer("p", "x", "y", "avg", (2, 2), (2, 2), (0, 0, 0, 0))


# --- concat / upsample -----------------------------------------------------------------------
def test_concat_takes_identity_inputs_as_is_and_rescales_the_others():
    rng = np.random.default_rng(4)
    a, b, c = (_x(rng, (2, ch, 3, 4), "int8") for ch in (3, 1, 5))   # odd channel counts
    rq = _rq(k=1, mult=[8], shift=4, zp=-2)
    layer = ConcatLayer("cat", ("a", "b", "c"), "y", (0, -9, 0), (None, rq, None))
    t = {n: Tensor(n, v.shape, "int8") for n, v in zip("abc", (a, b, c), strict=True)}
    t["y"] = Tensor("y", (2, 9, 3, 4), "int8")
    got = reference_execute(LayerGraph(t, [layer], list("abc"), ["y"]),
                            {"a": a, "b": b, "c": c})["y"]
    assert got.shape == (2, 9, 3, 4)
    np.testing.assert_array_equal(got[:, :3], a)
    np.testing.assert_array_equal(got[:, 4:], c)
    for idx in np.ndindex(b.shape):
        assert got[idx[0], 3, idx[2], idx[3]] == _rq_scalar(rq, int(b[idx]) + 9)


@pytest.mark.parametrize("scale", [(2, 2), (3, 3), (2, 1), (1, 4)])
def test_upsample_repeats_each_pixel(scale):
    rng = np.random.default_rng(5)
    x = _x(rng, (2, 3, 4, 5), "uint8")
    layer = UpsampleLayer("up", "x", "y", scale)
    g = LayerGraph({"x": Tensor("x", x.shape, "uint8"), "y": Tensor("y", (), "uint8")},
                   [layer], ["x"], ["y"])
    got = reference_execute(g, {"x": x})["y"]
    sh, sw = scale
    assert got.shape == (2, 3, 4 * sh, 5 * sw)
    for idx in np.ndindex(got.shape):
        n, c, i, j = idx
        assert got[idx] == x[n, c, i // sh, j // sw]
    rq = _rq(zp=100, qmin=0, qmax=255)
    layer = UpsampleLayer("up", "x", "y", scale, input_zero_point=128, requant=rq)
    got = reference_execute(LayerGraph(g.tensors, [layer], ["x"], ["y"]), {"x": x})["y"]
    assert got[1, 2, sh * 3, sw * 4] == _rq_scalar(rq, int(x[1, 2, 3, 4]) - 128)


# --- grouped / depthwise conv ----------------------------------------------------------------
@pytest.mark.parametrize("c,k,groups,kernel,stride", [(4, 4, 4, 3, 1), (6, 6, 6, 5, 2),
                                                      (4, 8, 2, 3, 2), (3, 3, 3, 7, 1)])
def test_grouped_conv_reads_only_its_group(c, k, groups, kernel, stride):
    rng = np.random.default_rng(6)
    x = _x(rng, (2, c, 9, 8), "int8")
    w = rng.integers(-20, 21, (k, c // groups, kernel, kernel))
    bias = rng.integers(-50, 50, k)
    pad = kernel // 2
    layer = ConvLayer("dw", "x", "y", w, bias, 3, (stride, stride), (pad,) * 4, _rq(k),
                      groups=groups)
    assert layer.is_depthwise == (c == groups and k == c)
    acc = conv_accumulate(x, layer)
    xp = np.pad(x.astype(np.int64) - 3, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kg, cg = k // groups, c // groups
    for n, o, i, j in itertools.product(range(2), range(k), range(acc.shape[2]),
                                        range(acc.shape[3])):
        g = o // kg
        win = xp[n, g * cg:(g + 1) * cg, i * stride:i * stride + kernel,
                 j * stride:j * stride + kernel]
        assert acc[n, o, i, j] == int((win * w[o]).sum()) + bias[o]
    with pytest.raises(ValueError, match="groups"):
        conv_accumulate(x, ConvLayer("bad", "x", "y", w[:, :1], bias, 0, (1, 1), (0,) * 4,
                                     _rq(k), groups=groups + 1))


# --- transpose convolution -------------------------------------------------------------------
def _deconv_loop(x, layer: DeconvLayer) -> np.ndarray:
    """Scatter loop of the DeconvLayer docstring."""
    xc = x.astype(np.int64) - layer.input_zero_point
    n, c, h, w = xc.shape
    g = layer.groups
    kg = layer.weight.shape[1]
    kh, kw = layer.kernel
    (sh, sw), (dh, dw) = layer.strides, layer.dilation
    pt, pl, _, _ = layer.padding
    shape = deconv_output_shape(layer, x.shape)
    out = np.zeros(shape, dtype=np.int64)
    for b, ci, ih, iw, kk, i, j in itertools.product(range(n), range(c), range(h), range(w),
                                                     range(kg), range(kh), range(kw)):
        oy, ox = ih * sh + i * dh - pt, iw * sw + j * dw - pl
        if 0 <= oy < shape[2] and 0 <= ox < shape[3]:
            o = (ci // (c // g)) * kg + kk
            out[b, o, oy, ox] += xc[b, ci, ih, iw] * layer.weight[ci, kk, i, j]
    return out + layer.bias.reshape(1, -1, 1, 1)


DECONV_CASES = [  # c, k, kernel, stride, padding, output_padding, groups, dilation
    (3, 5, 3, 2, (1, 1, 1, 1), (1, 1), 1, (1, 1)),
    (4, 2, 4, 2, (1, 1, 1, 1), (0, 0), 1, (1, 1)),
    (2, 3, 2, 2, (0, 0, 0, 0), (0, 0), 1, (1, 1)),
    (4, 6, 3, 1, (1, 1, 1, 1), (0, 0), 2, (1, 1)),
    (2, 2, 5, 3, (2, 1, 0, 2), (2, 1), 1, (1, 1)),
    (3, 3, 1, 2, (0, 0, 0, 0), (1, 1), 1, (1, 1)),    # kernel smaller than the stride
    (2, 4, 3, 2, (1, 1, 1, 1), (1, 0), 2, (2, 2)),
]


@pytest.mark.parametrize("c,k,kernel,stride,padding,opad,groups,dil", DECONV_CASES)
def test_deconv_matches_the_scatter_loop(c, k, kernel, stride, padding, opad, groups, dil):
    rng = np.random.default_rng(7)
    x = _x(rng, (2, c, 4, 3), "int8")
    w = rng.integers(-30, 31, (c, k // groups, kernel, kernel))
    layer = DeconvLayer("dc", "x", "y", w, rng.integers(-99, 99, k), -3, (stride, stride),
                        padding, opad, _rq(k), groups=groups, dilation=dil)
    assert layer.out_channels == k and layer.op_name == "conv2d_transpose"
    acc = deconv_accumulate(x, layer)
    np.testing.assert_array_equal(acc, _deconv_loop(x, layer))
    g = LayerGraph({"x": Tensor("x", x.shape, "int8"), "y": Tensor("y", acc.shape, "int8")},
                   [layer], ["x"], ["y"])
    np.testing.assert_array_equal(reference_execute(g, {"x": x})["y"],
                                  layer.requant.apply(acc).astype(np.int8))


@pytest.mark.parametrize("c,k,kernel,stride,padding,opad,groups,dil",
                         [cs for cs in DECONV_CASES if cs[-1] == (1, 1)])
def test_deconv_equals_sub_kernel_convolutions_plus_shuffle(c, k, kernel, stride, padding, opad,
                                                             groups, dil):
    rng = np.random.default_rng(8)
    x = _x(rng, (1, c, 5, 4), "int8")
    w = rng.integers(-30, 31, (c, k // groups, kernel, kernel))
    layer = DeconvLayer("dc", "x", "y", w, rng.integers(-99, 99, k), 5, (stride, stride),
                        padding, opad, _rq(k), groups=groups)
    subs = deconv_subconvs(layer, x.shape)
    # one stride-1 sub-convolution per phase (s^2; a phase without taps is bias only), each
    # sub-kernel at most ceil(k / s) wide
    assert len(subs) == stride * stride
    for sc in subs:
        assert sc.conv.strides == (1, 1) and sc.conv.groups == groups
        assert sc.conv.kernel[0] <= -(-kernel // stride)
    np.testing.assert_array_equal(deconv_by_subconvs(x, layer), deconv_accumulate(x, layer))


def test_deconv_equals_zero_insertion_upsample_pad_and_flipped_conv():
    """DECONV_{k,s,p}(X) = CONV_k(Padding_{k-1-p}(Upsample_s(X))) with a zero-insertion
    upsample and the kernel flipped and transposed (the DPU paper's other form)."""
    rng = np.random.default_rng(9)
    c, k, kernel, s, p = 3, 4, 3, 2, 1
    x = _x(rng, (1, c, 4, 4), "int8")
    w = rng.integers(-30, 31, (c, k, kernel, kernel))
    layer = DeconvLayer("dc", "x", "y", w, np.zeros(k, np.int64), 0, (s, s), (p,) * 4, (1, 1),
                        _rq(k))
    up = np.zeros((1, c, (4 - 1) * s + 1, (4 - 1) * s + 1), dtype=np.int64)
    up[:, :, ::s, ::s] = x
    q = kernel - 1 - p
    flipped = w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1]
    conv = ConvLayer("c", "u", "y", flipped, np.zeros(k, np.int64), 0, (1, 1),
                     (q, q, q + 1, q + 1), _rq(k))           # + output_padding at the end
    np.testing.assert_array_equal(conv_accumulate(up, conv), deconv_accumulate(x, layer))


def test_a_graph_of_the_new_kinds_runs_in_order():
    rng = np.random.default_rng(10)
    x = _x(rng, (1, 4, 4, 4), "int8")
    dc = DeconvLayer("dc", "x", "d", rng.integers(-5, 6, (4, 4, 2, 2)), np.zeros(4, np.int64),
                     0, (2, 2), (0, 0, 0, 0), (0, 0), _rq(4, shift=2, zp=0))
    mp = PoolLayer("mp", "d", "m", "max", (2, 2), (2, 2), (0, 0, 0, 0))
    up = UpsampleLayer("up", "m", "u", (2, 2))
    cat = ConcatLayer("cat", ("u", "d"), "y", (0, 0), (None, None))
    t = {"x": Tensor("x", x.shape, "int8"), "d": Tensor("d", (1, 4, 8, 8), "int8"),
         "m": Tensor("m", (1, 4, 4, 4), "int8"), "u": Tensor("u", (1, 4, 8, 8), "int8"),
         "y": Tensor("y", (1, 8, 8, 8), "int8")}
    out = reference_execute(LayerGraph(t, [dc, mp, up, cat], ["x"], ["y", "m"]), {"x": x})
    d = dc.requant.apply(deconv_accumulate(x, dc)).astype(np.int8)
    m = d.reshape(1, 4, 4, 2, 4, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(out["m"], m)
    np.testing.assert_array_equal(out["y"][:, 4:], d)
    np.testing.assert_array_equal(out["y"][:, :4], m.repeat(2, 2).repeat(2, 3))
