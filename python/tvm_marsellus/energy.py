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

Power of the CLUSTER domain (the paper measures only the CLUSTER):

- dynamic power scales as C V^2 f from the nominal point 0.8 V / 420 MHz (the paper's 10.7x
  dynamic reduction from 0.8 V / 420 MHz to 0.5 V / 100 MHz is 10.75x under this law);
- leakage: 5.4 % of 123 mW = 6.64 mW at 0.8 V, 3.5x lower at 0.5 V (Sec. III-A), geometric in
  between; ABB multiplies it by 2.56 (derived: Fig. 10's -30 % at 0.65 V / 400 MHz vs 0.8 V);
- dynamic power at the nominal point while one engine runs (the rest clock-gated):
  cluster cores 116.4 mW (Fig. 9: INT8 MAC&LOAD MatMul, 123 mW total, 94.6 % dynamic);
  RBE 107.9 mW (Fig. 15: 91 Gop/s at 740 Gop/s/W = 123 mW at 8x8 bits, 569 Gop/s at
  5.37 Top/s/W = 106 mW at 2x2 bits; the mean, minus leakage; +-7 % over precisions);
  idle 12 mW and CLUSTER DMA +10 mW are our choices (clock tree, TCDM and AXI activity; the
  paper gives no figure). The SoC I/O DMA (L3) is outside the CLUSTER domain and not counted.

Engines run concurrently: ``energy = (P_idle + leakage) x T + sum over engines of
(P_engine - P_idle) x busy time``, all at the operating point, except the RBE, whose dynamic
energy is charged per operation (its BinConvs switch per useful 1-bit product, so a job that
fills half the 32-channel BinConv rows or few bit planes burns proportionally less):
``E_rbe = (RBE_PJ_PER_OP x ops + RBE_PJ_PER_BINOP x binary ops) x (V / 0.8 V)^2``, with
``binary ops = ops x W x I``. The two coefficients are fitted to Fig. 15 so that a fully busy RBE
draws exactly the measured total power: 8x8 bits 91 Gop/s at 740 Gop/s/W (123 mW) and 2x2 bits
569 Gop/s at 5.37 Top/s/W (106 mW), after idle and leakage.
"""

from __future__ import annotations

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
#: dynamic power (mW) at 0.8 V / 420 MHz while only this engine is active
DYN_NOM_MW = {"idle": 12.0, "cluster": 0.946 * 123.0, "rbe": 114.5 - LEAK_NOM_MW, "dma": 22.0}


def _rbe_fit() -> tuple[float, float]:
    """(pJ per op, pJ per 1-bit op) of the RBE at 0.8 V from Fig. 15's two measured points."""
    base = DYN_NOM_MW["idle"] + LEAK_NOM_MW
    e88 = (1e3 / 740.0 - base / 91.0) / 1.0          # mW / (Gop/s) = pJ per op
    e22 = (1e3 / 5370.0 - base / 569.0) / 1.0
    per_binop = (e88 - e22) / (64 - 4)
    return e22 - 4 * per_binop, per_binop


RBE_PJ_PER_OP, RBE_PJ_PER_BINOP = _rbe_fit()


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
                not 0 < self.freq_mhz <= fmax + 1e-9:
            raise ConfigError(f"operating point: {self.freq_mhz!r} MHz at {self.vdd} V "
                              f"{'with' if self.abb else 'without'} ABB is above the maximum "
                              f"of {fmax:.0f} MHz (or not positive)")

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
    """Total CLUSTER power (dynamic + leakage) while only ``engine`` ("idle", "cluster", "rbe",
    "dma") is active."""
    if engine not in DYN_NOM_MW:
        raise ConfigError(f"unknown engine {engine!r} (engines: {', '.join(DYN_NOM_MW)})")
    return DYN_NOM_MW[engine] * _dyn_scale(op) + leakage_mw(op)


def energy_breakdown_uj(stats, op: OperatingPoint) -> dict[str, float]:
    """Energy in uJ per part (``idle`` = idle dynamic, ``leakage``, ``rbe``, ``cluster``,
    ``dma``) of a run whose :class:`~tvm_marsellus.simulator.MarsellusStats` is ``stats``."""
    f_hz = op.freq_mhz * 1e6
    s = _dyn_scale(op)
    idle = DYN_NOM_MW["idle"]

    def uj(mw: float, cycles: float) -> float:
        return mw * 1e-3 * cycles / f_hz * 1e6

    return {
        "idle": uj(idle * s, stats.cycles),
        "leakage": uj(leakage_mw(op), stats.cycles),
        "rbe": (RBE_PJ_PER_OP * 2 * stats.rbe_macs + RBE_PJ_PER_BINOP * stats.rbe_bin_ops)
        * 1e-6 * (op.vdd / V_NOM) ** 2,
        "cluster": uj((DYN_NOM_MW["cluster"] - idle) * s, stats.cluster_busy),
        "dma": uj((DYN_NOM_MW["dma"] - idle) * s, stats.dma_in_busy + stats.dma_out_busy),
    }


def energy_coefficients(op: OperatingPoint) -> dict[str, float]:
    """The terms of :func:`energy_breakdown_uj` in pJ at the operating point, for compile-time
    estimates: ``static`` per cycle (idle + leakage), ``cluster`` per busy core cycle (above
    idle), ``dma`` per busy DMA cycle, ``rbe_op`` per RBE operation (a MAC is two) and
    ``rbe_binop`` per 1-bit RBE operation."""
    cyc = 1e9 / (op.freq_mhz * 1e6)  # mW x ns = pJ
    s = _dyn_scale(op)
    idle = DYN_NOM_MW["idle"]
    v2 = (op.vdd / V_NOM) ** 2
    return {"static": (idle * s + leakage_mw(op)) * cyc,
            "cluster": (DYN_NOM_MW["cluster"] - idle) * s * cyc,
            "dma": (DYN_NOM_MW["dma"] - idle) * s * cyc,
            "rbe_op": RBE_PJ_PER_OP * v2, "rbe_binop": RBE_PJ_PER_BINOP * v2}


def energy_uj(stats, op: OperatingPoint) -> float:
    """CLUSTER energy of a run at the operating point, in microjoules."""
    return float(sum(energy_breakdown_uj(stats, op).values()))
