"""ZeRO/FSDP and ZeRO-Offload over Megatron tensor parallelism without a pipeline (Megatron-DeepSpeed,
FSDP2 + DTensor TP): memory per rank against the ZeRO paper's formulas applied to params/t, the bytes
of the sharding collectives over the strided data-parallel group and of the tensor-parallel
collectives against Megatron's program, t = 1 against the data-parallel ZeRO path, and the refusals."""

import pytest

from clustersim.cli import app
from clustersim.simulator.context import build_context
from clustersim.simulator.memory import gpu_memory
from clustersim.simulator.runner import simulate
from clustersim.simulator.sharding import model_states
from clustersim.simulator.strategies import registry
from clustersim.simulator.strategies.megatron import _tp_ops
from tests.conftest import make_scenario

GPT = {"workload.model": "GPT-3-1.3B", "workload.micro_batch": 1, "workload.seq_len": 512}
NODES, GPN = 4, 4


def _scenario(t=4, sharding=None, **overrides):
    changes = {**GPT, "cluster.nodes": NODES, "cluster.gpus_per_node": GPN, "training.parallelism.tensor": t}
    if sharding is not None:
        changes["training.sharding"] = sharding
    return make_scenario(**{**changes, **overrides})


def _whole_model_params(t: int) -> float:
    """The unsplit model as t tensor-parallel ranks hold it between them: its vocabulary padded as
    Megatron pads it for t ranks (128 per rank, the default under tensor parallelism)."""
    return build_context(make_scenario(**GPT, **{"workload.pad_vocab_to_multiple_of": 128 * t})).params


def _tp_ops_of(result):
    return [op for op in result.ops if op.name.startswith("tp ")]


# ZeRO paper (Rajbhandari et al. 2020, fig. 1), mixed-precision Adam, bytes per parameter per rank.
ZERO = {
    "stage1": ({"stage": 1}, lambda n: 4 + 12 / n),
    "stage2": ({"stage": 2}, lambda n: 2 + 14 / n),
    "stage3": ({"stage": 3}, lambda n: 16 / n),
    "fsdp": ({"framework": "fsdp"}, lambda n: 16 / n),
}


@pytest.mark.parametrize("t", [2, 4])
@pytest.mark.parametrize("case", sorted(ZERO))
def test_model_states_are_the_zero_formulas_on_params_over_t(case, t):
    sharding, formula = ZERO[case]
    scenario = _scenario(t, sharding)
    ctx = build_context(scenario)
    mem = gpu_memory(ctx, registry.create(ctx))
    d = NODES * GPN // t
    assert ctx.data_parallel.ranks == d
    assert ctx.params == pytest.approx(_whole_model_params(t) / t, rel=1e-12)
    assert model_states(mem) == pytest.approx(formula(d) * _whole_model_params(t) / t, rel=1e-12)


