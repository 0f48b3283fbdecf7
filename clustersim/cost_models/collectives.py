"""Topology-aware collective costs with NCCL-like algorithm and protocol selection.

For a group of ranks the cluster supplies the ring bus bandwidth (slowest of the intra-node ring
and the per-node NIC share) and per-step latencies. Each (algorithm, protocol) pair gets
``base latency + steps x hop latency + bytes / (bandwidth x protocol efficiency)``; ``auto`` picks
the cheapest of NCCL's own choices (ring and tree, LL / LL128 / Simple, LL128 only on NVLink).
Halving-doubling and the explicit two-level hierarchical all-reduce can be forced.

Each cost also reports the bytes that cross intra-node links and NICs per node, so a run can show
"bytes moved per link kind" and tests can check bytes sent = bytes received.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clustersim.catalog import hardware_defaults
from clustersim.cost_models import closed_forms as cf
from clustersim.errors import InputError
from clustersim.topologies.cluster import Cluster, GroupShape

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
ALGORITHMS = ("auto", "ring", "tree", "hd", "hier")
PROTOCOLS = ("LL", "LL128", "Simple")


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

    @property
    def algbw(self) -> float:
        return self.nbytes / self.time if self.time > 0 else float("inf")

    @property
    def busbw(self) -> float:
        return self.algbw * cf.busbw_factor(self.op, self.ranks)


def _lg(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


class CollectiveModel:
    """Collective times on one cluster; a calibration profile may supply measured overrides."""

    def __init__(self, cluster: Cluster, measured=None):
        self.cluster = cluster
        self.measured = measured  # calibration.CollectiveFits or None
        nccl = hardware_defaults()["nccl"]
        self._base = {p: v * 1e-6 for p, v in nccl["base_latency_us"].items()}
        self._proto_bw = nccl["protocol_bandwidth_fraction"]

    def _protocols(self, shape: GroupShape) -> tuple[str, ...]:
        nvlink_only = shape.nodes == 1 and self.cluster.intra_ring(shape.gpus_per_node).latency_class == "nvlink"
        return PROTOCOLS if nvlink_only else ("LL", "Simple")

    def cost(self, op: str, nbytes: float, shape: GroupShape, algorithm: str = "auto") -> CollectiveCost:
        if op not in OPS:
            raise InputError(f"unknown collective {op!r} (known: {', '.join(OPS)})", key="op")
        if algorithm not in ALGORITHMS:
            raise InputError(f"unknown algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})", key="algo")
        p = shape.ranks
        if p <= 1 or nbytes <= 0:
            return CollectiveCost(op, nbytes, p, "none", "none", 0.0, 0.0, 0.0, "single rank")
        if self.measured is not None:
            hit = self.measured.predict(op, nbytes, shape)
            if hit is not None:
                return hit
        candidates = self._candidates(op, algorithm, shape)
        if not candidates:
            raise InputError(f"algorithm {algorithm!r} does not apply to {op} on {shape.nodes} node(s)", key="algo")
        best = None
        for algo in candidates:
            for proto in self._protocols(shape):
                c = self._evaluate(op, algo, proto, nbytes, shape)
                if best is None or c.time < best.time:
                    best = c
        return best

    def _candidates(self, op: str, algorithm: str, shape: GroupShape) -> list[str]:
        natural = {
            "all_reduce": ["ring", "tree", "hd", "hier"],
            "all_gather": ["ring", "hd"], "reduce_scatter": ["ring", "hd"],
            "all_to_all": ["ring"], "broadcast": ["ring", "tree"],
        }[op]
        if shape.nodes == 1 or shape.gpus_per_node == 1:
            natural = [a for a in natural if a != "hier"]
        if algorithm == "auto":
            return [a for a in natural if a in ("ring", "tree")]  # NCCL's own choices
        return [algorithm] if algorithm in natural else []

    def _evaluate(self, op: str, algo: str, proto: str, S: float, shape: GroupShape) -> CollectiveCost:
        cl = self.cluster
        p, g, N = shape.ranks, shape.gpus_per_node, shape.nodes
        ring = cl.ring(shape)
        frac = self._proto_bw[proto]
        beta = 1.0 / (ring.bytes_per_s * frac)
        alpha = cl.step_latency(shape, proto)
        base = self._base[proto]
        bottleneck = ring.bottleneck
        intra_bw = cl.intra_ring(g).bytes_per_s * frac
        inter_bw = cl.inter_node(shape).bytes_per_s * frac if N > 1 else math.inf
        if op == "all_reduce":
            per_rank = 2 * (p - 1) / p * S
            inter = per_rank if N > 1 else 0.0
            if algo == "ring":
                t = cf.ring_allreduce(p, S, alpha, beta)
            elif algo == "tree":
                t = cf.double_binary_tree_allreduce(p, S, alpha, beta)
                per_rank = 2 * S
                inter = 2 * S if N > 1 else 0.0
            elif algo == "hd":
                lat = 2 * _lg(p) * alpha
                inter = 2 * (N - 1) / N * S * g if N > 1 else 0.0
                t = lat + inter / inter_bw + 2 * (g - 1) / g * (S / N) / intra_bw if N > 1 else \
                    cf.halving_doubling_allreduce(p, S, alpha, beta)
            else:  # hier
                rail = cl.inter_node(GroupShape(N, 1, sharing=g))
                alpha_l = cl.step_latency(GroupShape(1, g), proto)
                t = cf.hierarchical_allreduce(g, N, S, alpha_l, 1 / intra_bw, alpha,
                                              1 / (rail.bytes_per_s * frac))
                inter = 2 * (N - 1) / N * S
                per_rank = 2 * (g - 1) / g * S + 2 * (N - 1) / N * S / g
                bottleneck = rail.bottleneck if N > 1 else bottleneck
            intra = g * per_rank - inter
        elif op in ("all_gather", "reduce_scatter"):
            per_rank = (p - 1) / p * S
            inter = per_rank if N > 1 else 0.0
            if algo == "ring":
                t = cf.ring_allgather(p, S, alpha, beta)
            elif N > 1:  # recursive doubling/halving, node-contiguous ranks: the first lg N steps cross nodes
                inter = (N - 1) / N * S * g
                t = _lg(p) * alpha + inter / inter_bw + (g - 1) / g * (S / N) / intra_bw
            else:
                t = _lg(p) * alpha + (p - 1) / p * S * beta
            intra = g * per_rank - inter
        elif op == "all_to_all":
            # Each rank sends S/p to every other rank; intra- and inter-node parts run concurrently.
            inter = g * (p - g) / p * S
            intra = g * (g - 1) / p * S
            if N == 1:
                t = cf.pairwise_alltoall(p, S, alpha, beta)
            else:
                t = (p - 1) * alpha + max(inter / inter_bw, (g - 1) / p * S / intra_bw if g > 1 else 0.0)
                if inter / inter_bw < (g - 1) / p * S / intra_bw:
                    bottleneck = cl.intra_ring(g).bottleneck
                else:
                    bottleneck = cl.inter_node(shape).bottleneck
        else:  # broadcast
            if algo == "tree":
                t = cf.binomial_broadcast(p, S, alpha, beta)
            else:
                t = cf.pipelined_ring_broadcast(p, S, alpha, beta)
            inter = S if N > 1 else 0.0
            intra = g * S - inter
        return CollectiveCost(op, S, p, algo, proto, base + t, max(intra, 0.0), inter, bottleneck)
