"""GPU memory per rank: parameters, gradients, optimizer state, activations, strategy buffers.

Mixed precision (fp16/bf16) keeps an fp32 master copy of the parameters (4 B) beside the 16-bit
weights (2 B); optimizer state is fp32. Activations are those kept for backward of one micro-batch
(Korthikanti et al. 2022 for transformers). With tensor/pipeline parallelism a rank holds its
stage's share over t and the activations of its in-flight micro-batches (model_parallel.py).
PyTorch DDP's buckets hold a second copy of the gradients (Megatron-LM's are views). FP8 training
keeps bf16 weights and activations (the GEMM inputs it saves are FP8) and FP8 copies of the linear
weights (workloads/fp8.py). With CPU offload the master copy and the optimizer state live on the
host; only resident subgroups and staging buffers remain on the GPU, and under ZeRO-Offload DeepSpeed's
gradient buckets instead of the gradients (sharding.zero_offload_gradients).
"""

from __future__ import annotations

from clustersim import catalog
from clustersim.errors import InputError
from clustersim.simulator import headroom
from clustersim.simulator.oom import oom_culprit
from clustersim.units import format_bytes
from clustersim.workloads.fp8 import weight_copy_bytes


def gpu_memory(ctx, strategy) -> dict[str, float]:
    from clustersim.simulator.sharding import (
        DEEPSPEED_SUB_GROUP_ELEMENTS,
        TRANSIENT,
        layout,
        sharded_memory,
        zero_offload_gradients,
    )

    lay = layout(ctx)
    if lay is not None:  # ZeRO / FSDP: the ZeRO paper's partitioned model states (sharding.py)
        mem = sharded_memory(ctx, strategy, lay, _side_parts(ctx))
        # each rank updates its partition of the optimizer state (FSDP's torch.optim Adam: foreach);
        # DeepSpeed's ZeRO-3 steps it one sub-group at a time: its sub_group_size, which the scenario
        # gives as training.offload.subgroup_size when it sets it
        stepped = ctx.params / lay.ranks("optimizer_states")
        tr = ctx.scenario.training
        if tr.sharding.framework == "deepspeed" and lay.parameters:
            given = "subgroup_size" in tr.offload.model_fields_set
            stepped = min(stepped, tr.offload.subgroup_size if given else DEEPSPEED_SUB_GROUP_ELEMENTS)
        scratch = _update_scratch(ctx, stepped)
        if scratch:
            mem["update_scratch"] = scratch
            mem["peak_update"] += scratch
        mem["total"] = max(mem["peak_forward_backward"], mem["peak_update"])
        mem["capacity"] = ctx.gpu.memory_bytes
        return mem
    P = ctx.rank_params
    d = ctx.element_bytes
    offloaded = ctx.scenario.training.offload.mode != "none"
    # Megatron's distributed optimizer shards the fp32 master weights and the optimizer state over the
    # data-parallel replicas (ZeRO stage 1: Rajbhandari et al. 2020, 4Psi + 12Psi/N_d for mixed Adam).
    shards = (
        ctx.layout.data
        if ctx.model_parallel and ctx.scenario.training.parallelism.distributed_optimizer
        else 1
    )
    mem = {
        "parameters": P * d + (4 * P / shards if d < 4 and not offloaded else 0),
        "gradients": P * ctx.grad_bytes,
        # one GPU trains without DDP (strategies.common.add_ddp_gradient_sync): no bucket copy; nor
        # Megatron-LM's DDP, whose buckets are slices of the one gradient buffer each param.main_grad
        # views (megatron/core/distributed/param_and_grad_buffer.py)
        "ddp_buckets": 0.0 if offloaded or ctx.world_size == 1 or ctx.model_parallel else P * ctx.grad_bytes,
        # offloaded, all of it is on the host (Adam and SGDM, the optimizers that run offloaded)
        "optimizer_state": 0.0 if offloaded else P / shards * strategy.state_bytes_per_param,
        "activations": ctx.rank_activation_bytes,
    }
    if offloaded:  # ZeRO-Offload: DeepSpeed's stage 2 with the optimizer on the host
        mem.update(zero_offload_gradients(ctx, P))
    if ctx.precision == "fp8":  # Transformer Engine's cached FP8 weights, this rank's share
        mem["fp8_weight_copies"] = (
            weight_copy_bytes(ctx.workload.layers, ctx.workload.fp8_recipe) * P / ctx.params
        )
    mem.update(_side_parts(ctx))
    mem.update(strategy.extra_gpu_memory())
    scratch = _update_scratch(ctx, P / shards)
    if scratch:
        mem["update_scratch"] = scratch
    # Two peaks: forward/backward holds the activations; the update phase has freed them but holds
    # the offload staging buffers and the update's scratch.
    everything = sum(mem.values())
    mem["peak_forward_backward"] = (
        everything - mem.get("offload_staging", 0.0) - mem.get("update_scratch", 0.0)
    )
    transient = sum(mem.get(k, 0.0) for k in TRANSIENT)
    mem["peak_update"] = everything - mem["activations"] - mem["ddp_buckets"] - transient
    mem["total"] = max(mem["peak_forward_backward"], mem["peak_update"])
    mem["capacity"] = ctx.gpu.memory_bytes
    return mem


