"""The report's speedup, breakdown and cost figures read on their own: a panel per network, a legend
entry per optimizer, a few labelled ticks on every axis, every point named."""

from __future__ import annotations

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
    points = [t for t in fig.data if t.mode == "markers+text"]
    assert points and all(list(t.text) == [str(x) for x in _gpus_of(rows, t.name)] for t in points)
    assert all(t.error_y.arrayminus is not None for t in points)  # the cost's P10-P90
    assert "owned" in fig.layout.title.text


def _gpus_of(rows, opt):
    return [r["world_size"] for r in rows if r["optimizer"] == opt]


def test_log_ticks_on_a_narrow_span_use_finer_mantissas():
    assert figures.log_ticks([784, 1371]) == [700, 1000, 1500, 2000]
    assert figures.log_ticks([1.3, 40]) == [1, 2, 5, 10, 20, 50]  # as before on wider spans
    assert figures.log_ticks([0.5, 3000]) == [1, 10, 100, 1000]
