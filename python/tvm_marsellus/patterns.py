"""MARSELLUS pattern table: which canonical integer layers the CLUSTER (RBE + XpulpNN cores)
takes. Each check is named; its docstring is the reason a layer stays on the host CPU.

Offloaded: quantized conv2d (the strategy puts 3x3 / 1x1, stride 1 / 2 convs on the RBE and the
rest, including depthwise, wide kernels such as 20x5 and padding not smaller than the kernel,
on the cores: windows up to 255 in the cluster kernels' 8-bit fields; a dilated stride-1 conv
as its input phases), transpose conv (its output phases, ``strategy.deconv``), channel concat
(its inputs written into their slices of the output, ``strategy.concat``), nearest upsample by
integer factors (phase copies on the cores, ``strategy.resize``), dense (cluster FC),
the residual add (a 1x1 BinConv on the RBE between RBE layers, else the cluster ADD: one
recipe fits both), max pool with the same quantization in and out, and average / global
average pool (cluster AVGPOOL), and the table lookups of the integer activations (Sigmoid,
SiLU, HardSigmoid, HardSwish, Tanh, LeakyRelu, PRelu: cluster LUT, one table in L1) and the
product of a feature map and a per-channel vector (the squeeze-excitation gate: cluster MUL).
Requantization must be expressible as NormQuant: no
pre-shift, 16-bit kappa, shift 0..31, a 32-bit lambda once bias and zero points are folded,
and a clip equal to the output type's range (or its ReLU half).
"""

from __future__ import annotations

import numpy as np

from tvm_accel.partition import (
    OffloadPattern,
    concat_on_channels,
    const_value,
    dtype_of,
    pool_is_plain,
    qadd_pattern,
    qconcat_pattern,
    qdeconv_pattern,
    qlinear_pattern,
    qlut_pattern,
    qmul_pattern,
    qpool_pattern,
    qupsample_pattern,
    static_shape,
    upsample_is_nearest,
)
from tvm_marsellus.numerics import KAPPA_MAX

#: 16-bit shape fields of the cluster / RBE commands, 8-bit kernel / stride / padding fields
#: of the cluster kernels (the RBE takes 3x3 / 1x1 windows; the strategy picks the engine)
MAX_DIM = (1 << 16) - 1
MAX_WINDOW = 255
_INT = ("int8", "uint8")


def activations_8bit(m: dict) -> bool:
    """activations are not int8/uint8 (the CLUSTER runs quantized 2..8-bit integers)"""
    return dtype_of(m["data"]) in _INT and str(m["root"].attrs.dtype) in _INT


def static_shapes(m: dict) -> bool:
    """shapes are not static (MARSELLUS programs are compiled for fixed shapes)"""
    return static_shape(m["data"]) is not None and static_shape(m["core"]) is not None


def conv_nchw(m: dict) -> bool:
    """layout is not NCHW/OIHW"""
    a = m["core"].attrs
    return a.data_layout == "NCHW" and a.kernel_layout == "OIHW" and a.out_layout == "NCHW"


def conv_dilation_mappable(m: dict) -> bool:
    """dilated convolution with a stride above 1 (neither engine has dilated windows; the
    strategy's input-phase decomposition needs stride 1)"""
    a = m["core"].attrs
    return all(int(d) == 1 for d in a.dilation) or all(int(s) == 1 for s in a.strides)


def conv_groups_supported(m: dict) -> bool:
    """grouped conv other than depthwise (the cluster has CONV and DWCONV only)"""
    g = int(m["core"].attrs.groups)
    if g == 1:
        return True
    c = static_shape(m["data"])[1]
    w = const_value(m["weight"])
    return g == c and w.shape[0] == c and w.shape[1] == 1


def window_fits(m: dict) -> bool:
    """kernel, stride or padding above 255 (8-bit window fields of the cluster kernels)"""
    w = const_value(m["weight"])
    a = m["core"].attrs
    return (w.shape[2] <= MAX_WINDOW and w.shape[3] <= MAX_WINDOW
            and all(1 <= int(s) <= MAX_WINDOW for s in a.strides)
            and all(0 <= int(p) <= MAX_WINDOW for p in a.padding))


def dims_fit(m: dict) -> bool:
    """a dimension exceeds the 16-bit shape fields"""
    return max(static_shape(m["data"]) + static_shape(m["core"])) <= MAX_DIM


def dense_is_2d(m: dict) -> bool:
    """matmul is not a 2-D (batch, in) x (in, out) dense layer"""
    return len(static_shape(m["data"]) or ()) == 2 and len(static_shape(m["weight"]) or ()) == 2


def weights_fit_int8(m: dict) -> bool:
    """weights minus their zero point do not fit int8 (RBE and cores multiply <= 8-bit weights)"""
    w = const_value(m["weight"])
    return bool(w.min() >= -128 and w.max() <= 127)