def _update_scratch(ctx, params_updated: float) -> float:
    """Bytes the update allocates while it runs over the ``params_updated`` parameters this rank
    updates: torch's multi-tensor Adam computes sqrt(v) into new tensors for all of them at once
    (torch._foreach_sqrt, torch/optim/adam.py), fp32, live during the update only; 0 otherwise."""
    if ctx.scenario.training.optimizer == "adam" and ctx.update_implementation == "foreach":
        return 4.0 * params_updated
    return 0.0


def _side_parts(ctx) -> dict[str, float]:
    """Buffers beside the model states: the offload's (below) and the input pipeline's batches."""
    parts = _offloaded_parts(ctx)
    if ctx.scenario.workload.input is not None:
        from clustersim.simulator.input_pipeline import input_gpu_bytes

        parts["input_batches"] = input_gpu_bytes(ctx)
    return parts


def _offloaded_parts(ctx) -> dict[str, float]:
    """What an offloaded optimizer still keeps on the GPU: resident subgroups' state and staging."""
    if ctx.scenario.training.offload.mode == "none" or ctx.offload_placement is None:
        return {}
    from clustersim.simulator.offload import offload_memory

    plan = ctx.offload_placement
    extra = offload_memory(ctx, ctx.offload_spec, plan, plan.partition_params)
    return {
        "optimizer_state_resident": extra["optimizer_state_resident_on_gpu"],
        "offload_staging": extra["offload_staging_buffers"],
    }


def _check_other_gpus(ctx, mem: dict[str, float]) -> None:
    """A node of another GPU type (cluster.heterogeneity.node_gpus) runs the same ranks, so it needs the
    same memory per rank: one with less memory than that is refused by its own entry (an L4 node
    in a job of 80 GB ranks used to be simulated as a slower node that fits)."""
    h = ctx.scenario.cluster.heterogeneity
    for i, n in enumerate(h.node_gpus if h is not None else []):
        other = catalog.gpu(n.gpu)
        if mem["total"] > other.memory_bytes:
            raise InputError(
                f"does not fit in GPU memory: {format_bytes(mem['total'])} per rank needed but node "
                f"{n.node}'s {other.name} has {format_bytes(other.memory_bytes)}",
                key=f"cluster.heterogeneity.node_gpus.{i}.gpu",
            )


# The parts every optimizer's rank holds (gpu_memory, sharded_memory, _side_parts): what else a
# strategy adds (1-bit and 0/1 Adam's error-feedback buffers, DiLoCo's outer copy) is its own.
_COMMON_PARTS = {
    "parameters",
    "gradients",
    "ddp_buckets",
    "optimizer_state",
    "activations",
    "update_scratch",
    "input_batches",
    "optimizer_state_resident",
    "offload_staging",
    "reduce_bucket",
    "ipg_bucket_buffer",
    "offload_gradient_buffer",
    "total",
    "capacity",
    "peak_forward_backward",
    "peak_update",
}


def _optimizer_buffers(mem: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in mem.items() if k not in _COMMON_PARTS and v > 0}


