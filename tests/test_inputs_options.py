"""Every option that can change a result does: each optimizer option, network parameter and hardware
rate moved by 10x (or to another of its values) moves the simulated iteration, or is listed here with
the result it does move and why the iteration cannot (docs/input-validation.md). An option accepted
and ignored (DiLoCo's inter_worker_latency_ms once was) fails here; so does a new option without a
row."""

from __future__ import annotations

import pytest

from clustersim.optimizer_options import OPTIONS
from clustersim.planner.compare import warmup_fraction
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate
from tests.conftest import make_scenario
from tests.inputs_support import GPU


def _time(scenario) -> float:
    return simulate(scenario, uncertainty_samples=0).iteration_time


# preset:default is the 1-bit Adam paper's cluster (8 nodes of 4 V100, 4.1 Gb/s TCP), where every
# optimizer's communication matters. (optimizer, option, the value moved to): 10x the default, a tenth
# of it where 10x does not bind, or another of its values.
OPTIMIZER_MOVES = [
    ("adam", "implementation", "for_loop"),
    ("sgdm", "implementation", "for_loop"),
    ("onebit-adam", "stage", "warmup"),
    ("onebit-adam", "backend", "mpi_host_staged"),
    ("onebit-adam", "param_groups", 10),
    ("zero-one-adam", "total_steps", 1_000_000),
    ("zero-one-adam", "var_freeze_step", 2_300),
    ("zero-one-adam", "var_update_scaler", 160),
    ("zero-one-adam", "local_step_scaler", 3_268),
    # the default 16 does not bind within 100,000 steps (the local interval doubles every 32,678 steps,
    # so reaches 4): a tenth of it, clipped to a whole step, does
    ("zero-one-adam", "local_step_clipper", 1),
    ("zero-one-adam", "backend", "mpi_host_staged"),
    ("zero-one-adam", "param_groups", 10),
    ("binsgdm", "scheme", "flat"),
    ("diloco", "workers", 4),
    ("diloco", "inner_steps", 1000),
    # fragments pay where the exchange outlasts the steps it overlaps (a 1 Gb/s link between workers):
    # a quarter of the model per synchronisation hides behind one inner step, the whole model does not
    ("diloco", "fragments", 4),
    ("diloco", "overlap_steps", 1),
    ("diloco", "bits", 4),
    ("diloco", "inter_worker_gbps", 1.0),
    ("diloco", "inter_worker_latency_ms", 100.0),
    # preset:default's DiLoCo blocks (tau 0): released during the backward, the exchange overlaps it
    ("diloco", "outer_release", "during_backward"),
]

# Options that do not change one iteration, with the result they change (tested below).
NOT_IN_AN_ITERATION = {
    ("onebit-adam", "freeze_step"): "the warmup's share of a run's steps (compare/sweep time-to-train)",
}


def test_every_optimizer_option_has_a_row():
    listed = {(o, k) for o, k, _ in OPTIMIZER_MOVES} | set(NOT_IN_AN_ITERATION)
    every = {(o, k) for o, model in OPTIONS.items() for k in model.model_fields}
    assert every - listed == set(), "an option with no row: add how moving it moves a result"


@pytest.mark.parametrize(
    "optimizer,option,value", OPTIMIZER_MOVES, ids=[f"{o}.{k}" for o, k, _ in OPTIMIZER_MOVES]
)
def test_moving_an_optimizer_option_moves_the_iteration(optimizer, option, value):
    base = load_scenario("preset:default").with_changes(**{"training.optimizer": optimizer})
    if option == "fragments":
        base = base.with_changes(
            **{"training.optimizer_options": {"overlap_steps": 1, "inter_worker_gbps": 1.0}}
        )
    moved = base.with_changes(**{f"training.optimizer_options.{option}": value})
    assert _time(moved) != pytest.approx(_time(base), rel=1e-6)


def test_freeze_step_moves_the_warmup_share_of_a_run():
    base = load_scenario("preset:default").with_changes(**{"training.optimizer": "onebit-adam"})
    shares = [
        warmup_fraction(base.with_changes(**{"training.optimizer_options.freeze_step": f}), 100_000, None)
        for f in (1_000, 10_000)
    ]
    assert shares == [0.01, 0.1]


