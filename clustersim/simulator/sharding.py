"""What a sharding setting partitions, over which group, and the GPU memory per rank it leaves.

ZeRO (Rajbhandari et al., SC'20, sec. 5) for mixed-precision Adam, Ψ parameters, N_d ranks:
DDP 2Ψ + 2Ψ + 12Ψ = 16Ψ; stage 1 (optimizer states partitioned) 4Ψ + 12Ψ/N_d; stage 2 (+ gradients)
2Ψ + 14Ψ/N_d; stage 3 (+ parameters) 16Ψ/N_d. Here the 12 is the fp32 master copy (4 B, only when
training in 16 bits) plus the strategy's own ``state_bytes_per_param`` (Adam's m and v: 8 B), and the
2s are the workload's parameter and gradient dtypes, so other optimizers follow the same rule.

Beyond the model states, the frameworks hold transient buffers (named so, and freed before the
optimizer step): DeepSpeed's gradient reduce bucket (``reduce_bucket_size`` elements, the ipg buffer of
stage_1_and_2.py / stage3.py; two of them at stages 1-2 with overlap_comm), stage 3's gathered
parameters (the layer being computed and the prefetched ones, as gather_schedule issues them), FSDP's
two unsharded units (``limit_all_gathers`` lets one all-gather run ahead) and its unsharded gradient of
one unit.
ZeRO++'s hpZ keeps a secondary 16-bit copy of the weights partitioned over the node (+2Ψ/g, ZeRO++
paper sec. 3.2); qgZ its int4 send/receive buffers of one reduce bucket (coalesced_collectives.py
all_to_all_quant_reduce allocates both).

Hierarchical partitioning (``training.sharding.partition``, the Frontier design: GCD pair, node,
world): parameters over s_p ranks, gradients over s_g, optimizer states (with the fp32 master copy)
over s_o, s_p <= s_g <= s_o; per rank d·Ψ/s_p + g·Ψ/s_g + (4 + K)·Ψ/s_o, the ZeRO formulas with
each state's own divisor (all world: ZeRO-3's 16Ψ/N_d).

With the optimizer offloaded, DeepSpeed's stage 1/2 (ZeRO-Offload) keeps no gradient partition on the
GPU (zero_offload_gradients).
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.sharding_rules import LEVELS, partition_levels
from clustersim.topologies.cluster import GroupShape

MIB = 2**20
# DeepSpeed's defaults, in elements (deepspeed/runtime/zero/config.py): reduce_bucket_size,
# allgather_bucket_size = 5e8; stage3_prefetch_bucket_size = 5e7.
DEEPSPEED_BUCKET_ELEMENTS = 5e8
DEEPSPEED_PREFETCH_ELEMENTS = 5e7
# ZeRO-3 steps the optimizer one sub-group of its partition at a time (stage3.py, _optimizer_step per
# sub_group_size elements; default 1e9 in the same config.py).
DEEPSPEED_SUB_GROUP_ELEMENTS = 1e9
# Bits on the wire for ZeRO++ (paper sec. 3.1, 3.3): int8 weights (qwZ), int4 gradients (qgZ).
QWZ_BYTES = 1.0
QGZ_BYTES = 0.5
# qwZ's scales: one fp32 per group of at most ~8,000 weights (partition_parameters.py CUDAQuantizer,
# target_group_size = 8000).
QWZ_GROUP = 8000
SCALE_BYTES = 4.0
# Transient keys: held during forward/backward, freed before the optimizer step.
TRANSIENT = ("reduce_bucket", "gathered_parameters", "unsharded_gradients", "qgz_buffers")


@dataclass(frozen=True)
class Layout:
    """One sharding setting, resolved: what is partitioned over ``shard``, and how the step runs."""

    label: str
    shard: GroupShape  # parameters/gradients/optimizer state are split over these ranks
    replicate: GroupShape | None  # FSDP hybrid: gradient shards all-reduced over these (one per node)
    gradients: bool  # gradients partitioned (stage >= 2)
    parameters: bool  # parameters partitioned (stage 3, FSDP)
    reshard_after_forward: bool  # parameters gathered again for backward (stage 3, FULL_SHARD)
    per_unit: bool  # FSDP: one all-gather / reduce-scatter per wrapped unit (a layer), no buckets
    overlap: bool  # reductions on their own stream
    # Hierarchical partitioning: each state's level (gcd_pair | node | world) and group; None: ``shard``.
    levels: dict[str, str] | None = None
    groups: dict[str, GroupShape] | None = None

    @property
    def degree(self) -> int:
        return self.shard.ranks

    def group(self, state: str) -> GroupShape:
        """The ranks ``state`` (parameters | gradients | optimizer_states) is partitioned over."""
        return self.groups[state] if self.groups and state in self.groups else self.shard

    def ranks(self, state: str) -> int:
        return self.group(state).ranks


def layout(ctx) -> Layout | None:
    """The layout of ``training.sharding``, None when nothing is sharded (DDP)."""
    sh = ctx.scenario.training.sharding
    dp = ctx.data_parallel
    if sh.framework == "fsdp":
        strategy = sh.fsdp_strategy or "full"
        hybrid = strategy == "hybrid" and dp.nodes > 1
        # HYBRID_SHARD: shard over the node's data-parallel ranks (all its GPUs, or over tensor
        # parallelism g/t of them at stride t, t such groups per node: FSDP2's (replicate, shard, tp)
        # mesh), replicate across nodes (every GPU of the node in one such group at once).
        shard = GroupShape(1, dp.gpus_per_node, dp.sharing) if hybrid else dp
        replicate = GroupShape(dp.nodes, 1, sharing=dp.gpus_per_node * dp.sharing) if hybrid else None
        full = strategy != "grad_op"
        return Layout(f"FSDP {strategy.upper()}", shard, replicate, True, True, full, True, True)
    if sh.stage == 0:
        return None
    overlap = sh.overlap_comm if sh.overlap_comm is not None else sh.stage == 3
    label = f"ZeRO-{sh.stage}"
    levels = groups = None
    if sh.partition.enabled:
        levels = partition_levels(sh)
        groups = {state: level_group(ctx, level) for state, level in levels.items()}
        label += " (" + ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in levels.items()) + ")"
    return Layout(
        label, dp, None, sh.stage >= 2, sh.stage == 3, sh.stage == 3, False, overlap, levels, groups
    )


def span_of(shape: GroupShape) -> str:
    """Where a collective over ``shape`` runs: across nodes, inside a node, or between two GPUs of a
    node (on a Frontier node the GCD pair of a package, the first two GCDs)."""
    if shape.nodes > 1:
        return "inter_node"
    return "gcd_pair" if shape.gpus_per_node == 2 else "node"


def level_group(ctx, level: str) -> GroupShape:
    """A partition level's group: the two GCDs of a package (the node's g/2 pairs at once), the node's
    data-parallel ranks, or all of them."""
    dp = ctx.data_parallel
    if level == "gcd_pair":
        return GroupShape(1, 2, sharing=dp.gpus_per_node // 2)
    if level == "node":
        return GroupShape(1, dp.gpus_per_node)
    return dp


def across(ctx, inner: str, outer: str) -> GroupShape | None:
    """The ranks holding the same index of an ``inner``-level group inside one ``outer``-level group:
    who exchanges a shard's pieces between the levels. None when that is one rank (the same level, or
    an outer group no larger than the inner one)."""
    dp = ctx.data_parallel
    g, n = dp.gpus_per_node, dp.nodes
    if LEVELS.index(outer) <= LEVELS.index(inner):
        return None
    if inner == "gcd_pair":
        shape = GroupShape(n if outer == "world" else 1, g // 2, sharing=2)
    else:
        shape = GroupShape(n, 1, sharing=g)
    return shape if shape.ranks > 1 else None


def bucket_elements(mb: float | None, bytes_per_element: float, default: float) -> float:
    """A bucket given in MiB, as elements of ``bytes_per_element``; DeepSpeed's default when unset."""
    return default if mb is None else mb * MIB / bytes_per_element


