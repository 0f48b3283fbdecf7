"""CPU optimizer offload: ZeRO-Offload and interleaved offload (Deep Optimizer States).

ZeRO-Offload (Ren et al. 2021): fp32 master parameters and optimizer state live in host memory;
gradients leave the GPU as backward produces them; the CPU updates; updated 16-bit parameters return
before the next forward. Interleaved offload (Maurya et al. 2024): the parameters are split into
subgroups and, per subgroup, the update either runs on the CPU or the subgroup's state moves to the
GPU, is updated there and moves back, so CPU and PCIe/GPU work in parallel. Subgroups whose state
fits in the GPU memory left free at the forward/backward peak can stay resident and need no copies.

The planner is a performance model: per subgroup it compares the finish time of the CPU path
(CPU update, host->device parameter copy; its gradients left during backward) and the GPU path (host->device
state, GPU update, device->host state) on separate clocks for the CPU, the GPU and each PCIe
direction (the link is full duplex), and takes the earlier. The simulation then runs the chosen plan
with flow-level sharing of the PCIe links, the switch uplink and DRAM, and the plan is checked
against all-CPU and all-GPU placements, so interleaving never loses to the better of the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clustersim.errors import InputError
from clustersim.identifiers import Category, PlacementKind
from clustersim.simulator.headroom import THIN_HEADROOM
from clustersim.simulator.host import HostModel
from clustersim.simulator.program import Program
from clustersim.units import format_bytes, ordinal

# The planner decides subgroup by subgroup (O(subgroups) time and memory); beyond this many a subgroup is
# far smaller than any DeepSpeed setting (default sub_group_size 1e9 parameters) and only exhausts memory.
MAX_SUBGROUPS = 100_000
MAX_CHUNKS = 48  # subgroups of the same placement are merged into at most this many program steps
# The fork's async copiers' lane: each copier copies its tensor out, then in, in order on its own stream
# (csrc/async_copier: cudaMemcpyAsync on trf_stream); both directions on one in-order lane, as they run.
COPIER = "h2d_state"
STEP_PHASE = "step"  # meta["phase"] of the optimizer step's ops (step_phases)


@dataclass(frozen=True)
class UpdateSpec:
    """What an optimizer's update needs, in bytes per parameter."""

    to_host: float  # device -> host before a CPU update (gradients, or the synced tensor)
    to_device: float  # host -> device after it (updated 16-bit parameters)
    cpu_dram: float  # DRAM traffic of the CPU update
    gpu_update: float  # HBM traffic of the same update on the GPU
    state: float  # optimizer state kept on the host (fp32 master, moments), moved for GPU updates


@dataclass
class Placement:
    subgroup_params: float
    kinds: list[str]  # per subgroup: cpu | gpu_streamed | gpu_resident
    partition_params: float = 0.0  # the parameters this rank updates (P, or P/p under ZeRO)
    chosen_by: str = "performance model"
    sizes: tuple[float, ...] | None = None  # per subgroup when they differ (DeepSpeed's whole tensors)

    def subgroup_sizes(self) -> list[float]:
        """Parameters per subgroup: ``sizes``, or equal subgroups with the remainder in the last."""
        if self.sizes is not None:
            return list(self.sizes)
        out = [self.subgroup_params] * len(self.kinds)
        out[-1] = self.partition_params - self.subgroup_params * (len(self.kinds) - 1)
        return out

    def count(self, kind: str) -> int:
        return sum(1 for k in self.kinds if k == kind)

    def ranges(self) -> list[tuple[int, int, str]]:
        out: list[tuple[int, int, str]] = []
        for i, k in enumerate(self.kinds):
            if out and out[-1][2] == k and out[-1][1] == i - 1:
                out[-1] = (out[-1][0], i, k)
            else:
                out.append((i, i, k))
        return out


def mode(ctx) -> str:
    return ctx.scenario.training.offload.mode


def subgroup_count(params: float, size: float) -> int:
    return max(1, math.ceil(params / size))


