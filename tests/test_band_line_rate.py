"""A drawn network is never faster than its wire: every draw of a band stops at the links' peak rates.

A calibrated collective's draw is a factor on its whole time (the fit's covariance, its scatter, and the
spread that grows past the measured sizes and node counts), so far past the measured node counts the
low draws would have the bytes cross the NICs faster than their line rate; an uncalibrated NIC's drawn
rate (log-sigma 0.20 about its effective rate) would exceed the line rate where the effective rate is
close to it, and an NVLink's (0.10) its catalog rate. Each draw now stops there
(collectives.CollectiveModel.floor, Cluster.peak_ratio); the nominal predictions do not move.
"""

import json
import pickle
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from clustersim.calibration.fit import build_profile
from clustersim.calibration.network_fit import measured_cluster
from clustersim.calibration.profile import parse_profile
from clustersim.cost_models.collectives import CollectiveModel
from clustersim.cost_models.network_params import DEFAULT, NetworkParams
from clustersim.scenario import load_scenario
from clustersim.simulator.context import build_context
from clustersim.simulator.context import network_params as params_of
from clustersim.simulator.program import CollectiveSpec
from clustersim.simulator.uncertainty import Interval, collective_interval, perturbations, quasi_normals
from clustersim.topologies.cluster import GroupShape, build_cluster

SWEEP = (
    Path(__file__).resolve().parents[1] / "clustersim" / "validation" / "testbed" / "gloo-8hosts-200mbit.json"
)
MiB = 2**20


@pytest.fixture(scope="module")
def fitted():
    """The shipped 200 Mb/s gloo sweep fitted on its 2- and 4-host groups (as test_node_band's), and its
    testbed cluster: its fitted ring runs at 95% of the 0.2 Gb/s line rate, so a draw 5% fast beats it."""
    raw = json.loads(SWEEP.read_text())
    data = build_profile({**raw, "collectives": [r for r in raw["collectives"] if r["nodes"] < 8]})
    data["collectives"] = []
    return params_of(parse_profile(data, "p.json"), "p.json"), measured_cluster(raw)


def _draws(params: NetworkParams, cluster, op: str, nbytes: float, shape: GroupShape, n=64) -> list[float]:
    classes = CollectiveModel(cluster).classes(shape)
    z = quasi_normals(n, params.dimensions(classes))
    return [
        CollectiveModel(cluster, None, p).cost(op, nbytes, shape).time
        for p in params.from_normals(z, classes)
    ]


def _line_rate(spec) -> float:
    """Bytes/s one node's NICs move at their line rate."""
    return spec.nic.count * spec.nic.line_rate_gbps * 1e9 / 8


@pytest.mark.parametrize("nodes", [8, 64, 1024])
@pytest.mark.parametrize("op", ["all_reduce", "all_gather"])
def test_calibrated_draws_far_past_the_measured_nodes_never_beat_the_line_rate(fitted, nodes, op):
    params, spec = fitted
    cl = build_cluster(spec.model_copy(update={"nodes": nodes}))
    shape, S = GroupShape(nodes, 1), 8 * MiB
    # the fit runs gloo's ring: each node sends 2(N-1)/N S (all-reduce), (N-1)/N S (all-gather of S)
    sent = (2 if op == "all_reduce" else 1) * (nodes - 1) / nodes * S
    wire = sent / _line_rate(cl.spec)
    nominal = CollectiveModel(cl, None, params).cost(op, S, shape).time
    assert wire < nominal < 1.2 * wire  # the fit is close to the wire: a draw 20% fast would beat it
    assert CollectiveModel(cl, None, params).wire_time(op, S, shape) == pytest.approx(wire, rel=1e-12)
    times = _draws(params, cl, op, S, shape)
    assert min(times) >= wire * (1 - 1e-12)
    # many draws stop there (the spread past 4 nodes is wide), the rest are untouched
    at_floor = sum(t == pytest.approx(wire, rel=1e-12) for t in times)
    assert 0 < at_floor < len(times)


