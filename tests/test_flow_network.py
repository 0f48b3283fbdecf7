"""The flow backend (simulator/network/): collectives expanded into flows over the topology agree
with the analytical model on symmetric clusters, and the seam leaves the analytical path untouched."""

from __future__ import annotations

import pytest

from clustersim.cli import app
from clustersim.cost_models.collective_algorithms import double_tree_edges
from clustersim.cost_models.nccl_trees import spine_shares
from clustersim.scenario import FabricSpec, load_scenario
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.simulator.network.fabric import FlowNetwork
from clustersim.simulator.network.flow import FlowBackend
from clustersim.simulator.network.patterns import double_tree
from clustersim.simulator.program import CollectiveSpec
from clustersim.topologies import GroupShape
from clustersim.topologies.placement import alltoall_shares, place

SIZES = (1 << 20, 64 << 20, 1 << 30)


def _pair(ctx, backend, op, nbytes, shape, algo):
    cost = ctx.collectives.cost(op, nbytes, shape, algo)
    return cost.time, backend.time(CollectiveSpec(op, nbytes, shape, cost.algorithm, cost.protocol))


def _nvlink_share_corrected(ctx, op, nbytes, shape, algo, ana):
    """The analytical ring bound min(intra, inter) counts every byte over each GPU's NVSwitch link; in
    a ring (or tree) spanning nodes each GPU leaves the node by PCIe in one channel of g, so its NVSwitch
    link carries (g-1)/g of it: bandwidth min(intra x g/(g-1), inter). Where the analytical model is
    NVSwitch-bound this is the flow model's (exact) answer; elsewhere it equals the analytical one."""
    g = shape.gpus_per_node
    if shape.nodes == 1 or g == 1 or shape.sharing > 1 or algo not in ("ring", "tree") or op == "all_to_all":
        return ana
    c = ctx.cluster
    intra, inter = c.intra_ring(g).bytes_per_s, c.inter_node(shape).bytes_per_s
    cost = ctx.collectives.cost(op, nbytes, shape, algo)
    frac = ctx.collectives._proto_bw[cost.protocol]
    p = shape.ranks
    per_rank = {"all_reduce": 2 * (p - 1) / p, "all_gather": (p - 1) / p, "reduce_scatter": (p - 1) / p}
    if algo == "tree":  # the chains' 2S inside the node beside the NICs' S/2 per tree edge
        # (at the NICs' rate over r x the share of the tree's traffic that crosses the spine)
        inter = c.inter_node(shape, *spine_shares(place(c.spec.fabric, shape.nodes))).bytes_per_s
        nic = double_tree_edges(shape.nodes) / 2 * nbytes
        old = max(2 * nbytes / intra, nic / inter) / frac
        new = max(2 * nbytes / (intra * g / (g - 1)), nic / inter) / frac
        return ana - old + new
    per_rank = per_rank.get(op, 1.0) * nbytes
    old = per_rank / (min(intra, inter) * frac)
    new = per_rank / (min(intra * g / (g - 1), inter) * frac)
    return ana - old + new


def _dgx(nodes: int, **fabric):
    s = load_scenario("preset:dgx-h100-gpt3-1.3b")
    return s.with_changes(**{"cluster.nodes": nodes, **{f"cluster.fabric.{k}": v for k, v in fabric.items()}})


# (op, algorithm) on NVSwitch nodes with 8 NDR rails: every shape, one node to 32, and rail groups.
NVSWITCH_CASES = [
    ("all_reduce", "ring"),
    ("all_reduce", "tree"),
    ("all_reduce", "hd"),
    ("all_reduce", "hier"),
    ("all_gather", "ring"),
    ("all_gather", "hd"),
    ("reduce_scatter", "ring"),
    ("reduce_scatter", "hd"),
    ("all_to_all", "ring"),
    ("broadcast", "ring"),
]


