"""NCCL's double binary tree over a group's nodes, and the share of it that crosses the spine.

NCCL builds its two trees over the nodes in rank order (src/graph/trees.cc ncclGetBtree, ncclGetDtree;
Sanders, Speck & Träff 2009). Each tree carries half the array: S/2 up every edge (reduce) and S/2
down it (broadcast), all edges at once (pipelined). A leaf's uplink carries S/2 per direction for
every tree edge with one end on the leaf and the other elsewhere; which edges cross depends on where
the nodes sit (topologies/placement.py). Both backends use these trees: the flow backend routes their
edges (simulator/network/patterns.tree_allreduce), the analytical model prices the share computed here.
"""

from __future__ import annotations

from functools import lru_cache

from clustersim.topologies.placement import Placement


def btree_parent(k: int, r: int) -> int:
    """Parent of rank r in NCCL's binary tree over k ranks (ncclGetBtree): odd ranks are leaves,
    rank 0 the root."""
    if r == 0:
        return -1
    bit = r & -r
    up = (r ^ bit) | (bit << 1)
    return up if up < k else r ^ bit


@lru_cache(maxsize=256)
def double_tree(k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """NCCL's two complementary trees (ncclGetDtree) as parent lists: the second mirrors the first
    (k even) or shifts it by one (k odd), so the first's leaves are the second's inner ranks. Memoized
    (the flow backend asks for it per NIC of every communicator)."""
    a = tuple(btree_parent(k, r) for r in range(k))
    if k % 2:
        b = tuple(-1 if (u := btree_parent(k, (r - 1) % k)) < 0 else (u + 1) % k for r in range(k))
    else:
        b = tuple(-1 if (u := btree_parent(k, k - 1 - r)) < 0 else k - 1 - u for r in range(k))
    return a, b


def double_tree_edges(nodes: int) -> int:
    """The most tree edges one node has in NCCL's two complementary binary trees over ``nodes`` nodes.
    Each tree carries half the array up (reduce) and down (broadcast), so a node sends S/2 per edge.
    From 4 nodes on some node is interior in one tree (a parent and two children) and a leaf in the
    other: 4 edges, 2S. Two nodes: each is the root of one tree with the other as its only child: 2
    edges, S. Three: 3 edges, 1.5S (tests/test_flow_network.py checks this against the trees)."""
    return min(max(nodes, 0), 4)


@lru_cache(maxsize=512)
def spine_shares(placement: Placement) -> tuple[float, float]:
    """(leaf, pod) shares of the double tree on ``placement``: the most bytes one leaf's (pod's)
    uplink carries per direction, over what its nodes_per_leaf (leaves_per_pod x nodes_per_leaf) nodes
    would push through it if each sent the busiest node's NIC load (double_tree_edges x S/2) and all
    of it left the leaf. A ring under the placement's rule sends all of it across (share 1), so the
    share scales the oversubscription: the tree's uplink time is share x r times its NIC time.

    Nodes on leaf i mod L: on two leaves every leaf-of-a-tree (odd rank, an edge to an even parent)
    crosses and no inner edge does, N crossings of the 2(N-1) edges, share 1/2; from four leaves
    on (L a power of two) every edge crosses, share 1."""
    n, p = placement.nodes, placement
    busiest = double_tree_edges(n) / 2
    if p.leaves < 2 or busiest == 0:
        return 0.0, 0.0
    leaf_up = [0.0] * p.leaves
    pod_up = [0.0] * p.pods
    for parent in double_tree(n):
        for child, up in enumerate(parent):
            if up < 0:
                continue
            a, b = p.leaf_of(child), p.leaf_of(up)
            if a == b:
                continue
            leaf_up[a] += 0.5  # the child's half-array going up (reduce)
            leaf_up[b] += 0.5  # the parent's half-array coming down (broadcast)
            pa, pb = p.pod_of(a), p.pod_of(b)
            if pa != pb:
                pod_up[pa] += 0.5
                pod_up[pb] += 0.5
    leaf = max(leaf_up) / (p.nodes_per_leaf * busiest)
    pod = max(pod_up) / ((p.leaves_per_pod or 1) * p.nodes_per_leaf * busiest) if p.pods > 1 else 0.0
    return leaf, pod
