"""MARSELLUS host <-> device layouts: RBE bit planes, bit-packed HWC, NormQuant records."""

import numpy as np
import pytest

from tvm_marsellus import codegen as cg
from tvm_marsellus import layout


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
