"""Building blocks shared by strategies: micro-steps, DDP bucket all-reduce, update kernels."""

from __future__ import annotations

from typing import NamedTuple

from clustersim.catalog import hardware_defaults
from clustersim.cost_models.kernel_bytes import FUSED_ADAM
from clustersim.simulator.context import SimulationContext
from clustersim.simulator.dispatch_lane import (
    PassSequence,
    add_dispatch,
    add_merged_micro_steps,
    merge_from,
    reversed_layers,
)
from clustersim.simulator.host import fresh_buffer_shares
from clustersim.simulator.input_pipeline import add_input
from clustersim.simulator.measured_compute import device_time
from clustersim.simulator.program import CollectiveSpec, Program
from clustersim.simulator.strategies.buckets import assign_buckets
from clustersim.workloads.fp8 import FP8_BYTES


class PricedCollective(NamedTuple):
    """A collective's op fields that do not depend on when or where in the program it runs: its
    analytical time and traffic, its SM slowdown, its description for a network backend, and its
    metadata. A program of many identical collectives (a pipeline's sends, a chunk's tensor-parallel
    all-reduces in every micro-batch) prices each kind once (price_collective) and adds it many times
    (add_priced): pricing is most of what adding a collective costs."""

    duration: float
    intra_node_bytes: float
    inter_node_bytes: float
    compute_slowdown: float
    demands: dict
    collective: CollectiveSpec | None
    meta: dict


def _one_rank(ctx: SimulationContext) -> bool:
    """Whether the program is one representative rank's (it then carries that rank's host links)."""
    return not ctx.megatron_program


def price_collective(
    ctx: SimulationContext,
    op: str,
    nbytes: float,
    shape=None,
    algorithm: str | None = None,
    count: int = 1,
    backend_count: bool = False,
) -> PricedCollective:
    """Price ``count`` identical collectives back to back (see add_collective). ``backend_count``: a
    network backend prices them too, as ``count`` times one (CollectiveSpec.count)."""
    shape = shape or ctx.data_parallel
    cost = ctx.collective(op, nbytes, shape, algorithm)
    # A rail group (one GPU per node) runs once per GPU of the node at the same time: the node's
    # links carry ``sharing`` copies of its traffic.
    per_gpu = cost.inter_node_bytes * shape.sharing / ctx.scenario.cluster.gpus_per_node
    meta = {
        "op": op,
        "bytes": nbytes,
        "algorithm": cost.algorithm,
        "protocol": cost.protocol,
        "ranks": shape.ranks,
        "source": cost.source,
        **({"count": count} if count != 1 else {}),
    }
    return PricedCollective(
        float(cost.time * count),
        cost.intra_node_bytes * shape.sharing * count,
        cost.inter_node_bytes * shape.sharing * count,
        ctx.cluster.compute_slowdown(shape) if cost.time > 0 else 0.0,
        ctx.host.nic_traffic(per_gpu, cost.time) if _one_rank(ctx) else {},
        CollectiveSpec(op, nbytes, shape, cost.algorithm, cost.protocol, count)
        if cost.time > 0 and (count == 1 or backend_count)
        else None,
        meta,
    )


def add_priced(
    prog: Program, name: str, priced: PricedCollective, deps=(), stream: str = "comm", rank: int = 0, **meta
) -> int:
    """Add a priced collective. With ``meta`` the op gets its own copy of the metadata joined with it;
    without, the ops added from one pricing share its metadata (read-only everywhere): a 1T-parameter
    pipeline's 130k copies were a fifth of its program's memory. Each op gets its own link demands."""
    if type(deps) is not tuple or None in deps:
        deps = tuple(d for d in deps if d is not None)
    return prog.add_op(
        name, stream, priced.duration, "communication", deps, priced.intra_node_bytes,
        priced.inter_node_bytes, priced.compute_slowdown, dict(priced.demands),
        {**priced.meta, **meta} if meta else priced.meta, rank, priced.collective,
    )  # fmt: skip


