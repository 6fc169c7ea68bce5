"""DPU software pipelining with DPON/DPBY tokens: overlapped units, head / steady state / tail."""

from tvm_dpu import codegen as cg
from tvm_dpu.strategy import plan

from .test_dpu_strategy import _block, _run, _single


def test_software_pipelining_overlaps_units_and_cuts_cycles(cfg):
    g = _block(c=64, hw=32, batch=4)
    off = {"@fusion": {"enabled": False}}
    serial = {**off, **{n: {"pipeline": False} for n in ("conv1", "conv2", "add")}}
    _, st_pipe = _run(g, cfg, off)
    _, st_ser = _run(g, cfg, serial)
    for (name, p), (_, s) in zip(st_pipe, st_ser, strict=True):
        assert p.cycles < s.cycles, name
    total_p = sum(s.cycles for _, s in st_pipe)
    total_s = sum(s.cycles for _, s in st_ser)
    assert total_p < 0.85 * total_s
    conv = dict(st_pipe)["conv1"]
    assert conv.utilization(cfg) > 0.3


def test_pipelined_stream_is_head_steady_tail_with_balanced_tokens(cfg):
    prog = plan(_single(hw=40), cfg, {"conv": {"tile_h": 8}})
    insns = cg.decode_stream(prog.layers[0].insns)
    loads = [i for i in insns if isinstance(i, cg.Load) and not i.to_pm]
    convs = [i for i in insns if isinstance(i, cg.Conv)]
    saves = [i for i in insns if isinstance(i, cg.Save)]
    n = len(convs)
    assert n == 5
    assert [i.dpon for i in loads[:2]] == [frozenset()] * 2  # head: no waits
    assert all(i.dpon == frozenset({"CONV"}) for i in loads[2:])
    assert convs[2].dpon == frozenset({"LOAD", "SAVE"}) and convs[0].dpon == {"LOAD"}
    assert convs[-1].dpby == frozenset({"SAVE"}) and saves[-1].dpby == frozenset()  # tail
    # tokens: pushes == pops per FIFO
    for a in cg.UNITS:
        for b in cg.UNITS:
            if a == b:
                continue
            push = sum(1 for i in insns if not isinstance(i, cg.End)
                       and cg.UNITS[cg.unit_of(i)] == a and b in i.dpby)
            pop = sum(1 for i in insns if not isinstance(i, cg.End)
                      and cg.UNITS[cg.unit_of(i)] == b and a in i.dpon)
            assert push == pop, (a, b)
