"""The report's speedup, breakdown and cost figures read on their own: a panel per network, a legend
entry per optimizer, a few labelled ticks on every axis, every point named."""

from __future__ import annotations

import re
from types import SimpleNamespace

from clustersim.report import figures

NETWORKS = [("ethernet_tcp", 25), ("ethernet_tcp", 100), ("infiniband", 100), ("infiniband", 200)]


def _rows():
    rows = []
    for kind, rate in NETWORKS:
        label = f"{'Ethernet' if kind == 'ethernet_tcp' else 'InfiniBand'} {rate} Gb/s"
        for gpus in (32, 64, 128):
            base = None
            for i, opt in enumerate(("adam", "onebit-adam", "zero-one-adam", "binsgdm")):
                r = {
                    "optimizer": opt,
                    "network": label,
                    "nic_kind": kind,
                    "nic_gbps": rate,
                    "gpu": "A100-40GB",
                    "world_size": gpus,
                    "ttt_h": 100.0 / (1 + i) * 32 / gpus,
                    "cost": 800.0 + 40 * i + gpus,  # a narrow cost range: $832-$1,048
                    "cost_p10": 700.0,
                    "cost_p90": 1300.0,
                    "cost_basis": "owned: ...",
                    "cluster": f"{gpus} x A100-40GB, {label}",
                    "samples_per_s": 1000.0,
                    "forward_s": 0.1,
                    "backward_s": 0.2,
                    "exposed_communication_s": 0.05 * (4 - i),
                }
                base = base or r
                r["baseline"] = base
                r["speedup"] = base["ttt_h"] / r["ttt_h"]
                rows.append(r)
    return rows


def test_speedup_has_a_panel_per_network_and_a_legend_entry_per_optimizer():
    """18 legend entries, Ethernet and InfiniBand lines on one another: now one panel per network, so
    Ethernet 100 and InfiniBand 100 never share axes, and three legend entries."""
    fig = figures.speedup_vs_gpus(_rows())
    legend = [t.name for t in fig.data if t.showlegend is not False]
    assert sorted(legend) == ["binsgdm", "onebit-adam", "zero-one-adam"]  # no network in a legend entry
    axes = {}
    for t in fig.data:
        if t.showlegend:  # the legend's own entries draw nothing
            continue
        axes.setdefault(t.name.split(" · ")[1], set()).add(t.xaxis)
    assert all(len(a) == 1 for a in axes.values()) and len({next(iter(a)) for a in axes.values()}) == 4
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:4] == [
        "Ethernet 25 Gb/s",
        "Ethernet 100 Gb/s",
        "InfiniBand 100 Gb/s",
        "InfiniBand 200 Gb/s",
    ]


def test_breakdown_shows_every_network():
    """The breakdown was drawn for the recommended network only."""
    fig = figures.breakdown_bars(_rows(), "A100-40GB")
    assert len({t.xaxis for t in fig.data}) == 4
    assert [a.text for a in fig.layout.annotations][:4] == [
        "Ethernet 25 Gb/s",
        "Ethernet 100 Gb/s",
        "InfiniBand 100 Gb/s",
        "InfiniBand 200 Gb/s",
    ]
    assert sum(1 for t in fig.data if t.showlegend is not False) == len(figures.PARTS)  # each part once


def test_cost_figure_has_readable_ticks_labelled_points_and_cost_bands():
    """The cost figure had two y ticks on a narrow range and points that said nothing without a hover."""
    rows = _rows()
    fig = figures.cost_vs_time(rows, rows[0])
    lo, hi = fig.layout.yaxis.range
    visible = [t for t in fig.layout.yaxis.tickvals if 10**lo <= t <= 10**hi]
    assert len(visible) >= 3, fig.layout.yaxis.tickvals
    points = [t for t in fig.data if t.showlegend is False]
    assert points and all(t.error_y.arrayminus is not None for t in points)  # the cost's P10-P90
    for t in points:  # every point names its cluster on hover
        opt, net = t.name.split(" · ")
        mine = [r for r in rows if r["optimizer"] == opt and r["network"] == net]
        assert list(t.customdata) == [f"{r['world_size']}×{r['gpu']}, {net}" for r in mine]
    assert "owned" in fig.layout.title.text


def _axes(fig, letter):
    return {k: v for k, v in fig.layout.to_plotly_json().items() if k.startswith(f"{letter}axis")}


def test_facet_panels_share_one_y_scale_across_rows():
    """Four networks: three panels in the first row, one in the second, whose y axis was its own
    (0.6-1.4 beside 0.5-2.5: a 1.16x looked as big as a 1.8x). Every panel's y axis matches one axis."""
    rows = _rows()
    for fig in (figures.speedup_vs_gpus(rows), figures.breakdown_bars(rows, "A100-40GB")):
        used = {"yaxis" + t.yaxis[1:] for t in fig.data if t.yaxis}
        ys = {k: v for k, v in _axes(fig, "y").items() if k in used}  # empty cells of the grid: no axes
        assert len(ys) == 4
        anchors = {v.get("matches") or "y" + k[len("yaxis") :] for k, v in ys.items()}
        assert len(anchors) == 1, ys  # one shared range: each matches the same axis (or is it)
        matched = anchors.pop()
        assert sum("matches" not in v for v in ys.values()) == 1 and matched.startswith("y")