def add_collective(
    prog: Program,
    ctx: SimulationContext,
    name: str,
    op: str,
    nbytes: float,
    shape=None,
    deps=(),
    stream: str = "comm",
    algorithm: str | None = None,
    rank: int = 0,
    count: int = 1,
    backend_count: bool = False,
    **meta,
) -> int:
    """One collective on the communication stream, with its traffic and its SM slowdown; by default
    over the data-parallel group (the world without model parallelism). The op carries its description
    (``Op.collective``) so that a network backend other than the analytical one can price it when the
    engine starts it; ``duration`` is the analytical time.

    ``rank``: the pipeline stage that runs it, in a program of several stages; such programs leave
    the representative rank's host links (PCIe, NIC share) out, since every stage is another GPU.
    ``count``: that many identical collectives back to back as one op (a chunk's per-layer
    tensor-parallel all-reduces), so a deep model does not cost an op per layer. Such a batched op
    keeps its analytical time under the flow backend (its description is of one collective).
    """
    priced = price_collective(ctx, op, nbytes, shape, algorithm, count, backend_count)
    return add_priced(prog, name, priced, deps, stream, rank, **meta)


def add_tensor_parallel(prog: Program, ctx: SimulationContext, layer, forward: bool, micro: int) -> None:
    """Megatron's tensor-parallel collectives of one pass over ``layer`` (layout.tensor_collectives),
    when the data-parallel program runs over tensor parallelism (``ctx.tensor_sharded``). They go on
    the compute stream, right after the layer's kernels: Megatron's mappings.py calls
    torch.distributed on the current stream, so the next layer's kernels wait for them (megatron.py
    puts them on the critical path alike). Messages of b*s*h elements, as megatron.py prices them."""
    if not ctx.tensor_sharded:
        return
    lay = ctx.layout
    w = ctx.workload
    activation = w.micro_batch * w.seq_len * lay.arch.hidden * ctx.element_bytes
    fp8 = lay.gathers_in_fp8 and layer.name.startswith("block")
    for coll, count in lay.tensor_collectives(layer, forward):
        nbytes = activation * FP8_BYTES / ctx.element_bytes if fp8 and coll == "all_gather" else activation
        add_collective(
            prog, ctx, f"tp {coll} x{count} {'fwd' if forward else 'bwd'} {layer.name}", coll, nbytes,
            ctx.tensor_parallel, stream="compute", count=count, micro=micro,
        )  # fmt: skip


# Micro-steps before the last are listed one by one (a trace shows each) up to this many, and merged
# above it (add_micro_steps says why the timing is the same). A presentation threshold, not a model
# constant: 64 keeps every shipped scenario's trace as it was and costs ~50 ms.
MERGE_MICRO_STEPS_ABOVE = 64


def mergeable_micro_steps(ctx: SimulationContext, every_micro: bool) -> int:
    """How many micro-steps before the last add_micro_steps merges into one forward and one backward
    op: all of them when they are plain compute (no per-micro-step hook, no tensor-parallel
    collectives, no input pipeline) and more than MERGE_MICRO_STEPS_ABOVE, else none."""
    before_last = ctx.scenario.workload.gradient_accumulation - 1
    plain = not every_micro and not ctx.tensor_sharded and ctx.scenario.workload.input is None
    plain = plain and not ctx.host_syncs_after_forward  # the host waits inside every micro-step
    return before_last if plain and before_last > MERGE_MICRO_STEPS_ABOVE else 0


