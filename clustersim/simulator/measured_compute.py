"""A model's own measured compute (profile v4, ``calibrate model`` / ``calibrate import-trace``) in a run.

The measurement gives, per phase, host dispatch and device time as lines in the micro-batch. For
the measured model the layers' modelled times are scaled so each phase sums to the measured line: the
split over layers (where gradient buckets become ready, which layers bind the host) stays the model's,
the totals are the measurement's.

For another model on the same device the measurement still says how far the modelled rates are from
this machine and this software: the ratio of measured to modelled time per phase and resource (host
dispatch forward and backward, device forward and backward, the optimizer's host loop) is carried over
to the other model, whose structure (layers, kernels, FLOPs, bytes) the model supplies. The ratios are
taken at the measured model's middle micro-batch; the nearest measured model of the same family and
style, precision and execution mode is used. (``ctx`` is the run's SimulationContext, which calls in
here while it is built.)
"""

from __future__ import annotations

from clustersim import catalog
from clustersim.calibration.profile import ModelCompute, Profile
from clustersim.catalog import BYTES_PER_ELEMENT, ResNetArch, storage_precision
from clustersim.cost_models.kernel_bytes import FUSED_ADAM
from clustersim.errors import InputError
from clustersim.workloads.layers import Workload
from clustersim.workloads.resnet import resnet_layers
from clustersim.workloads.transformer import transformer_layers


def _measured_seq(workload: Workload) -> int:
    """The sequence length a measurement of this workload names (a CNN's is its image side)."""
    arch = _arch(workload.name)
    return arch.image_size if isinstance(arch, ResNetArch) else workload.seq_len


def matching_model_compute(profile: Profile | None, workload: Workload) -> ModelCompute | None:
    """The profile's measurement of this model at this sequence length and precision (any micro-batch)."""
    if profile is None or not profile.model_compute:
        return None
    # model names are case-insensitive (a scenario may write bert-large for BERT-Large)
    seq, name = _measured_seq(workload), workload.name.lower()
    for mc in profile.model_compute:
        same = mc.model.lower() == name
        if same and mc.seq_len == seq and mc.fingerprint.precision == workload.precision:
            return mc
    return None


def _phase_totals(ctx, workload: Workload) -> dict[str, float]:
    """The modelled unscaled host and device time of each phase of ``workload`` on ctx's device."""
    dev, disp, p = ctx.device, ctx.dispatch, workload.precision
    layers = workload.layers
    return {
        "device_fwd": sum(dev.kernels_time(x.forward, p) for x in layers),
        "device_bwd": sum(dev.kernels_time(x.backward, p) for x in layers),
        "host_fwd": sum(disp.pass_time(dev.kernels_launched(x.forward), True) for x in layers),
        "host_bwd": sum(disp.pass_time(dev.kernels_launched(x.backward), False) for x in layers),
        "host_opt": disp.optimizer_time(sum(len(x.param_tensors) for x in layers)),
        # the update's kernels, priced as an Adam update (calibrate model's default optimizer)
        "device_opt": dev.stream_time(FUSED_ADAM * workload.params, "optimizer"),
    }


def _ratios(mc: ModelCompute, b: float, modelled: dict[str, float]) -> dict[str, float]:
    measured = {
        "device_fwd": mc.forward.device_s.at(b),
        "device_bwd": mc.backward.device_s.at(b),
        "host_fwd": mc.forward.host_s.at(b),
        "host_bwd": mc.backward.host_s.at(b),
        "host_opt": mc.optimizer.host_s.at(b),
        "device_opt": mc.optimizer.device_s.at(b),
    }
    return {k: measured[k] / modelled[k] if modelled[k] > 0 else 1.0 for k in measured}


def _scale(ctx, ratios: dict[str, float]) -> None:
    ctx._fwd_scale, ctx._bwd_scale = ratios["device_fwd"], ratios["device_bwd"]
    ctx._host_fwd_scale, ctx._host_bwd_scale = ratios["host_fwd"], ratios["host_bwd"]
    ctx._host_opt_scale, ctx._update_scale = ratios["host_opt"], ratios["device_opt"]


def apply_model_compute(ctx, mc: ModelCompute) -> None:
    """Scale this model's layers so each phase sums to its measured line at this micro-batch."""
    b = ctx.workload.micro_batch
    _scale(ctx, _ratios(mc, b, _phase_totals(ctx, ctx.workload)))
    fp = mc.fingerprint
    measured_at = ", ".join(str(m) for m in mc.micro_batches)
    attention = f", attention {fp.attention}" if fp.attention else ""
    ctx.notes.append(
        f"compute of {mc.model} from its own measurement ({mc.source or ctx.profile.label}: micro-batches "
        f"{measured_at}, {fp.device}, torch {fp.torch or '?'}, execution {fp.execution}{attention})"
    )
    _warn_execution(ctx, mc)
    if not min(mc.micro_batches) <= b <= max(mc.micro_batches):
        ctx.notes.append(
            f"micro-batch {b} is outside the measured {min(mc.micro_batches)}-{max(mc.micro_batches)}: "
            "the measured lines are extrapolated"
        )


