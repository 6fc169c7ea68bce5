"""The merged stream's scheduler: list scheduling of the units' queues on the cycle model,
FM memory permutations / shifts when placing the next group, per-pixel DDR footprints of
channel slices, weight chunks for load-bound layers; every reordered stream stays bit-exact."""

import numpy as np

from tvm_accel.layers import reference_execute
from tvm_dpu import codegen as cg
from tvm_dpu.runtime import execute_program
from tvm_dpu.strategy import plan
from tvm_dpu.strategy.knobs import knob_space
from tvm_dpu.strategy.list_schedule import insn_cycles, list_schedule, reorder
from tvm_dpu.strategy.merge import _footprint, _Footprints, _shift
from tvm_dpu.strategy.tiling import _param_bytes, _pm_bytes

from .test_dpu_strategy import _conv, _graph, _single


def _load(rows=2, to_pm=False):
    return cg.Load(to_pm=to_pm, rows=rows, cols=28, chans=64, ddr_pix_stride=64,
                   ddr_row_stride=28 * 64, fm_pix_stride=64, fm_row_stride=28 * 64)


def _check_order(items, order, groups, sides):
    """Every dependency points backwards and every queue keeps its order."""
    merged, where = reorder(items, order)
    assert sorted(order) == list(range(len(items)))
    assert all(d < k for k, (_, deps) in enumerate(merged) for d in deps)
    for i, (a, _) in enumerate(items):
        for j in range(i + 1, len(items)):
            b = items[j][0]
            same = (groups[i], sides[i], cg.unit_of(a)) == (groups[j], sides[j], cg.unit_of(b))
            if same and getattr(a, "to_pm", False) == getattr(b, "to_pm", False):
                assert where[i] < where[j]
    return merged