def add_micro_steps(
    prog: Program, ctx: SimulationContext, on_backward=None, every_micro: bool = False
) -> int | None:
    """Forward and backward of every micro-step on the compute stream (each micro-step's input batch
    first, when the workload has an input pipeline).

    ``on_backward(layer_index, op_id)`` is called for each layer's backward in the last micro-step,
    where gradient communication may hook in; with ``every_micro``, ``on_backward(layer_index, op_id,
    micro)`` in every micro-step (ZeRO-2 reduces at each). Returns the id of the last backward op.

    The micro-steps before the last, when plain (mergeable_micro_steps), are two ops: their forwards
    and their backwards, each as long as all of them. The timing is exactly the same (to rounding):
    they are consecutive on the compute stream, nothing depends on any of them but through the
    stream's order, and a plain compute op has no link demands and no SM slowdown, so it changes no
    other op's rate; the engine's fluid model runs compute at the rate the other running ops leave it,
    so a chain of work w1, w2, ... ends when one op of work w1 + w2 + ... would. m = 1e6 micro-steps
    thus cost what m = 1 does (tests/test_simulation.py compares merged and listed runs). The host's
    dispatch of them is one op where it cannot delay a kernel (dispatch_lane.merge_from: from the first
    micro-step, or after one listed micro-step has put the host ahead); where it binds, they are listed.
    """
    layers = ctx.workload.layers
    steps = ctx.scenario.workload.gradient_accumulation
    last = None

    def one_micro_step(micro: int) -> None:
        nonlocal last
        batch = add_input(prog, ctx, micro)  # workload.input: the micro-batch's features over PCIe
        forward = PassSequence(prog, ctx, layers, True)
        for li, layer in enumerate(layers):
            deps = (batch,) if li == 0 and batch is not None else ()
            end = forward.add(layer, deps, meta={"micro": micro})
            add_tensor_parallel(prog, ctx, layer, True, micro)
        waits = (end,) if ctx.host_syncs_after_forward else ()
        backward = PassSequence(prog, ctx, reversed_layers(ctx, layers), False, waits)
        for li in reversed(range(len(layers))):
            last = backward.add(layers[li], meta={"micro": micro})
            add_tensor_parallel(prog, ctx, layers[li], False, micro)
            if on_backward is None:
                continue
            if every_micro:
                on_backward(li, last, micro)
            elif micro == steps - 1:
                on_backward(li, last)

    merged = mergeable_micro_steps(ctx, every_micro)
    start = merge_from(ctx, layers) if merged else None
    if start is None:
        merged = start = 0
    for micro in range(start):  # the one micro-step after which the host is ahead for good
        one_micro_step(micro)
    if merged > start:
        meta = {"micro": f"{start}-{merged - 1}", "merged_micro_steps": merged - start}
        add_merged_micro_steps(prog, ctx, layers, merged - start, meta)
    # Each listed micro-step adds a compute op per layer and pass at the least: a count that cannot fit
    # the op budget (10**9 micro-steps of a host-bound step) is refused before it is built, not after
    # 400,000 ops and seconds (a plan whose --global-batch made every candidate such a step ran for
    # half an hour).
    prog.refuse_beyond(2 * len(layers) * (steps - max(merged, start)))
    for micro in range(max(merged, start), steps):
        one_micro_step(micro)
    return last


def add_ddp_gradient_sync(
    prog: Program,
    ctx: SimulationContext,
    bytes_per_element: int,
    overlap: bool,
    shape=None,
    on_backward=None,
) -> tuple[list[int], list[dict]]:
    """Forward/backward plus DDP bucketed all-reduce of the gradients over ``shape`` (default: every rank).

    With overlap, a bucket's all-reduce is launched when it and all earlier buckets are ready
    (launch_i = max(ready_i, launch_{i-1}), enforced by the FIFO comm stream). Without it (DeepSpeed's
    engine), all buckets are reduced after backward. ``on_backward(layer_index, op_id)``, if given, is
    called after each layer's backward in the last micro-step (after DDP's own hook: Streaming DiLoCo's
    per-layer outer gradients). Returns the collective op ids and bucket info.
    """
    t = ctx.scenario.training
    if (shape or ctx.world).ranks == 1:  # one GPU trains without DDP: nothing to reduce or copy
        add_micro_steps(prog, ctx, on_backward)
        return [], []
    buckets = assign_buckets(
        ctx.workload.layers, bytes_per_element, t.ddp_bucket_cap_mb, t.first_bucket_cap_mb
    )
    by_layer: dict[int, list] = {}
    for b in buckets:
        by_layer.setdefault(b.ready_layer, []).append(b)
    comm_ops: list[int] = []
    info: list[dict] = []
    measured = ctx.phases is not None  # measured backward already includes the bucket copies

    def launch(bucket, dep):
        nbytes = bucket.nbytes(bytes_per_element)
        if not measured:
            dep = prog.add(
                f"bucket{bucket.index} copy+scale",
                "compute",
                ctx.device.stream_time(4 * nbytes, "bucket_copy"),
                "other",
                (dep,),
            )
        op = add_collective(
            prog,
            ctx,
            f"all_reduce bucket{bucket.index}",
            "all_reduce",
            nbytes,
            shape,
            deps=(dep,),
            bucket=bucket.index,
        )
        comm_ops.append(op)
        info.append({"bucket": bucket.index, "bytes": nbytes, "op": op})

    def hook(li, op):
        if overlap:
            for b in by_layer.get(li, []):
                launch(b, op)
        if on_backward is not None:
            on_backward(li, op)

    last = add_micro_steps(prog, ctx, hook if overlap or on_backward is not None else None)
    if not overlap:
        for b in buckets:
            launch(b, last)
    return comm_ops, info


