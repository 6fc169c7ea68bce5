"""MARSELLUS hardware config: paper defaults, derived geometry, validation naming the field."""

import json

import pytest

from tvm_accel.errors import ConfigError
from tvm_marsellus.hw_config import CONFIG_DIR, MarsellusConfig, load_config


def test_default_config_has_the_papers_rbe_cluster_and_memories():
    cfg = load_config()
    assert cfg.name == "marsellus_default"
    assert (cfg.RBE_CORES, cfg.RBE_BLOCKS, cfg.RBE_BINCONVS) == (9, 9, 4)
    assert cfg.rbe_and_gates == 10368
    assert cfg.rbe_patch == 3 and cfg.rbe_port_words == 9
    assert cfg.RBE_JOB_QUEUE_DEPTH == 2
    assert (cfg.RBE_MIN_BITS, cfg.RBE_MAX_BITS) == (2, 8)
    assert cfg.CLUSTER_CORES == 16
    assert (cfg.L1_BYTES, cfg.L2_BYTES) == (128 * 1024, 1024 * 1024)
    assert cfg.DMA_BYTES_PER_CYCLE == 8 and cfg.CLOCK_MHZ == 420


def test_cluster_matmul_rates_follow_the_papers_ratios():
    cfg = load_config()
    base = cfg.CL_MATMUL_8B_MACS_PER_CYCLE
    assert 2 * base * 0.42 == pytest.approx(25.45, rel=0.01)  # Gop/s baseline at 420 MHz
    assert cfg.cluster_macs_per_cycle(8) == pytest.approx(base * 1.67)
    assert cfg.cluster_macs_per_cycle(4) == pytest.approx(base * 3.2)
    assert cfg.cluster_macs_per_cycle(2) == pytest.approx(base * 6.3)
    no_ml = MarsellusConfig(**{**cfg.to_json(), "CL_MAC_LOAD": 0})
    assert no_ml.cluster_macs_per_cycle(8) == pytest.approx(base)


def test_fingerprint_identifies_the_parameters():
    cfg = load_config()
    assert len(cfg.fingerprint) == 16
    other = MarsellusConfig(**{**cfg.to_json(), "L1_BYTES": 65536})
    assert other.fingerprint != cfg.fingerprint
    assert load_config(cfg) is cfg


def _write(tmp_path, drop=None, **changes):
    d = json.loads((CONFIG_DIR / "marsellus_default.json").read_text())
    d.update(changes)
    if drop:
        del d[drop]
    p = tmp_path / "cfg.json"
    p.write_text(json.dumps(d))
    return p


def test_config_file_round_trips(tmp_path):
    p = _write(tmp_path)
    assert load_config(p).to_json() == load_config().to_json()


@pytest.mark.parametrize("changes,match", [
    ({"RBE_CORES": 8}, "RBE_CORES: 8 is not a square"),
    ({"RBE_BLOCKS": 4}, "RBE_BLOCKS"),
    ({"RBE_TCDM_PORT_BITS": 100}, "not a multiple of 32"),
    ({"RBE_MAX_BITS": 9}, "RBE_MAX_BITS"),
    ({"CL_MAC_LOAD": 2}, "CL_MAC_LOAD"),
    ({"DMA_BYTES_PER_CYCLE": 0}, "DMA_BYTES_PER_CYCLE"),
    ({"CLOCK_MHZ": -1}, "CLOCK_MHZ"),
    ({"CL_FC_EFFICIENCY": 1.5}, "CL_FC_EFFICIENCY"),
    ({"L1_BYTES": "big"}, "L1_BYTES: expected an integer"),
    ({"EXTRA": 1}, "unknown field EXTRA"),
])
def test_bad_fields_are_rejected_naming_the_field(tmp_path, changes, match):
    with pytest.raises(ConfigError, match=match):
        load_config(_write(tmp_path, **changes))


def test_missing_field_and_missing_file_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="missing field L2_BYTES"):
        load_config(_write(tmp_path, drop="L2_BYTES"))
    with pytest.raises(ConfigError, match="no such config file or bundled config"):
        load_config("no_such_marsellus")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(bad)
