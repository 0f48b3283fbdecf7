"""Measured collective costs: a profile's exact-shape α-β fits, the first choice of the collective model.

A fit applies only to the group shape it was measured on (same op, nodes and ranks per node, the
group alone on its NICs); every other shape goes to the topology model, calibrated or not. Fits are
plain records here (``op``, ``nodes``, ``gpus_per_node``, ``segments``, ``source``) so this cost
model does not depend on the calibration layer that produces them.
"""

from __future__ import annotations

import bisect

from clustersim.cost_models.closed_forms import busbw_factor
from clustersim.cost_models.collectives import CollectiveCost


def segmented_time(segments, nbytes: float) -> float:
    """``α + S·β`` of the segment whose ``min_bytes`` is the largest not above ``nbytes``."""
    starts = [s[0] for s in segments]
    i = max(0, bisect.bisect_right(starts, nbytes) - 1)
    _, alpha, beta = segments[i]
    return alpha + nbytes * beta


class MeasuredCollectives:
    """Fits that apply to this cluster, keyed by (op, nodes, gpus_per_node)."""

    def __init__(self, fits: dict[tuple[str, int, int], object]):
        self.fits = fits

    @classmethod
    def for_cluster(cls, fits, nodes: int, gpus_per_node: int) -> "MeasuredCollectives | None":
        usable = {
            (f.op, f.nodes, f.gpus_per_node): f
            for f in fits
            if f.nodes <= nodes and f.gpus_per_node <= gpus_per_node
        }
        return cls(usable) if usable else None

    def predict(self, op: str, nbytes: float, shape) -> CollectiveCost | None:
        fit = self.fits.get((op, shape.nodes, shape.gpus_per_node))
        if fit is None or shape.sharing != 1:
            return None
        p = shape.ranks
        per_rank = busbw_factor(op, p) * nbytes
        inter = per_rank if shape.nodes > 1 else 0.0
        origin = fit.source or "profile"
        source = f"measured fit ({origin if len(origin) <= 60 else origin[:57] + '...'})"
        return CollectiveCost(
            op,
            nbytes,
            p,
            "measured",
            "fit",
            segmented_time(fit.segments, nbytes),
            max(shape.gpus_per_node * per_rank - inter, 0.0),
            inter,
            source,
            source,
        )
