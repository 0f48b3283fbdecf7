"""How sure a prediction is: P10 / P50 / P90 by propagating parameter uncertainty through the simulator.

What is uncertain, and how wide:
* **Collectives.** With a calibrated network model, its fitted parameters are drawn from their
  covariance (log space) and each draw also carries the measured scatter of medians about the
  model (network_params.NetworkParams.from_normals). Link classes the profile did not measure, and every
  class without a profile, get the documented default widths (network_params.DEFAULT_SIGMA). No draw
  beats the wire: a drawn link rate stops at its peak (a NIC's line rate) and a calibrated collective's
  drawn time at its bytes' time at those rates (collectives.CollectiveModel.floor).
* **Compute.** The device's time gets one lognormal factor per draw: forward, backward, their host
  dispatch and every other kernel pass on the device (optimizer update, casts and copies, compression
  kernels), since a device that runs slower than calibrated runs all of its work slower. Its width is
  the model's own measurement's (widened by EXTRAPOLATION_SIGMA_PER_OCTAVE outside its measured
  micro-batches), the measured error of carrying another measurement to it, the profile's
  compute-model uncertainty (never under the defaults' where the host's rates were not measured for
  this code and precision), MEASURED_PHASES_SIGMA when forward/backward were measured for this very
  model, and otherwise DEFAULT_COMPUTE_SIGMA: a profile never makes a prediction surer than its evidence.
* **Host.** The host's CPU and memory work (simulator/host.py: the CPU optimizer's rate, streaming
  passes such as a CPU upcast, the driver's pageable copies, DeepSpeed's memory reports) gets one
  lognormal factor per draw, independent of the device's, of width HOST_SIGMA; its page faults another
  of the same width, drawn apart (the kernel's fault path, its mitigations and huge-page settings are
  not the CPU's rates). They change nothing where the host does no such work (no offload), so those
  runs' bands are as before.

**Draws.** All of these are standard normals mapped through their widths, and the draws are the
points of one scrambled Sobol sequence over all of them (quasi_normals, a fixed seed; the host's
factors from sequences of their own): the same inputs
give the same draws, so every command prints the same band. Each draw rebuilds the cost models and
re-runs the whole discrete-event simulation, so overlap, bucket timing and offload interleaving respond
to the perturbation exactly as they would to a real change (a Megatron pipeline's program, whose ops a
draw does not change, is built once and re-priced op for op: runner.draw_times); the band is read
from the draws' log-mean and log-spread (Interval.of), whose P10 and P90 at DEFAULT_SAMPLES move < 3%
against 256 draws. The band is
the uncertainty of the *model's parameters* and of repeated measurements, not of things the model
does not contain (stragglers, other jobs on the fabric).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from clustersim.simulator.context import Perturbation, SimulationContext
from clustersim.simulator.measured_compute import dispatch_precision, octaves_outside
from clustersim.topologies.cluster import GroupShape

# Default log-sigma of compute (device and host dispatch) without a measured compute model: the spread
# of the default predictions' errors against published single-GPU and single-node throughputs
# (`validate --dataset gpu_throughput`: 46 scored rows of NVIDIA DeepLearningExamples and MLPerf,
# V100/A100/H100, BERT-Large and ResNet-50, several software versions; median |error| 8%). A band of
# exp(+-1.2816 x 0.25) = -27%..+38% holds the published value in 44 of those rows; the two H200 steps
# of the development set are within 2% and 11%. Software versions of one code base differ by up to 2x
# there (ResNet-50 fp16 on A100: 1,241 img/s in one container, 2,470 in a later one), which no
# hardware model follows: `calibrate model` measures the user's own code and narrows the band.
DEFAULT_COMPUTE_SIGMA = 0.25
# Measured forward/backward phases are medians of another run of the same model: the 1-bit Adam
# paper's two measurements of one V100 step (1-GPU throughput vs its 64-GPU profile) differ by 10%.
MEASURED_PHASES_SIGMA = 0.10
# A model priced with another measured model's rates (calibrate model / import-trace of one model,
# carried to another of the same code on the same device) where the profile holds only one model of that
# code, so that carrying cannot be measured on the profile itself (measured_compute.carry_sigma): the
# errors of such predictions against measured steps were 2%, 12%, 12%, 14% (Hugging Face GPT-2 XL's
# measurement on an H100 carried to BERT-Large at 16 and 64 and to GPT-3 XL at 1 and 2) and 26%
# (clustersim's BERT-Large build on an H200 carried to Hugging Face's BERT-Base at 32);
# exp(+-1.2816 x 0.15) = -17%..+21% holds four of the five.
TRANSFERRED_COMPUTE_SIGMA = 0.15
# One session's measurement predicts another session's step: the same steps timed in 3-5 runs on one
# H200 and one H100 (validation/data/gpu_steps.yaml notes, 68 run medians of 19 steps) lay about each
# step's median with a root-mean-square log deviation of 0.10 (P80 of |deviation| 13%, P90 20%; the
# host-bound BERT steps moved by up to 30%, the device-bound ones by 1-2%). A measured model's band
# adds this to its fit's held-out error: a calibration is one draw of that spread.
SESSION_SIGMA = 0.10
# The smallest held-out error taken from a fit (a lucky hold-out says little about the next one): the
# median run-to-run spread of a timed step within one session on the H200 and H100 (gpu_steps.yaml).
RUN_TO_RUN = 0.05
# A model's compute from one imported trace (calibrate import-trace: one micro-batch, no hold-out):
# such imports predicted their own unprofiled steps within +3% (BERT-Large, H200), -9% (ResNet-50),
# +2% (BERT-Base, with --step-time) and +22% (GPT-2 XL, whose profiler cost per op was uneven between
# forward and backward); exp(+-1.2816 x 0.18) = -21%..+26% holds all four.
IMPORTED_TRACE_SIGMA = 0.18
# Added log-sigma per octave a measured model's micro-batch lies outside its measured ones (its lines
# extrapolated; every other micro-batch of a one-trace import): the shipped H200 traces imported with
# --step-time (ResNet-50 at 128, BERT-Large at 16, GPT-2 XL at 4) predicted the gpu_steps rows of their
# models at other micro-batches with log errors beyond their own micro-batch's of +0.27 and +0.03
# (ResNet-50 at 64 and 256), +0.14 and +0.16 (BERT-Large at 8 and 32) and +0.34 two octaves out (GPT-2 XL
# at 1): 0.17 per octave, root mean square (sqrt(sum d^2 / sum octaves^2)). Added to the measurement's own
# band in quadrature; a line fitted on several micro-batches is priced the same way beyond them.
EXTRAPOLATION_SIGMA_PER_OCTAVE = 0.17
# Default log-sigma of the host's CPU and memory rates (CPU Adam, pageable copies, page faults, memory
# reports), which the hosts of published runs seldom name: the published single-thread demand-zero
# page fault costs 1.0 and 1.9 us (hardware_defaults.yaml host.first_touch_s_per_page) are the
# default's P10 and P90 at this width (exp(+-1.2816 x 0.25) = x0.73..x1.38 about 1.4 us); the default
# CPU Adam rate (1.51e9/s, one H100 node's) and a 16-core H100 host's measured 1.69e9/s differ by
# 11%; DeepSpeed's memory report took 0.085 s and 0.14 s per call in the two logs we hold
# (hardware_defaults.yaml see_memory_usage_s).
HOST_SIGMA = 0.25
# Draws per band, in every command (run, compare, sweep, plan, validate, the API): scrambled Sobol points
# (quasi_normals), the band read from the draws' log-mean and log-spread (Interval.of). On five cases
# (preset:default and GPT-3 1.3B steps; BinSGDM on BERT-Base, 1-bit Adam on InfiniBand at 128 GPUs and on
# Ethernet at 64: speedups) the P10 and P90 of 32 draws were within 1.5% of 1,024 draws'; 16 Sobol draws
# moved up to 6%, and independent draws' sorted 2nd and 15th of 16 up to 6% (8 draws: 13%).
DEFAULT_SAMPLES = 32
QUANTILES = (0.1, 0.5, 0.9)
# The most draws a band takes: every command's --samples limit and the API's.
MAX_SAMPLES = 1000


def draws_refusal(samples: int) -> str | None:
    """Why ``samples`` draws make no band (None when they do): a P10-P90 of one draw is that draw, a
    band of zero width beside an estimate it need not contain (the draw moves every uncertain parameter;
    the estimate takes their nominal values), so 1 is refused by every command, the API and a sweep
    file's `samples`, in these words."""
    if samples == 1:
        return "a P10–P90 needs at least 2 draws; 0 turns the band off"
    return None