def add_gradient_to_host(
    prog: Program, ctx: SimulationContext, spec, on_cpu: float, shard: float, dep, label: str
):
    """A reduced gradient partition of ``shard`` elements leaving the GPU for the offloaded update.
    DeepSpeed (stage_1_and_2.py, async_inplace_copy_grad_to_fp32_buffer_from_gpu; stage3.py likewise):
    the gradient norm and src.float() run on the GPU, then copy_ moves fp32 (4 B) into the pinned host
    buffer, the CPU's share (``on_cpu``) of it. The cast runs on the stream that reduced the partition
    (DeepSpeed calls it inside the reduction stream's context): on the compute stream it made backward
    wait for every bucket's reduction. Returns the copy's op id."""
    cast = prog.add(
        f"grad norm + fp32 cast {label}",
        prog.ops[dep].stream,
        ctx.device.stream_time(shard * (2 * ctx.grad_bytes + 4), "grad_cast"),
        "other",
        (dep,),
    )
    secs, dem = ctx.host.copy(shard * spec.to_host * on_cpu, to_host=True)
    return prog.add(f"D2H gradients {label}", "d2h", secs, "transfer", (cast,), demands=dem)


def add_zero3_gradient_to_host(
    prog: Program,
    ctx: SimulationContext,
    on_cpu: float,
    shard: float,
    dep,
    label: str,
    fresh_buffers: tuple[float, float] | None = None,
) -> int:
    """A reduced gradient partition of ``shard`` elements on its way to ZeRO-3's fp32 host buffer, as
    DeepSpeed's stage3.py ``partition_grads`` moves it with the optimizer offloaded. The partition is
    first copied into the flat 16-bit gradient buffer, which lives in (pinned) host memory, and back to
    the GPU (``grad_buffer.copy_(...)``, ``grad_buffer.to(device)``); its norm runs on the GPU in double
    precision (``_constant_buffered_norm2``: ``.double()`` writes 8 bytes per element, ``norm(2)`` reads
    them). The GPU-updated share's fp32 gradient is a cast into a GPU buffer. Then the CPU-updated share
    (``on_cpu``) goes to the fp32 host buffer, by ``training.offload.gradient_copy``:

    * ``async`` (``copy_(..., non_blocking=True)``: Deep Optimizer States' part_grads_async; DeepSpeed
      from 0.16.3 casts with ``.float()`` explicitly): PyTorch casts on the GPU, then a pinned fp32
      copy on the reduction stream, beside backward.
    * ``blocking`` (``fp32_grad_tensor.copy_(grad_buffer)``, DeepSpeed up to 0.15.3): a blocking copy
      between devices and dtypes, which PyTorch runs as a 16-bit copy into a new pageable CPU tensor
      and an upcast on the CPU (ATen Copy.cu: "type conversions are performed on the CPU" unless
      non_blocking). The host thread waits for both, and it is the thread that launches backward's
      kernels, so backward stalls: the ops hold the compute stream. The pageable tensor is new for
      every parameter (``empty_like`` in Copy.cu); one above glibc's mmap threshold is a fresh mapping,
      so the driver's copy into it faults every page in (host.first_touch: 4 KiB pages, or 2 MiB ones
      where the host's transparent huge pages are "always").

    ``partition_grads`` runs inside ``with stream(reduce_and_partition_stream)``: every copy and kernel
    above is queued on that one stream, so they run one after another (CUDA streams are in order) and
    a partition's 16-bit copy back to the GPU never overlaps the next one's copy out. The ops sit on
    the stream of the reduction ``dep``. ``fresh_buffers``: the model's ``host.fresh_buffer_shares``, given
    by a caller that adds many partitions so that it is worked out once. Returns the last op's id."""
    g = ctx.grad_bytes
    host, gradient_copy = ctx.host, ctx.scenario.training.offload.gradient_copy
    stream = prog.ops[dep].stream
    secs, dem = host.copy(shard * g, to_host=True)
    out = prog.add(f"D2H 16-bit gradients {label}", stream, secs, "transfer", (dep,), demands=dem)
    secs, dem = host.copy(shard * g, to_host=False)
    back = prog.add(f"H2D 16-bit gradients {label}", stream, secs, "transfer", (out,), demands=dem)
    norm_bytes = shard * (g + 2 * 8)  # .double() reads g and writes 8 bytes, norm(2) reads the 8
    cast_bytes = shard * (g + 4) * (1.0 - on_cpu)  # the GPU-updated share: cast into a GPU fp32 buffer
    if gradient_copy == "async":
        cast = prog.add(
            f"grad norm + fp32 cast {label}",
            stream,
            ctx.device.stream_time(norm_bytes + cast_bytes + shard * on_cpu * (g + 4), "grad_cast"),
            "other",
            (back,),
        )
        secs, dem = host.copy(shard * 4 * on_cpu, to_host=True)
        return prog.add(f"D2H fp32 gradients {label}", stream, secs, "transfer", (cast,), demands=dem)
    norm = prog.add(
        f"grad norm {label}",
        stream,
        ctx.device.stream_time(norm_bytes + cast_bytes, "grad_norm"),
        "other",
        (back,),
    )
    secs, dem = host.pageable_copy(shard * g * on_cpu, to_host=True)
    staged = prog.add(
        f"D2H 16-bit gradients to pageable memory (host blocked) {label}",
        "compute",
        secs,
        "transfer",
        (norm,),
        demands=dem,
    )
    fresh_share, unaligned = fresh_buffers or fresh_buffer_shares(ctx.workload.layers, g)
    fresh = shard * g * on_cpu * fresh_share
    if fresh > 0:
        staged = prog.add(
            f"page faults of the new pageable buffer (host blocked) {label}",
            "compute",
            host.first_touch(fresh, unaligned),
            "host",
            (staged,),
        )
    # the upcast reads the 16-bit copy and writes fp32 (read for ownership, then written back: 8 bytes)
    secs, dem = host.cpu_stream(shard * on_cpu, g + 8)
    return prog.add(
        f"CPU upcast to fp32 (host blocked) {label}", "compute", secs, "host", (staged,), demands=dem
    )


