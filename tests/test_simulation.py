"""Invariants of a simulated iteration."""

import pytest

from clustersim.scenario import WorkloadSpec
from clustersim.simulator import simulate
from clustersim.simulator.strategies.buckets import MIB, assign_buckets
from clustersim.workloads import build_workload
from tests.conftest import make_scenario


def compute_only(r):
    return r.breakdown["forward"] + r.breakdown["backward"]


def test_breakdown_adds_up_to_iteration_time(default_scenario):
    r = simulate(default_scenario)
    assert sum(r.breakdown.values()) == pytest.approx(r.iteration_time)
    assert r.samples_per_s == pytest.approx(512 / r.iteration_time)


def test_overlap_never_beats_the_compute_only_bound():
    for nodes in (1, 2, 8):
        r = simulate(make_scenario(**{"cluster.nodes": nodes}))
        assert r.iteration_time >= compute_only(r) + r.breakdown["optimizer"] - 1e-12


def test_overlap_helps_and_never_hurts():
    on = simulate(make_scenario(**{"cluster.nodes": 4, "training.overlap": True}))
    off = simulate(make_scenario(**{"cluster.nodes": 4, "training.overlap": False}))
    assert on.iteration_time < off.iteration_time
    assert off.breakdown["exposed_communication"] > on.breakdown["exposed_communication"]


@pytest.mark.parametrize(
    "key,values",
    [
        ("cluster.nic.line_rate_gbps", [10, 20, 40, 100, 200, 400]),
        ("cluster.nic.count", [1, 2, 4]),
    ],
)
def test_more_bandwidth_is_never_slower(key, values):
    times = [simulate(make_scenario(**{"cluster.nodes": 8, key: v})).iteration_time for v in values]
    assert all(a >= b - 1e-12 for a, b in zip(times, times[1:]))


def test_bucket_launch_rule_and_fifo_stream(default_scenario):
    r = simulate(default_scenario)
    b = r.buckets
    assert b[0]["bytes"] <= 1 * MIB + 1024 * 1024 * 2 * 2  # 1 MiB cap, may overshoot by one tensor
    for prev, cur in zip(b, b[1:]):
        assert cur["start_s"] >= prev["end_s"] - 1e-12
    # exposed communication = end of the last all-reduce - end of backward (and its bucket copies)
    bwd_end = max(o.end for o in r.ops if o.stream == "compute" and o.end <= b[-1]["end_s"])
    assert r.breakdown["exposed_communication"] == pytest.approx(b[-1]["end_s"] - bwd_end, rel=1e-6)


def test_buckets_cover_every_parameter_once():
    w = build_workload(WorkloadSpec(model="BERT-Large", micro_batch=1))
    buckets = assign_buckets(w.layers, 2, 25, 1)
    assert sum(b.elements for b in buckets) == w.params
    assert all(b.elements * 2 >= 25 * MIB for b in buckets[1:-1])


def test_gradient_accumulation_reduces_once():
    one = simulate(make_scenario(**{"cluster.nodes": 2}))
    four = simulate(make_scenario(**{"cluster.nodes": 2, "workload.gradient_accumulation": 4}))
    assert four.breakdown["forward"] == pytest.approx(4 * one.breakdown["forward"])
    assert four.bytes_per_link_kind["inter_node_per_node"] == pytest.approx(
        one.bytes_per_link_kind["inter_node_per_node"]
    )
    assert four.samples_per_iteration == 4 * one.samples_per_iteration


def test_single_gpu_has_no_communication():
    r = simulate(make_scenario(**{"cluster.nodes": 1, "cluster.gpus_per_node": 1}))
    assert r.breakdown["exposed_communication"] == 0
    assert r.bytes_per_link_kind["inter_node_per_node"] == 0


def test_run_cost_does_not_grow_with_gpu_count():
    small = simulate(make_scenario(**{"cluster.nodes": 1}))
    huge = simulate(make_scenario(**{"cluster.nodes": 16384}))
    assert len(huge.ops) == len(small.ops)
    assert huge.world_size == 65536


def test_fp32_gradients_double_the_bytes():
    a = simulate(make_scenario(**{"cluster.nodes": 2}))
    b = simulate(make_scenario(**{"cluster.nodes": 2, "training.gradient_dtype": "fp32"}))
    assert b.bytes_per_link_kind["inter_node_per_node"] == pytest.approx(
        2 * a.bytes_per_link_kind["inter_node_per_node"], rel=0.01
    )


