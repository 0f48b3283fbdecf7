"""Sharded data parallelism as a layer over a full-precision optimizer: DeepSpeed ZeRO 1/2/3, FSDP.

The optimizer (Adam, SGDM) keeps its update kernel and state bytes; this strategy changes what is
communicated and on how much of the model the update runs. How each framework runs a step:

* ZeRO-1/2 (deepspeed/runtime/zero/stage_1_and_2.py): gradients are reduced in buckets of
  ``reduce_bucket_size`` elements to the rank owning each partition (``average_tensor``: one
  ``dist.reduce`` per partition slice, the volume of a reduce-scatter, priced as one). Stage 2 reduces
  as backward fills each bucket, every micro-step (gradients are partitioned); stage 1 only at the
  accumulation boundary (``reduce_ready_partitions_and_remove_grads``). With ``overlap_comm`` (default
  off for stages 1-2) the reduction runs on a side stream, otherwise on the compute stream (it
  blocks backward). Each rank updates its 1/N_d of the parameters, then the updated 16-bit
  partitions are all-gathered in ``allgather_bucket_size`` chunks (``all_gather_dp_groups``).
* ZeRO-3 (stage3.py, partitioned_param_coordinator.py): every layer's parameters are all-gathered
  before its forward and again before its backward (released after use), the next ones prefetched
  as ``fetch_sub_module`` does (sharding.gather_schedule: up to ``stage3_prefetch_bucket_size``
  elements at a time, never beyond ``stage3_max_live_parameters`` gathered); gradients go to
  ``reduce_bucket_size`` buckets reduce-scattered on their own stream (overlap_comm defaults to true
  for stage 3). The
  step updates the rank's partition; there is no all-gather after it (the next forward gathers).
  The reuse-distance cache (``stage3_max_reuse_distance``), which can keep the last layers of forward
  gathered into backward, is not modelled: every layer is gathered twice, the paper's 3Ψ.
* FSDP (torch/distributed/fsdp): one flat parameter per wrapped unit (here a layer); FULL_SHARD
  gathers each unit before forward and backward (``limit_all_gathers`` lets one all-gather run
  ahead; BACKWARD_PRE prefetch issues the next unit's before the current backward), reduce-scatters
  its gradient in the post-backward hook; SHARD_GRAD_OP keeps the gathered parameters from forward to
  backward; HYBRID_SHARD shards within the node and all-reduces the gradient shards across nodes.
* Hierarchical partitioning (``training.sharding.partition``; the Frontier design of three bandwidth
  levels, sharding.py ``level_group``): each state's collectives run over its level's group. Gradients
  are reduce-scattered in theirs every micro-step; at the boundary the shard goes on to the optimizer's
  group (reduce-scatter among the ranks with the same index, when wider) and is all-reduced across that
  group's copies (when not the world); the update runs on the optimizer's slice; a narrower parameter
  shard is rebuilt from the updated slices before the step's first forward, layer by layer on the
  gather stream; stage 1/2 all-gather the updated parameters over the optimizer's group.

Parameter all-gathers run on their own stream (``gather``), reductions on ``comm``: both frameworks
use separate streams for the two (stage3.py ``__allgather_stream`` / ``reduce_and_partition_stream``,
FSDP's unshard and post-backward streams). ZeRO++ replaces pieces of ZeRO-3 (zeropp.py).

Over tensor parallelism (Megatron-DeepSpeed; FSDP2 + DTensor) the same programs run one tensor rank's
share of the model (``ctx.workload`` is model_parallel.py ``rank_workload``), the collectives above
over the data-parallel group at stride t, and Megatron's per-layer tensor-parallel collectives after
each layer's kernels (common.add_tensor_parallel).
"""

from __future__ import annotations

import math

