"""MARSELLUS operating points and CLUSTER energy (paper Sec. III-A/B/C, Figs. 9, 10, 15).

Maximum frequency (MHz) at a supply voltage, piecewise linear between these points:

========  =========  ===========================================================================
VDD (V)   no ABB     source
========  =========  ===========================================================================
0.50      100        Fig. 9 / Sec. III-A (measured)
0.55      162        our alpha-power fit f = a (V - 0.394)^1.5 / V through the measured points
0.60      226        same fit
0.65      289        same fit
0.70      350        same fit
0.74      400        Sec. III-B: lowest voltage running 400 MHz without ABB (measured)
0.80      420        Fig. 9 / Sec. III-A (measured)
========  =========  ===========================================================================

With ABB (forward body bias driven by the on-chip monitors): 0.50 V 130 MHz (the paper's "up to
30 %" boost), 0.65 V 400 MHz (Fig. 10, measured), 0.80 V 470 MHz (Fig. 11 over-clocking,
measured).

Power of the CLUSTER domain (the paper measures only the CLUSTER), one term per source:

- dynamic power scales as C V^2 f from the nominal point 0.8 V / 420 MHz (the paper's 10.7x
  dynamic reduction from 0.8 V / 420 MHz to 0.5 V / 100 MHz is 10.75x under this law);
- **leakage**: 5.4 % of 123 mW = 6.64 mW at 0.8 V, 3.5x lower at 0.5 V (Sec. III-A), geometric
  in between; ABB multiplies it by 2.56 (derived: Fig. 10's -30 % at 0.65 V / 400 MHz vs 0.8 V);
- **idle** 12 mW dynamic whenever the CLUSTER is clocked (clock tree, TCDM, interconnect): our
  choice, the paper gives no idle figure;
- **cluster kernels** +104.4 mW above idle while the cores run (Fig. 9 / Sec. III-A: the INT8
  MAC&LOAD MatMul draws 123 mW, 94.6 % of it dynamic = 116.4 mW, minus idle); the paper has no
  per-kernel figure, so every cluster kernel is charged this;
- **CLUSTER DMA** +10 mW above idle per busy channel: our choice (no paper figure). The SoC I/O
  DMA (L3) is outside the CLUSTER domain and not counted;
- **RBE**: mostly time-proportional, as the paper's data say: from 2x2 to 8x8 bits (Fig. 15)
  the 1-bit operation rate rises 2.6x while the power rises only from 106 to 123 mW. While a
  job runs (its LOAD / COMPUTE / NORMQUANT / STREAMOUT cycles) the RBE draws ``RBE_FIXED``
  above idle, plus ``E_BINOP`` per 1-bit product (2 x MACs x W x I; a job filling part of the
  BinConv rows or few bit planes switches less). The two are fitted so that our simulator's
  job of each Fig. 15 configuration draws exactly the measured total power: 2x2 bits
  569 Gop/s / 5.37 Top/s/W = 106.0 mW, 8x8 bits 91 Gop/s / 0.740 Top/s/W = 123.0 mW
  (:func:`rbe_fit`; the throughput is then our cycle model's, the power the chip's). The
  reference job is Fig. 13's layer (Kin = Kout = 64, 3x3 outputs, 3x3 mode) with O = 2: Fig. 15
  does not state O, the paper's peak configuration has O = 2 or 4 (Sec. II-B), and O = 2 is
  each W x I's fastest job, so 123 mW, the chip's measured maximum (Sec. III-A, Table II), bounds
  every W, I, O in 2..8.

Engines run concurrently: ``energy = (P_idle + leakage) x T + sum over engines of
(P_engine - P_idle) x busy time + E_BINOP x 1-bit ops``, all at the operating point.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from tvm_accel.errors import ConfigError

V_MIN, V_MAX = 0.5, 0.8
V_NOM, F_NOM = 0.8, 420.0
_F_TABLE = ((0.50, 100.0), (0.55, 162.0), (0.60, 226.0), (0.65, 289.0), (0.70, 350.0),
            (0.74, 400.0), (0.80, 420.0))
_F_TABLE_ABB = ((0.50, 130.0), (0.65, 400.0), (0.80, 470.0))
LEAK_NOM_MW = 0.054 * 123.0
LEAK_RATIO_05 = 3.5
ABB_LEAK_FACTOR = 2.56
#: dynamic power (mW) at 0.8 V / 420 MHz while only this engine is active (the RBE: see rbe_fit)
DYN_NOM_MW = {"idle": 12.0, "cluster": 0.946 * 123.0, "dma": 22.0}
#: Fig. 15 at 0.8 V: (W = I bits, Gop/s, Top/s/W) of the RBE's 3x3 kernels, full CLUSTER power
FIG15_RBE = ((2, 569.0, 5.37), (8, 91.0, 0.740))
#: output bits of the reference jobs the Fig. 15 power is attached to (see the module docstring)
FIG15_OUT_BITS = 2


@dataclass(frozen=True)
class RbeFit:
    """The RBE's power terms at 0.8 V / 420 MHz: ``fixed_mw`` above idle while a job runs and
    ``fj_per_binop`` per 1-bit product."""

    fixed_mw: float
    fj_per_binop: float


def fig15_job(bits: int, out_bits: int = FIG15_OUT_BITS, kernel: int = 3):
    """The reference RBE job of a Fig. 15 point: Fig. 13's layer (Kin = Kout = 64, 3x3 outputs)
    at W = I = ``bits``."""
    from tvm_marsellus.codegen import RbeJob

    return RbeJob(h_in=2 + kernel, w_in=2 + kernel, h_out=3, w_out=3, k_in=64, k_out=64,
                  in_bits=bits, w_bits=bits, out_bits=out_bits, kernel=kernel)


def job_rates(job, cfg=None) -> tuple[int, float]:
    """(cycles, 1-bit products per cycle) of one RBE job in the simulator's cycle model."""
    from tvm_marsellus.hw_config import load_config
    from tvm_marsellus.simulator import rbe_job_phases

    cycles = sum(rbe_job_phases(load_config(cfg), job).values())
    return cycles, 2 * job.macs * job.w_bits * job.in_bits / cycles


