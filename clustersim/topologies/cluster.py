"""A cluster: N identical nodes (one detailed graph) joined by a switch fabric.

Collective cost models ask it two questions about a group of ranks: how fast can a ring (or any
bandwidth-optimal pattern) move bytes through the group's slowest link, and what is the latency of
one step. Bandwidths are derived from the graph:

* inside a node, a ring over the group's GPUs is routed hop by hop; the bottleneck is the directed
  edge with the least capacity per ring flow crossing it. On NVLink meshes NCCL runs several rings
  over disjoint links, so the bound is each GPU's total NVLink capacity to the other members.
* between nodes, a node's injection bandwidth is the max-flow from its GPUs to the fabric through
  the NICs: GPUDirect RDMA flows GPU->switch->NIC; without it data is staged in host memory, so the
  flow must pass a CPU. Once a group spans leaves, a leaf-spine fabric divides it by the
  oversubscription times the share of a full leaf's NIC traffic that the pattern sends across
  (topologies/placement.py: a ring on full leaves sends all of it), and a three-tier one
  (leaves_per_pod) likewise at the core once it spans pods.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from clustersim import catalog
from clustersim.catalog import GpuSpec, hardware_defaults
from clustersim.scenario import ClusterSpec
from clustersim.topologies.links import LinkKind
from clustersim.topologies.node import build_node_graph, nic_bandwidth
from clustersim.topologies.placement import place, ring_shares


@dataclass(frozen=True)
class GroupShape:
    """A communicator: ``nodes`` nodes with ``gpus_per_node`` members each; ``sharing`` such groups
    run at once on every node and split its NICs (e.g. the g rails of a hierarchical all-reduce)."""

    nodes: int
    gpus_per_node: int
    sharing: int = 1

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Bandwidth:
    bytes_per_s: float
    bottleneck: str
    latency_class: str  # nvlink | pcie | network
    measured: bool = False


class Cluster:
    def __init__(self, spec: ClusterSpec, gpu: GpuSpec):
        self.spec = spec
        self.gpu = gpu
        self.graph = build_node_graph(spec, gpu)
        self._intra_cache: dict[int, Bandwidth] = {}
        self._injection: dict[int, Bandwidth] = {}  # by GPUs per node in the communicator
        self._nic_peak: float | None = None  # peak_ratio of the network links
        self._intra_peak: float | None = None  # peak_ratio of a measured intra-node ring

    # ---- inside one node -------------------------------------------------------------------
    def intra_ring(self, members: int) -> Bandwidth:
        """Ring bus bandwidth among the first ``members`` GPUs of a node."""
        if members not in self._intra_cache:
            self._intra_cache[members] = self._compute_intra_ring(members)
        return self._intra_cache[members]

    def _compute_intra_ring(self, members: int, use_measured: bool = True) -> Bandwidth:
        measured = self.spec.intra_node.measured_allreduce_busbw_gbs if use_measured else None
        if members <= 1:
            return Bandwidth(float("inf"), "none (single GPU)", "nvlink")
        fabric = self.spec.intra_node.fabric
        if measured is not None and members == self.spec.gpus_per_node:
            cls = "pcie" if fabric == "pcie" else "nvlink"
            return Bandwidth(measured * 1e9, "measured intra-node all-reduce busbw", cls, measured=True)
        gpus = [f"gpu{i}" for i in range(members)]
        if fabric == "nvlink_mesh":
            best = None
            for gname in gpus:
                cap = sum(
                    d["capacity"]
                    for _, peer, d in self.graph.out_edges(gname, data=True)
                    if d["kind"] == LinkKind.NVLINK and peer in gpus
                )
                if best is None or cap < best[0]:
                    best = (cap, gname)
            if best and best[0] > 0:
                return Bandwidth(best[0], f"{best[1]} NVLinks to group peers", "nvlink")
        if fabric == "infinity_fabric":
            return self._cut_bound(gpus)
        return self._routed_ring(gpus)

    def _cut_bound(self, gpus: list[str]) -> Bandwidth:
        """Bus bandwidth of rings over the members' direct GPU-GPU links (RCCL builds several rings over
        the xGMI links): every ring crosses each cut of the group once per direction, so their sum is
        at most the least capacity of any cut, over all splits of the group in two (8 GCDs: 127 cuts).
        A single-GCD cut gives the mesh rule (its links to the peers); a package's cut bounds rings
        over the node by the inter-package links. Theoretical link rates: a measured intra-node busbw
        (intra_node.measured_allreduce_busbw_gbs) replaces it for the whole node."""
        graph, n = self.graph, len(gpus)
        best = None
        for mask in range(1, 2 ** (n - 1)):  # gpus[-1] stays outside: each split once
            inside = {gpus[i] for i in range(n) if mask >> i & 1}
            cap = sum(
                d["capacity"]
                for a in inside
                for _, b, d in graph.out_edges(a, data=True)
                if b in gpus and b not in inside and d["kind"] == LinkKind.INFINITY_FABRIC
            )
            if best is None or cap < best[0]:
                best = (cap, sorted(inside))
        if best is None or best[0] <= 0:
            return self._routed_ring(gpus)
        side = "+".join(best[1])
        return Bandwidth(best[0], f"Infinity Fabric cut {side} | rest of the group", "nvlink")

    def _routed_ring(self, gpus: list[str]) -> Bandwidth:
        """Route each ring hop; bottleneck = min over directed edges of capacity / flows on it."""
        graph = self.graph
        if self.spec.intra_node.fabric == "pcie" and not self.spec.intra_node.p2p:
            # No peer-to-peer: every hop is a device->host->device copy through a CPU.
            def route(a, b):
                cpu = nx.shortest_path(graph, a, "cpu0")[-1]
                return nx.shortest_path(graph, a, cpu) + nx.shortest_path(graph, cpu, b)[1:]
        else:

            def route(a, b):
                return nx.shortest_path(graph, a, b, weight=lambda u, v, d: 1.0 / d["capacity"])

        load: dict[tuple[str, str], int] = {}
        for i, a in enumerate(gpus):
            path = route(a, gpus[(i + 1) % len(gpus)])
            for edge in zip(path, path[1:]):
                load[edge] = load.get(edge, 0) + 1
        (u, v), flows = min(load.items(), key=lambda kv: graph.edges[kv[0]]["capacity"] / kv[1])
        kind = graph.edges[u, v]["kind"]
        return Bandwidth(
            graph.edges[u, v]["capacity"] / flows,
            f"{u}->{v} ({kind.value}, {flows} ring flow(s))",
            kind.latency_class,
        )

    def peak_ratio(self, link: Bandwidth) -> float:
        """How much faster than its modelled rate ``link`` can run at most: a network link at the NICs'
        line rate (cluster.nic.line_rate_gbps) over the rate the model gives it (nic_bandwidth: the
        measured effective rate, else the line rate times the transport's efficiency), a measured
        intra-node ring (intra_node.measured_allreduce_busbw_gbs) at its catalog links' rate over the
        measured one; every other link is modelled at its catalog rate already (1). Never below 1: a
        modelled rate is not itself lowered. A draw of the uncertain rates stops here
        (collectives.CollectiveModel)."""
        if link.latency_class == "network":
            return self.nic_peak_ratio()
        if link.measured:
            if self._intra_peak is None:
                catalog = self._compute_intra_ring(self.spec.gpus_per_node, use_measured=False)
                self._intra_peak = max(1.0, catalog.bytes_per_s / link.bytes_per_s)
            return self._intra_peak
        return 1.0

    def nic_peak_ratio(self) -> float:
        """A NIC's line rate over the rate the model gives it (nic_bandwidth), at least 1 (peak_ratio)."""
        if self._nic_peak is None:
            self._nic_peak = max(1.0, self.spec.nic.line_rate_gbps * 1e9 / 8 / nic_bandwidth(self.spec))
        return self._nic_peak

    # ---- between nodes ---------------------------------------------------------------------
    def injection(self, members: int | None = None) -> Bandwidth:
        """Bytes/s that ``members`` GPUs of one node (all of them by default) can push into the fabric:
        a maximum flow from those GPUs through the PCIe tree to the NICs. One GPU per node reaches its
        own rail's NIC (and whatever else its PCIe link can carry), not all eight NICs of a DGX."""
        g = self.spec.gpus_per_node
        members = g if members is None else max(1, min(members, g))
        if members not in self._injection:
            self._injection[members] = self._compute_injection(members)
        return self._injection[members]

    def _compute_injection(self, members: int) -> Bandwidth:
        nic_bw = nic_bandwidth(self.spec)
        count = self.spec.nic.count
        if count == 0:
            return Bandwidth(0.0, "no NIC", "network")
        flow = self.graph.copy()
        # NCCL's network transport moves a GPU's data to a NIC over PCIe (GPUDirect RDMA or through host
        # memory); NVLink paths to other GPUs' NICs (PXN) serve all-to-all, not rings and trees.
        flow.remove_edges_from(
            [
                (u, v)
                for u, v, d in flow.edges(data=True)
                if d.get("kind") and d["kind"].latency_class == "nvlink"
            ]
        )
        nics = [f"nic{m}" for m in range(count)]
        gpus = [f"gpu{i}" for i in range(members)]
        cpus = [n for n, d in flow.nodes(data=True) if d.get("role") == "cpu"]
        for gname in gpus:
            flow.add_edge("SRC", gname)  # no capacity attribute = infinite
        for nic in nics:
            flow.add_edge(nic, "SINK", capacity=nic_bw)
        rdma = self.spec.nic.gpudirect_rdma
        if rdma is None:
            rdma = self.spec.nic.kind == "infiniband"
        if rdma:
            value = nx.maximum_flow_value(flow, "SRC", "SINK")
        else:
            # Staged through host memory: GPU -> CPU, then CPU -> NIC; the two legs run on opposite
            # directions of the PCIe links, so the node moves the smaller of the two flows.
            up = flow.copy()
            for cpu in cpus:
                up.add_edge(cpu, "MEM")
            up.remove_node("SINK")
            down = flow.copy()
            down.remove_node("SRC")
            for cpu in cpus:
                down.add_edge("MEM", cpu)
            value = min(nx.maximum_flow_value(up, "SRC", "MEM"), nx.maximum_flow_value(down, "MEM", "SINK"))
        nic_total = nic_bw * count
        if value >= nic_total * (1 - 1e-9):
            what = f"{count} x NIC ({self.spec.nic.kind}, {nic_bw * 8 / 1e9:.3g} Gb/s each"
            what += ", measured)" if self.spec.nic.effective_gbps else ")"
            return Bandwidth(nic_total, what, "network", measured=self.spec.nic.effective_gbps is not None)
        who = "GPUs" if members == self.spec.gpus_per_node else f"{members} GPU(s) per node"
        return Bandwidth(value, f"PCIe path from {who} to the NICs", "pcie")

    def inter_node(
        self, shape: GroupShape, leaf_share: float | None = None, pod_share: float | None = None
    ) -> Bandwidth:
        """Per-node bandwidth available to one group spanning ``shape.nodes`` nodes. A pattern that
        sends ``leaf_share`` of what a full leaf's NICs could push across the spine (default: a ring's,
        placement.ring_shares: 1 on full leaves, the oversubscription r in full) is slowed by r x
        leaf_share when that exceeds 1 (the uplinks, not the NICs, bind), and likewise at the core
        with ``pod_share``."""
        if leaf_share is None or pod_share is None:
            ring = ring_shares(place(self.spec.fabric, shape.nodes))
            leaf_share = ring[0] if leaf_share is None else leaf_share
            pod_share = ring[1] if pod_share is None else pod_share
        inj = self.injection(shape.gpus_per_node * shape.sharing)
        bw = inj.bytes_per_s / shape.sharing
        note = inj.bottleneck
        fabric = self.spec.fabric
        r, c = fabric.oversubscription, fabric.core_oversubscription
        spans_leaves = fabric.kind == "leaf_spine" and shape.nodes > fabric.nodes_per_leaf
        spans_pods = (
            spans_leaves
            and fabric.leaves_per_pod is not None
            and shape.nodes > fabric.nodes_per_leaf * fabric.leaves_per_pod
        )
        at_leaf = r * leaf_share if spans_leaves else 1.0
        at_core = r * c * pod_share if spans_pods else 1.0
        slowdown = max(1.0, at_leaf, at_core)
        if spans_leaves and r > 1 and at_leaf > 1:
            note += f", leaf uplinks oversubscribed {r:g}:1"
            if leaf_share != 1:
                note += f" ({leaf_share:.2g} of a full leaf's NIC traffic crosses)"
        if spans_pods and c > 1 and at_core > 1:
            note += f", pod core uplinks oversubscribed {c:g}:1"
            if pod_share != 1:
                note += f" ({pod_share:.2g} of a full pod's NIC traffic crosses)"
        return Bandwidth(bw / slowdown, note, "network", inj.measured)

    # ---- a group as a whole ------------------------------------------------------------------
    def ring(self, shape: GroupShape) -> Bandwidth:
        """Bus bandwidth of a ring over the group: the slower of its intra- and inter-node parts."""
        intra = self.intra_ring(shape.gpus_per_node)
        if shape.nodes == 1:
            return intra
        inter = self.inter_node(shape)
        return inter if inter.bytes_per_s <= intra.bytes_per_s else intra

    def hop_latency(self, latency_class: str, protocol: str) -> float:
        nccl = hardware_defaults()["nccl"]["hop_latency_us"]
        lat = nccl[latency_class][protocol] * 1e-6
        if latency_class == "network":
            lat = max(lat, self.nic_latency()[0])
        return lat

    def transport(self) -> str:
        """The NICs' transport as hardware_defaults.yaml keys it: their kind, or ``rdma_ethernet`` for an
        ethernet NIC with gpudirect_rdma (RoCE), whose transport runs in the NIC as InfiniBand's."""
        nic = self.spec.nic
        return "rdma_ethernet" if nic.kind == "ethernet_tcp" and nic.gpudirect_rdma else nic.kind

    def nic_latency(self) -> tuple[float, str]:
        """(one-way message latency in seconds, where it came from): cluster.nic.latency_us, else the
        transport's default."""
        nic = self.spec.nic
        if nic.latency_us:
            return nic.latency_us * 1e-6, "cluster.nic.latency_us"
        key = self.transport()
        return hardware_defaults()["nic"]["latency_s"][key], f"default for {key}"

    def pacing_cv(self) -> float:
        """Per-chunk spread of a node's network rate (cluster.nic.pacing_cv, else the NIC kind's default)."""
        nic = self.spec.nic
        if nic.pacing_cv is not None:
            return float(nic.pacing_cv)
        return float(hardware_defaults()["nic"]["pacing_cv"][self.transport()])

    def step_latency(self, shape: GroupShape, protocol: str) -> float:
        """Latency of one ring step: the slowest hop class the group crosses."""
        if shape.nodes > 1:
            return self.hop_latency("network", protocol)
        return self.hop_latency(self.intra_ring(shape.gpus_per_node).latency_class, protocol)

    def compute_slowdown(self, shape: GroupShape) -> float:
        """Fraction of compute throughput lost while this group's NCCL kernel runs."""
        table = hardware_defaults()["nccl"]["compute_slowdown_while_communicating"]
        if shape.nodes > 1:
            return table["network"]
        return table[self.intra_ring(shape.gpus_per_node).latency_class] if shape.gpus_per_node > 1 else 0.0

    def describe(self) -> dict:
        s = self.spec
        kinds: dict[str, dict] = {}
        for _u, _v, d in self.graph.edges(data=True):
            entry = kinds.setdefault(
                d["kind"].value, {"links": 0, "gbs_per_direction": set(), "latency_us": d["latency"] * 1e6}
            )
            entry["links"] += 1
            entry["gbs_per_direction"].add(round(d["capacity"] / 1e9, 2))
        return {
            "nodes": s.nodes,
            "gpus_per_node": s.gpus_per_node,
            "world_size": s.world_size,
            "gpu": self.gpu.name,
            "intra_node_fabric": s.intra_node.fabric,
            "link_kinds": {
                k: {
                    "directed_edges_per_node": v["links"],
                    "gbs_per_direction": sorted(v["gbs_per_direction"]),
                    "hop_latency_us": v["latency_us"],
                    "full_duplex": True,
                }
                for k, v in sorted(kinds.items())
            },
            "nic": {
                "kind": s.nic.kind,
                "count": s.nic.count,
                "gbs_each": nic_bandwidth(s) / 1e9,
                "measured": s.nic.effective_gbps is not None,
            },
            "fabric": s.fabric.model_dump(),
        }


_CLUSTERS: dict[tuple[str, str], Cluster] = {}


def build_cluster(spec: ClusterSpec) -> Cluster:
    """The cluster of a spec, cached by the spec and the GPU it resolves to (a user catalog may give
    a name other properties; an inline GPU is not hashable)."""
    gpu = catalog.gpu(spec.gpu)
    key = (spec.model_dump_json(), gpu.model_dump_json())
    hit = _CLUSTERS.get(key)
    if hit is None:
        if len(_CLUSTERS) >= 256:
            _CLUSTERS.clear()
        hit = _CLUSTERS[key] = Cluster(spec, gpu)
    return hit