from clustersim.simulator import offload
from clustersim.simulator.dispatch_lane import PassSequence, reversed_layers
from clustersim.simulator.host import fresh_buffer_shares
from clustersim.simulator.input_pipeline import add_input
from clustersim.simulator.program import Program
from clustersim.simulator.sharding import (
    DEEPSPEED_BUCKET_ELEMENTS,
    Layout,
    across,
    bucket_elements,
    deepspeed_reduce_buckets,
    gather_schedule,
    layout,
    level_group,
    prefetch_window,
    span_of,
)
from clustersim.simulator.strategies import zeropp
from clustersim.simulator.strategies.base import StepProgram, Strategy
from clustersim.simulator.strategies.buckets import Bucket
from clustersim.simulator.strategies.common import (
    add_collective,
    add_micro_steps,
    add_other,
    add_tensor_parallel,
    add_zero3_gradient_to_host,
)

NIC_SHARE = "nic_share"  # the rank's share of its node's NICs (a link of the program, see share_nics)


class Sharded(Strategy):
    """``inner`` (a full-precision Strategy) run under ZeRO or FSDP; results keep the inner's name."""

    def __init__(self, ctx, inner: Strategy):
        super().__init__(ctx, inner.options)
        self.inner = inner
        self.name = inner.name
        self.summary = inner.summary
        self.update_bytes_per_param = inner.update_bytes_per_param
        self.state_bytes_per_param = inner.state_bytes_per_param
        self.layout: Layout = layout(ctx)

    def extra_gpu_memory(self) -> dict[str, float]:
        return self.inner.extra_gpu_memory()

    def result_extra(self, per_step: list[dict]) -> tuple[dict, list[str]]:
        lay, zpp = self.layout, self.ctx.scenario.training.sharding.zeropp
        quantized = zpp.quantized_gradients and not lay.per_unit
        inner, notes = self.inner.result_extra(per_step)
        return {
            "sharding": {
                "layout": lay.label,
                "shard_ranks": lay.degree,
                "replicate_ranks": lay.replicate.nodes if lay.replicate else 1,
                "partitioned": [
                    k
                    for k, on in (
                        ("optimizer state", True),
                        ("gradients", lay.gradients),
                        ("parameters", lay.parameters),
                    )
                    if on
                ],
                "zeropp": [k for k, on in zpp.model_dump().items() if on],
                "reduction": "int4 all-to-all (qgZ)" if quantized else "reduce-scatter",
                **(
                    {"partition": dict(lay.levels), "bytes_per_node_by_span": self.bytes_by_span()}
                    if lay.levels
                    else {}
                ),
            },
            **inner,
        }, notes

    def steps(self) -> list[StepProgram]:
        if self.ctx.scenario.training.offload.mode != "none":
            if not self.layout.parameters:
                # ZeRO-Offload is DeepSpeed's stage 1/2 CPU path (stage_1_and_2.py cpu_offload): the
                # existing program already reduce-scatters, moves the shard and all-gathers.
                return self.inner.steps()
            return [self._stage3_offloaded()]
        prog = Program()
        ctx, lay = self.ctx, self.layout
        if lay.parameters:
            ends, buckets = _stage3_program(prog, ctx, lay)
        else:
            ends, buckets = _stage12_program(prog, ctx, lay)
        ends = self._update(prog, ends)
        d = ctx.element_bytes
        if not lay.parameters:
            ends = _gather_updated(prog, ctx, ends, ctx.params * d, lay.group("optimizer_states"))
        add_other(prog, ctx, ends, params=ctx.params / lay.ranks("optimizer_states"))
        share_nics(prog, ctx)
        self._programs = [prog]
        return [StepProgram("step", 1.0, prog, buckets)]

    def bytes_by_span(self) -> dict[str, float]:
        """Bytes per node per step of the sharding's collectives, by where they run: inside a GCD pair,
        inside a node (and the intra-node part of collectives across nodes), out of the NICs."""
        out = {"gcd_pair": 0.0, "node": 0.0, "inter_node": 0.0}
        for prog in getattr(self, "_programs", []):
            for op in prog.ops:
                span = op.meta.get("span")
                if span is None:
                    continue
                out["inter_node"] += op.inter_node_bytes
                out["gcd_pair" if span == "gcd_pair" else "node"] += op.intra_node_bytes
        return out

    def _stage3_offloaded(self) -> StepProgram:
        """ZeRO-3 with the optimizer on the CPU (offload_optimizer, or interleaved as Deep Optimizer
        States does on ZeRO-3): each reduced gradient partition goes to the host as it is produced,
        every micro-step, the way stage3.py ``partition_grads`` moves it (common.
        add_zero3_gradient_to_host: ``training.offload.gradient_copy``); the offloaded update returns
        the rank's 16-bit partition, and the next forward gathers it as usual (no all-gather after the
        step)."""
        ctx, lay = self.ctx, self.layout
        spec = self.inner.offload_spec()
        partition = ctx.params / lay.degree
        host = ctx.host
        placement = ctx.offload_placement or offload.plan(ctx, spec, partition, host)
        ctx.offload_placement, ctx.offload_spec = placement, spec
        on_cpu = 1.0 - offload.gpu_fraction(placement)
        prog = Program()
        moved: list[int] = []

        fresh = None  # where the blocking copy's pageable buffers fault: the same for every partition
        if ctx.scenario.training.offload.gradient_copy == "blocking":
            fresh = fresh_buffer_shares(ctx.workload.layers, ctx.grad_bytes)

        def to_host(bucket, reduced: int) -> None:
            shard = bucket.elements / lay.degree
            label = f"partition {bucket.index}"
            moved.append(add_zero3_gradient_to_host(prog, ctx, on_cpu, shard, reduced, label, fresh))

        ends, buckets = _stage3_program(prog, ctx, lay, to_host)
        ends = offload.add_offloaded_update(
            prog, ctx, [*ends, *moved], spec, placement, host, partition, f"{self.name} update"
        )
        add_other(prog, ctx, ends, params=partition)
        share_nics(prog, ctx)
        return StepProgram("step", 1.0, prog, buckets)

    def _update_tensors(self) -> int:
        """Tensors the rank's update loops over: FSDP keeps each parameter's shard a tensor of its own;
        DeepSpeed's ZeRO updates one flat partition."""
        return self.ctx.param_tensors if self.ctx.scenario.training.sharding.framework == "fsdp" else 1

    def _update(self, prog: Program, deps) -> list[int]:
        """The optimizer's own update kernel on this rank's 1/N_d of the parameters."""
        ctx = self.ctx
        n = self.layout.ranks("optimizer_states")
        part = ctx.params / n
        return [
            prog.add(
                f"{self.name} update (1/{n} partition)",
                "compute",
                ctx.update_device_time(self.update_bytes_per_param, part, self._update_tensors()),
                "optimizer",
                tuple(deps),
            )
        ]