_Z90 = 1.2815515655446004  # the standard normal's P90: a lognormal's P10-P90 is exp(mu -+ _Z90 sigma)


@dataclass(frozen=True)
class Interval:
    p10: float
    p50: float
    p90: float
    samples: int

    def as_dict(self) -> dict:
        return {"p10": self.p10, "p50": self.p50, "p90": self.p90, "samples": self.samples}

    @classmethod
    def of(cls, values, floor: float | None = None) -> "Interval":
        """P10/P50/P90 of draws of a positive quantity (a time, a speedup, a bandwidth) from the mean
        and spread of their logarithms, as a lognormal's: exp(mu -+ 1.2816 sigma). Every uncertain
        input is lognormal and a step is near a product of such factors, so the draws' moments carry
        the band, and converge far faster than the 2nd and 15th of 16 sorted draws do (DEFAULT_SAMPLES).
        Draws that are not all positive get Hazen's empirical quantiles. ``floor``: the least value
        the quantity can take (a collective's bytes over its links at their peak rates), where draws
        stop: the lognormal read of draws piled up there would reach below it, so no quantile does."""
        v = np.asarray(values, dtype=float)
        if len(v) and np.all(v > 0):
            logs = np.log(v)
            mu, sigma = float(logs.mean()), float(logs.std())
            q = np.exp([mu - _Z90 * sigma, mu, mu + _Z90 * sigma])
        else:
            q = np.quantile(v, QUANTILES, method="hazen")
        if floor is not None:
            q = np.maximum(q, floor)
        return cls(float(q[0]), float(q[1]), float(q[2]), len(v))

    @classmethod
    def empirical(cls, values) -> "Interval":
        """Hazen's empirical P10/P50/P90 of measurements (rounds of a timed job): what was observed,
        with no distribution assumed, unlike the draws of a model's inputs (``of``)."""
        q = np.quantile(np.asarray(values, dtype=float), QUANTILES, method="hazen")
        return cls(float(q[0]), float(q[1]), float(q[2]), len(values))

    def contains(self, value: float) -> bool:
        return self.p10 <= value <= self.p90


