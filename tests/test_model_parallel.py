"""Megatron-LM tensor/pipeline parallelism: schedules against their closed forms, the rank layout,
per-rank memory (Korthikanti et al. 2022) and the layouts that are refused."""

import math

import pytest

from clustersim.catalog import model
from clustersim.errors import InputError
from clustersim.scenario import validate_scenario
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.simulator.engine import Engine
from clustersim.simulator.model_parallel import schedule
from clustersim.simulator.strategies import registry
from clustersim.topologies.cluster import GroupShape


def _scenario(nodes=4, gpn=8, t=2, p=4, m=8, v=1, model_name="GPT-3-1.3B", **par):
    data = {
        "cluster": {"nodes": nodes, "gpus_per_node": gpn, "gpu": "A100-80GB", "nic": {"count": 8}},
        "workload": {"model": model_name, "micro_batch": 1, "seq_len": 2048, "gradient_accumulation": m},
        "training": {
            "optimizer": "adam",
            "parallelism": {
                "tensor": t,
                "pipeline": p,
                "virtual_stages": v,
                "schedule": "interleaved" if v > 1 else "1f1b",
                **par,
            },
        },
    }
    return validate_scenario(data)


def _free_communication_step(scenario, tf=1.0, tb=2.0) -> float:
    """The program with every communication free, every pass over a chunk taking tf/v forward and
    tb/v backward, and the update free: what remains is the schedule."""
    ctx = build_context(scenario)
    prog = registry.create(ctx).steps()[0].program
    v = scenario.training.parallelism.virtual_stages
    for op in prog.ops:
        op.duration = {"forward": tf / v, "backward": tb / v}.get(op.category, 0.0)
    _, end = Engine(prog).run()
    return max(end.values())


@pytest.mark.parametrize("p,m", [(2, 1), (4, 8), (4, 3), (8, 16), (3, 7)])
@pytest.mark.parametrize("tf,tb", [(1.0, 2.0), (1.0, 1.0)])
def test_1f1b_matches_closed_form_when_communication_is_free(p, m, tf, tb):
    step = _free_communication_step(_scenario(nodes=p, t=8, p=p, m=m), tf, tb)
    assert math.isclose(step, (m + p - 1) * (tf + tb), rel_tol=1e-9)
    bubble = (step - m * (tf + tb)) / step
    assert math.isclose(bubble, (p - 1) / (m + p - 1), rel_tol=1e-9)


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (2, 4, 6), (4, 2, 4)])
def test_interleaved_matches_closed_form_when_communication_is_free(p, v, m):
    step = _free_communication_step(_scenario(nodes=p, t=8, p=p, m=m, v=v))
    bubble = (step - m * 3.0) / step
    assert math.isclose(bubble, (p - 1) / (v * m + p - 1), rel_tol=1e-9)


def test_interleaved_beats_1f1b_and_communication_adds_to_the_step():
    one = simulate(_scenario(p=4, m=8))
    inter = simulate(_scenario(p=4, m=8, v=2))
    assert inter.iteration_time < one.iteration_time
    ctx = build_context(_scenario(p=4, m=8))
    prog = registry.create(ctx).steps()[0].program
    for op in prog.ops:
        if op.category == "communication":
            op.duration = 0.0
    _, end = Engine(prog).run()
    assert max(end.values()) < one.iteration_time
    assert one.breakdown["exposed_communication"] > 0  # TP all-reduces on the critical path


def test_schedule_runs_each_pass_once_in_megatron_order():
    ctx = build_context(_scenario(p=4, m=8))
    order = schedule(ctx.layout, 0)
    assert order[:3] == [(True, 0, 0), (True, 0, 1), (True, 0, 2)]  # p - 1 = 3 warm-up forwards
    assert order[3:5] == [(True, 0, 3), (False, 0, 0)]
    last = schedule(ctx.layout, 3)
    assert last[:2] == [(True, 3, 0), (False, 3, 0)]  # the last stage alternates at once
    for s in range(4):
        passes = schedule(ctx.layout, s)
        assert sorted(passes) == sorted({(f, s, mb) for f in (True, False) for mb in range(8)})