def _skip(algo: str, op: str, shape: GroupShape, oversubscribed: bool) -> bool:
    """Cases where the two models differ for a reason found and tested below or documented:
    * hier with several communicators per node: the analytical rail leg ignores the other
      communicators' rails (a rail's max-flow may borrow their NICs); the flow model gives each rail
      its own NIC;
    * oversubscribed spine: halving-doubling partners at a node distance that is a multiple of the
      leaf count stay inside a leaf (placement node i on leaf i mod leaves), while the analytical
      model divides all their traffic by the oversubscription."""
    if algo == "hier" and (shape.nodes == 1 or shape.gpus_per_node == 1 or shape.sharing > 1):
        return True
    return oversubscribed and shape.nodes > 8 and algo == "hd"


@pytest.mark.parametrize("oversubscription", [1.0, 2.0])
@pytest.mark.parametrize("nodes", [1, 2, 4, 16, 32])  # 16: two leaves of 8, 32: four
@pytest.mark.parametrize("op,algo", NVSWITCH_CASES)
def test_flow_agrees_with_analytical_on_symmetric_nvswitch_clusters(nodes, op, algo, oversubscription):
    ctx = build_context(_dgx(nodes, nodes_per_leaf=8, oversubscription=oversubscription))
    backend = FlowBackend(ctx)
    shapes = [GroupShape(nodes, 8), GroupShape(1, 4)]
    if nodes > 1:
        shapes += [GroupShape(nodes, 1, sharing=8), GroupShape(nodes, 2, sharing=4)]
    for shape in shapes:
        if _skip(algo, op, shape, oversubscription > 1):
            continue
        for nbytes in SIZES:
            ana, flow = _pair(ctx, backend, op, nbytes, shape, algo)
            expected = _nvlink_share_corrected(ctx, op, nbytes, shape, algo, ana)
            assert flow == pytest.approx(expected, rel=0.03), (shape, nbytes)
            # A tree on 2-3 nodes sends S-1.5S through the NICs and 2S through the chains inside the
            # node, so at 400 Gb/s it is NVSwitch-bound, where the share above is (g-1)/g, not 3.4%.
            raw = 0.13 if algo == "tree" and nodes < 4 else 0.04
            assert flow == pytest.approx(ana, rel=raw), (shape, nbytes)


@pytest.mark.parametrize("op,algo", [("all_reduce", "ring"), ("all_reduce", "tree"), ("all_gather", "ring")])
def test_flow_agrees_on_a_pcie_cluster_with_a_measured_intra_node_rate(op, algo):
    """The default preset (V100s on PCIe, a measured intra-node busbw, one TCP NIC): ring and tree
    patterns agree. (Halving-doubling and all-to-all do not on a PCIe tree, see the next test.)"""
    ctx = build_context(load_scenario("preset:default"))
    backend = FlowBackend(ctx)
    for shape in (GroupShape(1, 4), GroupShape(8, 4), GroupShape(8, 1, sharing=4)):
        for nbytes in SIZES:
            ana, flow = _pair(ctx, backend, op, nbytes, shape, algo)
            assert flow == pytest.approx(ana, rel=0.03), (shape, nbytes)


def test_non_ring_patterns_contend_on_a_pcie_tree_where_the_analytical_model_does_not():
    """Why flow and analytical differ on PCIe: the analytical model gives every algorithm the ring's
    bandwidth, but halving-doubling's distance-2 round on 4 GPUs behind two PCIe switches sends two
    flows through each switch uplink (the ring sends one). Flow = analytical x (1 + that round's
    share): bandwidth terms S/4 at full rate, S/2 at half rate, twice: 2(S/2/B + S/4/B)/(2 x 3/4 S/B)."""
    ctx = build_context(load_scenario("preset:default").with_changes(**{"cluster.nodes": 1}))
    backend = FlowBackend(ctx)
    shape = GroupShape(1, 4)
    ana, flow = _pair(ctx, backend, "all_reduce", 1 << 30, shape, "hd")
    ring_ana, ring_flow = _pair(ctx, backend, "all_reduce", 1 << 30, shape, "ring")
    assert ring_flow == pytest.approx(ring_ana, rel=0.01)
    assert flow / ana == pytest.approx((2 * (0.5 * 2 + 0.25)) / (2 * 0.75), rel=0.03)