def requant_is_normquant(m: dict) -> bool:
    """requantize is not NormQuant (pre-shift, kappa above 16 bits or shift above 31)"""
    pre, sh = const_value(m["pre_shift"]), const_value(m["shift"])
    mult = const_value(m["multiplier"])
    return (pre.size == 1 and int(pre) == 0 and sh.size == 1 and 0 <= int(sh) <= 31
            and bool(np.all((mult >= 0) & (mult <= KAPPA_MAX)))
            and all(const_value(m[k]).size == 1 for k in ("zero_point", "qmin", "qmax")))


def clip_is_output_range(m: dict) -> bool:
    """clip is narrower than the output's O-bit range (NormQuant clamps to the O-bit range or
    its ReLU half)"""
    lo, hi = int(const_value(m["qmin"])), int(const_value(m["qmax"]))
    dt = str(m["root"].attrs.dtype)
    o = int((m.get("precision") or {}).get("o") or 8)  # sub-byte output (canonicalize record)
    if dt == "uint8":
        return (lo, hi) == (0, (1 << o) - 1)
    return hi == (1 << (o - 1)) - 1 and lo in (-(1 << (o - 1)), 0)


def _weight_sums(w: np.ndarray) -> np.ndarray:
    return w.reshape(w.shape[0], -1).sum(axis=1) if w.ndim == 4 else w.sum(axis=0)


def lambda_fits_int32(m: dict) -> bool:
    """NormQuant lambda (bias, zero points and the RBE's unsigned offset folded) leaves 32 bits"""
    return _lambda_fits(m, _weight_sums(const_value(m["weight"]).astype(np.int64)))


def _lambda_fits(m: dict, sums: np.ndarray) -> bool:
    """The NormQuant lambda of every output channel fits 32 bits with weight sums ``sums``
    (per output channel; a transpose conv: per phase and output channel)."""
    zx = int(const_value(m["input_zero_point"]))
    off = 128 if dtype_of(m["data"]) == "int8" else 0
    b = const_value(m["bias"]).astype(np.int64).reshape(-1)
    mult = np.broadcast_to(const_value(m["multiplier"]).astype(np.int64).reshape(-1), b.shape)
    sh = int(const_value(m["shift"]))
    zp = int(const_value(m["zero_point"]))
    lam = mult * (b - (zx + off) * sums) + (1 << max(sh - 1, 0)) + ((abs(zp) + 128) << sh)
    return bool(np.abs(lam).max() < 2 ** 31)


def acc_fits_int32(m: dict) -> bool:
    """accumulator may overflow int32 (RBE and cores accumulate in 32 bits)"""
    w = np.abs(const_value(m["weight"]).astype(np.int64))
    return bool((_weight_sums(w) * 256).max() < 2 ** 31)


def deconv_layout(m: dict) -> bool:
    """transpose conv layout is not NCHW/IOHW"""
    a = m["core"].attrs
    return a.data_layout == "NCHW" and a.kernel_layout == "IOHW" and a.out_layout == "NCHW"


def deconv_mappable(m: dict) -> bool:
    """dilated or grouped (non-depthwise) transpose conv, or kernel / stride above 255 (its
    output phases are stride-1 convs of the input: dilation 1, CONV or DWCONV, 8-bit window
    fields)"""
    a, w = m["core"].attrs, const_value(m["weight"])
    g, c = int(a.groups), static_shape(m["data"])[1]
    return (all(int(d) == 1 for d in a.dilation) and (g == 1 or (g == c and w.shape[1] == 1))
            and max(w.shape[2:]) <= MAX_WINDOW
            and all(1 <= int(s) <= MAX_WINDOW for s in a.strides))


