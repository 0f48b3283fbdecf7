"""Where a group's nodes sit on a leaf-spine fabric: one rule shared by the analytical model (which
counts the bytes a pattern sends over a leaf's uplinks) and the flow backend (which routes them).

A group of N nodes sits on the fewest leaves that hold it, ceil(N / nodes_per_leaf), and consecutive
nodes are on different leaves (node i on leaf i mod leaves): every inter-node hop of a ring crosses
the spine, the worst case for a ring (a scheduler that fills leaves in rank order crosses once per
leaf). ring_shares, alltoall_shares and cost_models/nccl_trees.spine_shares count what crosses. A
three-tier fabric (leaves_per_pod) groups leaves into pods the same way (leaf l in pod l mod pods). A
single switch is one leaf.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from clustersim.scenario import FabricSpec


@dataclass(frozen=True)
class Placement:
    nodes: int
    nodes_per_leaf: int
    leaves: int
    leaves_per_pod: int | None  # None: two tiers (or one switch)
    pods: int

    def leaf_of(self, node: int) -> int:
        return node % self.leaves

    def pod_of(self, leaf: int) -> int:
        return leaf % self.pods


def place(fabric: FabricSpec, nodes: int) -> Placement:
    """The placement of a group of ``nodes`` nodes on ``fabric``."""
    leaf_spine = fabric.kind != "single_switch"
    per_leaf = fabric.nodes_per_leaf if leaf_spine else max(nodes, 1)
    leaves = max(1, -(-nodes // per_leaf))
    per_pod = fabric.leaves_per_pod if leaf_spine and fabric.leaves_per_pod else None
    pods = max(1, -(-leaves // per_pod)) if per_pod else 1
    return Placement(nodes, per_leaf, leaves, per_pod, pods)


@lru_cache(maxsize=512)
def ring_shares(placement: Placement) -> tuple[float, float]:
    """(leaf, pod) shares of a ring over the nodes in order: the most ring hops leaving one leaf (pod)
    over the nodes its uplink is sized for, nodes_per_leaf (leaves_per_pod x nodes_per_leaf). Each hop
    carries a node's whole ring traffic, so the uplink's time is share x r times the NICs'. On full
    leaves every hop crosses (node i and i + 1 are on different leaves): share 1, the oversubscription
    in full; a group that fills its leaves only partly leaves their uplinks spare capacity."""
    p = placement
    if p.leaves < 2:
        return 0.0, 0.0
    leaf_up = [0] * p.leaves
    pod_up = [0] * p.pods
    for n in range(p.nodes):
        a, b = p.leaf_of(n), p.leaf_of((n + 1) % p.nodes)
        if a != b:
            leaf_up[a] += 1
            if p.pod_of(a) != p.pod_of(b):
                pod_up[p.pod_of(a)] += 1
    leaf = max(leaf_up) / p.nodes_per_leaf
    pod = max(pod_up) / ((p.leaves_per_pod or 1) * p.nodes_per_leaf) if p.pods > 1 else 0.0
    return leaf, pod


@lru_cache(maxsize=512)
def alltoall_shares(placement: Placement) -> tuple[float, float]:
    """(leaf, pod) shares of an all-to-all over the nodes: a node sends 1/(N-1) of its NIC traffic to
    each other node (its GPUs' bytes for their own node stay on NVLink), so a leaf of k nodes sends
    k x (N-k)/(N-1) of a node's traffic across its uplink per direction, over the nodes_per_leaf its
    uplink is sized for (a pod likewise over leaves_per_pod x nodes_per_leaf). Every send is posted at
    once (NCCL's grouped send/recv, MPI's Isend/Irecv), so the uplink's time is share x r times the
    NICs'. Two full leaves of 4: 4/7 of the traffic crosses, 2.3x the NICs' time at 4:1, not 4x."""
    p = placement
    if p.leaves < 2:
        return 0.0, 0.0
    on_leaf = [0] * p.leaves
    for n in range(p.nodes):
        on_leaf[p.leaf_of(n)] += 1
    on_pod = [0] * p.pods
    for leaf, k in enumerate(on_leaf):
        on_pod[p.pod_of(leaf)] += k
    others = p.nodes - 1
    leaf = max(k * (p.nodes - k) for k in on_leaf) / (others * p.nodes_per_leaf)
    pod_size = (p.leaves_per_pod or 1) * p.nodes_per_leaf
    pod = max(k * (p.nodes - k) for k in on_pod) / (others * pod_size) if p.pods > 1 else 0.0
    return leaf, pod