@pytest.mark.parametrize("nodes", [2, 3, 4])
@pytest.mark.parametrize("gbps", [20, 400])
def test_tree_on_few_nodes_sends_what_its_trees_hold(nodes, gbps):
    """Two nodes: in each tree one node is the root with one child, so a node's NICs send S/2 per tree
    (S in all); three nodes 1.5S; from four on 2S. Both backends count those bytes, so they agree with
    the NICs the bottleneck (20 Gb/s) and with NVSwitch-bound chains (400 Gb/s), as DiLoCo's 2-node
    workers showed when the analytical tree still sent 2S on two nodes."""
    ctx = build_context(_dgx(nodes).with_changes(**{"cluster.nic.line_rate_gbps": gbps}))
    backend = FlowBackend(ctx)
    for shape in (GroupShape(nodes, 8), GroupShape(nodes, 1, sharing=8)):
        ana, flow = _pair(ctx, backend, "all_reduce", 1 << 30, shape, "tree")
        expected = _nvlink_share_corrected(ctx, "all_reduce", 1 << 30, shape, "tree", ana)
        assert flow == pytest.approx(expected, rel=0.03), shape
        cost = ctx.collectives.cost("all_reduce", 1 << 30, shape, "tree")
        assert cost.inter_node_bytes == pytest.approx(double_tree_edges(nodes) / 2 * (1 << 30))


def test_double_tree_edges_counts_nccls_trees():
    """The analytical tree's NIC bytes come from double_tree_edges; it must be the most edges any node
    has in the two trees the flow backend builds."""
    for k in range(2, 70):
        a, b = double_tree(k)
        edges = [
            sum(1 for t in (a, b) for c, p in enumerate(t) if p == r) + (a[r] >= 0) + (b[r] >= 0)
            for r in range(k)
        ]
        assert max(edges) == double_tree_edges(k), k


def test_double_tree_matches_nccl_each_rank_inner_in_at_most_one_tree():
    """NCCL's double binary tree: a rank has at most 3 tree edges to send on in one tree and 1 in the
    other (4 x S/2 = 2S, the analytical tree's bytes)."""
    for k in (2, 4, 8, 16, 32, 7):
        a, b = double_tree(k)
        assert sum(p < 0 for p in a) == 1 and sum(p < 0 for p in b) == 1
        for r in range(k):
            edges = [sum(1 for c, p in enumerate(t) if p == r) + (t[r] >= 0) for t in (a, b)]
            assert sum(edges) <= 4 + (k % 2), (k, r, edges)


def _ethernet(nodes: int, **fabric):
    """The new-user trial's cluster: 8 x A100-80GB on NVSwitch, one 100 GbE NIC per node, on a
    leaf-spine fabric (``fabric``: nodes_per_leaf, oversubscription, ...)."""
    changes = {
        "cluster.gpu": "A100-80GB",
        "cluster.nic.kind": "ethernet_tcp",
        "cluster.nic.count": 1,
        "cluster.nic.line_rate_gbps": 100,
        "cluster.fabric.kind": "leaf_spine",
        **{f"cluster.fabric.{k}": v for k, v in fabric.items()},
    }
    return _dgx(nodes).with_changes(**changes)


# a leaf of 2 nodes has one uplink at the least: 2:1 at most (scenario.py refuses 4:1 there)
LEAF_SPINE_CASES = [(n, k, r) for n in (8, 16, 32, 64) for k in (2, 4, 8) for r in (2.0, 4.0) if r <= k]


