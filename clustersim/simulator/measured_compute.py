"""A model's own measured compute (profile v4, ``calibrate model`` / ``calibrate import-trace``) in a run.

What was measured is part of the measurement: a model's code (its fingerprint's ``implementation``:
Hugging Face's, torchvision's, clustersim's plain-torch build, a user's own) decides how many ops and
kernels a step launches, and the execution mode how they reach the GPU. A measurement therefore prices
a scenario directly only for the same model, sequence length, precision, code and mode: the layers'
modelled times are then scaled so each phase sums to the measured line (the split over layers, where
gradient buckets become ready, which layers bind the host, stays the model's).

Otherwise what carries is the measurement's per-op rates, applied to the scenario's own op counts:

- host dispatch per launch (forward and backward) and the optimizer's host loop, from a measurement
  of the scenario's own code and mode (another model of it): the host's cost per op is the code's (a
  Hugging Face op and a plain-torch op take different paths through Python), so a measurement of
  other code leaves host dispatch at the default rates for the mode;
- device time from the profile's hardware rates (its GEMM model, copy bandwidth, fixed cost per
  kernel), whatever code measured them: the scenario's own kernels, FLOPs and bytes are priced, not
  another model's ratio of measured to modelled time, which would carry the other model's residuals.
  Where the profile measured no hardware rates (``calibrate model`` alone), the same code's ratio of
  measured to modelled device time per phase is what says how fast the device is, and it carries;
- the fused Adam update's rate, from any measured model's AdamW phase (``_carry_update``).

The same model measured at another sequence length (same precision, code and mode) is carried from
first, its device time scaled by its own measured-to-modelled ratio even where the profile measured
hardware rates: its residuals are this model's (a tiny BERT's seq-64 entry priced its seq-128 step on a
CPU within 9%, BERT-Base-2L's rates 54% short). A measurement at another precision carries nothing: a
precision's kernels, casts and host work are its own.

The band of a carried prediction is how far such carrying went on the profile's own measurements
(``carry_errors``: each measured model priced exactly as a scenario of it is when its own entry is
absent), not the fit's.
(``ctx`` is the run's SimulationContext, which calls in here while it is built.)
"""

from __future__ import annotations

import math

from clustersim import catalog
from clustersim.calibration.profile import ModelCompute, PhaseMeasurement, Profile
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


def _same_code(mc: ModelCompute, implementation: str | None, execution: str) -> bool:
    """Whether ``mc`` measured the scenario's code (None on either side: not recorded, taken as the
    same) in the scenario's execution mode."""
    code = mc.fingerprint.implementation
    same = code is None or implementation is None or code.lower() == implementation.lower()
    return same and mc.fingerprint.execution == execution


def matching_model_compute(
    profile: Profile | None, workload: Workload, implementation: str | None = None, execution: str = "eager"
) -> ModelCompute | None:
    """The profile's measurement of this model at this sequence length and precision (any micro-batch),
    of the same code and execution mode."""
    mc = _same_model(profile, workload)
    return mc if mc is not None and _same_code(mc, implementation, execution) else None


def _same_model(profile: Profile | None, workload: Workload) -> ModelCompute | None:
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


def device_time(mc: ModelCompute, phase: PhaseMeasurement, b: float) -> float:
    """One of ``mc``'s measured phases' device time at micro-batch ``b`` on the device it was measured on
    (PhaseMeasurement.device_time: busy time plus the gaps between queued kernels on a GPU); a
    host-bound phase hides the gaps behind its dispatch, as the step takes max(host, device)."""
    return phase.device_time(b, mc.fingerprint.device)


