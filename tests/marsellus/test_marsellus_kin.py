"""Input-channel (Kin) tiling: a reduction split over L1 chunks accumulates 32-bit partial sums
on the cluster (``CL.CONV`` / ``CL.FC`` with psum_in / psum_out) and applies NormQuant after
the last chunk, bit-exact; the RBE, which cannot carry a partial sum between jobs, is never
given a split reduction."""

from dataclasses import replace

import numpy as np
import pytest

from tvm_accel.errors import MappingError, SimulatorError
from tvm_accel.layers import LayerGraph, reference_execute
from tvm_marsellus import codegen as cg
from tvm_marsellus import layout, strategy
from tvm_marsellus.simulator import simulate

from .test_marsellus_simulator import L1, conv_ref
from .test_marsellus_strategy import CFG, T, check, conv


def _convs(prog) -> list:
    return [c for ly in prog.layers for c in ly.commands
            if isinstance(c, cg.ClusterKernel) and c.kernel in ("CONV", "FC")]


def test_cluster_conv_partial_sums_over_chunks_equal_one_pass():
    """Three CL.CONV chunks (psum_out, both, psum_in + NormQuant) give the one-pass result."""
    rng = np.random.default_rng(1)
    h, ci, co, k, p = 5, 24, 8, 3, 1
    x = rng.integers(-8, 8, (h, h, ci))
    w = rng.integers(-2, 2, (co, ci, k, k))
    kappa, lam = rng.integers(1, 300, co), rng.integers(-500, 500, co)
    ref = cg.normquant(conv_ref(x, w, (p,) * 4, 3, 1, h, h), kappa, lam, 5, 4, True, False)
    m = L1()
    nq, out, psum = m.put(layout.pack_normquant(kappa, lam)), m.alloc(512), m.alloc(h * h * co * 4)
    cmds = []
    for j, c0 in enumerate(range(0, ci, 8)):
        last = c0 + 8 == ci
        cmds.append(cg.ClusterKernel(
            kernel="CONV", in_bits=4, w_bits=2, out_bits=4, shift=5 if last else 0,
            in_addr=m.put(layout.pack_hwc(x[..., c0:c0 + 8], 4)),
            w_addr=m.put(layout.pack_hwc(w[:, c0:c0 + 8].transpose(0, 2, 3, 1), 2)),
            nq_addr=nq if last else 0, out_addr=out, h_in=h, w_in=h, c_in=8, c_out=co,
            h_out=h, w_out=h, kh=k, kw=k, pad_top=p, pad_bottom=p, pad_left=p, pad_right=p,
            pad_value=3, psum_in=int(j > 0), psum_out=int(not last), psum_addr=psum))
    st = simulate(CFG, cg.encode_stream(cmds), l1=m.mem)
    np.testing.assert_array_equal(layout.unpack_hwc(m.mem[out:], (h, h, co), 4, True), ref)
    assert st.cluster_macs == h * h * co * k * k * ci
    # the partial-sum traffic is in the cycle model: a chunk costs more than its MACs alone
    one = simulate(CFG, cg.encode_stream([replace(cmds[1], psum_in=0, psum_out=0,
                                                  psum_addr=0, nq_addr=nq)]), l1=m.mem)
    mid = simulate(CFG, cg.encode_stream([cmds[1]]), l1=m.mem)
    assert mid.cycles > one.cycles - h * h * co * CFG.CL_NQ_CYCLES_PER_OUTPUT / 16


def test_partial_sum_fields_are_checked():
    def err(match, **kw):
        cmd = cg.ClusterKernel(**{"kernel": "CONV", "w_bits": 8, **kw})
        with pytest.raises(SimulatorError, match=match):
            simulate(CFG, cg.encode_stream([cmd]))

    err(r"psum_in/psum_out: only CONV and FC", kernel="DWCONV", psum_out=1, psum_addr=64)
    err(r"psum_addr: 0x40 set without", psum_addr=64)
    err(r"psum_addr: 0x42 is not a multiple of 4", psum_in=1, psum_addr=66)
    err(r"partial sums \(psum_addr\) .* exceeds L1", psum_out=1, psum_addr=CFG.L1_BYTES - 4,
        c_out=2)
    raw = bytearray(cg.encode_stream([cg.ClusterKernel(w_bits=8)]))
    raw[11] |= 0x80  # word 2 bit 31
    with pytest.raises(SimulatorError, match="reserved bit 31 of word 2"):
        simulate(CFG, bytes(raw))
    with pytest.raises(cg.DecodeError, match="reserved bits of word 15"):
        cg.decode(cg.encode(cg.ClusterKernel(w_bits=8))[:60] + b"\1\0\0\0")


@pytest.mark.parametrize("bits", [(8, 8, 8), (4, 2, 4)])
def test_forced_kin_tiling_is_bit_exact_after_an_rbe_layer(bits):
    """``tile_c`` splits a 3x3 conv that the RBE could run: it moves to the cluster (the RBE
    cannot carry partial sums) and stays bit-exact behind an RBE layer, at 8 and sub-byte
    precisions; asking for the RBE too is refused with the reason."""
    ib, wb, ob = bits
    rng = np.random.default_rng(2)
    layers = [conv(rng, "c1", "x", "y", 16, 64, 3, wbits=wb, obits=ib),
              conv(rng, "c2", "y", "z", 64, 40, 3, wbits=wb, obits=ob)]
    ts = {"x": T("x", (2, 16, 7, 9)), "y": T("y", (2, 64, 7, 9), ib),
          "z": T("z", (2, 40, 7, 9), ob)}
    prog, stats = check(rng, layers, ts, ["x"], ["z"], {"c2": {"tile_c": 24}})
    c1, c2 = prog.layers
    assert c1.engine == "rbe" and c2.engine == "cluster"
    assert (c2.meta["tile_c"], c2.meta["chunks"]) == (24, 3)
    convs = _convs(prog)
    assert [c.c_in for c in convs[:3]] == [24, 24, 16]
    assert [(c.psum_in, c.psum_out) for c in convs[:3]] == [(0, 1), (1, 1), (1, 0)]
    assert stats.rbe_cmds > 0 and stats.cluster_cmds > 0
    with pytest.raises(MappingError, match="RBE cannot split the input channels"):
        strategy.plan(LayerGraph(ts, layers, ["x"], ["z"]), CFG,
                      {"c2": {"tile_c": 24, "engine": "rbe"}})
    with pytest.raises(MappingError, match="tile_c"):
        strategy.plan(LayerGraph(ts, layers, ["x"], ["z"]), CFG, {"c2": {"tile_c": 20}})