@pytest.mark.parametrize("op,algo", [("all_reduce", "tree"), ("all_to_all", "ring")])
@pytest.mark.parametrize("nodes,per_leaf,oversubscription", LEAF_SPINE_CASES)
def test_oversubscribed_leaf_spine_agrees_across_node_counts(nodes, per_leaf, oversubscription, op, algo):
    """Both backends charge the uplinks only for the traffic that crosses them, on the shared placement.
    NCCL's tree: the tree edges that cross (nccl_trees.spine_shares): on two leaves half a leaf's NIC
    traffic, from four on all of it; dividing the whole tree by r would be twice the flow model's time
    on two leaves. An all-to-all: every send posted at once (NCCL's grouped send/recv, MPI's
    Isend/Irecv), so the node shifts that stay inside a leaf run beside those that cross it, and the
    uplinks carry r x the crossing share (placement.alltoall_shares), not the whole exchange."""
    ctx = build_context(_ethernet(nodes, nodes_per_leaf=per_leaf, oversubscription=oversubscription))
    backend = FlowBackend(ctx)
    for shape in (GroupShape(nodes, 8), GroupShape(nodes, 1, sharing=8)):
        for nbytes in (64 << 20, 1 << 30):
            ana, flow = _pair(ctx, backend, op, nbytes, shape, algo)
            assert flow == pytest.approx(ana, rel=0.03), (shape, nbytes)


@pytest.mark.parametrize("nodes,per_leaf", [(38, 4), (50, 16), (90, 8), (200, 16)])
def test_all_to_all_on_leaves_of_unequal_size_agrees(nodes, per_leaf):
    """Past 33 nodes the flow backend merges the node shifts by the leaves they cross (one per distance
    mod leaves): exact on equal leaves, and within 3% of the closed form where the leaves differ by a
    node (32 evenly spaced shifts were up to 11% off on 200 nodes)."""
    ctx = build_context(_ethernet(nodes, nodes_per_leaf=per_leaf, oversubscription=4.0))
    ana, flow = _pair(ctx, FlowBackend(ctx), "all_to_all", 1 << 30, GroupShape(nodes, 8), "ring")
    assert flow == pytest.approx(ana, rel=0.03)


@pytest.mark.parametrize(
    "nodes,per_leaf,leaves_per_pod,shares",
    [
        (8, 4, None, (4 / 7, 0.0)),  # two full leaves: 4 x 4 of a node's 7 sends leave each
        (16, 8, None, (8 / 15, 0.0)),
        (16, 4, None, (4 * 12 / (15 * 4), 0.0)),  # four leaves: 12 of 15 peers elsewhere
        (6, 4, None, (3 * 3 / (5 * 4), 0.0)),  # two leaves of 3 on uplinks sized for 4
        (7, 4, None, (4 * 3 / (6 * 4), 0.0)),  # 4 + 3: the full leaf sends more
        (16, 2, 4, (2 * 14 / (15 * 2), 8 * 8 / (15 * 8))),  # 8 leaves in 2 pods of 4 leaves
        (4, 4, None, (0.0, 0.0)),  # one leaf: nothing crosses
    ],
)
def test_the_share_of_an_all_to_all_that_crosses_the_spine(nodes, per_leaf, leaves_per_pod, shares):
    """Closed form: a leaf of k of the N nodes sends k x (N-k)/(N-1) of a node's NIC traffic across,
    over the nodes_per_leaf its uplink is sized for (a pod likewise); on two full leaves of 4 at 4:1
    an all-to-all takes 4 x 4/7 = 2.3 times its non-blocking time in both backends, not 4."""
    fabric = FabricSpec(kind="leaf_spine", nodes_per_leaf=per_leaf, leaves_per_pod=leaves_per_pod)
    assert alltoall_shares(place(fabric, nodes)) == pytest.approx(shares)
    if (nodes, per_leaf) != (8, 4):
        return
    shape = GroupShape(nodes, 8)
    times = {}
    for r in (1.0, 4.0):
        ctx = build_context(_ethernet(nodes, nodes_per_leaf=per_leaf, oversubscription=r))
        times[r] = _pair(ctx, FlowBackend(ctx), "all_to_all", 4 << 30, shape, "ring")
    for model in (0, 1):  # analytical, flow
        assert times[4.0][model] / times[1.0][model] == pytest.approx(16 / 7, rel=0.01), model


