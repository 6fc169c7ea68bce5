import pytest

from tvm_accel.blob import MAGIC, Blob, pack_blob, unpack_blob
from tvm_accel.errors import BlobError

FP = bytes(range(16))


def _blob() -> bytes:
    return pack_blob(Blob("vta", FP, {"META": b'{"a": 1}', "INSN": b"\x01" * 32}))


def test_round_trip_keeps_target_fingerprint_and_sections():
    b = unpack_blob(_blob(), expect_target="vta", expect_fingerprint=FP)
    assert b.target == "vta" and b.fingerprint == FP
    assert b.sections == {"META": b'{"a": 1}', "INSN": b"\x01" * 32}
    assert b.json_section("META") == {"a": 1}


@pytest.mark.parametrize("cut", [0, 5, 20, 60, -1])
def test_truncated_blob_is_rejected(cut):
    with pytest.raises(BlobError, match="truncated|checksum|outside"):
        unpack_blob(_blob()[:cut])


def test_wrong_magic_is_rejected():
    data = b"NOTABLOB" + _blob()[len(MAGIC):]
    with pytest.raises(BlobError, match="magic"):
        unpack_blob(data)


def test_flipped_payload_byte_fails_the_checksum():
    data = bytearray(_blob())
    data[-3] ^= 0xFF
    with pytest.raises(BlobError, match="checksum"):
        unpack_blob(bytes(data))


def test_blob_for_another_target_or_config_is_rejected():
    with pytest.raises(BlobError, match="target 'vta', not 'dpu'"):
        unpack_blob(_blob(), expect_target="dpu")
    with pytest.raises(BlobError, match="another hardware config"):
        unpack_blob(_blob(), expect_fingerprint=bytes(16))


def test_missing_section_names_the_section():
    with pytest.raises(BlobError, match="'CNST'"):
        unpack_blob(_blob()).section("CNST")


def test_blob_cache_decodes_a_blob_once_and_a_changed_byte_again():
    import numpy as np

    from tvm_accel.runtime import BlobCache

    loads = []
    cache = BlobCache(lambda b: loads.append(b) or (len(loads),))
    data = np.frombuffer(_blob(), np.uint8).copy()
    assert cache.decode(data) == cache.decode(data.copy()) == (1,)
    data[-1] ^= 1                                  # same size, one byte changed in place
    assert cache.decode(data) == (2,) and loads[-1] == data.tobytes()
    data[-1] ^= 1
    assert cache.decode(data) == (1,) and len(loads) == 2
    assert cache.decode(data.astype(np.int16)) == (3,)   # same values, other bytes