def compute_sigma(ctx: SimulationContext) -> float:
    if ctx.model_compute is not None:
        octaves = octaves_outside(ctx.model_compute, ctx.workload.micro_batch)
        return math.hypot(_model_compute_sigma(ctx.model_compute), EXTRAPOLATION_SIGMA_PER_OCTAVE * octaves)
    if ctx.phases is not None:
        # stated phases (a simulation's assumed step) are exact; the draws then move only the kernels the
        # device prices at its default rates (update, outer kernels), as uncertain as those rates
        return DEFAULT_COMPUTE_SIGMA if ctx.phases.stated else MEASURED_PHASES_SIGMA
    if ctx.transferred_from is not None:
        if ctx.carry_sigma is None:
            return TRANSFERRED_COMPUTE_SIGMA
        return math.hypot(ctx.carry_sigma, SESSION_SIGMA)
    models = ctx.profile.compute_model if ctx.profile is not None else {}
    model = models.get(ctx.precision)
    if model is not None:
        # the scatter about the fit, and how far it carried to shapes it was not fitted on
        transfer = model.holdout.median_abs_rel_error if model.holdout else 0.0
        sigma = math.hypot(model.log_sigma, transfer)
        if _code_unmeasured(ctx):
            # the GEMM model prices the device's GEMMs; the rest of the step (the host's dispatch, the
            # code's other kernels: its convolutions, normalisation, fusion) is at the default rates and
            # as uncertain as they are
            sigma = max(sigma, DEFAULT_COMPUTE_SIGMA)
        return sigma
    return DEFAULT_COMPUTE_SIGMA


def _code_unmeasured(ctx: SimulationContext) -> bool:
    """Whether no measurement of the scenario's code at its precision prices it: neither a model's
    phases nor per-op rates of that code (the profile's dispatch rates apply only to the code they were
    measured on, and say nothing of another precision's casts and kernels: a tiny BERT's bf16 step on a
    CPU came out 24% faster than measured from its code's fp32 rates, with a GEMM model at bf16)."""
    return not ctx.dispatch.source.startswith("measured") or dispatch_precision(ctx) is not None


def _model_compute_sigma(mc) -> float:
    """A model's own measurement: the held-out micro-batch's error is how far the fitted lines carry
    (at least the run-to-run spread of a timed step, RUN_TO_RUN), and the measurement is one session's
    draw of a step that moves between sessions (SESSION_SIGMA). One imported trace has no hold-out:
    its band is how far such imports carried (IMPORTED_TRACE_SIGMA)."""
    if mc.holdout is None:
        return IMPORTED_TRACE_SIGMA
    return math.hypot(max(abs(mc.holdout.rel_error), RUN_TO_RUN) / _Z90, SESSION_SIGMA)