def share_nics(prog: Program, ctx) -> None:
    """Make collectives that run at once on the two streams share the node's NICs.

    A collective's cost already assumes it has the NICs to itself; a parameter all-gather beside a
    gradient reduce-scatter (ZeRO-3, FSDP) must split them. Each op that crosses nodes pushes its
    inter-node bytes per GPU / its duration through the rank's share of the NICs, whose capacity is
    the node's injection bandwidth (topologies/cluster.py, max-flow to the NICs) over its GPUs, never
    below what one op alone pushes (so an op alone runs exactly as priced)."""
    g = ctx.scenario.cluster.gpus_per_node
    rates = []
    for op in prog.ops:
        if op.inter_node_bytes > 0 and op.duration > 0:
            rate = op.inter_node_bytes / g / op.duration
            op.demands = {**op.demands, NIC_SHARE: rate}
            rates.append(rate)
    if rates:
        prog.links[NIC_SHARE] = max(ctx.cluster.injection().bytes_per_s / g, *rates)


def _reduce_buckets(ctx, lay: Layout):
    """Gradient buckets: FSDP reduces one unit at a time; DeepSpeed fills reduce_bucket_size buckets
    (no small first bucket, unlike DDP)."""
    if lay.per_unit:
        return _unit_buckets(ctx.workload.layers)
    return deepspeed_reduce_buckets(ctx)


def _unit_buckets(layers) -> list[Bucket]:
    """One bucket per FSDP unit (layer), in the order backward finishes them."""
    order = [li for li in reversed(range(len(layers))) if layers[li].params > 0]
    return [Bucket(i, layers[li].params, li) for i, li in enumerate(order)]


