"""The placement report agrees with what lowering did: a layer is reported on the accelerator
exactly when one of the package's blobs was compiled from it, under its own name, on every
target; the blobs' layer tables and the ``--profile`` rows carry the same names."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np
import pytest
import tvm
from tvm import relax

from helpers import models
from tvm_accel import quantize, zoo
from tvm_accel.blob import unpack_blob
from tvm_accel.frontend import load_onnx
from tvm_accel.partition import LAYER_ATTR, explain, partition
from tvm_accel.pipeline import canonicalize_for, compile_model
from tvm_accel.profiler import profiling
from tvm_accel.target import get_target

#: how each target wants its models quantized
QUANT = {"vta": {}, "dpu": {"power_of_two": True}, "marsellus": {"activation_type": "uint8"}}
#: zoo networks at sizes that compile in seconds (the defaults are ImageNet-sized)
SMALL = {"resnet50": {"hw": 32}, "vgg16": {"hw": 32, "width": 0.125},
         "googlenet": {"hw": 32, "width": 0.25}, "yolov3_tiny": {"hw": 64, "width": 0.25},
         "encoder_decoder": {"hw": 16},
         "mobilenet_v2": {"hw": 32, "width": 0.25, "max_repeats": 1, "num_classes": 10},
         "efficientnet_b0": {"hw": 32, "width": 0.25, "max_repeats": 1, "num_classes": 10},
         "squeezenet1_1": {"hw": 32, "width": 0.25, "num_classes": 10},
         "unet": {"hw": 32, "width": 0.125, "levels": 2},
         "deeplab_aspp": {"hw": 32, "width": 0.125, "num_classes": 4},
         "conv_bn_net": {"hw": 16, "width": 0.25}}


def _zoo(name: str, target: str):
    """Zoo network ``name`` at its small size; four images for the DPU (one per PE)."""
    return zoo.MODELS[name](**SMALL.get(name, {}), **({"batch": 4} if target == "dpu" else {}))


def _compile(target: str, model):
    mod, _ = load_onnx(quantize.ort_quantize(model, **QUANT[target]))
    return compile_model(mod, get_target(target))


def _table_layers(report) -> list[str]:
    """The layers named in the blobs' own layer tables (``META``): a fused group ``a+b`` or
    a pair run side by side ``a||b`` names both; a layer realised by memory placement alone
    (the DPU's concat) has no entry."""
    return [part for fn in report.functions
            for ly in unpack_blob(fn.blob).json_section("META")["layers"]
            for part in re.split(r"\+|\|\|", ly["name"])]


def _assert_report_matches_blobs(report, target: str) -> None:
    in_blobs = [layer for fn in report.functions for layer in fn.layers]
    twice = [k for k, n in Counter(in_blobs).items() if n > 1]
    assert in_blobs and not twice, f"layers compiled twice, or under one name: {twice}"
    table = _table_layers(report)
    assert len(table) == len(set(table)) and set(table) <= set(in_blobs), \
        sorted(set(table) - set(in_blobs))
    rows = [r.layer for r in report.offloads]
    assert len(rows) == len(set(rows)), "a layer has two rows"
    on_target = {r.layer for r in report.offloads if r.placement == target}
    assert on_target == set(in_blobs), (sorted(on_target - set(in_blobs)),
                                        sorted(set(in_blobs) - on_target))
    assert {r.placement for r in report.offloads} <= {target, "cpu"}


@pytest.mark.parametrize("target", list(QUANT))
@pytest.mark.parametrize("build", [lambda: zoo.tiny_cnn(batch=4),
                                   lambda: models.conv_flatten_dense(8, 4, 10, batch=4)],
                         ids=["tiny_cnn", "conv_flatten_dense"])
def test_every_reported_placement_matches_the_blobs(target, build):
    _, report = _compile(target, build())
    _assert_report_matches_blobs(report, target)


def test_structurally_equal_layers_stay_separate_functions_named_after_their_layer():
    """ResNet-20's residual adds quantized with power-of-two scales are equal expressions;
    ``FuseOpsByPattern`` would share one composite function between them."""
    t = get_target("dpu")
    mod, _ = load_onnx(quantize.ort_quantize(zoo.resnet20(batch=4), **QUANT["dpu"]))
    parted = partition(canonicalize_for(mod, t), t.pattern_table())
    adds = [str(fn.attrs[LAYER_ATTR]) for fn in _composites(parted)
            if str(fn.attrs["Composite"]) == "dpu.qadd"]
    assert sorted(adds) == sorted(f"layer{s}_{i}_add" for s in (1, 2, 3) for i in range(3))


def _composites(mod: tvm.IRModule) -> list[relax.Function]:
    return [b.value for _, f in mod.functions_items()
            if isinstance(f, relax.Function) and f.attrs is not None and "Codegen" in f.attrs
            for blk in f.body.blocks for b in blk.bindings if isinstance(b.value, relax.Function)]


def test_layers_sharing_a_pattern_keep_their_names_in_blobs_report_and_profile():
    """On the DPU, ResNet-20's equal residual adds used to be lowered under one layer's name
    (``layer1_1_add_1`` for ``layer1.2.add``): the report and ``--profile`` disagreed."""
    ex, report = _compile("dpu", zoo.resnet20(batch=4))
    _assert_report_matches_blobs(report, "dpu")
    assert {"layer1.2.add", "layer2.2.add", "layer3.1.add"} <= set(_table_layers(report))
    x = np.random.default_rng(0).integers(-3, 3, (4, 3, 32, 32)).astype(np.float32)
    with profiling() as prof:
        relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    profiled = [part for r in prof.records for part in re.split(r"\+|\|\|", r.layer)]
    assert sorted(profiled) == sorted(_table_layers(report))


def test_a_blob_layer_the_pattern_walk_does_not_find_still_gets_a_row_on_the_target():
    t = get_target("dpu")
    mod, _ = load_onnx(quantize.ort_quantize(models.single_conv(batch=4), **QUANT["dpu"]))
    canon = canonicalize_for(mod, t)
    rows = explain(canon, t.pattern_table(), "dpu",
                   lowered={"conv": "dpu.qconv2d", "ghost": "dpu.qadd"})
    on_dpu = {r.layer: (r.op, r.shape) for r in rows if r.placement == "dpu"}
    assert on_dpu == {"conv": ("conv2d", "4x16x8x8 -> 4x16x8x8 k3x3 s1 p1"), "ghost": ("add", "?")}


@pytest.mark.slow
@pytest.mark.parametrize("target", list(QUANT))
@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_every_zoo_model_reports_exactly_the_layers_its_blobs_hold(name, target):
    _, report = _compile(target, _zoo(name, target))
    _assert_report_matches_blobs(report, target)


def test_a_dense_after_a_spatial_flatten_is_reported_on_the_dpu():
    """The Flatten of an (N, C, H, W) tensor fails the DPU's flatten-into-dense pattern; the
    plain dense pattern takes the layer, and the report says so (it used to stop at the
    first pattern whose structure matched and report the CPU)."""
    _, report = _compile("dpu", models.conv_flatten_dense(8, 4, 10, batch=4))
    fc = next(r for r in report.offloads if r.layer == "fc")
    assert (fc.placement, fc.reason) == ("dpu", "matched dpu.qdense")
