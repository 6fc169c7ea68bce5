"""Pictures of the exploration verbs (matplotlib, Agg): a sweep's latency against its second
objective with the Pareto front marked, and a per-layer bar chart of several targets."""

from __future__ import annotations

from typing import Any


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def sweep_png(result: Any, path: str, title: str = "") -> None:
    """One panel per model: every measured point of :class:`~tvm_accel.explore.sweep.
    SweepResult` ``result`` at (second objective, latency), labelled with its point index; the
    Pareto points in red joined by the front's staircase; points that are not bit-exact as
    crosses."""
    plt = _pyplot()
    models = list(dict.fromkeys(r["model"] for r in result.rows))
    n = max(len(models), 1)
    fig, axes = plt.subplots(1, n, figsize=(max(7.0, 5.5 * n), 4.5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=False):
        obj = result.objective.get(model, "on-chip bytes")
        col, unit = (("energy_uj", "energy (uJ)") if obj == "energy" else
                     ("on_chip_bytes", "on-chip buffers (KiB)"))
        div = 1 if col == "energy_uj" else 1024
        rows = [r for r in result.rows if r["model"] == model and r["status"] == "ok"]
        rejected = sum(1 for r in result.rows if r["model"] == model and r["status"] != "ok")
        front = []
        for r in rows:
            x, y = float(r[col] or 0) / div, float(r["latency_us"])
            on = (r["point"], model) in result.pareto
            ax.scatter([x], [y], c="tab:red" if on else "tab:blue", s=40 if on else 22,
                       marker="o" if r["bit_exact"] != "false" else "x", zorder=3)
            ax.annotate(r["point"], (x, y), textcoords="offset points", xytext=(4, 3),
                        fontsize=7)
            if on:
                front.append((x, y))
        if front:
            front.sort()
            ax.step([p[0] for p in front], [p[1] for p in front], where="post",
                    c="tab:red", lw=1, label="Pareto front")
            ax.legend(fontsize=8)
        ax.set_xlabel(unit)
        ax.set_ylabel("latency (us)")
        ax.set_title(model + (f" ({rejected} point(s) rejected or failed)" if rejected
                              else ""), fontsize=9)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def layers_png(names: list[str], series: dict[str, list[float]], path: str,
               ylabel: str = "time (us)", title: str = "") -> None:
    """Grouped bars: one group per layer (``names``), one bar per series (a target), log
    scale; a layer a target leaves on the CPU has no bar."""
    plt = _pyplot()
    n = max(len(series), 1)
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(max(6.0, 0.1 * len(names) * n + 2), 4.5))
    for i, (label, values) in enumerate(series.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(names))]
        ax.bar(xs, [v if v > 0 else 0 for v in values], width, label=label)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=90, fontsize=6)
    ax.set_ylabel(ylabel)
    if any(v > 0 for vs in series.values() for v in vs):
        ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
