"""Stragglers, degraded NICs, background jobs and an oversubscribed spine, against closed forms."""

from __future__ import annotations

import pytest

from clustersim.cli import app
from clustersim.errors import InputError
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.simulator.program import CollectiveSpec
from clustersim.topologies import GroupShape

BIG = 1 << 34  # 16 GiB: the bandwidth term dwarfs the latency one (< 0.1% of it here)


def _dgx(nodes: int = 2, **changes):
    s = load_scenario("preset:dgx-h100-gpt3-1.3b").with_changes(**{"cluster.nodes": nodes})
    return s.with_changes(**changes) if changes else s


def _flow_time(scenario, op="all_reduce", shape=None, nbytes=BIG, algo="ring"):
    ctx = build_context(scenario.with_changes(**{"training.network": "flow"}))
    shape = shape or ctx.world
    cost = ctx.collectives.cost(op, nbytes, shape, algo)
    return ctx.network.time(CollectiveSpec(op, nbytes, shape, cost.algorithm, cost.protocol))


COMPUTE = ("forward", "backward", "optimizer", "other")


def test_one_gpu_20_percent_slower_makes_the_synchronous_step_at_least_20_percent_slower():
    """Every collective waits for the slowest rank, whose compute chain alone takes 1.2x the typical
    rank's: the step is at least 1.2 x the compute part of the symmetric step."""
    base = simulate(_dgx())
    slow = simulate(_dgx(**{"cluster.heterogeneity": {"slow_gpus": [{"rank": 11, "compute_factor": 1.2}]}}))
    compute = sum(base.breakdown[k] for k in COMPUTE)
    assert slow.iteration_time >= 1.2 * compute
    assert slow.iteration_time > 1.15 * base.iteration_time
    st = slow.extra["straggler"]
    assert st["rank"] == 11 and st["compute_factor"] == 1.2 and st["delay_s"] > 0
    assert base.extra.get("straggler") is None


def test_jitter_makes_the_slowest_draw_the_straggler():
    s = _dgx(**{"cluster.heterogeneity": {"jitter": {"sigma": 0.1, "seed": 3}}})
    r = simulate(s)
    st = r.extra["straggler"]
    assert st["compute_factor"] > st["typical_factor"]
    base = simulate(_dgx())
    compute = sum(base.breakdown[k] for k in COMPUTE)
    assert r.iteration_time >= st["compute_factor"] * compute * 0.999


@pytest.mark.parametrize("ratio", [2.0, 4.0])
def test_spine_oversubscription_slows_inter_node_all_reduce_by_the_ratio(ratio):
    """32 nodes on leaves of 16: every ring hop between nodes crosses the spine (fabric.py placement),
    and a leaf's uplinks carry 1/ratio of what its NICs can send. 256 GiB: the 510 ring steps'
    latency is 0.4% of the time."""
    fabric = {"cluster.fabric.kind": "leaf_spine", "cluster.fabric.nodes_per_leaf": 16}
    flat = _flow_time(_dgx(32, **fabric), nbytes=1 << 38)
    over = _flow_time(_dgx(32, **fabric, **{"cluster.fabric.oversubscription": ratio}), nbytes=1 << 38)
    assert over / flat == pytest.approx(ratio, rel=0.03)


def test_a_background_job_halves_the_bandwidth_of_the_links_it_shares():
    """One greedy flow of another job beside each of the ring's NIC flows: max-min gives each half."""
    alone = _flow_time(_dgx())
    shared = _flow_time(_dgx(**{"cluster.heterogeneity": {"background": [{"links": "nics"}]}}))
    assert shared / alone == pytest.approx(2.0, rel=0.03)
    intra = GroupShape(1, 8)  # a node's own ring does not touch the NICs: unaffected
    assert _flow_time(
        _dgx(**{"cluster.heterogeneity": {"background": [{"links": "nics"}]}}), shape=intra
    ) == (pytest.approx(_flow_time(_dgx(), shape=intra), rel=1e-9))


@pytest.mark.parametrize("flows", [1, 3])
def test_background_flows_weighted_equal_the_flows_listed_one_by_one(flows, monkeypatch):
    """k background flows on a link are one weighted flow (maxmin.FlowSet's weights): the same time
    and link bytes as k flows listed one by one, as they once were."""
    from clustersim.simulator.network import faults

    bg = {"cluster.heterogeneity": {"background": [{"links": "nics", "flows_per_link": flows}]}}
    weighted = _flow_time(_dgx(**bg))
    real = faults.background_paths

    def one_by_one(net, hetero):
        paths, weights = real(net, hetero)
        return [p for p, w in zip(paths, weights) for _ in range(int(w))], [1.0] * int(sum(weights))

    monkeypatch.setattr(faults, "background_paths", one_by_one)
    assert _flow_time(_dgx(**bg)) == pytest.approx(weighted, rel=1e-12)
    assert weighted / _flow_time(_dgx()) == pytest.approx(1 + flows, rel=0.03)