def deepspeed_subgroups(layers, partition_params: float, size: float) -> list[float]:
    """DeepSpeed ZeRO-3's subgroups (stage3.py ``_create_fp16_sub_groups``): the rank's partitions of
    the parameter tensors, in order, closed into a subgroup once it holds ``size`` elements or more, so
    a tensor is never split and one larger than ``size`` is a subgroup of its own. One parameter group
    is assumed (Megatron's separate no-weight-decay group of biases and norms is a few small tensors)."""
    tensors = [n for layer in layers for n in layer.param_tensors if n > 0]
    scale = partition_params / sum(tensors)  # each rank holds 1/p of every tensor
    out: list[float] = []
    current = 0.0
    for n in tensors:
        current += n * scale
        if current >= size:
            out.append(current)
            current = 0.0
    if current > 0:
        out.append(current)
    return out


def gap_kinds(n: int, gap: int) -> list[str]:
    """Deep Optimizer States' DeepSpeed fork (github.com/DataStates/DeepSpeed, branch
    deep-optimizer-states, stage3.py ``get_opt_update_device``): subgroup i is updated on the GPU
    (PF_OPT_GPU_ONLY) when ``(i + 1) % gap == 0`` and ``i % gap != 0``, else on the CPU; a gap of 1
    puts every update on the CPU."""
    return [
        PlacementKind.GPU_STREAMED if (i + 1) % gap == 0 and i % gap != 0 else PlacementKind.CPU
        for i in range(n)
    ]


def memory_budget(ctx, partition_params: float) -> dict[str, float]:
    """GPU bytes without offloaded optimizer state, at the forward/backward peak and during the update
    (under ZeRO/FSDP the partitioned states and buffers of simulator/sharding.py; ZeRO-Offload at stage
    0 holds its parameters and stage 2's gradient buffers, sharding.zero_offload_gradients)."""
    from clustersim.simulator.sharding import layout, offload_budget, zero_offload_gradients

    lay = layout(ctx)
    if lay is not None:
        peak, update = offload_budget(ctx, lay)
        return {
            "peak_without_state": peak,
            "update_without_state": update,
            "capacity": ctx.gpu.memory_bytes,
            "partition_params": partition_params,
        }
    P = ctx.params
    grads = zero_offload_gradients(ctx, P)
    base = P * ctx.element_bytes + grads["gradients"] + grads["offload_gradient_buffer"]
    return {
        "peak_without_state": base + grads["reduce_bucket"] + ctx.workload.activation_bytes,
        "update_without_state": base,
        "capacity": ctx.gpu.memory_bytes,
        "partition_params": partition_params,
    }


def _refusal_key(ctx, budget: dict) -> tuple[str, str]:
    """The key an offloaded rank that does not fit names, and why: memory.check_fits' rule (the model,
    the micro-batch, or when not even one sample fits the sequence, the GPU), on what stays on the GPU
    with the optimizer state on the host. Adam and SGDM, the optimizers that run offloaded
    (sharding_rules), keep no buffers of their own on the GPU."""
    from clustersim.simulator.oom import oom_culprit

    activations = ctx.workload.activation_bytes
    return oom_culprit(
        ctx,
        budget["update_without_state"],
        budget["peak_without_state"] - activations,
        activations,
        budget["capacity"],
        {},
    )


