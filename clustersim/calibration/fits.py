"""Measured collective costs from a profile's α-β fits, used ahead of the topology model."""

from __future__ import annotations

import bisect

from clustersim.calibration.profile import CollectiveFit, Profile
from clustersim.cost_models.collectives import CollectiveCost
from clustersim.scenario import ClusterSpec


def _evaluate(fit: CollectiveFit, nbytes: float) -> float:
    starts = [s[0] for s in fit.segments]
    i = max(0, bisect.bisect_right(starts, nbytes) - 1)
    _, alpha, beta = fit.segments[i]
    return alpha + nbytes * beta


class MeasuredCollectives:
    """Fits that apply to this cluster, keyed by (op, nodes, gpus_per_node)."""

    def __init__(self, fits: dict[tuple[str, int, int], CollectiveFit]):
        self.fits = fits

    @classmethod
    def from_profile(cls, profile: Profile, spec: ClusterSpec) -> "MeasuredCollectives | None":
        fits = {(f.op, f.nodes, f.gpus_per_node): f for f in profile.collectives
                if f.nodes <= spec.nodes and f.gpus_per_node <= spec.gpus_per_node}
        return cls(fits) if fits else None

    def predict(self, op: str, nbytes: float, shape) -> CollectiveCost | None:
        fit = self.fits.get((op, shape.nodes, shape.gpus_per_node))
        if fit is None or shape.sharing != 1:
            return None
        p = shape.ranks
        t = _evaluate(fit, nbytes)
        factor = {"all_reduce": 2 * (p - 1) / p, "all_gather": (p - 1) / p, "reduce_scatter": (p - 1) / p,
                  "all_to_all": (p - 1) / p, "broadcast": 1.0}.get(op, 1.0)
        per_rank = factor * nbytes
        inter = per_rank if shape.nodes > 1 else 0.0
        return CollectiveCost(op, nbytes, p, "measured", "fit", t, max(shape.gpus_per_node * per_rank - inter, 0.0),
                              inter, f"measured fit ({fit.source or 'profile'})")
