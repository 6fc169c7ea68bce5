"""MARSELLUS ISA (binary + assembly round trips, corrupt fields), bit-plane layouts, blob."""

import numpy as np
import pytest

from tvm_accel.blob import Blob, pack_blob, unpack_blob
from tvm_accel.errors import BlobError
from tvm_marsellus import codegen as cg
from tvm_marsellus import layout, program
from tvm_marsellus.hw_config import MarsellusConfig, load_config


def _examples():
    return [
        cg.Dma(wait=(0,), signal=(1, 15), src_mem="L2", dst_mem="L1", src=0x1234, dst=0x40,
               length=96, rows=5, planes=3, src_row_stride=400, src_plane_stride=9000,
               dst_row_stride=96, dst_plane_stride=480),
        cg.Dma(src_mem="L3", dst_mem="L2", src=1 << 20, length=4096),
        cg.RbeJob(wait=(1,), signal=(2,), x_ptr=0x100, w_ptr=0x2000, nq_ptr=0x3002, y_ptr=0x4000,
                  h_in=9, w_in=11, h_out=4, w_out=5, k_in=96, k_out=40, in_bits=3, w_bits=5,
                  out_bits=7, kernel=3, stride=2, relu=1, shift=17, pad_value=2, pad_top=1,
                  pad_left=1, x_row_stride=1024),
        cg.RbeJob(kernel=1, k_in=65536, k_out=1, h_in=65536, w_unsigned=1, out_signed=1),
        cg.ClusterKernel(kernel="CONV", in_bits=4, w_bits=2, out_bits=8, in_addr=0x10,
                         out_addr=0x800, w_addr=0x900, nq_addr=0x1000, h_in=8, w_in=8, c_in=16,
                         c_out=8, h_out=8, w_out=8, kh=3, kw=3, pad_top=1, pad_bottom=1,
                         pad_left=1, pad_right=1, pad_value=-3, shift=9, relu=1),
        cg.ClusterKernel(kernel="ADD", kappa_a=300, kappa_b=65535, lambda_=-(1 << 31), shift=31,
                         in_signed=0, b_signed=1, out_signed=0, pad_value=255),
        cg.ClusterKernel(kernel="AVGPOOL", kappa_a=7, lambda_=5, kh=2, kw=2, sh=2, sw=2),
        cg.ClusterKernel(kernel="RBE2HWC", in_bits=5, out_bits=8),
        cg.Nop(engine="DMA_IN", signal=(3,)),
        cg.End(),
    ]


def test_every_command_round_trips_through_binary_and_assembly():
    for cmd in _examples():
        data = cg.encode(cmd)
        assert len(data) == cg.CMD_BYTES
        assert cg.decode(data) == cmd
        line = cg.format_cmd(cmd)
        assert cg.parse_line(line) == cmd, line
    stream = cg.encode_stream(_examples())
    assert cg.decode_stream(stream) == _examples()
    listing = "\n".join(cg.disassemble(stream))
    assert cg.assemble(listing + "\n; comment\n") == stream


def test_random_field_values_round_trip():
    rng = np.random.default_rng(1)
    for _ in range(200):
        job = cg.RbeJob(**{n: int(rng.integers(1, 1 << 16)) for n in
                           ("h_in", "w_in", "h_out", "w_out", "k_in", "k_out")},
                        x_ptr=int(rng.integers(0, 1 << 32)), in_bits=int(rng.integers(1, 9)),
                        w_bits=int(rng.integers(1, 9)), out_bits=int(rng.integers(1, 9)),
                        kernel=int(rng.choice([1, 3])), stride=int(rng.integers(1, 3)),
                        shift=int(rng.integers(0, 32)), pad_value=int(rng.integers(0, 256)),
                        wait=tuple(int(s) for s in rng.choice(16, 3)))
        assert cg.decode(cg.encode(job)) == job
        assert cg.parse_line(cg.format_cmd(job)) == job


def test_rbe_sizes_use_the_hwpe_value_minus_one_convention():
    data = cg.encode(cg.RbeJob(h_in=5, w_in=7, k_in=64, k_out=32, in_bits=4, w_bits=2,
                               out_bits=8))
    words = [int.from_bytes(data[4 * i:4 * i + 4], "little") for i in range(16)]
    assert words[0] == cg.OP_RBE
    assert words[6] == (6 << 16) | 4
    assert words[8] == (63 << 16) | 31
    assert words[9] & 0xFFFFFF == (7 << 16) | (1 << 8) | 3


@pytest.mark.parametrize("cmd,match", [
    (cg.RbeJob(in_bits=0), "in_bits"),
    (cg.RbeJob(kernel=5), "kernel size"),
    (cg.RbeJob(stride=3), "stride"),
    (cg.RbeJob(h_in=0), "h_in"),
    (cg.RbeJob(shift=32), "shift"),
    (cg.Dma(src_mem="L4"), "not a memory"),
    (cg.Dma(length=-1), "length"),
    (cg.ClusterKernel(kernel="SOFTMAX"), "not a cluster kernel"),
    (cg.ClusterKernel(kernel="CONV", kappa_a=1), "must be 0"),
    (cg.ClusterKernel(in_signed=1, pad_value=200), "pad_value"),
    (cg.Nop(engine="GPU"), "not an engine"),
])
def test_encoder_rejects_fields_that_do_not_fit(cmd, match):
    with pytest.raises(cg.EncodeError, match=match):
        cg.encode(cmd)


def test_semaphores_outside_the_sixteen_are_rejected():
    with pytest.raises(cg.EncodeError, match="semaphore 16"):
        cg.Nop(signal=(16,))


