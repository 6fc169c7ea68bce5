"""VTA pattern table: which canonical integer layers the GEMM/ALU datapath takes.

Offloaded: quantized conv2d (any kernel, stride, padding and dilation; grouped and depthwise
convs too: the strategy computes them as dense convs with a block-diagonal weight and skips the
all-zero weight blocks), dense, the quantized residual add (on the ALU) and the transpose conv
(dilation 1, any groups: stride-1 sub-convolutions whose STOREs interleave the output), max /
average / global average pooling on the ALU (canonicalize makes ceil-mode max pools plain), the
nearest upsample by integer factors as data movement (:func:`pool_patterns`), the channel
concat (inputs written in place in their channel-block slice, ``strategy.concat``), the product
of a map and its squeeze-excitation gate and a LeakyReLU table as ALU ops
(``strategy.activation``; other tables have no ALU form). Each check below is named; its
docstring is the reason a layer stays on the CPU. Later entries of
``PATTERNS`` have lower priority.
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
    subbyte_activation_bits,
    upsample_is_nearest,
)

_I8 = ("int8", "uint8")
_IMM_MAX = (1 << 15) - 1
#: largest column step of the interleaving STORE (16-bit x_stride)
MAX_STORE_STRIDE = (1 << 16) - 1


def input_is_8bit(m: dict) -> bool:
    """input is not an int8/uint8 tensor (VTA's INP buffer holds 8-bit data)"""
    return dtype_of(m["data"]) in _I8


def output_is_8bit(m: dict) -> bool:
    """output is not int8/uint8 (VTA stores 8-bit results)"""
    return dtype_of(m["root"]) in _I8


def static_shapes(m: dict) -> bool:
    """shapes are not static (VTA programs are compiled for fixed shapes)"""
    return static_shape(m["data"]) is not None and static_shape(m["core"]) is not None


def conv_nchw(m: dict) -> bool:
    """layout is not NCHW/OIHW (the static template packs NCHW into NCHWnc)"""
    a = m["core"].attrs
    return a.data_layout == "NCHW" and a.kernel_layout == "OIHW" and a.out_layout == "NCHW"


def dense_is_2d(m: dict) -> bool:
    """matmul is not a 2-D (batch, in) x (in, out) dense layer"""
    return len(static_shape(m["data"]) or ()) == 2 and len(static_shape(m["weight"]) or ()) == 2


def weights_fit_int8(m: dict) -> bool:
    """weights minus their zero point do not fit int8 (VTA's WGT buffer is 8-bit)"""
    w = const_value(m["weight"])
    return bool(w.min() >= -128 and w.max() <= 127)


def zero_point_fits_int8(m: dict) -> bool:
    """input zero point does not fit VTA's 8-bit padding value"""
    zx = int(const_value(m["input_zero_point"]))
    if dtype_of(m["data"]) == "uint8":
        zx -= 128
    return -128 <= zx <= 127


def _deconv_phase_sums(m: dict, w: np.ndarray) -> np.ndarray:
    """Per phase and output channel, the sum of the weights a transpose conv's stride-1
    sub-convolution multiplies (IOHW weights, per group): shape (phases, K)."""
    a = m["core"].attrs
    g, (sh, sw) = int(a.groups), (int(s) for s in a.strides)
    c, kg = w.shape[:2]
    sums = [w[:, :, rh::sh, rw::sw].sum(axis=(2, 3)).reshape(g, c // g, kg).sum(axis=1)
            .reshape(-1) for rh in range(sh) for rw in range(sw)]
    return np.stack(sums)


def bias_fits_int32(m: dict) -> bool:
    """bias with the folded zero-point correction overflows int32"""
    w = const_value(m["weight"]).astype(np.int64)
    zx = int(const_value(m["input_zero_point"])) - (128 if dtype_of(m["data"]) == "uint8" else 0)
    op = m["core"].op.name
    if op == "relax.nn.conv2d_transpose":
        sums = _deconv_phase_sums(m, w)
    else:
        sums = w.sum(axis=tuple(range(1, w.ndim)) if op == "relax.nn.conv2d" else (0,))
    b = const_value(m["bias"]).astype(np.int64).reshape(-1) - zx * sums
    return bool(np.abs(b).max() < 2**31)


def requant_fits_alu(m: dict) -> bool:
    """requantize recipe does not fit VTA's ALU (scalar shifts 0..31, multiplier 1..32767)"""
    pre, sh = const_value(m["pre_shift"]), const_value(m["shift"])
    mult = const_value(m["multiplier"])
    return (pre.size == 1 and sh.size == 1 and 0 <= int(pre) <= 31 and 0 <= int(sh) <= 31
            and mult.min() >= 1 and mult.max() <= _IMM_MAX
            and all(const_value(m[k]).size == 1 for k in ("zero_point", "qmin", "qmax")))


def deconv_nchw(m: dict) -> bool:
    """layout is not NCHW/IOHW (the transpose conv is planned as NCHW sub-convolutions)"""
    a = m["core"].attrs
    return a.data_layout == "NCHW" and a.kernel_layout == "IOHW" and a.out_layout == "NCHW"


def deconv_no_dilation(m: dict) -> bool:
    """dilated transpose conv (its stride-1 sub-convolution decomposition needs dilation 1)"""
    return all(int(d) == 1 for d in m["core"].attrs.dilation)


def deconv_stride_fits(m: dict) -> bool:
    """transpose conv stride above 65535 (the interleaving STORE's 16-bit x_stride field)"""
    return all(1 <= int(s) <= MAX_STORE_STRIDE for s in m["core"].attrs.strides)


def add_same_shape(m: dict) -> bool:
    """operands differ in shape (the ALU add has no broadcasting)"""
    a, b = static_shape(m["lhs"]), static_shape(m["rhs"])
    return a is not None and a == b and len(a) == 4


def add_operands_8bit(m: dict) -> bool:
    """an operand is not an int8/uint8 tensor"""
    return dtype_of(m["lhs"]) in _I8 and dtype_of(m["rhs"]) in _I8


def add_recipe_fits_alu(m: dict) -> bool:
    """add multipliers or zero points do not fit VTA's 16-bit ALU immediates"""
    vals = [int(const_value(m[k])) for k in ("lhs_multiplier", "rhs_multiplier")]
    zps = [int(const_value(m[k])) for k in ("lhs_zero_point", "rhs_zero_point")]
    sh = int(const_value(m["shift"]))
    return all(1 <= v <= _IMM_MAX for v in vals) and all(-256 <= z <= 255 for z in zps) and (
        0 <= sh <= 31)


def activations_are_8bit(m: dict) -> bool:
    """sub-8-bit (2..7-bit) activations: VTA computes int8 only

    Policy for mixed-precision models (:mod:`tvm_accel.precision`): a layer whose input or
    output activations were recorded below 8 bits stays on the CPU. Sub-8-bit *weights* are
    accepted: held in the int8 container they are exact on the int8 MAC.
    """
    return subbyte_activation_bits(m) is None


def pool_padding_fits(m: dict) -> bool:
    """pool padding above 15 (the LOAD's 4-bit pad fields)"""
    c = m["core"]
    return c.op.name == "relax.sum" or max(int(p) for p in c.attrs.padding) <= 15


def pool_patterns() -> list[OffloadPattern]:
    """Pooling on the ALU and nearest upsample as data movement (``strategy.pool``,
    ``strategy.upsample``); rescaled forms before the bare ones (which match their core)."""
    pool = [input_is_8bit, output_is_8bit, static_shapes, pool_is_plain,
            pool_padding_fits]
    up = [input_is_8bit, output_is_8bit, static_shapes, upsample_is_nearest]
    return [
        OffloadPattern("vta.maxpool_rescale", "max_pool2d", *qpool_pattern("max", rescale=True),
                       [*pool, requant_fits_alu]),
        OffloadPattern("vta.maxpool", "max_pool2d", *qpool_pattern("max"), pool),
        OffloadPattern("vta.avgpool", "avg_pool2d", *qpool_pattern("avg"),
                       [*pool, requant_fits_alu]),
        OffloadPattern("vta.globalavgpool", "global_avg_pool2d", *qpool_pattern("global_avg"),
                       [*pool, requant_fits_alu]),
        OffloadPattern("vta.upsample_rescale", "upsample", *qupsample_pattern(rescale=True),
                       [*up, requant_fits_alu]),
        OffloadPattern("vta.upsample", "upsample", *qupsample_pattern(), up),
    ]


def concat_inputs_8bit(m: dict) -> bool:
    """an input is not a 4-D int8/uint8 tensor, or one taken as is differs in dtype from the
    output (the blocked layouts of its slice and of the output must agree)"""
    out, i = str(m["core"].ty.dtype), 0
    while f"input{i}" in m:
        x = m[f"input{i}"]
        s = static_shape(x)
        if dtype_of(x) not in _I8 or s is None or len(s) != 4:
            return False
        if f"in{i}_input_zero_point" not in m and dtype_of(x) != out:
            return False
        i += 1
    return out in _I8


def concat_rescale_fits_alu(m: dict) -> bool:
    """a rescaled input's recipe does not fit VTA's ALU (the copy into its slice runs it:
    scalar shifts 0..31, multiplier 1..32767)"""
    i = 0
    while f"input{i}" in m:
        p = f"in{i}_"
        if f"{p}input_zero_point" in m and not requant_fits_alu(
                {k[len(p):]: v for k, v in m.items() if k.startswith(p)}):
            return False
        i += 1
    return True


def mul_operands_8bit(m: dict) -> bool:
    """an operand is not an int8/uint8 tensor"""
    return dtype_of(m["lhs"]) in _I8 and dtype_of(m["rhs"]) in _I8


def mul_is_map_by_gate(m: dict) -> bool:
    """the product is neither of two equal 4-D shapes nor of a map and its per-channel
    (N, C, 1, 1) gate (the ALU multiplies ACC entries, which broadcast over pixels only)"""
    a, b, out = static_shape(m["lhs"]), static_shape(m["rhs"]), static_shape(m["core"])
    if a is None or b is None or out is None or len(out) != 4:
        return False
    gate = (out[0], out[1], 1, 1)
    return (a == out and b in (out, gate)) or (b == out and a == gate)


def lut_composes_on_alu(m: dict) -> bool:
    """table lookup: VTA's ALU has no lookup (MIN, MAX, ADD, SHR, MUL only)

    Sigmoid, SiLU, Tanh, HardSwish, PRelu stay on the CPU; a table two lines, a MAX and the clip
    reproduce on all 256 codes (a LeakyReLU; a HardSigmoid whose saturation is the clip) runs
    on the ALU (:func:`tvm_vta_cp.alu_activation.fit_leaky`)."""
    from tvm_vta_cp.alu_activation import fit_leaky

    t = const_value(m["table"])
    out = str(m["core"].ty.dtype)
    return t.size == 256 and fit_leaky(t, dtype_of(m["data"]), out) is not None


_COMMON = [input_is_8bit, output_is_8bit, static_shapes, weights_fit_int8, zero_point_fits_int8,
           bias_fits_int32, requant_fits_alu]


def pattern_table() -> list[OffloadPattern]:
    """VTA's pattern table, highest priority first."""
    conv, conv_ann = qlinear_pattern("conv2d")
    dense, dense_ann = qlinear_pattern("matmul")
    add, add_ann = qadd_pattern()
    table = [
        OffloadPattern("vta.qconv2d", "conv2d", conv, conv_ann,
                       [conv_nchw, *_COMMON]),
        OffloadPattern("vta.qdense", "dense", dense, dense_ann, [dense_is_2d, *_COMMON]),
        OffloadPattern("vta.qadd", "add", add, add_ann,
                       [add_operands_8bit, add_same_shape, output_is_8bit, add_recipe_fits_alu]),
        OffloadPattern("vta.qdeconv", "conv2d_transpose", *qdeconv_pattern(),
                       [deconv_nchw, deconv_no_dilation, deconv_stride_fits, *_COMMON]),
        *[OffloadPattern(f"vta.concat{n}", "concat", *qconcat_pattern(n),
                         [concat_on_channels, concat_inputs_8bit, concat_rescale_fits_alu])
          for n in range(2, 9)],
        OffloadPattern("vta.qmul", "multiply", *qmul_pattern(),
                       [mul_operands_8bit, mul_is_map_by_gate, output_is_8bit,
                        requant_fits_alu]),
        OffloadPattern("vta.alu_activation", "lut", *qlut_pattern(),
                       [input_is_8bit, lut_composes_on_alu]),
    ]
    table += pool_patterns()
    for p in table:  # sub-8-bit activations stay on the CPU
        p.checks.append(activations_are_8bit)
    return table
