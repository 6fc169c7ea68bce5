"""The placement report agrees with what lowering did: a layer is reported on the accelerator
exactly when one of the package's blobs holds it (the offloaded functions), on every target."""

from __future__ import annotations

import pytest

from helpers import models
from tvm_accel import quantize, zoo
from tvm_accel.frontend import load_onnx
from tvm_accel.pipeline import compile_model
from tvm_accel.target import get_target

#: how each target wants its models quantized
QUANT = {"vta": {}, "dpu": {"power_of_two": True}, "marsellus": {"activation_type": "uint8"}}


def _report(target: str, model):
    mod, _ = load_onnx(quantize.ort_quantize(model, **QUANT[target]))
    _, report = compile_model(mod, get_target(target))
    return report


@pytest.mark.parametrize("target", list(QUANT))
@pytest.mark.parametrize("build", [lambda: zoo.tiny_cnn(batch=4),
                                   lambda: models.conv_flatten_dense(8, 4, 10, batch=4)],
                         ids=["tiny_cnn", "conv_flatten_dense"])
def test_every_reported_placement_matches_the_blobs(target, build):
    report = _report(target, build())
    in_blobs = {layer for fn in report.functions for layer in fn.layers}
    rows = {r.layer: r.placement for r in report.offloads}
    assert in_blobs and in_blobs <= set(rows)
    for layer, placement in rows.items():
        assert (placement == target) == (layer in in_blobs), (layer, placement)


def test_a_dense_after_a_spatial_flatten_is_reported_on_the_dpu():
    """The Flatten of an (N, C, H, W) tensor fails the DPU's flatten-into-dense pattern; the
    plain dense pattern takes the layer, and the report says so (it used to stop at the
    first pattern whose structure matched and report the CPU)."""
    report = _report("dpu", models.conv_flatten_dense(8, 4, 10, batch=4))
    fc = next(r for r in report.offloads if r.layer == "fc")
    assert (fc.placement, fc.reason) == ("dpu", "matched dpu.qdense")
