"""DPU pattern table: which canonical integer layers the CONV engine and MISC unit take.

Offloaded: quantized conv2d (kernel <= 15, stride <= 7, padding <= 15, groups 1 or
depthwise, the same dilation <= 15 in H and W), dense (as a 1x1 conv) and the residual add
(MISC ELTADD) and the squeeze-excitation product (MISC ELTMUL); on the MISC unit as separate
layers: max pool (same quantization in and out),
average / global average pool, nearest upsample by integer factors, and channel concat of
identically quantized inputs (by placement); transpose conv as stride-1 sub-convolutions whose
SAVEs scatter into the output. The DPU is int8-only with
power-of-two requantization: uint8 activations and non-power-of-two scales stay on the CPU.
Each check is named; its docstring is the reason a layer stays on the CPU.
"""

from __future__ import annotations

import numpy as np
from tvm.relax.dpl import DFPattern, is_op, wildcard

from tvm_accel.partition import (
    OffloadPattern,
    concat_on_channels,
    const_value,
    dtype_of,
    pool_is_plain,
    qadd_pattern,
    qconcat_pattern,
    qdeconv_pattern,
    qlinear_lut_pattern,
    qlinear_pattern,
    qmul_pattern,
    qpool_pattern,
    qupsample_pattern,
    static_shape,
    subbyte_activation_bits,
    upsample_is_nearest,
)

#: 12-bit channel fields (ic, oc, chans)
MAX_CHANNELS = (1 << 12) - 1
MAX_PAD = 15  # 4-bit pad fields of CONV (a tile's pads never exceed the layer's)


def input_is_int8(m: dict) -> bool:
    """activations are not int8 (the DPU is int8-only; uint8 activations stay on the CPU)"""
    return dtype_of(m["data"]) == "int8"


def output_is_int8(m: dict) -> bool:
    """output is not int8 (the DPU stores int8 feature maps only)"""
    return str(m["root"].attrs.dtype) == "int8"


def static_shapes(m: dict) -> bool:
    """shapes are not static (DPU programs are compiled for fixed shapes)"""
    return static_shape(m["data"]) is not None and static_shape(m["core"]) is not None


def conv_nchw(m: dict) -> bool:
    """layout is not NCHW/OIHW"""
    a = m["core"].attrs
    return a.data_layout == "NCHW" and a.kernel_layout == "OIHW" and a.out_layout == "NCHW"


#: 4-bit CONV dilation field
MAX_DILATION = 15


def conv_dilation_fits(m: dict) -> bool:
    """dilation differs between H and W or exceeds 15 (one 4-bit CONV dilation field)"""
    dh, dw = (int(d) for d in m["core"].attrs.dilation)
    return dh == dw and 1 <= dh <= MAX_DILATION


def conv_groups_supported(m: dict) -> bool:
    """grouped conv other than depthwise with ic == oc (the CONV engine has no groups)"""
    g = int(m["core"].attrs.groups)
    if g == 1:
        return True
    c = static_shape(m["data"])[1]
    w = const_value(m["weight"])
    return g == c and w.shape[0] == c and w.shape[1] == 1


def kernel_fits(m: dict) -> bool:
    """kernel larger than 15 (4-bit kernel fields) and no W space-to-depth brings it within"""
    from tvm_dpu.strategy.space_to_depth import w_space_to_depth_factor

    w = const_value(m["weight"])
    if w.shape[2] <= 15 and w.shape[3] <= 15:
        return True
    a = m["core"].attrs
    shape = static_shape(m["data"])
    return shape is not None and w_space_to_depth_factor(
        (int(w.shape[2]), int(w.shape[3])), int(a.strides[1]), int(shape[3]),
        int(a.padding[1]), int(a.padding[3]), int(a.groups),
        tuple(int(d) for d in a.dilation)) is not None


def stride_fits(m: dict) -> bool:
    """stride larger than 7 (3-bit stride fields)"""
    return all(1 <= int(s) <= 7 for s in m["core"].attrs.strides)


def padding_fits(m: dict) -> bool:
    """padding larger than 15 (4-bit pad fields)"""
    return all(0 <= int(p) <= MAX_PAD for p in m["core"].attrs.padding)


def channels_fit(m: dict) -> bool:
    """more than 4095 input or output channels (12-bit channel fields)"""
    w = const_value(m["weight"])
    return max(w.shape[:2]) <= MAX_CHANNELS and static_shape(m["data"])[1] <= MAX_CHANNELS


def dense_is_2d(m: dict) -> bool:
    """matmul is not a 2-D (batch, in) x (in, out) dense layer"""
    return len(static_shape(m["data"]) or ()) == 2 and len(static_shape(m["weight"]) or ()) == 2


