"""The report's plotly figures. Each takes enriched rows (report/analysis.py) and returns a Figure."""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from clustersim.identifiers import Stream
from clustersim.report.analysis import network_order, pareto

# One colour per phase of an iteration, the same in the breakdown bars and in the timeline.
PHASE_COLORS = {
    "forward": "#4C78A8",
    "backward": "#72B7B2",
    "communication": "#F58518",
    "compression": "#E45756",
    "optimizer": "#54A24B",
    "other": "#B279A2",
    "host": "#9D755D",
    "transfer": "#BAB0AC",
}
PARTS = [  # (row key, label, phase colour)
    ("forward_s", "forward", "forward"),
    ("backward_s", "backward", "backward"),
    ("compression_s", "compression kernels", "compression"),
    ("optimizer_s", "optimizer", "optimizer"),
    ("other_s", "other", "other"),
    ("exposed_communication_s", "exposed communication", "communication"),
    ("exposed_host_s", "exposed host", "host"),  # absent from folders begun before it: 0
    ("idle_s", "idle (pipeline bubbles)", "idle"),
]
IDLE_COLOR = "#DDDDDD"  # the breakdown's idle part; not an op category of the timeline
# One colour per optimizer, one line dash per network, one marker per GPU type, in every figure.
OPTIMIZER_PALETTE = ["#1F77B4", "#D62728", "#2CA02C", "#9467BD", "#FF7F0E", "#8C564B", "#E377C2", "#17BECF"]
DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
MARKERS = ["circle", "square", "diamond", "triangle-up", "x", "cross"]
STREAM_ORDER = list(Stream)  # one row per stream, in the order they are declared
GIB = 2**30


def optimizer_colors(rows: list[dict[str, Any]]) -> dict[str, str]:
    """A distinct colour for each optimizer in the rows (sorted by name, so stable across figures)."""
    names = sorted({r["optimizer"] for r in rows})
    if len(names) > len(OPTIMIZER_PALETTE):  # more optimizers than the palette: evenly spaced hues
        return {n: f"hsl({round(360 * i / len(names))}, 65%, 45%)" for i, n in enumerate(names)}
    return dict(zip(names, OPTIMIZER_PALETTE))


def _styles(values: list[str], styles: list[str]) -> dict[str, str]:
    """One style per value, in the order given (networks slowest first, so legends read 25, 50, 100)."""
    return {v: styles[i % len(styles)] for i, v in enumerate(dict.fromkeys(values))}


def _networks(rows: list[dict[str, Any]]) -> list[str]:
    """Network labels in numeric order of their rate."""
    return [r["network"] for r in sorted(rows, key=network_order)]


def log_ticks(values: list[float]) -> list[float]:
    """Tick values for a log axis over ``values``: the decades (1, 10, 100, ...) it spans, plus 2 and 5
    times each when it spans less than two decades, so an axis never reads "2 3 ... 10 2 3" and never
    has fewer than two ticks."""
    lo, hi = min(values), max(values)
    # 10.0**309 overflows (OverflowError): no tick above the largest finite decade
    first, last = math.floor(math.log10(lo)), min(math.ceil(math.log10(hi)), 308)
    steps = (1,) if last - first > 2 else (1, 2, 5)
    ticks = [m * 10.0**e for e in range(first, last + 1) for m in steps]
    inside = [t for t in ticks if lo / 1.5 <= t <= hi * 1.5]
    return inside if len(inside) >= 2 else ticks


def _tick_text(t: float) -> str:
    return f"{t:,.0f}" if t >= 1 else f"{t:g}"


def _log_axis(fig: go.Figure, axis: str, values: list[float]) -> None:
    ticks = log_ticks(values)
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(type="log", tickmode="array", tickvals=ticks, ticktext=[_tick_text(t) for t in ticks])


def _layout(fig: go.Figure, title: str, x: str, y: str, log_x: bool = False) -> go.Figure:
    """Title top left, legend to the right of the plot (never over the title or the axes)."""
    fig.update_layout(
        title={"text": title, "x": 0.0, "xanchor": "left", "y": 0.97, "yanchor": "top"},
        xaxis_title=x,
        yaxis_title=y,
        template="plotly_white",
        height=480,
        legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1.0, "yanchor": "top"},
        margin={"t": 70, "b": 60, "r": 40},
    )
    if log_x:
        fig.update_xaxes(type="log")
    return fig


def _gpu_ticks(fig: go.Figure, counts) -> None:
    """x-axis ticks exactly at the swept GPU counts."""
    ticks = sorted(set(counts))
    fig.update_xaxes(tickmode="array", tickvals=ticks, ticktext=[str(t) for t in ticks])