@pytest.mark.parametrize("oversubscription", [2.0, 4.0])
@pytest.mark.parametrize("nodes", [8, 16, 32])
def test_a_tree_on_two_leaves_crosses_the_spine_on_its_tree_leaves_only(nodes, oversubscription):
    """Closed form. Nodes sit on leaf i mod 2 (topologies/placement.py), so in NCCL's first tree every
    odd rank (a tree leaf) hangs off an even parent on the other leaf and every inner edge joins two
    even ranks; the mirror tree likewise: N of the 2(N-1) edges cross. Each carries S/2 each way, one
    end on either leaf, so a leaf's uplink carries N x S/2 = kS per direction (k = N/2 nodes per leaf)
    at kB/r: rS/B, beside the NICs' 2S/B. The tree's bandwidth time grows by max(2, r)/2: nothing at
    2:1, twice at 4:1, where a ring's (every hop crossing) grows r times."""
    per_leaf = nodes // 2
    where = place(FabricSpec(kind="leaf_spine", nodes_per_leaf=per_leaf), nodes)
    crossing = [
        (c, q)
        for t in double_tree(nodes)
        for c, q in enumerate(t)
        if q >= 0 and where.leaf_of(c) != where.leaf_of(q)
    ]
    assert len(crossing) == nodes and all(c % 2 != q % 2 for c, q in crossing)
    assert spine_shares(where) == (0.5, 0.0)
    times = {}
    for r in (1.0, oversubscription):
        ctx = build_context(_ethernet(nodes, nodes_per_leaf=per_leaf, oversubscription=r))
        backend = FlowBackend(ctx)
        times[r] = {
            algo: _pair(ctx, backend, "all_reduce", 4 << 30, GroupShape(nodes, 8), algo)
            for algo in ("tree", "ring")
        }
    for model in (0, 1):  # analytical, flow
        tree = times[oversubscription]["tree"][model] / times[1.0]["tree"][model]
        ring = times[oversubscription]["ring"][model] / times[1.0]["ring"][model]
        assert tree == pytest.approx(max(2.0, oversubscription) / 2, rel=0.01), model
        # a ring's 2(p-1) latency steps: 1.3% of its time on 256 ranks at 1:1
        assert ring == pytest.approx(oversubscription, rel=0.02), model


@pytest.mark.parametrize("nodes,per_leaf", [(16, 4), (32, 8), (64, 2), (64, 16)])
def test_a_tree_on_four_or_more_leaves_sends_a_whole_leaf_s_traffic_across(nodes, per_leaf):
    """From four leaves on (node i on leaf i mod L) the busiest leaf's nodes have all their tree edges
    on other leaves: k nodes x 2S over an uplink of kB/r, r times the NICs' time, as a ring."""
    where = place(FabricSpec(kind="leaf_spine", nodes_per_leaf=per_leaf), nodes)
    assert where.leaves >= 4 and spine_shares(where) == (1.0, 0.0)
    ctx = build_context(_ethernet(nodes, nodes_per_leaf=per_leaf, oversubscription=2.0))
    flat = build_context(_ethernet(nodes, nodes_per_leaf=per_leaf, oversubscription=1.0))
    shape = GroupShape(nodes, 8)
    ratio = ctx.collectives.cost("all_reduce", 1 << 30, shape, "tree").time
    ratio /= flat.collectives.cost("all_reduce", 1 << 30, shape, "tree").time
    assert ratio == pytest.approx(2.0, rel=0.01)