def test_fsdp_hybrid_over_tensor_parallelism_shards_over_the_nodes_data_parallel_ranks():
    """FSDP2's (replicate, shard, tp) mesh: each tensor rank's 1/t is sharded over the node's g/t
    data-parallel ranks (16 bytes per parameter / (g/t) for mixed Adam) and the gradient shards are
    all-reduced across the n nodes: per node g x 2 x (2Ψ/t)/(g/t) x (n-1)/n = 4Ψ(n-1)/n leave the NICs
    per micro-step, what HYBRID_SHARD moves without tensor parallelism (ring all-reduces: the closed
    form is the ring's; auto picks a tree for the smallest shard)."""
    t = 2
    hybrid = {"framework": "fsdp", "fsdp_strategy": "hybrid"}
    ring = {"training.collective_algorithm": "ring"}
    scenario = _scenario(t, hybrid, **ring)
    ctx = build_context(scenario)
    mem = gpu_memory(ctx, registry.create(ctx))
    P = _whole_model_params(t)
    assert model_states(mem) == pytest.approx(16 / (GPN // t) * P / t, rel=1e-12)
    result = simulate(scenario)
    assert result.extra["sharding"]["shard_ranks"] == GPN // t
    inter = sum(op.inter_node_bytes for op in result.ops if op.name.startswith("all_reduce grad shard"))
    assert inter == pytest.approx(4 * P * (NODES - 1) / NODES, rel=1e-9)
    assert result.bytes_per_link_kind["inter_node_per_node"] == pytest.approx(inter, rel=1e-9)
    without_tp = simulate(make_scenario(**GPT, **{"cluster.nodes": NODES, "cluster.gpus_per_node": GPN,
                                                  "training.sharding": hybrid, **ring,
                                                  "workload.pad_vocab_to_multiple_of": 128 * t}))  # fmt: skip
    assert without_tp.bytes_per_link_kind["inter_node_per_node"] == pytest.approx(inter, rel=1e-9)


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("attention", ["fused", "unfused"])
def test_activations_are_korthikantis_per_tensor_rank(sequence_parallel, attention):
    """Korthikanti et al. 2022, Table 2 (16 bit): per block sbh(10 + 24/t + 5as/(ht)), sequence
    parallel sbh(34/t + 5as/(ht)), without the 5as/(ht) scores under fused attention; the embedding's
    and head's activations split by t; one micro-batch in flight without a pipeline."""
    t = 4
    scenario = _scenario(
        t,
        {"stage": 3},
        **{"training.parallelism.sequence_parallel": sequence_parallel, "workload.attention": attention},
    )
    ctx = build_context(scenario)
    mem = gpu_memory(ctx, registry.create(ctx))
    padded = {"workload.attention": attention, "workload.pad_vocab_to_multiple_of": 128 * t}
    whole = build_context(make_scenario(**GPT, **padded)).workload
    arch = ctx.layout.arch
    s, b, h, a = 512, 1, arch.hidden, arch.heads
    scores = 5 * a * s / (h * t) if attention == "unfused" else 0.0
    per = (34 / t if sequence_parallel else 10 + 24 / t) + scores
    ends = sum(x.activation_bytes for x in whole.layers if x.name in ("embedding", "head")) / t
    assert mem["activations"] == pytest.approx(arch.layers * s * b * h * per + ends, rel=1e-12)


def test_zero3_moves_3_model_shards_over_the_strided_data_parallel_group():
    """ZeRO-3 sends 3M/t per rank per step over the data-parallel group (two all-gathers and a
    reduce-scatter of the rank's 16-bit 1/t of the model; ring: (d-1)/d of it per rank). With t = GPUs
    per node the d members sit on d nodes and every GPU of a node runs its own group: per node
    g x 3M/t x (d-1)/d leaves the node; the tensor-parallel collectives stay inside it."""
    t = GPN
    result = simulate(_scenario(t, {"stage": 3}))
    d = NODES * GPN // t
    M = 2 * _whole_model_params(t)
    sharding = [op for op in result.ops if op.meta.get("op") in ("all_gather", "reduce_scatter")]
    sharding = [op for op in sharding if not op.name.startswith("tp ")]
    assert {op.meta["ranks"] for op in sharding} == {d}
    assert sum(op.meta["bytes"] for op in sharding) == pytest.approx(3 * M / t, rel=1e-9)
    inter = sum(op.inter_node_bytes for op in sharding)
    assert inter == pytest.approx(GPN * 3 * M / t * (d - 1) / d, rel=1e-9)
    assert sum(op.inter_node_bytes for op in _tp_ops_of(result)) == 0


@pytest.mark.parametrize(
    "par",
    [
        {},
        {"training.parallelism.sequence_parallel": True},
        {"training.parallelism.recompute": "full"},
    ],
    ids=["plain", "sequence_parallel", "recompute"],
)
def test_tensor_parallel_collectives_are_megatrons(par):
    """Per micro-step the ZeRO program runs the tensor-parallel collectives Megatron's program runs
    (the same ops, counts and b*s*h messages over the same group), layer by layer on the compute stream."""
    m = 2
    common = {"workload.gradient_accumulation": m, **par}
    zero = simulate(_scenario(4, {"stage": 3}, **common))
    megatron = simulate(_scenario(4, None, **common))

    def totals(result):
        out = {}
        for op in _tp_ops_of(result):
            kind = op.meta["op"]
            count, nbytes, intra = out.get(kind, (0, 0.0, 0.0))
            out[kind] = (count + op.meta.get("count", 1), op.meta["bytes"], intra + op.intra_node_bytes)
        return out

    ours, theirs = totals(zero), totals(megatron)
    assert ours.keys() == theirs.keys() and ours
    for kind in ours:
        assert ours[kind][0] == theirs[kind][0]
        assert ours[kind][1] == theirs[kind][1]
        assert ours[kind][2] == pytest.approx(theirs[kind][2], rel=1e-12)
    assert {op.stream for op in _tp_ops_of(zero)} == {"compute"}


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_per_layer_counts_add_up_to_megatrons_per_chunk(sequence_parallel, recompute):
    scenario = _scenario(
        4,
        None,
        **{
            "training.parallelism.sequence_parallel": sequence_parallel,
            "training.parallelism.recompute": recompute,
        },
    )
    ctx = build_context(scenario)
    (chunk,) = ctx.layout.chunks
    for forward in (True, False):
        mine: dict[str, int] = {}
        for layer in chunk.layers:
            for kind, n in ctx.layout.tensor_collectives(layer, forward):
                mine[kind] = mine.get(kind, 0) + n
        assert mine == dict(_tp_ops(ctx, chunk, forward))


def test_t1_runs_the_data_parallel_zero_program():
    """At t = 1 with Megatron's recomputation (which takes the tensor-rank path) ZeRO-3 runs exactly
    the program of the data-parallel path with activation checkpointing, and holds the same model states."""
    base = {**GPT, "cluster.nodes": NODES, "cluster.gpus_per_node": GPN, "training.sharding": {"stage": 3}}
    rank_path = make_scenario(**base, **{"training.parallelism.recompute": "full"})
    dp_path = make_scenario(**base, **{"workload.activation_checkpointing": True})
    assert build_context(rank_path).tensor_sharded and not build_context(dp_path).tensor_sharded
    a, b = simulate(rank_path), simulate(dp_path)
    assert a.iteration_time == pytest.approx(b.iteration_time, rel=1e-12)
    assert [o.name for o in a.ops] == [o.name for o in b.ops]
    times = [t for o in a.ops for t in (o.start, o.end)]
    assert times == pytest.approx([t for o in b.ops for t in (o.start, o.end)], rel=1e-12)
    assert model_states(a.memory) == pytest.approx(model_states(b.memory), rel=1e-12)


@pytest.mark.parametrize(
    "sharding,t",
    [
        ({"stage": 1}, GPN),
        ({"stage": 3}, GPN),
        ({"framework": "fsdp"}, GPN),
        ({"framework": "fsdp", "fsdp_strategy": "hybrid"}, 2),
    ],
)
def test_more_network_bandwidth_is_never_slower(sharding, t):
    scenario = _scenario(t, sharding)
    times = [
        simulate(scenario.with_changes(**{"cluster.nic.line_rate_gbps": rate})).iteration_time
        for rate in (20, 100, 400)  # InfiniBand DDR, EDR, NDR
    ]
    assert times[0] >= times[1] >= times[2]
    assert times[0] > times[2]


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_zero_offload_over_tensor_parallelism_updates_one_rank_partition_on_the_cpu(stage):
    """ZeRO-Offload with Megatron's model parallelism (Ren et al. ATC'21; stage 0 with offload is
    ZeRO-Offload's stage 2, stage 3 offloads the partitioned optimizer): each rank's CPU updates its 1/d
    of its tensor rank's parameters, P/(t d); the GPU keeps no optimizer state."""
    t = 2
    scenario = _scenario(t, {"stage": stage}, **{"training.offload": {"mode": "zero"}})
    ctx = build_context(scenario)
    strategy = registry.create(ctx)
    strategy.steps()
    d = NODES * GPN // t
    assert ctx.offload_placement.partition_params == pytest.approx(_whole_model_params(t) / (t * d))
    result = simulate(scenario)
    assert _tp_ops_of(result)
    assert result.memory["optimizer_state"] == 0


REFUSED = {
    "zero3_pipeline": (
        {"training.sharding": {"stage": 3}, "training.parallelism": {"tensor": 2, "pipeline": 2}},
        "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
        "training.sharding.stage",
    ),
    "zero2_pipeline": (
        {"training.sharding": {"stage": 2}, "training.parallelism": {"pipeline": 2}},
        "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
        "training.sharding.stage",
    ),
    "zero1_pipeline": (
        {"training.sharding": {"stage": 1}, "training.parallelism": {"pipeline": 2}},
        "distributed_optimizer: true",
        "training.sharding.stage",
    ),
    "fsdp_pipeline": (
        {"training.sharding": {"framework": "fsdp"}, "training.parallelism": {"pipeline": 2}},
        "FSDP with pipeline",
        "training.sharding.framework",
    ),
    "offload_pipeline": (
        {"training.offload": {"mode": "zero"}, "training.parallelism": {"pipeline": 2}},
        "offload with pipeline",
        "training.offload.mode",
    ),
    "zero_and_distributed_optimizer": (
        {
            "training.sharding": {"stage": 1},
            "training.parallelism": {"tensor": 2, "distributed_optimizer": True},
        },
        "Megatron's own ZeRO-1",
        "training.parallelism.distributed_optimizer",
    ),
    "zeropp_tensor": (
        {
            "training.sharding": {"stage": 3, "zeropp": {"quantized_weights": True}},
            "training.parallelism": {"tensor": 2},
        },
        "ZeRO++ with tensor parallelism",
        "training.sharding.zeropp",
    ),
    "hybrid_tensor": (
        {
            "training.sharding": {"framework": "fsdp", "fsdp_strategy": "hybrid"},
            "training.parallelism": {"tensor": 4},
        },
        "HYBRID_SHARD",
        "training.sharding.fsdp_strategy",
    ),
    "partition_tensor": (
        {
            "training.sharding": {"stage": 3, "partition": {"parameters": "node"}},
            "training.parallelism": {"tensor": 2},
        },
        "partition levels with tensor",
        "training.sharding.partition",
    ),
}


REFUSED["stragglers_zero_tensor"] = (
    {"training.sharding": {"stage": 3}, "training.parallelism": {"tensor": 2}},
    "stragglers with ZeRO/FSDP",
    "cluster.heterogeneity",
)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_the_frameworks_refuse_exits_2_with_one_line(runner, tmp_path, case):
    import yaml

    overrides, expected, key = REFUSED[case]
    data = {
        "cluster": {"nodes": 2, "gpus_per_node": 4, "gpu": "A100-80GB"},
        "workload": {"model": "GPT-3-1.3B", "micro_batch": 1, "seq_len": 512, "gradient_accumulation": 2},
        "training": {"optimizer": "adam"},
    }
    for k, value in overrides.items():
        data["training"][k.split(".")[1]] = value
    if case.startswith("stragglers"):
        data["cluster"]["heterogeneity"] = {"slow_gpus": [{"rank": 1, "compute_factor": 1.2}]}
    path = tmp_path / f"{case}.yaml"
    path.write_text(yaml.safe_dump(data))
    r = runner.invoke(app, ["run", str(path)])
    out = r.output.strip()
    assert r.exit_code == 2, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    assert expected in out and key in out, out


def test_zero1_over_tensor_parallelism_moves_what_megatrons_distributed_optimizer_moves():
    """ZeRO-1 over TP (DeepSpeed's reduce to partition owners, update 1/d, all-gather) and Megatron's
    distributed optimizer at p = 1 are the same partitioning: the same inter-node bytes, the same
    optimizer state per rank, and steps within 5%: bucketing and DDP buffers differ, and where the host's
    dispatch is the longer side of a pass, the data-parallel program's dispatch lane runs on while the
    tensor-parallel collectives do, where Megatron's one op per pass takes max(host, device) before them
    (host-bound here at micro-batch 1: 3.6% apart; 1% before host dispatch was modelled)."""
    common = {"training.parallelism.sequence_parallel": True, "workload.gradient_accumulation": 2}
    zero1 = simulate(_scenario(GPN, {"stage": 1}, **common))
    dist = simulate(_scenario(GPN, None, **common, **{"training.parallelism.distributed_optimizer": True}))
    inter = "inter_node_per_node"
    assert zero1.bytes_per_link_kind[inter] == pytest.approx(dist.bytes_per_link_kind[inter], rel=1e-9)
    assert zero1.memory["optimizer_state"] == pytest.approx(dist.memory["optimizer_state"], rel=1e-12)
    assert zero1.iteration_time == pytest.approx(dist.iteration_time, rel=0.05)


def test_out_of_memory_under_zero3_over_tensor_parallelism_suggests_a_larger_tensor_size():
    from clustersim.errors import InputError

    scenario = _scenario(2, {"stage": 3}, **{"workload.model": "GPT-3-175B", "cluster.gpus_per_node": 2})
    with pytest.raises(InputError) as err:
        simulate(scenario)
    assert err.value.key == "workload.model" and "training.parallelism.tensor" in str(err.value)


@pytest.mark.parametrize("t", [1, 2])
def test_out_of_memory_under_fsdp_hybrid_suggests_full_shard_not_more_gpus(t):
    """HYBRID_SHARD holds 1/(GPUs per node) of the model states per rank however many nodes there are
    (and 1/t over g/t ranks with tensor parallelism is the same): the hint said "try more GPUs" (and
    "a larger tensor"), neither of which shrinks them."""
    from clustersim.errors import InputError

    hybrid = {"framework": "fsdp", "fsdp_strategy": "hybrid"}
    with pytest.raises(InputError) as err:
        simulate(_scenario(t, hybrid, **{"workload.model": "GPT-3-175B"}))
    message = str(err.value)
    assert err.value.key == "workload.model" and "fsdp_strategy: full" in message
    assert "more GPUs" not in message and "larger training.parallelism.tensor" not in message


def test_out_of_memory_with_tensor_parallelism_alone_suggests_zero3():
    """Without a pipeline ZeRO composes with tensor parallelism, so the hint names it too (with a
    pipeline it does not: test_model_parallel.py)."""
    from clustersim.errors import InputError

    with pytest.raises(InputError) as err:
        simulate(_scenario(4, None, **{"workload.model": "GPT-3-175B"}))
    assert "training.sharding.stage: 3" in str(err.value)


def test_without_a_pipeline_run_places_no_pipeline_neighbours():
    """run printed "pipeline group: ranks [0], neighbours on different nodes" for ZeRO-3 over TP,
    which has one stage and so no neighbours; a real pipeline still says where its neighbours sit."""
    one = simulate(_scenario(4, {"stage": 3})).extra["parallelism"]["pipeline_group"]
    assert one == "ranks [0], one stage: no pipeline neighbours"
    two = simulate(_scenario(4, None, **{"training.parallelism.pipeline": 2})).extra["parallelism"]
    assert two["pipeline_group"].endswith("neighbours on different nodes")


def test_selective_recompute_adds_the_core_attention_forward_to_each_ranks_block():
    """Under ZeRO over tensor parallelism a block's backward carries, with selective recomputation, its
    core attention's forward again: 4bs^2h/t FLOPs more than without, and the Korthikanti activations
    without the score term (fused attention keeps none anyway)."""
    t, s, b = 4, GPT["workload.seq_len"], GPT["workload.micro_batch"]
    sharding = {"stage": 3}

    def blocks(recompute):
        ctx = build_context(_scenario(t, sharding, **{"training.parallelism.recompute": recompute}))
        return ctx, [x for x in ctx.layout.rank_workload.layers if x.name.startswith("block")]

    ctx, selective = blocks("selective")
    _, none = blocks("none")
    h = ctx.layout.arch.hidden
    for sel, plain in zip(selective, none):
        extra = sum(k.flops for k in sel.backward) - sum(k.flops for k in plain.backward)
        assert extra == pytest.approx(4 * b * s * s * h / t)
        assert sel.activation_bytes == pytest.approx(plain.activation_bytes)
    key = "training.parallelism.recompute"
    with_, without = (simulate(_scenario(t, sharding, **{key: rc})) for rc in ("selective", "none"))
    # more work is never faster; here the parameter gathers hide the extra compute from the step
    assert with_.iteration_time >= without.iteration_time
    assert with_.breakdown["backward"] > without.breakdown["backward"]