def add_update_and_other(
    prog: Program,
    ctx: SimulationContext,
    deps,
    update_bytes_per_param: float,
    label: str = "optimizer step",
    kernel: str | None = None,
) -> int:
    """The optimizer update on the GPU and the per-step work outside forward/backward/communication.
    ``kernel`` is a compressed optimizer's own update: its passes at the rate of that kernel in the
    profile's measured kernels, marked as the step (offload.STEP_PHASE); None is Adam's or SGD's update
    as its implementation runs it. (An offloaded update is ZeRO-Offload's, ddp.zero_offload_program and
    zero.py: the compressed optimizers are refused with offload, sharding_rules.)

    With measured phases, "other" is the measured remainder after removing a modelled Adam step
    (so each optimizer adds its own update cost on top of the same measured overhead).
    """
    P = ctx.params
    # After a host synchronisation (the loss scaler's inf check, a gradient norm read on the host) the
    # host starts the optimizer step only once backward's kernels and the gradients' reduction are
    # done; otherwise it dispatches the step while they still run.
    waits = tuple(deps) if ctx.host_syncs_before_update else ()
    host = add_dispatch(
        prog, ctx, f"{label} (host, per parameter tensor)", ctx.host_optimizer_time(), waits,
        meta={"waits_for_backward": bool(waits)},
    )  # fmt: skip
    deps = tuple(d for d in (*deps, host) if d is not None)
    if kernel is not None:  # a compressed optimizer's own update kernel, after the same clipping
        from clustersim.simulator.offload import STEP_PHASE

        seconds = ctx.gpu_update_time(update_bytes_per_param, P, kernel)
        ends = [prog.add(label, "compute", seconds, "optimizer", deps, meta={"phase": STEP_PHASE})]
        return add_other(prog, ctx, ends)
    mc = ctx.model_compute
    if mc is not None and ctx.update_implementation == "fused":
        # the model's own optimizer phase was measured (calibrate model times a fused update)
        seconds = device_time(mc, mc.optimizer, ctx.workload.micro_batch) + ctx.clip_time(P)
    else:  # Adam's or SGD's update as its implementation runs it, at a measured model's update rate
        seconds = ctx.update_device_time(update_bytes_per_param, P) * ctx._update_scale
    ends = [prog.add(label, "compute", seconds, "optimizer", deps)]
    return add_other(prog, ctx, ends)


