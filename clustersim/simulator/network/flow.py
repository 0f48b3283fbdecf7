"""The flow-level network backend: a collective's time from its flows simulated over the topology.

When the engine starts a collective op, the backend expands its algorithm into steps of flows
(patterns.py), routes them over every node's graph, the NICs, leaves and spine (fabric.py) and shares
the links max-min fairly (maxmin.py). Time = the analytical model's launch and per-step latencies
(the same α: NCCL's constants or the calibration's) + the simulated transfer time of every step,
with link capacities scaled by the protocol's bandwidth fraction and any calibrated per-class
efficiency, exactly as the analytical model scales its bottleneck.

Speed: a step's makespan is linear in its bytes, so each (op, algorithm, protocol, group shape) is
simulated once per run and scaled by the message size; identical steps of an algorithm (the 2(p-1)
steps of a ring) are simulated once and multiplied. Heterogeneity (a degraded NIC, a background job)
changes the link capacities and adds flows; it is read from the scenario (cluster.heterogeneity).
"""

from __future__ import annotations

import numpy as np

from clustersim.cost_models import collective_algorithms as algos
from clustersim.cost_models.network_params import class_key
from clustersim.errors import InputError
from clustersim.simulator.network import faults, maxmin
from clustersim.simulator.network.fabric import FlowNetwork
from clustersim.simulator.network.patterns import NotModelled, expand, ring_step
from clustersim.simulator.program import CollectiveSpec, Op
from clustersim.topologies.cluster import GroupShape

# The most nodes the flow backend simulates. It builds every node's graph and every rank's flows: cost
# and memory grow with the nodes (4,096 DGX nodes, 32,768 GPUs: ~18 s and 0.5 GB for a 1-bit Adam run,
# benchmarks/bench_counts.py; 1,048,576 GPUs would take ~10 min and ~16 GB). Larger clusters are
# refused (docs/scale-limits.md); the analytical model, within 3% of it on symmetric clusters, prices
# them in constant time. Not a model constant.
MAX_FLOW_NODES = 4096

# Links a collective keeps at least this busy when alone are the ones it competes for with collectives
# running beside it (a selection threshold for the engine's sharing, not a hardware constant).
HOT = 0.5