def _error_bars(pts: list[dict[str, Any]], key: str, unit: str = "") -> dict | None:
    """Asymmetric P10-P90 error bars for ``key`` (e.g. ``speedup``, ``ttt`` with unit ``_h``) when every
    point has its band, else none."""
    mid, lo, hi = f"{key}{unit}", f"{key}_p10{unit}", f"{key}_p90{unit}"
    if not all(lo in p for p in pts):
        return None
    return {
        "type": "data",
        "symmetric": False,
        "array": [p[hi] - p[mid] for p in pts],
        "arrayminus": [p[mid] - p[lo] for p in pts],
    }


def speedup_vs_gpus(rows: list[dict[str, Any]], suffix: str = "") -> go.Figure:
    """Speedup per optimizer (colour), network (dash) and GPU type (marker) against the GPU count;
    legend entries by optimizer, then network in numeric order."""
    fig = go.Figure()
    groups: dict[tuple, list] = {}
    for r in sorted(rows, key=lambda r: (r["optimizer"], network_order(r), r["gpu"])):
        # the baseline itself is the dotted 1x line, not three more legend entries
        if r.get("speedup") is not None and r["baseline"]["optimizer"] != r["optimizer"]:
            groups.setdefault((r["optimizer"], r["network"], r["gpu"]), []).append(r)
    colors = optimizer_colors(rows)
    dashes = _styles(_networks(rows), DASHES)
    markers = _styles(sorted({gpu for _, _, gpu in groups}), MARKERS)
    for (opt, net, gpu), pts in groups.items():
        pts.sort(key=lambda r: r["world_size"])
        err = _error_bars(pts, "speedup", "")
        fig.add_trace(
            go.Scatter(
                x=[p["world_size"] for p in pts],
                y=[p["speedup"] for p in pts],
                mode="lines+markers",
                name=f"{opt} · {net}" + (f" · {gpu}" if len(markers) > 1 else ""),
                legendgroup=opt,
                line={"color": colors[opt], "dash": dashes[net]},
                marker={"color": colors[opt], "symbol": markers[gpu], "size": 8},
                error_y=err and {**err, "color": colors[opt]},
            )
        )
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    gpus = " · ".join(markers)
    base = next((r["baseline"]["optimizer"] for r in rows if r.get("baseline")), "the baseline")
    _layout(
        fig,
        f"Time-to-train speedup over {base} on the same cluster ({gpus}){suffix}",
        "GPUs",
        "speedup (x)",
        log_x=True,
    )
    _gpu_ticks(fig, [r["world_size"] for r in rows])
    return fig


def breakdown_bars(rows: list[dict[str, Any]], network: str, gpu: str, suffix: str = "") -> go.Figure:
    sel = sorted(
        [r for r in rows if r["network"] == network and r["gpu"] == gpu],
        key=lambda r: (r["world_size"], r["optimizer"]),
    )
    labels = [f"{r['optimizer']} @ {r['world_size']}" for r in sel]
    fig = go.Figure()
    for key, name, phase in PARTS:
        fig.add_trace(
            go.Bar(
                x=labels,
                y=[1e3 * (r.get(key) or 0.0) for r in sel],
                name=name,
                marker_color=PHASE_COLORS.get(phase, IDLE_COLOR),
            )
        )
    fig.update_layout(barmode="stack")
    return _layout(
        fig, f"Where one iteration goes ({gpu}, {network}){suffix}", "optimizer @ GPUs", "ms per iteration"
    )


def timeline(result, label: str | None = None) -> go.Figure:
    """Gantt chart of one simulated iteration, one row per stream, one colour per phase (as in the
    breakdown). Ops are drawn without outlines, so short forward/backward layers stay visible; the hover
    names each op with its start and end."""
    fig = go.Figure()
    ops = [o for o in result.ops if o.end > o.start]
    for cat, color in PHASE_COLORS.items():
        mine = [o for o in ops if o.category == cat]
        if not mine:
            continue
        fig.add_trace(
            go.Bar(
                y=[o.stream for o in mine],
                x=[1e3 * (o.end - o.start) for o in mine],
                base=[1e3 * o.start for o in mine],
                orientation="h",
                name=cat,
                marker={"color": color, "line": {"width": 0}},
                width=0.7,
                hovertext=[f"{o.name}: {1e3 * o.start:,.2f}–{1e3 * o.end:,.2f} ms" for o in mine],
                hoverinfo="text",
            )
        )
    streams = [s for s in STREAM_ORDER if any(o.stream == s for o in ops)]
    streams += sorted({o.stream for o in ops} - set(streams))
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(streams)))
    fig.update_layout(barmode="overlay", bargap=0.25)
    return _layout(
        fig,
        f"One iteration: {label or f'{result.optimizer} on {result.world_size} GPUs ({result.scenario})'}",
        "time (ms)",
        "stream",
    )


