"""DPU hardware config: defaults from the papers, variants, validation naming the field."""

import json

import pytest

from tvm_accel.errors import ConfigError
from tvm_dpu.hw_config import CONFIG_DIR, REGION_NAMES, DPUConfig, load_config


def test_default_config_is_four_pes_with_three_banked_fm_memories():
    cfg = load_config()
    assert cfg.name == "dpu_default"
    assert cfg.NUM_PE == 4
    assert (cfg.FM_MEMORIES, cfg.FM_BANKS) == (3, 8)
    assert cfg.fm_memory_bytes == 8 * cfg.FM_BANK_BYTES == 256 * 1024
    assert cfg.fm_bytes == 3 * 256 * 1024
    assert cfg.PM_BYTES == 1 << 20
    assert cfg.FORMAT_MAX_CHANNELS == 8 and cfg.format_unit


def test_peak_macs_per_cycle_per_pe_and_total():
    cfg = load_config()
    assert (cfg.CONV_IC_PAR, cfg.CONV_OC_PAR, cfg.CONV_ROW_PAR) == (16, 16, 8)
    assert cfg.macs_per_cycle_per_pe == 2048
    assert cfg.peak_macs_per_cycle == 8192
    assert cfg.peak_gops == pytest.approx(2 * 8192 * 300 / 1000)


def test_8pe_variant_doubles_pes_and_ddr_and_has_its_own_fingerprint():
    cfg, base = load_config("dpu_8pe"), load_config()
    assert cfg.NUM_PE == 8 and cfg.peak_macs_per_cycle == 2 * base.peak_macs_per_cycle
    assert cfg.DDR_BYTES_PER_CYCLE == 2 * base.DDR_BYTES_PER_CYCLE
    assert cfg.fingerprint != base.fingerprint
    assert len(base.fingerprint) == 16
    assert load_config(base) is base


def test_region_layout_packs_regions_in_register_order():
    cfg = load_config()
    lay = cfg.region_layout()
    assert list(lay) == list(REGION_NAMES)
    assert lay["INPUT"] == (0, cfg.DDR_INPUT_BYTES)
    assert lay["OUTPUT"][0] == cfg.DDR_INPUT_BYTES
    small = cfg.region_layout({"INPUT": 100, "OUTPUT": 5000, "PARAM": 1, "INSN": 0, "SWAP": 7})
    assert small == {"INPUT": (0, 100), "OUTPUT": (4096, 5000), "PARAM": (12288, 1),
                     "INSN": (16384, 0), "SWAP": (16384, 7)}
    assert DPUConfig.ddr_bytes(small) == 16391
    with pytest.raises(ConfigError, match="unknown DDR region 'STACK'"):
        cfg.region_layout({"STACK": 1})
    with pytest.raises(ConfigError, match="DDR region SWAP"):
        cfg.region_layout({"SWAP": 1 << 33})


def _write(tmp_path, **changes):
    d = json.loads((CONFIG_DIR / "dpu_default.json").read_text())
    d.update(changes)
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("changes, field", [
    ({"CONV_ROW_PAR": 16}, "CONV_ROW_PAR"),          # more rows in parallel than FM banks
    ({"MISC_ROW_PAR": 9}, "MISC_ROW_PAR"),
    ({"FM_BANK_BYTES": 3000}, "FM_BANK_BYTES"),      # not a power of two
    ({"FM_BANK_BYTES": 1 << 18}, "FM_BANK_BYTES"),   # 8 x 256 KiB exceeds the 20-bit address
    ({"FM_BANKS": 6}, "FM_BANKS"),
    ({"FM_MEMORIES": 5}, "FM_MEMORIES"),
    ({"NUM_PE": 0}, "NUM_PE"),
    ({"PM_BYTES": 1 << 25}, "PM_BYTES"),
    ({"FORMAT_MAX_FACTOR": 16}, "FORMAT_MAX_FACTOR"),
    ({"DDR_BYTES_PER_CYCLE": 0}, "DDR_BYTES_PER_CYCLE"),
    ({"CLOCK_MHZ": -1}, "CLOCK_MHZ"),
    ({"LOAD_LATENCY_CYCLES": -5}, "LOAD_LATENCY_CYCLES"),
    ({"DDR_SWAP_BYTES": (1 << 32) + 1}, "DDR_SWAP_BYTES"),
    ({"NUM_PE": "four"}, "NUM_PE"),
    ({"NUM_PE": True}, "NUM_PE"),
    ({"NUM_PES": 4}, "NUM_PES"),
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
    d = json.loads((CONFIG_DIR / "dpu_default.json").read_text())
    del d["PM_BYTES"]
    p.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="missing field PM_BYTES"):
        load_config(p)
    p.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        load_config(p)


def test_unknown_config_name_lists_bundled_configs():
    with pytest.raises(ConfigError, match="dpu_8pe"):
        load_config("dpu_16pe")


def test_bundled_configs_round_trip_through_json():
    for p in CONFIG_DIR.glob("*.json"):
        cfg = load_config(p.stem)
        assert cfg.to_json() == {**json.loads(p.read_text()),
                                 "CLOCK_MHZ": cfg.CLOCK_MHZ,
                                 "DDR_BYTES_PER_CYCLE": cfg.DDR_BYTES_PER_CYCLE}