def test_measured_phases_are_used_when_the_profile_matches():
    from clustersim.scenario import load_scenario

    r = simulate(load_scenario("preset:onebit-adam-ethernet"))
    assert r.breakdown["forward"] == pytest.approx(0.0355)
    assert r.breakdown["backward"] == pytest.approx(0.060)
    assert any("measured phases" in n for n in r.notes)


def test_trace_has_one_track_per_stream(default_scenario, tmp_path):
    import json

    r = simulate(default_scenario)
    path = tmp_path / "t.json"
    r.write_trace(path)
    data = json.loads(path.read_text())
    names = {e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "thread_name"}
    assert {"compute", "comm"} <= names
    assert sum(1 for e in data["traceEvents"] if e.get("ph") == "X") == len(r.ops)


def test_op_records_read_as_the_list_they_stand_for():
    """SimulationResult.ops is built when first read (result.OpRecords): length, indexing, slices,
    iteration, equality, pickling (sweeps ship results between processes) and to_dict all see the
    records of every op, in program order, with their times."""
    import pickle

    r = simulate(make_scenario())
    n = len(r.ops)
    assert n > 10
    records = list(r.ops)
    assert len(records) == n and r.ops[0] == records[0] and r.ops[-3:] == records[-3:]
    assert all(a.end >= a.start for a in records)
    assert max(a.end for a in records) == pytest.approx(r.iteration_time)
    assert pickle.loads(pickle.dumps(r)).ops == records
    assert len(r.to_dict(include_ops=True)["ops"]) == n


def test_simulate_leaves_the_garbage_collector_as_it_found_it():
    """simulate pauses Python's cyclic collector while it runs (runner._collector_paused)."""
    import gc

    assert gc.isenabled()
    simulate(make_scenario())
    assert gc.isenabled()
    gc.disable()
    try:
        simulate(make_scenario())
        assert not gc.isenabled()
    finally:
        gc.enable()


MERGE_CASES = [
    {"training.optimizer": "adam"},
    {"training.optimizer": "adam", "training.overlap": False},
    {"training.optimizer": "onebit-adam", "training.optimizer_options": {"stage": "compression"}},
    {"training.optimizer": "zero-one-adam"},
    {"training.optimizer": "binsgdm"},
    {"training.optimizer": "diloco", "training.optimizer_options": {"workers": 2, "inner_steps": 4}},
    {"training.optimizer": "adam", "training.network": "flow"},
    {
        "training.optimizer": "adam",
        "cluster.heterogeneity": {"slow_gpus": [{"rank": 3, "compute_factor": 1.3}]},
    },
]


# Micro-batch 64: the GPU, not the host's dispatch, bounds every pass (merging needs it; where the host
# binds, the micro-steps are listed: test_host_bound_micro_steps_are_listed)
DEVICE_BOUND = {"workload.micro_batch": 64}


def _compared(r):
    return (
        r.iteration_time,
        r.breakdown,
        {k: v for k, v in r.bytes_per_link_kind.items() if isinstance(v, float)},
    )


@pytest.mark.parametrize("changes", MERGE_CASES, ids=lambda c: "-".join(str(v) for v in c.values())[:40])
def test_merged_micro_steps_time_as_the_listed_ones(changes, monkeypatch):
    """Gradient accumulation's micro-steps before the last, merged into one forward and one backward op
    (common.add_micro_steps), give the iteration, breakdown and bytes of the same micro-steps listed
    one by one, on both backends and with a straggler's two rank classes."""
    from clustersim.simulator.strategies import common

    s = make_scenario(**{"cluster.nodes": 2, "workload.gradient_accumulation": 6, **DEVICE_BOUND, **changes})
    listed = simulate(s, uncertainty_samples=0)
    monkeypatch.setattr(common, "MERGE_MICRO_STEPS_ABOVE", 0)
    merged = simulate(s, uncertainty_samples=0)
    assert len(merged.ops) < len(listed.ops)
    (t_m, b_m, x_m), (t_l, b_l, x_l) = _compared(merged), _compared(listed)
    assert t_m == pytest.approx(t_l, rel=1e-12)
    assert b_m == pytest.approx(b_l, rel=1e-12, abs=1e-15)
    assert x_m == pytest.approx(x_l, rel=1e-12)