def test_a_billion_background_flows_cost_one_entry_per_link():
    bg = {"cluster.heterogeneity": {"background": [{"links": "nics", "flows_per_link": 10**9}]}}
    assert _flow_time(_dgx(**bg)) / _flow_time(_dgx()) == pytest.approx(1e9 + 1, rel=0.03)


def test_a_degraded_nic_gates_the_ring_through_it():
    """A ring channel through a NIC at half rate takes twice as long; the collective ends with it."""
    alone = _flow_time(_dgx())
    slow = _dgx(
        **{"cluster.heterogeneity": {"degraded_nics": [{"node": 1, "nic": 3, "bandwidth_factor": 0.5}]}}
    )
    assert _flow_time(slow) / alone == pytest.approx(2.0, rel=0.03)


def test_network_faults_on_the_analytical_backend_are_noted_not_silently_ignored():
    s = _dgx(**{"cluster.heterogeneity": {"degraded_nics": [{"node": 1, "bandwidth_factor": 0.5}]}})
    assert any("flow backend only" in n for n in simulate(s).notes)


@pytest.mark.parametrize(
    "hetero,key",
    [
        ({"slow_gpus": [{"rank": 16, "compute_factor": 1.2}]}, "cluster.heterogeneity.slow_gpus.0.rank"),
        (
            {"degraded_nics": [{"node": 2, "bandwidth_factor": 0.5}]},
            "cluster.heterogeneity.degraded_nics.0.node",
        ),
        (
            {"degraded_nics": [{"node": 0, "nic": 8, "bandwidth_factor": 0.5}]},
            "cluster.heterogeneity.degraded_nics.0.nic",
        ),
        ({"background": [{"links": "nics", "nodes": [5]}]}, "cluster.heterogeneity.background.0.nodes"),
    ],
)
def test_a_fault_on_something_that_does_not_exist_is_refused_naming_the_key(hetero, key):
    with pytest.raises(InputError) as err:
        _dgx(**{"cluster.heterogeneity": hetero})
    assert err.value.key == key


@pytest.mark.parametrize(
    "hetero,key",
    [
        (
            {"slow_gpus": [{"rank": 3, "compute_factor": 1.2}, {"rank": 3, "compute_factor": 1.5}]},
            "cluster.heterogeneity.slow_gpus.1",
        ),
        (
            {"node_gpus": [{"node": 1, "gpu": "A100-80GB"}, {"node": 1, "gpu": "B200"}]},
            "cluster.heterogeneity.node_gpus.1",
        ),
        (
            {
                "degraded_nics": [
                    {"node": 1, "nic": 2, "bandwidth_factor": 0.5},
                    {"node": 1, "nic": 2, "bandwidth_factor": 0.5},
                ]
            },
            "cluster.heterogeneity.degraded_nics.1",
        ),
    ],
)
def test_a_rank_node_or_nic_listed_twice_is_refused_not_multiplied(hetero, key):
    """Two entries for one rank used to multiply (1.2 x 1.5 = 1.8), and a node listed with two GPU
    types took both roofline ratios: refused, naming the second entry."""
    with pytest.raises(InputError) as err:
        _dgx(**{"cluster.heterogeneity": hetero})
    assert err.value.key == key and "already listed" in str(err.value)


def test_cli_straggler_on_a_missing_rank_is_one_line_exit_2(runner, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "cluster: {nodes: 2, gpus_per_node: 8, gpu: H100-SXM, nic: {count: 8, line_rate_gbps: 400},\n"
        "  heterogeneity: {slow_gpus: [{rank: 99, compute_factor: 1.2}]}}\n"
        "workload: {model: GPT-3-1.3B, micro_batch: 4, seq_len: 2048, precision: bf16}\n"
    )
    r = runner.invoke(app, ["run", str(path)])
    assert r.exit_code == 2
    assert "slow_gpus.0.rank" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


# ---- multi-tier fabrics ------------------------------------------------------------------------------
def test_a_million_gpus_on_two_tiers_of_32_node_leaves_is_refused_naming_the_key():
    """Issue #11: 125,000 DGX nodes on 32-node leaves need 3,907 leaves; a spine switch of the largest
    radix (144 ports) joins 144. One line, exit 2, naming cluster.nodes and the way out."""
    with pytest.raises(InputError) as err:
        load_scenario("preset:dgx-h100-gpt3-1.3b").with_world_size(1_000_000)
    assert err.value.key == "cluster.nodes" and "leaves_per_pod" in str(err.value)


