"""Which key a rank that does not fit in GPU memory names, and why: one rule for memory.check_fits
(the whole rank) and the offload planner (what stays on the GPU with the optimizer state on the host),
so a refusal names the same key whether the optimizer is offloaded or not (docs/input-validation.md)."""

from __future__ import annotations

from clustersim import catalog
from clustersim.units import format_bytes


def _one_sample_culprit(
    ctx, without_activations: float, own_buffers: float, per_sample: float, capacity: float
) -> str:
    """Not even one sample's activations fit beside the model states: the sequence when the user set
    one longer than the model's own; the optimizer when its own buffers (error feedback) take the room
    a sample needs; else the GPU (its memory holds the model states, not a sample beside them)."""
    w = ctx.scenario.workload
    arch = catalog.model(w.model) if w.model is not None else None
    if w.seq_len is not None and (arch is None or w.seq_len > arch.default_seq_len):
        return "workload.seq_len"
    if own_buffers and without_activations - own_buffers + per_sample <= capacity:
        return "training.optimizer"
    return "cluster.gpu"


def oom_culprit(
    ctx,
    states: float,
    without_activations: float,
    activations: float,
    capacity: float,
    own_buffers: dict[str, float],
) -> tuple[str, str]:
    """The key that makes a rank not fit and why (a clause for the message), by one rule whether the
    optimizer is offloaded or not: the model when ``states`` (what the update holds: weights, gradients,
    the optimizer state on the GPU and its buffers) alone exceed ``capacity``; the micro-batch when the
    activations tip ``without_activations`` over and a smaller one fits; when not even one sample fits,
    _one_sample_culprit's key; else the GPU ("" for why: the caller's own words)."""
    w = ctx.scenario.workload
    if states > capacity:
        key = "workload.model" if w.model is not None else "workload.layers"
        return key, f"; the model's weights, gradients and optimizer state alone need {format_bytes(states)}"
    if activations > 0 and without_activations <= capacity:
        per_sample = activations / w.micro_batch
        fits = int((capacity - without_activations) // per_sample) if per_sample > 0 else 0
        extra = sum(own_buffers.values())
        key = (
            "workload.micro_batch"
            if fits >= 1
            else _one_sample_culprit(ctx, without_activations, extra, per_sample, capacity)
        )
        if key == "training.optimizer":
            shown = ", ".join(f"{k.replace('_', ' ')} {format_bytes(v)}" for k, v in own_buffers.items())
            return key, (
                f"; {ctx.scenario.training.optimizer}'s own buffers ({shown}) leave no room for one "
                f"sample's activations ({format_bytes(per_sample)})"
            )
        return key, f"; the activations of micro_batch {w.micro_batch} need {format_bytes(activations)}" + (
            f" (a micro_batch of at most {fits} fits)" if fits >= 1 else " (not even a micro_batch of 1 fits)"
        )
    return "cluster.gpu", ""