def compute_band_source(ctx: SimulationContext) -> str:
    """One line for `run`: how wide the compute part of the band is, and why."""
    sigma = compute_sigma(ctx)
    width = _width(sigma)
    if ctx.model_compute is not None:
        h = ctx.model_compute.holdout
        why = "one imported trace, whose steps came within 2-22% of the unprofiled ones"
        if h is not None:
            why = (
                f"held-out micro-batch {h.micro_batch} predicted within {abs(h.rel_error):.1%}, and a "
                "session's steps move about their median by 10% (root mean square)"
            )
        octaves = octaves_outside(ctx.model_compute, ctx.workload.micro_batch)
        if octaves > 0:
            why += (
                f"; micro-batch {ctx.workload.micro_batch} is {octaves:.1f} octaves outside the measured "
                f"ones, and imported traces' log errors grew by {EXTRAPOLATION_SIGMA_PER_OCTAVE:.2f} per "
                "octave outside theirs"
            )
        return f"{width} (P10-P90): {why}"
    if ctx.phases is not None and ctx.phases.compute_only:
        return (
            "none: the profile's forward/backward are a stated step time, exact, and its compute_only "
            "step prices nothing else (only the network's draws move the step)"
        )
    if ctx.phases is not None and ctx.phases.stated:
        return (
            f"{width} (P10-P90) on the kernels the device prices (update, casts, compression), at default "
            "rates; the profile's forward/backward are a stated step time, exact"
        )
    if ctx.phases is not None:
        return f"{width} (P10-P90): measured phases, two measurements of one step differ ~10%"
    source = ctx.transferred_from
    if source is not None:
        own = ctx.carry_same_model
        what = f"its own measurement at sequence length {source.seq_len}" if own else f"{source.model}'s"
        if ctx.carry_sigma is None:
            return (
                f"{width} (P10-P90): rates carried over from {what}; the profile holds no other measured "
                "model of that code to test such a carry on, and such carried predictions came within "
                "2-26% of measured steps"
            )
        return (
            f"{width} (P10-P90): rates carried over from {what}; carried predictions of the profile's "
            f"measured models of that code erred by {ctx.carry_sigma:.2f} in log (root mean square, a "
            f"factor of {math.exp(ctx.carry_sigma):.2f}), and a session's steps move about their median "
            "by 10%"
        )
    if ctx.profile is not None and ctx.profile.compute_model:
        measured_at = dispatch_precision(ctx)
        if measured_at is not None:
            return (
                f"{width} (P10-P90): GEMMs from the profile's GEMM model; the host's dispatch at rates "
                f"measured at {measured_at}, not the scenario's {ctx.precision}: as wide as the defaults' "
                "band"
            )
        if _code_unmeasured(ctx):
            return (
                f"{width} (P10-P90): GEMMs from the profile's GEMM model; the rest at the default rates "
                "(the profile measured none of this model's code), as wide as the defaults' band"
            )
        return f"{width} (P10-P90): the profile's GEMM model, its scatter and hold-out error"
    return (
        f"{width} (P10-P90): default compute rates, from their errors against published and measured "
        "single-GPU steps (`clustersim calibrate model` measures this model and narrows it)"
    )


def host_band_source() -> str:
    """One line for `run` where the host does CPU work: how wide the host part of the band is, and why."""
    return (
        f"{_width(HOST_SIGMA)} (P10-P90) on the host's CPU and memory time (CPU optimizer, "
        "pageable copies, page faults, memory reports): the published page-fault costs span it"
    )


def _width(sigma: float) -> str:
    """A lognormal's P10/P90 about its median, as "-19%/+23%"."""
    return f"-{1 - math.exp(-_Z90 * sigma):.0%}/+{math.exp(_Z90 * sigma) - 1:.0%}"