def deepspeed_reduce_buckets(ctx):
    """DeepSpeed ZeRO's gradient buckets: backward fills ``reduce_bucket_size`` elements (the ipg
    buffer, training.sharding.reduce_bucket_mb) before each is reduced; no small first bucket, unlike
    DDP's. ZeRO-1/2 and ZeRO-Offload (stage_1_and_2.py: an offloaded rank copies each reduced bucket's
    partition to the host) and ZeRO-3 alike."""
    from clustersim.simulator.strategies.buckets import assign_buckets

    sh = ctx.scenario.training.sharding
    cap = bucket_elements(sh.reduce_bucket_mb, ctx.grad_bytes, DEEPSPEED_BUCKET_ELEMENTS) * ctx.grad_bytes
    return assign_buckets(ctx.workload.layers, ctx.grad_bytes, cap / MIB, cap / MIB)


def ipg_buffer_bytes(ctx, overlap: bool) -> float:
    """DeepSpeed ZeRO-1/2's gradient buckets (the ipg buffer), bytes. With contiguous_gradients
    (DeepSpeed's default, and forced with the optimizer offloaded: ``self.contiguous_gradients =
    contiguous_gradients or self.cpu_offload``) stage_1_and_2.py ``backward`` allocates ``buf_0 =
    torch.empty(int(self.reduce_bucket_size), dtype=self.dtype, ...)`` and, ``if self.overlap_comm``, a
    second ``buf_1`` ("double buffers to avoid data access conflict when overlap_comm is enabled"): the
    whole reduce_bucket_size each, however few parameters the model has. ``_release_ipg_buffers`` drops
    them at the end of backward (independent_gradient_partition_epilogue): transient. (DeepSpeed's
    master of February 2025: stage_1_and_2.py lines 206, 2047-2061 and 802.)"""
    sh = ctx.scenario.training.sharding
    bucket = bucket_elements(sh.reduce_bucket_mb, ctx.grad_bytes, DEEPSPEED_BUCKET_ELEMENTS)
    return (2 if overlap else 1) * bucket * ctx.grad_bytes


