"""1-bit Adam as DeepSpeed runs it (Tang et al. 2021; deepspeed/runtime/fp16/onebit/adam.py).

Warmup stage (the first ``freeze_step`` steps): plain Adam, gradients all-reduced by the engine as
in the baseline, then the optimizer's unfused Adam passes.
Compression stage: no gradient all-reduce in backward. After backward each rank updates its local
momentum, runs one ``compressed_allreduce`` per parameter group on the flat fp32 momentum, then
applies ``m / (sqrt(v_frozen) + eps)``. Nothing overlaps backward. With one rank DeepSpeed skips the
compression entirely (``if self.size > 1``).
"""

from __future__ import annotations

from clustersim.cost_models import kernel_bytes as ok
from clustersim.optimizer_options import OneBitAdamOptions
from clustersim.simulator.program import Program
from clustersim.simulator.strategies.base import StepProgram, Strategy
from clustersim.simulator.strategies.common import (
    add_ddp_gradient_sync,
    add_micro_steps,
    add_update_and_other,
)
from clustersim.simulator.strategies.compressed_allreduce import (
    add_compressed_allreduce,
    error_buffers_for_groups,
)


def group_sizes(params: int, groups: int) -> list[tuple[int, int]]:
    """The parameters split into ``groups`` near-equal groups, as (elements, how many groups of that
    size): the first params % groups groups hold one element more. Two sizes at most, so a billion
    groups cost two entries, not a billion."""
    base, more = divmod(params, groups)
    return [(n, k) for n, k in ((base + 1, more), (base, groups - more)) if k]


def add_compressed_momentum_sync(prog: Program, ctx, options, dep, name: str = "onebit") -> int:
    """Momentum (or gradient) compressed all-reduce of every parameter group, in sequence: the groups
    of one size as one chain of ``count`` (add_compressed_allreduce says why that is exact)."""
    if ctx.world_size <= 1:
        return dep
    first = 0
    for n, count in group_sizes(ctx.params, options.param_groups):
        label = f"{name} group{first}" if count == 1 else f"{name} groups {first}-{first + count - 1}"
        dep = add_compressed_allreduce(prog, ctx, n, dep, options.backend, label, count)
        first += count
    return dep


def own_kernel(ctx, name: str) -> str:
    """The rate of 1-bit Adam's own update passes: ``name`` where the profile measured those torch
    expressions, else the device's Adam rate ('optimizer'). They differ where Adam is not one fused
    pass: on a CPU torch's foreach Adam makes several passes where FUSED_ADAM counts one of 28 bytes per
    parameter, so its rate is not a streaming rate (the testbed's MLP on 2 quarter-core hosts: 1-bit
    Adam's momentum and update passes, 88 bytes per parameter, priced 44 ms at Adam's rate, measured
    15 ms)."""
    return name if name in ctx.device.kernel_bw else "optimizer"


class OneBitAdam(Strategy):
    name = "onebit-adam"
    summary = (
        "1-bit Adam (DeepSpeed): Adam warmup, then 1-bit compressed momentum all-reduce with error feedback"
    )
    Options = OneBitAdamOptions
    baseline = "adam"

    @classmethod
    def run_options(cls, options: dict, steps: int | None) -> dict:
        return {**options, "stage": "compression"}

    @classmethod
    def warmup_options(cls, options: dict) -> dict | None:
        return {**options, "stage": "warmup"}

    @classmethod
    def warmup_steps(cls, options: dict) -> int | None:
        return options.get("freeze_step")

    state_bytes_per_param = 8.0

    def compression_program(self) -> Program:
        ctx, P = self.ctx, self.ctx.params
        prog = Program()
        last = add_micro_steps(prog, ctx)
        dep = prog.add(
            "local momentum update",
            "compute",
            ctx.device.stream_time(ok.MOMENTUM_UPDATE * P, own_kernel(ctx, "onebit_momentum")),
            "optimizer",
            (last,),
        )
        dep = add_compressed_momentum_sync(prog, ctx, self.options, dep)
        add_update_and_other(
            prog,
            ctx,
            [dep],
            ok.ADAM_DIRECTION + ok.APPLY_UPDATE,
            "1-bit Adam update (frozen variance)",
            kernel=own_kernel(ctx, "onebit_update"),
        )
        return prog

    def warmup_program(self) -> tuple[Program, list[dict]]:
        ctx = self.ctx
        update = ok.MOMENTUM_UPDATE + ok.VARIANCE_UPDATE + ok.ADAM_DIRECTION + ok.APPLY_UPDATE
        prog = Program()
        comm, buckets = add_ddp_gradient_sync(prog, ctx, ctx.grad_bytes, ctx.scenario.training.overlap)
        add_update_and_other(prog, ctx, [*comm, prog.last_on("compute")], update, "Adam update (warmup)")
        return prog, buckets

    def steps(self) -> list[StepProgram]:
        if self.options.stage == "warmup":
            return [StepProgram("warmup", 1.0, *self.warmup_program())]
        return [StepProgram("compression", 1.0, self.compression_program())]

    def extra_gpu_memory(self) -> dict[str, float]:
        return error_buffers_for_groups(
            group_sizes(self.ctx.params, self.options.param_groups), self.ctx.world_size
        )