class FlowBackend:
    name = "flow"

    def __init__(self, ctx):
        nodes = ctx.scenario.cluster.nodes
        if nodes > MAX_FLOW_NODES:
            raise InputError(
                f"the flow backend simulates every flow over every node: at most {MAX_FLOW_NODES:,} nodes, "
                f"the cluster has {nodes:,}; use the analytical backend (docs/scale-limits.md)",
                key="training.network",
            )
        self.ctx = ctx
        self.cluster = ctx.cluster
        self.model = ctx.collectives
        self.hetero = getattr(ctx.scenario.cluster, "heterogeneity", None)
        self._nets: dict[int, FlowNetwork] = {}
        self._intra_scale = 1.0  # a measured intra-node busbw over the catalog links' (_match_measured_intra)
        self._per_byte: dict[tuple, tuple[float, np.ndarray | None]] = {}
        self.link_bytes: dict[int, np.ndarray] = {}  # group nodes -> bytes per link since reset()
        self.fallbacks: set[str] = set()
        self.notes: list[str] = []
        # Pipeline stages are ranks of one program on other GPUs: stage s starts at GPU s x (t x d) in
        # Megatron's order, so stages whose GPUs lie on other nodes use other NICs (simulator/
        # model_parallel.py). 0: a representative-rank program, every op on node 0's links.
        self._stage_span = 0
        if getattr(ctx, "model_parallel", False):
            lay = ctx.layout
            self._stage_span = lay.tensor * lay.data
        if ctx.scenario.cluster.intra_node.fabric == "nvlink_mesh":
            self.notes.append(
                "flow backend on an NVLink mesh (DGX-1): rings run over balanced sets of NVLink rings "
                "and paths (as NCCL's channels) and agree with the analytical model; tree, "
                "halving-doubling and all-to-all inside a node take one route per flow and come out "
                "2-8x slower than it"
            )

    # ---- the NetworkBackend protocol -----------------------------------------------------------------
    def duration(self, op: Op, now: float) -> float:
        t = self.time(op.collective, count_bytes=self._first_node(op) == 0)
        return op.duration if t is None else t

    def _first_node(self, op: Op) -> int:
        """The first node of the GPUs that run ``op``: 0 but for a pipeline stage on other nodes."""
        if not self._stage_span or not op.rank:
            return 0
        return op.rank * self._stage_span // self.ctx.scenario.cluster.gpus_per_node

    def fabric_demands(self, op: Op, duration: float) -> tuple[dict[str, float], dict[str, float]]:
        """Bytes/s the collective pushes through its busiest links (utilisation >= HOT alone) and their
        capacities, for the engine to share between collectives that run at the same time: two
        collectives through the same NICs each get half of them. Only the links of node 0 and of leaf
        and pod 0 are named (every group starts at node 0 and is symmetric, so they stand for all)."""
        spec = op.collective
        hit = self._per_byte.get((spec.op, spec.algorithm, spec.protocol, spec.shape))
        if hit is None or hit[1] is None or duration <= 0:
            return {}, {}
        per_byte, unit_bytes = hit
        net = self.network(spec.shape.nodes)
        frac = self.model._proto_bw[spec.protocol]
        # wire bytes: a protocol moving a fraction of its bytes as data (LL: half) fills the wire faster
        wire = unit_bytes * (spec.nbytes * spec.count) / frac
        busy = wire / (net.capacity * duration)
        demands, capacity = {}, {}
        node = self._first_node(op)
        for i in np.flatnonzero(busy[: len(net.representative)] * net.representative >= HOT):
            # a stage on other nodes pushes through other NICs (and, taken as such, other uplinks)
            name = net.name(int(i)) + (f" (stage on node {node})" if node else "")
            # never above the link (a calibrated efficiency above 1 would otherwise slow it when alone)
            demands[name] = float(min(wire[i] / duration, net.capacity[i]))
            capacity[name] = float(net.capacity[i])
        return demands, capacity

    # ---- pricing ---------------------------------------------------------------------------------------
    def time(self, spec: CollectiveSpec, count_bytes: bool = True) -> float | None:
        """Seconds of one collective, or None where the flow model does not apply (a measured fit, a
        single rank, an algorithm it does not expand): the analytical time then stands. ``count_bytes``:
        add its bytes to node 0's links for the utilisation table (not for a stage on other nodes)."""
        if spec.algorithm in ("none", "measured") or spec.nbytes <= 0 or spec.shape.ranks <= 1:
            return None
        key = (spec.op, spec.algorithm, spec.protocol, spec.shape)
        hit = self._per_byte.get(key)
        if hit is None:
            try:
                hit = self._simulate(*key)
            except NotModelled as exc:
                self.fallbacks.add(str(exc))
                hit = (float("nan"), None)
            self._per_byte[key] = hit
        per_byte, unit_bytes = hit
        if unit_bytes is None:
            return None
        if count_bytes:
            acc = self.link_bytes.get(spec.shape.nodes)
            if acc is None:
                acc = self.link_bytes[spec.shape.nodes] = np.zeros_like(unit_bytes)
            acc += unit_bytes * (spec.nbytes * spec.count)
        prm = self.model.params
        scale = prm.scatter(spec.op, spec.nbytes, nodes=spec.shape.nodes)
        t = (self._latency(spec) + per_byte * spec.nbytes) * scale
        if prm.calibrated and prm.floors is not None:  # a calibrated draw: never under the wire's time
            t = max(t, self.model.draw_floor(spec.op, spec.nbytes, spec.shape, spec.algorithm))
        return t * spec.count

    def _latency(self, spec: CollectiveSpec) -> float:
        """The analytical model's α terms for this algorithm and protocol (collectives.price)."""
        m = self.model
        plan = algos.REGISTRY[spec.op][spec.algorithm](algos.Inputs(self.cluster, spec.shape, spec.nbytes))
        scale = m.params.op_latency_scale.get(spec.op, 1.0)
        steps = sum(n * m.hop_latency(cls, spec.protocol) for n, cls in plan.latency_steps)
        return m.base_latency(spec.protocol) + steps * scale

    def network(self, nodes: int) -> FlowNetwork:
        net = self._nets.get(nodes)
        if net is None:
            net = self._nets[nodes] = FlowNetwork(self.cluster, nodes)
            self._match_measured_intra(net)
            if self.hetero is not None:
                faults.apply_degraded(net, self.hetero)
        return net

    def _match_measured_intra(self, net: FlowNetwork) -> None:
        """A measured intra-node all-reduce bus bandwidth (cluster.intra_node.measured_allreduce_busbw_gbs)
        overrides the topology in the analytical model; here it scales every link inside the nodes so
        that a ring over one node's GPUs runs at the measured rate."""
        spec = self.cluster.spec
        measured = spec.intra_node.measured_allreduce_busbw_gbs
        if measured is None or spec.gpus_per_node < 2:
            return
        step = ring_step(net, GroupShape(1, spec.gpus_per_node))
        t, _ = maxmin.makespan(maxmin.FlowSet(step.paths, step.sizes), net.capacity)
        net.capacity[: net.nic_base] *= measured * 1e9 * t
        self._intra_scale = measured * 1e9 * t

    def capacity(self, net: FlowNetwork, op: str, protocol: str) -> np.ndarray:
        """Link capacities as the analytical model scales its bottleneck: the protocol's bandwidth
        fraction and the calibrated efficiency of each link's class."""
        frac = self.model._proto_bw[protocol]
        nic = self.cluster.spec.nic.kind
        prm = self.model.params
        factor = {k: prm.bandwidth_factor(class_key(k, nic), op) for k in set(net.kind)}
        if prm.floors is not None:  # a draw: a class the calibration did not measure stops at its peak
            for k in factor:
                cls = class_key(k, nic)
                eff = prm.bw_eff.get(cls, 1.0)
                if eff > 1.0 and cls not in prm.calibrated_classes:
                    peak = (
                        self.cluster.nic_peak_ratio() if k == "network" else max(1.0, 1 / self._intra_scale)
                    )
                    factor[k] = min(eff, peak) * prm.op_bw_eff.get(op, 1.0)
        return net.capacity * frac * np.array([factor[k] for k in net.kind])

    def _simulate(self, op, algorithm, protocol, shape) -> tuple[float, np.ndarray]:
        """Seconds per byte of S and the bytes per link per byte of S."""
        net = self.network(shape.nodes)
        cap = self.capacity(net, op, protocol)
        plan = algos.REGISTRY[op][algorithm](algos.Inputs(self.cluster, shape, 1.0))
        if plan.paced and shape.nodes > 1:  # lockstep steps wait for the slowest node (collectives.pacing)
            pace = self.model.pacing(shape.nodes)
            if pace != 1.0:
                cap = cap / np.where(np.asarray(net.kind) == "network", pace, 1.0)
        background, weights = (
            faults.background_paths(net, self.hetero) if self.hetero is not None else ([], [])
        )
        parts = expand(net, op, algorithm, shape)
        times, carried = [], np.zeros(net.n_links)
        for part in parts:
            total = 0.0
            for phase in part:
                flows = maxmin.FlowSet(
                    phase.paths + background,
                    phase.sizes + [float("inf")] * len(background),
                    [1.0] * len(phase.paths) + weights if background else None,
                )
                t, link_bytes = maxmin.makespan(flows, cap)
                total += phase.repeat * t
                if background:  # the other job's bytes are not this collective's
                    mine = maxmin.FlowSet(phase.paths, phase.sizes)
                    link_bytes = np.bincount(
                        mine.entries, weights=mine.size[mine.owner], minlength=net.n_links
                    )
                carried += phase.repeat * link_bytes
            times.append(total)
        return max(times), carried

    # ---- outputs -----------------------------------------------------------------------------------------
    def reset(self) -> None:
        self.link_bytes = {}

    def utilisation(self, seconds: float, top: int = 10) -> list[dict]:
        """The ``top`` busiest links over ``seconds``: bytes carried / (capacity x seconds)."""
        rows = []
        for nodes, carried in self.link_bytes.items():
            net = self.network(nodes)
            cap = net.capacity
            busy = np.where(np.isfinite(cap) & (cap > 0), carried / (cap * max(seconds, 1e-30)), 0.0)
            for i in np.argsort(-busy)[:top]:
                if carried[i] > 0:
                    rows.append(
                        {
                            "link": net.name(int(i)),
                            "group_nodes": nodes,
                            "bytes": float(carried[i]),
                            "gbs": float(cap[i] / 1e9),
                            "utilisation": float(busy[i]),
                        }
                    )
        rows.sort(key=lambda r: -r["utilisation"])
        return rows[:top]