def zero_offload_overlap(ctx) -> bool:
    """overlap_comm of ZeRO-Offload (stage 0-2 with the optimizer offloaded): the scenario's when it sets
    it, else true, the ZeRO-Offload tutorial's setting, with which ddp.zero_offload_program reduces each
    bucket beside backward."""
    overlap = ctx.scenario.training.sharding.overlap_comm
    return True if overlap is None else overlap


def zero_offload_gradients(ctx, params: float) -> dict[str, float]:
    """GPU bytes of the gradients of DeepSpeed's ZeRO-1/2 with the optimizer offloaded (stage_1_and_2.py
    with cpu_offload; ZeRO-Offload at stage 0 runs as its stage 2), over the rank's ``params``:

    * ``gradients``: none beyond the buckets. A parameter's backward hook copies its gradient into the
      ipg buffer and points the gradient there (reduce_independent_p_g_buckets_and_remove_grads,
      ``grad_reduc.data = new_grad_tensor.data``); after the reduction the rank's part goes to the fp32
      host buffer and the gradient is dropped (async_inplace_copy_grad_to_fp32_buffer_from_gpu,
      ``param.grad = None``), and copy_grads_in_partition returns before it would allocate the GPU
      partition ``grads_in_partition`` (``if self.cpu_offload: ... return``). Stage 1 has those hooks
      only with overlap_comm (``if self.partition_gradients or self.overlap_comm``) and reduces only at
      the accumulation boundary (reduce_ready_partitions_and_remove_grads), so without overlap_comm or
      with several micro-steps every parameter's gradient stays on the GPU until then.
    * ``reduce_bucket``: the ipg buffers (ipg_buffer_bytes), transient.
    * ``offload_gradient_buffer``: ``temp_grad_buffer_for_gpu_offload``, a GPU tensor of the largest
      parameter's elements in the model's dtype, allocated at initialisation with cpu_offload and kept
      (its host twin temp_grad_buffer_for_cpu_offload is on the host).

    DeepSpeed's master of February 2025, stage_1_and_2.py: hooks line 527, the copy into the bucket
    961-963, the temp buffers 472-484, copy_grads_in_partition 1329-1341, the copy to the host 1268-1284.

    Temporaries of PyTorch ops (the overflow check's and the norm's casts of one parameter's gradient)
    are not counted, as nowhere else in the memory model."""
    t = ctx.scenario.training
    overlap = zero_offload_overlap(ctx)
    held = t.sharding.stage == 1 and (not overlap or ctx.scenario.workload.gradient_accumulation > 1)
    largest = max((n for layer in ctx.workload.layers for n in layer.param_tensors), default=0)
    return {
        "gradients": params * ctx.grad_bytes if held else 0.0,
        "reduce_bucket": ipg_buffer_bytes(ctx, overlap),
        "offload_gradient_buffer": largest * ctx.element_bytes,
    }


