"""Whole networks on MARSELLUS, bit-exact: CIFAR ResNet-20 (8-bit) and a small MobileNet-like
net (depthwise-separable blocks, built with onnx.helper through the zoo's builder)."""

import onnx

from helpers import models
from tvm_accel import quantize, zoo


def mobilenet_like(seed: int = 0) -> onnx.ModelProto:
    """3x32x32: conv3x3/2 32, three depthwise-separable blocks (dw3x3 + pw1x1, one strided),
    a pointwise residual, GAP, FC 10."""
    b = zoo.Builder(seed)
    x = "input"
    y = b.conv(x, 3, 32, 3, stride=2, name="stem", relu=True)
    cin = 32
    for i, (c, s) in enumerate(((64, 1), (96, 2), (96, 1))):
        d = b.conv(y, cin, cin, 3, stride=s, name=f"dw{i}", relu=True, groups=cin)
        p = b.conv(d, cin, c, 1, name=f"pw{i}", relu=True)
        y = b.relu(b.add(p, y), f"res{i}_relu") if (c, s) == (cin, 1) else p
        cin = c
    y = b.node("GlobalAveragePool", [y], "gap")
    y = b.node("Flatten", [y], "flatten", axis=1)
    y = b.gemm(y, cin, 10, "fc")
    return b.model("mobilenet_like", x, (1, 3, 32, 32), [y])


def test_resnet20_8bit_is_bit_exact(compare):
    r = compare(models.quantized("resnet20"))
    eng = r.engines()
    # every 3x3 / 1x1 conv but the 3-channel stem, which the cores run ~2x faster and, the
    # RBE's power being mostly time-proportional (Fig. 15), for less energy; the residual adds
    # on the RBE (1x1 BinConvs over the stacked operands: the blocks stay in bit planes)
    convs = {n: e for n, e in eng.items() if not n.endswith(".add")}
    assert sum(e == "rbe" for e in convs.values()) == 20 and eng["conv1"] == "cluster"
    assert {e for n, e in eng.items() if n.endswith(".add")} == {"rbe"}
    assert eng["avgpool"] == "cluster" and eng["fc"] == "cluster"
    r.assert_bit_exact()


def test_mobilenet_like_is_bit_exact(compare):
    r = compare(quantize.ort_quantize(mobilenet_like()))
    eng = r.engines()
    assert {eng[f"dw{i}"] for i in range(3)} == {"cluster"}
    assert {eng[f"pw{i}"] for i in range(3)} == {"rbe"}
    r.assert_bit_exact()


def test_mixed_precision_resnet20_runs_every_conv_but_the_stem_on_the_rbe_bit_exact(compare):
    # HAWQ-style: weights 2/3/4/6/8 bits, activations 4/8 bits (int4/uint4 and clipped QDQ)
    r = compare(quantize.resnet20_mixed())
    eng = r.engines()
    # all but the 3-channel stem (faster and cheaper on the cores, as at 8 bits)
    assert sum(e == "rbe" for n, e in eng.items() if not n.endswith(".add")) == 20
    cpu = [o.layer for o in r.report.offloads
           if o.placement == "cpu" and o.op not in ("quantize", "dequantize")]
    assert cpu == ["flatten"]
    r.assert_bit_exact()


def test_mixed_precision_mobilenet_tiny_is_bit_exact(compare):
    r = compare(quantize.mobilenet_tiny_mixed())
    assert "cluster" in r.engines().values()
    r.assert_bit_exact()


def test_4bit_resnet18_at_224_runs_through_l3_bit_exact(compare):
    """ImageNet ResNet-18 (HAWQ-V3 W4A4, the paper's RBE 4x4b network): its tensors and
    weights exceed L2, so they live in L3 and stream through L2; every conv, add and pool is
    offloaded and the result is bit-exact."""
    r = compare(quantize.resnet18_mixed())
    r.assert_bit_exact()
    placed = {o.op: o.placement for o in r.report.offloads}
    assert all(o.placement == "marsellus" for o in r.report.offloads
               if o.op in ("conv2d", "add", "max_pool2d", "dense")), placed
    from tvm_marsellus.program import load_blob

    body = load_blob(max(r.report.functions, key=lambda f: len(f.layers)).blob)[0]
    assert body.l3_bytes > 0 and any(t.mem == "L3" for t in body.tensors.values())
