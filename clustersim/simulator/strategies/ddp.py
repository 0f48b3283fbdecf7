"""The full-precision baselines: Adam and SGD with momentum under PyTorch DDP.

Gradients (``training.gradient_dtype``, default the training precision) are all-reduced in DDP
buckets overlapped with backward; then every rank runs the same update. Adam's fused update moves
about 28 bytes per parameter (fp32 param r/w 8, m r/w 8, v r/w 8, gradient 4; DeepSpeed's
fp16 variant: master 8 + m,v 16 + fp16 grad 2 + fp16 param write 2), SGDM's 20.

With CPU offload this becomes ZeRO-Offload (ZeRO stage 2): each bucket is reduce-scattered and the
rank's shard of it leaves the GPU as soon as backward produced it; the CPU (or, interleaved, the GPU
for some subgroups) updates the rank's 1/p of the parameters; the updated 16-bit shards return and
are all-gathered before the next forward.
"""

from __future__ import annotations

from clustersim.cost_models.kernel_bytes import UPDATE_BYTES
from clustersim.optimizer_options import UpdateOptions
from clustersim.simulator import offload
from clustersim.simulator.program import Program
from clustersim.simulator.sharding import deepspeed_reduce_buckets
from clustersim.simulator.strategies.base import StepProgram, Strategy
from clustersim.simulator.strategies.common import (
    add_collective,
    add_ddp_gradient_sync,
    add_gradient_to_host,
    add_micro_steps,
    add_other,
    add_update_and_other,
)
from clustersim.simulator.strategies.megatron import model_parallel_program


def zero_offload_program(
    ctx, spec: offload.UpdateSpec, gpu_bytes: float, label: str
) -> tuple[Program, list[dict]]:
    """ZeRO-Offload (DeepSpeed's ZeRO-2 with offload_optimizer): reduce-scatter per DeepSpeed gradient
    bucket (reduce_bucket_size, not DDP's), shard D2H during backward, offloaded update, all-gather."""
    prog = Program()
    dp = ctx.data_parallel  # ZeRO-Offload partitions over the data-parallel ranks
    p = dp.ranks
    partition = ctx.params / p
    host = ctx.host
    placement = ctx.offload_placement or offload.plan(ctx, spec, partition, host)
    ctx.offload_placement, ctx.offload_spec = placement, spec
    on_cpu = 1.0 - offload.gpu_fraction(placement)
    buckets = deepspeed_reduce_buckets(ctx)
    by_layer: dict[int, list] = {}
    for b in buckets:
        by_layer.setdefault(b.ready_layer, []).append(b)
    moved: list[int] = []
    info: list[dict] = []

    def on_backward(li, op):
        for b in by_layer.get(li, []):
            dep = op
            if p > 1:
                dep = add_collective(
                    prog,
                    ctx,
                    f"reduce_scatter bucket{b.index}",
                    "reduce_scatter",
                    b.nbytes(ctx.grad_bytes),
                    dp,
                    deps=(op,),
                    bucket=b.index,
                )
                info.append({"bucket": b.index, "bytes": b.nbytes(ctx.grad_bytes), "op": dep})
            moved.append(
                add_gradient_to_host(prog, ctx, spec, on_cpu, b.elements / p, dep, f"bucket{b.index}")
            )

    last = add_micro_steps(prog, ctx, on_backward)
    ends = offload.add_offloaded_update(prog, ctx, [last, *moved], spec, placement, host, partition, label)
    if p > 1:
        ends = [
            add_collective(
                prog,
                ctx,
                "all_gather parameters",
                "all_gather",
                ctx.params * ctx.element_bytes,
                dp,
                deps=tuple(ends),
            )
        ]
    add_other(prog, ctx, ends)
    return prog, info


def adam_spec(ctx, cpu_bytes: float, state: float) -> offload.UpdateSpec:
    """Gradients reach the host as fp32 (cast on the GPU first, see zero_offload_program)."""
    return offload.UpdateSpec(
        to_host=4.0,
        to_device=ctx.element_bytes,
        cpu_dram=cpu_bytes,
        gpu_update=cpu_bytes,
        state=state,
    )


class AdamDDP(Strategy):
    name = "adam"
    summary = "Adam, full-precision gradient all-reduce in DDP buckets (baseline)"
    Options = UpdateOptions
    state_bytes_per_param = 8.0
    offload_state_bytes = 12.0  # fp32 master + m + v on the host, none of it on the GPU

    def __init__(self, ctx, options):
        super().__init__(ctx, options)
        # bytes per parameter of the update as its implementation runs it (the optimizer's own, by
        # name); where the code fixes a fused update, the scenario refuses another (scenario.py)
        self.update_bytes_per_param = UPDATE_BYTES[(self.name, options.implementation)]

    def offload_spec(self) -> offload.UpdateSpec:
        return adam_spec(self.ctx, self.update_bytes_per_param, self.offload_state_bytes)

    def build_program(self) -> tuple[Program, list[dict]]:
        if self.ctx.megatron_program:  # else: ZeRO-Offload over TP, or no model parallelism
            return model_parallel_program(self.ctx, self.update_bytes_per_param, f"{self.name} update"), []
        if offload.mode(self.ctx) != "none":
            return zero_offload_program(
                self.ctx, self.offload_spec(), self.update_bytes_per_param, f"{self.name} update"
            )
        prog = Program()
        comm, buckets = add_ddp_gradient_sync(
            prog, self.ctx, self.ctx.grad_bytes, self.ctx.scenario.training.overlap
        )
        last_bwd = prog.last_on("compute")
        add_update_and_other(prog, self.ctx, [*comm, last_bwd], self.update_bytes_per_param)
        return prog, buckets

    def steps(self) -> list[StepProgram]:
        prog, buckets = self.build_program()
        return [StepProgram("step", 1.0, prog, buckets)]


class SgdmDDP(AdamDDP):
    name = "sgdm"
    summary = "SGD with momentum, full-precision gradient all-reduce in DDP buckets"
    state_bytes_per_param = 4.0
    offload_state_bytes = 8.0  # fp32 master + momentum
