"""How sure a prediction is: P10 / P50 / P90 by propagating parameter uncertainty through the simulator.

What is uncertain, and how wide:
* **Collectives.** With a calibrated network model, its fitted parameters are drawn from their
  covariance (log space) and each draw also carries the measured scatter of medians about the
  model (network_params.NetworkParams.sample). Link classes the profile did not measure, and every
  class without a profile, get the documented default widths (network_params.DEFAULT_SIGMA).
* **Compute.** Forward and backward times get one lognormal factor per draw: the profile's
  compute-model uncertainty when it has one, MEASURED_PHASES_SIGMA when forward/backward were
  measured for this very model, and otherwise DEFAULT_COMPUTE_SIGMA.

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

# Default log-sigma of forward/backward time without a measured compute model: the roofline with
# the catalog's 0.7 / 0.8 efficiencies vs measured steps scatters by about 10-15% (docs/validation.md:
# the published single-GPU BERT-Large row implies 178 ms of compute where the paper's own 64-GPU profile
# gives 162 ms, a 10% disagreement between two measurements of one machine).
DEFAULT_COMPUTE_SIGMA = 0.15
# Measured forward/backward phases are medians of another run of the same model: the 1-bit Adam
# paper's two measurements of one V100 step (1-GPU throughput vs its 64-GPU profile) differ by 10%.
MEASURED_PHASES_SIGMA = 0.10
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
        q = np.quantile(np.asarray(values, dtype=float), QUANTILES)
        return cls(float(q[0]), float(q[1]), float(q[2]), len(values))

    def contains(self, value: float) -> bool:
        return self.p10 <= value <= self.p90


def compute_sigma(ctx: SimulationContext) -> float:
    if ctx.phases is not None:
        return MEASURED_PHASES_SIGMA
    models = ctx.profile.compute_model if ctx.profile is not None else {}
    model = models.get(ctx.precision)
    if model is not None:
        # the scatter about the fit, and how far it carried to shapes it was not fitted on
        transfer = model.holdout.median_abs_rel_error if model.holdout else 0.0
        return math.hypot(model.log_sigma, transfer)
    return DEFAULT_COMPUTE_SIGMA


def perturbations(ctx: SimulationContext, n: int, seed: int = 0) -> list[Perturbation]:
    """``n`` draws of the uncertain parameters of this context's models."""
    rng = np.random.default_rng(seed)
    model = ctx.collectives
    # Every class the cluster has, whatever this run's size, so that the same seed gives the same
    # draws to every size and optimizer on this cluster (paired comparisons, break-even).
    g = ctx.scenario.cluster.gpus_per_node
    classes = model.classes(GroupShape(max(2, ctx.scenario.cluster.nodes), g))
    nets = model.params.sample(rng, n, classes)
    scales = np.exp(rng.normal(0.0, compute_sigma(ctx), size=n))
    return [Perturbation(net, float(s)) for net, s in zip(nets, scales)]


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
