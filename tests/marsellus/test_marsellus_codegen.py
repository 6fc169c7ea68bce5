"""MARSELLUS ISA (binary + assembly round trips, corrupt fields)."""

import numpy as np
import pytest

from tvm_marsellus import codegen as cg


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
