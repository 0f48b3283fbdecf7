"""Where a group's nodes sit on a leaf-spine fabric: one rule shared by the analytical model (which
counts the bytes a pattern sends over a leaf's uplinks) and the flow backend (which routes them).

A group of N nodes sits on the fewest leaves that hold it, ceil(N / nodes_per_leaf), and consecutive
nodes are on different leaves (node i on leaf i mod leaves): every inter-node hop of a ring crosses
the spine, the worst case for a ring, which the analytical model's "oversubscription applies once the
group spans leaves" assumes. A three-tier fabric (leaves_per_pod) groups leaves into pods the same
way (leaf l in pod l mod pods). A single switch is one leaf.
"""

from __future__ import annotations

from dataclasses import dataclass

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
