"""0/1 Adam (Lu et al. 2022; deepspeed/runtime/fp16/onebit/zoadam.py).

Before ``var_freeze_step``: on steps where ``step % var_interval == 0`` the variance is updated from
a full-precision gradient all-reduce; other steps compressed-all-reduce the gradient. ``var_interval``
doubles every ``var_update_scaler`` variance updates. After the freeze: local steps without
communication; every ``local_step_interval`` steps the accumulated update is compressed-all-reduced;
the interval doubles every ``local_step_scaler`` steps, capped at ``local_step_clipper``.

The per-step time varies, so each kind of step is simulated once and the run's average weighs them
by how often the schedule produces them over ``total_steps``. Defaults are DeepSpeed's 0/1 Adam
tutorial values for BERT-Large pretraining (var_freeze_step 23000, scalers 16 / 32678, clipper 16).
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

from clustersim.cost_models import kernel_bytes as ok
from clustersim.errors import InputError
from clustersim.optimizer_options import ZeroOneAdamOptions
from clustersim.simulator import offload
from clustersim.simulator.program import Program
from clustersim.simulator.strategies.base import StepProgram, Strategy
from clustersim.simulator.strategies.common import (
    add_ddp_gradient_sync,
    add_micro_steps,
    add_update_and_other,
)
from clustersim.simulator.strategies.compressed_allreduce import error_buffers_for_groups
from clustersim.simulator.strategies.ddp import adam_spec, zero_offload_program
from clustersim.simulator.strategies.onebit_adam import (
    add_compressed_momentum_sync,
    frozen_variance_offload_spec,
    group_sizes,
)

STEP_KINDS = ("variance_update", "compressed_gradient", "local", "local_sync")


@lru_cache(maxsize=64)
def schedule(o: ZeroOneAdamOptions) -> Counter:
    """How many steps of each kind the run has."""
    counts: Counter = Counter()
    var_interval, var_counter, local_interval = 1, 0, 1
    for step in range(1, o.total_steps + 1):
        if step <= o.var_freeze_step:
            if step % var_interval == 0:
                counts["variance_update"] += 1
                var_counter += 1
                if var_counter == o.var_update_scaler:
                    var_counter, var_interval = 0, var_interval * 2
            else:
                counts["compressed_gradient"] += 1
        else:
            since = step - o.var_freeze_step
            counts["local_sync" if since % local_interval == 0 else "local"] += 1
            if since % o.local_step_scaler == 0:
                local_interval = min(o.local_step_clipper, local_interval * 2)
    return counts


class ZeroOneAdam(Strategy):
    name = "zero-one-adam"
    summary = "0/1 Adam (DeepSpeed): adaptive variance freezing and 1-bit sync with local steps"
    Options = ZeroOneAdamOptions
    baseline = "adam"

    @classmethod
    def run_options(cls, options: dict, steps: int | None) -> dict:
        """The schedule fitted to the run: ``total_steps`` = steps, variance frozen by DeepSpeed's
        default step (the options' default) or the run's end, whichever comes first."""
        opts = dict(options)
        if steps:
            opts["total_steps"] = steps
            default_freeze = ZeroOneAdamOptions.model_fields["var_freeze_step"].default
            opts.setdefault("var_freeze_step", min(default_freeze, steps))
            if opts["var_freeze_step"] > steps:
                raise InputError(
                    f"var_freeze_step {opts['var_freeze_step']} is beyond the run's {steps} steps",
                    key="training.optimizer_options.var_freeze_step",
                )
        return opts

    state_bytes_per_param = 12.0  # m, v and the momentum accumulator
    gpu_state_with_offload = 8.0  # momentum and accumulator stay on the GPU (they are compressed)

    def offload_spec(self) -> offload.UpdateSpec:
        return frozen_variance_offload_spec(self.ctx, self.gpu_state_with_offload)

    def _local_update(self, prog: Program, dep, label: str):
        ctx = self.ctx
        return add_update_and_other(
            prog, ctx, [dep], ok.ADAM_DIRECTION + ok.APPLY_UPDATE, label, offload=self.offload_spec()
        )

    def program(self, kind: str) -> tuple[Program, list[dict]]:
        ctx, P, prog = self.ctx, self.ctx.params, Program()
        if kind == "variance_update" and offload.mode(ctx) != "none":
            update = ok.MOMENTUM_UPDATE + ok.VARIANCE_UPDATE + ok.ADAM_DIRECTION + ok.APPLY_UPDATE
            return zero_offload_program(
                ctx, adam_spec(ctx, update, 12.0), update, "0/1 Adam update (variance)"
            )
        if kind == "variance_update":
            comm, buckets = add_ddp_gradient_sync(prog, ctx, ctx.grad_bytes, ctx.scenario.training.overlap)
            update = ok.MOMENTUM_UPDATE + ok.VARIANCE_UPDATE + ok.ADAM_DIRECTION + ok.APPLY_UPDATE
            add_update_and_other(
                prog, ctx, [*comm, prog.last_on("compute")], update, "0/1 Adam update (variance)"
            )
            return prog, buckets
        last = add_micro_steps(prog, ctx)
        dep = last
        if kind == "compressed_gradient":
            dep = add_compressed_momentum_sync(prog, ctx, self.options, dep, "gradient")
        dep = prog.add(
            "momentum update",
            "compute",
            ctx.device.stream_time(ok.MOMENTUM_UPDATE * P, "optimizer"),
            "optimizer",
            (dep,),
        )
        if kind == "local_sync":
            dep = add_compressed_momentum_sync(prog, ctx, self.options, dep, "accumulator")
            dep = prog.add(
                "accumulator correction",
                "compute",
                ctx.device.stream_time(ok.ACCUMULATOR_CORRECTION * P, "optimizer"),
                "optimizer",
                (dep,),
            )
        self._local_update(prog, dep, f"0/1 Adam update ({kind})")
        return prog, []

    def steps(self) -> list[StepProgram]:
        counts = schedule(self.options)
        self.schedule = counts
        return [StepProgram(kind, counts[kind], *self.program(kind)) for kind in STEP_KINDS if counts[kind]]

    def extra_gpu_memory(self) -> dict[str, float]:
        return error_buffers_for_groups(
            group_sizes(self.ctx.params, self.options.param_groups), self.ctx.world_size
        )