def test_megatron_rank_order_groups():
    # Megatron's docstring example: 16 GPUs, t=2, p=4 -> d=2; data groups [g0, g2], pipeline [g0, g4, ...]
    ctx = build_context(_scenario(nodes=2, t=2, p=4, m=4))
    assert ctx.tensor_parallel == GroupShape(1, 2, 4)
    assert ctx.data_parallel == GroupShape(1, 2, 4)  # g0 and g2: inside one node
    assert ctx.pipeline_pair == GroupShape(1, 2, 4)  # g0 and g4: inside one node too
    big = build_context(_scenario(nodes=192, t=8, p=16, m=16, model_name="GPT-3-175B"))
    assert big.data_parallel == GroupShape(12, 1, 8)  # one rank per node, 8 such rails per node
    assert big.pipeline_pair == GroupShape(2, 1, 8)
    wide = build_context(_scenario(nodes=8, t=2, p=1, m=1))
    assert wide.data_parallel == GroupShape(8, 4, 2)  # 32 ranks, 4 per node, 2 groups per node
    plain = build_context(validate_scenario({**_scenario().model_dump(), "training": {"optimizer": "adam"}}))
    assert plain.data_parallel == plain.world


def test_tensor_parallel_all_reduces_per_layer_and_bytes():
    s = _scenario(nodes=1, t=8, p=1, m=2)
    r = simulate(s)
    arch = model("GPT-3-1.3B")
    tp = [o for o in r.ops if o.name.startswith("tp all_reduce")]
    count = sum(o.meta.get("count", 1) for o in tp)
    # 2 forward + 2 backward per block, one for the embedding forward, one for the head backward
    assert count == 2 * (4 * arch.layers + 2)
    assert all(o.meta["bytes"] == 2048 * arch.hidden * 2 for o in tp)
    sp = simulate(_scenario(nodes=1, t=8, p=1, m=2, sequence_parallel=True))
    kinds = {o.meta["op"] for o in sp.ops if o.name.startswith("tp ")}
    assert kinds == {"all_gather", "reduce_scatter"}
    assert sp.breakdown["forward"] < r.breakdown["forward"]  # LayerNorm/dropout split by t


