"""How sure a prediction is: P10 / P50 / P90 by propagating parameter uncertainty through the simulator.

What is uncertain, and how wide:
* **Collectives.** With a calibrated network model, its fitted parameters are drawn from their
  covariance (log space) and each draw also carries the measured scatter of medians about the
  model (network_params.NetworkParams.sample). Link classes the profile did not measure, and every
  class without a profile, get the documented default widths (network_params.DEFAULT_SIGMA).
* **Compute.** The device's time gets one lognormal factor per draw: forward, backward, their host
  dispatch and every other kernel pass on the device (optimizer update, casts and copies, compression
  kernels), since a device that runs slower than calibrated runs all of its work slower. Its width is
  the profile's compute-model uncertainty when it has one, MEASURED_PHASES_SIGMA when forward/backward
  were measured for this very model, and otherwise DEFAULT_COMPUTE_SIGMA. The factors are drawn one
  per equal-probability stratum (a Latin hypercube in one dimension), in random order: with the 8 or
  16 draws a run makes, independent draws from a fixed seed gave a band centred 5-8% slow of the
  prediction (P10-P90 of the factor 0.89-1.46 where the distribution's is 0.73-1.38).
* **Host.** The host's CPU and memory work (simulator/host.py: the CPU optimizer's rate, streaming
  passes such as a CPU upcast, the driver's pageable copies, page faults, DeepSpeed's memory reports)
  gets one lognormal factor per draw, independent of the device's, of width HOST_SIGMA. It changes
  nothing where the host does no such work (no offload), so those runs' bands are as before.

Each draw rebuilds the cost models and re-runs the whole discrete-event simulation, so overlap,
bucket timing and offload interleaving respond to the perturbation exactly as they would to a real
change; quantiles are taken over the draws (a fixed seed keeps outputs reproducible). The band is
the uncertainty of the *model's parameters* and of repeated measurements, not of things the model
does not contain (stragglers, other jobs on the fabric).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from clustersim.simulator.context import Perturbation, SimulationContext
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
# A model priced with another measured model's ratios (calibrate model / import-trace of one model,
# carried to another on the same device): the errors of such predictions against measured steps were
# 2%, 12%, 12%, 14% (Hugging Face GPT-2 XL's measurement on an H100 carried to BERT-Large at 16 and 64
# and to GPT-3 XL at 1 and 2) and 26% (clustersim's BERT-Large build on an H200 carried to Hugging
# Face's BERT-Base at 32); exp(+-1.2816 x 0.15) = -17%..+21% holds four of the five.
TRANSFERRED_COMPUTE_SIGMA = 0.15
# The same step timed in separate runs of one session moved by a median of 5% (the largest deviation
# from the runs' median; 19 steps on an H200 and an H100, validation/data/gpu_steps.yaml), by up to
# 30% where the host thread sets the pace: a measured model's band is never narrower than that median.
RUN_TO_RUN = 0.05
# A model's compute from one imported trace (calibrate import-trace: one micro-batch, no hold-out):
# such imports predicted their own unprofiled steps within +3% (BERT-Large, H200), -9% (ResNet-50),
# +2% (BERT-Base, with --step-time) and +22% (GPT-2 XL, whose profiler cost per op was uneven between
# forward and backward); exp(+-1.2816 x 0.18) = -21%..+26% holds all four.
IMPORTED_TRACE_SIGMA = 0.18
# Default log-sigma of the host's CPU and memory rates (CPU Adam, pageable copies, page faults, memory
# reports), which the hosts of published runs seldom name: the published single-thread demand-zero
# page fault costs 1.0 and 1.9 us (hardware_defaults.yaml host.first_touch_s_per_page) are the
# default's P10 and P90 at this width (exp(+-1.2816 x 0.25) = x0.73..x1.38 about 1.4 us); the default
# CPU Adam rate (1.51e9/s, one H100 node's) and a 16-core H100 host's measured 1.69e9/s differ by
# 11%; DeepSpeed's memory report took 0.085 s and 0.14 s per call in the two logs we hold
# (hardware_defaults.yaml see_memory_usage_s).
HOST_SIGMA = 0.25
DEFAULT_SAMPLES = 16
QUANTILES = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class Interval:
    p10: float
    p50: float
    p90: float
    samples: int

    def as_dict(self) -> dict:
        return {"p10": self.p10, "p50": self.p50, "p90": self.p90, "samples": self.samples}

    @classmethod
    def of(cls, values) -> "Interval":
        # the i-th of n sorted draws stands for probability (i + 0.5) / n, as a stratified draw does
        # (stratified_normal): Hazen's plotting position, not numpy's default (i / (n - 1)), which puts
        # the P10 and P90 of 16 draws inside the distribution's
        q = np.quantile(np.asarray(values, dtype=float), QUANTILES, method="hazen")
        return cls(float(q[0]), float(q[1]), float(q[2]), len(values))

    def contains(self, value: float) -> bool:
        return self.p10 <= value <= self.p90


def compute_sigma(ctx: SimulationContext) -> float:
    if ctx.model_compute is not None:
        return _model_compute_sigma(ctx.model_compute)
    if ctx.phases is not None:
        return MEASURED_PHASES_SIGMA
    if ctx.transferred_from is not None:
        return TRANSFERRED_COMPUTE_SIGMA
    models = ctx.profile.compute_model if ctx.profile is not None else {}
    model = models.get(ctx.precision)
    if model is not None:
        # the scatter about the fit, and how far it carried to shapes it was not fitted on
        transfer = model.holdout.median_abs_rel_error if model.holdout else 0.0
        return math.hypot(model.log_sigma, transfer)
    return DEFAULT_COMPUTE_SIGMA


# A lognormal factor's P10-P90 is exp(+-1.2816 sigma).
_Z90 = 1.2816


def _model_compute_sigma(mc) -> float:
    """A model's own measurement: the held-out micro-batch's error is how far the fitted lines carry,
    so the band is +- that (at least the run-to-run spread of a timed step, RUN_TO_RUN). One imported
    trace has no hold-out: its band is how far such imports carried (IMPORTED_TRACE_SIGMA)."""
    if mc.holdout is None:
        return IMPORTED_TRACE_SIGMA
    return max(abs(mc.holdout.rel_error), RUN_TO_RUN) / _Z90


def compute_band_source(ctx: SimulationContext) -> str:
    """One line for `run`: how wide the compute part of the band is, and why."""
    sigma = compute_sigma(ctx)
    width = f"-{1 - math.exp(-_Z90 * sigma):.0%}/+{math.exp(_Z90 * sigma) - 1:.0%}"  # a lognormal's P10/P90
    if ctx.model_compute is not None:
        h = ctx.model_compute.holdout
        why = "one imported trace, whose steps came within 2-22% of the unprofiled ones"
        if h is not None:
            why = f"held-out micro-batch {h.micro_batch} predicted within {abs(h.rel_error):.1%}"
        return f"{width} (P10-P90): {why}"
    if ctx.phases is not None:
        return f"{width} (P10-P90): measured phases, two measurements of one step differ ~10%"
    source = ctx.transferred_from
    if source is not None:
        return f"{width} (P10-P90): rates carried over from {source.model}'s measurement to another model"
    if ctx.profile is not None and ctx.profile.compute_model:
        return f"{width} (P10-P90): the profile's GEMM model, its scatter and hold-out error"
    return (
        f"{width} (P10-P90): default compute rates, from their errors against published and measured "
        "single-GPU steps (`clustersim calibrate model` measures this model and narrows it)"
    )


def host_band_source() -> str:
    """One line for `run` where the host does CPU work: how wide the host part of the band is, and why."""
    lo, hi = math.exp(-_Z90 * HOST_SIGMA), math.exp(_Z90 * HOST_SIGMA)
    return (
        f"-{1 - lo:.0%}/+{hi - 1:.0%} (P10-P90) on the host's CPU and memory time (CPU optimizer, "
        "pageable copies, page faults, memory reports): the published page-fault costs span it"
    )


def perturbations(ctx: SimulationContext, n: int, seed: int = 0) -> list[Perturbation]:
    """``n`` draws of the uncertain parameters of this context's models."""
    rng = np.random.default_rng(seed)
    model = ctx.collectives
    # Every class the cluster has, whatever this run's size, so that the same seed gives the same
    # draws to every size and optimizer on this cluster (paired comparisons, break-even).
    g = ctx.scenario.cluster.gpus_per_node
    classes = model.classes(GroupShape(max(2, ctx.scenario.cluster.nodes), g))
    nets = model.params.sample(rng, n, classes)
    scales = np.exp(compute_sigma(ctx) * stratified_normal(rng, n))
    # drawn after the device's factors, so that those are the same draws as before host rates were
    # uncertain (and where the host does no CPU work the band is unchanged)
    hosts = np.exp(HOST_SIGMA * stratified_normal(rng, n))
    return [Perturbation(net, float(s), float(h)) for net, s, h in zip(nets, scales, hosts)]


def stratified_normal(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` standard normal draws, one from each of ``n`` equal-probability strata, in random order
    (Latin hypercube sampling in one dimension). Each is still a draw from the distribution, but their
    quantiles follow its quantiles far more closely than ``n`` independent draws do, which is what a
    P10-P90 band of 8 or 16 draws needs."""
    from scipy.special import ndtri  # here, not at import: scipy.special costs every CLI start ~0.15 s

    u = (rng.permutation(n) + rng.random(n)) / n
    return ndtri(u)


def collective_interval(
    ctx: SimulationContext, op: str, nbytes: float, shape, algorithm: str, samples: int = 200, seed: int = 0
) -> Interval:
    """P10/P50/P90 of one collective's time under the collective model's parameter uncertainty."""
    from clustersim.cost_models.collectives import CollectiveModel

    rng = np.random.default_rng(seed)
    classes = ctx.collectives.classes(shape)
    times = []
    for params in ctx.collectives.params.sample(rng, samples, classes):
        model = CollectiveModel(ctx.cluster, ctx.collectives.measured, params)
        times.append(model.cost(op, nbytes, shape, algorithm).time)
    return Interval.of(times)