def copies_like_fsdp2(ctx) -> bool:
    """Whether the sharding is PyTorch's FSDP2 (``fully_shard``), which keeps each parameter's shard a
    tensor of its own and so copies around every collective (torch/distributed/fsdp/_fully_shard/
    _fsdp_collectives.py): ``foreach_all_gather_copy_out`` splits the all-gather's output into the
    unsharded parameters (``torch.split_with_sizes_copy``) on the compute stream, before the unit's
    pass; ``foreach_reduce`` first concatenates the unit's gradients into the reduce-scatter input in
    the reduce dtype (``torch.cat`` into a reduce_dtype buffer) on the reduce-scatter stream. A flat
    FSDP (PyTorch's FlatParameter, Megatron-FSDP, whose documentation says it "avoids redundant COPY
    operations before and after collectives") communicates in place."""
    sh = ctx.scenario.training.sharding
    return sh.framework == "fsdp" and (sh.fsdp_implementation or "fsdp2") == "fsdp2"


def _copy_out(prog: Program, ctx, layer, gathered, phase: str):
    """FSDP2's copy-out of ``layer``'s gathered parameters (copies_like_fsdp2): a read and a write of
    the unsharded parameters on the compute stream, which the layer's pass waits for."""
    if gathered is None or layer.params == 0 or not copies_like_fsdp2(ctx):
        return gathered
    nbytes = 2 * layer.params * ctx.element_bytes
    return prog.add(
        f"all_gather copy-out {phase} {layer.name}",
        "compute",
        ctx.device.stream_time(nbytes, "fsdp_copy_out"),
        "other",
        (gathered,),
    )


def _bucket_copies(prog: Program, ctx, lay: Layout, bucket, dep, stream: str) -> int:
    """DeepSpeed ZeRO-3's passes over a gradient bucket before its reduce-scatter, on the reduction
    stream (stage3.py): each gradient is copied into the flat IPG bucket (``__add_grad_to_ipg_bucket``,
    contiguous_gradients), then ``reduce_scatter_coalesced`` (runtime/comm/coalesced_collectives.py,
    reduce_scatter on by default) concatenates the bucket's tensors into one buffer (``torch.cat``) and
    pre-divides it by the world size (``div_``): three read-and-write passes, six times the bucket's
    bytes of HBM traffic, at any world size (one rank included). FSDP (one flat gradient per unit) and
    qgZ (its own quantizing all-to-all) do not take this path. Returns the op the reduction waits for."""
    if lay.per_unit and copies_like_fsdp2(ctx):
        # FSDP2: the unit's gradients (computed in the parameters' dtype) read once and written into
        # the reduce-scatter input in the reduce dtype (copies_like_fsdp2)
        return prog.add(
            f"bucket{bucket.index} reduce-scatter copy-in",
            stream,
            ctx.device.stream_time(bucket.elements * (ctx.element_bytes + ctx.grad_bytes), "fsdp_copy_in"),
            "other",
            (dep,),
        )
    if lay.per_unit or ctx.scenario.training.sharding.zeropp.quantized_gradients:
        return dep
    nbytes = bucket.nbytes(ctx.grad_bytes)
    return prog.add(
        f"bucket{bucket.index} copy+cat+scale",
        stream,
        ctx.device.stream_time(6 * nbytes, "bucket_copy"),
        "other",
        (dep,),
    )


