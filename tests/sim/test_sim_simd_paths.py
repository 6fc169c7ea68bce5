"""The simulators' host-SIMD functional cores (AVX2 and AVX-512 VNNI, picked at run time) and
their portable C kernels give the same memory contents, cycles and counters.

``ACCELSIM_SIMD=c`` (or ``avx2``) caps the kernels the library picks (``sim/common/simd.h``);
each case runs at every level and compares. On a host without AVX2 every level runs the portable
kernels and the comparisons still check the results against the references.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from helpers.models import quantized
from tvm_marsellus import codegen as cg
from tvm_marsellus import layout
from tvm_marsellus.hw_config import load_config
from tvm_marsellus.simulator import simulate

#: ACCELSIM_SIMD values; "" lets the library pick the best the CPU has
LEVELS = ("c", "avx2", "")
MARS = load_config()


def at_levels(monkeypatch, run):
    """``run()`` once per SIMD level."""
    out = []
    for level in LEVELS:
        monkeypatch.setenv("ACCELSIM_SIMD", level)
        out.append(run())
    return out


def rbe_case(rng, wb: int, ib: int, corner: int, ko: int = 40):
    """One RBE job (3x3, odd Kin so a pair is half padding, by default Kout past one 32-lane
    group, padded taps with a non-zero pad value) and its numpy reference; ``corner`` picks
    NormQuant extremes: kappa 0 / 65535, lambda at +-2^24, shift 0 / 31, ReLU, signed and
    unsigned outputs, offset-binary and unsigned weights."""
    ki, h, w_, ob = 33, 4, 5, 8
    w_unsigned = corner % 2
    x = rng.integers(0, 1 << ib, (h, w_, ki))
    lo, hi = (0, 1 << wb) if w_unsigned else (-(1 << (wb - 1)), 1 << (wb - 1))
    w = rng.integers(lo, hi, (ko, ki, 3, 3))
    kappa = rng.choice([0, 1, 65535], ko) if corner >= 2 else rng.integers(0, 1 << 16, ko)
    lam = rng.choice([-(1 << 24), 0, (1 << 24) - 1], ko)
    shift = (0, 31, 12, 20)[corner]
    relu, out_signed = corner in (1, 3), corner != 2
    padv = (1 << ib) - 1 if corner % 2 else 1
    pads = (1, 1, 1, 1)
    xp = np.full((h + 2, w_ + 2, ki), padv, np.int64)
    xp[1:1 + h, 1:1 + w_] = x
    acc = np.zeros((h, w_, ko), np.int64)
    for ky, kx in itertools.product(range(3), range(3)):
        acc += xp[ky:ky + h, kx:kx + w_] @ w[:, :, ky, kx].T.astype(np.int64)
    ref = cg.normquant(acc, kappa, lam, shift, ob, out_signed, relu)
    l1 = np.zeros(MARS.L1_BYTES, np.uint8)
    top = 0

    def put(data) -> int:
        nonlocal top
        data = np.asarray(data, np.uint8).reshape(-1)
        addr = top
        l1[addr:addr + data.size] = data
        top = (addr + data.size + 3) // 4 * 4
        return addr

    job = cg.RbeJob(x_ptr=put(layout.pack_activations(x, ib)),
                    w_ptr=put(layout.pack_weights(w, wb, signed=not w_unsigned)),
                    nq_ptr=put(layout.pack_normquant(kappa, lam)),
                    y_ptr=put(np.zeros(layout.activation_bytes(h, w_, ko, ob), np.uint8)),
                    h_in=h, w_in=w_, h_out=h, w_out=w_, k_in=ki, k_out=ko, in_bits=ib,
                    w_bits=wb, out_bits=ob, kernel=3, stride=1, relu=int(relu),
                    out_signed=int(out_signed), w_unsigned=w_unsigned, shift=shift,
                    pad_value=padv, pad_top=pads[0], pad_bottom=pads[1], pad_left=pads[2],
                    pad_right=pads[3])
    return job, l1, ref, (h, w_, ko, ob, out_signed)


def test_rbe_integer_convolution_equals_binconv_at_every_w_i_and_normquant_corner(monkeypatch):
    """Every weight and input precision 2..8 and the NormQuant corners: each SIMD level gives
    the numpy BinConv reference (sum over bit planes = the integer convolution) and the same
    statistics."""
    rng = np.random.default_rng(0)
    for wb, ib in itertools.product(range(2, 9), range(2, 9)):
        corner = (wb + ib) % 4
        job, l1, ref, (h, w_, ko, ob, signed) = rbe_case(rng, wb, ib, corner)
        stream = cg.encode_stream([job])

        def run(job=job, l1=l1, stream=stream, h=h, w_=w_, ko=ko, ob=ob, signed=signed):
            mem = l1.copy()
            st = simulate(MARS, stream, l1=mem)
            y = layout.unpack_activations(mem[job.y_ptr:], h, w_, ko, ob, signed=signed)
            return y, st

        results = at_levels(monkeypatch, run)
        for y, st in results:
            assert np.array_equal(y, ref), f"W={wb} I={ib} corner {corner}"
            assert st == results[0][1]


@pytest.mark.parametrize("ko", [16, 20, 40])
def test_rbe_weights_rewritten_between_jobs_and_runs_are_read_again(monkeypatch, ko):
    """The simulator keeps unpacked RBE weights between jobs and runs (mars_rbe_cache.c): a job
    whose weight bytes a DMA overwrote since the last job of the same geometry and address, and a
    run on other weight bytes at that address, read the new weights at every SIMD level (Kout 16,
    20 and 40 leave 2, 3 and 4 + 1 live 8-lane vectors in the AVX2 kernel)."""
    rng = np.random.default_rng(ko)
    job, l1, ref, (h, w_, _, ob, signed) = rbe_case(rng, 8, 6, 1, ko)
    job2, l1b, ref2, _ = rbe_case(rng, 8, 6, 1, ko)
    assert (job2.w_ptr, job2.y_ptr) == (job.w_ptr, job.y_ptr)
    y_bytes = layout.activation_bytes(h, w_, ko, ob)
    saved = job.y_ptr  # L2 offset of the first job's outputs, past the second job's inputs
    stream = cg.encode_stream([
        cg.RbeJob(**{**vars(job), "signal": (0,)}),
        cg.Dma(src_mem="L1", dst_mem="L2", src=job.y_ptr, dst=saved, length=y_bytes, wait=(0,),
               signal=(1,)),
        cg.Dma(src_mem="L2", dst_mem="L1", src=0, dst=0, length=job.y_ptr, wait=(1,),
               signal=(2,)),
        cg.RbeJob(**{**vars(job2), "wait": (2,)})])

    def outputs(mem):
        return layout.unpack_activations(mem, h, w_, ko, ob, signed=signed)

    def run():
        mem, l2 = l1.copy(), np.zeros(MARS.L2_BYTES, np.uint8)
        l2[:job.y_ptr] = l1b[:job.y_ptr]
        st = simulate(MARS, stream, l1=mem, l2=l2)
        other = l1b.copy()
        simulate(MARS, cg.encode_stream([job2]), l1=other)
        again = l1.copy()
        simulate(MARS, cg.encode_stream([job]), l1=again)
        return [outputs(l2[saved:]), outputs(mem[job.y_ptr:]), outputs(other[job.y_ptr:]),
                outputs(again[job.y_ptr:])], st

    results = at_levels(monkeypatch, run)
    for ys, st in results:
        for y, want in zip(ys, (ref, ref2, ref2, ref), strict=True):
            np.testing.assert_array_equal(y, want)
        assert st == results[0][1]


#: (target, config, model, quantization) whose offloaded layers take every SIMD kernel: VTA's
#: GEMM, the DPU's dense CONV with an odd segment (3 input channels) and a dilated one, the RBE
NETWORKS = [
    ("vta", "vta_1x16x16", "tiny_cnn", {"per_channel": True}),
    ("vta", "vta_8x8x8", "conv_residual", {"per_channel": True}),
    ("dpu", None, "tiny_cnn", {"power_of_two": True}),
    ("dpu", None, "single_dilated_conv", {"power_of_two": True}),
    ("marsellus", None, "tiny_cnn", {"activation_type": "uint8", "per_channel": True}),
]


@pytest.mark.parametrize("target,config,model,scheme", NETWORKS,
                         ids=[f"{t}-{c or 'default'}-{m}" for t, c, m, _ in NETWORKS])
def test_networks_give_the_same_outputs_and_cycles_at_every_simd_level(
        monkeypatch, compare_on, target, config, model, scheme):
    from conftest import run_vm

    from tvm_accel.profiler import profiling

    compared = compare_on(target)(quantized(model, **scheme), config=config)
    assert compared.offloaded

    def run():
        with profiling() as prof:
            out = run_vm(compared.ex, compared.inputs)
        return out, [(r.layer, r.cycles) for r in prof.records]

    results = at_levels(monkeypatch, run)
    assert results[0][1], "the profiler recorded no offloaded layer"
    for out, cycles in results:
        for a, b in zip(out, compared.ref_outputs, strict=True):
            np.testing.assert_array_equal(a, b)
        assert cycles == results[0][1]