def test_a_panel_title_has_room_below_the_panel_above():
    """The second row's "InfiniBand 200 Gb/s" lay over the first row's bar labels and "optimizer @ GPUs":
    the gap between rows holds the longest bar label (at 90 degrees) and the title; the x title is under
    the lowest panel of each column only."""
    rows = _rows()
    fig = figures.breakdown_bars(rows, "A100-40GB")
    axes = _axes(fig, "y")
    top_row, second_row = axes["yaxis"]["domain"], axes["yaxis4"]["domain"]
    plot_px = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    gap_px = (top_row[0] - second_row[1]) * plot_px
    longest = max(len(f"{r['optimizer']} @ {r['world_size']}") for r in rows)
    assert gap_px >= longest * figures.CHAR_PX + 30 + figures.TITLE_PX
    assert fig.layout.margin.b >= longest * figures.CHAR_PX + 30  # the lowest row's labels fit too
    assert {a.tickangle for a in fig.select_xaxes()} == {-90}
    four = ("xaxis", "xaxis2", "xaxis3", "xaxis4")  # the grid's two empty cells aside
    titled = {k: (v.get("title") or {}).get("text") for k, v in _axes(fig, "x").items() if k in four}
    # panels 1 (a panel below it), 2 and 3 (none below), 4 (the bottom row)
    assert titled == {
        "xaxis": None,
        "xaxis2": "optimizer @ GPUs",
        "xaxis3": "optimizer @ GPUs",
        "xaxis4": "optimizer @ GPUs",
    }
    speed = figures.speedup_vs_gpus(rows)
    assert (_axes(speed, "x")["xaxis"].get("title") or {}).get("text") is None
    assert _axes(speed, "x")["xaxis4"]["title"]["text"] == "GPUs"


def test_cost_points_have_a_symbol_and_a_legend_entry_per_network_and_no_always_on_labels():
    """The GPU count beside every point overlapped into an unreadable cloud and nothing told networks
    apart: a marker symbol per network, a legend entry per network and per optimizer, hover text."""
    rows = _rows()
    fig = figures.cost_vs_time(rows, rows[0])
    legend = [t.name for t in fig.data if t.showlegend is not False]
    networks = ["Ethernet 25 Gb/s", "Ethernet 100 Gb/s", "InfiniBand 100 Gb/s", "InfiniBand 200 Gb/s"]
    for name in ["adam", "binsgdm", "onebit-adam", "zero-one-adam", *networks]:
        assert legend.count(name) == 1, legend
    symbol = {t.name: t.marker.symbol for t in fig.data if t.name in networks}
    assert len(set(symbol.values())) == 4
    for t in fig.data:
        assert "text" not in (t.mode or "")  # no always-on labels; the Pareto numbers are annotations
        if t.showlegend is False:
            assert t.marker.symbol == symbol[t.name.split(" · ")[1]] and t.hovertemplate


def test_no_figure_is_wider_than_its_container():
    """At 800 px the page scrolled sideways: no figure sets a fixed width (plotly then takes the
    container's), and the page lets a wide table scroll inside itself."""
    from clustersim.report.build import _section_html

    rows = _rows()
    figs = {
        "speedup": figures.speedup_vs_gpus(rows),
        "breakdown": figures.breakdown_bars(rows, "A100-40GB"),
        "cost": figures.cost_vs_time(rows, rows[0]),
        "bytes": figures.bytes_on_wire(
            [r | {"inter_node_bytes": 2.0**30} for r in rows], "Ethernet 25 Gb/s", "A100-40GB"
        ),
    }
    assert all(f.layout.width is None and f.layout.autosize is not False for f in figs.values())
    section = SimpleNamespace(
        model="m", rows=rows, rec={"text": []}, figs=figs, table=[], hottest_links=None, checked=[]
    )
    page = _section_html(section, 1, False)
    # each figure's box: a height in px and the container's width, never a px width
    assert re.findall(r'style="height:\d+px; width:([^;"]*);"', page) == ["100%"] * 4
    assert not re.search(r"width:\s*\d+px", page)
    assert page.count('"responsive": true') == 4


def test_log_ticks_on_a_narrow_span_use_finer_mantissas():
    assert figures.log_ticks([784, 1371]) == [700, 1000, 1500, 2000]
    assert figures.log_ticks([1.3, 40]) == [1, 2, 5, 10, 20, 50]  # as before on wider spans
    assert figures.log_ticks([0.5, 3000]) == [1, 10, 100, 1000]
