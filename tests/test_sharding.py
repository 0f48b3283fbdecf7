"""ZeRO 1/2/3, FSDP and ZeRO++ (training.sharding): memory per rank against the ZeRO paper's formulas,
inter-node bytes against ZeRO++'s closed forms, the programs' structure, and the refusals."""

import math

import pytest

from clustersim.cli import app
from clustersim.errors import InputError
from clustersim.scenario import load_scenario
from clustersim.simulator.context import build_context
from clustersim.simulator.memory import gpu_memory
from clustersim.simulator.runner import simulate
from clustersim.simulator.sharding import model_states
from clustersim.simulator.strategies import registry
from clustersim.simulator.strategies.zeropp import qwz_wire_bytes
from tests.conftest import make_scenario

ZEROPP_ALL = {"quantized_weights": True, "hierarchical_partition": True, "quantized_gradients": True}


def _memory(scenario):
    ctx = build_context(scenario)
    return gpu_memory(ctx, registry.create(ctx)), ctx.params


def _sharded(sharding: dict, **overrides):
    return make_scenario(**{"training.sharding": sharding, **overrides})


# ZeRO paper (Rajbhandari et al. 2020, fig. 1) for mixed-precision Adam: bytes per parameter per rank.
@pytest.mark.parametrize(
    "sharding,formula",
    [
        ({"stage": 1}, lambda n: 4 + 12 / n),
        ({"stage": 2}, lambda n: 2 + 14 / n),
        ({"stage": 3}, lambda n: 16 / n),
        ({"framework": "fsdp"}, lambda n: 16 / n),
        ({"framework": "fsdp", "fsdp_strategy": "grad_op"}, lambda n: 16 / n),
    ],
)
def test_model_states_per_rank_are_the_zero_papers(sharding, formula):
    scenario = _sharded(sharding)
    mem, params = _memory(scenario)
    n = scenario.cluster.world_size
    assert model_states(mem) == pytest.approx(formula(n) * params, rel=1e-12)


def test_ddp_model_states_are_16_bytes_per_parameter():
    mem, params = _memory(make_scenario())
    assert model_states(mem) == pytest.approx(16 * params, rel=1e-12)


def test_fsdp_hybrid_shards_within_the_node_only():
    scenario = _sharded({"framework": "fsdp", "fsdp_strategy": "hybrid"})
    mem, params = _memory(scenario)
    assert model_states(mem) == pytest.approx(16 / scenario.cluster.gpus_per_node * params, rel=1e-12)


def test_other_optimizers_scale_by_their_own_state_bytes():
    # SGD with momentum: fp32 master 4 + momentum 4 = 8 bytes of K instead of Adam's 12.
    scenario = _sharded({"stage": 3}, **{"training.optimizer": "sgdm"})
    mem, params = _memory(scenario)
    assert model_states(mem) == pytest.approx(12 / scenario.cluster.world_size * params, rel=1e-12)


def test_hpz_adds_a_16_bit_copy_partitioned_over_the_node():
    base, params = _memory(_sharded({"stage": 3}))
    scenario = _sharded({"stage": 3, "zeropp": {"hierarchical_partition": True}})
    mem, _ = _memory(scenario)
    assert mem["hpz_secondary_parameters"] == pytest.approx(2 * params / scenario.cluster.gpus_per_node)
    assert mem["total"] > base["total"]


def test_transient_buffers_are_freed_before_the_update():
    """ZeRO-3's gathered parameters are freed before the step; its ipg bucket is allocated whole at
    init (stage3.py: torch.empty(self.reduce_bucket_size) under contiguous_gradients, freed only in
    destroy()), however few parameters the model has (BERT-Large's 335M < 5e8), and held at the update."""
    mem, params = _memory(_sharded({"stage": 3}))
    assert params < 5e8
    assert mem["gathered_parameters"] > 0 and "reduce_bucket" not in mem
    assert mem["ipg_bucket_buffer"] == pytest.approx(5e8 * 2)  # fp16 gradients
    assert mem["peak_update"] == pytest.approx(model_states(mem) + mem["ipg_bucket_buffer"])


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_1_2_allocate_whole_reduce_buckets_two_with_overlap_comm(stage):
    """stage_1_and_2.py backward: buf_0 = torch.empty(int(reduce_bucket_size)) and buf_1 the same with
    overlap_comm, however few parameters the model has (BERT-Large's 335M are fewer than the 5e8
    elements); it counted one bucket, no larger than the model."""
    one, params = _memory(_sharded({"stage": stage}))
    two, _ = _memory(_sharded({"stage": stage, "overlap_comm": True}))
    assert params < 5e8
    assert one["reduce_bucket"] == pytest.approx(5e8 * 2)  # fp16 gradients
    assert two["reduce_bucket"] == pytest.approx(2 * 5e8 * 2)
    assert two["peak_update"] == pytest.approx(one["peak_update"])  # freed before the step


