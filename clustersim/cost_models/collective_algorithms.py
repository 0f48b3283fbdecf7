"""Collective algorithms as data: one small function per (op, algorithm), registered by name.

Each function describes *what* an algorithm does on a group of the cluster, not how long it takes:
its latency steps (how many, over which link class) and its bandwidth legs (bytes over which
modelled link, run one after another or concurrently), plus the bytes it puts on intra-node links
and NICs. The collective model (collectives.py) prices a decomposition with the default or the
calibrated network parameters, so a fit made on a few nodes extrapolates with the right step counts
and bottlenecks (algorithms.md sec. 7: "keep latency-step counts and bandwidth bottlenecks separate").

Formulas: Thakur, Rabenseifner & Gropp 2005 (closed_forms.py), for p ranks, g per node, N nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from clustersim.catalog import hardware_defaults
from clustersim.cost_models.closed_forms import lg
from clustersim.cost_models.nccl_trees import double_tree_edges, spine_shares
from clustersim.topologies.cluster import Bandwidth, Cluster, GroupShape
from clustersim.topologies.placement import alltoall_shares, place


@dataclass(frozen=True)
class Leg:
    """Bytes that cross one modelled link (per rank on the critical path)."""

    nbytes: float
    link: Bandwidth


@dataclass(frozen=True)
class Decomposition:
    latency_steps: tuple[tuple[float, str], ...]  # (steps, latency class: nvlink | pcie | network)
    legs: tuple[Leg, ...]
    concurrent: bool  # legs overlap (max) instead of following each other (sum)
    intra_node_bytes: float  # per node
    inter_node_bytes: float  # per node, out of its NICs
    bottleneck: str
    # What NCCL's tuner believes the algorithm costs, where that differs from what it moves: NCCL picks
    # its algorithm by this (collectives.CollectiveModel), the time is the decomposition's own.
    tuner: Decomposition | None = None
    # Steps in lockstep across nodes (ring, tree, halving-doubling rounds): each waits for the slowest
    # node's link, so the network legs are paced (closed_forms.paced_factor). A bulk exchange posted
    # at once (all-to-all) or one pair's transfer averages its rate over the whole transfer instead.
    paced: bool = True


@dataclass(frozen=True)
class Inputs:
    cluster: Cluster
    shape: GroupShape
    nbytes: float

    @property
    def p(self) -> int:
        return self.shape.ranks

    @property
    def g(self) -> int:
        return self.shape.gpus_per_node

    @property
    def n(self) -> int:
        return self.shape.nodes

    def step_class(self) -> str:
        return "network" if self.n > 1 else self.cluster.intra_ring(self.g).latency_class

    def ring(self) -> Bandwidth:
        return self.cluster.ring(self.shape)

    def intra(self) -> Bandwidth:
        return self.cluster.intra_ring(self.g)

    def inter(self) -> Bandwidth:
        return self.cluster.inter_node(self.shape)

    def tuner_inter(self) -> Bandwidth:
        """The inter-node bandwidth as NCCL's tuner sees it: from the NIC's link speed, which the net
        plugin reports (net_socket.cc reads /sys/class/net/<if>/speed, net_ib.cc the port's rate), not
        a measured effective rate (cluster.nic.effective_gbps)."""
        inter = self.inter()
        nic = self.cluster.spec.nic
        if nic.effective_gbps is None:
            return inter
        ratio = nic.line_rate_gbps * hardware_defaults()["nic"][nic.kind] / nic.effective_gbps
        return Bandwidth(inter.bytes_per_s * ratio, inter.bottleneck, "network")


Algorithm = Callable[[Inputs], Decomposition]
REGISTRY: dict[str, dict[str, Algorithm]] = {}
# What NCCL itself chooses among for each op (the others can be forced with --algo).
NCCL_AUTO = {
    "all_reduce": ("ring", "tree"),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "all_to_all": ("ring",),
    "broadcast": ("ring", "tree"),
    "send_recv": ("ring",),
}


def register(op: str, name: str, *, multi_node_only: bool = False):
    def wrap(fn: Algorithm) -> Algorithm:
        fn.multi_node_only = multi_node_only  # type: ignore[attr-defined]
        REGISTRY.setdefault(op, {})[name] = fn
        return fn

    return wrap


def ops() -> tuple[str, ...]:
    return tuple(REGISTRY)


def algorithm_names() -> tuple[str, ...]:
    """Every algorithm name, for the schema's literal and --algo's help (plus ``auto``)."""
    names: list[str] = []
    for algos in REGISTRY.values():
        names += [a for a in algos if a not in names]
    return ("auto", *names)


def applicable(op: str, shape: GroupShape) -> dict[str, Algorithm]:
    flat = shape.nodes == 1 or shape.gpus_per_node == 1
    return {k: f for k, f in REGISTRY[op].items() if not (flat and f.multi_node_only)}  # type: ignore[attr-defined]


def _ring_like(x: Inputs, steps: float, per_rank: float, inter: float) -> Decomposition:
    ring = x.ring()
    return Decomposition(
        ((steps, x.step_class()),),
        (Leg(per_rank, ring),),
        False,
        max(x.g * per_rank - inter, 0.0),
        inter,
        ring.bottleneck,
    )


# ---- all_reduce ----------------------------------------------------------------------------------
@register("all_reduce", "ring")
def _allreduce_ring(x: Inputs) -> Decomposition:
    per_rank = 2 * (x.p - 1) / x.p * x.nbytes
    plan = _ring_like(x, 2 * (x.p - 1), per_rank, per_rank if x.n > 1 else 0.0)
    if x.n == 2 and x.cluster.spec.nic.effective_gbps is not None:
        # on 2 nodes NCCL weighs ring against tree by its own view of the NIC (_two_node_tree_belief)
        seen = min(x.tuner_inter(), x.intra(), key=lambda b: b.bytes_per_s)
        believed = Decomposition(plan.latency_steps, (Leg(per_rank, seen),), False, 0.0, 0.0, seen.bottleneck)
        return replace(plan, tuner=believed)
    return plan


def _two_node_tree_belief(x: Inputs, S: float) -> Decomposition:
    """What NCCL's tuner believes a tree on 2 nodes costs: src/graph/search.cc raises a tree's intra-node
    bandwidth up to twice its inter-node one ("increase bwIntra for trees (2 nodes or collnet)") and
    src/graph/tuning.cc prices any algorithm on nNodes <= 2 by that intra-node bandwidth, so the tree is
    costed as what it moves: S through the NIC beside 2S along the node's chain, at the tree's .92
    discount. A node whose GPUs talk to each other at less than twice the NIC's rate (the 1-bit Adam
    paper's PCIe nodes, 4.2 GB/s against 40 GbE) keeps the ring; an NVLink node (its InfiniBand
    nodes: 42 GB/s against 40 Gb/s) gets the tree, as NCCL's maintainers describe ("On two nodes, NCCL
    uses the tree algorithm which can go beyond the network bottleneck",
    github.com/NVIDIA/nccl-tests/issues/196)."""
    f = hardware_defaults()["nccl"]["tuner_tree_bandwidth_factor"]
    nic, intra = x.tuner_inter(), x.intra()
    legs = (Leg(S, Bandwidth(nic.bytes_per_s * f, nic.bottleneck, "network")),)
    if x.g > 1:
        legs += (Leg(2 * S, Bandwidth(intra.bytes_per_s * f, intra.bottleneck, intra.latency_class)),)
    return Decomposition(((2 * lg(x.p), "network"),), legs, True, 0.0, 0.0, nic.bottleneck)


@register("all_reduce", "tree")
def _allreduce_tree(x: Inputs) -> Decomposition:
    """NCCL's double binary tree: 2·lg p steps. Inside a node the trees are chains of its GPUs, each
    GPU sending and receiving the whole array twice over the intra-node links; across nodes a node's
    NICs send S/2 per tree edge it has (double_tree_edges: 2S from 4 nodes on, S on 2, 1.5S on 3).
    On an oversubscribed leaf-spine fabric only the tree edges between leaves share the uplinks
    (nccl_trees.spine_shares: half of a leaf's NIC traffic on two leaves, all of it from four on), so
    the NICs' rate is divided by r x that share where it exceeds 1, not by r as a ring's.
    The chains and the NICs are pipelined: the two legs run concurrently. NCCL's tuner (``tuner``)
    costs it at 2S from 3 nodes on, and on 2 nodes by what it moves (_two_node_tree_belief), so a
    bandwidth-bound all-reduce on 2 nodes whose GPUs talk faster than twice the NIC is a tree."""
    S = x.nbytes
    believed = _ring_like(x, 2 * lg(x.p), 2 * S, 2 * S if x.n > 1 else 0.0)
    if x.n == 1:
        return believed
    inter = double_tree_edges(x.n) / 2 * S
    link = x.cluster.inter_node(x.shape, *spine_shares(place(x.cluster.spec.fabric, x.n)))
    legs = (Leg(inter, link),) + ((Leg(2 * S, x.intra()),) if x.g > 1 else ())
    intra_bound = x.g > 1 and inter / link.bytes_per_s < 2 * S / x.intra().bytes_per_s
    return Decomposition(
        ((2 * lg(x.p), "network"),),
        legs,
        True,
        max(x.g * 2 * S - inter, 0.0),
        inter,
        x.intra().bottleneck if intra_bound else link.bottleneck,
        # NCCL's tuner (src/graph/tuning.cc) gives a tree half its bus bandwidth as algorithm bandwidth,
        # i.e. 2S over the inter-node bandwidth from 3 nodes on (3 nodes: as if it sent 2S); on 2
        # nodes over the intra-node one, up to twice the NIC's.
        _two_node_tree_belief(x, S) if x.n == 2 else None if inter == 2 * S else believed,
    )


@register("all_reduce", "hd")
def _allreduce_hd(x: Inputs) -> Decomposition:
    """Rabenseifner halving-doubling; node-contiguous ranks, so the first lg N rounds cross nodes."""
    S, p, g, N = x.nbytes, x.p, x.g, x.n
    if N == 1:
        return _ring_like(x, 2 * lg(p), 2 * (p - 1) / p * S, 0.0)
    inter = 2 * (N - 1) / N * S * g
    legs = (Leg(inter, x.inter()), Leg(2 * (g - 1) / g * (S / N), x.intra()))
    per_rank = 2 * (p - 1) / p * S
    return Decomposition(
        ((2 * lg(p), "network"),), legs, False, max(g * per_rank - inter, 0.0), inter, x.ring().bottleneck
    )


@register("all_reduce", "hier", multi_node_only=True)
def _allreduce_hier(x: Inputs) -> Decomposition:
    """Reduce-scatter in the node, all-reduce of S/g shards across nodes on g rails, all-gather."""
    S, g, N = x.nbytes, x.g, x.n
    rail = x.cluster.inter_node(GroupShape(N, 1, sharing=g))
    intra_cls = x.cluster.intra_ring(g).latency_class
    legs = (Leg(2 * (g - 1) / g * S, x.intra()), Leg(2 * (N - 1) / N * S / g, rail))
    inter = 2 * (N - 1) / N * S
    per_rank = 2 * (g - 1) / g * S + 2 * (N - 1) / N * S / g
    return Decomposition(
        ((2 * (g - 1), intra_cls), (2 * (N - 1), "network")),
        legs,
        False,
        max(g * per_rank - inter, 0.0),
        inter,
        rail.bottleneck,
    )


# ---- all_gather / reduce_scatter (S = the whole array) ---------------------------------------------
def _gather_ring(x: Inputs) -> Decomposition:
    per_rank = (x.p - 1) / x.p * x.nbytes
    return _ring_like(x, x.p - 1, per_rank, per_rank if x.n > 1 else 0.0)


def _gather_hd(x: Inputs) -> Decomposition:
    """Recursive doubling (all-gather) / halving (reduce-scatter)."""
    S, p, g, N = x.nbytes, x.p, x.g, x.n
    per_rank = (p - 1) / p * S
    if N == 1:
        return _ring_like(x, lg(p), per_rank, 0.0)
    inter = (N - 1) / N * S * g
    legs = (Leg(inter, x.inter()), Leg((g - 1) / g * (S / N), x.intra()))
    return Decomposition(
        ((lg(p), "network"),), legs, False, max(g * per_rank - inter, 0.0), inter, x.ring().bottleneck
    )


for _op in ("all_gather", "reduce_scatter"):
    register(_op, "ring")(_gather_ring)
    register(_op, "hd")(_gather_hd)


@register("reduce_scatter", "via_all_reduce")
def _reduce_scatter_via_all_reduce(x: Inputs) -> Decomposition:
    """A reduce-scatter run as a ring all-reduce of the whole array, each rank keeping its slice:
    what gloo does (torch 2.13's ProcessGroupGloo reduce_scatter). Measured on the emulated testbed
    (/proc/net/dev, 4 MiB, 200 Mb/s): a rank sends 1.00·S on 2 hosts and 1.50·S on 4, exactly its
    all-reduce's 2(p-1)/p·S and in the all-reduce's time, where a ring reduce-scatter sends (p-1)/p·S.
    A gloo calibration uses it (calibration/network_fit.py KNOWN_ALGORITHMS); NCCL never does."""
    return _allreduce_ring(x)


# ---- all_to_all (S = bytes each rank sends in total) -----------------------------------------------
@register("all_to_all", "ring")
def _alltoall_pairwise(x: Inputs) -> Decomposition:
    """Pairwise exchange, p-1 steps; across nodes the intra- and inter-node parts run concurrently.
    On an oversubscribed leaf-spine fabric only the bytes for nodes on other leaves share the uplinks
    (placement.alltoall_shares: 4/7 of them on two leaves of 4), so the NICs' rate is divided by
    r x that share where it exceeds 1, not by r as a ring's."""
    S, p, g, N = x.nbytes, x.p, x.g, x.n
    inter = g * (p - g) / p * S
    intra = g * (g - 1) / p * S
    if N == 1:
        return Decomposition(
            ((p - 1, x.step_class()),),
            (Leg((p - 1) / p * S, x.ring()),),
            False,
            intra,
            inter,
            x.ring().bottleneck,
        )
    inter_link = x.cluster.inter_node(x.shape, *alltoall_shares(place(x.cluster.spec.fabric, N)))
    intra_link = x.intra()
    legs = (Leg(inter, inter_link),) + ((Leg((g - 1) / p * S, intra_link),) if g > 1 else ())
    intra_bound = g > 1 and inter / inter_link.bytes_per_s < (g - 1) / p * S / intra_link.bytes_per_s
    # NCCL posts every send and receive of an all-to-all in one group, MPI as Isend/Irecv all at once
    # (DeepSpeed's 1-bit Adam): no step waits for another node's, so it is not paced.
    return Decomposition(
        ((p - 1, "network"),),
        legs,
        True,
        intra,
        inter,
        intra_link.bottleneck if intra_bound else inter_link.bottleneck,
        paced=False,
    )


# ---- broadcast ---------------------------------------------------------------------------------------
def _broadcast(x: Inputs, steps: float, transfers: float) -> Decomposition:
    """A broadcast of ``steps`` latency rounds whose critical path moves the array ``transfers`` times
    through a rank's link; every node but the root's receives it once (over its NIC when N > 1)."""
    inter = x.nbytes if x.n > 1 else 0.0
    ring = x.ring()
    return Decomposition(
        ((steps, x.step_class()),),
        (Leg(transfers * x.nbytes, ring),),
        False,
        max(x.g * x.nbytes - inter, 0.0),
        inter,
        ring.bottleneck,
    )


@register("broadcast", "ring")
def _broadcast_ring(x: Inputs) -> Decomposition:
    """Pipelined ring (NCCL): p-1 steps of latency, the array once through the bottleneck."""
    return _broadcast(x, x.p - 1, 1)


@register("broadcast", "tree")
def _broadcast_tree(x: Inputs) -> Decomposition:
    """Binomial tree: lg p rounds, each sending the whole array."""
    return _broadcast(x, lg(x.p), lg(x.p))


def concurrent_binomial_depth(p: int) -> int:
    """Whole-message transfers on the critical path of gloo's broadcast (gloo/broadcast.cc): a binomial
    tree in which every sender posts all its sends at once, so they share its uplink. A rank that
    received in round i sends to its children of rounds i+1..lg p-1 together; each child finishes
    ``children`` transfer times after its parent did. For p = 2^d this is d(d+1)/2."""
    dim = lg(p)
    done = {0: 0}
    for v in range(p):  # parents before children: a child's rank is its parent's plus a higher bit
        first = 0 if v == 0 else v.bit_length()
        children = [v + (1 << j) for j in range(first, dim) if v + (1 << j) < p]
        for c in children:
            done[c] = done[v] + len(children)
    return max(done.values())


@register("broadcast", "binomial_concurrent")
def _broadcast_gloo_tree(x: Inputs) -> Decomposition:
    """gloo's binomial tree with concurrent sends: lg p rounds of latency; the critical path moves the
    array concurrent_binomial_depth(p) times through a rank's link."""
    return _broadcast(x, lg(x.p), concurrent_binomial_depth(x.p))


# ---- send_recv -------------------------------------------------------------------------------------
@register("send_recv", "ring")
def _send_recv(x: Inputs) -> Decomposition:
    """One rank sends ``nbytes`` to its peer (NCCL ncclSend/ncclRecv, a pipeline stage boundary): one
    latency step and one transfer over the pair's link, a one-hop ring of two ranks. The shape is the
    pair (1 node x 2 GPUs, or 2 nodes x 1 GPU with ``sharing`` senders per node)."""
    ring = x.ring()
    inter = x.nbytes if x.n > 1 else 0.0
    return Decomposition(
        ((1, x.step_class()),),
        (Leg(x.nbytes, ring),),
        False,
        0.0 if x.n > 1 else x.nbytes,
        inter,
        ring.bottleneck,
        paced=False,  # one link: nothing to wait for
    )
