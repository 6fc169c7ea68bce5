"""Operating points and CLUSTER energy against the paper's measured points."""

import pytest

from tvm_accel.errors import ConfigError
from tvm_marsellus.energy import (
    ABB_065,
    LOW_05,
    NOMINAL,
    OperatingPoint,
    energy_breakdown_uj,
    energy_uj,
    leakage_mw,
    max_freq_mhz,
    power_mw,
)
from tvm_marsellus.simulator import MarsellusStats


def test_max_frequency_matches_the_measured_points():
    assert max_freq_mhz(0.8) == 420 and max_freq_mhz(0.5) == 100
    assert max_freq_mhz(0.74) == 400
    assert max_freq_mhz(0.65, abb=True) == 400
    assert max_freq_mhz(0.8, abb=True) == 470
    assert max_freq_mhz(0.6) < max_freq_mhz(0.7) < max_freq_mhz(0.74)


@pytest.mark.parametrize("vdd,freq,abb,match", [
    (0.45, 50, False, "outside the measured range"),
    (0.9, 400, False, "outside the measured range"),
    (0.65, 400, False, "above the maximum"),
    (0.5, 120, False, "above the maximum"),
    (0.8, 0, False, "above the maximum|not positive"),
])
def test_bad_operating_points_are_config_errors(vdd, freq, abb, match):
    with pytest.raises(ConfigError, match=match):
        OperatingPoint(vdd, freq, abb)


def test_nominal_power_is_123_mw_and_scales_like_the_paper():
    assert power_mw(NOMINAL, "cluster") == pytest.approx(123.0, rel=1e-3)
    dyn_nom = power_mw(NOMINAL, "cluster") - leakage_mw(NOMINAL)
    dyn_low = power_mw(LOW_05, "cluster") - leakage_mw(LOW_05)
    assert dyn_nom / dyn_low == pytest.approx(10.7, rel=0.01)          # Sec. III-A
    assert leakage_mw(NOMINAL) / leakage_mw(LOW_05) == pytest.approx(3.5)


def test_abb_at_065v_saves_30_percent_at_400_mhz():
    ref = power_mw(OperatingPoint(0.8, 400), "cluster")
    assert power_mw(ABB_065, "cluster") / ref == pytest.approx(0.70, abs=0.01)   # Fig. 10
    no_abb_074 = power_mw(OperatingPoint(0.74, 400), "cluster")
    assert power_mw(ABB_065, "cluster") / no_abb_074 == pytest.approx(0.84, abs=0.03)


def test_rbe_efficiency_at_the_three_points():
    # Fig. 15: 8x8 RBE 91 Gop/s at 740 Gop/s/W; 2x2 5.37 Top/s/W at 0.8 V, 12.36 at 0.5 V
    assert 91 / power_mw(NOMINAL, "rbe") * 1e3 == pytest.approx(740, rel=0.10)
    assert 569 / power_mw(NOMINAL, "rbe") == pytest.approx(5.37, rel=0.10)
    assert 136 / power_mw(LOW_05, "rbe") == pytest.approx(12.36, rel=0.10)
    assert power_mw(ABB_065, "rbe") < power_mw(OperatingPoint(0.8, 400), "rbe")


@pytest.mark.parametrize("bits, gops, mw", [(8, 91.0, 123.0), (2, 569.0, 1e3 * 569 / 5370)])
def test_a_fully_busy_rbe_draws_the_measured_power(bits, gops, mw):
    # Fig. 15: 100 us at the measured throughput costs the measured total power x 100 us
    ops = gops * 1e9 * 100e-6
    st = MarsellusStats(cycles=42_000, rbe_busy=42_000, rbe_macs=int(ops // 2),
                        rbe_bin_ops=int(ops * bits * bits))
    assert energy_uj(st, NOMINAL) == pytest.approx(mw * 100e-6 * 1e3, rel=1e-3)


def test_energy_is_power_times_time_summed_over_engines():
    ops = 91e9 * 100e-6
    st = MarsellusStats(cycles=42_000, rbe_busy=42_000, rbe_macs=int(ops // 2),
                        rbe_bin_ops=int(ops * 64))
    e_nom = energy_uj(st, NOMINAL)
    assert energy_uj(st, ABB_065) < e_nom          # same speed class, lower voltage
    assert energy_uj(st, LOW_05) < energy_uj(st, ABB_065)   # 4.2x slower, less energy
    both = MarsellusStats(cycles=42_000, rbe_busy=42_000, cluster_busy=42_000,
                          dma_in_busy=21_000)
    parts = energy_breakdown_uj(both, NOMINAL)
    assert set(parts) == {"idle", "leakage", "rbe", "cluster", "dma"}
    assert energy_uj(both, NOMINAL) > e_nom and parts["dma"] > 0