def test_the_floor_is_priced_once_per_collective_shape_for_all_draws(fitted):
    params, spec = fitted
    cl = build_cluster(spec.model_copy(update={"nodes": 64}))
    shape = GroupShape(64, 1)
    classes = CollectiveModel(cl).classes(shape)
    draws = params.from_normals(quasi_normals(32, params.dimensions(classes)), classes)
    assert len({id(d.floors) for d in draws}) == 1 and draws[0].floors.nominal is params
    for d in draws:
        for nbytes in (MiB, 8 * MiB):
            CollectiveModel(cl, None, d).cost("all_reduce", nbytes, shape)
    (nominal,) = draws[0].floors.models.values()
    assert len(nominal._floor_cache) == 2
    # a copy sent to another process carries the nominal set, not the priced models
    copy = pickle.loads(pickle.dumps(draws[0]))
    assert copy.floors.models == {} and copy.floors.nominal == params


def test_a_fit_faster_than_the_wire_is_its_own_floor_and_no_nominal_moves(fitted):
    params, spec = fitted
    cl = build_cluster(spec.model_copy(update={"nodes": 64}))
    shape, S = GroupShape(64, 1), 8 * MiB
    # a fit whose byte model differs from the topology's: its network twice as fast as the line rate
    fast = params.with_values(("bw_eff.net_ethernet_tcp",), (2.0,))
    model = CollectiveModel(cl, None, fast)
    nominal = model.cost("all_reduce", S, shape).time
    wire = model.wire_time("all_reduce", S, shape)
    assert nominal < wire
    assert model.floor("all_reduce", S, shape) == nominal
    times = _draws(fast, cl, "all_reduce", S, shape)
    assert min(times) == pytest.approx(nominal, rel=1e-12)  # stopped at the nominal, not lifted to the wire
    # a set that is not a draw (the nominal, a fit's trial) is priced as it stands: no cap, no floor
    plain = CollectiveModel(cl).cost("all_reduce", S, shape, "ring").time
    trial = NetworkParams(bw_eff={"net_ethernet_tcp": 2.0})
    faster = CollectiveModel(cl, None, trial).cost("all_reduce", S, shape, "ring").time
    assert plain - faster == pytest.approx(wire / 0.94 / 2, rel=1e-9)  # half the transfer at 94% of line


@pytest.mark.parametrize(
    "preset, nic",
    [
        ("onebit-adam-infiniband", {}),  # effective 32 of 40 Gb/s
        ("dgx-h100-gpt3-1.3b", {"count": 1, "line_rate_gbps": 200}),  # no effective rate: 96% of line
    ],
)
def test_uncalibrated_nic_draws_stop_at_the_line_rate(preset, nic):
    spec = load_scenario(f"preset:{preset}").cluster
    spec = spec.model_copy(update={"nodes": 16, "nic": spec.nic.model_copy(update=nic)})
    cl = build_cluster(spec)
    shape, S = GroupShape(16, 1), 4096 * MiB  # one GPU per node: the NIC alone binds
    model = CollectiveModel(cl)
    classes = model.classes(shape)
    draws = DEFAULT.from_normals(quasi_normals(64, DEFAULT.dimensions(classes)), classes)
    drawn = [d.bw_eff["net_infiniband"] for d in draws]
    cap = spec.nic.line_rate_gbps / (spec.nic.effective_gbps or spec.nic.line_rate_gbps * 0.96)
    assert cl.peak_ratio(cl.inter_node(shape)) == pytest.approx(cap)
    assert sum(f > cap for f in drawn) >= 4  # the default width does draw NICs past their line rate
    wire = 2 * 15 / 16 * S / _line_rate(spec)
    assert model.wire_time("all_reduce", S, shape) == pytest.approx(wire, rel=1e-12)
    times = [CollectiveModel(cl, None, d).cost("all_reduce", S, shape, "ring").time for d in draws]
    assert min(times) >= wire
    # a draw past the line rate prices as one at it: the wire's time and its (tiny) latency
    for f, t in zip(drawn, times):
        if f > cap:
            assert t == pytest.approx(wire, rel=0.01)
    assert model.cost("all_reduce", S, shape, "ring").time > wire * cap * 0.99  # the nominal, at effective