def _ratios(mc: ModelCompute, b: float, modelled: dict[str, float]) -> dict[str, float]:
    measured = {
        "device_fwd": device_time(mc, mc.forward, b),
        "device_bwd": device_time(mc, mc.backward, b),
        "host_fwd": mc.forward.host_s.at(b),
        "host_bwd": mc.backward.host_s.at(b),
        "host_opt": mc.optimizer.host_s.at(b),
        "device_opt": device_time(mc, mc.optimizer, b),
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
    ctx.update_from = mc
    fp = mc.fingerprint
    measured_at = ", ".join(str(m) for m in mc.micro_batches)
    attention = f", attention {fp.attention}" if fp.attention else ""
    ctx.notes.append(
        f"compute of {mc.model} from its own measurement ({mc.source or ctx.profile.label}: micro-batches "
        f"{measured_at}, {fp.device}, torch {fp.torch or '?'}, execution {fp.execution}{attention})"
    )
    _warn_execution(ctx, mc)
    octaves = octaves_outside(mc, b)
    if octaves > 0:
        measured = sorted(set(mc.micro_batches))
        span = str(measured[0]) if len(measured) == 1 else f"{measured[0]}-{measured[-1]}"
        ctx.notes.append(
            f"micro-batch {b} is outside the measured {span} ({octaves:.1f} octaves): the measured lines "
            "are extrapolated, and the compute band grows with the distance"
        )


def octaves_outside(mc: ModelCompute, b: float) -> float:
    """How far micro-batch ``b`` lies outside ``mc``'s measured micro-batches, in octaves (log2 of the
    ratio to the nearest measured one; 0 within them): what a measurement's lines are extrapolated by."""
    lo, hi = min(mc.micro_batches), max(mc.micro_batches)
    if b < lo:
        return math.log2(lo / b)
    return math.log2(b / hi) if b > hi else 0.0


# A measurement's attention kernel (Hugging Face's attn_implementation, or what a trace shows) as the
# workload.attention value that prices the same kernels
_ATTENTION_OF = {
    "sdpa": "fused",
    "flash_attention_2": "fused",
    "flash_attention_3": "fused",
    "eager": "eager",
}


def _warn_execution(ctx, mc: ModelCompute) -> None:
    """Warn where the measurement ran other settings than the scenario asks for (its code and execution
    mode always match, ``_same_code``): the measured times are used as they are, so the scenario's own
    attention or batch-norm setting does not change them."""
    fp = mc.fingerprint
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
    """Carry the per-op rates of a measured model of this code and mode to this one (module docstring)."""
    implementation, execution = ctx.scenario.implementation, ctx.scenario.workload.execution
    other = _same_model(profile, ctx.workload)
    ref = _reference(ctx, profile)
    hardware = _measured_hardware(profile, ctx.precision)
    if other is not None:
        fp = other.fingerprint
        ctx.notes.append(
            f"the profile measured {other.model} as {fp.implementation or 'unrecorded'} code, "
            f"{fp.execution}; the scenario runs {implementation or 'unrecorded'} code, {execution} "
            "(workload.implementation, workload.execution): that measurement prices only the same code "
            "and mode" + ("" if ref is None else f", and the per-op rates of {ref[0].model}'s carry")
        )
    _carry_update(ctx, profile)
    if ref is None:
        ctx.notes.append(
            f"{_no_carry_reason(ctx, profile)}: host dispatch at {ctx.dispatch.source}, "
            f"{_device_rates(hardware, ctx.precision)}"
        )
        return
    mc, workload = ref
    own = _same_model_name(mc, ctx.workload.name)
    ops_per_launch = ctx.dispatch.backward_ops_per_launch
    ratios, fwd, bwd = _carried_ratios(
        ctx, mc, workload, hardware and not own, ops_per_launch, ctx._update_scale
    )
    _scale(ctx, ratios)
    ctx.transferred_from = mc
    ctx.carry_same_model = own
    if workload is not None and own:
        device = (
            f"device time scaled by its own measured-to-modelled ratio at sequence length {mc.seq_len} "
            "(the same model's kernels: its residuals are this scenario's)"
        )
    elif workload is not None and not hardware:
        device = (
            f"device time scaled by {mc.model}'s measured-to-modelled ratio (the profile measured no "
            "hardware rates)"
        )
    else:
        device = _device_rates(hardware, ctx.precision)
    ctx.notes.append(
        f"compute rates carried over from {mc.model}'s measurement on {mc.fingerprint.device} "
        f"({mc.source or profile.label}, {mc.fingerprint.implementation or 'unrecorded'} code): host "
        f"{fwd * 1e6:.1f} us per forward and {bwd * 1e6:.1f} us per backward launch over this model's "
        f"own launches, {device}"
    )
    _warn_execution(ctx, mc)


def _no_carry_reason(ctx, profile: Profile) -> str:
    """Why no measured model's per-op rates carry to the scenario: no measurement of its code and mode,
    or measurements of it only at other precisions (a precision's kernels, casts and host work are its
    own: the same code at bf16 autocast launches casts an fp32 step does not)."""
    implementation, execution = ctx.scenario.implementation, ctx.scenario.workload.execution
    code = implementation or "this"
    same = [m for m in profile.model_compute if _same_code(m, implementation, execution)]
    if same:
        models = ", ".join(sorted({f"{m.model} ({m.fingerprint.precision})" for m in same}))
        return (
            f"the profile measured {code} code in {execution} mode only at another precision ({models}); "
            f"the scenario runs {ctx.precision}, whose kernels, casts and host work are its own, so no "
            "measured model's host rate per op carries"
        )
    codes = sorted({f"{m.model} ({m.fingerprint.implementation or '?'})" for m in profile.model_compute})
    return (
        f"no measurement of {code} code in {execution} mode in the profile (it measured "
        f"{', '.join(codes)}), so no measured model's host rate per op carries"
    )


def dispatch_precision(ctx) -> str | None:
    """The precision the profile's dispatch rates were measured at, where the scenario's dispatch is at
    those rates (``Dispatch.of``: same code and mode) and the scenario runs another precision; else None.
    Such rates are used as they are (a host's cost per op is mostly the code's), but they are not a
    measurement of this step: the compute band stays as wide as the defaults' (uncertainty)."""
    measured = ctx.profile.dispatch if ctx.profile is not None else None
    if measured is None or not ctx.dispatch.source.startswith("measured"):
        return None
    precision = measured.fingerprint.precision
    return precision if precision and precision != ctx.precision else None


def _carry_update(ctx, profile: Profile) -> None:
    """The fused Adam update's measured rate, from any model's measured optimizer phase on this device:
    its kernels are torch.optim's, whatever the model's code, and a whole model's update measures them
    at the scale a scenario runs them (a microbenchmark's smaller tensors stream slower). Applies to an
    Adam scenario with the fused update, from a measurement that timed AdamW (fused on a GPU)."""
    if ctx.scenario.training.optimizer != "adam" or ctx.update_implementation != "fused":
        return
    for mc in profile.model_compute:
        if mc.fingerprint.optimizer != "adamw" or mc.fingerprint.precision != ctx.precision:
            continue
        workload = _measured_workload(mc)
        if workload is None:
            continue
        modelled = ctx.device.stream_time(FUSED_ADAM * workload.params, "optimizer")
        measured = device_time(mc, mc.optimizer, mc.micro_batches[0])
        if modelled > 0 and measured > 0:
            ctx._update_scale, ctx.update_from = measured / modelled, mc
            ctx.notes.append(
                f"the Adam update's rate from {mc.model}'s measured optimizer phase ({measured * 1e3:.2f} ms "
                f"for {workload.params / 1e6:,.0f}M parameters on {mc.fingerprint.device})"
            )
            return


def _device_rates(hardware: bool, precision: str) -> str:
    """What prices the device time of a scenario no measured model prices directly: the profile's
    hardware rates where it measured them, else the catalog's defaults (the sources of matmul and
    memory say which)."""
    if hardware:
        return "device time at the profile's measured hardware rates"
    return (
        f"device time at the default rates (the profile measured no {precision} GEMM rate; the sources "
        "of matmul and memory say which)"
    )


def _measured_hardware(profile: Profile, precision: str) -> bool:
    """Whether the profile measured this device's GEMM rate at ``precision`` (calibrate run): then the
    device is priced by it, and a measured model's ratio of measured to modelled time would carry that
    model's residuals (on an H100, Hugging Face's GPT-2 XL's ratio carried to GPT-3 XL put its steps
    10% short, the GEMM model within 1%)."""
    return precision in profile.compute_model or precision in profile.matmul_tflops


def host_rates(mc: ModelCompute) -> tuple[float, float]:
    """Host time per launched kernel, forward and backward, at the smallest measured micro-batch: the
    host's own cost per op, before a device-bound step makes the host wait for the launch queue."""
    b = min(mc.micro_batches)
    return (
        mc.forward.host_s.at(b) / max(mc.forward.kernels, 1),
        mc.backward.host_s.at(b) / max(mc.backward.kernels, 1),
    )


def _per_op_backward(mc: ModelCompute) -> float | None:
    """The backward's host time per autograd op at the smallest measured micro-batch (None: the
    measurement recorded no ops)."""
    if not mc.backward.ops:
        return None
    return mc.backward.host_s.at(min(mc.micro_batches)) / mc.backward.ops


def _same_model_name(mc: ModelCompute, name: str) -> bool:
    return mc.model.lower() == name.lower()


def _carried_ratios(
    ctx,
    mc: ModelCompute,
    workload: Workload | None,
    hardware: bool,
    ops_per_launch: float | None,
    update_scale: float,
) -> tuple[dict[str, float], float, float]:
    """The scales a carried prediction puts on a model's modelled phases (``_phase_totals`` on ctx's
    device and dispatch), from ``mc``'s measurement (``workload``: its catalog build, None where the
    catalog has none): host per launch at ``mc``'s rates (backward per autograd op times
    ``ops_per_launch`` where both are known), the optimizer's host loop at its measured-to-modelled
    ratio, the update at ``update_scale`` (``_carry_update``'s), and the device at the profile's hardware
    rates (``hardware``) or else at ``mc``'s measured-to-modelled ratio. Returns the scales and the host
    time per forward and backward launch."""
    ratios = dict.fromkeys(("device_fwd", "device_bwd", "host_opt"), 1.0)
    ratios["device_opt"] = update_scale
    if workload is not None:
        b = mc.micro_batches[len(mc.micro_batches) // 2]
        measured = _ratios(mc, b, _phase_totals(ctx, workload))
        ratios["host_opt"] = measured["host_opt"]
        if not hardware:
            # nothing measured this device's rates but the model's own phases: their ratio to the
            # modelled device time (same code: the same kernels) is what says how fast the device is
            ratios["device_fwd"], ratios["device_bwd"] = measured["device_fwd"], measured["device_bwd"]
    fwd, bwd = host_rates(mc)
    per_op = _per_op_backward(mc)
    if per_op is not None and ops_per_launch is not None:
        bwd = per_op * ops_per_launch  # per launch of this model: its autograd ops at the measured rate
    ratios["host_fwd"] = fwd / ctx.dispatch.host_s_per_kernel_forward
    ratios["host_bwd"] = bwd / ctx.dispatch.host_s_per_kernel_backward
    return ratios, fwd, bwd


def _carried_step(phases: dict[str, float], asynchronous: bool, sync_before_update: bool) -> float:
    """A single-GPU step from its phases' modelled host and device times, as the simulator runs them:
    on an asynchronous device the host queues forward's and backward's kernels ahead of the device and
    the optimizer's host loop follows (after backward's kernels where the host waits for them:
    ``sync_before_update``), the update's kernels last; on a CPU every phase is its host time plus its
    device time (the thread that dispatches an op also runs it)."""
    host = phases["host_fwd"] + phases["host_bwd"]
    device = phases["device_fwd"] + phases["device_bwd"]
    if not asynchronous:
        return host + device + phases["host_opt"] + phases["device_opt"]
    if sync_before_update:
        return max(host, device) + phases["host_opt"] + phases["device_opt"]
    return max(host + phases["host_opt"], device) + phases["device_opt"]


def _measured_step(mc: ModelCompute, b: float) -> float:
    """``mc``'s measured step at micro-batch ``b``: its phases' measured wall times where it timed them,
    else each phase's host and device time combined as ``calibrate model`` predicts its held-out step."""
    phases = (mc.forward, mc.backward, mc.optimizer)
    if all(p.wall_s is not None for p in phases):
        return sum(p.wall_s.at(b) for p in phases)
    cpu = mc.fingerprint.device == "cpu"
    combine = (lambda h, d: h + d) if cpu else max
    return sum(combine(p.host_s.at(b), device_time(mc, p, b)) for p in phases)


def _update_scale_from(ctx, candidates: list[ModelCompute]) -> float | None:
    """The fused Adam update's measured-to-modelled ratio from the first of ``candidates`` that timed
    AdamW and is in the catalog (``_carry_update``'s choice), or None."""
    for mc in candidates:
        workload = _measured_workload(mc)
        if mc.fingerprint.optimizer != "adamw" or workload is None:
            continue
        modelled = ctx.device.stream_time(FUSED_ADAM * workload.params, "optimizer")
        measured = device_time(mc, mc.optimizer, mc.micro_batches[0])
        if modelled > 0 and measured > 0:
            return measured / modelled
    return None


def carry_errors(ctx, profile: Profile, like: ModelCompute, same_model: bool | None = None) -> list[float]:
    """How far a carried prediction went on the profile's own measurements of ``like``'s code, mode and
    precision: each measured model (each entry: a model at one sequence length) priced at each of its
    micro-batches the way a scenario of it is priced when its own entry is absent (``_pick`` from the
    others, ``_carried_ratios`` on ctx's device: host per launch at the source's rates, device at the
    profile's hardware rates, its own other sequence length's ratio first), as log(predicted / measured).
    A model the catalog cannot build is not predicted (its kernels are unknown); a model that did not
    time AdamW keeps its measured optimizer phase (a scenario prices its own optimizer). ``same_model``:
    only the carries from the same model at another sequence length (True) or from another model
    (False); None: both."""
    fp = like.fingerprint
    peers = [
        mc
        for mc in profile.model_compute
        if mc.fingerprint.precision == fp.precision
        and _same_code(mc, fp.implementation, fp.execution)
        and mc.forward.kernels
        and mc.backward.kernels
    ]
    hardware = _measured_hardware(profile, fp.precision)
    asynchronous = ctx.dispatch.asynchronous
    sync = fp.precision == "fp16"  # the host reads fp16's loss scaler before the update (context)
    errors = []
    for target in peers:
        arch = _arch(target.model)
        others = [mc for mc in peers if mc is not target]
        source = _pick(others, target.model, arch)
        if arch is None or source is None:
            continue
        own = _same_model_name(source, target.model)
        if same_model is not None and own != same_model:
            continue
        # the update's rate from any other model's AdamW phase at this precision, whatever its code
        updaters = [
            m for m in profile.model_compute if m is not target and m.fingerprint.precision == fp.precision
        ]
        update = _update_scale_from(ctx, updaters) if target.fingerprint.optimizer == "adamw" else None
        ops = catalog.backward_ops_per_launch(arch) if ctx.dispatch.backward_ops_per_launch else None
        ratios, _, _ = _carried_ratios(
            ctx, source, _measured_workload(source), hardware and not own, ops, update or 1.0
        )
        for b in target.micro_batches:
            modelled = _phase_totals(ctx, _measured_workload(target, b))
            predicted = {k: modelled[k] * ratios[k] for k in modelled}
            if target.fingerprint.optimizer != "adamw":
                predicted["host_opt"] = target.optimizer.host_s.at(b)
                predicted["device_opt"] = device_time(target, target.optimizer, b)
            step = _carried_step(predicted, asynchronous, sync)
            errors.append(math.log(step / _measured_step(target, b)))
    return errors


def carry_sigma(ctx, profile: Profile, like: ModelCompute, same_model: bool = False) -> float | None:
    """The log-sigma of a carried prediction of ``like``'s code, from ``carry_errors`` of the same kind
    (their root mean square): from the same model at another sequence length (``same_model``) or from
    another model. A same-model carry the profile cannot test takes the other models' carries, the wider
    evidence (on a CPU profile tiny-bert's seq-64 entry priced its seq-128 step within 9%, the two BERTs
    priced each other 34-67% short). None where the profile holds no such pair to carry between."""
    errors = carry_errors(ctx, profile, like, same_model)
    if not errors and same_model:
        errors = carry_errors(ctx, profile, like, False)
    if not errors:
        return None
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def _pick(candidates: list[ModelCompute], name: str, target) -> ModelCompute | None:
    """Of measured models (already of the scenario's precision, code and mode), the one a scenario of
    model ``name`` (catalog model ``target``) carries from: the same model at another sequence length
    first, then the same family (and the same transformer style first)."""
    best = None
    for mc in candidates:
        if not (mc.forward.kernels and mc.backward.kernels):
            continue
        arch = _arch(mc.model)
        if target is not None and arch is not None and type(arch) is not type(target):
            continue
        rank = (
            _same_model_name(mc, name),
            arch is not None,
            getattr(arch, "style", None) == getattr(target, "style", None),
        )
        if best is None or rank > best[0]:
            best = (rank, mc)
    return None if best is None else best[1]


def _reference(ctx, profile: Profile) -> tuple[ModelCompute, Workload | None] | None:
    """The measured model to carry rates from: same precision, code and execution mode (``_pick``).
    Its catalog build (``NAME-<N>L``: NAME with N layers), where the catalog has it, prices its
    optimizer phase for the update's ratio."""
    implementation, execution = ctx.scenario.implementation, ctx.scenario.workload.execution
    candidates = [
        mc
        for mc in profile.model_compute
        if mc.fingerprint.precision == ctx.precision and _same_code(mc, implementation, execution)
    ]
    mc = _pick(candidates, ctx.workload.name, _arch(ctx.workload.name))
    return None if mc is None else (mc, _measured_workload(mc))


def _arch(name: str):
    """The catalog model of that name (``NAME-<N>L``: NAME with N layers), or None."""
    try:
        return catalog.model(name)
    except InputError:
        return None


def _measured_workload(mc: ModelCompute, b: int | None = None) -> Workload | None:
    """The measured model's layers at micro-batch ``b`` (default: its middle measured one), as the
    simulator builds them."""
    arch = _arch(mc.model)
    if arch is None:
        return None
    b = mc.micro_batches[len(mc.micro_batches) // 2] if b is None else b
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