def add_other(prog: Program, ctx: SimulationContext, deps, params: float | None = None) -> int:
    """Loss scaling over ``params`` gradient elements (the rank's partition under ZeRO/FSDP; every
    parameter by default): fp16 training unscales the gradients and checks them for inf/NaN
    (torch.amp.GradScaler, DeepSpeed's dynamic loss scaler); bf16 and fp32 need no loss scaling.
    zero_grad sets gradients to None (PyTorch's default since 2.0): no kernel, its host loop is part
    of the optimizer's host time."""
    end = _add_other(prog, ctx, deps, params)
    return add_memory_reports(prog, ctx, end)


def add_memory_reports(prog: Program, ctx: SimulationContext, dep: int) -> int:
    """DeepSpeed's ``memory_breakdown``: the engine reports memory (runtime/utils.py
    ``see_memory_usage``) before and after each of forward, backward and step, six times a step. Each
    report runs ``gc.collect()`` on the training thread, between phases whose end the thread has
    waited for, so the device waits too: here one host op after the step, 6 x
    hardware_defaults.yaml host.see_memory_usage_s (a draw's host factor on it)."""
    if not ctx.scenario.training.memory_breakdown:
        return dep
    seconds = 6 * hardware_defaults()["host"]["see_memory_usage_s"] * ctx.host.scale
    return prog.add("memory reports (memory_breakdown: 6 x gc.collect)", "compute", seconds, "host", (dep,))


def _add_other(prog: Program, ctx: SimulationContext, deps, params: float | None) -> int:
    P = ctx.params if params is None else params
    measured = ctx.measured_other()
    if measured is not None:
        adam = ctx.device.stream_time(FUSED_ADAM * ctx.params, "optimizer")
        return prog.add(
            "other (measured: loss scaling, data, bookkeeping)",
            "compute",
            max(0.0, measured - adam),
            "other",
            tuple(deps),
        )
    if ctx.precision != "fp16":
        return prog.add("no loss scaling (bf16/fp32)", "compute", 0.0, "other", tuple(deps))
    other_bytes = 3 * P * ctx.grad_bytes  # loss-scale unscale (read+write) and overflow check (read)
    return prog.add(
        "loss scaling (unscale + inf check)",
        "compute",
        ctx.device.stream_time(other_bytes, "other"),
        "other",
        tuple(deps),
    )