def _inter_bytes(result, stream=None):
    return sum(op.inter_node_bytes for op in result.ops if stream is None or op.stream == stream)


def test_zero3_moves_3m_and_zeropp_0_75m_across_nodes():
    """ZeRO++ paper sec. 3: ZeRO-3 sends 3M per step across nodes (forward and backward all-gather,
    gradient reduce-scatter; M = model bytes in 16 bits), ZeRO++ 0.75M (int8 forward gather 0.5M,
    backward gather inside the node, int4 gradients 0.25M). Ring collectives over N ranks on n nodes
    send (N-1)/N of it; qgZ's inter-node all-to-all (n-1)/n."""
    scenario = make_scenario(**{"cluster.nodes": 4})
    n_nodes, world = scenario.cluster.nodes, scenario.cluster.world_size
    zero3 = simulate(scenario.with_changes(**{"training.sharding": {"stage": 3}}))
    zpp = simulate(scenario.with_changes(**{"training.sharding": {"stage": 3, "zeropp": ZEROPP_ALL}}))
    ctx = build_context(scenario)
    M = 2 * ctx.params
    assert _inter_bytes(zero3) == pytest.approx(3 * M * (world - 1) / world, rel=1e-9)
    weights = sum(qwz_wire_bytes(layer.params) for layer in ctx.workload.layers if layer.params)
    expected = weights * (world - 1) / world + 0.25 * M * (n_nodes - 1) / n_nodes
    assert _inter_bytes(zpp) == pytest.approx(expected, rel=1e-9)
    assert weights == pytest.approx(0.5 * M, rel=1e-3)  # the scales: one fp32 per 8,000 weights
    assert _inter_bytes(zpp, "gather") == pytest.approx(weights * (world - 1) / world, rel=1e-9)


def test_stage_0_is_ddp():
    scenario = load_scenario("preset:dgx-h100-gpt3-1.3b")
    explicit = scenario.with_changes(**{"training.sharding": {"stage": 0, "reduce_bucket_mb": 7}})
    a, b = simulate(scenario), simulate(explicit)
    assert a.iteration_time == b.iteration_time and a.memory == b.memory
    assert [(o.name, o.start, o.end) for o in a.ops] == [(o.name, o.start, o.end) for o in b.ops]
    assert "sharding" not in b.extra


@pytest.mark.parametrize(
    "sharding",
    [
        {"stage": 2},
        {"stage": 3},
        {"stage": 3, "zeropp": ZEROPP_ALL},
        {"framework": "fsdp", "fsdp_strategy": "hybrid"},
    ],
)
def test_more_network_bandwidth_is_never_slower(sharding):
    scenario = _sharded(sharding, **{"cluster.nodes": 4})
    times = [
        simulate(scenario.with_changes(**{"cluster.nic.line_rate_gbps": rate})).iteration_time
        for rate in (20, 100, 400)
    ]
    assert times[0] >= times[1] >= times[2]
    assert times[0] > times[2]  # the network matters at 25 Gb/s


def test_zero3_step_is_at_least_its_compute():
    result = simulate(_sharded({"stage": 3}, **{"cluster.nodes": 4}))
    compute = sum(op.end - op.start for op in result.ops if op.stream == "compute")
    assert result.iteration_time >= compute
    assert any(op.stream == "gather" for op in result.ops)


def test_zero3_gathers_every_layer_twice_and_fsdp_grad_op_once():
    ctx = build_context(make_scenario())
    layers = sum(1 for layer in ctx.workload.layers if layer.params)
    zero3 = simulate(_sharded({"stage": 3}))
    grad_op = simulate(_sharded({"framework": "fsdp", "fsdp_strategy": "grad_op"}))
    assert sum(op.meta.get("op") == "all_gather" for op in zero3.ops) == 2 * layers
    assert sum(op.meta.get("op") == "all_gather" for op in grad_op.ops) == layers