def test_insn_cycles_follow_the_simulator_cycle_model(cfg):
    ld = _load(rows=8)
    assert insn_cycles(ld, cfg) == cfg.LOAD_LATENCY_CYCLES + -(-8 * 28 * 64 * cfg.NUM_PE
                                                             // int(cfg.DDR_BYTES_PER_CYCLE))
    conv = cg.Conv(out_h=9, out_w=10, oc=20, ic=40, kernel_h=3, kernel_w=3)
    assert insn_cycles(conv, cfg) == cfg.CONV_LATENCY_CYCLES + 2 * 10 * 2 * 3 * 9
    pool = cg.Pool(out_h=3, out_w=5, chans=17, kernel_h=3, kernel_w=2)
    assert insn_cycles(pool, cfg) == cfg.MISC_LATENCY_CYCLES + 2 * 5 * 2 * 6


def test_a_conv_stream_runs_beside_the_pool_stream_of_a_parallel_pair(cfg):
    # side 0: LOAD -> long MAXPOOL -> CONV on its result; side 1: LOAD -> CONV
    pool_side = [(_load(), []), (cg.Pool(out_h=8, out_w=28, chans=256, kernel_h=3, kernel_w=3),
                                 [0]),
                 (cg.Conv(out_h=8, out_w=28, oc=64, ic=256), [1])]
    conv_side = [(_load(), []), (cg.Conv(out_h=8, out_w=28, oc=64, ic=64), [0])]
    items = pool_side + [(i, [d + len(pool_side) for d in deps]) for i, deps in conv_side]
    groups, sides = [0] * len(items), [0, 0, 0, 1, 1]
    order = list_schedule(items, groups, cfg, sides)
    _check_order(items, order, groups, sides)
    convs = [i for i in order if isinstance(items[i][0], cg.Conv)]
    assert convs == [4, 2]  # the independent CONV does not queue behind the pool's


def test_a_younger_group_only_fills_gaps_of_the_older_one(cfg):
    # group 0: LOAD, a long CONV, a LOAD waiting for it; group 1: a short and a long LOAD
    long_conv = cg.Conv(out_h=8, out_w=28, oc=64, ic=64, kernel_h=3, kernel_w=3)
    items = [(_load(), []), (long_conv, [0]), (_load(), [1]),
             (_load(rows=1), []), (_load(rows=200, to_pm=True), [])]
    groups, sides = [0, 0, 0, 1, 1], [0] * 5
    assert insn_cycles(items[4][0], cfg) > insn_cycles(long_conv, cfg)
    order = list_schedule(items, groups, cfg, sides, window=1)
    _check_order(items, order, groups, sides)
    loads = [i for i in order if isinstance(items[i][0], cg.Load)]
    assert loads == [0, 3, 2, 4]  # the short one in the gap, the long one after


def test_moving_a_stream_to_other_fm_memories_and_pm_offsets_computes_the_same(cfg):
    g = _single(c=32, k=48, hw=24, batch=4)
    rng = np.random.default_rng(3)
    feed = {"x": rng.integers(-128, 128, size=(4, 32, 24, 24)).astype(np.int8)}
    prog = plan(g, cfg, {"@fusion": {"enabled": False}})
    insns = cg.decode_stream(prog.layers[0].insns)

    def used() -> set[int]:
        return {i.fm_mem for i in insns if isinstance(i, cg.Save)
                or isinstance(i, cg.Load) and not i.to_pm}
    before, mems = used(), (2, 0, 1)
    for insn in insns:
        _shift(insn, 3 * cfg.fm_memory_bytes // 8, 5 * cfg.PM_BYTES // 8, cfg, mems)
    assert used() == {mems[m] for m in before} != before
    prog.layers[0].insns = cg.encode_stream(insns)
    out, _ = execute_program(prog, feed, cfg)
    np.testing.assert_array_equal(out["y"], reference_execute(g, feed)["y"])


def test_channel_slices_of_a_tensor_do_not_wait_for_each_other(cfg):
    def save(ch0):  # 64 of 128 channels of 2 x 4 pixels
        return cg.Save(region=cg.REGION_SWAP, ddr_offset=ch0, rows=2, cols=4, chans=64,
                       ddr_pix_stride=128, ddr_row_stride=4 * 128, img_stride=8 * 128)
    fp = _Footprints(cfg.NUM_PE * 8 * 128)

    def access(insn, idx=None):
        ((_, lo, hi, write),) = [f for f in _footprint(insn, cfg) if f[0][0] == "DDR"]
        deps = fp.conflicts(lo, hi, write)
        if idx is not None:
            fp.record(lo, hi, write, cg.unit_of(insn), idx)
        return deps
    assert access(save(0), 0) == []
    assert access(save(64), 1) == []  # the other slice: no false dependency
    whole = cg.Load(region=cg.REGION_SWAP, rows=2, cols=4, chans=128, ddr_pix_stride=128,
                    ddr_row_stride=4 * 128, img_stride=8 * 128)
    one = cg.Load(region=cg.REGION_SWAP, ddr_offset=64, rows=1, cols=4, chans=64,
                  ddr_pix_stride=128, ddr_row_stride=4 * 128, img_stride=8 * 128)
    assert access(whole) == [0, 1] and access(one) == [1]


def test_load_bound_weights_come_in_half_pm_chunks(cfg):
    rng = np.random.default_rng(0)
    dense = _conv(rng, "fc", "x", "y", 1024, 1000, ksz=1, pad=0)
    c, k = 1024, 1000
    assert cfg.PM_BYTES // 2 < _pm_bytes(_param_bytes(dense, k, c)) <= cfg.PM_BYTES
    kt = knob_space(dense, (4, c, 1, 1), cfg).default()["oc_tile"]
    assert kt < k and _pm_bytes(_param_bytes(dense, kt, c)) <= cfg.PM_BYTES // 2
    # the same weights convolving a large map (not load-bound) stay whole
    wide = _conv(rng, "wide", "x", "y", 1024, 768, ksz=1, pad=0)
    assert _pm_bytes(_param_bytes(wide, 768, c)) > cfg.PM_BYTES // 2
    assert knob_space(wide, (4, c, 28, 28), cfg).default()["oc_tile"] == 768


def test_dense_layer_in_chunks_is_bit_exact(cfg):
    rng = np.random.default_rng(5)
    a = _conv(rng, "a", "x", "t", 64, 1024, ksz=1, pad=0, shift=9, relu=True)
    fc = _conv(rng, "fc", "t", "y", 1024, 1000, ksz=1, pad=0, shift=12)
    g = _graph([a, fc], {"x": (4, 64, 1, 1), "t": (4, 1024, 1, 1), "y": (4, 1000, 1, 1)},
               ["x"], ["y"])
    feed = {"x": rng.integers(-128, 128, size=(4, 64, 1, 1)).astype(np.int8)}
    prog = plan(g, cfg, {"@fusion": {"enabled": False}})
    pm = [i for ly in prog.layers for i in cg.decode_stream(ly.insns)
          if isinstance(i, cg.Load) and i.to_pm]
    assert len(pm) >= 3  # a's weights and fc's in chunks
    out, _ = execute_program(prog, feed, cfg)
    np.testing.assert_array_equal(out["y"], reference_execute(g, feed)["y"])


def test_a_dilated_conv_reads_its_whole_dilated_window(cfg):
    """The merged stream orders instructions by the FM bytes they touch: a 3x3 CONV with
    dilation 6 on 8 output rows reads (8 - 1) + 2 * 6 + 1 = 20 input rows, not 10."""
    conv = cg.Conv(in_pix_stride=16, in_row_stride=16 * 20, ic=16, out_mem=1, out_pix_stride=16,
                   out_row_stride=16 * 8, out_h=8, out_w=8, oc=16, kernel_h=3, kernel_w=3,
                   dilation=6)
    ((_, lo, hi, _),) = [f for f in _footprint(conv, cfg) if f[0] == ("FM", 0)]
    assert (lo, hi) == (0, 19 * 16 * 20 + 19 * 16 + 16)