def test_memory_per_rank_follows_the_split_and_korthikanti():
    t, p, m = 2, 4, 8
    ctx = build_context(_scenario(t=t, p=p, m=m))
    L, arch = ctx.layout, model("GPT-3-1.3B")
    blocks = [x for x in ctx.workload.layers if x.name.startswith("block")]
    stage0 = (ctx.workload.layers[0].params + sum(b.params for b in blocks[: arch.layers // p])) / t
    assert L.stage_params(0) == pytest.approx(stage0)
    last = (ctx.workload.layers[-1].params + sum(b.params for b in blocks[-arch.layers // p :])) / t
    # tied copy of the word embedding, padded as Megatron pads it (128 per tensor-parallel rank)
    assert ctx.scenario.vocab_multiple == 128 * t
    padded_vocab = -(-arch.vocab // (128 * t)) * 128 * t
    assert L.stage_params(p - 1) == pytest.approx(last + padded_vocab * arch.hidden / t)
    s, b, h, a = 2048, 1, arch.hidden, arch.heads
    per_layer = s * b * h * (10 + 24 / t)  # fused attention (the default) keeps no s^2 scores
    assert L.block_activation_bytes() == pytest.approx(per_layer)
    unfused = build_context(_scenario(t=t, p=p, m=m).with_changes(**{"workload.attention": "unfused"})).layout
    assert unfused.block_activation_bytes() == pytest.approx(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)))
    # 1F1B: the first stage holds p micro-batches of its L/p layers (plus the embedding's output)
    emb = ctx.workload.layers[0].activation_bytes / t
    assert L.activation_bytes == pytest.approx(p * (arch.layers // p * per_layer + emb))
    interleaved = build_context(_scenario(t=t, p=p, m=m, v=2)).layout
    chunk_layers = arch.layers // (p * 2)
    assert interleaved.in_flight(0) == 2 * (p - 1) + p + 1
    assert interleaved.in_flight(0) * chunk_layers == pytest.approx(arch.layers * (1 + (p - 1) / (p * 2)))
    sp = build_context(_scenario(t=t, p=p, m=m, sequence_parallel=True)).layout
    assert sp.block_activation_bytes() == pytest.approx(s * b * h * 34 / t)
    full = build_context(_scenario(t=t, p=p, m=m, recompute="full")).layout
    assert full.block_activation_bytes() == pytest.approx(2 * s * b * h)


def test_megatron_gradients_have_one_buffer_without_a_bucket_copy():
    """Megatron-LM's DDP buckets are slices of the gradient buffer each param.main_grad views
    (megatron/core/distributed/param_and_grad_buffer.py): no second gradient copy, unlike PyTorch DDP."""
    mem = simulate(_scenario()).memory
    assert mem["ddp_buckets"] == 0.0 and mem["gradients"] > 0


def test_gpt3_175b_fits_with_3d_parallelism_and_not_without():
    big = _scenario(nodes=128, t=8, p=8, m=32, model_name="GPT-3-175B", recompute="full")
    r = simulate(big)
    assert r.memory["total"] <= r.memory["capacity"]
    assert r.samples_per_iteration == 32 * 16  # m x d, d = 1024 / 64
    with pytest.raises(InputError) as err:
        simulate(validate_scenario({**big.model_dump(), "training": {"optimizer": "adam"}}))
    assert "training.parallelism" in str(err.value)


@pytest.mark.parametrize(
    "kw,key",
    [
        ({"t": 3, "p": 1}, "training.parallelism.tensor"),  # 3 x 1 does not divide 32 GPUs
        ({"nodes": 8, "t": 32, "p": 1}, "training.parallelism.tensor"),  # 16 heads over 32 ranks
        ({"t": 2, "p": 5}, "training.parallelism.pipeline"),  # 10 does not divide 32 GPUs
        ({"t": 1, "p": 16}, "training.parallelism.pipeline"),  # 24 layers over 16 stages
        ({"p": 4, "v": 4}, "training.parallelism.pipeline"),  # 24 layers over 16 chunks
        ({"p": 4, "v": 2, "m": 6}, "workload.gradient_accumulation"),  # interleaved: m % p
        ({"p": 1, "t": 2, "v": 2}, "training.parallelism.schedule"),  # interleaving needs p >= 2
        ({"model_name": "LLaMA-2-70B", "t": 16, "p": 2}, "training.parallelism.tensor"),  # 8 kv heads
    ],
)
def test_impossible_layouts_are_refused_with_their_key(kw, key):
    with pytest.raises(InputError) as err:
        _scenario(**kw)
    assert err.value.key.endswith(key)


def test_diloco_with_model_parallelism_is_refused_for_its_own_reason():
    """The refusal names DiLoCo's reason (workers are data-parallel replicas), not 1-bit Adam's."""
    base = _scenario().model_dump()
    options = {"workers": 2}
    data = {**base, "training": {**base["training"], "optimizer": "diloco", "optimizer_options": options}}
    with pytest.raises(InputError) as err:
        validate_scenario(data)
    assert err.value.key.endswith("training.optimizer")
    assert "1-bit" not in str(err.value) and "worker" in str(err.value)


def test_compressed_optimizers_and_offload_are_refused_with_model_parallelism():
    base = _scenario().model_dump()
    for optimizer in ("onebit-adam", "zero-one-adam", "binsgdm"):
        data = {**base, "training": {**base["training"], "optimizer": optimizer}}
        with pytest.raises(InputError) as err:
            validate_scenario(data)
        assert err.value.key.endswith("training.optimizer")
    data = {**base, "training": {**base["training"], "offload": {"mode": "zero"}}}
    with pytest.raises(InputError) as err:
        validate_scenario(data)
    assert err.value.key.endswith("training.offload.mode")


def test_a_compressed_optimizers_refusal_names_the_split_the_layout_has():
    """On a pipeline-free layout the refusal names tensor parallelism and its key, never DeepSpeed's
    pipeline incompatibility; with a pipeline it names both splits and says the pipeline reason."""
    tensor_only = _scenario(p=1).model_dump()
    data = {**tensor_only, "training": {**tensor_only["training"], "optimizer": "onebit-adam"}}
    with pytest.raises(InputError) as err:
        validate_scenario(data)
    text = str(err.value)
    assert "pipeline" not in text.replace("tensor and pipeline parallelism is modelled", "")
    assert "tensor = 2" in text and "training.parallelism.tensor to 1" in text
    both = _scenario().model_dump()
    data = {**both, "training": {**both["training"], "optimizer": "zero-one-adam"}}
    with pytest.raises(InputError) as err:
        validate_scenario(data)
    assert "tensor = 2 and pipeline = 4" in str(err.value)
    # the tutorials' incompatibility is the MPI backend's; the NCCL one runs under DeepSpeed's own
    # PipelineEngine, which is what the simulator does not model
    said = "NCCL-based 0/1 Adam runs under its PipelineEngine, whose schedule is not modelled"
    assert said in str(err.value)
    mpi = {**data, "training": {**data["training"], "optimizer_options": {"backend": "mpi_cuda_aware"}}}
    with pytest.raises(InputError) as err:
        validate_scenario(mpi)
    assert "MPI-based 0/1 Adam is not compatible with pipeline parallelism" in str(err.value)


def test_out_of_memory_suggests_the_distributed_optimizer_where_it_fits():
    """A 3D layout whose model states overflow the GPU: the error suggests Megatron's distributed
    optimizer with the rank's total it would leave, which is what the simulation of it then holds."""
    from clustersim.units import format_bytes

    big = dict(nodes=32, gpn=8, t=8, p=4, model_name="GPT-3-175B", sequence_parallel=True, recompute="full")
    with pytest.raises(InputError) as err:
        simulate(_scenario(**big))
    text = err.value.message
    assert "does not fit in GPU memory" in text and "a larger training.parallelism.tensor" in text
    assert "training.parallelism.distributed_optimizer: true" in text and "which fits" in text
    fits = simulate(_scenario(**big, distributed_optimizer=True))
    assert f"about {format_bytes(fits.memory['total'])} per rank" in text
    # already on, or no data-parallel replicas to shard over: not suggested
    with pytest.raises(InputError) as err:
        simulate(_scenario(**{**big, "nodes": 4}, distributed_optimizer=True))
    assert "distributed_optimizer" not in err.value.message


def test_step_is_the_slowest_stage_and_placement_is_reported():
    r = simulate(_scenario(p=4, m=8))
    par = r.extra["parallelism"]
    ends = [s["end_s"] for s in par["stages"]]
    assert r.iteration_time == pytest.approx(max(ends))
    assert par["critical_stage"] == ends.index(max(ends))
    assert sum(r.breakdown.values()) == pytest.approx(r.iteration_time)
    assert r.breakdown["idle"] > 0  # the pipeline bubble on the critical stage
    assert "inside one node" in par["tensor_group"]


@pytest.mark.parametrize("v", [1, 2])
def test_ranked_engine_paths_equal_the_general_engine(v):
    """engine_inorder's one pass and engine_ranked's event loop (multi-rank programs without shared
    links) against the general fluid engine on the same program: sends slow their own rank's compute,
    so rates do change mid-op."""
    from clustersim.simulator.engine_inorder import run_in_order

    ctx = build_context(_scenario(p=4, m=8, v=v))
    prog = registry.create(ctx).steps()[0].program
    slowed = [op for op in prog.ops if op.rank and op.compute_slowdown > 0]
    assert slowed
    assert run_in_order(prog) is not None  # Megatron's programs take the one pass
    one_pass = Engine(prog).run()
    events = Engine(prog, in_order=False).run()
    general = Engine(prog, ranked=False).run()
    for start, end in (one_pass, events):
        for i in general[1]:
            assert start[i] == pytest.approx(general[0][i], rel=1e-9, abs=1e-12)
            assert end[i] == pytest.approx(general[1][i], rel=1e-9, abs=1e-12)
    # Some compute op really ran slowed (otherwise the comparison would not test the integration).
    assert any(
        one_pass[1][op.id] - one_pass[0][op.id] > op.duration * (1 + 1e-6)
        for op in prog.ops
        if op.stream == "compute" and op.duration > 0
    )


def test_megatron_weak_scaling_table_is_the_papers_layouts():
    """Each row's batch is the paper's (micro-batch x m x d); the FLOPs per step are eq. 3 of
    Narayanan et al., the count behind the published TFLOP/s."""
    from clustersim.scenario import load_scenario
    from clustersim.validation.published import load_dataset, megatron_flops

    data = load_dataset("megatron_weak_scaling")
    base = load_scenario(data.scenario)
    batches = [512, 512, 512, 1024, 1536, 1792, 2304, 2160, 2520, 3072]  # Table 1
    for row, batch in zip(data.rows, batches, strict=True):
        s = base.with_changes(**data.changes, **row.changes, **{"cluster.nodes": row.gpus // 8})
        par = s.training.parallelism
        d = row.gpus // (par.tensor * par.pipeline)
        assert s.workload.micro_batch * s.workload.gradient_accumulation * d == batch
    one_t = base.with_changes(**data.changes, **data.rows[-1].changes, **{"cluster.nodes": 384})
    arch = model("Megatron-GPT-1T")
    B, s, L, h, V = 3072, 2048, arch.layers, arch.hidden, arch.vocab
    assert megatron_flops(one_t) == pytest.approx(
        96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    )


def test_megatron_weak_scaling_predictions():
    """The shipped Table 1 predicted from the published cluster and layouts, no per-row factor.
    Measured: median |error| 2.3%, largest 11.4% (the 256-GPU, t=8 row: each rank's kernels an
    eighth of a layer's, so the device's 1.18 us gap between queued kernels weighs most there)."""
    from clustersim.validation.published import validate

    report = validate("megatron_weak_scaling", samples=0)
    assert len(report.rows) == 10
    assert report.median_abs_error < 0.05
    assert report.max_abs_error < 0.12


_LARGE = {
    "LLaMA-2-70B, 64 H100, t8 p4 d2": {
        "cluster.nodes": 8,
        "workload.model": "LLaMA-2-70B",
        "workload.seq_len": 4096,
        "training.parallelism.pipeline": 4,
        "workload.gradient_accumulation": 64,
    },
    "LLaMA-2-70B, 64 A100, t8 p4 d2": {
        "cluster.nodes": 8,
        "cluster.gpu": "A100-80GB",
        "cluster.nic.line_rate_gbps": 200,
        "workload.model": "LLaMA-2-70B",
        "workload.seq_len": 4096,
        "training.parallelism.pipeline": 4,
        "workload.gradient_accumulation": 64,
    },
    "GPT-3 175B, 1024 A100, t8 p8 d16": {
        "cluster.nodes": 128,
        "cluster.gpu": "A100-80GB",
        "cluster.nic.line_rate_gbps": 200,
    },
    "1T, 1024 H100, t8 p32 v2 interleaved": {
        "cluster.nodes": 128,
        "workload.model": "Megatron-GPT-1T",
        "training.parallelism.pipeline": 32,
        "training.parallelism.virtual_stages": 2,
        "training.parallelism.schedule": "interleaved",
        "workload.gradient_accumulation": 64,
    },
    "GPT-3 175B, 3072 H100, t8 p16 d24": {
        "cluster.nodes": 384,
        "training.parallelism.pipeline": 16,
        "workload.gradient_accumulation": 64,
    },
}


@pytest.mark.parametrize("label", sorted(_LARGE))
def test_large_models_fit_and_run_at_plausible_utilisation(label):
    """Issue #12's models on A100/H100 clusters of 64-3,072 GPUs with layouts people use: they fit in
    80 GB, and the model FLOPs utilisation (6 x params per token, the recomputed forward not
    counted) lands where published Megatron runs do, between 20% and 60% of dense peak."""
    from clustersim.catalog import gpu
    from clustersim.scenario import load_scenario

    s = load_scenario("preset:dgx-h100-gpt3-175b-3d").with_changes(**_LARGE[label])
    r = simulate(s)
    assert r.memory["total"] <= r.memory["capacity"]
    tokens = r.samples_per_iteration * s.workload.seq_len
    params = build_context(s).params
    mfu = 6 * params * tokens / (r.iteration_time * r.world_size * gpu(s.cluster.gpu).peak_flops("bf16"))
    assert 0.2 < mfu < 0.6, mfu


def test_samples_count_data_parallel_replicas_even_when_the_group_spans_nodes_unevenly():
    # 24 GPUs, t=2, p=2: d=6 replicas; a data group is 4 ranks on one node and 2 on the next
    s = _scenario(nodes=3, t=2, p=2, m=4)
    assert simulate(s).samples_per_iteration == 1 * 4 * 6


def test_out_of_memory_with_model_parallelism_does_not_suggest_zero():
    """ZeRO together with tensor/pipeline parallelism is refused, so the out-of-memory hint of a
    model-parallel layout that does not fit points at more tensor/pipeline stages instead."""
    with pytest.raises(InputError) as err:
        simulate(_scenario(nodes=4, t=8, p=2, m=8, model_name="GPT-3-175B"))
    msg = str(err.value)
    assert err.value.key == "workload.model" and "does not fit" in msg
    assert "training.sharding" not in msg
    assert "training.parallelism" in msg


def test_distributed_optimizer_shards_the_fp32_states_over_the_data_parallel_replicas():
    """Megatron's distributed optimizer is ZeRO stage 1 over the data-parallel group (Rajbhandari et al.
    2020: 4Psi + 12Psi/N_d for mixed-precision Adam): the fp32 master weights and Adam's m, v shrink by
    d, the 16-bit weights and the gradients do not; the reduce-scatter plus all-gather move what the
    all-reduce moved (the ring's 2(d-1)/d each way), and the update runs on 1/d of the parameters.
    Both on rings: a data group on 2 nodes would otherwise all-reduce on NCCL's tree, which moves less."""
    plain = _scenario(nodes=4, t=2, p=2, m=8).with_changes(**{"training.collective_algorithm": "ring"})
    dist = plain.with_changes(**{"training.parallelism.distributed_optimizer": True})
    a, b = simulate(plain, uncertainty_samples=0), simulate(dist, uncertainty_samples=0)
    ctx = build_context(plain)
    P, d = ctx.rank_params, ctx.layout.data
    assert d == 8
    assert a.memory["optimizer_state"] == pytest.approx(8 * P)
    assert b.memory["optimizer_state"] == pytest.approx(8 * P / d)
    assert b.memory["parameters"] == pytest.approx(2 * P + 4 * P / d)  # fp16 weights + fp32 master / d
    assert b.memory["gradients"] == a.memory["gradients"]
    assert b.bytes_per_link_kind["inter_node_per_node"] == pytest.approx(
        a.bytes_per_link_kind["inter_node_per_node"], rel=0.02
    )
    names = [op.name for op in b.ops]
    assert any("reduce_scatter gradients" in n for n in names) and any(
        "all_gather parameters" in n for n in names
    )
    assert not any("all_reduce gradients" in n for n in names)
    upd_a = sum(op.end - op.start for op in a.ops if op.category == "optimizer")
    upd_b = sum(op.end - op.start for op in b.ops if op.category == "optimizer")
    assert upd_b == pytest.approx(upd_a / d, rel=1e-6)


def test_distributed_optimizer_alone_runs_megatrons_data_parallel_program():
    s = _scenario(nodes=2, t=1, p=1, m=4).with_changes(**{"training.parallelism.distributed_optimizer": True})
    r = simulate(s, uncertainty_samples=0)
    assert any("reduce_scatter gradients" in op.name for op in r.ops)


def test_replica_factors_follow_megatrons_rank_order():
    """rank = tp + t*dp + t*d*pp: with t=2, d=2, p=4 rank 13 is stage 3 of replica 0; a tensor-parallel
    group computes at its slowest member's pace; the typical replica takes each stage's median over
    the other replicas (here the one other replica: the mean of the two, 1.1 and 1.25, was a replica
    no rank runs at)."""
    import numpy as np

    from clustersim.simulator.stragglers import replica_factors

    factors = np.ones(16)
    factors[13] = 1.5
    factors[4] = 1.2  # stage 1, replica 0 (rank 4 = 0 + 2*0 + 4*1)
    typical, slowest, where = replica_factors(factors, tensor=2, data=2, pipeline=4)
    assert where == (3, 0)
    assert slowest == [1.0, 1.2, 1.0, 1.5]
    assert typical == [1.0, 1.0, 1.0, 1.0]  # replica 1's own factors
    factors[6] = 1.4  # stage 1, replica 1: the typical replica is replica 1, whatever it runs at
    typical, slowest, where = replica_factors(factors, tensor=2, data=2, pipeline=4)
    assert where == (3, 0) and typical == [1.0, 1.4, 1.0, 1.0] and slowest == [1.0, 1.2, 1.0, 1.5]


def _slow(ranks, factor=1.3, **kw):
    s = _scenario(nodes=4, t=2, p=4, m=8, **kw)
    return s.with_changes(
        **{"cluster.heterogeneity": {"slow_gpus": [{"rank": r, "compute_factor": factor} for r in ranks]}}
    )


def test_a_slow_gpu_in_a_pipeline_slows_the_step_within_its_factor():
    """Replicas meet at the data-parallel collectives, so one slow replica costs the step what slowing
    that stage in every replica costs (t=2, d=4, p=4 on 32 GPUs: stage 2's groups are ranks 16-23,
    replica r's is ranks 16+2r and 17+2r); and a step never gets faster, nor slower than the factor."""
    base = simulate(_scenario(nodes=4, t=2, p=4, m=8)).iteration_time
    one = simulate(_slow([17]))
    every = simulate(_slow([17, 19, 21, 23]))
    assert one.extra["straggler"]["stage"] == 2 and one.extra["straggler"]["replica"] == 0
    assert one.iteration_time == pytest.approx(every.iteration_time, rel=1e-9)
    assert base < one.iteration_time <= 1.3 * base
    assert one.extra["straggler"]["delay_s"] > 0  # the typical replica waits at its all-reduces
    assert "delay_s" not in every.extra["straggler"] or every.extra["straggler"]["delay_s"] == pytest.approx(
        0
    )
    assert sum(one.breakdown.values()) == pytest.approx(one.iteration_time)
    par = one.extra["parallelism"]
    assert len(par["stages"]) == len(par["slowest_replica_stages"]) == 4


def test_pipeline_traces_name_a_process_per_stage():
    """Perfetto: one process per pipeline stage (and per stage of the slowest replica)."""
    names = {
        e["args"]["name"].split(" (")[0]
        for e in simulate(_slow([17])).chrome_trace()["traceEvents"]
        if e["name"] == "process_name"
    }
    assert names == {f"stage {s}" for s in range(4)} | {f"stage {s} of the slowest replica" for s in range(4)}


@pytest.mark.parametrize(
    "parallelism",
    [
        {"tensor": 2},
        {"tensor": 4, "distributed_optimizer": True},
        {"sequence_parallel": True},
        {"pipeline": 2},
    ],
)
def test_one_node_without_a_nic_runs_model_parallel(parallelism):
    """A single node needs no NIC (nic.count 0 is valid there): without a pipeline nothing is sent between
    stages, so no send is priced over the missing NIC (it divided by zero bandwidth)."""
    scenario = {
        "name": "one node, no NIC",
        "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM", "nic": {"count": 0}},
        "workload": {"model": "GPT-2-124M", "micro_batch": 1, "seq_len": 1024},
        "training": {"parallelism": parallelism},
    }
    s = validate_scenario(scenario, "one node")
    assert simulate(s).iteration_time > 0


def test_selective_recompute_memory_is_korthikantis_table_2():
    """Selective recomputation drops the 5as/(ht) score term and nothing else (Korthikanti et al. 2022,
    Table 2): sbh(10 + 24/t), sbh*34/t with sequence parallelism, for unfused attention; fused attention
    keeps no scores either way, so selective changes nothing there."""
    t, p, m = 2, 4, 8
    arch = model("GPT-3-1.3B")
    s, b, h = 2048, 1, arch.hidden
    unfused = {"workload.attention": "unfused"}

    def layout(**par):
        return build_context(_scenario(t=t, p=p, m=m, **par).with_changes(**unfused)).layout

    assert layout(recompute="selective").block_activation_bytes() == pytest.approx(s * b * h * (10 + 24 / t))
    sp = layout(recompute="selective", sequence_parallel=True)
    assert sp.block_activation_bytes() == pytest.approx(s * b * h * 34 / t)
    assert layout().block_activation_bytes() > layout(recompute="selective").block_activation_bytes()
    fused = build_context(_scenario(t=t, p=p, m=m, recompute="selective")).layout
    assert fused.block_activation_bytes() == pytest.approx(s * b * h * (10 + 24 / t))
    assert fused.describe()["recompute"] == "selective"


@pytest.mark.parametrize("attention", ["unfused", "fused"])
def test_selective_recompute_reruns_the_core_attention_forward(attention):
    """The extra backward work per block on one of t ranks is the core attention's forward: the QK^T and
    attention-over-V matmuls, 4bs^2h/t FLOPs, and (unfused) the softmax and dropout's 4 passes over the
    b*a*s^2/t scores; the step grows by that and stays below full recomputation's."""
    t, arch, b, s = 2, model("GPT-3-1.3B"), 1, 2048
    changes = {"workload.attention": attention}
    base = _scenario(nodes=1, t=t, p=1, m=2).with_changes(**changes)
    sel = _scenario(nodes=1, t=t, p=1, m=2, recompute="selective").with_changes(**changes)
    ctx = build_context(sel)
    block = next(x for x in ctx.workload.layers if x.name.startswith("block"))
    kernels = ctx.layout.recomputed_attention(block)
    assert sum(k.flops for k in kernels) == pytest.approx(4 * b * s * s * arch.hidden / t)
    scores = b * arch.heads * s * s / t
    softmax = sum(k.bytes for k in kernels if k.name == "elementwise")
    assert softmax == pytest.approx(4 * 2 * scores if attention == "unfused" else 0.0)
    r0, r1 = simulate(base), simulate(sel)
    full = simulate(_scenario(nodes=1, t=t, p=1, m=2, recompute="full").with_changes(**changes))
    extra = r1.breakdown["backward"] - r0.breakdown["backward"]
    per_block = ctx.rank_kernels_time(kernels)
    assert extra == pytest.approx(per_block * arch.layers * 2, rel=1e-6)  # 2 micro-batches
    assert r0.iteration_time < r1.iteration_time < full.iteration_time
    # no tensor-parallel collective is repeated: the core attention has none
    assert sum(o.meta.get("count", 1) for o in r1.ops if o.name.startswith("tp ")) == sum(
        o.meta.get("count", 1) for o in r0.ops if o.name.startswith("tp ")
    )


def test_selective_recompute_beside_activation_checkpointing_is_refused_with_its_key():
    scenario = _scenario(nodes=1, t=1, p=1, m=2, recompute="selective").model_dump()
    scenario["workload"]["activation_checkpointing"] = True
    with pytest.raises(InputError) as err:
        validate_scenario(scenario)
    assert err.value.key == "workload.activation_checkpointing"
    assert "selective" in str(err.value)