def test_deepspeed_zero3_copies_each_bucket_three_times_before_reducing_it_and_fsdp_does_not():
    """stage3.py: the IPG bucket copy, reduce_scatter_coalesced's torch.cat and its div_ by the world
    size, each a read and a write of the bucket (6 x its bytes), on the reduction stream, before the
    bucket's reduce-scatter; FSDP's per-unit path has none of them."""
    from clustersim.simulator.sharding import layout
    from clustersim.simulator.strategies.zero import _reduce_buckets

    s = _sharded({"stage": 3})
    assert s.workload.gradient_accumulation == 1
    ctx = build_context(s)
    result = simulate(s)
    copies = [op for op in result.ops if "copy+cat+scale" in op.name]
    buckets = _reduce_buckets(ctx, layout(ctx))
    assert len(copies) == len(buckets)
    total = sum(b.nbytes(ctx.grad_bytes) for b in buckets)
    expected = sum(ctx.device.stream_time(6 * b.nbytes(ctx.grad_bytes), "bucket_copy") for b in buckets)
    assert sum(op.end - op.start for op in copies) == pytest.approx(expected, rel=1e-9)
    assert total == pytest.approx(ctx.params * ctx.grad_bytes, rel=1e-9)
    reductions = {op.meta.get("bucket"): op for op in result.ops if op.meta.get("op") == "reduce_scatter"}
    for op in copies:
        assert op.stream == reductions[int(op.name.split()[0][len("bucket") :])].stream
    fsdp = simulate(_sharded({"framework": "fsdp"}))
    assert not any("copy+cat+scale" in op.name for op in fsdp.ops)


@pytest.mark.parametrize("strategy", ["full", "grad_op"])
def test_fsdp2_copies_each_gather_out_and_each_unit_s_gradients_in(strategy):
    """FSDP2 (fully_shard, _fsdp_collectives.py): after each all-gather the unsharded parameters are
    split out of its output on the compute stream (a read and a write of params x element bytes) before
    the unit's pass; before each reduce-scatter the unit's gradients are copied into its input in the
    reduce dtype (elements x (parameter bytes + reduce bytes)), on the reduction stream. A flat FSDP
    (fsdp_implementation: flat) has neither, and its step is never longer."""
    fsdp2 = _sharded({"framework": "fsdp", "fsdp_strategy": strategy})
    ctx = build_context(fsdp2)
    result = simulate(fsdp2)
    gathers = [op for op in result.ops if op.meta.get("op") == "all_gather"]
    outs = [op for op in result.ops if "all_gather copy-out" in op.name]
    assert (
        len(outs)
        == len(gathers)
        == (2 if strategy == "full" else 1) * sum(1 for layer in ctx.workload.layers if layer.params)
    )
    params = {layer.name: layer.params for layer in ctx.workload.layers}
    index = {id(op): i for i, op in enumerate(result.ops)}
    waited = {d for op in result.ops if op.name.startswith(("fwd ", "bwd ")) for d in op.deps}
    for op in outs:
        assert op.stream == "compute" and result.ops[op.deps[0]].meta.get("op") == "all_gather"
        assert index[id(op)] in waited  # the unit's pass waits for its copy-out
        expected = ctx.device.stream_time(2 * params[op.name.split()[-1]] * ctx.element_bytes, "x")
        assert op.end - op.start >= expected * (1 - 1e-9)
    ins = [op for op in result.ops if "reduce-scatter copy-in" in op.name]
    reductions = [op for op in result.ops if op.meta.get("op") == "reduce_scatter"]
    assert len(ins) == len(reductions)
    copied = ctx.params * (ctx.element_bytes + ctx.grad_bytes)
    assert sum(op.end - op.start for op in ins) == pytest.approx(
        ctx.device.stream_time(copied, "x"), rel=1e-9
    )
    flat = simulate(_sharded({"framework": "fsdp", "fsdp_strategy": strategy, "fsdp_implementation": "flat"}))
    assert not any("copy-out" in op.name or "copy-in" in op.name for op in flat.ops)
    assert flat.iteration_time <= result.iteration_time
    with pytest.raises(InputError, match="fsdp_implementation needs framework: fsdp"):
        _sharded({"stage": 3, "fsdp_implementation": "flat"})


def test_stage_2_reduces_every_micro_step_and_stage_1_once():
    def reductions(stage):
        result = simulate(_sharded({"stage": stage}, **{"workload.gradient_accumulation": 3}))
        return sum(op.meta.get("op") == "reduce_scatter" for op in result.ops)

    assert reductions(2) == 3 * reductions(1)