def test_kin_tiling_with_w_tiling_and_an_fc_layer():
    rng = np.random.default_rng(3)
    lay = conv(rng, "c", "x", "y", 64, 24, 3)
    check(rng, [lay], {"x": T("x", (1, 64, 6, 11)), "y": T("y", (1, 24, 6, 11))}, ["x"],
          ["y"], {"c": {"tile_c": 32, "engine": "cluster", "tile_w": 4, "tile_h": 2}})
    fc = conv(rng, "fc", "x", "y", 96, 20, 1, dense=True)
    prog, _ = check(rng, [fc], {"x": T("x", (2, 96)), "y": T("y", (2, 20))}, ["x"], ["y"],
                    {"fc": {"tile_c": 32}})
    assert prog.layers[0].meta["chunks"] == 3 and _convs(prog)[0].kernel == "FC"


# DeepBench layers that need Kin tiling (5x5 over 512 / 832 input channels: the weights of 8
# output channels over all inputs exceed half of L1), at reduced spatial sizes
DEEPBENCH_KIN = {
    "30: 512x14x14 -> 48 5x5": ((1, 512, 6, 6), 48),
    "33: 832x7x7 -> 128 5x5": ((1, 832, 5, 5), 128),
    "37: 2x512x14x14 -> 48 5x5": ((2, 512, 4, 4), 48),
    "40: 2x832x7x7 -> 128 5x5": ((2, 832, 3, 3), 128),
}


@pytest.mark.parametrize("case", list(DEEPBENCH_KIN))
def test_deepbench_layers_needing_kin_tiling_run_bit_exact(case):
    shape, k = DEEPBENCH_KIN[case]
    rng = np.random.default_rng(len(case))
    lay = conv(rng, "c", "x", "y", shape[1], k, 5)
    n, _, h, w = shape
    prog, stats = check(rng, [lay], {"x": T("x", shape), "y": T("y", (n, k, h, w))}, ["x"],
                        ["y"])
    meta = prog.layers[0].meta
    assert prog.layers[0].engine == "cluster" and meta["chunks"] > 1
    assert meta["tile_c"] < shape[1] and stats.cluster_macs == n * h * w * k * 25 * shape[1]
    with pytest.raises(MappingError, match="does not fit L1"):  # the reason it splits
        strategy.plan(LayerGraph({"x": T("x", shape), "y": T("y", (n, k, h, w))}, [lay],
                                 ["x"], ["y"]), CFG, {"c": {"tile_c": shape[1]}})


def test_kin_tiling_through_l3_with_staged_weights():
    """Input in L3 (3-D chunk windows fetched into the bounce slot) and weight groups staged
    from L3 (one L2 slot, freed after the group's last chunk), bit-exact."""
    rng = np.random.default_rng(6)
    small = replace(CFG, L2_BYTES=160 * 1024)
    lay = conv(rng, "c", "x", "y", 256, 32, 5)
    ts = {"x": T("x", (1, 256, 24, 24)), "y": T("y", (1, 32, 24, 24))}
    g = LayerGraph(ts, [lay], ["x"], ["y"])
    xs = {"x": rng.integers(-128, 128, (1, 256, 24, 24)).astype(np.int8)}
    from tvm_marsellus.runtime import execute_program

    prog = strategy.plan(g, small, {"c": {"tile_c": 64}})
    outs, [(_, stats)] = execute_program(prog, xs, small, whole_stream=True)
    np.testing.assert_array_equal(outs["y"], reference_execute(g, xs)["y"])
    assert prog.tensors["x"].mem == "L3" and prog.l3_image and stats.iodma_busy > 0
    assert prog.layers[0].meta["chunks"] == 4


def test_tile_cost_counts_l3_transfers():
    """The tile cost model charges the I/O DMA: with the compute made negligible, the same
    tile costs more with its input in L3, more again with its output and weights there, and
    at least the L3 fetches of every step."""
    rng = np.random.default_rng(7)
    lay = conv(rng, "c", "x", "y", 64, 64, 1)
    ts = {"x": T("x", (1, 64, 28, 28)), "y": T("y", (1, 64, 28, 28))}
    p = strategy.Planner(LayerGraph(ts, [lay], ["x"], ["y"]), CFG)
    p._choose()
    p._layer(lay)
    lt = p.layers["c"]
    th, kt = lt.plan.tile_h, lt.plan.tile_k
    lt.compute_cycles = lambda th, kt: 0.0
    base = lt.cost(th, kt)
    lt.tin.mem = "L3"
    with_in = lt.cost(th, kt)
    lt.w_l3 = True
    lt.tout.mem = "L3"
    everything = lt.cost(th, kt)
    assert base < with_in < everything
    steps = -(-28 // th) * -(-64 // kt)
    assert everything >= steps * lt.buffers(th, kt)["in"] / CFG.L3_BYTES_PER_CYCLE