@pytest.mark.parametrize(
    "nodes,per_leaf,oversubscription,slowdown",
    [
        # 6 nodes on two 4-node leaves, 3 each: every ring hop crosses, 3 flows on an uplink sized
        # for 4 at r = 2: 3 x 2 / 4 = 1.5 (the full ratio, 2, assumed a full leaf)
        (6, 4, 2.0, 1.5),
        # 5 nodes: leaf 0 holds 0, 2, 4 and hop 4 -> 0 stays on it: 2 crossing hops per leaf,
        # 2 x 2 / 4 = 1, the NICs bind
        (5, 4, 2.0, 1.0),
        (7, 4, 4.0, 3.0),  # 4 + 3 nodes, 3 crossing hops from either leaf at 4:1 on 4: 3
        (20, 8, 2.0, 1.75),  # 3 leaves of 7, 7, 6: 7 x 2 / 8
    ],
)
def test_a_ring_on_leaves_its_group_does_not_fill_is_slowed_by_its_crossing_hops(
    nodes, per_leaf, oversubscription, slowdown
):
    """Closed form: a leaf's uplink is sized for nodes_per_leaf NICs over r; a ring on node i -> i+1
    (leaf i mod L) sends one node's ring traffic across per hop that leaves the leaf, so its time on
    the uplink is r x crossing hops / nodes_per_leaf of the NICs' (placement.ring_shares). Both
    backends; the analytical model used to charge r whenever the group spanned leaves."""
    shape = GroupShape(nodes, 8)
    times = {}
    for r in (1.0, oversubscription):
        ctx = build_context(_ethernet(nodes, nodes_per_leaf=per_leaf, oversubscription=r))
        times[r] = _pair(ctx, FlowBackend(ctx), "all_gather", 4 << 30, shape, "ring")
    for model in (0, 1):  # analytical, flow
        ratio = times[oversubscription][model] / times[1.0][model]
        assert ratio == pytest.approx(slowdown, rel=0.01), model


def test_a_single_switch_s_links_are_named_for_the_switch():
    """The hottest links on one switch say "switch", not a leaf the fabric does not have."""
    trial = _ethernet(8).with_changes(**{"cluster.fabric.kind": "single_switch"})
    ctx = build_context(trial)
    backend = FlowBackend(ctx)
    flow = backend.time(CollectiveSpec("all_reduce", 1 << 30, GroupShape(8, 8), "ring", "Simple"))
    names = [row["link"] for row in backend.utilisation(flow, top=4)]
    assert names and not any("leaf" in n for n in names), names
    assert any(n.endswith("<- switch") or n.endswith("-> switch") for n in names), names
    spine = FlowNetwork(build_context(_ethernet(8, nodes_per_leaf=4)).cluster, 8)
    assert spine.name(spine.nic_up(0, 0)) == "node0 nic0 -> leaf"


def test_flow_backend_run_is_close_to_the_analytical_run():
    s = load_scenario("preset:dgx-h100-gpt3-1.3b")
    ana = simulate(s)
    flow = simulate(s.with_changes(**{"training.network": "flow"}))
    assert flow.iteration_time == pytest.approx(ana.iteration_time, rel=0.03)
    assert flow.extra["hottest_links"] and "hottest_links" not in ana.extra
    top = flow.extra["hottest_links"][0]
    assert 0 < top["utilisation"] <= 1.0


def test_cli_network_flag(runner):
    out = runner.invoke(app, ["run", "preset:dgx-h100-gpt3-1.3b", "--network", "flow"])
    assert out.exit_code == 0 and "Hottest links" in out.output
    bad = runner.invoke(app, ["run", "preset:dgx-h100-gpt3-1.3b", "--network", "packets"])
    assert bad.exit_code == 2 and "--network" in bad.output