def test_overlap_comm_moves_the_reduction_off_the_compute_stream():
    blocking = simulate(_sharded({"stage": 2}))
    overlapped = simulate(_sharded({"stage": 2, "overlap_comm": True}))
    rs = [op.stream for op in blocking.ops if op.meta.get("op") == "reduce_scatter"]
    assert set(rs) == {"compute"}
    assert {op.stream for op in overlapped.ops if op.meta.get("op") == "reduce_scatter"} == {"comm"}
    assert overlapped.iteration_time <= blocking.iteration_time


def test_zero_1_2_update_one_partition_and_gather_it_back():
    scenario = _sharded({"stage": 2, "allgather_bucket_mb": 64})
    result = simulate(scenario)
    ctx = build_context(scenario)
    gathers = [op for op in result.ops if op.meta.get("op") == "all_gather"]
    assert len(gathers) == math.ceil(ctx.params * 2 / (64 * 2**20))
    assert sum(op.meta["bytes"] for op in gathers) == pytest.approx(2 * ctx.params)
    update = next(op for op in result.ops if op.category == "optimizer")
    assert f"1/{scenario.cluster.world_size}" in update.name


def test_gpt3_175b_fits_under_zero3_and_the_ddp_hint_names_sharding():
    preset = load_scenario("preset:zero3-gpt3-175b-a100")
    result = simulate(preset)
    assert result.memory["total"] <= result.memory["capacity"]
    assert result.extra["sharding"]["layout"] == "ZeRO-3"
    with pytest.raises(InputError, match=r"training\.sharding\.stage"):
        simulate(preset.with_changes(**{"training.sharding": {"stage": 0}}))