def flatten_is_a_view(m: dict) -> bool:
    """the Flatten before the dense does not turn an (N, C, 1, 1) tensor into (N, C)

    (in the DPU's HWC layout those are the same bytes, so the dense reads the 1x1 image
    directly and a global pool, the Flatten and the classifier stay in one instruction stream)
    """
    x, flat = static_shape(m["data"]), static_shape(m["flatten"])
    return (x is not None and flat is not None and len(x) == 4 and tuple(x[2:]) == (1, 1)
            and tuple(flat) == tuple(x[:2]))


def weights_fit_int8(m: dict) -> bool:
    """weights minus their zero point do not fit int8 (the CONV engine multiplies int8 x int8)"""
    w = const_value(m["weight"])
    return bool(w.min() >= -128 and w.max() <= 127)


def _reduce_axes(m: dict, ndim: int) -> tuple[int, ...]:
    op = m["core"].op.name
    if op == "relax.nn.conv2d":
        return tuple(range(1, ndim))
    if op == "relax.nn.conv2d_transpose":
        return (0, 2, 3)
    return (0,)


def _weight_sums(m: dict, w: np.ndarray) -> np.ndarray:
    """Per-output-channel sums of ``w`` (transpose conv: IOHW, per group)."""
    sums = w.sum(axis=_reduce_axes(m, w.ndim))
    if m["core"].op.name == "relax.nn.conv2d_transpose" and int(m["core"].attrs.groups) > 1:
        g = int(m["core"].attrs.groups)
        cg_ = w.shape[0] // g
        sums = np.concatenate([w[i * cg_:(i + 1) * cg_].sum(axis=(0, 2, 3)) for i in range(g)])
    return sums


def _folded_bias(m: dict) -> np.ndarray:
    w = const_value(m["weight"]).astype(np.int64)
    zx = int(const_value(m["input_zero_point"]))
    b = const_value(m["bias"]).astype(np.int64).reshape(-1) - zx * _weight_sums(m, w)
    zp, sh = int(const_value(m["zero_point"])), int(const_value(m["shift"]))
    return b + (zp << sh)


def bias_fits_int32(m: dict) -> bool:
    """bias with the folded zero points overflows int32 (the PM holds int32 biases)"""
    return bool(np.abs(_folded_bias(m)).max() < 2**31)


def acc_fits_int32(m: dict) -> bool:
    """accumulator may overflow int32 (the CONV engine accumulates in 32 bits)"""
    w = np.abs(const_value(m["weight"]).astype(np.int64))
    return bool((_weight_sums(m, w) * 256).max() < 2**31)


def requant_is_shift(m: dict) -> bool:
    """requantize is not a right shift 0..31 (the DPU requantizes by shifting only)"""
    pre, sh = const_value(m["pre_shift"]), const_value(m["shift"])
    mult = const_value(m["multiplier"])
    return (pre.size == 1 and sh.size == 1 and int(pre) == 0 and 0 <= int(sh) <= 31
            and bool(np.all(mult == 1))
            and all(const_value(m[k]).size == 1 for k in ("zero_point", "qmin", "qmax")))


def lut_is_leaky_relu(m: dict) -> bool:
    """the activation is not the DPU's LeakyReLU (slope 26/256 = 0.1015625 at the conv's scale)

    The CONV's nonlinear module (DNNVM 4.1.2) has LeakyReLU with the DPUCZDX8G's fixed slope
    on the int8 result; the fused table must equal it on every code
    (:func:`tvm_dpu.numerics.leaky_mismatch`), else the activation stays on the CPU.
    """
    from tvm_dpu.numerics import leaky_mismatch

    table, off = const_value(m["table"]), np.asarray(const_value(m["offset"])).reshape(-1)
    if str(m["table"].ty.dtype) != "int8" or table.size != 256 * off.size:
        return False
    return leaky_mismatch(table, -int(off[0]), int(const_value(m["qmin"])),
                          int(const_value(m["qmax"]))) is None


def add_same_shape(m: dict) -> bool:
    """operands differ in shape or are not 4-D (ELTADD has no broadcasting)"""
    a, b = static_shape(m["lhs"]), static_shape(m["rhs"])
    return a is not None and a == b and len(a) == 4 and a[1] <= MAX_CHANNELS


def add_operands_int8(m: dict) -> bool:
    """an operand is not int8 (the DPU is int8-only)"""
    return dtype_of(m["lhs"]) == "int8" and dtype_of(m["rhs"]) == "int8"


def add_zero_points_zero(m: dict) -> bool:
    """add with a non-zero zero point (ELTADD works on symmetric int8 only)"""
    return all(int(const_value(m[k])) == 0
               for k in ("lhs_zero_point", "rhs_zero_point", "zero_point"))


