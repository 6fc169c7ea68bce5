"""Operating points and CLUSTER energy against the paper's measured points."""

import dataclasses
import itertools

import pytest

from tvm_accel.errors import ConfigError
from tvm_marsellus.energy import (
    ABB_065,
    DYN_NOM_MW,
    FIG15_RBE,
    LOW_05,
    NOMINAL,
    OperatingPoint,
    energy_breakdown_uj,
    energy_uj,
    fig15_job,
    job_rates,
    leakage_mw,
    max_freq_mhz,
    power_mw,
    rbe_fit,
    rbe_power_mw,
)
from tvm_marsellus.hw_config import load_config
from tvm_marsellus.simulator import MarsellusStats, rbe_job_phases


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
    (0.8, 0, False, "must be a positive"),
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


def _busy_rbe_stats(job) -> MarsellusStats:
    """Counters of a run in which the RBE runs ``job`` and nothing else."""
    phases = rbe_job_phases(load_config(), job)
    cycles = sum(phases.values())
    return MarsellusStats(cycles=cycles, rbe_busy=cycles, rbe_macs=job.macs,
                          rbe_bin_ops=2 * job.macs * job.w_bits * job.in_bits,
                          **{f"rbe_{k}": v for k, v in phases.items()})


@pytest.mark.parametrize("bits, gops, tops_w", FIG15_RBE)
def test_a_busy_rbe_draws_the_power_fig15_measured(bits, gops, tops_w):
    # Fig. 15 at 0.8 V: 2x2 bits 569 Gop/s at 5.37 Top/s/W, 8x8 bits 91 Gop/s at 0.740 Top/s/W
    st = _busy_rbe_stats(fig15_job(bits))
    mw = energy_uj(st, NOMINAL) / (st.cycles / NOMINAL.freq_mhz) * 1e3
    assert mw == pytest.approx(gops / tops_w, rel=1e-6)
    assert mw == pytest.approx(rbe_power_mw(NOMINAL, job_rates(fig15_job(bits))[1]), rel=1e-9)


@pytest.mark.parametrize("kernel", [3, 1])
def test_a_busy_rbe_stays_within_the_measured_123_mw_at_every_precision(kernel):
    # Sec. III-A / Table II: 123 mW is the CLUSTER's measured maximum at 0.8 V
    for w, i, o in itertools.product(range(2, 9), repeat=3):
        job = dataclasses.replace(fig15_job(2, kernel=kernel), w_bits=w, in_bits=i, out_bits=o)
        assert rbe_power_mw(NOMINAL, job_rates(job)[1]) <= 123.0 + 1e-9, (kernel, w, i, o)


def test_rbe_power_scales_to_fig15_at_05v_and_drops_with_abb():
    # Fig. 15 at 0.5 V: 2x2 136 Gop/s at 12.36 Top/s/W (11.0 mW), 8x8 22 Gop/s at 1.64 (13.4 mW)
    for bits, mw in ((2, 136 / 12.36), (8, 22 / 1.64)):
        rate = job_rates(fig15_job(bits))[1]
        assert rbe_power_mw(LOW_05, rate) == pytest.approx(mw, rel=0.10)
        assert rbe_power_mw(ABB_065, rate) < rbe_power_mw(OperatingPoint(0.8, 400), rate)


def test_rbe_energy_is_mostly_time_proportional():
    # from 2x2 to 8x8 the 1-bit rate rises 3.4x in our jobs but the power only 106 -> 123 mW
    fit = rbe_fit()
    lo, hi = (job_rates(fig15_job(b))[1] for b in (2, 8))
    assert hi / lo > 3
    busy_dyn = rbe_power_mw(NOMINAL, hi) - leakage_mw(NOMINAL) - DYN_NOM_MW["idle"]
    assert fit.fj_per_binop > 0 and fit.fixed_mw > 0.7 * busy_dyn
    # the same operations over twice the job cycles cost more than 1.6x the energy
    st = _busy_rbe_stats(fig15_job(4))
    slow = dataclasses.replace(st, cycles=2 * st.cycles, rbe_busy=2 * st.rbe_busy,
                               rbe_compute=st.rbe_compute + st.cycles)
    assert energy_uj(slow, NOMINAL) > 1.6 * energy_uj(st, NOMINAL)


def test_energy_is_power_times_time_summed_over_engines():
    ops = 91e9 * 100e-6
    st = MarsellusStats(cycles=42_000, rbe_busy=42_000, rbe_compute=42_000,
                        rbe_macs=int(ops // 2), rbe_bin_ops=int(ops * 64))
    e_nom = energy_uj(st, NOMINAL)
    assert energy_uj(st, ABB_065) < e_nom          # same speed class, lower voltage
    assert energy_uj(st, LOW_05) < energy_uj(st, ABB_065)   # 4.2x slower, less energy
    both = MarsellusStats(cycles=42_000, rbe_busy=42_000, rbe_compute=42_000,
                          cluster_busy=42_000, dma_in_busy=21_000)
    parts = energy_breakdown_uj(both, NOMINAL)
    assert set(parts) == {"idle", "leakage", "rbe", "cluster", "dma"}
    assert energy_uj(both, NOMINAL) > e_nom and parts["dma"] > 0
