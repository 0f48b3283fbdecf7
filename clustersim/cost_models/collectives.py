"""Topology-aware collective costs with NCCL-like algorithm and protocol selection.

Each registered algorithm (collective_algorithms.py) says which latency steps and which bandwidth
legs it needs on a group; this module prices them:

    time = base + sum(steps x hop latency of the class) + sum or max(bytes / (bandwidth x protocol
           efficiency x calibrated efficiency))

with NCCL's constants by default and a calibration's fitted parameters (network_params.py) when a
profile has them. ``auto`` picks the cheapest of NCCL's own choices (ring and tree; LL / LL128 /
Simple, LL128 only on NVLink), or the algorithm a calibrated backend was found to run. The cheapest
by NCCL's own tuner: where it misjudges what an algorithm moves (a tree on 2-3 nodes) the choice is
its, the time is what the algorithm moves.

Where costs come from, in order (each cost names its source): a measured exact-shape fit from the
profile (MeasuredCollectives), then the topology model with calibrated parameters, then the
topology model with default constants.

Each cost also reports the bytes that cross intra-node links and NICs per node, so a run can show
"bytes moved per link kind" and tests can check bytes sent = bytes received.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from clustersim.catalog import hardware_defaults
from clustersim.cost_models import closed_forms as cf
from clustersim.cost_models import collective_algorithms as algos
from clustersim.cost_models.network_params import (
    DEFAULT,
    NODE_EXTRAPOLATION_SIGMA,
    SIZE_EXTRAPOLATION_SIGMA,
    NetworkParams,
    class_key,
)
from clustersim.errors import InputError
from clustersim.identifiers import CollectiveAlgorithm, CollectiveOp, Protocol
from clustersim.topologies.cluster import Cluster, GroupShape
from clustersim.units import format_bytes

OPS = tuple(CollectiveOp)
assert set(OPS) == set(algos.ops()), "every collective op needs registered algorithms"
ALGORITHMS = tuple(CollectiveAlgorithm)
assert set(ALGORITHMS) == set(algos.algorithm_names()), "registered algorithms and their names differ"
PROTOCOLS = tuple(Protocol)


@dataclass(frozen=True)
class CollectiveCost:
    op: str
    nbytes: float
    ranks: int
    algorithm: str
    protocol: str
    time: float
    intra_node_bytes: float  # bytes sent over intra-node links, per node
    inter_node_bytes: float  # bytes sent out of the node's NICs, per node
    bottleneck: str
    source: str = "topology model, default constants"

    @property
    def algbw(self) -> float:
        return self.nbytes / self.time if self.time > 0 else float("inf")

    @property
    def busbw(self) -> float:
        return self.algbw * cf.busbw_factor(self.op, self.ranks)


class CollectiveModel:
    """Collective times on one cluster: measured fits first, then the (calibrated) topology model."""

    def __init__(self, cluster: Cluster, measured=None, params: NetworkParams | None = None):
        self.cluster = cluster
        self._blind_cluster: Cluster | None = None  # the same NICs on a non-blocking fabric: the tuner
        self.measured = measured  # MeasuredCollectives or None
        self.params = params or DEFAULT
        nccl = hardware_defaults()["nccl"]
        self._base = {p: v * 1e-6 for p, v in nccl["base_latency_us"].items()}
        self._proto_bw = nccl["protocol_bandwidth_fraction"]
        self._hop_table = nccl["hop_latency_us"]

    def _protocols(self, shape: GroupShape) -> tuple[str, ...]:
        if self.params.protocols is not None:
            return self.params.protocols
        nvlink_only = (
            shape.nodes == 1 and self.cluster.intra_ring(shape.gpus_per_node).latency_class == "nvlink"
        )
        return PROTOCOLS if nvlink_only else ("LL", "Simple")

    def cost(self, op: str, nbytes: float, shape: GroupShape, algorithm: str = "auto") -> CollectiveCost:
        """The fastest applicable (algorithm, protocol), or the measured fit. Memoized per model and
        parameter set: a program asks for the same collective many times (DDP buckets of equal size,
        one per layer of a deep model), and pricing tries every decomposition under every protocol."""
        key = (op, nbytes, shape, algorithm)
        hit = self._cost_cache.get(key)
        if hit is None:
            hit = self._cost_cache[key] = self._cost(op, nbytes, shape, algorithm)
        return hit

    def _cost(self, op: str, nbytes: float, shape: GroupShape, algorithm: str) -> CollectiveCost:
        if op not in OPS:
            raise InputError(f"unknown collective {op!r} (known: {', '.join(OPS)})", key="op")
        if algorithm not in ALGORITHMS:
            raise InputError(f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})", key="algo")
        p = shape.ranks
        if p <= 1 or nbytes <= 0:
            return CollectiveCost(op, nbytes, p, "none", "none", 0.0, 0.0, 0.0, "single rank", "none")
        if self.measured is not None:
            hit = self.measured.predict(op, nbytes, shape)
            if hit is not None:
                sizes = self.measured.size_range(op, shape)
                self._note_range(op, nbytes, sizes)
                factor = self._scatter(op, nbytes, sizes and sizes[1], shape.nodes)
                if factor == 1.0:
                    return hit
                floor = self.draw_floor(op, nbytes, shape, algorithm, hit.time)
                return replace(hit, time=max(hit.time * factor, floor))
        if self.params.calibrated:
            if self.params.unmeasured(op):
                self.unmeasured.add(op)
            else:
                self._note_range(op, nbytes, self.params.measured_range(op))
                self._note_nodes(op, shape.nodes)
        candidates = self._candidates(op, algorithm, shape)
        if not candidates:
            raise InputError(
                f"algorithm {getattr(algorithm, 'value', algorithm)!r} does not apply to {op} on "
                f"{shape.nodes} node(s)",
                key="algo",
            )
        inputs = algos.Inputs(self.cluster, shape, nbytes)
        blind = self._spine_blind_inputs(shape, nbytes)
        best, best_rank = None, 0.0
        for name, fn in candidates.items():
            plan = fn(inputs)
            seen = plan if blind is None else fn(blind)
            # chosen as NCCL's tuner would (plan.tuner: what it believes the algorithm costs; on an
            # oversubscribed fabric, what it believes on the NICs alone: it never sees the spine)
            belief = seen.tuner or seen
            for proto in self._protocols(shape):
                time = self._time(op, proto, plan, inputs)
                rank = time if belief is plan else self._time(op, proto, belief, blind or inputs)
                if best is None or rank < best_rank:
                    best, best_rank = (name, proto, plan, time), rank
        name, proto, plan, time = best
        time *= self._scatter(op, nbytes, None, shape.nodes)
        if self.params.calibrated and self.params.floors is not None:
            time = max(time, self.draw_floor(op, nbytes, shape, algorithm))
        return self._priced(op, name, proto, plan, inputs, time)

    def draw_floor(
        self, op: str, nbytes: float, shape: GroupShape, algorithm: str, nominal: float | None = None
    ) -> float:
        """The least time a draw of a calibrated collective may take (``floor`` at the nominal
        parameters the draw came from; ``nominal``: its nominal time where that is not the nominal
        model's own, a measured fit's). A calibrated draw is a factor on the whole time (scatter and the
        fitted parameters' covariance), which far past the measured node counts would have the bytes
        cross the NICs faster than their line rate. The nominal model is kept per cluster for every
        draw of one set (DrawFloors): the floor is priced once per collective shape, not per draw."""
        floors = self.params.floors
        if floors is None:  # a set built by hand, not drawn: nothing to floor against
            return 0.0
        model = floors.models.get(self.cluster)
        if model is None:
            model = floors.models[self.cluster] = CollectiveModel(self.cluster, None, floors.nominal)
        return model.floor(op, nbytes, shape, algorithm, nominal)

    def floor(
        self, op: str, nbytes: float, shape: GroupShape, algorithm: str = "auto", nominal: float | None = None
    ) -> float:
        """The least time a draw of this collective may take: what its bytes take over the links at their
        peak rates (wire_time), or the nominal time (this model's, else ``nominal``) where a fit already
        puts it under that (a fit whose byte model differs): a draw never moves the nominal itself.
        Memoized per collective for this model's parameters."""
        key = (op, nbytes, shape, algorithm, nominal)
        hit = self._floor_cache.get(key)
        if hit is None:
            if nominal is None:
                nominal = self.cost(op, nbytes, shape, algorithm).time
            hit = self._floor_cache[key] = min(self.wire_time(op, nbytes, shape), nominal)
        return hit

    def wire_time(self, op: str, nbytes: float, shape: GroupShape) -> float:
        """The least time ``op`` may physically take on this cluster: the bytes of the algorithm that moves
        fewest (of every one the model knows for the group, not only those NCCL or a calibrated backend
        runs) over its links at their peak rates (the NICs at their line rate, intra-node links at their
        catalog rates: Cluster.peak_ratio), with no latency, no protocol overhead and no pacing. The
        least of all, not the running algorithm's own: a model of one algorithm's bytes may overstate
        what it moves (gloo's binomial broadcast on the shipped 8-host testbed sweeps ran 3-10% faster
        than its modelled bytes take at the line rate), while the ring's and the pairwise all-to-all's
        are what every node must send or receive (an all-reduce's 2(p-1)/p of its bytes)."""
        if shape.ranks <= 1 or nbytes <= 0:
            return 0.0
        inputs = algos.Inputs(self.cluster, shape, nbytes)
        best = float("inf")
        for fn in algos.applicable(op, shape).values():
            plan = fn(inputs)
            legs = [
                leg.nbytes / (leg.link.bytes_per_s * self.cluster.peak_ratio(leg.link)) for leg in plan.legs
            ]
            best = min(best, (max(legs) if plan.concurrent else sum(legs)) if legs else 0.0)
        return 0.0 if best == float("inf") else best

    def _scatter(self, op: str, nbytes: float, largest: float | None = None, nodes: int = 1) -> float:
        """This draw's factor on a collective's time across ``nodes`` nodes (NetworkParams.scatter; 1 at
        the nominal parameters). Put once on the chosen algorithm's time: it is the same for every
        algorithm and protocol of one collective, so it cannot change which is cheapest."""
        if self.params.scatter_z == 0.0 and not self.params.op_z:
            return 1.0
        return self.params.scatter(op, nbytes, largest, nodes)

    def _note_range(self, op: str, nbytes: float, sizes: tuple[float, float] | None) -> None:
        """Remember a size outside the range its fit measured (``extrapolated``: op -> (smallest and
        largest such size priced, the measured range)), for the run's note."""
        if sizes is None or sizes[0] <= nbytes <= sizes[1]:
            return
        lo, hi = self.extrapolated.get(op, ((nbytes, nbytes), sizes))[0]
        self.extrapolated[op] = ((min(lo, nbytes), max(hi, nbytes)), sizes)

    def _note_nodes(self, op: str, nodes: int) -> None:
        """Remember a group across more nodes than the calibrated model's fit measured
        (``extrapolated_nodes``: op -> the most nodes priced), for the run's note."""
        if self.params.nodes_past(nodes) is not None:
            self.extrapolated_nodes[op] = max(nodes, self.extrapolated_nodes.get(op, 0))

    def extrapolation_notes(self) -> list[str]:
        """One line per op priced outside the sizes its fit measured (calibrated model or measured fit),
        and one per op priced across more nodes than the calibrated model's fit measured."""
        out = []
        for op, ((lo, hi), (m_lo, m_hi)) in sorted(self.extrapolated.items()):
            size = format_bytes(hi) if hi > m_hi else format_bytes(lo)
            if hi > m_hi and lo < m_lo:
                size = f"{format_bytes(lo)} and {format_bytes(hi)}"
            elif lo != hi:
                size = f"{format_bytes(lo)}–{format_bytes(hi)}"
            widens = f"; its band widens by log-σ {SIZE_EXTRAPOLATION_SIGMA:g} per e-fold past the largest"
            past = widens + " measured" if hi > m_hi else ""
            out.append(
                f"{op} of {size} priced from a fit measured at {format_bytes(m_lo)}–{format_bytes(m_hi)}: "
                f"extrapolated{past}"
            )
        for op in sorted(self.unmeasured):
            out.append(self.unmeasured_note(op))
        for op, nodes in sorted(self.extrapolated_nodes.items()):
            *lower, top = self.params.measured_nodes
            measured = f"{', '.join(map(str, lower))} and {top}" if lower else str(top)
            out.append(
                f"{op} across {nodes:,} nodes priced from a fit measured on {measured} nodes: extrapolated; "
                f"its band widens by log-σ {NODE_EXTRAPOLATION_SIGMA:g} per e-fold past the largest measured "
                "node count"
            )
        return out

    def unmeasured_note(self, op: str) -> str:
        """What pricing ``op`` rests on where the calibration measured other collectives only: the fitted
        link parameters and the model's own choice of algorithm, with no measurement of its own (the
        shipped 2+4-host gloo fits of all-reduce and all-gather priced the 8-host broadcast 76-83% fast:
        gloo broadcasts by a binomial tree, not the ring the model takes)."""
        measured = ", ".join(sorted(self.params.spread))
        return (
            f"{op} was not measured by the calibration (it measured {measured}): priced from the fitted "
            "link parameters with the model's own algorithm; its band holds the fit's spread, not the "
            f"error of pricing an unmeasured collective (measure it: calibrate run --ops {op})"
        )

    def _spine_blind_inputs(self, shape: GroupShape, nbytes: float) -> algos.Inputs | None:
        """The group as NCCL's tuner sees it where the fabric's spine would bind: the same NICs on a
        non-blocking fabric. NCCL's topology search reads the NICs' speeds (net plugins) and nothing of
        the switches above them (src/graph/topo.cc, search.cc), so on an oversubscribed leaf-spine it
        chooses between ring and tree as if the uplinks were full; the time is still what the
        algorithm moves over the real fabric. None where no spine is crossed or none is narrower."""
        fabric = self.cluster.spec.fabric
        oversubscribed = fabric.oversubscription > 1 or fabric.core_oversubscription > 1
        if fabric.kind != "leaf_spine" or not oversubscribed or shape.nodes <= fabric.nodes_per_leaf:
            return None
        if self._blind_cluster is None:
            flat = fabric.model_copy(update={"oversubscription": 1.0, "core_oversubscription": 1.0})
            spec = self.cluster.spec.model_copy(update={"fabric": flat})
            self._blind_cluster = Cluster(spec, self.cluster.gpu)
        return algos.Inputs(self._blind_cluster, shape, nbytes)

    def _candidates(self, op: str, algorithm: str, shape: GroupShape) -> dict:
        natural = algos.applicable(op, shape)
        if algorithm == "auto":
            chosen = self.params.algorithms.get(op)
            if chosen in natural:
                return {chosen: natural[chosen]}
            return {k: v for k, v in natural.items() if k in algos.NCCL_AUTO[op]}
        return {algorithm: natural[algorithm]} if algorithm in natural else {}

    @property
    def params(self) -> NetworkParams:
        return self._params

    @params.setter
    def params(self, params: NetworkParams) -> None:
        self._params = params
        self._hop_cache: dict[tuple[str, str], float] = {}
        self._cost_cache: dict[tuple, CollectiveCost] = {}
        self._pace_cache: dict[int, float] = {}
        self._floor_cache: dict[tuple, float] = {}
        self.extrapolated: dict[str, tuple[tuple[float, float], tuple[float, float]]] = {}
        self.extrapolated_nodes: dict[str, int] = {}
        self.unmeasured: set[str] = set()  # ops a calibrated model priced without measuring them

    def pacing(self, nodes: int) -> float:
        """The factor on a lockstep collective's network legs across ``nodes`` nodes: each step waits for
        the slowest node's link (closed_forms.paced_factor, with the calibrated or the cluster's cv).
        Memoized per node count for the current parameters."""
        factor = self._pace_cache.get(nodes)
        if factor is None:
            cls = class_key("network", self.cluster.spec.nic.kind)
            cv = self.params.pacing_cv.get(cls)
            cv = self.cluster.pacing_cv() if cv is None else cv
            factor = self._pace_cache[nodes] = cf.paced_factor(nodes, cv)
        return factor

    def hop_latency(self, latency_class: str, protocol: str) -> float:
        """One step's latency on a link class: calibrated, else NCCL's constant (and the NIC's wire
        latency). Memoized per (class, protocol) for the current parameters: every collective prices
        several decompositions under each protocol (issue #15)."""
        key = (latency_class, protocol)
        lat = self._hop_cache.get(key)
        if lat is None:
            lat = self._hop_cache[key] = self._hop_latency(latency_class, protocol)
        return lat

    def _hop_latency(self, latency_class: str, protocol: str) -> float:
        cls = class_key(latency_class, self.cluster.spec.nic.kind)
        calibrated = self.params.hop_s.get(cls)
        if calibrated is not None:
            table = self._hop_table[latency_class]
            lat = calibrated * table[protocol] / table["Simple"]
        else:
            lat = self.cluster.hop_latency(latency_class, protocol)
        return lat * self.params.hop_scale.get(cls, 1.0)

    def base_latency(self, protocol: str) -> float:
        if self.params.base_s is None:
            return self._base[protocol]
        return self.params.base_s * self._base[protocol] / self._base["Simple"]

    def price(
        self, op: str, algorithm: str, protocol: str, plan: algos.Decomposition, inputs: algos.Inputs
    ) -> CollectiveCost:
        """One decomposition under one protocol, with this model's parameters, less the draw's scatter
        (common to every decomposition of a collective; cost puts it on the one chosen)."""
        return self._priced(op, algorithm, protocol, plan, inputs, self._time(op, protocol, plan, inputs))

    def _time(self, op: str, protocol: str, plan: algos.Decomposition, inputs: algos.Inputs) -> float:
        """price's time alone: cost compares candidates by it and builds one CollectiveCost, the chosen."""
        prm = self.params
        nic = self.cluster.spec.nic.kind
        frac = self._proto_bw[protocol]
        lat_scale = prm.op_latency_scale.get(op, 1.0)
        latency = (
            sum(steps * self.hop_latency(cls, protocol) for steps, cls in plan.latency_steps) * lat_scale
        )
        pace = self.pacing(inputs.n) if plan.paced and inputs.n > 1 else 1.0
        transfer = [
            leg.nbytes
            / (
                leg.link.bytes_per_s
                * frac
                * self._bandwidth_factor(class_key(leg.link.latency_class, nic), op, leg)
            )
            * (pace if leg.link.latency_class == "network" else 1.0)
            for leg in plan.legs
        ]
        t = (max(transfer) if plan.concurrent else sum(transfer)) if transfer else 0.0
        return self.base_latency(protocol) + latency + t

    def _bandwidth_factor(self, cls: str, op: str, leg: algos.Leg) -> float:
        """The parameters' factor on a leg's modelled rate. A draw's rate of a link class the calibration
        did not measure (a default-width lognormal about the modelled rate) stops at the link's peak: a
        NIC at its line rate, an NVLink or PCIe link at its catalog rate (Cluster.peak_ratio). The nominal
        parameters and a fit's trial ones are never capped; a calibrated class's draws are floored on the
        collective's time instead (floor)."""
        prm = self.params
        eff = prm.bw_eff.get(cls, 1.0)
        if eff > 1.0 and prm.floors is not None and cls not in prm.calibrated_classes:
            eff = min(eff, self.cluster.peak_ratio(leg.link))
        return eff * prm.op_bw_eff.get(op, 1.0)

    def _priced(
        self,
        op: str,
        algorithm: str,
        protocol: str,
        plan: algos.Decomposition,
        inputs: algos.Inputs,
        time: float,
    ) -> CollectiveCost:
        return CollectiveCost(
            op,
            inputs.nbytes,
            inputs.p,
            algorithm,
            protocol,
            time,
            plan.intra_node_bytes,
            plan.inter_node_bytes,
            plan.bottleneck,
            self._source(plan),
        )

    def _source(self, plan: algos.Decomposition) -> str:
        """Calibrated only where every link class the algorithm uses was calibrated."""
        if not self.params.calibrated:
            return self.params.source
        nic = self.cluster.spec.nic.kind
        used = {class_key(c, nic) for _, c in plan.latency_steps} | {
            class_key(leg.link.latency_class, nic) for leg in plan.legs
        }
        missing = sorted(used - set(self.params.calibrated_classes))
        if not missing:
            return self.params.source
        return f"{self.params.source}; defaults for {', '.join(missing)}"

    def classes(self, shape: GroupShape) -> tuple[str, ...]:
        """The link classes a group's collectives can use (for sampling their uncertainty)."""
        nic = self.cluster.spec.nic.kind
        out = (
            [class_key(self.cluster.intra_ring(shape.gpus_per_node).latency_class, nic)]
            if shape.gpus_per_node > 1
            else []
        )
        if shape.nodes > 1:
            out += [class_key("network", nic), class_key(self.cluster.inter_node(shape).latency_class, nic)]
        return tuple(dict.fromkeys(out))