# A measurement's attention kernel (Hugging Face's attn_implementation, or what a trace shows) as the
# workload.attention value that prices the same kernels
_ATTENTION_OF = {
    "sdpa": "fused",
    "flash_attention_2": "fused",
    "flash_attention_3": "fused",
    "eager": "eager",
}


def _warn_execution(ctx, mc: ModelCompute) -> None:
    """Warn where the measurement ran other settings than the scenario asks for: the measured times are
    used as they are, so the scenario's own setting does not change them."""
    fp = mc.fingerprint
    if fp.execution != ctx.scenario.workload.execution:
        ctx.notes.append(
            f"warning: the profile measured {mc.model} with execution {fp.execution}, the scenario asks for "
            f"{ctx.scenario.workload.execution} (workload.execution): the measurement is used as it is"
        )
    measured = _ATTENTION_OF.get(fp.attention or "")
    asked = ctx.scenario.workload.attention
    if (
        measured is not None
        and measured != asked
        and any(x.name.startswith("block") for x in ctx.workload.layers)
    ):
        ctx.notes.append(
            f"warning: the profile measured {mc.model} with {fp.attention} attention ({measured}), the "
            f"scenario asks for {asked} (workload.attention): the measurement is used as it is"
        )
    fusion = ctx.scenario.workload.batch_norm
    if fusion != "separate" and ctx.workload.layers and ctx.workload.layers[0].name == "stem":
        # calibrate model and import-trace measure PyTorch code, whose batch-norm kernels are separate
        ctx.notes.append(
            f"warning: the profile measured {mc.model} in PyTorch, with separate batch-norm kernels; the "
            f"scenario asks for {fusion} (workload.batch_norm): the measurement is used as it is"
        )


def transfer_model_compute(ctx, profile: Profile) -> None:
    """Carry the measured-to-modelled ratios of another measured model of this device to this one."""
    ref = _reference(ctx, profile)
    if ref is None:
        return
    mc, workload = ref
    b = mc.micro_batches[len(mc.micro_batches) // 2]
    _scale(ctx, _ratios(mc, b, _phase_totals(ctx, workload)))
    ctx.transferred_from = mc
    ctx.notes.append(
        f"compute rates carried over from {mc.model}'s measurement on {mc.fingerprint.device} "
        f"({mc.source or profile.label}): its measured-to-modelled ratios per phase, applied to this model"
    )
    _warn_execution(ctx, mc)


def _reference(ctx, profile: Profile) -> tuple[ModelCompute, Workload] | None:
    """The measured model to carry rates from: same precision and execution mode, same family (and the
    same transformer style first), buildable from the catalog (``NAME-<N>L``: NAME with N layers)."""
    target = _arch(ctx.workload.name)
    best = None
    for mc in profile.model_compute:
        if mc.fingerprint.precision != ctx.precision:
            continue
        workload = _measured_workload(mc)
        if workload is None:
            continue
        arch = _arch(mc.model)
        same_family = target is None or type(arch) is type(target)
        if not same_family:
            continue
        rank = (
            getattr(arch, "style", None) == getattr(target, "style", None),
            mc.fingerprint.execution == ctx.scenario.workload.execution,
        )
        if best is None or rank > best[0]:
            best = (rank, mc, workload)
    return None if best is None else (best[1], best[2])


def _arch(name: str):
    """The catalog model of that name (``NAME-<N>L``: NAME with N layers), or None."""
    try:
        return catalog.model(name)
    except InputError:
        return None


def _measured_workload(mc: ModelCompute) -> Workload | None:
    """The measured model's layers at its middle micro-batch, as the simulator builds them."""
    arch = _arch(mc.model)
    if arch is None:
        return None
    b = mc.micro_batches[len(mc.micro_batches) // 2]
    p = mc.fingerprint.precision
    d = BYTES_PER_ELEMENT[storage_precision(p)]
    if isinstance(arch, ResNetArch):
        return Workload(mc.model, tuple(resnet_layers(arch, b, d)), b, 1, p)
    # Hugging Face's eager attention runs plain ops on the scores; sdpa and FlashAttention are fused
    attention = _ATTENTION_OF.get(mc.fingerprint.attention or "", "fused")
    # a measured model is plain PyTorch code (calibrate model, a user's traced job) unless compiled
    unfused = mc.fingerprint.execution != "compiled"
    layers = transformer_layers(arch, b, mc.seq_len, d, attention, unfused, fp8=p == "fp8")
    return Workload(mc.model, tuple(layers), b, mc.seq_len, p)
