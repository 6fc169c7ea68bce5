"""Nearest upsample on MARSELLUS as data movement (``strategy/resize``): ``S x S'`` copies of
the input on the cores, each scattered by DMA_OUT into its output phase; bit-exact against the
integer reference and the CPU graph."""

from dataclasses import replace

import numpy as np
import pytest

from helpers import models
from tvm_accel.layers import ConcatLayer, UpsampleLayer
from tvm_marsellus import codegen as cg

from .test_marsellus_concat import _rescale
from .test_marsellus_phases import _check_cfg
from .test_marsellus_strategy import CFG, T, check, conv


@pytest.mark.parametrize("scale, rescaled, batch", [((2, 2), False, 1), ((3, 2), True, 2),
                                                    ((1, 4), False, 1)])
def test_an_upsample_is_one_scattered_copy_per_phase(scale, rescaled, batch):
    rng = np.random.default_rng(scale[0] * 10 + scale[1])
    a = conv(rng, "a", "x", "f", 16, 24, 3)
    up = UpsampleLayer("up", "f", "y", scale, 3 if rescaled else 0,
                       _rescale(-5) if rescaled else None)
    tensors = {"x": T("x", (batch, 16, 5, 6)), "f": T("f", (batch, 24, 5, 6)),
               "y": T("y", (batch, 24, 5 * scale[0], 6 * scale[1]))}
    prog, _ = check(rng, [a, up], tensors, ["x"], ["y"])
    lp = prog.layers[1]
    assert (lp.name, lp.op, lp.engine) == ("up", "upsample", "cluster")
    assert len(lp.meta["phases"]) == scale[0] * scale[1]
    kernels = [c for c in lp.commands if isinstance(c, cg.ClusterKernel)]
    assert kernels and all(c.kernel == "AVGPOOL" and (c.kh, c.kw) == (1, 1) for c in kernels)


def test_an_upsample_writes_into_its_concat_slice_and_into_l3():
    """A U-Net decoder step: upsample, concat with the skip feature, conv."""
    rng = np.random.default_rng(7)
    e = conv(rng, "e", "x", "f", 16, 16, 3)
    d = conv(rng, "d", "f", "g", 16, 16, 3, s=2)
    up = UpsampleLayer("up", "g", "u", (2, 2))
    cat = ConcatLayer("cat", ("u", "f"), "c", (0, 0), (None, None))
    h = conv(rng, "h", "c", "y", 32, 16, 3)
    tensors = {"x": T("x", (1, 16, 24, 24)), "f": T("f", (1, 16, 24, 24)),
               "g": T("g", (1, 16, 12, 12)), "u": T("u", (1, 16, 24, 24)),
               "c": T("c", (1, 32, 24, 24)), "y": T("y", (1, 16, 24, 24))}
    prog, _ = check(rng, [e, d, up, cat, h], tensors, ["x"], ["y"])
    assert "u" not in prog.tensors and "f" not in prog.tensors
    prog = _check_cfg(rng, [e, d, up, cat, h], tensors, replace(CFG, L2_BYTES=40 * 1024))
    assert any(t.mem == "L3" for t in prog.tensors.values())


@pytest.mark.parametrize("kwargs", [{}, {"scale": 3, "batch": 2,
                                         "coordinate_transformation_mode": "asymmetric",
                                         "nearest_mode": "floor"}])
def test_onnx_nearest_resize_is_offloaded_bit_exact(compare, kwargs):
    r = compare(models.quantized("single_upsample", **kwargs))
    assert {o.layer: o.placement for o in r.report.offloads}["upsample"] == "marsellus"
    r.assert_bit_exact()