def _deconv_phase_sums(m: dict, w: np.ndarray) -> np.ndarray:
    """Per phase and output channel, the sum of the IOHW weights its sub-convolution
    multiplies: shape (phases, K)."""
    a = m["core"].attrs
    g, (sh, sw) = int(a.groups), (int(s) for s in a.strides)
    c, kg = w.shape[:2]
    return np.stack([w[:, :, rh::sh, rw::sw].sum(axis=(2, 3)).reshape(g, c // g, kg).sum(axis=1)
                     .reshape(-1) for rh in range(sh) for rw in range(sw)])


def deconv_lambda_fits(m: dict) -> bool:
    """NormQuant lambda of an output phase (bias, zero points and the RBE's unsigned offset
    folded) leaves 32 bits"""
    sums = _deconv_phase_sums(m, const_value(m["weight"]).astype(np.int64))
    return all(_lambda_fits(m, s) for s in sums)


def deconv_acc_fits(m: dict) -> bool:
    """accumulator of an output phase may overflow int32 (RBE and cores accumulate in 32 bits)"""
    sums = _deconv_phase_sums(m, np.abs(const_value(m["weight"]).astype(np.int64)))
    return bool((sums * 256).max() < 2 ** 31)


def concat_inputs_fit(m: dict) -> bool:
    """an input is not 4-D int8/uint8 of the output's type or its rescale is not one NormQuant

    (a pre-shift, several or above 16-bit multipliers, a shift above 31, a clip narrower than
    the output's range): the cores copy a rescaled input into its slice with a 1x1 AVGPOOL."""
    i, dt = 0, dtype_of(m["core"]) if hasattr(m["core"], "ty") else None
    while f"input{i}" in m:
        x, p = m[f"input{i}"], f"in{i}_"
        s = static_shape(x)
        if dtype_of(x) not in _INT or s is None or len(s) != 4 or (dt and dtype_of(x) != dt):
            return False
        if f"{p}input_zero_point" in m:
            pre, sh, mult = (const_value(m[p + k]).ravel() for k in ("pre_shift", "shift",
                                                                   "multiplier"))
            lo, hi = (int(const_value(m[p + k]).ravel()[0]) for k in ("qmin", "qmax"))
            rlo, rhi = (-128, 127) if dtype_of(x) == "int8" else (0, 255)
            if not (pre.size == sh.size == mult.size == 1 and int(pre[0]) == 0
                    and 0 <= int(sh[0]) <= 31 and 1 <= int(mult[0]) <= KAPPA_MAX
                    and hi == rhi and lo in (rlo, 0)):
                return False
        i += 1
    return True


def add_same_shape(m: dict) -> bool:
    """operands differ in shape or are not 4-D (cluster ADD has no broadcasting)"""
    a, b = static_shape(m["lhs"]), static_shape(m["rhs"])
    return a is not None and a == b and len(a) == 4 and max(a) <= MAX_DIM


def add_operands_8bit(m: dict) -> bool:
    """an operand or the result is not int8/uint8"""
    return (dtype_of(m["lhs"]) in _INT and dtype_of(m["rhs"]) in _INT
            and dtype_of(m["lhs"]) == dtype_of(m["rhs"]) and str(m["root"].attrs.dtype) in _INT)


def add_recipe_fits(m: dict) -> bool:
    """add multipliers above 16 bits or lambda above 32 bits (cluster ADD: kappa_a, kappa_b,
    lambda; on the RBE the same integers as W-bit weights times one kappa)"""
    ma, mb = (int(const_value(m[k])) for k in ("lhs_multiplier", "rhs_multiplier"))
    sh = int(const_value(m["shift"]))
    za, zb = (int(const_value(m[k])) for k in ("lhs_zero_point", "rhs_zero_point"))
    lam = (1 << max(sh - 1, 0)) + (int(const_value(m["zero_point"])) << sh) - za * ma - zb * mb
    return 0 <= ma <= KAPPA_MAX and 0 <= mb <= KAPPA_MAX and 0 <= sh <= 31 and abs(lam) < 2 ** 31


def pool_input_8bit(m: dict) -> bool:
    """input is not int8/uint8"""
    return dtype_of(m["data"]) in _INT


def pool_window_fits(m: dict) -> bool:
    """pool window, stride or padding above 255 (8-bit fields), dilation or ceil mode"""
    a = m["core"].attrs
    k = [int(x) for x in a.pool_size]
    pad = [int(x) for x in a.padding]
    return (max(k) <= MAX_WINDOW and all(1 <= int(x) <= MAX_WINDOW for x in a.strides)
            and max(pad) <= MAX_WINDOW and all(int(d) == 1 for d in a.dilation)
            and not bool(a.ceil_mode) and str(a.layout) == "NCHW")


def pool_shape_fits(m: dict) -> bool:
    """shape not static 4-D"""
    s = static_shape(m["data"])
    return s is not None and len(s) == 4 and max(s) <= MAX_DIM


def avg_recipe_fits(m: dict) -> bool:
    """average pool recipe is not one 16-bit kappa with shift 0..31 (cluster AVGPOOL)"""
    mult = const_value(m["multiplier"]).reshape(-1)
    return (int(const_value(m["pre_shift"])) == 0 and len(set(mult.tolist())) == 1
            and 1 <= int(mult[0]) <= KAPPA_MAX and 0 <= int(const_value(m["shift"])) <= 31)


def global_pool_fits(m: dict) -> bool:
    """global pool over more than 255 x 255 pixels (8-bit window fields)"""
    s = static_shape(m["data"])
    return s is not None and len(s) == 4 and s[2] <= MAX_WINDOW and s[3] <= MAX_WINDOW


def lut_tensors_fit(m: dict) -> bool:
    """input or output is not a static 4-D int8/uint8 tensor within the 16-bit shape fields, or
    the table has not one row or one row per channel (cluster LUT: one 256-byte row per
    channel of an HWC tile)"""
    s, so = static_shape(m["data"]), static_shape(m["core"])
    if s is None or so is None or len(s) != 4 or s != so or max(s) > MAX_DIM:
        return False
    rows = const_value(m["table"]).size // 256
    return (dtype_of(m["data"]) in _INT and dtype_of(m["core"]) in _INT
            and rows in (1, s[1]) and const_value(m["table"]).size == rows * 256)


def mul_is_gate(m: dict) -> bool:
    """product is not an 8-bit 4-D feature map times an 8-bit (N, C, 1, 1) vector of the same
    type (cluster MUL: one value per channel, broadcast over the pixels)"""
    a, b = static_shape(m["lhs"]), static_shape(m["rhs"])
    if a is None or b is None or len(a) != 4 or len(b) != 4:
        return False
    if a[2:] == (1, 1) and b[2:] != (1, 1):
        a, b = b, a
    return (b == (a[0], a[1], 1, 1) and max(a) <= MAX_DIM
            and dtype_of(m["lhs"]) == dtype_of(m["rhs"]) in _INT
            and str(m["root"].attrs.dtype) in _INT)


def mul_recipe_fits(m: dict) -> bool:
    """requantize of the product is not one NormQuant (pre-shift, kappa above 16 bits, shift
    above 31)"""
    mult = const_value(m["multiplier"]).reshape(-1)
    return (int(const_value(m["pre_shift"])) == 0 and mult.size == 1
            and 1 <= int(mult[0]) <= KAPPA_MAX and 0 <= int(const_value(m["shift"])) <= 31)


_COMMON = [activations_8bit, static_shapes, dims_fit, weights_fit_int8, requant_is_normquant,
           clip_is_output_range, acc_fits_int32, lambda_fits_int32]


def pattern_table() -> list[OffloadPattern]:
    """MARSELLUS's pattern table, highest priority first."""
    conv, conv_ann = qlinear_pattern("conv2d")
    dense, dense_ann = qlinear_pattern("matmul")
    add, add_ann = qadd_pattern()
    return [
        OffloadPattern("marsellus.qconv2d", "conv2d", conv, conv_ann,
                       [conv_nchw, conv_dilation_mappable, conv_groups_supported, window_fits,
                        *_COMMON]),
        OffloadPattern("marsellus.qdeconv", "conv2d_transpose", *qdeconv_pattern(),
                       [deconv_layout, deconv_mappable, activations_8bit, static_shapes, dims_fit,
                        weights_fit_int8, requant_is_normquant, clip_is_output_range,
                        deconv_acc_fits, deconv_lambda_fits]),
        OffloadPattern("marsellus.qdense", "dense", dense, dense_ann, [dense_is_2d, *_COMMON]),
        OffloadPattern("marsellus.qadd", "add", add, add_ann,
                       [add_operands_8bit, add_same_shape, clip_is_output_range,
                        add_recipe_fits]),
        *[OffloadPattern(f"marsellus.concat{n}", "concat", *qconcat_pattern(n),
                         [concat_on_channels, concat_inputs_fit]) for n in range(2, 9)],
        OffloadPattern("marsellus.upsample_rescaled", "upsample",
                       *qupsample_pattern(rescale=True),
                       [upsample_is_nearest, pool_input_8bit, pool_shape_fits, dims_fit,
                        clip_is_output_range, avg_recipe_fits]),
        OffloadPattern("marsellus.upsample", "upsample", *qupsample_pattern(),
                       [upsample_is_nearest, pool_input_8bit, pool_shape_fits, dims_fit]),
        OffloadPattern("marsellus.maxpool", "max_pool2d", *qpool_pattern("max"),
                       [pool_is_plain, pool_input_8bit, pool_shape_fits, pool_window_fits]),
        OffloadPattern("marsellus.avgpool", "avg_pool2d", *qpool_pattern("avg"),
                       [pool_is_plain, pool_input_8bit, pool_shape_fits, pool_window_fits,
                        clip_is_output_range, avg_recipe_fits]),
        OffloadPattern("marsellus.globalavgpool", "global_avg_pool2d",
                       *qpool_pattern("global_avg"),
                       [pool_is_plain, pool_input_8bit, pool_shape_fits, global_pool_fits,
                        clip_is_output_range, avg_recipe_fits]),
        OffloadPattern("marsellus.lut", "lut", *qlut_pattern(), [lut_tensors_fit]),
        OffloadPattern("marsellus.mul", "multiply", *qmul_pattern(),
                       [mul_is_gate, mul_recipe_fits, clip_is_output_range]),
    ]