def _reduce(
    prog: Program, ctx, lay: Layout, bucket, dep, info: list, stream: str, boundary: bool = True
) -> list[int]:
    """One bucket's gradient reduction: reduce-scatter over the shard group (qgZ's all-to-alls
    instead when enabled), then for FSDP hybrid an all-reduce of the shard across nodes.

    Hierarchical partitioning: the reduce-scatter runs over the gradients' group every micro-step (a
    rank accumulates its gradient shard); at the accumulation boundary the shard is reduce-scattered
    on to the optimizer states' group when that is wider, then all-reduced across the groups of that
    level (each holds the same slice) unless it is the world."""
    nbytes = bucket.nbytes(ctx.grad_bytes)
    sh = ctx.scenario.training.sharding
    if lay.levels:
        return _reduce_levels(prog, ctx, lay, bucket, nbytes, dep, info, stream, boundary)
    if sh.zeropp.quantized_gradients:
        op = zeropp.quantized_gradient_reduce(prog, ctx, bucket, dep, stream)
    else:
        op = add_collective(
            prog,
            ctx,
            f"reduce_scatter grads {bucket.index}",
            "reduce_scatter",
            nbytes,
            lay.shard,
            deps=(dep,),
            stream=stream,
            bucket=bucket.index,
            span=span_of(lay.shard),
        )
    info.append({"bucket": bucket.index, "bytes": nbytes, "op": op})
    if lay.replicate is not None:
        op = add_collective(
            prog,
            ctx,
            f"all_reduce grad shard {bucket.index} across nodes",
            "all_reduce",
            nbytes / lay.shard.ranks,
            lay.replicate,
            deps=(op,),
            stream=stream,
            bucket=bucket.index,
            span=span_of(lay.replicate),
        )
    return [op]


def _reduce_levels(prog, ctx, lay: Layout, bucket, nbytes, dep, info, stream, boundary) -> list[int]:
    """``_reduce`` under training.sharding.partition (stage 1 reduces over the optimizer's group)."""
    g_level = lay.levels.get("gradients", lay.levels["optimizer_states"])
    o_level = lay.levels["optimizer_states"]
    steps = [("reduce_scatter", "grads", g_level, level_group(ctx, g_level), nbytes)]
    if boundary:
        shard = nbytes / level_group(ctx, g_level).ranks
        wider = across(ctx, g_level, o_level)
        if wider is not None:
            steps.append(("reduce_scatter", f"grad shard {g_level}->{o_level}", o_level, wider, shard))
            shard /= wider.ranks
        rest = across(ctx, o_level, "world")
        if rest is not None:
            steps.append(("all_reduce", f"grad shard across {o_level}s", o_level, rest, shard))
    op = dep
    for i, (kind, what, _level, shape, size) in enumerate(steps):
        op = add_collective(
            prog,
            ctx,
            f"{kind} {what} {bucket.index}",
            kind,
            size,
            shape,
            deps=(op,),
            stream=stream,
            bucket=bucket.index,
            span=span_of(shape),
        )
        if i == 0:
            info.append({"bucket": bucket.index, "bytes": nbytes, "op": op})
    return [op]


def _stage12_program(prog: Program, ctx, lay: Layout) -> tuple[list[int], list[dict]]:
    """ZeRO-1/2: forward/backward with bucketed gradient reduction to the partition owners."""
    micro_steps = ctx.scenario.workload.gradient_accumulation
    buckets = _reduce_buckets(ctx, lay)
    by_layer: dict[int, list] = {}
    for b in buckets:
        by_layer.setdefault(b.ready_layer, []).append(b)
    stream = "comm" if lay.overlap else "compute"
    reduced: list[int] = []
    info: list[dict] = []

    def on_backward(li: int, op: int, micro: int) -> None:
        boundary = micro == micro_steps - 1
        if lay.gradients or (lay.overlap and boundary):  # stage 1 reduces only at the boundary
            for b in by_layer.get(li, []):
                reduced.extend(_reduce(prog, ctx, lay, b, op, info if boundary else [], stream, boundary))

    last = add_micro_steps(prog, ctx, on_backward, every_micro=True)
    if not lay.gradients and not lay.overlap:  # stage 1 without overlap_comm: after backward
        for b in buckets:
            reduced += _reduce(prog, ctx, lay, b, last, info, stream)
    return [last, *reduced], info


def _gather_updated(prog: Program, ctx, deps, nbytes: float, shape) -> list[int]:
    """Stage 1/2: all-gather the updated 16-bit partitions (``nbytes`` in all) over the optimizer's
    group ``shape`` in allgather_bucket_size chunks (DeepSpeed all_gather_dp_groups)."""
    d = ctx.element_bytes
    sh = ctx.scenario.training.sharding
    chunk = bucket_elements(sh.allgather_bucket_mb, d, DEEPSPEED_BUCKET_ELEMENTS)
    count = max(1, math.ceil(nbytes / d / chunk))
    return [
        add_collective(
            prog,
            ctx,
            f"all_gather updated params {i}",
            "all_gather",
            nbytes / count,
            shape,
            deps=tuple(deps),
            span=span_of(shape),
        )
        for i in range(count)
    ]