def add_recipe_is_shift(m: dict) -> bool:
    """add scales are not powers of two within ELTADD's shifts (align 0..31, shift 0..31)"""
    for k in ("lhs_multiplier", "rhs_multiplier"):
        v = int(const_value(m[k]))
        if v < 1 or v & (v - 1) or v.bit_length() - 1 > 31:
            return False
    sh = const_value(m["shift"])
    return sh.size == 1 and 0 <= int(sh) <= 31


def mul_is_gate(m: dict) -> bool:
    """product is not an int8 map times an int8 map of its shape or (N, C, 1, 1) vector

    (ELTMUL repeats one pixel of its operand B by zero strides; nothing else broadcasts)
    """
    a, b = static_shape(m["lhs"]), static_shape(m["rhs"])
    if a is None or b is None or len(a) != 4 or len(b) != 4:
        return False
    if a[2:] == (1, 1) and b[2:] != (1, 1):
        a, b = b, a
    return (b in (a, (a[0], a[1], 1, 1)) and a[1] <= MAX_CHANNELS
            and dtype_of(m["lhs"]) == dtype_of(m["rhs"]) == "int8")


def mul_zero_points_zero(m: dict) -> bool:
    """product with a non-zero zero point (ELTMUL multiplies symmetric int8 only)"""
    return all(int(const_value(m[k])) == 0
               for k in ("lhs_zero_point", "rhs_zero_point", "zero_point"))


def pool_input_int8(m: dict) -> bool:
    """input is not int8 (the DPU is int8-only)"""
    return dtype_of(m["data"]) == "int8"


def pool_window_fits(m: dict) -> bool:
    """pool window > 15, stride > 7, padding >= window, dilation or ceil mode (MISC fields)"""
    a = m["core"].attrs
    k = [int(x) for x in a.pool_size]
    pad = [int(x) for x in a.padding]
    return (max(k) <= 15 and all(1 <= int(x) <= 7 for x in a.strides)
            and pad[0] < k[0] and pad[2] < k[0] and pad[1] < k[1] and pad[3] < k[1]
            and all(int(d) == 1 for d in a.dilation) and not bool(a.ceil_mode)
            and str(a.layout) == "NCHW")


def pool_channels_fit(m: dict) -> bool:
    """shape not static 4-D or more than 4095 channels"""
    s = static_shape(m["data"])
    return s is not None and len(s) == 4 and s[1] <= MAX_CHANNELS


def avg_recipe_fits(m: dict) -> bool:
    """average pool recipe does not fit AVGPOOL (zero points 0, 16-bit mult, shift 0..31)"""
    mult = const_value(m["multiplier"]).reshape(-1)
    return (int(const_value(m["input_zero_point"])) == 0
            and int(const_value(m["zero_point"])) == 0 and int(const_value(m["pre_shift"])) == 0
            and len(set(mult.tolist())) == 1 and 1 <= int(mult[0]) < 1 << 16
            and 0 <= int(const_value(m["shift"])) <= 31)


def global_pool_fits(m: dict) -> bool:
    """global pool over more than 15 x 15 pixels (4-bit kernel fields) not split in steps (a
    side without factors <= 7 then <= 15, or the steps' 8-bit intermediates would cost more than
    --max-requant-error output LSBs)"""
    s = static_shape(m["data"])
    return s is not None and len(s) == 4 and s[2] <= 15 and s[3] <= 15


def qglobal_pool_flat_pattern() -> tuple[DFPattern, dict]:
    """A global average pool whose output is flattened to (N, C) (SqueezeNet's head ends in
    GlobalAveragePool -> Flatten): the reshape is annotated ``flatten``."""
    out, ann = qpool_pattern("global_avg")
    flat = is_op("relax.reshape")(out, wildcard())
    ann["flatten"] = flat
    return flat, ann


def pool_flatten_is_a_view(m: dict) -> bool:
    """the Flatten after the global pool does not turn its (N, C, 1, 1) output into (N, C)

    (in the DPU's HWC layout those are the same bytes: the pool SAVEs the (N, C) tensor)
    """
    pooled, flat = static_shape(m["root"]), static_shape(m["flatten"])
    return (pooled is not None and flat is not None and len(pooled) == 4
            and tuple(pooled[2:]) == (1, 1) and tuple(flat) == tuple(pooled[:2]))


def upsample_is_nearest_integer(m: dict) -> bool:
    """resize is not a nearest upsample by integer factors up to 15 (UPSAMPLE factors)"""
    from tvm_accel.canonicalize import nearest_upsample_scale

    sc = nearest_upsample_scale(m["core"].attrs, static_shape(m["data"]),
                                static_shape(m["core"]))
    return sc is not None and 1 <= min(sc) and max(sc) <= 15


