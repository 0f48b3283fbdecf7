"""Network faults and other jobs as the flow backend sees them (scenario: cluster.heterogeneity).

A degraded NIC scales the capacity of its links to and from the leaf. A background job is a set of
greedy flows (no size: they never finish) on the NICs of some nodes or on some leaves' spine
uplinks; max-min sharing gives a collective's flows their fair share beside them, so one background
flow beside one flow of ours halves what ours gets. Node and leaf numbers are those of a group that
starts at node 0 (the flow backend places every communicator there, see fabric.py).
"""

from __future__ import annotations

from clustersim.simulator.network.fabric import FlowNetwork


def apply_degraded(net: FlowNetwork, hetero) -> None:
    for d in hetero.degraded_nics:
        if d.node < net.nodes:
            net.capacity[net.nic_up(d.node, d.nic)] *= d.bandwidth_factor
            net.capacity[net.nic_down(d.node, d.nic)] *= d.bandwidth_factor


def background_paths(net: FlowNetwork, hetero) -> tuple[list[list[int]], list[float]]:
    """One single-link path per link a background job uses, weighted by its flows on that link
    (``flows_per_link`` identical greedy flows share as that many copies: maxmin.FlowSet's weights)."""
    paths: list[list[int]] = []
    weights: list[float] = []
    for job in hetero.background:
        if job.links == "nics":
            nodes = [n for n in (job.nodes if job.nodes is not None else range(net.nodes)) if n < net.nodes]
            links = [f(n, m) for n in nodes for m in range(net.nics) for f in (net.nic_up, net.nic_down)]
        else:
            if net.leaves < 2:  # a group inside one leaf never uses its uplinks
                continue
            leaves = [
                x for x in (job.nodes if job.nodes is not None else range(net.leaves)) if x < net.leaves
            ]
            links = [f(x) for x in leaves for f in (net.leaf_up, net.leaf_down)]
        paths += [[link] for link in links]
        weights += [float(job.flows_per_link)] * len(links)
    return paths, weights
