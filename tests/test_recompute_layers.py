"""Full recomputation by layer count (training.parallelism.recompute_num_layers / recompute_method),
checked against closed forms: Megatron-LM's ``_checkpointed_forward`` recomputes the first N blocks of
each chunk (method block) or every block in groups of N checkpointed at their input (method uniform);
a recomputed block keeps only its input (2sbh in 16 bits) and runs its forward, with its forward's
tensor-parallel collectives, again before its backward."""

import math

import pytest

from clustersim.catalog import model
from clustersim.errors import InputError
from clustersim.planner.bounds import step_time_lower_bound
from clustersim.scenario import validate_scenario
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from tests.test_model_parallel import _scenario as model_parallel_scenario

MODEL = "GPT-3-1.3B"  # 24 layers


def _scenario(t=2, p=1, m=2, v=1, nodes=1, sharding=None, **par):
    """test_model_parallel's Megatron scenario (A100-80GB nodes of 8, micro-batch 1, sequence 2048) of
    MODEL, one node by default, optionally sharded by a framework."""
    s = model_parallel_scenario(nodes=nodes, t=t, p=p, m=m, v=v, model_name=MODEL, **par)
    return s.with_changes(**{"training.sharding": {"framework": sharding}}) if sharding else s


def _block(n, **kw):
    return _scenario(recompute="full", recompute_method="block", recompute_num_layers=n, **kw)


def _tp_count(result, backward_only=False):
    return sum(
        o.meta.get("count", 1)
        for o in result.ops
        if o.name.startswith("tp ") and (not backward_only or o.category != "forward")
    )


@pytest.mark.parametrize("kw", [{}, {"p": 4, "m": 8}, {"p": 2, "v": 2, "m": 4, "nodes": 2}])
def test_no_layer_recomputed_equals_none_and_all_layers_equal_full(kw):
    per_chunk = model(MODEL).layers // (kw.get("p", 1) * kw.get("v", 1))
    none, full = simulate(_scenario(**kw)), simulate(_scenario(recompute="full", **kw))
    zero, every = simulate(_block(0, **kw)), simulate(_block(per_chunk, **kw))
    one_each = simulate(_scenario(recompute="full", recompute_method="uniform", recompute_num_layers=1, **kw))
    assert zero.iteration_time == pytest.approx(none.iteration_time, rel=1e-12)
    assert zero.memory["activations"] == pytest.approx(none.memory["activations"], rel=1e-12)
    assert _tp_count(zero) == _tp_count(none)
    for same in (every, one_each):
        assert same.iteration_time == pytest.approx(full.iteration_time, rel=1e-12)
        assert same.memory["activations"] == pytest.approx(full.memory["activations"], rel=1e-12)
        assert _tp_count(same) == _tp_count(full)


def test_each_recomputed_block_adds_its_forward_and_its_collectives_to_backward():
    """One chunk (p = 1), m micro-batches: recomputing k blocks adds k block forwards per micro-batch to
    the backward, on one of t ranks (2T(4h^2 + 2hf)/t GEMM FLOPs each among them), and 2k all-reduces."""
    t, m, k = 2, 2, 5
    base, part = simulate(_block(0, t=t, m=m)), simulate(_block(k, t=t, m=m))
    ctx = build_context(_block(k, t=t, m=m))
    block = next(x for x in ctx.workload.layers if x.name == "block0")
    assert ctx.layout.recomputes(block) and not ctx.layout.recomputes(
        next(x for x in ctx.workload.layers if x.name == f"block{k}")
    )
    extra = part.breakdown["backward"] - base.breakdown["backward"]
    assert extra == pytest.approx(m * k * ctx.rank_forward_time(block), rel=1e-9)
    arch, tokens = model(MODEL), 2048
    gemm = sum(x.flops for x in ctx.layout.kernels(block.forward) if x.name == "gemm")
    assert gemm == pytest.approx(2 * tokens * (4 * arch.hidden**2 + 2 * arch.hidden * arch.ffn) / t)
    assert _tp_count(part) - _tp_count(base) == m * 2 * k


def test_each_recomputed_block_keeps_its_input_instead_of_its_activations():
    """Per recomputed block and micro-batch in flight: sbh(10 + 24/t) (fused attention, Korthikanti et al.
    2022 Table 2) less its input 2sbh; the first of p = 4 stages holds p micro-batches (1F1B)."""
    t, p, m, k = 2, 4, 8, 3
    arch, s, b = model(MODEL), 2048, 1
    h = arch.hidden
    base = build_context(_block(0, t=t, p=p, m=m, nodes=1)).layout
    part = build_context(_block(k, t=t, p=p, m=m, nodes=1)).layout
    saved = s * b * h * (10 + 24 / t) - 2 * s * b * h
    assert base.activation_bytes - part.activation_bytes == pytest.approx(p * k * saved)