def test_a_sweep_varies_the_network_backend(tmp_path):
    import csv

    import yaml

    from clustersim.sweeps.run import run_sweep
    from clustersim.sweeps.spec import load_sweep

    path = tmp_path / "sweep.yaml"
    data = {
        "name": "nets",
        "base": "preset:dgx-h100-gpt3-1.3b",
        "vary": {"training.network": ["analytical", "flow"]},
    }
    path.write_text(yaml.safe_dump(data))
    assert run_sweep(load_sweep(path), tmp_path / "out")["written"] == 2
    with (tmp_path / "out" / "results.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert all(r["status"] == "ok" for r in rows)
    times = sorted(float(r["iteration_time_s"]) for r in rows)
    assert times[1] == pytest.approx(times[0], rel=0.03)


def test_cli_collective_with_the_flow_backend(runner):
    import json

    r = runner.invoke(
        app,
        ["collective", "preset:dgx-h100-gpt3-1.3b", "--bytes", "1GiB", "--network", "flow", "--json"],
    )
    assert r.exit_code == 0
    data = json.loads(r.stdout)
    assert data["flow_time_s"] == pytest.approx(data["time_s"], rel=0.04)
    assert data["flow_hottest_links"][0]["utilisation"] > 0.5  # a 1 GiB all-reduce keeps its bottleneck busy
    bad = runner.invoke(app, ["collective", "preset:dgx-h100-gpt3-1.3b", "--network", "packets"])
    assert bad.exit_code == 2


def test_an_nvlink_mesh_run_on_the_flow_backend_says_its_rings_are_single_path():
    s = load_scenario("preset:default").with_changes(
        **{
            "cluster.gpu": "V100-SXM2",
            "cluster.intra_node.fabric": "nvlink_mesh",
            "cluster.gpus_per_node": 8,
            "cluster.intra_node.measured_allreduce_busbw_gbs": None,
            "training.network": "flow",
        }
    )
    assert any("NVLink mesh" in n for n in simulate(s).notes)


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "broadcast"])
def test_rings_inside_an_nvlink_mesh_node_use_all_its_links(op):
    """DGX-1: the best set of rings over direct NVLinks moves each GPU's whole NVLink capacity, the
    analytical model's bound (sum of a GPU's NVLinks to its peers)."""
    s = load_scenario("preset:default").with_changes(
        **{
            "cluster.gpu": "V100-SXM2",
            "cluster.intra_node.fabric": "nvlink_mesh",
            "cluster.gpus_per_node": 8,
            "cluster.intra_node.measured_allreduce_busbw_gbs": None,
        }
    )
    ctx = build_context(s)
    backend = FlowBackend(ctx)
    for shape in (GroupShape(1, 8), GroupShape(1, 4)):
        for nbytes in SIZES:
            ana, flow = _pair(ctx, backend, op, nbytes, shape, "ring")
            assert flow == pytest.approx(ana, rel=0.03), (shape, nbytes)


@pytest.mark.parametrize("op,algo", [("all_reduce", "ring"), ("all_reduce", "tree"), ("all_gather", "ring")])
def test_rings_and_trees_across_nvlink_mesh_nodes_agree(op, algo):
    """Four DGX-1 nodes with 4 x 100 Gb/s InfiniBand: each NIC's channel crosses a node over NVLinks
    the other channels use least, so the NVLinks never become the bottleneck the NICs are."""
    s = load_scenario("preset:default").with_changes(
        **{
            "cluster.nodes": 4,
            "cluster.gpu": "V100-SXM2",
            "cluster.intra_node.fabric": "nvlink_mesh",
            "cluster.gpus_per_node": 8,
            "cluster.intra_node.measured_allreduce_busbw_gbs": None,
            "cluster.nic": {"kind": "infiniband", "count": 4, "line_rate_gbps": 100},
        }
    )
    ctx = build_context(s)
    backend = FlowBackend(ctx)
    for nbytes in SIZES:
        ana, flow = _pair(ctx, backend, op, nbytes, GroupShape(4, 8), algo)
        assert flow == pytest.approx(ana, rel=0.03), nbytes


def test_collectives_at_the_same_time_share_the_fabric_links_in_the_engine():
    """Two 1 GiB all-reduces over the same 2 nodes started together (on two rank classes' comm
    streams): their NICs carry both, so each needs twice the bandwidth time (the engine's fluid model
    shares the links for the op's whole duration, so the two end between 2 x its bandwidth time and
    that plus its latency); one alone takes the flow backend's time."""
    from clustersim.simulator.engine import Engine
    from clustersim.simulator.program import Program
    from clustersim.simulator.strategies.common import add_collective

    ctx = build_context(_dgx(2).with_changes(**{"training.network": "flow"}))
    alone = Program()
    add_collective(alone, ctx, "a", "all_reduce", 1 << 30, algorithm="ring")
    _, end = Engine(alone, network=ctx.network).run()
    spec = alone.ops[0].collective
    assert end[0] == pytest.approx(ctx.network.time(spec), rel=1e-9)
    both = Program()
    add_collective(both, ctx, "a", "all_reduce", 1 << 30, algorithm="ring")
    second = add_collective(both, ctx, "b", "all_reduce", 1 << 30, algorithm="ring")
    both.ops[second].rank = 1
    _, end2 = Engine(both, network=ctx.network).run()
    latency = ctx.network._latency(spec)
    bandwidth = end[0] - latency
    for t in (end2[0], end2[1]):
        assert 2 * bandwidth * (1 - 1e-6) <= t <= (latency + 2 * bandwidth) * (1 + 1e-6)