def sharded_memory(ctx, strategy, lay: Layout, offloaded_parts: dict[str, float]) -> dict[str, float]:
    """Bytes per rank, the same keys as memory.gpu_memory, model states per the ZeRO formulas;
    ``offloaded_parts``: the offload's resident state and staging buffers (memory.py)."""
    offloaded = ctx.scenario.training.offload.mode != "none"
    mem = _states_and_buffers(ctx, lay, 0.0 if offloaded else strategy.state_bytes_per_param)
    mem.update(offloaded_parts)
    mem.update(strategy.extra_gpu_memory())
    everything = sum(mem.values())
    mem["peak_forward_backward"] = everything - mem.get("offload_staging", 0.0)
    mem["peak_update"] = everything - mem["activations"] - sum(mem.get(k, 0.0) for k in TRANSIENT)
    return mem


def offload_budget(ctx, lay: Layout) -> tuple[float, float]:
    """GPU bytes at the forward/backward peak and during the update with the optimizer state offloaded
    (none of it on the GPU): what the offload planner may fill."""
    mem = _states_and_buffers(ctx, lay, 0.0)
    everything = sum(mem.values())
    return everything, everything - mem["activations"] - sum(mem.get(k, 0.0) for k in TRANSIENT)


def _states_and_buffers(ctx, lay: Layout, state: float) -> dict[str, float]:
    """Partitioned model states (``state`` optimizer bytes per parameter on the GPU; the fp32 master
    copy unless offloaded), activations and the frameworks' buffers."""
    sh = ctx.scenario.training.sharding
    P = ctx.params
    n_p, n_g, n_o = (lay.ranks(s) for s in ("parameters", "gradients", "optimizer_states"))
    d = ctx.element_bytes
    offloaded = ctx.scenario.training.offload.mode != "none"
    master = 4.0 if d < 4 and not offloaded else 0.0
    largest = max(layer.params for layer in ctx.workload.layers)
    mem = {
        "parameters": P * d / (n_p if lay.parameters else 1) + master * P / n_o,
        "gradients": P * ctx.grad_bytes / (n_g if lay.gradients else 1),
        "optimizer_state": P * state / n_o,
        "activations": ctx.workload.activation_bytes,
    }
    if lay.per_unit:
        gathered = P * d if not lay.reshard_after_forward else gathered_peak(ctx, lay) * d
        mem["gathered_parameters"] = min(gathered, P * d)
        mem["unsharded_gradients"] = largest * ctx.grad_bytes
    else:
        bucket = bucket_elements(sh.reduce_bucket_mb, ctx.grad_bytes, DEEPSPEED_BUCKET_ELEMENTS)
        if lay.parameters:  # stage 3
            # stage3.py allocates the whole bucket once, at init (``__ipg_bucket_flat_buffer =
            # torch.empty(self.reduce_bucket_size, ...)`` under contiguous_gradients, its default),
            # however few parameters the model has, and frees it only in destroy(): held at the
            # update too, unlike stage 1/2's buckets
            mem["ipg_bucket_buffer"] = bucket * ctx.grad_bytes
            mem["gathered_parameters"] = gathered_peak(ctx, lay) * d
        elif offloaded:  # stage 1/2, ZeRO-Offload
            mem.update(zero_offload_gradients(ctx, P))
        else:  # stage 1/2
            mem["reduce_bucket"] = ipg_buffer_bytes(ctx, lay.overlap)
        if sh.zeropp.hierarchical_partition:
            mem["hpz_secondary_parameters"] = P * d / hpz_group(ctx).ranks
        if sh.zeropp.quantized_gradients:
            mem["qgz_buffers"] = 2 * min(bucket, P) * QGZ_BYTES
    return mem


