"""The report's plotly figures. Each takes enriched rows (report/analysis.py) and returns a Figure."""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

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


LOG_STEPS = ((1,), (1, 2, 5), (1, 1.5, 2, 3, 5, 7))  # mantissas per decade, coarsest first
MIN_TICKS = 3  # an axis with fewer labelled ticks cannot be read (a narrow cost range showed two)


def log_ticks(values: list[float]) -> list[float]:
    """Tick values for a log axis over ``values``: the decades (1, 10, 100, ...) it spans when that gives
    MIN_TICKS, else 1, 2 and 5 times each decade, else 1, 1.5, 2, 3, 5 and 7 times (a span of less than a
    factor of ten), so an axis never reads "2 3 ... 10 2 3" and always has a few labelled ticks."""
    lo, hi = min(values), max(values)
    # 10.0**309 overflows (OverflowError): no tick above the largest finite decade
    first, last = math.floor(math.log10(lo)), min(math.ceil(math.log10(hi)), 308)
    inside: list[float] = []
    for steps in LOG_STEPS:
        if steps == (1,) and last - first <= 2:
            continue
        ticks = [round(m * 10.0**e, 12) for e in range(first, last + 1) for m in steps]
        inside = [t for t in ticks if lo / 1.5 <= t <= hi * 1.5]
        if len(inside) >= MIN_TICKS:
            return inside
    return inside


def _tick_text(t: float) -> str:
    return f"{t:,.0f}" if t >= 1 else f"{t:g}"


def _log_axis(fig: go.Figure, axis: str, values: list[float]) -> None:
    ticks = log_ticks(values)
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(type="log", tickmode="array", tickvals=ticks, ticktext=[_tick_text(t) for t in ticks])


def _layout(fig: go.Figure, title: str, x: str, y: str, log_x: bool = False) -> go.Figure:
    """Title top left, legend to the right of the plot (never over the title or the axes). No width: a
    figure takes its container's (the page is responsive). Empty axis titles leave a faceted figure's
    own (_facets) as they are."""
    fig.update_layout(
        title={"text": title, "x": 0.0, "xanchor": "left", "y": 0.97, "yanchor": "top"},
        template="plotly_white",
        height=480,
        legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1.0, "yanchor": "top"},
        margin={"t": MARGIN_TOP, "b": MARGIN_BOTTOM, "r": 40},
    )
    if x:
        fig.update_layout(xaxis_title=x)
    if y:
        fig.update_layout(yaxis_title=y)
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


FACET_COLUMNS = 3  # networks side by side per row of panels (the report is 1,100 px wide)
MARGIN_TOP, MARGIN_BOTTOM = 70, 60  # px, as _layout sets them
TITLE_PX = 30  # a panel's title (one line of 14 px text) and the space around it
CHAR_PX = 6.5  # one character of a 12 px tick label, at most (plotly's default font)


