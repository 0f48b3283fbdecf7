"""Measured collective costs: a profile's exact-shape α-β fits, the first choice of the collective model.

A fit applies only to the group shape it was measured on (same op, nodes and ranks per node, the
group alone on its NICs) and only on the hardware it was measured on: a fit replays a time, so on
another GPU, intra-node fabric, NIC (kind, count, line rate) or switch fabric it would answer a
what-if ("and with 100 GbE?") with today's number. Where the scenario's hardware differs in a part
the group uses, the fit is skipped and the topology model, with the profile's fitted parameters,
prices the scenario's own links. Fits are plain records here (``op``, ``nodes``, ``gpus_per_node``,
``segments``, ``source``) so this cost model does not depend on the calibration layer that produces
them; the measured cluster is the scenario-schema dict the calibration recorded.
"""

from __future__ import annotations

import bisect

from clustersim.cost_models.closed_forms import busbw_factor
from clustersim.cost_models.collectives import CollectiveCost
from clustersim.scenario import ClusterSpec, FabricSpec, IntraNodeSpec, NicSpec


def segmented_time(segments, nbytes: float) -> float:
    """``α + S·β`` of the segment whose ``min_bytes`` is the largest not above ``nbytes``."""
    starts = [s[0] for s in segments]
    i = max(0, bisect.bisect_right(starts, nbytes) - 1)
    _, alpha, beta = segments[i]
    return alpha + nbytes * beta


def _gbps(v) -> str:
    return f"{v:g} Gb/s"


def _fabric(f: FabricSpec) -> str:
    if f.kind == "single_switch":
        return "single switch"
    return f"leaf-spine, {f.nodes_per_leaf} nodes per leaf, {f.oversubscription:g}:1"


def hardware_differences(measured: dict, cluster: ClusterSpec) -> dict[str, list[str]]:
    """What differs between the cluster a profile was measured on (``measured``, the scenario
    schema's ``cluster`` as the calibration recorded it) and ``cluster``, by the part of a group it
    concerns: ``device`` (every group), ``intra`` (groups with several GPUs per node), ``nic`` and
    ``fabric`` (groups across nodes; the switch fabric only past one leaf). Each entry reads
    'NIC line rate 10 Gb/s here, 0.2 Gb/s measured'. Node counts are not compared: a fit's own group
    shape is matched per collective."""
    m_gpu = measured.get("gpu")
    m_gpu = m_gpu.get("name") if isinstance(m_gpu, dict) else m_gpu
    out: dict[str, list[str]] = {"device": [], "intra": [], "nic": [], "fabric": []}
    if m_gpu and m_gpu != cluster.gpu_name:
        out["device"].append(f"device {cluster.gpu_name} here, {m_gpu} measured")
    m_intra = IntraNodeSpec.model_validate(measured.get("intra_node") or {})
    if m_intra.fabric != cluster.intra_node.fabric:
        out["intra"].append(f"intra-node fabric {cluster.intra_node.fabric} here, {m_intra.fabric} measured")
    m_nic, nic = NicSpec.model_validate(measured.get("nic") or {}), cluster.nic
    for label, field, fmt in (
        ("NIC kind", "kind", str),
        ("NICs per node", "count", str),
        ("NIC line rate", "line_rate_gbps", _gbps),
        ("NIC measured throughput", "effective_gbps", lambda v: "unset" if v is None else _gbps(v)),
    ):
        a, b = getattr(nic, field), getattr(m_nic, field)
        if a != b:
            out["nic"].append(f"{label} {fmt(a)} here, {fmt(b)} measured")
    m_fab, fab = FabricSpec.model_validate(measured.get("fabric") or {}), cluster.fabric
    if m_fab != fab and not (m_fab.kind == fab.kind == "single_switch"):
        out["fabric"].append(f"switch fabric {_fabric(fab)} here, {_fabric(m_fab)} measured")
    return {k: v for k, v in out.items() if v}


def _parts_used(shape, fabric_leaf: int | None) -> tuple[str, ...]:
    """The parts of the hardware a group of this shape runs on (hardware_differences' keys)."""
    parts = ["device"]
    if shape.gpus_per_node > 1:
        parts.append("intra")
    if shape.nodes > 1:
        parts.append("nic")
        if fabric_leaf is None or shape.nodes > fabric_leaf:
            parts.append("fabric")
    return tuple(parts)


class MeasuredCollectives:
    """Fits that apply to this cluster, keyed by (op, nodes, gpus_per_node). ``differences``
    (hardware_differences) names what differs from the measured hardware; a fit is skipped for a
    group that uses a differing part, and ``skipped`` collects those parts' descriptions."""

    def __init__(
        self,
        fits: dict[tuple[str, int, int], object],
        differences: dict[str, list[str]] | None = None,
        fabric_leaf: int | None = None,
    ):
        self.fits = fits
        self.differences = differences or {}
        self.fabric_leaf = fabric_leaf
        self.skipped: set[str] = set()

    @classmethod
    def for_cluster(cls, fits, cluster: ClusterSpec, measured: dict | None) -> "MeasuredCollectives | None":
        """The fits usable on ``cluster`` (a group no larger than it), knowing the hardware they
        were measured on (``measured``; None where the profile does not record it: then every
        fit of a matching shape is used, as measured)."""
        usable = {
            (f.op, f.nodes, f.gpus_per_node): f
            for f in fits
            if f.nodes <= cluster.nodes and f.gpus_per_node <= cluster.gpus_per_node
        }
        if not usable:
            return None
        if measured is None:
            return cls(usable)
        m_fab = FabricSpec.model_validate(measured.get("fabric") or {})
        leaves = [f.nodes_per_leaf for f in (m_fab, cluster.fabric) if f.kind == "leaf_spine"]
        return cls(usable, hardware_differences(measured, cluster), min(leaves) if leaves else None)

    def relevant_differences(self, shape) -> list[str]:
        """What differs from the measured hardware in the parts a group of this shape uses."""
        return [d for part in _parts_used(shape, self.fabric_leaf) for d in self.differences.get(part, ())]

    def size_range(self, op: str, shape) -> tuple[float, float] | None:
        """The smallest and largest size this shape's fit of ``op`` measured (its per-size table);
        None where the fit does not record them."""
        fit = self.fits.get((op, shape.nodes, shape.gpus_per_node))
        sizes = [b for b, _ in getattr(fit, "busbw_by_size", None) or ()]
        return (min(sizes), max(sizes)) if sizes else None

    def predict(self, op: str, nbytes: float, shape) -> CollectiveCost | None:
        fit = self.fits.get((op, shape.nodes, shape.gpus_per_node))
        if fit is None or shape.sharing != 1:
            return None
        differs = self.relevant_differences(shape)
        if differs:
            self.skipped.update(differs)
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