def _corrupt(data: bytes, word: int, value: int) -> bytes:
    b = bytearray(data)
    b[4 * word:4 * word + 4] = value.to_bytes(4, "little")
    return bytes(b)


def test_decoder_rejects_corrupt_fields():
    rbe = cg.encode(cg.RbeJob())
    with pytest.raises(cg.DecodeError, match="unknown opcode 9"):
        cg.decode(_corrupt(rbe, 0, 9))
    with pytest.raises(cg.DecodeError, match="reserved bits of word 15"):
        cg.decode(_corrupt(rbe, 15, 1))
    with pytest.raises(cg.DecodeError, match="reserved bits of word 9"):
        cg.decode(_corrupt(rbe, 9, 1 << 30))
    cl = cg.encode(cg.ClusterKernel())
    with pytest.raises(cg.DecodeError, match="kernel field 0"):
        cg.decode(_corrupt(cl, 2, 0))
    dma = cg.encode(cg.Dma())
    with pytest.raises(cg.DecodeError, match="not a memory"):
        cg.decode(_corrupt(dma, 2, 3))
    with pytest.raises(cg.DecodeError, match="END carries"):
        cg.decode(_corrupt(cg.encode(cg.End()), 1, 1))
    with pytest.raises(cg.DecodeError, match="64 bytes"):
        cg.decode(rbe[:60])


def test_assembly_errors_name_the_problem():
    with pytest.raises(cg.AsmError, match="unknown mnemonic"):
        cg.parse_line("FOO x=1")
    with pytest.raises(cg.AsmError, match="no field"):
        cg.parse_line("RBE wait=- signal=- bogus=1")
    with pytest.raises(cg.AsmError, match="not an integer"):
        cg.parse_line("RBE h_in=abc")
    with pytest.raises(cg.AsmError, match="in_bits"):
        cg.parse_line("RBE in_bits=0")
    assert cg.parse_line("   ; only a comment") is None


# --- layouts -----------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", range(1, 9))
def test_activation_pack_unpack_is_a_bit_exact_inverse(bits):
    rng = np.random.default_rng(bits)
    for k in (32, 64, 96, 45):
        x = rng.integers(0, 1 << bits, (3, 4, k))
        data = layout.pack_activations(x, bits)
        assert data.size == layout.activation_bytes(3, 4, k, bits) == 12 * (-(-k // 32)) * bits * 4
        np.testing.assert_array_equal(layout.unpack_activations(data, 3, 4, k, bits), x)
        xs = x - (1 << (bits - 1))
        np.testing.assert_array_equal(
            layout.unpack_activations(layout.pack_activations(xs, bits), 3, 4, k, bits,
                                      signed=True), xs)


def test_activation_layout_is_h_w_ktile_bit_channel():
    x = np.zeros((1, 2, 64), np.int64)
    x[0, 1, 33] = 0b10  # pixel 1, tile 1, channel 1 of the tile, bit 1
    words = layout.pack_activations(x, 2).view("<u4")
    assert words.size == 2 * 2 * 2
    assert np.flatnonzero(words).tolist() == [4 + 2 * 1 + 1]  # pixel 1, tile 1, bit 1
    assert words[7] == 1 << 1


@pytest.mark.parametrize("kernel", [3, 1])
@pytest.mark.parametrize("bits", [2, 3, 5, 8])
def test_weight_pack_unpack_is_a_bit_exact_inverse(kernel, bits):
    rng = np.random.default_rng(bits * kernel)
    for ki in (32, 40, 96):
        w = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (7, ki, kernel, kernel))
        data = layout.pack_weights(w, bits)
        assert data.size == layout.weight_bytes(7, ki, kernel, bits)
        np.testing.assert_array_equal(layout.unpack_weights(data, 7, ki, kernel, bits), w)
        u = w + (1 << (bits - 1))
        np.testing.assert_array_equal(
            layout.unpack_weights(layout.pack_weights(u, bits, signed=False), 7, ki, kernel, bits,
                              signed=False), u)


def test_3x3_weight_layout_is_kout_ktile_bit_tap_channel():
    w = np.full((1, 32, 3, 3), -2)  # offset-binary 0 for 2-bit weights
    w[0, 5, 1, 2] = -1              # stored 1: bit 0 of tap 5, channel 5
    words = layout.pack_weights(w, 2).view("<u4")
    assert words.size == 2 * 9
    assert np.flatnonzero(words).tolist() == [5] and words[5] == 1 << 5
    with pytest.raises(ValueError, match="outside"):
        layout.pack_weights(w + 5, 2)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_hwc_sub_byte_packing_round_trips(bits):
    rng = np.random.default_rng(bits)
    x = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (3, 5, 7))
    data = layout.pack_hwc(x, bits)
    assert data.size == -(-x.size * bits // 8)
    np.testing.assert_array_equal(layout.unpack_hwc(data, x.shape, bits, signed=True), x)


def test_normquant_records_and_reference_semantics():
    rec = layout.pack_normquant([1, 65535], [-1, 7])
    assert rec.tobytes() == bytes([1, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 7, 0, 0, 0])
    with pytest.raises(ValueError, match="kappa"):
        layout.pack_normquant([1 << 16], [0])
    # floor shift, saturation, ReLU, 32-bit accumulator wrap
    assert cg.normquant(-5, 1, 0, 1, 8, True, False) == -3
    assert cg.normquant(1000, 1, 0, 0, 4, True, False) == 7
    assert cg.normquant(-1000, 1, 0, 0, 4, True, True) == 0
    assert cg.normquant(1000, 1, 0, 0, 4, False, False) == 15
    assert cg.normquant((1 << 31) + 5, 1, 0, 0, 8, True, False) == -128


# --- blob --------------------------------------------------------------------------------------
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
