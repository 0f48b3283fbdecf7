"""The report's plotly figures. Each takes enriched rows (report/analysis.py) and returns a Figure."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from clustersim.identifiers import Stream
from clustersim.report.analysis import pareto

PARTS = [
    ("forward_s", "forward"),
    ("backward_s", "backward"),
    ("compression_s", "compression kernels"),
    ("optimizer_s", "optimizer"),
    ("other_s", "other"),
    ("exposed_communication_s", "exposed communication"),
]
STREAM_ORDER = list(Stream)  # one row per stream, in the order they are declared


def _layout(fig: go.Figure, title: str, x: str, y: str, log_x: bool = False) -> go.Figure:
    fig.update_layout(
        title=title,
        xaxis_title=x,
        yaxis_title=y,
        template="plotly_white",
        height=470,
        legend={"orientation": "h", "y": -0.32, "yanchor": "top"},
        margin={"t": 60, "b": 150},
    )
    if log_x:
        fig.update_xaxes(type="log")
    return fig


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


def speedup_vs_gpus(rows: list[dict[str, Any]]) -> go.Figure:
    fig = go.Figure()
    groups: dict[tuple, list] = {}
    for r in rows:
        if r.get("speedup") is not None:
            groups.setdefault((r["optimizer"], r["network"], r["gpu"]), []).append(r)
    for (opt, net, gpu), pts in sorted(groups.items()):
        pts.sort(key=lambda r: r["world_size"])
        err = _error_bars(pts, "speedup", "")
        fig.add_trace(
            go.Scatter(
                x=[p["world_size"] for p in pts],
                y=[p["speedup"] for p in pts],
                mode="lines+markers",
                name=f"{opt} · {net} · {gpu}",
                error_y=err,
            )
        )
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    return _layout(
        fig,
        "Time-to-train speedup over the baseline optimizer on the same cluster",
        "GPUs",
        "speedup (x)",
        log_x=True,
    )


def breakdown_bars(rows: list[dict[str, Any]], network: str, gpu: str) -> go.Figure:
    sel = sorted(
        [r for r in rows if r["network"] == network and r["gpu"] == gpu],
        key=lambda r: (r["world_size"], r["optimizer"]),
    )
    labels = [f"{r['optimizer']} @ {r['world_size']}" for r in sel]
    fig = go.Figure()
    for key, name in PARTS:
        fig.add_trace(go.Bar(x=labels, y=[1e3 * (r.get(key) or 0.0) for r in sel], name=name))
    fig.update_layout(barmode="stack")
    return _layout(
        fig, f"Where one iteration goes ({gpu}, {network})", "optimizer @ GPUs", "ms per iteration"
    )


def timeline(result) -> go.Figure:
    """Gantt chart of one simulated iteration, one row per stream."""
    fig = go.Figure()
    colors = {
        "forward": "#4C78A8",
        "backward": "#72B7B2",
        "communication": "#F58518",
        "compression": "#E45756",
        "optimizer": "#54A24B",
        "other": "#B279A2",
        "host": "#9D755D",
        "transfer": "#BAB0AC",
    }
    ops = [o for o in result.ops if o.end > o.start]
    for cat in colors:
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
                marker_color=colors[cat],
                hovertext=[o.name for o in mine],
            )
        )
    streams = [s for s in STREAM_ORDER if any(o.stream == s for o in ops)]
    streams += sorted({o.stream for o in ops} - set(streams))
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(streams)))
    fig.update_layout(barmode="overlay")
    return _layout(
        fig,
        f"One iteration: {result.optimizer} on {result.world_size} GPUs ({result.scenario})",
        "time (ms)",
        "stream",
    )


def bytes_on_wire(rows: list[dict[str, Any]], network: str, gpu: str) -> go.Figure:
    sel = [r for r in rows if r["network"] == network and r["gpu"] == gpu]
    fig = go.Figure()
    for opt in sorted({r["optimizer"] for r in sel}):
        pts = sorted([r for r in sel if r["optimizer"] == opt], key=lambda r: r["world_size"])
        fig.add_trace(
            go.Bar(
                x=[str(p["world_size"]) for p in pts],
                y=[p["inter_node_bytes"] / 1e9 for p in pts],
                name=f"{opt} (inter-node)",
            )
        )
    fig.update_layout(barmode="group")
    return _layout(
        fig, f"Bytes each node sends over the network per step ({gpu}, {network})", "GPUs", "GB per step"
    )


def cost_vs_time(rows: list[dict[str, Any]], chosen: dict | None) -> go.Figure:
    fig = go.Figure()
    for opt in sorted({r["optimizer"] for r in rows}):
        pts = [r for r in rows if r["optimizer"] == opt]
        err = _error_bars(pts, "ttt", "_h")
        fig.add_trace(
            go.Scatter(
                x=[p["ttt_h"] for p in pts],
                y=[p["cost"] for p in pts],
                mode="markers",
                name=opt,
                text=[p["cluster"] for p in pts],
                hovertemplate="%{text}<br>%{x:.1f} h, $%{y:,.0f}",
                error_x=err,
            )
        )
    front = pareto(rows)
    fig.add_trace(
        go.Scatter(
            x=[p["ttt_h"] for p in front],
            y=[p["cost"] for p in front],
            mode="lines",
            name="Pareto frontier",
            line={"color": "black", "dash": "dash"},
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
    fig = _layout(fig, "Cost vs time to train", "time to train (h)", "cost (USD)", log_x=True)
    fig.update_yaxes(type="log")
    return fig
