"""Each optimizer's options schema: part of the scenario schema, so it depends on nothing above it.

``training.optimizer`` names the optimizer and ``training.optimizer_options`` is validated against
its model here (OPTIONS); the strategy registry (simulator/strategies/registry.py) only maps the
same names to the classes that build programs, and a test keeps the two tables in step.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictInt,
    Tag,
    ValidationError,
    model_validator,
)

from clustersim.catalog import Number
from clustersim.errors import InputError
from clustersim.io import first_error

#: how Adam's or SGD's update kernels run (torch.optim's three paths)
UpdateImplementation = Literal["fused", "foreach", "for_loop"]


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class UpdateOptions(BaseModel):
    """Adam(W) and SGD with momentum: how the update's kernels run (torch.optim's three paths)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    implementation: UpdateImplementation = Field(
        "fused",
        description="fused: one pass over parameters, gradients and state per tensor group "
        "(torch.optim.AdamW(fused=True), apex and DeepSpeed FusedAdam, Megatron-LM); foreach: one "
        "multi-tensor kernel per op of the update, each a pass of its own (PyTorch's default for CUDA "
        "tensors when neither flag is given); for_loop: every op a kernel per parameter tensor, each "
        "dispatched by the host (foreach=False, or hand-written loops such as BERT's BertAdam)",
    )


class OneBitAdamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    stage: Literal["compression", "warmup"] = Field("compression", description="which stage `run` simulates")
    backend: Literal["nccl", "mpi_cuda_aware", "mpi_host_staged"] = "nccl"
    param_groups: StrictInt = Field(1, ge=1, description="one compressed_allreduce per parameter group")
    freeze_step: StrictInt | None = Field(
        None, ge=0, description="warmup steps; compare/time-to-train uses it with --steps"
    )