def _distributed_optimizer_hint(ctx, mem: dict[str, float]) -> str:
    """Megatron's distributed optimizer where the scenario leaves it off and has data-parallel replicas
    to shard over: the fp32 master weights and the optimizer state divided by the data-parallel size
    (gpu_memory's own sharding, 4Psi + 12Psi/N_d for mixed-precision Adam), with the rank's total it
    would leave and whether that fits; "" where it cannot help."""
    par, data = ctx.scenario.training.parallelism, ctx.layout.data
    if par.distributed_optimizer or data <= 1 or ctx.scenario.training.offload.mode != "none":
        return ""
    master = 4 * ctx.rank_params if ctx.element_bytes < 4 else 0.0
    saved = (master + mem.get("optimizer_state", 0.0)) * (1 - 1 / data)
    if saved <= 0:
        return ""
    left = mem["total"] - saved
    verdict = "which fits" if left <= mem["capacity"] else "still too much alone"
    return (
        f"; try training.parallelism.distributed_optimizer: true (Megatron's ZeRO-1 shards the fp32 master "
        f"weights and optimizer state over the {data} data-parallel ranks: about {format_bytes(left)} per "
        f"rank, {verdict})"
    )


# Below this share of the GPU left free, a fit is said to be close (simulator/headroom.py says why 5%).
THIN_HEADROOM = headroom.THIN_HEADROOM


def thin_headroom_note(
    total: float, capacity: float, remedy: str = "a smaller workload.micro_batch leaves room"
) -> str | None:
    """What a rank that fits with under THIN_HEADROOM of its GPU to spare is told (None: more spare):
    the memory model counts the model states, activations and the frameworks' named buffers, not the
    CUDA context, cuBLAS workspaces, NCCL's channel buffers or the caching allocator's fragmentation,
    which take memory on a real GPU. `run` notes it; `plan` says it of its choice and the fastest.
    ``remedy`` names the key that frees memory in the rank's case (thin_headroom_remedy)."""
    spare = capacity - total
    if spare >= THIN_HEADROOM * capacity:
        return None
    return (
        f"GPU memory: {format_bytes(total)} of {format_bytes(capacity)}, "
        f"{format_bytes(spare)} to spare; the CUDA context, cuBLAS workspaces, NCCL's buffers and the "
        f"caching allocator's fragmentation are not counted, so a fit this close may not run ({remedy})"
    )


def thin_headroom_remedy(ctx) -> str:
    """The key that frees GPU memory for this rank: the micro-batch when it is above 1; for an offloaded
    optimizer whose state the scenario pins on the GPU, the interleaved placement (it keeps resident only
    what leaves THIN_HEADROOM free, simulator/offload.py); else activation checkpointing."""
    w = ctx.scenario.workload
    off = ctx.scenario.training.offload
    if w.micro_batch > 1:
        return "a smaller workload.micro_batch leaves room"
    if off.mode == "interleaved" and off.placement == "gpu":
        return (
            "training.offload.placement: auto keeps on the GPU only the optimizer state that leaves "
            f"{THIN_HEADROOM:.0%} of it free"
        )
    if not w.activation_checkpointing:
        return "workload.activation_checkpointing: true leaves room; the micro-batch is already 1"
    return "more GPUs with training.sharding or training.parallelism leave room; the micro-batch is already 1"


def _note_thin_headroom(ctx, mem: dict[str, float]) -> None:
    note = thin_headroom_note(mem["total"], mem["capacity"], thin_headroom_remedy(ctx))
    # once: a run checks its memory before building its program and again after (runner._run)
    if note is not None and note not in ctx.notes:
        ctx.notes.append(note)


