"""Host <-> device packing: NCHWnc blocking, the uint8 shift and the halo fill."""

import numpy as np
import pytest

from tvm_vta_cp.hw_config import load_config
from tvm_vta_cp.layout import pack_tensor, unpack_tensor
from tvm_vta_cp.program import TensorPlacement

from .test_strategy import CONFIGS, random_input


@pytest.mark.parametrize("cfg_name", CONFIGS)
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_pack_unpack_round_trip_keeps_values_and_fills_the_halo(cfg_name, dtype):
    cfg = load_config(cfg_name)
    rng = np.random.default_rng(20)
    shape = (3, 21, 5, 4)
    x = random_input(rng, shape, dtype)
    B, BLK = cfg.batch, cfg.block_out
    nb, cb = -(-3 // B), -(-21 // BLK)
    nbytes = nb * cb * (5 + 3) * (4 + 1) * B * BLK
    p = TensorPlacement("x", shape, dtype, 0, (1, 0, 2, 1), -5, nbytes)
    buf = pack_tensor(x, p, cfg)
    assert buf.dtype == np.uint8 and buf.size == nbytes
    packed = buf.view(np.int8).reshape(nb, cb, 8, 5, B, BLK)
    assert np.all(packed[:, :, 0] == -5) and np.all(packed[:, :, :, 4] == -5)
    np.testing.assert_array_equal(unpack_tensor(buf, p, cfg), x)