REFUSED = {
    "onebit_zero1": ({"training.optimizer": "onebit-adam", "training.sharding": {"stage": 1}}, "1bit-Adam"),
    "zero_one_zero2": (
        {"training.optimizer": "zero-one-adam", "training.sharding": {"stage": 2}},
        "0/1 Adam",
    ),
    "binsgdm_fsdp": (
        {"training.optimizer": "binsgdm", "training.sharding": {"framework": "fsdp"}},
        "BinSGDM",
    ),
    "zeropp_stage2": ({"training.sharding": {"stage": 2, "zeropp": {"quantized_weights": True}}}, "stage 3"),
    "fsdp_offload": (
        {"training.sharding": {"framework": "fsdp"}, "training.offload": {"mode": "interleaved"}},
        "FSDP has no",
    ),
    "fsdp_stage": ({"training.sharding": {"framework": "fsdp", "stage": 3}}, "fsdp_strategy"),
    "strategy_without_fsdp": (
        {"training.sharding": {"stage": 3, "fsdp_strategy": "full"}},
        "framework: fsdp",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unreal_combinations_exit_2_with_one_line(runner, tmp_path, case):
    import yaml

    overrides, expected = REFUSED[case]
    data = {
        "cluster": {"nodes": 2, "gpus_per_node": 4, "gpu": "A100-80GB"},
        "workload": {"model": "BERT-Large", "micro_batch": 8, "seq_len": 128},
        "training": {"optimizer": "adam"},
    }
    for key, value in overrides.items():
        data["training"][key.split(".")[1]] = value
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(data))
    r = runner.invoke(app, ["run", str(path)])
    out = r.output.strip()
    assert r.exit_code == 2, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    assert expected in out and "training." in out


def test_offload_with_zero_2_keeps_the_zero_offload_program():
    scenario = load_scenario("preset:offload-llama7b-h100").with_changes(**{"cluster.nodes": 2})
    plain = simulate(scenario.with_changes(**{"training.offload.placement": "cpu"}))
    staged = simulate(
        scenario.with_changes(**{"training.offload.placement": "cpu", "training.sharding": {"stage": 2}})
    )
    assert staged.iteration_time == plain.iteration_time
    # DeepSpeed's ZeRO-Offload holds no gradient partition at either: the same buffers, the same memory
    assert staged.memory["gradients"] == plain.memory["gradients"] == 0.0
    assert staged.memory["total"] == pytest.approx(plain.memory["total"])


def test_activation_checkpointing_keeps_block_inputs_and_recomputes_forward():
    plain = build_context(make_scenario())
    ckpt = build_context(make_scenario(**{"workload.activation_checkpointing": True}))
    blocks = [i for i, layer in enumerate(plain.workload.layers) if layer.checkpoint_bytes is not None]
    assert blocks
    kept = sum(
        layer.checkpoint_bytes if layer.checkpoint_bytes is not None else layer.activation_bytes
        for layer in plain.workload.layers
    )
    peak = max(plain.workload.layers[i].activation_bytes for i in blocks)
    assert ckpt.workload.activation_bytes == pytest.approx(kept + peak)
    assert ckpt.workload.activation_bytes < plain.workload.activation_bytes
    i = blocks[0]
    layer, redo = plain.workload.layers[i], ckpt.workload.layers[i]
    assert ckpt.backward_time(redo) == pytest.approx(plain.forward_time(layer) + plain.backward_time(layer))


def test_concurrent_gathers_and_reductions_share_the_nics():
    """ZeRO-3 runs parameter all-gathers and gradient reduce-scatters on two streams at once; together
    they cannot push the node's inter-node bytes faster than its NICs inject them."""
    scenario = _sharded(
        {"stage": 3, "reduce_bucket_mb": 4},
        **{"cluster.nodes": 4, "cluster.nic.line_rate_gbps": 10, "workload.micro_batch": 1},
    )
    result = simulate(scenario)
    ctx = build_context(scenario)
    wire_s = result.bytes_per_link_kind["inter_node_per_node"] / ctx.cluster.injection().bytes_per_s
    assert result.iteration_time >= wire_s


def test_compare_marks_refused_optimizers_and_runs_the_rest():
    from clustersim.planner.compare import compare

    rows = compare(_sharded({"stage": 3}), ["adam", "onebit-adam"], [8])
    by_name = {r.optimizer: r for r in rows}
    assert by_name["adam"].error is None and by_name["adam"].iteration_time_s > 0
    assert "not compatible with ZeRO" in by_name["onebit-adam"].error


def test_zero3_with_cpu_offload_moves_partitions_and_needs_no_gather_after_the_step():
    scenario = load_scenario("preset:offload-llama7b-h100").with_changes(**{"cluster.nodes": 2})
    zero2, zero3 = (
        simulate(
            scenario.with_changes(**{"training.sharding": {"stage": stage}, "training.offload.mode": "zero"})
        )
        for stage in (2, 3)
    )
    assert zero3.memory["parameters"] < zero2.memory["parameters"]  # partitioned
    assert any(op.name.startswith("D2H fp32 gradients") for op in zero3.ops)
    assert any(op.name.startswith("CPU update") for op in zero3.ops)
    gathers = [op for op in zero3.ops if op.meta.get("op") == "all_gather"]
    assert gathers and all(op.name.startswith("all_gather params") for op in gathers)


def test_zero3_interleaved_offload_is_no_slower_than_all_on_the_cpu():
    scenario = load_scenario("preset:offload-llama7b-h100").with_changes(
        **{"cluster.nodes": 2, "training.sharding": {"stage": 3}}
    )
    interleaved = simulate(scenario)
    cpu = simulate(scenario.with_changes(**{"training.offload.placement": "cpu"}))
    assert interleaved.iteration_time <= cpu.iteration_time


def test_gather_schedule_prefetches_as_deepspeed_and_fsdp_do():
    from clustersim.simulator.sharding import gather_schedule

    sizes = [10.0, 10.0, 10.0, 10.0]
    # No prefetch bucket: every layer gathered on demand, one at a time.
    assert gather_schedule(sizes, 0.0, 1e9, False) == ([0, 1, 2, 3], 10.0)
    # A bucket of 15 elements: each fetch issues the next layers until 15 are newly in flight.
    assert gather_schedule(sizes, 15.0, 1e9, False) == ([0, 0, 0, 1], 30.0)
    # A layer alone above max_live leaves no room to prefetch (stage3_max_live_parameters).
    assert gather_schedule(sizes, 15.0, 10.0, False) == ([0, 1, 2, 3], 10.0)
    # FSDP: one unit ahead.
    assert gather_schedule(sizes, 0.0, 0.0, True) == ([0, 0, 1, 2], 20.0)


def test_zero3_memory_holds_what_the_schedule_gathers():
    scenario = _sharded({"stage": 3, "prefetch_bucket_mb": 0})
    mem, _ = _memory(scenario)
    largest = max(layer.params for layer in build_context(scenario).workload.layers)
    assert mem["gathered_parameters"] == pytest.approx(2 * largest)  # fp16: one layer at a time