def plan(ctx, spec: UpdateSpec, partition_params: float, host: HostModel) -> Placement:
    """Where each subgroup of the rank's ``partition_params`` is updated. The gradients are on the host
    already when the step starts (copied out during backward: ddp.zero_offload_program, zero.py)."""
    off = ctx.scenario.training.offload
    size = min(off.subgroup_size, partition_params)
    n = subgroup_count(partition_params, size)
    if n > MAX_SUBGROUPS:
        raise InputError(
            f"subgroups of {off.subgroup_size:,g} parameters split {partition_params:,.0f} parameters into "
            f"{n:,.4g} subgroups (at most {MAX_SUBGROUPS:,}; DeepSpeed's default sub_group_size is 1e9)",
            key="training.offload.subgroup_size",
        )
    budget = memory_budget(ctx, partition_params)
    free_peak = budget["capacity"] - budget["peak_without_state"]
    free_update = budget["capacity"] - budget["update_without_state"]
    if free_peak < 0:
        key, why = _refusal_key(ctx, budget)
        raise InputError(
            f"does not fit in GPU memory even with the optimizer offloaded: parameters, gradients and "
            f"activations need {format_bytes(budget['peak_without_state'])} of "
            f"{format_bytes(budget['capacity'])}" + why,
            key=key,
        )
    if off.mode == "zero" and (off.gpu_update_gap or 1) > 1:
        sizes = deepspeed_subgroups(ctx.workload.layers, partition_params, off.subgroup_size)
        if off.gpu_update_gap > len(sizes):
            raise InputError(
                f"a gpu_update_gap of {off.gpu_update_gap:,} puts no subgroup on the GPU: the rank has "
                f"{len(sizes):,} subgroups (DeepSpeed's whole tensors of at least {off.subgroup_size:,.0f} "
                f"parameters), so the gap is at most {len(sizes):,}",
                key="training.offload.gpu_update_gap",
            )
        kinds = gap_kinds(len(sizes), off.gpu_update_gap)
        return Placement(
            max(sizes),  # the staging buffers hold the largest subgroup (offload_memory)
            kinds,
            partition_params,
            f"every {ordinal(off.gpu_update_gap)} subgroup on the GPU",
            tuple(sizes),
        )
    if off.mode == "zero" or off.placement == "cpu":
        return Placement(
            size,
            [PlacementKind.CPU] * n,
            partition_params,
            "all on the CPU" if off.mode == "zero" else "placement: cpu",
        )
    state_bytes = size * spec.state
    if off.placement == "gpu":
        if n * state_bytes > free_peak:
            raise InputError(
                f"placement gpu keeps all optimizer state on the GPU: {format_bytes(n * state_bytes)} "
                f"needed, {format_bytes(free_peak)} free at the forward/backward peak",
                key="training.offload.placement",
            )
        return Placement(size, [PlacementKind.GPU_RESIDENT] * n, partition_params, "placement: gpu")
    # Resident subgroups fill the free memory only up to THIN_HEADROOM of the GPU (simulator/headroom.py:
    # the CUDA context, workspaces and fragmentation need room on a real GPU). Deep Optimizer States'
    # fork sizes nothing to free memory (a fixed gap, stage3.py get_opt_update_device).
    headroom = THIN_HEADROOM * budget["capacity"]
    fill_peak = max(0.0, free_peak - headroom)
    resident = min(n, int(fill_peak // state_bytes)) if state_bytes > 0 else n
    can_stream = free_update - headroom - resident * state_bytes >= 2 * state_bytes
    kinds = _place_streamed_or_cpu(ctx, spec, host, size, n, resident, can_stream)
    return Placement(size, kinds, partition_params)


@dataclass
class _Clocks:
    """When each resource is next free: the CPU, the GPU, each PCIe direction, host DRAM."""

    cpu: float = 0.0
    gpu: float = 0.0
    h2d: float = 0.0
    d2h: float = 0.0
    dram: float = 0.0


def _place_streamed_or_cpu(
    ctx,
    spec: UpdateSpec,
    host: HostModel,
    size: float,
    n: int,
    resident: int,
    can_stream: bool,
) -> list:
    """Resident subgroups first; then, subgroup by subgroup, the path (CPU update, or state streamed to
    the GPU and back) that finishes earlier on separate clocks for CPU, GPU, each PCIe direction, DRAM.
    The CPU path's gradients are on the host already (copied during backward)."""
    bw = min(host.pcie, host.switch_share)
    t_cpu = size / host.cpu_rate(spec.cpu_dram)
    t_back = size * spec.to_device / bw
    t_state = size * spec.state / bw
    t_gpu = size * spec.gpu_update / ctx.device.memory_rate
    # Host DRAM is shared by the CPU update and every copy (they all read or write host memory).
    dram_cpu = size * (spec.cpu_dram + spec.to_device) / host.dram_share
    dram_gpu = 2 * size * spec.state / host.dram_share
    kinds = [PlacementKind.GPU_RESIDENT] * resident
    now = _Clocks(gpu=resident * t_gpu)  # resident subgroups update first, on the GPU, without copies
    for _ in range(n - resident):
        # CPU path: CPU update, parameters back
        via_cpu = _Clocks(gpu=now.gpu, d2h=now.d2h)
        via_cpu.cpu = max(now.cpu, via_cpu.d2h) + t_cpu
        via_cpu.h2d = max(now.h2d, via_cpu.cpu) + t_back
        via_cpu.dram = now.dram + dram_cpu
        cpu_finish = max(via_cpu.h2d, via_cpu.cpu, now.gpu, now.d2h, now.h2d, via_cpu.dram)
        # GPU path: state in, GPU update, state out
        g_finish = float("inf")
        if can_stream:
            via_gpu = _Clocks(cpu=now.cpu, h2d=now.h2d + t_state)
            via_gpu.gpu = max(now.gpu, via_gpu.h2d) + t_gpu
            via_gpu.d2h = max(now.d2h, via_gpu.gpu) + t_state
            via_gpu.dram = now.dram + dram_gpu
            g_finish = max(via_gpu.d2h, via_gpu.gpu, now.cpu, now.h2d, now.d2h, via_gpu.h2d, via_gpu.dram)
        if g_finish < cpu_finish:
            kinds.append(PlacementKind.GPU_STREAMED)
            now = via_gpu
        else:
            kinds.append(PlacementKind.CPU)
            now = via_cpu
    return kinds


def _chunks(placement: Placement, total_params: float) -> list[tuple[str, float]]:
    """Merge consecutive subgroups of one kind into at most MAX_CHUNKS steps of (kind, params)."""
    per = max(1, math.ceil(len(placement.kinds) / MAX_CHUNKS))
    out: list[tuple[str, float]] = []
    sizes = placement.subgroup_sizes()
    if placement.sizes is None:
        sizes[-1] = total_params - placement.subgroup_params * (len(placement.kinds) - 1)
    run_kind, run_params, run_len = None, 0.0, 0
    for kind, s in zip(placement.kinds, sizes):
        if kind != run_kind or run_len >= per:
            if run_kind is not None:
                out.append((run_kind, run_params))
            run_kind, run_params, run_len = kind, 0.0, 0
        run_params += s
        run_len += 1
    out.append((run_kind, run_params))
    return out


def add_offloaded_update(
    prog: Program,
    ctx,
    deps,
    spec: UpdateSpec,
    placement: Placement,
    host: HostModel,
    partition_params: float,
    label: str,
) -> list[int]:
    """The update phase of one iteration under offload; returns the ops the next step waits for. Its
    ops are marked as the step (``meta["phase"]``, read by step_phases)."""
    first = len(prog.ops)
    ends = _add_offloaded_update(prog, ctx, deps, spec, placement, host, partition_params, label)
    for op in prog.ops[first:]:
        op.meta = {**op.meta, "phase": STEP_PHASE}
    return ends


def _add_offloaded_update(
    prog: Program,
    ctx,
    deps,
    spec: UpdateSpec,
    placement: Placement,
    host: HostModel,
    partition_params: float,
    label: str,
) -> list[int]:
    ends: list[int] = []
    deps = tuple(d for d in deps if d is not None)
    if placement.sizes is not None:
        return add_gap_update(prog, ctx, deps, spec, placement, host)
    for i, (kind, params) in enumerate(_chunks(placement, partition_params)):
        tag = f"{label} chunk{i} ({kind}, {params / 1e6:,.1f}M params)"
        if kind == PlacementKind.CPU:
            t, dem = host.cpu_update(params, spec.cpu_dram)
            cpu = prog.add(f"CPU update {tag}", "cpu", t, "host", deps, demands=dem, meta={"params": params})
            t, dem = host.copy(params * spec.to_device, to_host=False)
            ends.append(prog.add(f"H2D params {tag}", "h2d", t, "transfer", (cpu,), demands=dem))
        elif kind == PlacementKind.GPU_STREAMED:
            t, dem = host.copy(params * spec.state, to_host=False)
            load = prog.add(f"H2D state {tag}", "h2d_state", t, "transfer", deps, demands=dem)
            upd = prog.add(
                f"GPU update {tag}",
                "compute",
                ctx.gpu_update_time(spec.gpu_update, params),
                "optimizer",
                (load,),
            )
            t, dem = host.copy(params * spec.state, to_host=True)
            ends.append(prog.add(f"D2H state {tag}", "d2h_state", t, "transfer", (upd,), demands=dem))
        else:
            ends.append(
                prog.add(
                    f"GPU update {tag}",
                    "compute",
                    ctx.gpu_update_time(spec.gpu_update, params),
                    "optimizer",
                    deps,
                )
            )
    return ends


def add_gap_update(
    prog: Program, ctx, deps, spec: UpdateSpec, placement: Placement, host: HostModel
) -> list[int]:
    """The step of Deep Optimizer States' DeepSpeed fork (``training.offload.gpu_update_gap``), in the
    order of its stage3.py ``step`` (github.com/DataStates/DeepSpeed, branch deep-optimizer-states):

    * One host thread walks the subgroups in order. At a CPU subgroup ``i % gap == 0`` it first queues
      ``opt_transfers``: the previous GPU subgroup's fp32 parameters, ``exp_avg`` and ``exp_avg_sq``
      back to the host, then the next GPU subgroup's three tensors to the GPU (``spec.state`` bytes per
      parameter each way), with ``cudaMemcpyAsync`` on the copiers' own streams (csrc/async_copier:
      one stream per tensor, so each stream copies out, then in); then it runs DeepSpeed's CPU Adam on
      its own subgroup while they move. Its updated 16-bit parameters go back as today's CPU path has
      them (``downsample_fp32_fp16`` on an executor thread, then a pinned copy).
    * At a GPU subgroup the thread waits for the copiers (``wait()``, a stream synchronize), then
      launches torch.optim.AdamW on the GPU (the fork's ``backup_optimizer``; PyTorch picks its foreach
      path for CUDA tensors), whose fp32 gradient is already on the GPU (cast there in backward). The
      16-bit parameters are a device-to-device copy of the fp32 ones (no PCIe).
    * The last GPU subgroup's state is copied back by the next CPU subgroup's ``opt_transfers`` only,
      so with none after it, it stays on the GPU (as the code has it).

    * At a CPU subgroup ``i % gap == 0``, right after queueing ``opt_transfers``, the thread also waits
      for the 16-bit parameter copies already issued (``prefetch_optimizer_copier_fetch_fp16.wait()``,
      a ``cudaStreamSynchronize`` on that copier's stream) before its CPU update: the earlier CPU
      subgroups' parameters, whose downsample the executor had the GPU subgroup's wait to issue.

    So each CPU update overlaps the copies for the GPU subgroups around it, and the thread cannot pass
    a GPU subgroup before its state has arrived. Returns the ops the next step waits for."""
    from clustersim.cost_models.kernel_bytes import UPDATE_BYTES

    gap = ctx.scenario.training.offload.gpu_update_gap
    gpu_bytes = UPDATE_BYTES[("adam", "foreach")] if spec.gpu_update > 0 else 0.0
    sizes, kinds = placement.subgroup_sizes(), placement.kinds
    gpu_ids = [i for i, k in enumerate(kinds) if k != PlacementKind.CPU]
    ends: list[int] = []
    thread = tuple(deps)  # what the host thread has waited for so far
    copier = None  # the copiers' last copy (their streams run in order)
    updated: dict[int, int] = {}  # GPU subgroup -> its update op
    arrived: dict[int, int] = {}  # GPU subgroup -> its state's copy in
    fp16_copied = None  # the last CPU subgroup's 16-bit parameters copy (the fetch copier runs in order)
    for i, (params, kind) in enumerate(zip(sizes, kinds)):
        tag = f"subgroup {i} ({params / 1e6:,.1f}M params)"
        if kind == PlacementKind.CPU:
            if i % gap == 0:
                prev = max((g for g in gpu_ids if g < i), default=None)
                nxt = min((g for g in gpu_ids if g > i), default=None)
                if prev is not None:
                    t, dem = host.copy(sizes[prev] * spec.state, to_host=True)
                    after = (updated[prev],) + ((copier,) if copier is not None else ())
                    copier = prog.add(f"D2H state subgroup {prev}", COPIER, t, "transfer", after, demands=dem)
                if nxt is not None:
                    t, dem = host.copy(sizes[nxt] * spec.state, to_host=False)
                    after = thread + ((copier,) if copier is not None else ())
                    copier = prog.add(f"H2D state subgroup {nxt}", COPIER, t, "transfer", after, demands=dem)
                    arrived[nxt] = copier
                if fp16_copied is not None:
                    thread = thread + (fp16_copied,)
            t, dem = host.cpu_update(params, spec.cpu_dram)
            cpu = prog.add(
                f"CPU update {tag}", "cpu", t, "host", thread, demands=dem, meta={"params": params}
            )
            t, dem = host.copy(params * spec.to_device, to_host=False)
            fp16_copied = prog.add(f"H2D params {tag}", "h2d", t, "transfer", (cpu,), demands=dem)
            ends.append(fp16_copied)
            thread = (cpu,)
        else:
            wait = (arrived[i],) if i in arrived else ()
            upd = prog.add(
                f"GPU update {tag}",
                "compute",
                ctx.gpu_update_time(gpu_bytes, params),
                "optimizer",
                thread + wait,
            )
            updated[i] = upd
            ends.append(upd)
            thread = thread + wait
    if copier is not None:
        ends.append(copier)
    return ends


def step_phases(ops, iteration_time: float) -> dict[str, float] | None:
    """The iteration in the phases DeepSpeed's ``wall_clock_breakdown`` times (fwd, bwd, step): forward
    to the end of the last forward op; backward from there to the start of the optimizer step, so it
    holds whatever the GPU waits for during backward (a blocking gradient copy's pageable copies and
    page faults, which the breakdown counts as exposed host and transfer time); step from its first op
    to its last (the ops add_update marks); other, the rest (loss scaling, memory reports). None when
    the program has no marked step (an update add_update did not build)."""
    start = end = None
    forward_end = 0.0
    for o in ops:
        if o.rank != 0:
            continue
        if o.category == Category.FORWARD:
            forward_end = max(forward_end, o.end)
        if o.meta.get("phase") == STEP_PHASE:
            start = o.start if start is None else min(start, o.start)
            end = o.end if end is None else max(end, o.end)
    if start is None:
        return None
    return {
        "forward": forward_end,
        "backward": max(0.0, start - forward_end),
        "step": end - start,
        "other": max(0.0, iteration_time - end),
    }


def gpu_fraction(placement: Placement) -> float:
    """The share of the parameters updated on the GPU (of the subgroups, when they are equal)."""
    if placement.sizes is None:
        return sum(1 for k in placement.kinds if k != PlacementKind.CPU) / len(placement.kinds)
    sizes = placement.subgroup_sizes()
    on_gpu = sum(s for s, k in zip(sizes, placement.kinds) if k != PlacementKind.CPU)
    return on_gpu / sum(sizes)


def offload_memory(ctx, spec: UpdateSpec, placement: Placement, partition_params: float) -> dict[str, float]:
    resident = placement.count(PlacementKind.GPU_RESIDENT) * placement.subgroup_params * spec.state
    streamed = (
        (2 * placement.subgroup_params * spec.state) if placement.count(PlacementKind.GPU_STREAMED) else 0.0
    )
    if placement.sizes is not None:
        # Deep Optimizer States' fork keeps every GPU subgroup's gradient in its own GPU buffer (stage3.py
        # prefetch_optimizer_gpu_fp32_grads) from backward until the step updates it. Despite the name
        # the buffer has DeepSpeed's gradient_accumulation_dtype (the engine's default under ZeRO: the
        # model's dtype, bf16 in the artifact's run; ctx.grad_bytes); opt_transfers casts the next GPU
        # subgroup's to fp32 (``.to(dtype)``), 4 bytes per parameter of one subgroup at a time.
        gpu_sizes = [s for s, k in zip(placement.sizes, placement.kinds) if k != PlacementKind.CPU]
        streamed += ctx.grad_bytes * sum(gpu_sizes) + 4.0 * max(gpu_sizes, default=0.0)
    c = ctx.scenario.cluster
    host_bytes = partition_params * (spec.state + spec.to_host) * c.gpus_per_node
    if host_bytes > c.host.memory_gib * 2**30:
        raise InputError(
            f"the offloaded optimizer state needs {format_bytes(host_bytes)} of host memory per node, "
            f"the host has {c.host.memory_gib:g} GiB",
            key="cluster.host.memory_gib",
        )
    return {
        "optimizer_state_resident_on_gpu": resident,
        "offload_staging_buffers": streamed,
        "host_optimizer_state_per_node": host_bytes,
    }