def concat_inputs_placeable(m: dict) -> bool:
    """an input is rescaled, not int8 or not 4-D (concat by placement needs equal scales)"""
    i = 0
    while f"input{i}" in m:
        s = static_shape(m[f"input{i}"])
        if (f"in{i}_input_zero_point" in m or dtype_of(m[f"input{i}"]) != "int8" or s is None
                or len(s) != 4):
            return False
        i += 1
    return int(m["core"].attrs.axis) in (1, -3)


def deconv_supported(m: dict) -> bool:
    """transpose conv with groups, dilation, non-NCHW layout, kernel > 15 or stride > 7"""
    a = m["core"].attrs
    w = const_value(m["weight"])
    return (int(a.groups) == 1 and all(int(d) == 1 for d in a.dilation)
            and a.data_layout == "NCHW" and a.kernel_layout == "IOHW"
            and w.shape[2] <= 15 and w.shape[3] <= 15 and all(1 <= int(s) <= 7 for s in a.strides)
            and max(w.shape[0], w.shape[1]) <= MAX_CHANNELS)


def activations_are_8bit(m: dict) -> bool:
    """sub-8-bit (2..7-bit) activations: the DPU computes int8 only

    Policy for mixed-precision models (:mod:`tvm_accel.precision`): a layer whose input or
    output activations were recorded below 8 bits stays on the CPU. Sub-8-bit *weights* are
    accepted: held in the int8 container they are exact on the int8 MAC.
    """
    return subbyte_activation_bits(m) is None


_COMMON = [input_is_int8, output_is_int8, static_shapes, weights_fit_int8, requant_is_shift,
           bias_fits_int32, acc_fits_int32]


def pattern_table() -> list[OffloadPattern]:
    """DPU's pattern table, highest priority first."""
    conv, conv_ann = qlinear_pattern("conv2d")
    dense, dense_ann = qlinear_pattern("matmul")
    add, add_ann = qadd_pattern()
    conv_checks = [conv_nchw, conv_dilation_fits, conv_groups_supported, kernel_fits,
                   stride_fits, padding_fits, channels_fit, *_COMMON]
    table = [
        OffloadPattern("dpu.qconv2d_leaky", "conv2d", *qlinear_lut_pattern("conv2d"),
                       [*conv_checks, lut_is_leaky_relu]),
        OffloadPattern("dpu.qconv2d", "conv2d", conv, conv_ann, conv_checks),
        OffloadPattern("dpu.qdense_flat", "dense", *qlinear_pattern("matmul", flatten=True),
                       [flatten_is_a_view, channels_fit, *_COMMON]),
        OffloadPattern("dpu.qdense", "dense", dense, dense_ann,
                       [dense_is_2d, channels_fit, *_COMMON]),
        OffloadPattern("dpu.qadd", "add", add, add_ann,
                       [add_operands_int8, add_same_shape, output_is_int8, add_zero_points_zero,
                        add_recipe_is_shift]),
        OffloadPattern("dpu.qdeconv", "conv2d_transpose", *qdeconv_pattern(),
                       [deconv_supported, *_COMMON]),
        OffloadPattern("dpu.maxpool", "max_pool2d", *qpool_pattern("max"),
                       [pool_is_plain, pool_input_int8, pool_channels_fit, pool_window_fits]),
        OffloadPattern("dpu.avgpool", "avg_pool2d", *qpool_pattern("avg"),
                       [pool_is_plain, pool_input_int8, output_is_int8, pool_channels_fit,
                        pool_window_fits, avg_recipe_fits]),
        OffloadPattern("dpu.globalavgpool_flat", "global_avg_pool2d", *qglobal_pool_flat_pattern(),
                       [pool_flatten_is_a_view, pool_is_plain, pool_input_int8, output_is_int8,
                        pool_channels_fit, global_pool_fits, avg_recipe_fits]),
        OffloadPattern("dpu.globalavgpool", "global_avg_pool2d", *qpool_pattern("global_avg"),
                       [pool_is_plain, pool_input_int8, output_is_int8, pool_channels_fit,
                        global_pool_fits, avg_recipe_fits]),
        OffloadPattern("dpu.upsample", "upsample", *qupsample_pattern(),
                       [upsample_is_nearest, pool_input_int8, pool_channels_fit,
                        upsample_is_nearest_integer]),
        OffloadPattern("dpu.mul", "multiply", *qmul_pattern(),
                       [mul_is_gate, output_is_int8, mul_zero_points_zero, requant_is_shift]),
        *[OffloadPattern(f"dpu.concat{n}", "concat", *qconcat_pattern(n),
                         [concat_on_channels, concat_inputs_placeable]) for n in (2, 3, 4)],
    ]
    for p in table:  # sub-8-bit activations stay on the CPU
        p.checks.append(activations_are_8bit)
    return table