def test_uniform_groups_keep_one_input_each_and_hold_a_group_while_it_reruns():
    """Method uniform, groups of N over a chunk of 24 blocks: ceil(24/N) inputs per micro-batch in
    flight, plus, once, the N - 1 blocks' activations beyond one that a group's re-run holds; every block's
    forward runs again (the step takes full recomputation's time)."""
    t, n = 2, 5
    arch, s, b = model(MODEL), 2048, 1
    h = arch.hidden
    sc = _scenario(t=t, recompute="full", recompute_method="uniform", recompute_num_layers=n)
    lay = build_context(sc).layout
    full = build_context(_scenario(t=t, recompute="full")).layout
    kept, ckpt = s * b * h * (10 + 24 / t), 2 * s * b * h
    groups = math.ceil(arch.layers / n)
    blocks_only = lay.activation_bytes - full.activation_bytes + arch.layers * ckpt
    assert blocks_only == pytest.approx(groups * ckpt + (n - 1) * kept)
    full_time = simulate(_scenario(t=t, recompute="full")).iteration_time
    assert simulate(sc).iteration_time == pytest.approx(full_time)


@pytest.mark.parametrize("kw", [{"t": 2}, {"t": 1, "sharding": "fsdp", "nodes": 2}])
def test_more_recomputation_is_never_faster_and_never_takes_more_memory(kw):
    times, memory = [], []
    for k in (0, 1, 6, 12, 24):
        r = simulate(_block(k, **kw))
        times.append(r.iteration_time)
        memory.append(r.memory["activations"])
    assert times == sorted(times) and times[0] < times[-1]
    assert memory == sorted(memory, reverse=True) and memory[0] > memory[-1]
    # uniform groups: more blocks per checkpoint keep fewer inputs and hold more at once while re-run
    uniform = [
        simulate(_scenario(recompute="full", recompute_method="uniform", recompute_num_layers=n, **kw))
        for n in (1, 2, 4)
    ]
    assert len({round(r.iteration_time, 12) for r in uniform}) == 1


def test_the_sharded_path_recomputes_the_same_blocks():
    """FSDP without a pipeline runs one tensor rank's workload (rank_workload): the first k blocks carry
    their forward in their backward and keep only their input; the rest are untouched."""
    k = 4
    ctx = build_context(_block(k, t=1, sharding="fsdp", nodes=2))
    blocks = [x for x in ctx.workload.layers if x.name.startswith("block")]
    lay = ctx.layout
    for i, x in enumerate(blocks):
        if i < k:
            assert x.backward[: len(x.forward)] == x.forward
            assert x.activation_bytes == pytest.approx(lay.checkpoint_block_bytes())
        else:
            assert x.activation_bytes == pytest.approx(lay.kept_block_bytes())
    full = build_context(_scenario(t=1, sharding="fsdp", nodes=2, recompute="full"))
    bwd = sum(k.flops for x in ctx.workload.layers for k in x.backward)
    full_bwd = sum(k.flops for x in full.workload.layers for k in x.backward)
    fwd_block = sum(k.flops for k in blocks[0].forward)
    assert full_bwd - bwd == pytest.approx((len(blocks) - k) * fwd_block)


def test_the_step_lower_bound_counts_only_the_recomputed_share():
    bounds = []
    for k in (0, 3, 6):  # of 6 blocks per stage
        sc = _block(k, p=4, m=8)
        bounds.append(step_time_lower_bound(sc))
        assert 0 < bounds[-1] <= simulate(sc).iteration_time
    assert bounds[0] < bounds[1] < bounds[2]
    assert bounds[2] == pytest.approx(step_time_lower_bound(_scenario(p=4, m=8, recompute="full")))


@pytest.mark.parametrize(
    "par,key,words",
    [
        ({"recompute": "selective", "recompute_num_layers": 2}, "recompute_num_layers", "recompute: full"),
        ({"recompute_num_layers": 2}, "recompute_num_layers", "recompute: full"),
        ({"recompute": "full", "recompute_method": "block"}, "recompute_method", "needs recompute_num"),
        ({"recompute": "full", "recompute_num_layers": 0}, "recompute_num_layers", "at least 1"),
        ({"recompute": "full", "recompute_num_layers": 7, "pipeline": 4}, "recompute_num_layers", "6 blocks"),
    ],
)
def test_bad_layer_counts_are_refused_naming_the_key(par, key, words):
    data = _scenario().model_dump()
    data["training"]["parallelism"].update(par)
    data["workload"]["gradient_accumulation"] = 4
    with pytest.raises(InputError) as err:
        validate_scenario(data)
    assert err.value.key == f"training.parallelism.{key}"
    assert words in str(err.value)


