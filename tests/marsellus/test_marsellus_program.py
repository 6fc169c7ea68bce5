"""MARSELLUS program container: blob round trip, corrupt blobs, memory-map checks."""

import pytest

from tvm_accel.blob import Blob, pack_blob, unpack_blob
from tvm_accel.errors import BlobError
from tvm_marsellus import codegen as cg
from tvm_marsellus import program
from tvm_marsellus.hw_config import MarsellusConfig, load_config


def _program():
    cmds = [cg.Dma(src_mem="L2", dst_mem="L1", length=64, signal=(0,)),
            cg.RbeJob(wait=(0,), signal=(1,)),
            cg.Dma(src_mem="L1", dst_mem="L2", length=64, dst=1024, wait=(1,))]
    return program.MarsProgram(
        layers=[program.LayerProgram("conv1", "conv2d", "rbe", cmds[:2], macs=9216),
                program.LayerProgram("store", "copy", "rbe", cmds[2:])],
        tensors={"x": program.TensorPlacement("x", (4, 4, 32), "L2", 0, "rbe", 4, False),
                 "y": program.TensorPlacement("y", (1, 64), "L2", 1024, "hwc", 8, True)},
        inputs=["x"], outputs=["y"], l2_image=b"\1" * 100, l2_bytes=4096)


def test_blob_round_trip_keeps_layers_map_and_images():
    cfg = load_config()
    data = program.build_blob(_program(), cfg, "net")
    prog, cfg2, name = program.load_blob(data, expect_config=cfg)
    assert name == "net" and cfg2 == cfg
    assert [ly.name for ly in prog.layers] == ["conv1", "store"]
    assert prog.layers[0].commands == _program().layers[0].commands
    assert prog.layers[0].macs == 9216
    assert prog.tensors == _program().tensors
    assert prog.l2_image == b"\1" * 100 and prog.stream() == _program().stream()


def test_corrupt_truncated_or_foreign_blobs_are_rejected():
    cfg = load_config()
    data = program.build_blob(_program(), cfg, "net")
    with pytest.raises(BlobError, match="checksum"):
        program.load_blob(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(BlobError, match="truncated|checksum"):
        program.load_blob(data[: len(data) // 2])
    with pytest.raises(BlobError, match="truncated"):
        program.load_blob(data[:10])
    other = MarsellusConfig(**{**cfg.to_json(), "L1_BYTES": 65536})
    with pytest.raises(BlobError, match="another hardware config"):
        program.load_blob(data, expect_config=other)
    b = unpack_blob(data)
    with pytest.raises(BlobError, match="not 'marsellus'"):
        program.load_blob(pack_blob(Blob("dpu", b.fingerprint, b.sections)))
    bad = dict(b.sections, CMDS=b.sections["CMDS"][:-64])
    with pytest.raises(BlobError, match="exactly one END"):
        program.load_blob(pack_blob(Blob("marsellus", b.fingerprint, bad)))
    bad = dict(b.sections, CMDS=b"\x09" + b.sections["CMDS"][1:])
    with pytest.raises(BlobError, match="does not decode"):
        program.load_blob(pack_blob(Blob("marsellus", b.fingerprint, bad)))
    bad = dict(b.sections, META=b"{}")
    with pytest.raises(BlobError, match="META section is malformed"):
        program.load_blob(pack_blob(Blob("marsellus", b.fingerprint, bad)))


def test_program_memory_map_is_checked():
    cfg = load_config()
    prog = _program()
    prog.tensors["y"].offset = 4090
    with pytest.raises(BlobError, match="tensor y"):
        program.build_blob(prog, cfg)
    prog = _program()
    prog.l2_bytes = cfg.L2_BYTES + 1
    with pytest.raises(BlobError, match="exceeds L2"):
        program.build_blob(prog, cfg)