def _facets(networks: list[str], title_y: str, title_x: str, panel_px: int, below_px: float) -> go.Figure:
    """One panel per network, every panel on one y scale (``shared_yaxes="all"``: a 1.16x must not
    fill a panel as a 1.8x fills the next), and between rows of panels room (px) for the tick labels
    and axis title below a panel (``below_px``) and the next panel's title, so none overlaps; the x
    axis title only under the lowest panel of each column. Heights in pixels, not fractions, so two
    rows of panels have the same room as one."""
    cols = min(FACET_COLUMNS, len(networks)) or 1
    rows = -(-len(networks) // cols) or 1
    gap = round(below_px + TITLE_PX)  # whole pixels: the page sizes the figure's box in px
    plot_px = rows * panel_px + (rows - 1) * gap
    fig = make_subplots(
        rows=rows,
        cols=cols,
        shared_yaxes="all",
        subplot_titles=networks,
        horizontal_spacing=0.04,
        vertical_spacing=gap / plot_px if rows > 1 else 0.0,
    )
    fig.update_layout(height=MARGIN_TOP + MARGIN_BOTTOM + plot_px)
    fig.update_yaxes(title_text=title_y, col=1)
    for i in range(len(networks)):
        if i + cols >= len(networks):  # nothing below this panel: its column's x title goes here
            fig.update_xaxes(title_text=title_x, **_cell(i))
    return fig


def _cell(i: int) -> dict[str, int]:
    return {"row": i // FACET_COLUMNS + 1, "col": i % FACET_COLUMNS + 1}


def speedup_vs_gpus(rows: list[dict[str, Any]], suffix: str = "") -> go.Figure:
    """Speedup per optimizer (colour) against the GPU count, one panel per network in numeric order (and
    one dash per network), one marker per GPU type; the legend lists each optimizer once."""
    groups: dict[tuple, list] = {}
    for r in sorted(rows, key=lambda r: (r["optimizer"], network_order(r), r["gpu"])):
        # the baseline itself is the dotted 1x line, not three more legend entries
        if r.get("speedup") is not None and r["baseline"]["optimizer"] != r["optimizer"]:
            groups.setdefault((r["optimizer"], r["network"], r["gpu"]), []).append(r)
    colors = optimizer_colors(rows)
    networks = list(dict.fromkeys(_networks(rows)))
    dashes = _styles(networks, DASHES)
    markers = _styles(sorted({gpu for _, _, gpu in groups}), MARKERS)
    fig = _facets(networks, "speedup (x)", "GPUs", panel_px=260, below_px=45)
    shown: set[str] = set()
    for (opt, net, gpu), pts in groups.items():
        pts.sort(key=lambda r: r["world_size"])
        err = _error_bars(pts, "speedup", "")
        legend = f"{opt}" + (f" · {gpu}" if len(markers) > 1 else "")
        fig.add_trace(
            go.Scatter(
                x=[p["world_size"] for p in pts],
                y=[p["speedup"] for p in pts],
                mode="lines+markers",
                name=f"{opt} · {net}" + (f" · {gpu}" if len(markers) > 1 else ""),
                legendgroup=legend,
                showlegend=False,
                line={"color": colors[opt], "dash": dashes[net]},
                marker={"color": colors[opt], "symbol": markers[gpu], "size": 8},
                error_y=err and {**err, "color": colors[opt]},
                hovertemplate=f"{opt} · {net}<br>%{{x}} GPUs: %{{y:.2f}}x<extra></extra>",
            ),
            **_cell(networks.index(net)),
        )
        if legend not in shown:  # the legend names the optimizer once, not once per network panel
            fig.add_trace(
                go.Scatter(
                    x=[None],
                    y=[None],
                    mode="lines+markers",
                    name=legend,
                    legendgroup=legend,
                    line={"color": colors[opt]},
                    marker={"color": colors[opt], "symbol": markers[gpu], "size": 8},
                    showlegend=True,
                )
            )
            shown.add(legend)
    for i in range(len(networks)):
        fig.add_hline(y=1.0, line_dash="dot", line_color="grey", **_cell(i))
    gpus = " · ".join(markers)
    base = next((r["baseline"]["optimizer"] for r in rows if r.get("baseline")), "the baseline")
    height = fig.layout.height
    _layout(
        fig, f"Time-to-train speedup over {base} on the same cluster ({gpus}), per network{suffix}", "", ""
    )
    fig.update_layout(height=height)
    fig.update_xaxes(type="log")
    _gpu_ticks(fig, [r["world_size"] for r in rows])
    return fig


def breakdown_bars(rows: list[dict[str, Any]], gpu: str, suffix: str = "") -> go.Figure:
    """Where one iteration goes, per optimizer and GPU count, one panel per network (every network of the
    sweep, not only the recommended one's), the parts stacked in the phase colours of the timeline."""
    mine = [r for r in rows if r["gpu"] == gpu]
    networks = list(dict.fromkeys(_networks(mine)))
    labels_of = {
        net: sorted([r for r in mine if r["network"] == net], key=lambda r: (r["world_size"], r["optimizer"]))
        for net in networks
    }
    longest = max((len(f"{r['optimizer']} @ {r['world_size']}") for r in mine), default=0)
    # the bar labels stand at 90 degrees: a label's length is its height below the panel, then the title
    fig = _facets(
        networks, "ms per iteration", "optimizer @ GPUs", panel_px=300, below_px=longest * CHAR_PX + 35
    )
    for i, net in enumerate(networks):
        sel = labels_of[net]
        labels = [f"{r['optimizer']} @ {r['world_size']}" for r in sel]
        for key, name, phase in PARTS:
            fig.add_trace(
                go.Bar(
                    x=labels,
                    y=[1e3 * (r.get(key) or 0.0) for r in sel],
                    name=name,
                    legendgroup=name,
                    showlegend=i == 0,
                    marker_color=PHASE_COLORS.get(phase, IDLE_COLOR),
                ),
                **_cell(i),
            )
    fig.update_layout(barmode="stack")
    height = fig.layout.height
    _layout(fig, f"Where one iteration goes ({gpu}), per network{suffix}", "", "")
    # the lowest row's bar labels and x title below the plot area, and the eight parts of the legend
    bottom = round(longest * CHAR_PX + 40)
    fig.update_layout(height=height - MARGIN_BOTTOM + bottom, margin={"b": bottom})
    fig.update_xaxes(tickangle=-90)
    return fig


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
    """Every configuration: colour per optimizer, marker symbol per network, each with its legend entry
    (clicking an optimizer's hides its points); the Pareto frontier's points are numbered as in the
    report's table (labels inside the plot, none overlapping, drawn over the recommended star), and
    every point names its cluster on hover (always-on GPU counts beside every point overlapped into
    an unreadable cloud). Both axes logarithmic, ticked at decades."""
    fig = go.Figure()
    colors = optimizer_colors(rows)
    networks = list(dict.fromkeys(_networks(rows)))
    symbols = _styles(networks, MARKERS)
    for opt in sorted({r["optimizer"] for r in rows}):
        for net in networks:
            pts = [r for r in rows if r["optimizer"] == opt and r["network"] == net]
            if not pts:
                continue
            err = _error_bars(pts, "ttt", "_h")
            cost_err = _error_bars(pts, "cost", "")
            fig.add_trace(
                go.Scatter(
                    x=[p["ttt_h"] for p in pts],
                    y=[p["cost"] for p in pts],
                    mode="markers",
                    name=f"{opt} · {net}",
                    legendgroup=opt,
                    showlegend=False,  # the legend keys colour (optimizer) and symbol (network) apart
                    marker={"color": colors[opt], "symbol": symbols[net], "size": 9},
                    customdata=[_point_label(p) for p in pts],
                    hovertemplate=f"{opt}<br>%{{customdata}}<br>%{{x:,.1f}} h, $%{{y:,.0f}}<extra></extra>",
                    error_x=err and {**err, "color": colors[opt]},
                    error_y=cost_err and {**cost_err, "color": colors[opt], "thickness": 1},
                )
            )
    for opt in sorted({r["optimizer"] for r in rows}):  # legend: one entry per optimizer (its colour)
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=opt,
                legendgroup=opt,
                marker={"color": colors[opt], "symbol": "circle", "size": 9},
            )
        )
    for net in networks:  # and one per network (its symbol)
        fig.add_trace(
            go.Scatter(
                x=[None],
                y=[None],
                mode="markers",
                name=net,
                legendgroup=f"network {net}",
                marker={"color": "grey", "symbol": symbols[net], "size": 9},
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
    basis = next((r.get("cost_basis", "") for r in rows), "")
    model = "owned" if basis.startswith("owned") else "rented" if basis.startswith("rented") else ""
    fig = _layout(
        fig,
        f"Cost ({model}, P10–P90) vs time to train{suffix}; hover a point for its cluster",
        "time to train (h)",
        "cost (USD)",
    )
    xs = [r["ttt_h"] for r in rows] + [r.get("ttt_p90_h", r["ttt_h"]) for r in rows]
    xs += [r.get("ttt_p10_h", r["ttt_h"]) for r in rows]
    ys = [r["cost"] for r in rows] + [r.get("cost_p10", r["cost"]) for r in rows]
    ys += [r.get("cost_p90", r["cost"]) for r in rows]
    _log_axis(fig, "x", xs)
    _log_axis(fig, "y", ys)
    # room above and right of the highest and rightmost points, so every label is inside the plot, and
    # every tick inside the range
    xt, yt = log_ticks(xs), log_ticks(ys)
    fig.update_xaxes(
        range=[
            min(math.log10(min(xs)) - 0.05, math.log10(xt[0]) - 0.01),
            max(math.log10(max(xs)) + 0.15, math.log10(xt[-1]) + 0.01),
        ]
    )
    fig.update_yaxes(
        range=[
            min(math.log10(min(ys)) - 0.05, math.log10(yt[0]) - 0.01),
            max(math.log10(max(ys)) + 0.12, math.log10(yt[-1]) + 0.01),
        ]
    )
    return fig