@functools.cache
def rbe_fit() -> RbeFit:
    """Fit the RBE's fixed power and energy per 1-bit product to Fig. 15's two points, each the
    measured total power attached to the simulator's job of that configuration (default
    config): ``idle + leakage + fixed + E_BINOP x rate = P_measured`` at both."""
    (b_lo, g_lo, e_lo), (b_hi, g_hi, e_hi) = FIG15_RBE
    p_lo, p_hi = g_lo / e_lo, g_hi / e_hi  # Gop/s / (Top/s/W) = mW
    f_hz = F_NOM * 1e6
    r_lo = job_rates(fig15_job(b_lo))[1] * f_hz
    r_hi = job_rates(fig15_job(b_hi))[1] * f_hz
    mw_per_rate = (p_hi - p_lo) / (r_hi - r_lo)  # mW per (1-bit product / s)
    fixed = p_lo - mw_per_rate * r_lo - DYN_NOM_MW["idle"] - LEAK_NOM_MW
    return RbeFit(fixed_mw=fixed, fj_per_binop=mw_per_rate * 1e-3 * 1e15)


def max_freq_mhz(vdd: float, abb: bool = False) -> float:
    """Highest CLUSTER frequency at ``vdd`` (with or without ABB), interpolated in the table."""
    _check_vdd(vdd)
    table = _F_TABLE_ABB if abb else _F_TABLE
    return float(np.interp(vdd, [v for v, _ in table], [f for _, f in table]))


def _check_vdd(vdd: float) -> None:
    if isinstance(vdd, bool) or not isinstance(vdd, (int, float)) or not (
            V_MIN - 1e-9 <= vdd <= V_MAX + 1e-9):
        raise ConfigError(f"operating point: VDD {vdd!r} V is outside the measured range "
                          f"{V_MIN}..{V_MAX} V")


@dataclass(frozen=True)
class OperatingPoint:
    """A supply voltage, a CLUSTER clock and whether ABB is on; checked on construction."""

    vdd: float
    freq_mhz: float
    abb: bool = False

    def __post_init__(self):
        _check_vdd(self.vdd)
        fmax = max_freq_mhz(self.vdd, self.abb)
        if isinstance(self.freq_mhz, bool) or not isinstance(self.freq_mhz, (int, float)) or \
                not self.freq_mhz > 0:
            raise ConfigError(f"operating point: {self.freq_mhz!r} MHz: the CLUSTER clock must "
                              "be a positive number of MHz")
        if self.freq_mhz > fmax + 1e-9:
            raise ConfigError(f"operating point: {self.freq_mhz!r} MHz at {self.vdd} V "
                              f"{'with' if self.abb else 'without'} ABB is above the maximum "
                              f"of {fmax:.0f} MHz at that voltage")

    @classmethod
    def at(cls, vdd: float, abb: bool = False) -> OperatingPoint:
        """The point running at the maximum frequency of ``vdd``."""
        return cls(vdd, max_freq_mhz(vdd, abb), abb)


