"""Closed-form α-β-γ costs of collective algorithms (Thakur, Rabenseifner & Gropp 2005).

p ranks, S bytes, α seconds per message, β seconds per byte, γ seconds per byte reduced.
S is the whole array for all-reduce, all-gather, reduce-scatter and broadcast, and the total bytes
each rank sends for all-to-all. These are the formulas the tests hold the topology-aware model to.
"""

from __future__ import annotations

import functools
import math


def lg(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


def ring_allreduce(p: int, S: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * S * beta + (p - 1) / p * S * gamma


def halving_doubling_allreduce(p: int, S: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
    if p <= 1:
        return 0.0
    return 2 * lg(p) * alpha + 2 * (p - 1) / p * S * beta + (p - 1) / p * S * gamma


def double_binary_tree_allreduce(p: int, S: float, alpha: float, beta: float) -> float:
    if p <= 1:
        return 0.0
    return 2 * lg(p) * alpha + 2 * S * beta


def ring_allgather(p: int, S: float, alpha: float, beta: float) -> float:
    if p <= 1:
        return 0.0
    return (p - 1) * alpha + (p - 1) / p * S * beta


def pairwise_alltoall(p: int, S: float, alpha: float, beta: float) -> float:
    if p <= 1:
        return 0.0
    return (p - 1) * alpha + (p - 1) / p * S * beta


def binomial_broadcast(p: int, S: float, alpha: float, beta: float) -> float:
    if p <= 1:
        return 0.0
    return lg(p) * (alpha + S * beta)


def pipelined_ring_broadcast(p: int, S: float, alpha: float, beta: float) -> float:
    if p <= 1:
        return 0.0
    return (p - 1) * alpha + S * beta


def hierarchical_allreduce(
    g: int, N: int, S: float, alpha_l: float, beta_l: float, alpha_n: float, beta_n: float
) -> float:
    """Reduce-scatter in the node, all-reduce of S/g shards across N nodes on g rails, all-gather."""
    intra = 2 * (g - 1) * alpha_l + 2 * (g - 1) / g * S * beta_l if g > 1 else 0.0
    inter = 2 * (N - 1) * alpha_n + 2 * (N - 1) / N * (S / g) * beta_n if N > 1 else 0.0
    return intra + inter


# nccl-tests' bus-bandwidth factors: busbw = algbw * factor (algbw = S / t).
def busbw_factor(op: str, p: int) -> float:
    if p <= 1:
        return 1.0
    return {
        "all_reduce": 2 * (p - 1) / p,
        "all_gather": (p - 1) / p,
        "reduce_scatter": (p - 1) / p,
        "all_to_all": (p - 1) / p,
        "broadcast": 1.0,
        "send_recv": 1.0,
    }[op]


@functools.lru_cache(maxsize=1)
def _normal_cdf_grid() -> tuple:
    """Φ on a grid wide enough that Φ^n of any n up to millions is 0 at its left end and 1 at its right."""
    import numpy as np

    step = 1e-3
    xs = np.linspace(-12.0, 12.0, 24001)
    return xs, np.array([0.5 * (1.0 + math.erf(x / math.sqrt(2.0))) for x in xs]), step


@functools.lru_cache(maxsize=4096)
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals]: 0 for n = 1, 1/√π for 2, 3/(2√π) for 3, 1.0294 for 4,
    growing like √(2 ln n) (3.25 at 1,024). From E[M] = ∫₀^∞ (1 - Φⁿ) dx - ∫_{-∞}^0 Φⁿ dx =
    12 - ∫_{-12}^{12} Φⁿ dx, trapezoidal on a 0.001 grid (error < 1e-6); cached per n."""
    if n <= 1:
        return 0.0
    xs, cdf, step = _normal_cdf_grid()
    powered = cdf**n
    return float(xs[-1] - step * (powered.sum() - 0.5 * (powered[0] + powered[-1])))


def paced_factor(nodes: int, cv: float) -> float:
    """How much longer a synchronous collective's network part takes when every step waits for the
    slowest of ``nodes`` nodes whose per-chunk rates spread by ``cv``: 1 + cv·E[max of N normals]."""
    if nodes <= 1 or cv <= 0:
        return 1.0
    return 1.0 + cv * expected_max_normal(nodes)
