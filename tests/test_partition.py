"""Hierarchical partitioning over three levels of bandwidth (training.sharding.partition, issue #12):
on Frontier nodes (8 MI250X GCDs, Infinity Fabric, 4 Slingshot NICs) each state is partitioned over a
GCD pair, a node or the world. Memory per rank and bytes per node by where the collectives run
against closed forms; lower levels never send more across nodes; all world is ZeRO-3; refusals."""

import itertools

import pytest

from clustersim.errors import InputError
from clustersim.scenario import load_scenario
from clustersim.simulator.context import build_context
from clustersim.simulator.memory import gpu_memory
from clustersim.simulator.runner import simulate
from clustersim.simulator.strategies import registry
from tests.conftest import make_scenario

N, G = 4, 8  # nodes, GCDs per node
W = N * G
SIZE = {"gcd_pair": 2, "node": G, "world": W}
FRONTIER = {
    "cluster.nodes": N,
    "cluster.gpus_per_node": G,
    "cluster.gpu": "MI250X",
    "cluster.intra_node": {"fabric": "infinity_fabric", "gpus_per_pcie_switch": 2},
    "cluster.nic": {"kind": "ethernet_tcp", "count": 4, "line_rate_gbps": 200, "gpudirect_rdma": True},
    "training.collective_algorithm": "ring",
}
LEVELS = ("gcd_pair", "node", "world")
STAGE3 = [  # parameters <= gradients <= optimizer states
    dict(zip(("parameters", "gradients", "optimizer_states"), c))
    for c in itertools.combinations_with_replacement(LEVELS, 3)
]


def frontier(stage=3, partition=None, **kw):
    return make_scenario(
        **FRONTIER, **{"training.sharding": {"stage": stage, "partition": partition or {}}}, **kw
    )


def spans(result):
    return result.extra["sharding"]["bytes_per_node_by_span"]


@pytest.mark.parametrize("part", STAGE3, ids=lambda p: "/".join(p.values()))
def test_memory_per_rank_divides_each_state_by_its_level(part):
    """fp16 Adam: parameters 2Ψ/s_p + master 4Ψ/s_o, gradients 2Ψ/s_g, Adam's m and v 8Ψ/s_o."""
    ctx = build_context(frontier(partition=part))
    mem, P = gpu_memory(ctx, registry.create(ctx)), ctx.params
    sp, sg, so = (SIZE[part[k]] for k in ("parameters", "gradients", "optimizer_states"))
    assert mem["parameters"] == pytest.approx(2 * P / sp + 4 * P / so, rel=1e-12)
    assert mem["gradients"] == pytest.approx(2 * P / sg, rel=1e-12)
    assert mem["optimizer_state"] == pytest.approx(8 * P / so, rel=1e-12)


def test_stage_1_and_2_partition_their_own_states():
    ctx = build_context(frontier(2, {"gradients": "node", "optimizer_states": "world"}))
    mem, P = gpu_memory(ctx, registry.create(ctx)), ctx.params
    assert mem["parameters"] == pytest.approx(2 * P + 4 * P / W, rel=1e-12)
    assert mem["gradients"] == pytest.approx(2 * P / G, rel=1e-12)
    ctx = build_context(frontier(1, {"optimizer_states": "gcd_pair"}))
    mem = gpu_memory(ctx, registry.create(ctx))
    assert mem["optimizer_state"] == pytest.approx(8 * P / 2, rel=1e-12)
    assert mem["gradients"] == pytest.approx(2 * P, rel=1e-12)


