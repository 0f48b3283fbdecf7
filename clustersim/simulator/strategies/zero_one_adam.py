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
from clustersim.simulator.program import Program
from clustersim.simulator.strategies.base import StepProgram, Strategy
from clustersim.simulator.strategies.common import (
    add_ddp_gradient_sync,
    add_micro_steps,
    add_update_and_other,
)
from clustersim.simulator.strategies.compressed_allreduce import error_buffers_for_groups
from clustersim.simulator.strategies.onebit_adam import (
    add_compressed_momentum_sync,
    group_sizes,
    own_kernel,
)

STEP_KINDS = ("variance_update", "compressed_gradient", "local", "local_sync")


@lru_cache(maxsize=64)
def schedule(o: ZeroOneAdamOptions) -> Counter:
    """How many steps of each kind the run has, counted in O(log total_steps) arithmetic instead of a
    loop over the steps (1e18 steps took minutes).

    DeepSpeed's schedule, step by step: before the freeze a step updates the variance when
    ``step % var_interval == 0``, and the interval doubles after every ``var_update_scaler`` updates;
    after it, step ``since`` steps past the freeze syncs when ``since % local_interval == 0``, and the
    interval doubles (capped at the clipper) after each multiple of ``local_step_scaler``. Between two
    doublings an interval is fixed, and the steps of a fixed interval I that fall in (lo, hi] are
    counted exactly as hi // I - lo // I. Each doubling at least doubles the interval, so there are at
    most lg(total_steps) + 1 spans before the interval passes the run or reaches its cap
    (tests/test_optimizers.py holds this to the step-by-step loop)."""
    counts: Counter = Counter()
    freeze = min(o.var_freeze_step, o.total_steps)
    updates, pos, interval = 0, 0, 1  # pos: the last step counted; every update before it is counted
    while pos < freeze:
        avail = freeze // interval - pos // interval  # multiples of the interval in (pos, freeze]
        if avail < o.var_update_scaler:
            updates += avail
            break
        updates += o.var_update_scaler
        pos = (pos // interval + o.var_update_scaler) * interval  # the step of the scaler-th update
        interval *= 2
    if updates:
        counts["variance_update"] = updates
    if freeze - updates:
        counts["compressed_gradient"] = freeze - updates
    local = o.total_steps - freeze  # steps since the freeze: 1 .. local
    syncs, lo, interval = 0, 0, 1
    while lo < local:
        # the interval is fixed for since in (lo, lo + scaler]; once capped (or past the run), for the rest
        capped = interval >= o.local_step_clipper or interval > local
        hi = local if capped else min(local, lo + o.local_step_scaler)
        syncs += hi // interval - lo // interval
        lo, interval = hi, min(o.local_step_clipper, interval * 2)
    if syncs:
        counts["local_sync"] = syncs
    if local - syncs:
        counts["local"] = local - syncs
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

    def _local_update(self, prog: Program, dep, label: str, accumulate: bool):
        """The update with the frozen variance (1-bit Adam's expressions, at their own rate where the
        profile measured them), plus past the freeze its accumulation into the momentum accumulator."""
        ctx = self.ctx
        per_param = ok.ADAM_DIRECTION + ok.APPLY_UPDATE + (ok.ACCUMULATE if accumulate else 0.0)
        return add_update_and_other(
            prog,
            ctx,
            [dep],
            per_param,
            label,
            kernel=own_kernel(ctx, "onebit_update"),
        )

    def program(self, kind: str) -> tuple[Program, list[dict]]:
        ctx, P, prog = self.ctx, self.ctx.params, Program()
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
            ctx.device.stream_time(ok.MOMENTUM_UPDATE * P, own_kernel(ctx, "onebit_momentum")),
            "optimizer",
            (dep,),
        )
        if kind == "local_sync":
            dep = add_compressed_momentum_sync(prog, ctx, self.options, dep, "accumulator")
            dep = prog.add(
                "accumulator correction",
                "compute",
                ctx.device.stream_time(ok.ACCUMULATOR_CORRECTION * P, own_kernel(ctx, "onebit_update")),
                "optimizer",
                (dep,),
            )
        self._local_update(prog, dep, f"0/1 Adam update ({kind})", kind in ("local", "local_sync"))
        return prog, []

    def steps(self) -> list[StepProgram]:
        counts = schedule(self.options)
        self.schedule = counts
        return [StepProgram(kind, counts[kind], *self.program(kind)) for kind in STEP_KINDS if counts[kind]]

    def extra_gpu_memory(self) -> dict[str, float]:
        return error_buffers_for_groups(
            group_sizes(self.ctx.params, self.options.param_groups), self.ctx.world_size
        )