def gather_schedule(
    sizes: list[float], window: float, max_live: float, per_unit: bool
) -> tuple[list[int], float]:
    """When each layer's parameters are gathered, for layers computed in the order of ``sizes``
    (elements): ``issue_at[i]`` = the layer at whose start i's all-gather is issued (i itself: on
    demand), and the most elements gathered at once (the layer computed and those in flight).

    DeepSpeed (partitioned_param_coordinator.py ``fetch_sub_module``): at each layer's fetch, prefetch
    the next parameters while the newly prefetched elements are below ``min(max_live -
    available, prefetch_bucket)``, where ``available`` counts what is gathered or in flight
    (``__n_available_params``): a bucket of 0, or a layer alone above ``stage3_max_live_parameters``,
    means no prefetch. FSDP (``per_unit``): the next unit's all-gather runs one ahead
    (``limit_all_gathers``, BACKWARD_PRE)."""
    n = len(sizes)
    issue_at = list(range(n))
    issued, peak = -1, 0.0
    for j in range(n):
        if issued < j:
            issued = j
        available = sum(sizes[j : issued + 1])
        new = 0.0
        if per_unit:
            if issued == j and j + 1 < n:
                issued += 1
                issue_at[issued] = j
                new = sizes[issued]
        else:
            limit = min(window, max_live - available)
            while issued + 1 < n and new < limit:
                issued += 1
                issue_at[issued] = j
                new += sizes[issued]
        peak = max(peak, available + new)
    return issue_at, peak


def model_states(mem: dict[str, float]) -> float:
    """Parameters (with the master copy), gradients and optimizer state: the ZeRO paper's sum."""
    return mem["parameters"] + mem["gradients"] + mem["optimizer_state"]


def prefetch_window(ctx) -> float:
    """stage3_prefetch_bucket_size in elements of the parameter dtype."""
    sh = ctx.scenario.training.sharding
    return bucket_elements(sh.prefetch_bucket_mb, ctx.element_bytes, DEEPSPEED_PREFETCH_ELEMENTS)


def gathered_peak(ctx, lay: Layout) -> float:
    """Most parameter elements gathered at once, forward or backward (gather_schedule)."""
    sizes = [float(layer.params) for layer in ctx.workload.layers]
    window, live = prefetch_window(ctx), ctx.scenario.training.sharding.max_live_parameters
    return max(gather_schedule(s, window, live, lay.per_unit)[1] for s in (sizes, sizes[::-1]))


def hpz_group(ctx) -> GroupShape:
    """hpZ's secondary partition: the data-parallel ranks of one node (zero_hpz_partition_size = g)."""
    return GroupShape(1, ctx.data_parallel.gpus_per_node)