def bytes_on_wire(rows: list[dict[str, Any]], network: str, gpu: str, suffix: str = "") -> go.Figure:
    sel = [r for r in rows if r["network"] == network and r["gpu"] == gpu]
    colors = optimizer_colors(rows)
    fig = go.Figure()
    for opt in sorted({r["optimizer"] for r in sel}):
        pts = sorted([r for r in sel if r["optimizer"] == opt], key=lambda r: r["world_size"])
        fig.add_trace(
            go.Bar(
                x=[str(p["world_size"]) for p in pts],
                y=[p["inter_node_bytes"] / GIB for p in pts],
                name=f"{opt} (inter-node)",
                marker_color=colors[opt],
            )
        )
    fig.update_layout(barmode="group")
    return _layout(
        fig,
        f"Bytes each node sends over the network per step ({gpu}, {network}){suffix}",
        "GPUs",
        "GiB per step",
    )


def _point_label(r: dict[str, Any]) -> str:
    return f"{r['world_size']}×{r['gpu']}, {r['network']}"


LABEL_GAP = 0.06  # of each log axis's span: closer Pareto labels would overlap (10 px text, 480 px plot)


def pareto_labels(front: list[dict[str, Any]]) -> list[str]:
    """The frontier's labels: its number in the report's Pareto table, left out for a point closer than
    LABEL_GAP (in both log axes) to one already labelled, so no two labels overlap."""
    xs = [math.log10(p["ttt_h"]) for p in front]
    ys = [math.log10(p["cost"]) for p in front]
    dx = max(max(xs) - min(xs), 1e-9) * LABEL_GAP
    dy = max(max(ys) - min(ys), 1e-9) * LABEL_GAP
    kept: list[int] = []
    out = []
    for i in range(len(front)):
        clash = any(abs(xs[i] - xs[j]) < dx and abs(ys[i] - ys[j]) < dy for j in kept)
        out.append("" if clash else str(i + 1))
        if not clash:
            kept.append(i)
    return out


def cost_vs_time(rows: list[dict[str, Any]], chosen: dict | None, suffix: str = "") -> go.Figure:
    """Every configuration (colour: optimizer); the Pareto frontier's points are numbered as in the
    report's table (labels inside the plot, none overlapping, drawn over the recommended star), and
    every point names its cluster on hover. Both axes logarithmic, ticked at decades."""
    fig = go.Figure()
    colors = optimizer_colors(rows)
    for opt in sorted({r["optimizer"] for r in rows}):
        pts = [r for r in rows if r["optimizer"] == opt]
        err = _error_bars(pts, "ttt", "_h")
        fig.add_trace(
            go.Scatter(
                x=[p["ttt_h"] for p in pts],
                y=[p["cost"] for p in pts],
                mode="markers",
                name=opt,
                marker={"color": colors[opt], "size": 8},
                text=[_point_label(p) for p in pts],
                hovertemplate=f"{opt}<br>%{{text}}<br>%{{x:,.1f}} h, $%{{y:,.0f}}<extra></extra>",
                error_x=err and {**err, "color": colors[opt]},
            )
        )
    if chosen is not None:
        fig.add_trace(
            go.Scatter(
                x=[chosen["ttt_h"]],
                y=[chosen["cost"]],
                mode="markers",
                name="recommended",
                marker={
                    "size": 16,
                    "symbol": "star",
                    "color": "gold",
                    "line": {"color": "black", "width": 1},
                },
            )
        )
    front = pareto(rows)
    fig.add_trace(
        go.Scatter(
            x=[p["ttt_h"] for p in front],
            y=[p["cost"] for p in front],
            mode="lines",
            name="Pareto frontier (# as in the table)",
            line={"color": "black", "dash": "dash"},
            hoverinfo="skip",
        )
    )
    for p, label in zip(front, pareto_labels(front)):
        if label:  # a boxed number above the other markers; plotly places log-axis annotations in log10
            fig.add_annotation(
                x=math.log10(p["ttt_h"]),
                y=math.log10(p["cost"]),
                text=label,
                showarrow=True,
                arrowhead=0,
                arrowwidth=1,
                ax=14,
                ay=-18,
                bgcolor="white",
                bordercolor="black",
                borderwidth=1,
                borderpad=1,
                font={"size": 11},
                name="pareto-label",
            )
    fig = _layout(fig, f"Cost vs time to train{suffix}", "time to train (h)", "cost (USD)")
    xs = [r["ttt_h"] for r in rows] + [r.get("ttt_p90_h", r["ttt_h"]) for r in rows]
    xs += [r.get("ttt_p10_h", r["ttt_h"]) for r in rows]
    ys = [r["cost"] for r in rows]
    _log_axis(fig, "x", xs)
    _log_axis(fig, "y", ys)
    # room above and right of the highest and rightmost points, so every label is inside the plot
    fig.update_xaxes(range=[math.log10(min(xs)) - 0.05, math.log10(max(xs)) + 0.15])
    fig.update_yaxes(range=[math.log10(min(ys)) - 0.05, math.log10(max(ys)) + 0.12])
    return fig
