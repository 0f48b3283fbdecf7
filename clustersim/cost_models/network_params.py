"""The parameters of the topology-aware collective model, default or calibrated.

The collective model multiplies each modelled link bandwidth and per-hop latency by these numbers,
so one set of parameters fitted on a few nodes applies to any group shape: bandwidths still come
from the topology (ring bottleneck, NIC injection, oversubscription) and step counts from the
algorithm, only the per-link-class efficiency and latency are measured.

Link classes: ``nvlink`` and ``pcie`` inside a node, ``net_<nic kind>`` (``net_ethernet_tcp``,
``net_infiniband``) between nodes. Per op, ``op_bw_eff`` and ``op_latency_scale`` capture what a
collective does beyond moving its bytes over the ring bottleneck (all-to-all's many concurrent
flows, per-message overheads of a software stack such as gloo's TCP transport).

Uncertainty: the parameters come with a covariance of their logarithms (from the fit, or the
documented default widths below), and ``scatter`` carries the scatter of measured medians around
the fitted model, the run-to-run spread measured at each size and a growth past the largest measured
size and past the largest measured node count. ``sample`` draws parameter sets from that distribution;
propagating each through the simulator gives the prediction's P10/P50/P90 (simulator/uncertainty.py).
A draw never makes a collective faster than its bytes at the links' peak rates (DrawFloors,
collectives.CollectiveModel.floor).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace

import numpy as np

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")

# Default widths (standard deviations of the natural log) used when no calibration is given.
# * Network links: predictions of real gloo collectives on a shaped TCP network from the line rate
#   alone were 12-17% off at the median and up to 40% for all-to-all (issue #9 measurement), so a
#   log-sigma of 0.20 puts about two thirds of cases within +-20%.
# * NVLink / PCIe: the topology model gives H100 8-GPU ring busbw 370.8 GB/s vs published 360-370,
#   A100 240 vs 228-235 (docs/uncertainty.md): 3-5% off; 0.10 is a conservative width.
# * Per-hop latency: NCCL's own tuning constants are coarse (tuning.cc); a factor of ~1.6 (0.5).
DEFAULT_SIGMA = {"bw_eff.net": 0.20, "bw_eff.intra": 0.10, "hop_s": 0.5}
# How a calibrated collective's band widens past the largest size its fit measured: this log-sigma per
# e-fold of the ratio (ln(bytes / largest measured)), added in quadrature to the run-to-run spread.
# Measured on the shipped testbed sweeps (16 files: 1-32 MiB at 2-8 hosts, and the 4 KiB-8 MiB sweeps
# of the `testbed validate` runs), each fitted on its small sizes only (up to 1/8 and up to 1/64 of its
# largest, on 2 hosts and on 2+4 hosts) and predicting its larger measured ones: 1,206 predictions at
# 1.1-64x the largest fitted size. Without growth 69% of the measured medians fell inside the predicted
# P10-P90 (87% of those fitted up to 1/8; 58% of those fitted up to 1/64, whose large sizes ran up to
# 3x slower than the small sizes' fit said: a bottleneck the small sizes do not show); 0.175 is the
# value that puts 80% of all of them inside (94% and 72%). benchmarks/network_band_evidence.py.
SIZE_EXTRAPOLATION_SIGMA = 0.175
# How a calibrated collective's band widens past the largest node count its fit measured: this log-sigma
# per e-fold of the ratio (ln(nodes / largest measured nodes)), added in quadrature as the size growth
# is; a group within the measured node counts gets none, nor does a fit that measured no inter-node
# group (its network links keep the default widths). Measured on the same 16 shipped testbed sweeps
# (2, 4 and 8 hosts each), each fitted on every set of its smaller host counts and predicting every
# larger one held out (2 -> 4, 2 -> 8, 4 -> 8, 2+4 -> 8: 2,208 predictions at 2x and 4x the largest
# fitted node count). Without growth 77% of the measured medians fell inside the predicted P10-P90
# (72-78% of the single-count fits, 81% of the 2+4-host ones), against 88% of the same fits' held-out
# medians inside the measured node counts (2+8 -> 4); the 2-host fits' log error grew from rms 0.56 at
# 2x to 0.78 at 4x. 0.18 is the value that puts 80% of all of them inside.
# benchmarks/network_band_evidence.py, section 3.
NODE_EXTRAPOLATION_SIGMA = 0.18


class DrawFloors:
    """What the draws of one parameter set share: that nominal set and, per cluster, the collective model
    at it (filled by collectives.CollectiveModel), which prices the least time each collective may take
    in a draw once per collective shape for every draw, not once per draw. A copy (pickled to another
    process) starts with no models."""

    def __init__(self, nominal: "NetworkParams"):
        self.nominal = nominal
        self.models: dict = {}  # Cluster -> CollectiveModel at the nominal parameters

    def __reduce__(self):
        return DrawFloors, (self.nominal,)


def class_key(latency_class: str, nic_kind: str) -> str:
    """The calibration class of a link: ``network`` is split by NIC kind (TCP and InfiniBand differ)."""
    return f"net_{nic_kind}" if latency_class == "network" else latency_class


@dataclass(frozen=True)
class NetworkParams:
    """Multipliers and latencies the collective model applies on top of the topology.

    Empty mappings mean "the documented defaults": efficiency 1 (the catalog already holds the
    achievable fraction of line rate) and NCCL's latency table.
    """

    hop_s: dict[str, float] = field(default_factory=dict)  # class -> Simple-protocol hop latency, s
    bw_eff: dict[str, float] = field(default_factory=dict)  # class -> multiplier on modelled bandwidth
    base_s: float | None = None  # per-collective launch, Simple protocol
    op_bw_eff: dict[str, float] = field(default_factory=dict)  # op -> multiplier on bandwidth
    op_latency_scale: dict[str, float] = field(default_factory=dict)
    algorithms: dict[str, str] = field(default_factory=dict)  # op -> algorithm the backend runs
    protocols: tuple[str, ...] | None = None  # None: NCCL's protocol choice
    hop_scale: dict[str, float] = field(default_factory=dict)  # class -> multiplier on hop latency
    # class (net_<nic kind>) -> per-chunk spread of a node's rate, pacing lockstep collectives
    # (closed_forms.paced_factor); absent: the cluster's (cluster.nic.pacing_cv or its kind's default)
    pacing_cv: dict[str, float] = field(default_factory=dict)
    source: str = "topology model, default constants"
    calibrated: bool = False
    # Uncertainty: names of log-parameters, their mean and covariance, plus the log-sigma of the
    # residual scatter. Names: "base_s", "hop_s.<class>", "bw_eff.<class>", "op_bw_eff.<op>",
    # "op_latency_scale.<op>", "pacing_cv.<class>".
    names: tuple[str, ...] = ()
    log_mean: tuple[float, ...] = ()
    log_cov: tuple[tuple[float, ...], ...] = ()
    residual_sigma: float = 0.0
    calibrated_classes: tuple[str, ...] = ()
    # op -> ((bytes, log-sigma of one repetition), ...) ascending: the sizes the fit measured and the
    # run-to-run spread there (calibration/network_fit.measured_spread); empty: not recorded
    spread: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    # the node counts the fit measured (ascending; the profile's network.shapes); empty: not recorded
    measured_nodes: tuple[int, ...] = ()
    # This draw's standard normals (nominal: 0). ``scatter_z`` moves every collective together by the
    # scatter of medians about the model (a misfit of the model is the same in every collective);
    # ``op_z`` each op apart by its run-to-run spread and its extrapolation (scatter): on the emulated
    # testbed the session-to-session shifts of one op's 1-8 MiB medians and another's correlated by
    # 0.18, of one op's small and large sizes by 0.4 (nine sweeps of one machine, docs/calibration.md)
    scatter_z: float = 0.0
    op_z: dict[str, float] = field(default_factory=dict)
    # Set on a draw (from_normals, sample), None on the nominal set: a draw's link rates stop at their
    # peaks and its collectives at the time their bytes take at those rates (collectives.CollectiveModel)
    floors: DrawFloors | None = field(default=None, compare=False, repr=False)

    @classmethod
    def from_calibration(cls, cal, label: str) -> "NetworkParams":
        """Parameters from a profile's ``network`` section (calibration/profile.py NetworkCalibration)."""
        names = tuple(cal.parameters)
        base = cls(
            algorithms=dict(cal.algorithms),
            protocols=tuple(cal.protocols) if cal.protocols else None,
            source=f"topology model, calibrated ({label})",
            calibrated=True,
            names=names,
            log_mean=tuple(math.log(v) for v in cal.parameters.values()),
            log_cov=tuple(tuple(row) for row in cal.log_covariance),
            residual_sigma=cal.residual_sigma,
            calibrated_classes=tuple(cal.calibrated_classes),
            spread={op: tuple((float(b), float(v)) for b, v in table) for op, table in cal.spread.items()},
            measured_nodes=tuple(sorted({int(n) for n, _ in cal.shapes})),
        )
        return base.with_values(names, cal.parameters.values())

    def measured_range(self, op: str) -> tuple[float, float] | None:
        """The smallest and largest size the fit measured ``op`` at; None where not recorded."""
        table = self.spread.get(op)
        return (table[0][0], table[-1][0]) if table else None

    def unmeasured(self, op: str) -> bool:
        """Whether a calibrated fit that records its ops' spreads never measured ``op`` (a fit without
        that record, an older profile's, says nothing either way)."""
        return self.calibrated and bool(self.spread) and op not in self.spread

    def nodes_past(self, nodes: int) -> int | None:
        """The largest node count the fit measured, where a group of ``nodes`` nodes lies past it; None
        within the measured counts, or where the fit measured no inter-node group (its network links are
        then at the default widths, DEFAULT_SIGMA) or did not record its shapes."""
        top = self.measured_nodes[-1] if self.measured_nodes else 0
        return top if 2 <= top < nodes else None

    def spread_sigma(self, op: str, nbytes: float, largest: float | None = None, nodes: int = 1) -> float:
        """Log-sigma of a calibrated collective's time about the fitted model that is this op's own
        (beyond the parameters' covariance and the residual scatter): the run-to-run spread measured at
        the nearest measured size and, past the largest measured size (``largest``, else the fit's own
        for this op), SIZE_EXTRAPOLATION_SIGMA per e-fold of the ratio, and past the largest measured
        node count (a group across ``nodes`` nodes), NODE_EXTRAPOLATION_SIGMA per e-fold of that ratio."""
        table = self.spread.get(op, ())
        run = 0.0
        if table:
            i = bisect.bisect_left(table, (nbytes,))
            near = [table[j] for j in (i - 1, i) if 0 <= j < len(table)]
            run = min(near, key=lambda e: abs(math.log(e[0] / nbytes)))[1]
        top = largest if largest is not None else (table[-1][0] if table else None)
        beyond = SIZE_EXTRAPOLATION_SIGMA * math.log(nbytes / top) if top and nbytes > top else 0.0
        past = self.nodes_past(nodes)
        wider = NODE_EXTRAPOLATION_SIGMA * math.log(nodes / past) if past else 0.0
        return math.hypot(run, beyond, wider)

    def scatter(self, op: str, nbytes: float, largest: float | None = None, nodes: int = 1) -> float:
        """This draw's factor on a calibrated collective's time (1 at the nominal parameters) across
        ``nodes`` nodes: the residual scatter shared by every collective, and this op's own spread
        (spread_sigma)."""
        z = self.op_z.get(op, 0.0)
        if self.scatter_z == 0.0 and z == 0.0:
            return 1.0
        own = z * self.spread_sigma(op, nbytes, largest, nodes) if z else 0.0
        return math.exp(self.scatter_z * self.residual_sigma + own)

    def _spread_ops(self) -> tuple[str, ...]:
        """The ops whose run-to-run spread a draw moves apart (one standard normal each), in order."""
        return tuple(sorted(self.spread))

    def bandwidth_factor(self, cls: str, op: str) -> float:
        return self.bw_eff.get(cls, 1.0) * self.op_bw_eff.get(op, 1.0)

    def with_values(self, names, values) -> "NetworkParams":
        """A copy with the named parameters set (values in linear units)."""
        hop, bw, opbw, oplat, pace = (
            dict(self.hop_s),
            dict(self.bw_eff),
            dict(self.op_bw_eff),
            dict(self.op_latency_scale),
            dict(self.pacing_cv),
        )
        base = self.base_s
        tables = {"hop_s": hop, "bw_eff": bw, "op_bw_eff": opbw, "op_latency_scale": oplat, "pacing_cv": pace}
        for name, value in zip(names, values):
            kind, _, key = name.partition(".")
            if kind == "base_s":
                base = value
            else:
                tables[kind][key] = value
        return replace(
            self, hop_s=hop, bw_eff=bw, base_s=base, op_bw_eff=opbw, op_latency_scale=oplat, pacing_cv=pace
        )

    def dimensions(self, classes: tuple[str, ...] = ()) -> int:
        """Independent standard normals one draw of ``from_normals`` consumes: the calibrated
        parameters, the residual scatter and one per op with a measured spread (when calibrated), then
        a bandwidth and a hop latency per class the calibration did not measure."""
        own = len(self.names) + 1 + len(self.spread) if self.names else 0
        return own + 2 * sum(1 for c in classes if c not in self.calibrated_classes)

    def from_normals(self, z: np.ndarray, classes: tuple[str, ...] = ()) -> list["NetworkParams"]:
        """One parameter set per row of ``z`` (standard normals, ``dimensions(classes)`` columns), as
        ``sample`` draws them: the same distribution, from points the caller chose (quasi-random draws,
        simulator/uncertainty.py) instead of a generator's. Each draw carries ``floors`` (this set, as
        the nominal its collectives' floors are priced at)."""
        z = np.atleast_2d(np.asarray(z, dtype=float))
        col = 0
        if self.names:
            k = len(self.names)
            w, v = np.linalg.eigh(np.asarray(self.log_cov, dtype=float))
            root = v * np.sqrt(np.clip(w, 0.0, None))  # cov = root @ root.T
            draws = np.asarray(self.log_mean) + z[:, :k] @ root.T
            ops = self._spread_ops()
            col = k + 1 + len(ops)
            calibrated = [
                replace(
                    self.with_values(self.names, np.exp(row)),
                    scatter_z=float(zi[k]),
                    op_z={op: float(v) for op, v in zip(ops, zi[k + 1 : col])},
                )
                for row, zi in zip(draws, z)
            ]
        else:
            calibrated = [self] * len(z)
        own = [c for c in classes if c not in self.calibrated_classes]
        floors = DrawFloors(self)
        out = []
        for i, params in enumerate(calibrated):
            bw, hop = dict(params.bw_eff), dict(params.hop_scale)
            for j, cls in enumerate(own):
                sigma = DEFAULT_SIGMA["bw_eff.net" if cls.startswith("net_") else "bw_eff.intra"]
                bw[cls] = bw.get(cls, 1.0) * math.exp(sigma * z[i, col + 2 * j])
                hop[cls] = hop.get(cls, 1.0) * math.exp(DEFAULT_SIGMA["hop_s"] * z[i, col + 2 * j + 1])
            out.append(replace(params, bw_eff=bw, hop_scale=hop, floors=floors))
        return out

    def sample(
        self, rng: np.random.Generator, n: int, classes: tuple[str, ...] = ()
    ) -> list["NetworkParams"]:
        """``n`` parameter sets drawn from this set's uncertainty.

        Calibrated parameters: multivariate normal in log space (the fit's covariance), one standard
        normal ``scatter_z`` per draw for the residual scatter and one per op for its spread. Every
        class in ``classes`` that the calibration did not measure gets independent lognormal factors of
        the documented default widths (DEFAULT_SIGMA) on its bandwidth and hop latency.
        """
        out = []
        if self.names:
            mean = np.asarray(self.log_mean)
            cov = np.asarray(self.log_cov)
            draws = rng.multivariate_normal(mean, cov, size=n, method="eigh")
            scatter = rng.normal(0.0, 1.0, size=n)
            ops = self._spread_ops()
            per_op = rng.normal(0.0, 1.0, size=(n, len(ops)))
            calibrated = [
                replace(
                    self.with_values(self.names, np.exp(row)),
                    scatter_z=float(s),
                    op_z={op: float(v) for op, v in zip(ops, zs)},
                )
                for row, s, zs in zip(draws, scatter, per_op)
            ]
        else:
            calibrated = [self] * n
        floors = DrawFloors(self)
        for params in calibrated:
            bw, hop = dict(params.bw_eff), dict(params.hop_scale)
            for cls in classes:
                if cls in self.calibrated_classes:
                    continue
                sigma = DEFAULT_SIGMA["bw_eff.net" if cls.startswith("net_") else "bw_eff.intra"]
                bw[cls] = bw.get(cls, 1.0) * math.exp(rng.normal(0.0, sigma))
                hop[cls] = hop.get(cls, 1.0) * math.exp(rng.normal(0.0, DEFAULT_SIGMA["hop_s"]))
            out.append(replace(params, bw_eff=bw, hop_scale=hop, floors=floors))
        return out


DEFAULT = NetworkParams()