def _closed_forms(part, M):
    """Bytes per node per step (one micro-step, ring collectives; M = Ψ in 16 bits, for parameters and
    gradients alike): {gcd_pair, node, inter_node}. A ring over n nodes x k GCDs moving S per rank
    ((n k - 1)/(n k) S for all-gather/reduce-scatter, twice that for all-reduce) sends that once per
    node out of the NICs and k times minus that inside; a pair-level collective runs in the node's
    G/2 pairs at once, a collective among the ranks with the same index of a pair in 2 copies, of a
    node in G copies."""
    out = {"gcd_pair": 0.0, "node": 0.0, "inter_node": 0.0}

    def coll(kind, S, nodes, per_node, copies):
        q = nodes * per_node
        per_rank = (2 if kind == "all_reduce" else 1) * (q - 1) / q * S
        inter = per_rank if nodes > 1 else 0.0
        span = "inter_node" if nodes > 1 else ("gcd_pair" if per_node == 2 else "node")
        out["inter_node"] += inter * copies
        out["gcd_pair" if span == "gcd_pair" else "node"] += (per_node * per_rank - inter) * copies

    shape = {"gcd_pair": (1, 2, G // 2), "node": (1, G, 1), "world": (N, G, 1)}
    across = {
        ("gcd_pair", "node"): (1, G // 2, 2),
        ("gcd_pair", "world"): (N, G // 2, 2),
        ("node", "world"): (N, 1, G),
    }
    p, g, o = part["parameters"], part["gradients"], part["optimizer_states"]
    coll("all_gather", 2 * M, *shape[p])  # forward and backward gathers of every layer
    coll("reduce_scatter", M, *shape[g])
    if o != g:
        coll("reduce_scatter", M / SIZE[g], *across[g, o])
    if o != "world":
        coll("all_reduce", M / SIZE[o], *across[o, "world"])
    if p != o:
        coll("all_gather", M / SIZE[p], *across[p, o])  # the updated slices of each parameter shard
    return out


@pytest.mark.parametrize("part", STAGE3, ids=lambda p: "/".join(p.values()))
def test_bytes_by_level_match_closed_forms(part):
    s = frontier(partition=part)
    got = spans(simulate(s))
    want = _closed_forms(part, 2 * build_context(s).params)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1.0), k


@pytest.mark.parametrize("micro", [1, 4])
def test_lower_levels_never_send_more_across_nodes(micro):
    world = simulate(frontier(partition={}, **{"workload.gradient_accumulation": micro}))
    base = world.bytes_per_link_kind["inter_node_per_node"]
    for part in STAGE3:
        r = simulate(frontier(partition=part, **{"workload.gradient_accumulation": micro}))
        assert r.bytes_per_link_kind["inter_node_per_node"] <= base * (1 + 1e-12), part
    for stage, part in (
        (1, {"optimizer_states": "node"}),
        (2, {"gradients": "node", "optimizer_states": "node"}),
    ):
        ref = simulate(frontier(stage, {}, **{"workload.gradient_accumulation": micro}))
        r = simulate(frontier(stage, part, **{"workload.gradient_accumulation": micro}))
        assert r.bytes_per_link_kind["inter_node_per_node"] <= ref.bytes_per_link_kind["inter_node_per_node"]


def test_world_for_every_state_is_zero3():
    plain = simulate(frontier(partition={}))
    world = simulate(
        frontier(partition=dict.fromkeys(("parameters", "gradients", "optimizer_states"), "world"))
    )
    assert world.iteration_time == plain.iteration_time
    assert world.memory == plain.memory
    assert world.bytes_per_link_kind == plain.bytes_per_link_kind
    assert spans(world)["gcd_pair"] == 0.0


def test_pair_level_gathers_run_on_the_package_link():
    """A parameter all-gather inside a GCD pair is priced on the 200 GB/s quad link."""
    r = simulate(frontier(partition={"parameters": "gcd_pair"}))
    gathers = [op for op in r.ops if op.name.startswith("all_gather params fwd")]
    assert gathers and all(op.meta["ranks"] == 2 for op in gathers)
    ctx = build_context(frontier(partition={"parameters": "gcd_pair"}))
    assert ctx.cluster.intra_ring(2).bytes_per_s == pytest.approx(200e9)


@pytest.mark.parametrize(
    "overrides,key",
    [
        ({"cluster.gpu": "A100-80GB", "cluster.intra_node": {"fabric": "nvswitch"}}, "partition.parameters"),
        ({"training.sharding": {"stage": 1, "partition": {"gradients": "node"}}}, "partition.gradients"),
        ({"training.sharding": {"stage": 2, "partition": {"parameters": "node"}}}, "partition.parameters"),
        (
            {"training.sharding": {"stage": 3, "partition": {"parameters": "world", "gradients": "node"}}},
            "partition.parameters",
        ),
        (
            {
                "training.sharding": {
                    "stage": 3,
                    "zeropp": {"quantized_weights": True},
                    "partition": {"parameters": "node"},
                }
            },
            "sharding.partition",
        ),
        (
            {"training.sharding": {"framework": "fsdp", "partition": {"parameters": "node"}}},
            "sharding.partition",
        ),
        ({"training.offload": {"mode": "zero"}}, "sharding.partition"),
        (
            {"cluster.heterogeneity": {"slow_gpus": [{"rank": 3, "compute_factor": 1.5}]}},
            "cluster.heterogeneity",
        ),
    ],
)
def test_refusals_name_the_key(overrides, key):
    base = {**FRONTIER, "training.sharding": {"stage": 3, "partition": {"parameters": "gcd_pair"}}}
    with pytest.raises(InputError) as exc:
        make_scenario(**{**base, **overrides})
    assert exc.value.key.endswith(key) and "\n" not in str(exc.value)


def test_frontier_preset_partitions():
    s = load_scenario("preset:frontier-gpt3-13b-zero3")
    r = simulate(
        s.with_changes(**{"training.sharding.partition": {"parameters": "gcd_pair", "gradients": "node"}})
    )
    assert r.extra["sharding"]["partition"] == {
        "parameters": "gcd_pair",
        "gradients": "node",
        "optimizer_states": "world",
    }


def test_narrow_parameters_rebuild_their_shards_during_the_first_forward():
    """Parameters over a GCD pair, optimizer states over the world: each layer's updated slices are
    gathered into its pair shard on the gather stream before that layer's forward gathers it, once per
    step (not per micro-step); with the same level for both there is nothing to rebuild."""
    r = simulate(frontier(partition={"parameters": "gcd_pair"}, **{"workload.gradient_accumulation": 2}))
    ctx = build_context(frontier(partition={"parameters": "gcd_pair"}))
    refresh = [op for op in r.ops if op.name.startswith("all_gather updated param slices")]
    assert len(refresh) == sum(1 for layer in ctx.workload.layers if layer.params)
    assert {op.stream for op in refresh} == {"gather"} and all(op.meta["ranks"] == W // 2 for op in refresh)
    first_fwd = min(op.end for op in r.ops if op.name.startswith("fwd "))
    assert min(op.start for op in refresh) < first_fwd
    same = simulate(
        frontier(partition=dict.fromkeys(("parameters", "gradients", "optimizer_states"), "node"))
    )
    assert not [op for op in same.ops if "updated param" in op.name]


def test_out_of_memory_names_the_partition():
    s = load_scenario("preset:frontier-gpt3-13b-zero3")
    pair = dict.fromkeys(("parameters", "gradients", "optimizer_states"), "gcd_pair")
    with pytest.raises(InputError, match="wider levels") as exc:
        simulate(s.with_changes(**{"training.sharding.partition": pair}))
    assert "\n" not in str(exc.value)


def test_topology_and_run_show_the_levels(runner):
    from clustersim.cli import app

    out = runner.invoke(app, ["topology", "show", "preset:frontier-gpt3-13b-zero3"])
    assert out.exit_code == 0 and "GCD pair" in out.output and "200.00" in out.output
    out = runner.invoke(app, ["run", "examples/frontier-hierarchical-partition.yaml", "--samples", "0"])
    assert out.exit_code == 0, out.output
    assert "parameters: node, gradients: node, optimizer states: world" in out.output
    assert "Sharding collectives per node: inside GCD pairs 0 B" in out.output


def test_stage_1_and_2_bytes_match_closed_forms():
    """Stage 2, gradients in the node, optimizer states over the world: reduce-scatter M in the node,
    the shard M/G reduce-scattered across nodes on G rails, the updated M all-gathered over the world.
    Stage 1, optimizer states in the node: reduce-scatter M in the node, all-reduce of the shard M/G
    across nodes, the updated M all-gathered in the node."""
    s2 = frontier(2, {"gradients": "node", "optimizer_states": "world"})
    M = 2 * build_context(s2).params
    got = spans(simulate(s2))
    world_gather = (W - 1) / W * M
    assert got["inter_node"] == pytest.approx((N - 1) / N * M + world_gather, rel=1e-9)
    assert got["node"] == pytest.approx((G - 1) * M + G * world_gather - world_gather, rel=1e-9)
    got = spans(simulate(frontier(1, {"optimizer_states": "node"})))
    assert got["inter_node"] == pytest.approx(2 * (N - 1) / N * M, rel=1e-9)
    assert got["node"] == pytest.approx(2 * (G - 1) * M, rel=1e-9)
    assert got["gcd_pair"] == 0.0