def check_fits(ctx, mem: dict[str, float]) -> None:
    """Refuse a rank that does not fit, naming the key that makes it not fit: the model when its
    weights, gradients and optimizer state alone exceed the GPU, the micro-batch when its activations
    tip it over, else the GPU; then a node of another GPU type that holds less."""
    if mem["total"] <= mem["capacity"]:
        _check_other_gpus(ctx, mem)
        _note_thin_headroom(ctx, mem)
        return
    parts = ", ".join(
        f"{k.replace('_', ' ')} {format_bytes(v)}"
        for k, v in mem.items()
        if k not in ("total", "capacity", "peak_forward_backward", "peak_update") and v > 0
    )
    offload = ctx.scenario.training.offload.mode != "none"
    from clustersim.sharding_rules import runs_sharded
    from clustersim.simulator.sharding import layout

    lay = layout(ctx)
    if ctx.model_parallel and lay is None:
        par = ctx.scenario.training.parallelism
        hint = (
            f"; try a larger training.parallelism.tensor or training.parallelism.pipeline (a rank holds "
            f"1/(t x p) of the model states; now {par.tensor} x {par.pipeline})"
        )
        if par.pipeline == 1:  # ZeRO composes with tensor parallelism only (scenario.py)
            hint += ", or training.sharding.stage: 3 over the data-parallel ranks"
        megatron_zero = _distributed_optimizer_hint(ctx, mem)
        if megatron_zero:  # first: it keeps the layout; then the layout's own ways
            hint = megatron_zero + hint.replace("; try ", ", or ", 1)
    elif (lay is None or not lay.parameters) and not runs_sharded(ctx.scenario.training.optimizer):
        # neither ZeRO, offload nor tensor/pipeline parallelism runs it (sharding_rules): only more
        # memory per GPU helps the whole replica
        hint = (
            f"; {ctx.scenario.training.optimizer} runs only as whole replicas on the GPUs (no sharding, "
            "offload or model parallelism): GPUs with more memory, or another optimizer (activation "
            "checkpointing or a smaller micro_batch shrink the activations only)"
        )
    elif (lay is None or not lay.parameters) and ctx.world_size == 1:
        # ZeRO and tensor/pipeline parallelism divide by ranks there are none of: only the host helps
        hint = (
            "; on one GPU try training.offload (mode: zero or interleaved: the optimizer state and its "
            "update on the host), or GPUs with more memory (ZeRO and tensor/pipeline parallelism divide "
            "the model states by more GPUs)"
        )
    elif lay is None or not lay.parameters:
        hint = (
            "; try training.sharding.stage: 3 (ZeRO partitions parameters, gradients and optimizer state "
            "over the data-parallel ranks), training.parallelism (tensor/pipeline) or training.offload"
        )
    elif lay.levels and set(lay.levels.values()) != {"world"}:
        hint = (
            f"; {lay.label} divides each state by its level's ranks: partition over wider levels "
            "(training.sharding.partition) or try more GPUs"
        )
    elif lay.replicate is not None:
        # HYBRID_SHARD shards inside the node only: a rank holds 1/(gpus per node) of the model states
        # whatever the node count, and with tensor parallelism 1/t of the model over g/t ranks is the
        # same 1/g, so neither more GPUs nor a larger tensor size shrinks them.
        hint = (
            f"; {lay.label} shards model states over a node's data-parallel ranks only "
            f"({ctx.data_parallel.gpus_per_node} here), so more nodes do not shrink them: try "
            "training.sharding.fsdp_strategy: full"
        )
    else:
        hint = f"; {lay.label} divides model states by the data-parallel size: try more GPUs"
        if ctx.tensor_sharded:  # over a tensor rank's 1/t of the model
            hint += " or a larger training.parallelism.tensor"
    key, why = "cluster.gpu", ""
    w = ctx.scenario.workload
    without_activations = mem["peak_forward_backward"] - mem["activations"]
    batches = mem.get("input_batches", 0.0)
    if batches > 0 and mem["total"] - batches <= mem["capacity"]:
        key = "workload.input.bytes_per_sample"
        twice = " (two with prefetch)" if w.input.prefetch else ""
        why = f"; the input batches of micro_batch {w.micro_batch}{twice} need {format_bytes(batches)}"
        hint = ""
    else:
        key, why = oom_culprit(
            ctx,
            mem["peak_update"],
            without_activations,
            mem["activations"],
            mem["capacity"],
            _optimizer_buffers(mem),
        )
        if key != "workload.model" and why:  # the activations tip it over: the hint is about states
            hint = ""
            state = mem.get("optimizer_state", 0.0)
            frees = not offload and runs_sharded(ctx.scenario.training.optimizer) and state > 0
            if key == "workload.micro_batch" and frees and mem["total"] - state <= mem["capacity"]:
                # the goal is often this micro-batch: moving the optimizer state off the GPU makes room
                hint = (
                    f"; or keep it and move the optimizer state ({format_bytes(state)}) to the host with "
                    "training.offload (mode: zero), which leaves room for it"
                )
    raise InputError(
        f"does not fit in GPU memory: {format_bytes(mem['total'])} per rank needed but {ctx.gpu.name} has "
        f"{format_bytes(mem['capacity'])}{why}{'' if offload else hint}; per rank: {parts}",
        key=key,
    )
