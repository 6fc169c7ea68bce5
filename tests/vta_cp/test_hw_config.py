import json

import pytest

from tvm_accel.errors import ConfigError
from tvm_vta_cp.hw_config import CONFIG_DIR, load_config


def test_default_config_is_1x16x16_with_vta_buffer_depths():
    cfg = load_config()
    assert (cfg.batch, cfg.block_in, cfg.block_out) == (1, 16, 16)
    assert (cfg.uop_depth, cfg.inp_depth, cfg.wgt_depth, cfg.acc_depth) == (8192, 2048, 1024, 2048)
    assert cfg.macs_per_cycle == 256


def test_8x8x8_variant_has_its_own_depths_and_fingerprint():
    cfg = load_config("vta_8x8x8")
    assert (cfg.batch, cfg.block_in, cfg.block_out) == (8, 8, 8)
    assert (cfg.inp_depth, cfg.wgt_depth, cfg.acc_depth) == (512, 4096, 512)
    assert cfg.fingerprint != load_config().fingerprint


def _write(tmp_path, **changes):
    d = json.loads((CONFIG_DIR / "vta_1x16x16.json").read_text())
    d.update(changes)
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("changes, field", [
    ({"LOG_BLOCK_OUT": 3}, "LOG_BLOCK_OUT"),
    ({"LOG_ACC_WIDTH": 4}, "LOG_ACC_WIDTH"),
    ({"LOG_INP_BUFF_SIZE": 6}, "LOG_INP_BUFF_SIZE"),
    ({"DRAM_BYTES_PER_CYCLE": 0}, "DRAM_BYTES_PER_CYCLE"),
    ({"LOG_BATCH": "two"}, "LOG_BATCH"),
    ({"LOG_BLOK_IN": 4}, "LOG_BLOK_IN"),
    ({"DRAM_LATENCY_CYCLES": 2**31}, "DRAM_LATENCY_CYCLES"),
    ({"GEMM_CYCLES_PER_UOP": 2**32 + 1}, "GEMM_CYCLES_PER_UOP"),
    ({"CLOCK_MHZ": float("nan")}, "CLOCK_MHZ"),
    ({"DRAM_BYTES_PER_CYCLE": float("inf")}, "DRAM_BYTES_PER_CYCLE"),
    ({"HOST_GATHER_BYTES_PER_CYCLE": 10**400}, "HOST_GATHER_BYTES_PER_CYCLE"),
    ({"HOST_COPY_BYTES_PER_CYCLE": 0}, "HOST_COPY_BYTES_PER_CYCLE"),
])
def test_inconsistent_config_names_the_file_and_field(tmp_path, changes, field):
    p = _write(tmp_path, **changes)
    with pytest.raises(ConfigError, match=field) as e:
        load_config(p)
    assert str(p) in str(e.value)


def test_missing_field_and_bad_json_are_reported(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(p)
    d = json.loads((CONFIG_DIR / "vta_1x16x16.json").read_text())
    del d["LOG_BATCH"]
    p.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="missing field LOG_BATCH"):
        load_config(p)


def test_unknown_config_name_lists_bundled_configs():
    with pytest.raises(ConfigError, match="vta_8x8x8"):
        load_config("vta_4x4x4")


def test_timing_fields_reach_the_int32_limit_of_the_simulator_binding(tmp_path):
    """2^31 - 1 is the widest value the ctypes int32 fields carry unchanged; it is accepted."""
    top = 2**31 - 1
    cfg = load_config(_write(tmp_path, DRAM_LATENCY_CYCLES=top, PIPELINE_LATENCY_CYCLES=top,
                             GEMM_CYCLES_PER_UOP=top, ALU_CYCLES_PER_UOP=top))
    assert cfg.DRAM_LATENCY_CYCLES == top