NOMINAL = OperatingPoint(0.8, 420.0)
ABB_065 = OperatingPoint(0.65, 400.0, abb=True)
LOW_05 = OperatingPoint(0.5, 100.0)


def leakage_mw(op: OperatingPoint) -> float:
    """CLUSTER leakage at the operating point."""
    p = LEAK_NOM_MW * LEAK_RATIO_05 ** ((op.vdd - V_NOM) / (V_NOM - V_MIN))
    return p * (ABB_LEAK_FACTOR if op.abb else 1.0)


def _dyn_scale(op: OperatingPoint) -> float:
    return (op.vdd / V_NOM) ** 2 * (op.freq_mhz / F_NOM)


def power_mw(op: OperatingPoint, engine: str = "cluster") -> float:
    """Total CLUSTER power (dynamic + leakage) while only ``engine`` ("idle", "cluster", "dma")
    is active; the RBE's depends on its job, see :func:`rbe_power_mw`."""
    if engine not in DYN_NOM_MW:
        raise ConfigError(f"unknown engine {engine!r} (engines: {', '.join(DYN_NOM_MW)}; the "
                          "RBE: rbe_power_mw)")
    return DYN_NOM_MW[engine] * _dyn_scale(op) + leakage_mw(op)


def rbe_power_mw(op: OperatingPoint, binops_per_cycle: float) -> float:
    """Total CLUSTER power while the RBE runs a job doing ``binops_per_cycle`` 1-bit products
    per cycle (:func:`job_rates`) and nothing else runs."""
    fit = rbe_fit()
    dyn = DYN_NOM_MW["idle"] + fit.fixed_mw + \
        fit.fj_per_binop * 1e-15 * binops_per_cycle * F_NOM * 1e6 * 1e3
    return dyn * _dyn_scale(op) + leakage_mw(op)


def rbe_job_cycles(stats) -> int:
    """Cycles the RBE spent running jobs (LOAD, COMPUTE, NORMQUANT, STREAMOUT; not the cores'
    register programming)."""
    return stats.rbe_load + stats.rbe_compute + stats.rbe_normquant + stats.rbe_streamout


def energy_breakdown_uj(stats, op: OperatingPoint) -> dict[str, float]:
    """Energy in uJ per part (``idle`` = idle dynamic, ``leakage``, ``rbe``, ``cluster``,
    ``dma``) of a run whose :class:`~tvm_marsellus.simulator.MarsellusStats` is ``stats``."""
    coef = energy_coefficients(op)
    return {
        "idle": coef["idle"] * stats.cycles * 1e-6,
        "leakage": coef["leakage"] * stats.cycles * 1e-6,
        "rbe": (coef["rbe"] * rbe_job_cycles(stats) + coef["rbe_binop"] * stats.rbe_bin_ops)
        * 1e-6,
        "cluster": coef["cluster"] * stats.cluster_busy * 1e-6,
        "dma": coef["dma"] * (stats.dma_in_busy + stats.dma_out_busy) * 1e-6,
    }


def energy_coefficients(op: OperatingPoint) -> dict[str, float]:
    """The terms of :func:`energy_breakdown_uj` in pJ at the operating point, for compile-time
    estimates: ``idle`` and ``leakage`` per cycle (``static`` = both), ``cluster`` per busy core
    cycle, ``dma`` per busy DMA channel cycle and ``rbe`` per RBE job cycle (each above idle),
    ``rbe_binop`` per 1-bit RBE product."""
    cyc = 1e9 / (op.freq_mhz * 1e6)  # mW x ns = pJ
    s = _dyn_scale(op)
    idle = DYN_NOM_MW["idle"]
    fit = rbe_fit()
    out = {"idle": idle * s * cyc, "leakage": leakage_mw(op) * cyc,
           "cluster": (DYN_NOM_MW["cluster"] - idle) * s * cyc,
           "dma": (DYN_NOM_MW["dma"] - idle) * s * cyc,
           "rbe": fit.fixed_mw * s * cyc,
           "rbe_binop": fit.fj_per_binop * 1e-3 * (op.vdd / V_NOM) ** 2}
    out["static"] = out["idle"] + out["leakage"]
    return out


def energy_uj(stats, op: OperatingPoint) -> float:
    """CLUSTER energy of a run at the operating point, in microjoules."""
    return float(sum(energy_breakdown_uj(stats, op).values()))