def test_a_third_tier_holds_them_and_its_oversubscription_slows_groups_spanning_pods():
    s = load_scenario("preset:dgx-h100-gpt3-1.3b").with_changes(**{"cluster.fabric.leaves_per_pod": 32})
    big = s.with_world_size(1_000_000)
    over = big.with_changes(**{"cluster.fabric.core_oversubscription": 4.0})
    a, b = simulate(big), simulate(over)
    assert b.iteration_time > a.iteration_time
    shape = GroupShape(big.cluster.nodes, 8)
    ca, cb = build_context(big), build_context(over)
    assert cb.cluster.inter_node(shape).bytes_per_s == pytest.approx(
        ca.cluster.inter_node(shape).bytes_per_s / 4
    )


def test_a_leaf_with_more_nodes_than_ports_is_refused():
    with pytest.raises(InputError) as err:
        _dgx(**{"cluster.fabric.ports_per_switch": 48})  # 32 nodes down + 32 up > 48
    assert err.value.key == "cluster.fabric.nodes_per_leaf"
    with pytest.raises(InputError) as err:
        _dgx(**{"cluster.fabric.leaves_per_pod": 40, "cluster.fabric.ports_per_switch": 64})
    assert err.value.key == "cluster.fabric.leaves_per_pod"


def test_core_oversubscription_slows_a_ring_across_pods_by_its_ratio_in_both_backends():
    """64 nodes, 8-node leaves, 2 leaves per pod: 4 pods, every ring hop crosses the core."""
    fabric = {
        "cluster.fabric.kind": "leaf_spine",
        "cluster.fabric.nodes_per_leaf": 8,
        "cluster.fabric.leaves_per_pod": 2,
    }
    flat = _dgx(64, **fabric)
    over = _dgx(64, **fabric, **{"cluster.fabric.core_oversubscription": 2.0})
    assert _flow_time(over, nbytes=1 << 38) / _flow_time(flat, nbytes=1 << 38) == pytest.approx(2.0, rel=0.03)
    ctx = build_context(over)
    ana = ctx.collectives.cost("all_reduce", 1 << 38, ctx.world, "ring").time
    assert _flow_time(over, nbytes=1 << 38) == pytest.approx(ana, rel=0.03)