class KeyedValueError(ValueError):
    """A check across two options, raised with the option it names: the one the user set (pydantic puts a
    model check at no key; parse_options reads this one's from the error)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


class ZeroOneAdamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    total_steps: StrictInt = Field(100_000, gt=0)
    var_freeze_step: StrictInt = Field(23_000, ge=0)
    var_update_scaler: StrictInt = Field(16, gt=0)
    local_step_scaler: StrictInt = Field(32_678, gt=0)
    local_step_clipper: StrictInt = Field(16, gt=0)
    backend: Literal["nccl", "mpi_cuda_aware", "mpi_host_staged"] = "nccl"
    param_groups: StrictInt = Field(1, ge=1)

    @model_validator(mode="after")
    def _freeze_within_run(self):
        """The variance freezes within the run. Named by the option the user set, the other said to be
        its default when it is one (total_steps: 1000 alone is below var_freeze_step's default 23000)."""
        freeze, total = self.var_freeze_step, self.total_steps
        if freeze <= total:
            return self
        if "var_freeze_step" not in self.model_fields_set:
            raise KeyedValueError(
                "total_steps",
                f"{total} is below var_freeze_step's default {freeze} (set var_freeze_step too)",
            )
        if "total_steps" not in self.model_fields_set:
            raise KeyedValueError(
                "var_freeze_step", f"{freeze} is beyond total_steps' default {total} (set total_steps too)"
            )
        raise KeyedValueError("var_freeze_step", f"{freeze} is beyond total_steps {total}")


class Phase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    primitive: Literal["reduce_scatter", "all_gather", "all_reduce", "all_to_all"]
    group: Literal["intra", "inter", "world"]
    bits: StrictInt = Field(ge=1, le=32, description="bits per element on the wire")
    via: Literal["native", "all_to_all"] = "native"
    requantize_bits: StrictInt | None = Field(
        None, ge=1, le=32, description="re-quantize the phase's result to this many bits"
    )


# The tags of the scheme union (a named scheme or a list of phases): pydantic puts them in an error's
# location, where they are not keys the user wrote (first_error drops them). Without the discriminator
# a phase with ``bits: 0`` was reported as the named scheme's literal.
_SCHEME_TAGS = ("scheme name", "phases")


class BinSGDMOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    scheme: Annotated[
        Annotated[Literal["hierarchical", "flat"], Tag(_SCHEME_TAGS[0])]
        | Annotated[list[Phase], Field(min_length=1), Tag(_SCHEME_TAGS[1])],
        Discriminator(lambda v: _SCHEME_TAGS[1] if isinstance(v, list) else _SCHEME_TAGS[0]),
    ] = Field("hierarchical", description="hierarchical, flat, or a list of phases (at least one)")


class DiLoCoOptions(BaseModel):
    """DiLoCo (Douillard et al. 2024, arXiv:2311.08105) and Streaming DiLoCo (Douillard et al. 2025,
    arXiv:2501.18512). ``fragments`` 1 with ``overlap_steps`` 0 and 32 bits is DiLoCo as published
    (blocking fp32 outer synchronisation every H steps); Streaming DiLoCo synchronises P fragments of the
    model in turn (one every H/P inner steps), lets the exchange overlap ``overlap_steps`` (tau) inner
    steps, and sends the outer gradients in 4 bits."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    workers: StrictInt = Field(
        2, ge=2, description="M: workers (groups of whole nodes), each a data-parallel replica"
    )
    inner_steps: StrictInt = Field(
        100, ge=1, description="H: inner steps between two synchronisations of a fragment (the paper's 100)"
    )
    fragments: StrictInt = Field(1, ge=1, description="P: fragments synchronised in turn (1: plain DiLoCo)")
    overlap_steps: StrictInt = Field(
        0, ge=0, description="tau: inner steps the exchange of a fragment overlaps before it is applied"
    )
    bits: Literal[4, 8, 16, 32] = Field(32, description="bits per outer-gradient element on the wire")
    inter_worker_gbps: Number | None = Field(
        None, gt=0, description="bandwidth between workers, Gb/s per worker (default: the cluster's own NICs)"
    )
    inter_worker_latency_ms: Number = Field(
        0.0,
        ge=0,
        description="one-way latency between workers, ms, once per step of the outer ring's 2(M-1): over "
        "inter_worker_gbps links, or added to the cluster's own NICs' exchange (workers apart)",
    )
    outer_release: Literal["after_step", "during_backward"] = Field(
        "after_step",
        description="when a fragment's outer gradient leaves: after_step, once the inner step's update is "
        "done (PyTorch DiLoCo implementations: after optimizer.step()); during_backward, each layer's "
        "share as soon as that layer's backward is done, its update applied there (a compiled step that "
        "updates each layer when its gradient is ready; the Streaming DiLoCo paper's simulation)",
    )


OPTIONS: dict[str, type[BaseModel]] = {
    "adam": UpdateOptions,
    "sgdm": UpdateOptions,
    "onebit-adam": OneBitAdamOptions,
    "zero-one-adam": ZeroOneAdamOptions,
    "binsgdm": BinSGDMOptions,
    "diloco": DiLoCoOptions,
}


def parse_options(optimizer: str, options: dict) -> BaseModel:
    """The validated options of ``optimizer``; errors name ``training.optimizer(_options)...``."""
    if optimizer not in OPTIONS:
        raise InputError(
            f"unknown optimizer {optimizer!r} (known: {', '.join(OPTIONS)})", key="training.optimizer"
        )
    try:
        return OPTIONS[optimizer].model_validate(options)
    except ValidationError as exc:
        key, msg = first_error(exc, _SCHEME_TAGS)
        if msg == "unknown key":
            msg += " for optimizer " + optimizer
        cause = (exc.errors()[0].get("ctx") or {}).get("error")
        if isinstance(cause, KeyedValueError):  # a check across options, named by the one the user set
            key = cause.key
        where = "training.optimizer_options"
        raise InputError(msg, key=where if key == "(top level)" else f"{where}.{key}") from None