def test_a_negative_layer_count_is_refused_by_the_schema():
    data = _scenario().model_dump()
    data["training"]["parallelism"].update({"recompute": "full", "recompute_num_layers": -1})
    with pytest.raises(InputError) as err:
        validate_scenario(data)
    assert err.value.key == "training.parallelism.recompute_num_layers"
    assert "greater than or equal to 0" in str(err.value)


# ---- TorchTitan's op-level selective checkpointing (recompute: selective_op) ----------------------------


def _llama(recompute, **par):
    data = {
        "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM", "nic": {"count": 8}},
        "workload": {"model": "Llama-3-8B", "micro_batch": 1, "seq_len": 2048, "gradient_accumulation": 2},
        "training": {
            "optimizer": "adam",
            "sharding": {"framework": "fsdp"},
            "parallelism": {"recompute": recompute, **par},
        },
    }
    return validate_scenario(data)


def test_op_checkpointing_reruns_every_second_matmul_and_the_pointwise_ops():
    """Llama 3 8B (h 4096, 8 of 32 heads for K and V, f 14336): wk, wo and w3 run again, (h*kv + h^2 +
    h*f) / (2h^2 + 2h*kv + 3hf) of the block's matmul FLOPs; the attention kernel does not; the forward's
    pointwise group runs again whole. The step grows by exactly that per block and micro-batch."""
    arch = model("Llama-3-8B")
    h, f, kv = arch.hidden, arch.ffn, arch.hidden * arch.kv_heads // arch.heads
    share = (h * kv + h * h + h * f) / (2 * h * h + 2 * h * kv + 3 * h * f)
    assert share == pytest.approx(79_691_776 / 218_103_808)
    sc = _llama("selective_op")
    ctx = build_context(sc)
    block = next(x for x in ctx.workload.layers if x.name == "block0")
    lay = ctx.layout
    again = lay.recomputed_ops(block)
    fwd = {k.name: k for k in lay.kernels(build_context(_llama("full")).workload.layers[1].forward)}
    gemm = next(k for k in again if k.name == "gemm")
    assert gemm.flops == pytest.approx(share * fwd["gemm"].flops) and gemm.launches == 3
    assert not any(k.name == "attention" for k in again)
    assert next(k for k in again if k.name == "elementwise") == fwd["elementwise"]
    base = simulate(_llama("full", recompute_method="block", recompute_num_layers=0))
    extra = simulate(sc).breakdown["backward"] - base.breakdown["backward"]
    assert extra == pytest.approx(2 * arch.layers * ctx.rank_kernels_time(again), rel=1e-9)


def test_op_checkpointing_keeps_the_input_and_the_saved_outputs():
    """Per block and micro-batch: 2 bytes x tokens x (input h + wq h + wv kv + attention h + w1 f + w2 h)
    and the attention's fp32 log-sum-exp (4 bytes per head and token); between full and none in memory,
    and in time."""
    arch, tokens = model("Llama-3-8B"), 2048
    h, kv = arch.hidden, arch.hidden * arch.kv_heads // arch.heads
    lay = build_context(_llama("selective_op")).layout
    assert lay.kept_block_bytes() == pytest.approx(tokens * (2 * (4 * h + kv + arch.ffn) + 4 * arch.heads))
    runs = [
        simulate(_llama("full")),
        simulate(_llama("selective_op")),
        simulate(_llama("full", recompute_method="block", recompute_num_layers=0)),
    ]
    mem = [r.memory["activations"] for r in runs]
    times = [r.iteration_time for r in runs]
    assert mem[0] < mem[1] < mem[2]
    assert times[0] > times[1] > times[2]


@pytest.mark.parametrize(
    "model_name,par,words",
    [("GPT-3-1.3B", {}, "Llama blocks"), ("Llama-3-8B", {"tensor": 2}, "tensor parallelism")],
)
def test_op_checkpointing_outside_torchtitans_llama_is_refused(model_name, par, words):
    data = _llama("selective_op").model_dump()
    data["workload"]["model"] = model_name
    data["training"]["parallelism"].update(par)
    with pytest.raises(InputError) as err:
        validate_scenario(data)
    assert err.value.key == "training.parallelism.recompute"
    assert words in str(err.value)
