"""The links a collective's flows cross: every node's graph (topologies/node.py), its NICs, the
leaves and the spine (and, for a three-tier fabric, the pods' core uplinks).

Link indices: node n's graph edge e is ``n * E + e``; after the nodes come each NIC's uplink and
downlink, then each leaf's uplink and downlink to the spine, then each pod's to the core. A leaf's
uplink capacity is what its nodes_per_leaf nodes' NICs can send divided by the oversubscription
(FabricSpec); the analytical model applies it times the share of that traffic a pattern sends across
(Cluster.inter_node).

Placement (topologies/placement.py, shared with the analytical model): a group of N nodes sits on
the fewest leaves that hold it, ceil(N / nodes_per_leaf), node i on leaf i mod leaves, so every
inter-node hop of a ring crosses the spine. A group within one leaf never touches the spine. A
three-tier fabric (leaves_per_pod) groups leaves into pods the same way (leaf l in pod l mod pods);
a pod's core uplinks carry what its leaves' uplinks can send divided by the core oversubscription.
A single switch has no uplinks: a NIC's links are named to and from the "switch".
"""

from __future__ import annotations

import networkx as nx
import numpy as np

from clustersim.topologies.cluster import Cluster
from clustersim.topologies.node import nic_bandwidth
from clustersim.topologies.placement import place

_INF = float("inf")


