"""One instruction stream per offloaded function: the next group's weight LOADs and first input
bands overlap the previous group's tail (DPON/DPBY by buffer across groups), bit-exact, fewer
cycles than back-to-back streams, per-layer cycles from the simulator's instruction ranges."""

import numpy as np
import pytest

from tvm_accel.errors import SimulatorError
from tvm_accel.layers import conv_output_shape
from tvm_dpu import codegen as cg
from tvm_dpu.runtime import execute_program, streams
from tvm_dpu.simulator import simulate, simulate_ranges

from .test_dpu_strategy import _conv, _graph, _run


def _convs(specs, batch=4, hw=28, c0=32, seed=0):
    rng = np.random.default_rng(seed)
    layers, shapes, t, c = [], {"x": (batch, c0, hw, hw)}, "x", c0
    for i, (k, ksz, stride) in enumerate(specs):
        ly = _conv(rng, f"c{i}", t, f"t{i}", c, k, ksz=ksz, stride=stride, pad=ksz // 2,
                   relu=True, shift=10, zx=2 if i == 0 else 0)
        shapes[f"t{i}"] = conv_output_shape(ly, shapes[t])
        layers.append(ly)
        t, c = f"t{i}", k
    return _graph(layers, shapes, ["x"], [t])


SPECS = [(64, 3, 1), (128, 3, 2), (128, 1, 1), (256, 3, 1), (64, 1, 1)]


@pytest.mark.parametrize("fusion", [False, True])
def test_one_stream_is_bit_exact_and_faster_than_back_to_back_streams(cfg, fusion):
    g = _convs(SPECS)
    fk = {} if fusion else {"enabled": False}
    prog, st = _run(g, cfg, {"@fusion": fk})  # bit-exact against reference_execute
    prog_b2b, st_b2b = _run(g, cfg, {"@fusion": {**fk, "overlap": False}})
    assert len(prog.layers) == len(prog_b2b.layers) > 1
    assert [ly.stream for ly in prog.layers] == [0] * len(prog.layers)
    assert all(ly.stream is None for ly in prog_b2b.layers)
    # one END, closing the last group's instructions
    ends = [isinstance(i, cg.End) for ly in prog.layers for i in cg.decode_stream(ly.insns)]
    assert sum(ends) == 1 and ends[-1]
    cyc = sum(s.cycles for _, s in st)
    cyc_b2b = sum(s.cycles for _, s in st_b2b)
    # layer by layer the overlap hides several heads; fused (two chains) the second chain's
    # first band needs the first chain's last rows, so only its weight LOADs overlap
    assert cyc < (1.0 if fusion else 0.9) * cyc_b2b
    # per group: the counters of its own instructions, marginal cycles that sum to the run
    assert [n for n, _ in st] == [ly.name for ly in prog.layers]
    assert all(s.cycles > 0 and s.conv_insns > 0 for _, s in st)
    assert all(s.conv_busy <= s.cycles for _, s in st)  # its CONV work lies in its own window
    assert sum(s.macs for _, s in st) == sum(s.macs for _, s in st_b2b)
    assert sum(s.ddr_read_bytes for _, s in st) == sum(s.ddr_read_bytes for _, s in st_b2b)


def test_next_group_loads_are_issued_during_the_previous_tail(cfg, tmp_path):
    import json

    g = _convs(SPECS[:3])
    prog, _ = _run(g, cfg, {"@fusion": {"enabled": False}})
    whole = b"".join(ly.insns for ly in prog.layers)
    n0 = prog.layers[0].n_insns
    insns = cg.decode_stream(whole)
    layout = cfg.region_layout({r: max(64, v) for r, v in prog.region_sizes.items()})
    ddr = np.zeros(cfg.ddr_bytes(layout), np.uint8)
    ends = list(np.cumsum([ly.n_insns for ly in prog.layers]))
    ends[-1] -= 1
    trace = tmp_path / "t.json"
    total, per = simulate_ranges(cfg, whole, ddr.copy(), ends, trace_path=str(trace),
                                 regions=layout)
    ev = {e["args"]["insn"]: e for e in json.loads(trace.read_text())["traceEvents"]
          if e.get("ph") == "X"}
    # the list scheduler may issue the next layer's LOADs inside the previous layer's range:
    # find them by what they read (layer 1's weights follow layer 0's, its input is in SWAP)
    assert n0 > 0
    last_conv0 = max(k for k, i in enumerate(insns)
                     if isinstance(i, cg.Conv) and i.oc == SPECS[0][0])
    pm = [k for k, i in enumerate(insns) if isinstance(i, cg.Load) and i.to_pm]
    band = [k for k, i in enumerate(insns) if isinstance(i, cg.Load) and not i.to_pm
            and i.region == cg.REGION_SWAP]
    loads1 = [pm[1], band[0]]  # weights, first band
    conv_end = ev[last_conv0]["ts"] + ev[last_conv0]["dur"]
    assert all(ev[k]["ts"] < conv_end for k in loads1)
    # the merged stream runs as one program; the ranges split it per layer
    assert sum(s.cycles for s in per) == total.cycles == simulate(cfg, whole, ddr,
                                                                  regions=layout).cycles
    assert sum(s.load_insns for s in per) == total.load_insns


@pytest.mark.parametrize("ends", [[], [0, 5], [3, 3], [2, 10**6], [1]])
def test_simulator_rejects_malformed_ranges(cfg, ends):
    g = _convs(SPECS[:2], hw=16)
    prog, _ = _run(g, cfg, {"@fusion": {"enabled": False}})
    whole = b"".join(ly.insns for ly in prog.layers)
    layout = cfg.region_layout({r: max(64, v) for r, v in prog.region_sizes.items()})
    with pytest.raises(SimulatorError):
        simulate_ranges(cfg, whole, np.zeros(cfg.ddr_bytes(layout), np.uint8), ends,
                        regions=layout)


def test_blob_keeps_the_stream_and_rejects_split_streams(cfg):
    import json

    from tvm_accel.blob import Blob, pack_blob, unpack_blob
    from tvm_accel.errors import BlobError

    g = _convs(SPECS[:3], hw=16)
    prog, st = _run(g, cfg, {"@fusion": {"enabled": False}})
    blob = cg.build_blob(prog, cfg, "f")
    back, _, _ = cg.load_blob(blob)
    assert [ly.stream for ly in back.layers] == [0, 0, 0]
    assert [len(r) for r in streams(back.layers)] == [3]
    rng = np.random.default_rng(0)
    feed = {"x": rng.integers(-128, 128, size=g.tensors["x"].shape).astype(np.int8)}
    out, st2 = execute_program(back, feed, cfg)
    out_ref, _ = execute_program(prog, feed, cfg)
    np.testing.assert_array_equal(out["t2"], out_ref["t2"])
    assert [s.cycles for _, s in st2] == [s.cycles for _, s in st]
    b = unpack_blob(blob)
    meta = json.loads(b.sections["META"])
    meta["layers"][1]["stream"] = 7  # layers of stream 0 no longer consecutive
    b.sections["META"] = json.dumps(meta).encode()
    with pytest.raises(BlobError, match="consecutive"):
        cg.load_blob(pack_blob(Blob(b.target, b.fingerprint, b.sections)))