def test_a_million_micro_steps_cost_what_a_few_do():
    few = simulate(
        make_scenario(**{"workload.gradient_accumulation": 100, **DEVICE_BOUND}), uncertainty_samples=0
    )
    many = simulate(
        make_scenario(**{"workload.gradient_accumulation": 10**6, **DEVICE_BOUND}), uncertainty_samples=0
    )
    assert len(many.ops) == len(few.ops)
    per_micro = few.breakdown["forward"] / 100
    assert many.breakdown["forward"] == pytest.approx(per_micro * 10**6, rel=1e-9)


def test_a_program_past_its_op_limit_is_refused_naming_the_count():
    """ZeRO-2 reduces in every micro-step, so its micro-steps cannot be merged: past the op limit the
    run is refused with the key that made it long (a small limit here stands for MAX_PROGRAM_OPS)."""
    from clustersim.errors import InputError
    from clustersim.simulator.program import op_budget

    s = make_scenario(**{"workload.gradient_accumulation": 50, "training.sharding": {"stage": 2}})
    token = op_budget.set(1_000)
    try:
        with pytest.raises(InputError) as err:
            simulate(s, uncertainty_samples=0)
    finally:
        op_budget.reset(token)
    assert err.value.key == "workload.gradient_accumulation" and "1,000 ops" in str(err.value)
    assert simulate(s, uncertainty_samples=0).iteration_time > 0  # within the real limit it runs


def test_a_hundred_million_repeated_layers_are_refused_before_they_are_built():
    from clustersim.errors import InputError

    layer = {"name": "l", "params": 1000, "forward_flops": 1e6, "repeat": 10**8}
    s = make_scenario(**{"workload.model": None, "workload.layers": [{**layer, "repeat": 1}, layer]})
    with pytest.raises(InputError) as err:
        simulate(s, uncertainty_samples=0)
    assert err.value.key == "workload.layers.1.repeat"


def test_the_band_takes_fewer_draws_for_a_large_program(monkeypatch):
    from clustersim.simulator import runner

    s = make_scenario()
    full = simulate(s, uncertainty_samples=8)
    assert full.interval.samples == 8 and not any("draws" in n for n in full.notes)
    monkeypatch.setattr(runner, "MAX_BAND_OP_RUNS", 5 * runner._ops_per_run.get())
    fewer = simulate(s, uncertainty_samples=8)
    assert fewer.interval.samples == 5 and any("from 5 draws, not 8" in n for n in fewer.notes)
    monkeypatch.setattr(runner, "MAX_BAND_OP_RUNS", 3 * runner._ops_per_run.get())
    none = simulate(s, uncertainty_samples=8)
    assert none.interval is None and any("no P10-P90 band" in n for n in none.notes)


def test_a_program_surely_past_the_limit_is_refused_before_it_is_built(monkeypatch):
    """ZeRO-2 lists every micro-step: 10^6 of them are refused from the lower bound (2 ops per layer
    per micro-step) without building a single op."""
    from clustersim.errors import InputError
    from clustersim.simulator import program

    built = []
    real = program.Program.add_op
    monkeypatch.setattr(program.Program, "add_op", lambda self, *a: built.append(1) or real(self, *a))
    s = make_scenario(**{"workload.gradient_accumulation": 10**6, "training.sharding": {"stage": 2}})
    with pytest.raises(InputError) as err:
        simulate(s, uncertainty_samples=0)
    assert err.value.key == "workload.gradient_accumulation" and not built


def test_zero_offload_at_stage_2_merges_its_micro_steps_and_is_not_refused():
    """ZeRO-Offload at stage 1/2 runs the DDP program, whose plain micro-steps merge: the up-front
    bound must not count them as listed."""
    s = make_scenario(
        **{
            "training.offload.mode": "zero",
            "training.sharding": {"stage": 2},
            "workload.gradient_accumulation": 10**5,
            **DEVICE_BOUND,
        }
    )
    assert len(simulate(s, uncertainty_samples=0).ops) < 1_000


def test_host_bound_micro_steps_are_listed():
    """Where the host's dispatch binds (BERT-Large at micro-batch 8 on an A100, eager), when a kernel can
    run depends on the dispatch of every layer before it: the micro-steps are not merged, and their
    dispatch lane is listed with them."""
    s = make_scenario(**{"workload.gradient_accumulation": 100})
    r = simulate(s, uncertainty_samples=0)
    assert sum(o.stream == "compute" and o.category == "forward" for o in r.ops) == 100 * 26
    assert r.breakdown["exposed_host"] > r.breakdown["forward"]