class FlowNetwork:
    """Link capacities and routes for a group spanning ``nodes`` nodes of ``cluster``."""

    def __init__(self, cluster: Cluster, nodes: int):
        spec = cluster.spec
        self.cluster = cluster
        self.nodes = nodes
        self.graph = cluster.graph
        self.edges = list(self.graph.edges)
        self.edge_index = {e: i for i, e in enumerate(self.edges)}
        self.E = len(self.edges)
        self.nics = spec.nic.count
        fabric = spec.fabric
        self.placement = place(fabric, nodes)
        per_leaf, per_pod = self.placement.nodes_per_leaf, self.placement.leaves_per_pod
        self.leaves, self.pods = self.placement.leaves, self.placement.pods
        self.single_switch = fabric.kind == "single_switch"
        self.nic_bw = nic_bandwidth(spec) if self.nics else 0.0
        self.rdma = (
            spec.nic.gpudirect_rdma if spec.nic.gpudirect_rdma is not None else spec.nic.kind == "infiniband"
        )
        self.nic_base = nodes * self.E
        self.leaf_base = self.nic_base + 2 * nodes * self.nics
        self.pod_base = self.leaf_base + 2 * self.leaves
        self.n_links = self.pod_base + 2 * self.pods
        cap = np.empty(self.n_links)
        node_caps = np.array([self.graph.edges[e]["capacity"] for e in self.edges], dtype=float)
        cap[: self.nic_base] = np.tile(node_caps, nodes)
        cap[self.nic_base : self.leaf_base] = self.nic_bw
        uplink = per_leaf * self.nics * self.nic_bw / fabric.oversubscription
        cap[self.leaf_base : self.pod_base] = uplink if self.leaves > 1 else _INF
        if self.pods > 1:
            cap[self.pod_base :] = per_pod * uplink / fabric.core_oversubscription
        else:
            cap[self.pod_base :] = _INF
        self.capacity = cap
        self.kind = np.empty(self.n_links, dtype=object)  # latency class per link, for calibration
        node_kinds = [self.graph.edges[e]["kind"].latency_class for e in self.edges]
        self.kind[: self.nic_base] = node_kinds * nodes
        self.kind[self.nic_base :] = "network"
        # Links of node 0, leaf 0 and pod 0: the ones named when collectives share the fabric.
        rep = np.zeros(self.n_links, dtype=bool)
        rep[: self.E] = True
        rep[self.nic_base : self.nic_base + 2 * self.nics] = True
        rep[self.leaf_base : self.leaf_base + 2] = True
        rep[self.pod_base : self.pod_base + 2] = True
        self.representative = rep
        self._paths: dict[tuple, list[int]] = {}
        self._nearest: dict[int, list[int]] = {}

    # ---- link indices ----------------------------------------------------------------------------
    def nic_up(self, node: int, nic: int) -> int:
        return self.nic_base + 2 * (node * self.nics + nic)

    def nic_down(self, node: int, nic: int) -> int:
        return self.nic_up(node, nic) + 1

    def leaf_of(self, node: int) -> int:
        return self.placement.leaf_of(node)

    def pod_of(self, leaf: int) -> int:
        return self.placement.pod_of(leaf)

    def pod_up(self, pod: int) -> int:
        return self.pod_base + 2 * pod

    def pod_down(self, pod: int) -> int:
        return self.pod_base + 2 * pod + 1

    def leaf_up(self, leaf: int) -> int:
        return self.leaf_base + 2 * leaf

    def leaf_down(self, leaf: int) -> int:
        return self.leaf_base + 2 * leaf + 1

    def name(self, link: int) -> str:
        """A link's readable name, for the hottest-links output."""
        if link < self.nic_base:
            node, e = divmod(link, self.E)
            u, v = self.edges[e]
            return f"node{node} {u}->{v}"
        if link < self.leaf_base:
            k, up = divmod(link - self.nic_base, 2)
            node, nic = divmod(k, self.nics)
            switch = "switch" if self.single_switch else "leaf"
            return f"node{node} nic{nic} {'-> ' if up == 0 else '<- '}{switch}"
        if link < self.pod_base:
            leaf, up = divmod(link - self.leaf_base, 2)
            return f"leaf{leaf} {'-> spine' if up == 0 else '<- spine'}"
        pod, up = divmod(link - self.pod_base, 2)
        return f"pod{pod} {'-> core' if up == 0 else '<- core'}"

    # ---- routes inside a node ----------------------------------------------------------------------
    def _local(self, a: str, b: str, via_pcie: bool) -> list[int]:
        """Edge indices of a node-local route a -> b: NVLink allowed (NCCL's peer path, weighted by
        1/capacity as Cluster._routed_ring does) or PCIe only (GPU <-> NIC, as Cluster.injection);
        through a CPU where peer-to-peer (or GPUDirect RDMA) is off."""
        key = (a, b, via_pcie)
        hit = self._paths.get(key)
        if hit is not None:
            return hit
        spec = self.cluster.spec
        g = self.graph
        if via_pcie:
            g = nx.restricted_view(
                g, [], [(u, v) for u, v, d in g.edges(data=True) if d["kind"].latency_class == "nvlink"]
            )
        staged = (
            (not self.rdma) if via_pcie else (spec.intra_node.fabric == "pcie" and not spec.intra_node.p2p)
        )
        if staged:
            cpu = nx.shortest_path(g, a, "cpu0")[-1]
            path = nx.shortest_path(g, a, cpu) + nx.shortest_path(g, cpu, b)[1:]
        else:
            path = nx.shortest_path(g, a, b, weight=lambda u, v, d: 1.0 / d["capacity"])
        out = [self.edge_index[e] for e in zip(path, path[1:])]
        self._paths[key] = out
        return out

    def nearest_gpus(self, nic: int) -> list[int]:
        """Local GPU indices ordered by PCIe distance to ``nic`` (ties: lower index first)."""
        hit = self._nearest.get(nic)
        if hit is None:
            gpus = self.cluster.spec.gpus_per_node
            hit = sorted(range(gpus), key=lambda i: (len(self._local(f"gpu{i}", f"nic{nic}", True)), i))
            self._nearest[nic] = hit
        return hit

    def intra(self, node: int, a: int, b: int) -> list[int]:
        """GPU a -> GPU b of one node."""
        base = node * self.E
        return [base + e for e in self._local(f"gpu{a}", f"gpu{b}", False)]

    def inter(self, src: tuple[int, int], dst: tuple[int, int], nic: int) -> list[int]:
        """GPU src=(node, gpu) -> its node's NIC ``nic`` -> fabric -> dst node's NIC ``nic`` -> GPU."""
        (n1, a), (n2, b) = src, dst
        links = [n1 * self.E + e for e in self._local(f"gpu{a}", f"nic{nic}", True)]
        links.append(self.nic_up(n1, nic))
        l1, l2 = self.leaf_of(n1), self.leaf_of(n2)
        if l1 != l2:
            p1, p2 = self.pod_of(l1), self.pod_of(l2)
            pods = [self.pod_up(p1), self.pod_down(p2)] if p1 != p2 else []
            links += [self.leaf_up(l1), *pods, self.leaf_down(l2)]
        links.append(self.nic_down(n2, nic))
        links += [n2 * self.E + e for e in self._local(f"nic{nic}", f"gpu{b}", True)]
        return links