def test_diloco_latency_between_workers_is_paid_on_the_clusters_own_nics():
    """DiLoCo's outer ring crosses the workers' latency 2(M-1) times a fragment synchronisation: on
    preset:default (2 workers, 100 inner steps, the exchange blocking) 10 s adds 20 s to the sync window
    and 0.2 s to the mean step."""
    base = load_scenario("preset:default").with_changes(**{"training.optimizer": "diloco"})
    times = [
        _time(base.with_changes(**{"training.optimizer_options.inter_worker_latency_ms": ms}))
        for ms in (0.0, 0.01, 10_000.0)
    ]
    assert times[0] < times[1] < times[2]
    assert times[2] - times[0] == pytest.approx(2 * 10.0 / 100, rel=1e-3)


# Network parameters and hardware rates on the small scenario (2 nodes of 4 A100s, InfiniBand 200):
# (name, keys set on both, the key moved, base value, moved value: the slower). Rates move by 10x.
LEAF_SPINE = {"cluster.nodes": 20, "cluster.fabric": {"kind": "leaf_spine", "nodes_per_leaf": 10}}
PODS = {
    "cluster.nodes": 20,
    "cluster.fabric": {"kind": "leaf_spine", "nodes_per_leaf": 2, "leaves_per_pod": 5},
}
INPUT = {"workload.input": {"bytes_per_sample": 50e6, "row_bytes": 4096}}
NETWORK_MOVES = [
    ("line rate", {}, "cluster.nic.line_rate_gbps", 200, 20),
    ("effective rate", {}, "cluster.nic.effective_gbps", 100, 10),
    ("NIC latency", {}, "cluster.nic.latency_us", 5.0, 500.0),
    ("NIC count", {}, "cluster.nic.count", 8, 1),
    ("measured busbw", {}, "cluster.intra_node.measured_allreduce_busbw_gbs", 100, 10),
    ("leaf oversubscription", LEAF_SPINE, "cluster.fabric.oversubscription", 1.0, 10.0),
    ("core oversubscription", PODS, "cluster.fabric.core_oversubscription", 1.0, 5.0),
    ("DDP bucket", {}, "training.ddp_bucket_cap_mb", 25.0, 250.0),
    ("host DRAM", INPUT, "cluster.host.dram_gbs", 200.0, 20.0),
    ("PCIe generation", INPUT, "cluster.intra_node.pcie_gen", 5, 3),
]
FLOW_ONLY_MOVES = [
    (
        "degraded NIC",
        {},
        "cluster.heterogeneity",
        {"degraded_nics": [{"node": 1, "bandwidth_factor": 0.5}]},
        {"degraded_nics": [{"node": 1, "bandwidth_factor": 0.05}]},
    ),
    (
        "background flows",
        {},
        "cluster.heterogeneity",
        {"background": [{"flows_per_link": 1}]},
        {"background": [{"flows_per_link": 10}]},
    ),
]


def _moves(backend):
    rows = NETWORK_MOVES + (FLOW_ONLY_MOVES if backend == "flow" else [])
    return [pytest.param(backend, *row[1:], id=f"{backend}-{row[0]}") for row in rows]


@pytest.mark.parametrize("backend,keys,key,before,after", _moves("analytical") + _moves("flow"))
def test_moving_a_network_parameter_moves_the_iteration(backend, keys, key, before, after):
    base = {**keys, "training.network": backend}
    a = _time(make_scenario(**base, **{key: before}))
    b = _time(make_scenario(**base, **{key: after}))
    assert b > a * (1 + 1e-6), f"{key}: {before} -> {after} left {a:.6g} s"


# An inline GPU (A100-80GB's datasheet figures): its rates, moved by 10x, move the compute.
GPU_MOVES = [
    ("peak_tflops", {"fp32": 19.5, "tf32": 15.6, "fp16": 31.2, "bf16": 31.2}),
    ("hbm_gbs", 203.9),
    ("nvlink", {"links": 12, "gbs_per_link": 2.0}),
]


@pytest.mark.parametrize("field,slower", GPU_MOVES, ids=[f for f, _ in GPU_MOVES])
def test_moving_a_gpu_rate_moves_the_iteration(field, slower):
    gpu = {**GPU, "name": "X100"}
    a = _time(make_scenario(**{"cluster.gpu": gpu}))
    b = _time(make_scenario(**{"cluster.gpu": {**gpu, field: slower}}))
    assert b > a * (1 + 1e-6), f"cluster.gpu.{field} a tenth as fast left {a:.6g} s"