def test_the_trace_has_a_process_per_rank_class(tmp_path):
    r = simulate(_dgx(**{"cluster.heterogeneity": {"slow_gpus": [{"rank": 3, "compute_factor": 1.5}]}}))
    events = r.chrome_trace()["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert set(procs) == {0, 1} and procs[1].startswith("slowest rank")
    slow_bwd = [e for e in events if e.get("ph") == "X" and e["pid"] == 1 and e["cat"] == "backward"]
    typical_bwd = [e for e in events if e.get("ph") == "X" and e["pid"] == 0 and e["cat"] == "backward"]
    assert sum(e["dur"] for e in slow_bwd) == pytest.approx(
        1.5 * sum(e["dur"] for e in typical_bwd), rel=0.01
    )


def test_a_node_of_an_older_gpu_is_the_straggler_by_its_roofline_ratio():
    """One node of A100s among H100s: its ranks compute slower by the ratio of the workload's
    forward+backward roofline times, and the synchronous step is at least that times the compute."""
    s = _dgx(**{"cluster.heterogeneity": {"node_gpus": [{"node": 1, "gpu": "A100-80GB"}]}})
    r = simulate(s)
    st = r.extra["straggler"]
    assert st["rank"] // 8 == 1 and st["compute_factor"] > 1.5  # A100 bf16 dense: 312 vs 989 TFLOP/s peak
    base = simulate(_dgx())
    compute = sum(base.breakdown[k] for k in ("forward", "backward"))
    assert r.iteration_time >= st["compute_factor"] * compute
    with pytest.raises(InputError) as err:
        _dgx(**{"cluster.heterogeneity": {"node_gpus": [{"node": 1, "gpu": "Z100"}]}})
    assert err.value.key.startswith("cluster.heterogeneity.node_gpus.0.gpu")


def test_a_node_gpu_without_the_workloads_precision_names_the_node_not_the_workload():
    """A V100 node in a bf16 job: the V100 has no bf16 tensor cores. The error used to come from the
    straggler's roofline ratio as workload.precision, which the user had not changed."""
    with pytest.raises(InputError) as err:
        _dgx(**{"cluster.heterogeneity": {"node_gpus": [{"node": 1, "gpu": "V100-SXM2"}]}})
    assert err.value.key == "cluster.heterogeneity.node_gpus.0.gpu" and "bf16" in str(err.value)


DILOCO = {
    "training.optimizer": "diloco",
    "training.optimizer_options": {"workers": 2},
    "workload.micro_batch": 3,
}


@pytest.mark.parametrize("optimizer", [{}, DILOCO])
def test_a_straggler_does_not_change_the_bytes_each_node_moves(optimizer):
    """The slowest rank's copy of the program carries no bytes; a node still moves what it moves
    without the straggler (the two rank classes are not two pipeline stages to average over)."""
    base = simulate(_dgx(**optimizer))
    slow = simulate(
        _dgx(**optimizer, **{"cluster.heterogeneity": {"slow_gpus": [{"rank": 3, "compute_factor": 1.2}]}})
    )
    for kind in ("intra_node_per_node", "inter_node_per_node"):
        value = base.bytes_per_link_kind[kind]
        assert value > 0
        assert slow.bytes_per_link_kind[kind] == pytest.approx(value), kind
    for b, s in zip(base.extra.get("steps", []), slow.extra.get("steps", [])):
        assert s["inter_node_bytes"] == pytest.approx(b["inter_node_bytes"])


def test_readme_worked_example_matches_a_run():
    """The shared-fabric worked example of docs/network.md (its scenario and the numbers of its excerpt)
    is what `run` prints for that scenario."""
    import re
    from pathlib import Path

    import yaml

    from clustersim.scenario import validate_scenario

    readme = (Path(__file__).resolve().parents[1] / "docs" / "network.md").read_text()
    section = readme.split("Worked example:", 1)[1]
    block, rest = section.split("```yaml\n", 1)[1].split("```\n", 1)
    scenario = yaml.safe_load(block)
    excerpt = rest.split("```\n", 1)[1].split("```", 1)[0]
    r = simulate(validate_scenario(scenario), uncertainty_samples=0)
    shown = re.search(r"iteration time ([\d.]+) ms", excerpt).group(1)
    assert f"{r.iteration_time * 1e3:.2f}" == shown
    idle = re.search(r"the typical rank idles ([\d.]+) ms", excerpt).group(1)
    assert f"{r.breakdown['idle'] * 1e3:.2f}" == idle


@pytest.mark.parametrize("stage", [0, 3])
def test_a_rank_no_slower_than_the_others_delays_nothing(stage):
    """A 'straggler' at compute factor 1 delays no collective, also under ZeRO-3, whose gathers and
    reduce-scatters queue on streams of their own (a wait is measured from the op before it on its
    own stream, not from the previous collective of the program)."""
    s = _dgx(
        **{
            "workload.model": "GPT-3-13B",
            "workload.micro_batch": 1,
            "workload.activation_checkpointing": True,
            "training.sharding": {"stage": stage},
            "cluster.heterogeneity": {"slow_gpus": [{"rank": 9, "compute_factor": 1.0}]},
        }
    )
    if stage == 0:
        s = s.with_changes(**{"workload.model": "GPT-3-1.3B"})
    st = simulate(s).extra["straggler"]
    assert st["delay_s"] == 0.0 and st["collectives_delayed"] == 0


def test_run_names_no_straggler_when_no_rank_is_slower(runner, tmp_path):
    """A GPU listed in slow_gpus with a factor below 1 is faster, not a straggler: run used to print
    "Slowest rank 0 (compute x1, typical rank x1) delays 0 collective(s)", naming a rank no one
    listed."""
    path = tmp_path / "fast.yaml"
    path.write_text(
        "cluster: {nodes: 2, gpus_per_node: 8, gpu: H100-SXM, nic: {count: 8, line_rate_gbps: 400},\n"
        "  heterogeneity: {slow_gpus: [{rank: 3, compute_factor: 0.5}]}}\n"
        "workload: {model: GPT-3-1.3B, micro_batch: 4, seq_len: 2048, precision: bf16}\n"
    )
    r = runner.invoke(app, ["run", str(path), "--samples", "0"])
    assert r.exit_code == 0, r.output
    assert "Slowest rank" not in r.output and "no rank computes slower than the typical one" in r.output


def test_run_says_a_pipelines_idle_includes_its_bubble(runner, tmp_path):
    """Under a pipeline the breakdown's idle is the typical replica's critical stage's, its 1F1B
    bubble included: "the typical rank idles" read as if the straggler cost all of it."""
    path = tmp_path / "pp.yaml"
    path.write_text(
        "cluster: {nodes: 2, gpus_per_node: 4, gpu: A100-80GB, nic: {count: 1, line_rate_gbps: 200},\n"
        "  heterogeneity: {slow_gpus: [{rank: 5, compute_factor: 1.3}]}}\n"
        "workload: {model: GPT-3-1.3B, micro_batch: 1, seq_len: 512, gradient_accumulation: 4}\n"
        "training: {parallelism: {tensor: 2, pipeline: 2}}\n"
    )
    r = runner.invoke(app, ["run", str(path), "--samples", "0"])
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("Slowest rank"))
    assert line.startswith("Slowest rank 5 (stage 1 of replica 0; compute x1.3, typical rank x1)")
    assert "critical stage idles" in line and "pipeline bubble included" in line