def _stage3_program(prog: Program, ctx, lay: Layout, on_reduced=None) -> tuple[list[int], list[dict]]:
    """ZeRO-3 / FSDP: per-layer parameter all-gathers (prefetched) around forward and backward.
    ``on_reduced(bucket, op)`` hooks in after each bucket's reduction (the offload's gradient copy)."""
    layers = ctx.workload.layers
    window, live = prefetch_window(ctx), ctx.scenario.training.sharding.max_live_parameters
    by_layer: dict[int, list] = {}
    for b in _reduce_buckets(ctx, lay):
        by_layer.setdefault(b.ready_layer, []).append(b)
    stream = "comm" if lay.overlap else "compute"
    n = len(layers)
    sizes = [float(layer.params) for layer in layers]
    fwd_from = gather_schedule(sizes, window, live, lay.per_unit)[0]
    bwd_from = gather_schedule(sizes[::-1], window, live, lay.per_unit)[0]
    reduced: list[int] = []
    info: list[dict] = []
    last = None
    # Parameters partitioned over fewer ranks than the optimizer states (training.sharding.partition):
    # each layer's shard is rebuilt from the slices the last step updated, by the ranks holding the
    # same shard index in the optimizer's group, before the first forward gathers it (as ZeRO++'s hpZ
    # fills its secondary partition during the forward), prefetched with the layer's gather.
    refresh = None
    if lay.levels:
        refresh = across(ctx, lay.levels["parameters"], lay.levels["optimizer_states"])
    for micro in range(ctx.scenario.workload.gradient_accumulation):
        boundary = micro == ctx.scenario.workload.gradient_accumulation - 1
        fwd: list[int] = []
        batch = add_input(prog, ctx, micro)  # workload.input: the micro-batch's features over PCIe
        forward = PassSequence(prog, ctx, layers, True)
        for i, layer in enumerate(layers):
            start = fwd[fwd_from[i] - 1] if fwd_from[i] > 0 else last
            if refresh is not None and micro == 0 and layer.params:
                start = add_collective(
                    prog,
                    ctx,
                    f"all_gather updated param slices {layer.name}",
                    "all_gather",
                    layer.params * ctx.element_bytes / lay.ranks("parameters"),
                    refresh,
                    deps=(start,) if start is not None else (),
                    stream="gather",
                    span=span_of(refresh),
                )
            gathered = zeropp.gather_parameters(prog, ctx, lay, layer, start, forward=True)
            gathered = _copy_out(prog, ctx, layer, gathered, "fwd")
            deps = (gathered, batch) if i == 0 and batch is not None else (gathered,)
            fwd.append(forward.add(layer, tuple(d for d in deps if d is not None), meta={"micro": micro}))
            add_tensor_parallel(prog, ctx, layer, True, micro)
        bwd: list[int] = []
        waits = (fwd[-1],) if ctx.host_syncs_after_forward else ()
        backward = PassSequence(prog, ctx, reversed_layers(ctx, layers), False, waits)
        for k in range(n):
            li = n - 1 - k
            start = bwd[bwd_from[k] - 1] if bwd_from[k] > 0 else fwd[-1]
            gathered = start
            if lay.reshard_after_forward:
                gathered = zeropp.gather_parameters(prog, ctx, lay, layers[li], start, forward=False)
                gathered = _copy_out(prog, ctx, layers[li], gathered, "bwd")
            last = backward.add(
                layers[li], (gathered,) if gathered is not None else (), meta={"micro": micro}
            )
            bwd.append(last)
            add_tensor_parallel(prog, ctx, layers[li], False, micro)
            for b in by_layer.get(li, []):
                ready = _bucket_copies(prog, ctx, lay, b, last, stream)
                reduced += _reduce(prog, ctx, lay, b, ready, info if boundary else [], stream, boundary)
                if on_reduced is not None:
                    on_reduced(b, reduced[-1])
    return [last, *reduced], info