def test_intra_node_draws_stop_at_the_catalog_rate():
    # H100 NVSwitch: modelled at the catalog's NVLink rate already, so no draw runs faster
    spec = load_scenario("preset:dgx-h100-gpt3-1.3b").cluster
    cl = build_cluster(spec)
    shape, S = GroupShape(1, 8), 1024 * MiB
    model = CollectiveModel(cl)
    classes = model.classes(shape)
    draws = DEFAULT.from_normals(quasi_normals(32, DEFAULT.dimensions(classes)), classes)
    assert sum(d.bw_eff["nvlink"] > 1 for d in draws) >= 8
    peak = model.wire_time("all_reduce", S, shape)
    assert peak == pytest.approx(2 * 7 / 8 * S / cl.intra_ring(8).bytes_per_s, rel=1e-12)
    assert min(CollectiveModel(cl, None, d).cost("all_reduce", S, shape, "ring").time for d in draws) >= peak
    # a measured intra-node busbw (V100 mesh, 42 GB/s) may be drawn up to the catalog's links, not past
    spec = load_scenario("preset:onebit-adam-infiniband").cluster
    cl = build_cluster(spec)
    catalog = cl._compute_intra_ring(8, use_measured=False).bytes_per_s
    assert cl.intra_ring(8).measured and cl.peak_ratio(cl.intra_ring(8)) == pytest.approx(catalog / 42e9)
    assert catalog > 42e9


@pytest.mark.parametrize("nodes", [64, 1024])
def test_a_collective_band_p10_is_never_under_its_wire(fitted, nodes):
    """`clustersim collective`'s band (collective_interval): the draws' band with its quantiles stopped at
    the wire, where the unstopped band reached under it; its P50 and P90 are the draws' own."""
    params, spec = fitted
    cl = build_cluster(spec.model_copy(update={"nodes": nodes}))
    shape, S = GroupShape(nodes, 1), 8 * MiB
    ctx = SimpleNamespace(cluster=cl, collectives=CollectiveModel(cl, None, params))
    band = collective_interval(ctx, "all_reduce", S, shape, "auto", samples=200)
    wire = 2 * (nodes - 1) / nodes * S / _line_rate(cl.spec)
    assert band.p10 == pytest.approx(wire, rel=1e-12)
    assert band.p10 < band.p50 < band.p90
    # the same draws unstopped: their band reached under the wire, and is the same above it
    rng = np.random.default_rng(0)
    classes = ctx.collectives.classes(shape)
    raw = [
        CollectiveModel(cl, None, replace(p, floors=None)).cost("all_reduce", S, shape).time
        for p in params.sample(rng, 200, classes)
    ]
    unstopped = Interval.of(raw)
    assert min(raw) < wire and unstopped.p10 < wire
    assert (band.p50, band.p90) == (unstopped.p50, unstopped.p90)


def test_an_uncalibrated_collective_band_p10_is_never_under_its_wire():
    # the 1-bit Adam InfiniBand cluster's NICs: effective 32 of 40 Gb/s, one GPU per node
    ctx = build_context(load_scenario("preset:onebit-adam-infiniband"))
    shape, S = GroupShape(8, 1), 4096 * MiB
    band = collective_interval(ctx, "all_reduce", S, shape, "ring", samples=200)
    wire = 2 * 7 / 8 * S / _line_rate(ctx.cluster.spec)
    assert ctx.collectives.floor("all_reduce", S, shape, "ring") == pytest.approx(wire, rel=1e-12)
    assert band.p10 >= wire and band.p10 < band.p50 < band.p90


def test_the_flow_backend_draws_stop_at_the_line_rate_too():
    """`training.network: flow` prices a draw's collectives over every link: its NICs stop at their line
    rate as the analytical model's do."""
    s = load_scenario("preset:onebit-adam-infiniband").with_changes(
        **{"cluster.gpus_per_node": 1, "training.network": "flow"}
    )
    shape, S = GroupShape(8, 1), 4096 * MiB
    nominal = build_context(s)
    wire = nominal.collectives.wire_time("all_reduce", S, shape)
    assert wire == pytest.approx(2 * 7 / 8 * S / _line_rate(s.cluster), rel=1e-12)
    times = []
    for p in perturbations(nominal, 32):
        ctx = build_context(s, None, p)
        times.append(ctx.network.time(CollectiveSpec("all_reduce", S, shape, "ring", "Simple")))
    cap = 40 / 32
    assert sum(p.network.bw_eff["net_infiniband"] > cap for p in perturbations(nominal, 32)) >= 2
    assert min(times) >= wire
    assert min(times) == pytest.approx(wire, rel=0.01)  # those past the line rate run at it
