"""Random small graphs of conv / depthwise / dilated / 1x1 / concat / add / pool / resize
branches, quantized with each target's scheme and compiled for every target, config and
strategy: each one compiles, runs bit-exact with the CPU reference, or leaves layers on the CPU
with a reason; none crashes the compile (issue 24, item 1)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import run_vm

from tvm_accel.frontend import load_onnx, random_inputs
from tvm_accel.pipeline import compile_model, compile_reference
from tvm_accel.quantize import ort_quantize
from tvm_accel.target import get_target
from tvm_accel.zoo import INPUT_NAME, Builder

#: target -> (activation type, per-channel weights, power-of-two scales) of its quantizer
SCHEMES = {"vta": ("int8", True, False), "dpu": ("int8", False, True),
           "marsellus": ("uint8", True, False)}
BRANCHES = ("conv", "conv1x1", "depthwise", "dilated", "concat", "add", "pool", "resize")


def random_graph(seed: int):
    """A stem conv, then 2..5 branches, each reading a random earlier tensor."""
    r = random.Random(seed)
    b = Builder(seed)
    cin, hw = r.choice([1, 3, 8, 16]), r.choice([8, 12, 16])
    tensors = [(b.conv(INPUT_NAME, cin, 16, 3, r.choice([1, 2]), 1, name="stem", relu=True), 16)]
    for i in range(r.randint(2, 5)):
        src, c = r.choice(tensors)
        kind = r.choice(BRANCHES)
        if kind in ("conv", "conv1x1"):
            k, co = (3, r.choice([8, 16, 24])) if kind == "conv" else (1, r.choice([8, 16, 32]))
            tensors.append((b.conv(src, c, co, k, 1, k // 2, name=f"c{i}",
                                   relu=r.random() < 0.7), co))
        elif kind == "depthwise":
            tensors.append((b.conv(src, c, c, 3, 1, 1, name=f"dw{i}", relu=True, groups=c), c))
        elif kind == "dilated":
            w = np.random.default_rng(seed + i).normal(0, 0.1, (c, c, 3, 3)).astype(np.float32)
            tensors.append((b.node("Conv", [src, b.init(f"dil{i}.weight", w)], f"dil{i}",
                                   kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]),
                            c))
        elif kind == "concat":
            others = [t for t in tensors if t[0] != src]
            if others:
                o, co = r.choice(others)
                tensors.append((b.concat([src, o], name=f"cat{i}"), c + co))
        elif kind == "add":
            same = [t for t, tc in tensors if tc == c and t != src]
            if same:
                tensors.append((b.add(src, same[0], name=f"add{i}"), c))
        elif kind == "pool":
            tensors.append((b.pool(src, r.choice(["max", "avg"]), 3, 1, 1, name=f"pool{i}"), c))
        else:
            up = b.upsample(src, 2, name=f"up{i}")
            tensors.append((b.pool(up, "max", 2, 2, 0, name=f"down{i}"), c))
    return b.model(f"random{seed}", INPUT_NAME, (r.choice([1, 2]), cin, hw, hw),
                   [tensors[-1][0]])


def _variants(kind: str, every: bool) -> list[tuple[str | None, dict | None]]:
    """(config, knobs) to compile with: the default, and with ``every`` each bundled config and
    each choice of the target's ``strategy`` option."""
    target = get_target(kind)
    out: list[tuple[str | None, dict | None]] = [(None, None)]
    if not every:
        return out
    for opt in target.options():
        if opt.name == "strategy" and opt.choices:
            out += [(None, target.knobs_from_options({"strategy": s})) for s in opt.choices]
    if kind == "vta":
        out.append(("vta_8x8x8", None))
    return out


def _check(seed: int, kind: str, every: bool) -> None:
    act, per_channel, pow2 = SCHEMES[kind]
    model = ort_quantize(random_graph(seed), act, per_channel, power_of_two=pow2)
    mod, info = load_onnx(model)
    x = list(random_inputs(info, seed=seed).values())
    target = get_target(kind)
    ref = run_vm(compile_reference(mod, target), x)
    for config, knobs in _variants(kind, every):
        ex, report = compile_model(mod, target, config, knobs)
        for a, b in zip(run_vm(ex, x), ref, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=f"seed {seed} {config} {knobs}")
        assert all(r.reason for r in report.offloads if r.placement == "cpu")


@pytest.mark.parametrize("kind", sorted(SCHEMES))
@pytest.mark.parametrize("seed", [0, 9])
def test_random_graphs_compile_bit_exact_or_fall_back(seed, kind):
    _check(seed, kind, every=False)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(SCHEMES))
@pytest.mark.parametrize("seed", range(1, 9))
def test_random_graphs_on_every_config_and_strategy(seed, kind):
    _check(seed, kind, every=True)