def network_band_source(ctx: SimulationContext) -> str | None:
    """One line for `run`: how wide the network's part of the band is per link class, and why; None
    without a collective (one GPU)."""
    from clustersim.cost_models.network_params import DEFAULT_SIGMA

    c = ctx.scenario.cluster
    if c.world_size <= 1:
        return None
    params = ctx.collectives.params
    classes = ctx.collectives.classes(GroupShape(max(2, c.nodes), c.gpus_per_node))
    used = [k for k in classes if c.nodes > 1 or not k.startswith("net_")]
    parts = []
    for k in used:
        if k in params.calibrated_classes:
            continue
        sigma = DEFAULT_SIGMA["bw_eff.net" if k.startswith("net_") else "bw_eff.intra"]
        parts.append(f"{k} rate {_width(sigma)}")
    if parts:
        parts.append(f"per-hop latency {_width(DEFAULT_SIGMA['hop_s'])} (P10-P90)")
    said = ", ".join(parts)
    calibrated = sorted(k for k in used if k in params.calibrated_classes)
    if calibrated:
        spread = ", each op's measured run-to-run spread, wider past its largest measured size"
        said += ("; " if said else "") + (
            f"{', '.join(calibrated)}: the profile's fit (its covariance and residual scatter"
            + (spread if params.spread else "")
            + ")"
        )
    if any(k.startswith("net_") and k not in params.calibrated_classes for k in used):
        said += (
            "; the network's is the documented default (log-sigma 0.20, docs/uncertainty.md), which a "
            "measured effective_gbps keeps: what a collective draws from a NIC is not what iperf's one "
            "stream measures (NCCL's ring drew 4.8 Gb/s on the 1-bit Adam cluster whose iperf read 4.1); "
            "`calibrate run` measures it"
        )
    return said


def perturbations(ctx: SimulationContext, n: int, seed: int = 0) -> list[Perturbation]:
    """``n`` draws of the uncertain parameters of this context's models (quasi_normals: the first
    column is the compute factor, the others the collective model's parameters)."""
    model = ctx.collectives
    # Every class the cluster has, whatever this run's size, so that the same seed gives the same
    # draws to every size and optimizer on this cluster (paired comparisons, break-even).
    g = ctx.scenario.cluster.gpus_per_node
    classes = model.classes(GroupShape(max(2, ctx.scenario.cluster.nodes), g))
    z = quasi_normals(n, 1 + model.params.dimensions(classes), seed)
    nets = model.params.from_normals(z[:, 1:], classes)
    scales = np.exp(compute_sigma(ctx) * z[:, 0])
    # the host's factor from its own sequence (seed + 1), so that every other draw is what it is without
    # it, and a run whose host does no CPU work keeps its band
    hosts = np.exp(HOST_SIGMA * quasi_normals(n, 1, seed + 1)[:, 0])
    # the page-fault cost from a third sequence: the kernel's fault path is not the CPU's rates, so a
    # ratio of a faulting run over one that does not fault keeps its uncertainty
    faults = np.exp(HOST_SIGMA * quasi_normals(n, 1, seed + 2)[:, 0])
    return [
        Perturbation(net, float(s), float(h), float(f)) for net, s, h, f in zip(nets, scales, hosts, faults)
    ]


def quasi_normals(n: int, d: int, seed: int = 0) -> np.ndarray:
    """``n`` x ``d`` standard normal draws: the first ``n`` points of a scrambled Sobol sequence (a fixed
    seed: the same inputs give the same draws in every command), through the normal's inverse CDF.
    Sobol points fill the d-dimensional cube far more evenly than independent draws, so the moments of
    a smooth output converge about as 1/n instead of 1/sqrt(n); its balance holds at powers of two,
    hence DEFAULT_SAMPLES = 32."""
    from scipy.special import ndtri  # here, not at import: scipy.special costs every CLI start ~0.15 s
    from scipy.stats import qmc

    m = max(0, math.ceil(math.log2(max(n, 1))))
    u = qmc.Sobol(d, scramble=True, seed=seed).random_base2(m)[:n]
    return ndtri(u)


def collective_interval(
    ctx: SimulationContext, op: str, nbytes: float, shape, algorithm: str, samples: int = 200, seed: int = 0
) -> Interval:
    """P10/P50/P90 of one collective's time under the collective model's parameter uncertainty, never
    under the least time a draw may take (CollectiveModel.floor: its bytes at the links' peak rates).

    The band is read from the draws before any is stopped there, its quantiles then raised to the floor:
    a quantile of a time stopped at a floor is the floor or the unstopped time's quantile, whichever is
    larger, whereas the lognormal read of draws piled up at the floor (Interval.of) would move the P50
    up and the P90 down with no slow draw changed."""
    from dataclasses import replace

    from clustersim.cost_models.collectives import CollectiveModel

    rng = np.random.default_rng(seed)
    classes = ctx.collectives.classes(shape)
    times = []
    for params in ctx.collectives.params.sample(rng, samples, classes):
        model = CollectiveModel(ctx.cluster, ctx.collectives.measured, replace(params, floors=None))
        times.append(model.cost(op, nbytes, shape, algorithm).time)
    return Interval.of(times, floor=ctx.collectives.floor(op, nbytes, shape, algorithm))
