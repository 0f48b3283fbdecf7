"""The full-precision baselines: Adam and SGD with momentum under PyTorch DDP.

Gradients (``training.gradient_dtype``, default the training precision) are all-reduced in DDP
buckets overlapped with backward; then every rank runs the same update. Adam's fused update moves
about 28 bytes per parameter (fp32 param r/w 8, m r/w 8, v r/w 8, gradient 4; DeepSpeed's
fp16 variant: master 8 + m,v 16 + fp16 grad 2 + fp16 param write 2), SGDM's 20.
"""

from __future__ import annotations

from clustersim.simulator.program import Program
from clustersim.simulator.strategies.optimizer_kernels import FUSED_ADAM
from clustersim.simulator.strategies.base import StepProgram, Strategy
from clustersim.simulator.strategies.common import add_ddp_gradient_sync, add_update_and_other


class AdamDDP(Strategy):
    name = "adam"
    summary = "Adam, full-precision gradient all-reduce in DDP buckets (baseline)"
    update_bytes_per_param = FUSED_ADAM
    state_bytes_per_param = 8.0

    def build_program(self) -> tuple[Program, list[dict]]:
        prog = Program()
        comm, buckets = add_ddp_gradient_sync(prog, self.ctx, self.ctx.grad_bytes, self.ctx.scenario.training.overlap)
        last_bwd = prog.last_on("compute")
        add_update_and_other(prog, self.ctx, [*comm, last_bwd], self.update_bytes_per_param)
        return prog, buckets

    def steps(self) -> list[StepProgram]:
        prog, buckets = self.build_program()
        return [StepProgram("step", 1.0, prog, buckets)]


class SgdmDDP(AdamDDP):
    name = "sgdm"
    summary = "SGD with momentum, full-precision gradient all-reduce in DDP buckets"
    update_bytes_per_param = 20.0
    state_bytes_per_param = 4.0
