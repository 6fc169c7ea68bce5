"""Timeline picture of a simulator trace (any target), like the execution figures of the
DPUV3INT8 paper.

:func:`trace_to_png` reads a Chrome/Perfetto trace written by the simulator (``tvmc run --trace``,
:func:`tvm_accel.profiler.profiling`; possibly several runs appended) and draws one horizontal
lane per busy unit (track) with one bar per instruction, coloured by instruction kind: the DPU's
LOAD to FM blue, LOAD to PM black, CONV purple, MAXPOOL green, ELTADD yellow, SAVE light purple
(the colours of the paper's Fig. 9-15); kinds of other targets (VTA's GEMM, MARSELLUS's RBE
jobs) get colours from a qualitative palette. The x axis is time in microseconds.
``tvmc timeline PACKAGE`` runs a compiled package once and writes the trace and the picture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tvm_accel.errors import AccelError
from tvm_accel.profiler import LAYER_CATEGORY

#: colours of the paper's timelines (LOAD FM light blue, LOAD PM black, CONV purple, pool green,
#: element-wise yellow, SAVE light purple)
KIND_COLORS = {
    "LOAD FM": "#4fa3e0",
    "LOAD PM": "#000000",
    "CONV": "#7b2d8e",
    "CONV DW": "#b04fc4",
    "MAXPOOL": "#2ca02c",
    "AVGPOOL": "#7fbf3f",
    "ELTADD": "#f2c500",
    "ELTMUL": "#e8e000",
    "UPSAMPLE": "#e08a00",
    "COPY": "#c9a227",
    "SAVE": "#d7a6e8",
    "NOP": "#b0b0b0",
}
#: lane order (top to bottom) for the DPU units; other tracks follow in trace order
LANE_ORDER = ("LOAD", "CONV", "MISC", "SAVE")


def _load_events(path: str | Path) -> tuple[list[dict], dict[tuple, str], list[dict]]:
    """The instruction events, the units' names and the layer spans of a trace."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise AccelError(f"{path}: cannot read trace: {e}") from None
    except json.JSONDecodeError as e:
        raise AccelError(f"{path}: not a JSON trace: {e.msg} at line {e.lineno}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise AccelError(f"{path}: no traceEvents list (not a Chrome trace)")
    names: dict[tuple, str] = {}
    xs: list[dict] = []
    layers: list[dict] = []
    for ev in events:
        if not isinstance(ev, dict):
            continue
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[(ev.get("pid"), ev.get("tid"))] = str(ev.get("args", {}).get("name",
                                                                                ev.get("tid")))
        elif ev.get("ph") == "X" and isinstance(ev.get("ts"), (int, float)) \
                and isinstance(ev.get("dur"), (int, float)):
            (layers if ev.get("cat") == LAYER_CATEGORY else xs).append(ev)
    return xs, names, layers


def layer_marks(layers: list[dict]) -> list[tuple[float, float, str]]:
    """``(start, middle, name)`` of each layer span (``tvmc run --trace``'s "layers" track),
    in time order: where the timeline draws a boundary and writes the layer's name."""
    spans = sorted(layers, key=lambda e: e["ts"])
    return [(float(e["ts"]), float(e["ts"]) + float(e["dur"]) / 2, str(e.get("name", "?")))
            for e in spans]


def lanes(xs: list[dict], names: dict[tuple, str]) -> list[tuple]:
    """The ``(pid, tid)`` units that ran an instruction, top to bottom: the DPU's units in
    :data:`LANE_ORDER`, others in trace order. A unit that stayed idle gets no lane."""
    tracks: list[tuple] = []
    for e in xs:
        key = (e.get("pid"), e.get("tid"))
        if key not in tracks:
            tracks.append(key)
    order = {n: i for i, n in enumerate(LANE_ORDER)}
    first = {k: i for i, k in enumerate(tracks)}
    return sorted(tracks, key=lambda k: (order.get(names.get(k, ""), len(order)), first[k]))


def kind_colors(kinds) -> dict[str, Any]:
    """A colour per instruction kind: the paper's for the DPU's kinds, then distinct hues for
    other targets' kinds (tab20's ten dark hues before their light twins, so RBE and DMA never
    get two shades of one blue)."""
    import matplotlib.pyplot as plt

    # "tab20" is a ListedColormap; the registry lookup is typed as the base Colormap
    tab20 = plt.get_cmap("tab20").colors  # type: ignore[attr-defined]
    palette = [*tab20[0::2], *tab20[1::2]]
    extra = [k for k in sorted(kinds) if k not in KIND_COLORS]
    color: dict[str, Any] = dict(KIND_COLORS)
    color.update({k: palette[i % len(palette)] for i, k in enumerate(extra)})
    return color


def trace_to_png(trace_json_path: str | Path, png_path: str | Path, title: str | None = None,
                 width_in: float = 14.0) -> Path:
    """Draw the trace as a PNG timeline (one lane per unit, one colour per instruction kind).

    Bars shorter than 1/2000 of the time span are widened to that so every instruction stays
    visible. The layers' spans of the trace (its "layers" track) are marked: a dashed line
    where each layer starts, its name above the plot. Returns the PNG path.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    xs, names, layers = _load_events(trace_json_path)
    if not xs:
        raise AccelError(f"{trace_json_path}: the trace has no instruction events to draw")
    tracks = lanes(xs, names)
    label = {k: names.get(k, f"track {k[1]}") for k in tracks}
    lane = {k: i for i, k in enumerate(tracks)}

    t0 = min(e["ts"] for e in xs)
    t1 = max(e["ts"] + e["dur"] for e in xs)
    min_w = max(t1 - t0, 1e-9) / 2000.0
    kinds: dict[str, dict[int, list]] = {}
    for e in xs:
        kinds.setdefault(str(e.get("name", "?")), {}).setdefault(
            lane[(e.get("pid"), e.get("tid"))], []).append((e["ts"], max(e["dur"], min_w)))

    extra = [k for k in sorted(kinds) if k not in KIND_COLORS]
    color = kind_colors(kinds)

    marks = layer_marks(layers)
    label_in = 0.075 * max((len(n) for _, _, n in marks), default=0)  # names above the plot
    fig, ax = plt.subplots(figsize=(width_in, 1.0 + 0.6 * len(tracks) + label_in))
    for kind, per_lane in kinds.items():
        for ln, bars in per_lane.items():
            ax.broken_barh(bars, (ln - 0.4, 0.8), facecolors=color[kind], edgecolor="white",
                           linewidth=0.3)
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([label[k] for k in tracks])
    ax.invert_yaxis()
    ax.set_xlim(t0, t1 + (t1 - t0) * 0.01 + 1e-9)
    ax.set_xlabel("time (us)")
    ax.grid(axis="x", alpha=0.3)
    for start, _, _ in marks:  # layer boundaries, the names above the plot
        ax.axvline(start, color="0.35", linewidth=0.6, linestyle="--", zorder=0)
    if marks:
        top = ax.secondary_xaxis("top")
        top.set_xticks([m for _, m, _ in marks], labels=[n for _, _, n in marks], rotation=90,
                       fontsize="x-small")
        top.tick_params(length=0)
    ax.set_title(title or Path(trace_json_path).name, pad=6 + 72 * label_in)
    shown = [k for k in list(KIND_COLORS) + extra if k in kinds]
    legend_in = 0.25 * -(-len(shown) // 8) + 0.15  # its rows, below the time axis
    fig.set_figheight(fig.get_figheight() + legend_in)
    fig.legend(handles=[Patch(color=color[k], label=k) for k in shown], loc="lower center",
               ncol=min(len(shown), 8), fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, legend_in / fig.get_figheight(), 1, 1))
    out = Path(png_path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