def test_pipeline_stages_on_other_nodes_use_their_own_nics():
    """A pipeline program holds every stage; stages on other nodes push their data-parallel all-reduces
    through other NICs. The flow backend used to name node 0's links for every stage, so p stages shared
    one node's NICs p ways (the 3D preset ran 21% slower than the analytical model) and the hottest-links
    table counted every stage's bytes on node 0."""
    from clustersim.scenario import validate_scenario
    from clustersim.simulator import simulate

    data = {
        "cluster": {
            "nodes": 8,
            "gpus_per_node": 8,
            "gpu": "H100-SXM",
            "nic": {"count": 8, "line_rate_gbps": 400},
        },
        "workload": {"model": "GPT-3-1.3B", "micro_batch": 1, "seq_len": 2048, "gradient_accumulation": 8},
        "training": {"optimizer": "adam", "parallelism": {"tensor": 4, "pipeline": 4}},
    }
    s = validate_scenario(data)
    analytical = simulate(s, uncertainty_samples=0)
    flow = simulate(s.with_changes(**{"training.network": "flow"}), uncertainty_samples=0)
    assert flow.iteration_time == pytest.approx(analytical.iteration_time, rel=0.03)
    egress = flow.bytes_per_link_kind["inter_node_per_node"]
    nics = [x for x in flow.extra["hottest_links"] if "nic" in x["link"] and "->" in x["link"]]
    # node 0's NICs carry stage 0's bytes: the node's egress over its 8 NICs, plus the wire protocol's
    # overhead (the table counts wire bytes); with every stage counted there it was p = 4 times that
    assert nics and all(x["bytes"] <= egress / 8 * 1.25 for x in nics)


def test_a_cluster_past_the_flow_backends_node_limit_is_refused_before_it_is_built(monkeypatch):
    """The flow backend builds every node's graph and flows; past MAX_FLOW_NODES it refuses, naming
    training.network, before building anything (a small limit here stands for the real one)."""
    from clustersim.errors import InputError
    from clustersim.simulator.network import flow

    monkeypatch.setattr(flow, "MAX_FLOW_NODES", 4)
    with pytest.raises(InputError) as err:
        simulate(_dgx(8).with_changes(**{"training.network": "flow"}), uncertainty_samples=0)
    assert err.value.key == "training.network" and "at most 4 nodes" in str(err.value)
    assert simulate(_dgx(4).with_changes(**{"training.network": "flow"}), uncertainty_samples=0)


@pytest.mark.parametrize("oversubscription", [2.0, 4.0])
def test_nccls_choice_on_an_oversubscribed_spine_is_the_one_it_makes_on_the_nics_alone(oversubscription):
    """NCCL's tuner reads the NICs' speeds and nothing of the switches above them, so on two 2:1 or 4:1
    leaves it picks for a large all-reduce what it picks on a non-blocking fabric (the ring), although
    the tree would cross the spine less: the auto choice is the same algorithm as at 1:1, and its time
    is that algorithm's on the real fabric."""
    from clustersim.cost_models.collectives import CollectiveModel

    nodes, shape, nbytes = 8, GroupShape(8, 8), float(1 << 30)
    flat = CollectiveModel(build_context(_ethernet(nodes, nodes_per_leaf=4, oversubscription=1.0)).cluster)
    tight = CollectiveModel(
        build_context(_ethernet(nodes, nodes_per_leaf=4, oversubscription=oversubscription)).cluster
    )
    chosen = flat.cost("all_reduce", nbytes, shape)
    auto = tight.cost("all_reduce", nbytes, shape)
    assert auto.algorithm == chosen.algorithm
    assert auto.time == tight.cost("all_reduce", nbytes, shape, chosen.algorithm).time
    tree = tight.cost("all_reduce", nbytes, shape, "tree").time
    assert tree < auto.time  # the tree would have been faster here: NCCL cannot know it
