"""The interface every strategy implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import BaseModel

from clustersim.cost_models.kernel_bytes import FUSED_ADAM
from clustersim.optimizer_options import NoOptions
from clustersim.simulator.context import SimulationContext
from clustersim.simulator.program import Program


@dataclass
class StepProgram:
    """One kind of training step and the fraction of steps that are of this kind. A program may cover
    ``covers`` consecutive steps (DiLoCo's exchange overlaps several inner steps): its time, breakdown and
    bytes are divided by that number, and ``weight`` is still the fraction of steps it accounts for."""

    label: str
    weight: float
    program: Program
    buckets: list[dict] = field(default_factory=list)  # DDP buckets: {"bucket", "bytes", "op"}
    covers: int = 1


class Strategy:
    name: ClassVar[str]
    summary: ClassVar[str]
    Options: ClassVar[type[BaseModel]] = NoOptions
    #: bytes of HBM traffic per parameter for the optimizer's update kernel(s)
    update_bytes_per_param: ClassVar[float] = FUSED_ADAM
    #: bytes of optimizer state per parameter kept on the GPU (beyond params and grads)
    state_bytes_per_param: ClassVar[float] = 8.0
    #: the full-precision optimizer this one is measured against (None: it is a baseline itself)
    baseline: ClassVar[str | None] = None

    # ---- run-level behaviour, so that compare, sweeps and reports need no optimizer names ------------
    @classmethod
    def run_options(cls, options: dict, steps: int | None) -> dict:
        """Options for the steady stage of a run of ``steps`` steps (compare, time-to-train)."""
        return dict(options)

    @classmethod
    def warmup_options(cls, options: dict) -> dict | None:
        """Options that simulate the optimizer's warmup stage, or None when it has none."""
        return None

    @classmethod
    def warmup_steps(cls, options: dict) -> int | None:
        """Steps of the warmup stage the options name (None: not named)."""
        return None

    def __init__(self, ctx: SimulationContext, options: BaseModel):
        self.ctx = ctx
        self.options = options

    def steps(self) -> list[StepProgram]:
        raise NotImplementedError

    def result_extra(self, per_step: list[dict]) -> tuple[dict, list[str]]:
        """What the strategy adds to ``SimulationResult.extra`` (the sharding layout, DiLoCo's bandwidth,
        ...) and its notes, from the simulated steps (``per_step``: label, weight, iteration_time_s,
        breakdown_s, bytes of each step program)."""
        return {}, []

    def extra_gpu_memory(self) -> dict[str, float]:
        """Strategy-specific GPU memory (error-feedback buffers, ...), bytes per rank."""
        return {}
