"""Stragglers as rank classes: a slow GPU, or per-rank jitter, in a synchronous program.

The representative-rank program assumes every rank computes at the same speed. With a straggler,
two rank classes suffice for a data-parallel step whose collectives synchronise every rank: the
typical rank (class 0) and the slowest rank (class 1). A collective starts when both classes reached
it (each collective waits for the slowest rank, and with one compute factor per rank the slowest
rank is the same one at every collective), so the program is rewritten with each non-collective op
duplicated per class, compute ops of class 1 stretched by its factor, and each collective kept once
with the dependencies of both classes. Streams stay FIFO per (rank class, stream); class 1's host
links are its own (suffix ``@1``), as on a real node each GPU has its own PCIe link.

A node of another GPU type (node_gpus) is a compute factor on its ranks: the workload's forward and
backward time on that GPU over the cluster's (roofline, default efficiencies). Its memory is not
checked separately, and a faster GPU (factor < 1) is never the straggler.

Jitter (cluster.heterogeneity.jitter) draws one factor per rank (seeded): the typical class gets
the median of the other draws (typical_factor) and the slowest class the largest, combined with any
slow GPU's own factor.

With tensor and pipeline parallelism (replica_factors) the classes are data-parallel replicas: a
tensor-parallel group computes at its slowest member's pace (its all-reduces close every layer), a
replica runs its own pipeline, and replicas meet only at the data-parallel gradient collectives. The
slowest class is the replica holding the slowest rank (a 1F1B pipeline's steady state runs at the pace
of its slowest stage, so to first order that replica ends last), with that rank's stage stretched;
the typical replica takes, per stage, the median over the other replicas (typical_factor).
"""

from __future__ import annotations

import numpy as np

from clustersim.identifiers import COMPUTE_CATEGORIES, Stream
from clustersim.simulator.program import Op, Program

SUFFIX = "@1"


def rank_factors(hetero, world_size: int, gpus_per_node: int = 1, gpu_factor=None) -> np.ndarray | None:
    """Each rank's compute-time multiplier, or None without stragglers. ``gpu_factor(name)`` is how
    much longer the workload's forward and backward take on another catalog GPU (node_gpus)."""
    if hetero is None or (not hetero.slow_gpus and hetero.jitter is None and not hetero.node_gpus):
        return None
    factors = np.ones(world_size)
    j = hetero.jitter
    if j is not None:
        rng = np.random.default_rng(j.seed)
        if j.distribution == "lognormal":
            factors = np.exp(rng.normal(0.0, j.sigma, world_size))
        else:  # a normal draw around 1, floored where it would be no time at all
            factors = np.maximum(rng.normal(1.0, j.sigma, world_size), 0.05)
    for g in hetero.slow_gpus:
        factors[g.rank] *= g.compute_factor
    for n in hetero.node_gpus:
        factors[n.node * gpus_per_node : (n.node + 1) * gpus_per_node] *= gpu_factor(n.gpu)
    return factors


def typical_factor(factors: np.ndarray, slowest: int, axis: int = -1) -> np.ndarray:
    """The typical member's factor: the median over the members other than the slowest (index
    ``slowest`` along ``axis``), whom the slowest class stands for. Over all of them, two replicas at
    1.0 and 1.3 made a typical replica of 1.15 that no rank runs at (hiding part of the wait for the
    slow one); with one slow member among many the two agree. A lone member is its own typical."""
    if factors.shape[axis] == 1:
        return np.take(factors, 0, axis=axis)
    return np.median(np.delete(factors, slowest, axis=axis), axis=axis)


def replica_factors(factors: np.ndarray, tensor: int, data: int, pipeline: int):
    """Per pipeline stage, the typical replica's compute factor and the slowest replica's, from each
    rank's (Megatron's rank order: rank = tp + t*dp + t*d*pp), and the slowest rank's (stage, replica).
    A tensor-parallel group's factor is its slowest member's."""
    groups = factors.reshape(pipeline, data, tensor).max(axis=2)  # [stage, replica]
    slow = int(np.argmax(factors))
    stage, replica = slow // (tensor * data), (slow // tensor) % data
    typical = [float(x) for x in typical_factor(groups, replica, axis=1)]
    slowest = [float(x) for x in groups[:, replica]]
    return typical, slowest, (stage, replica)


def _stretched(op: Op, factor: float) -> float:
    if op.stream == Stream.COMPUTE and op.category in COMPUTE_CATEGORIES and op.compute_slowdown == 0.0:
        return op.duration * factor
    return op.duration


def _copy(prog: Program, op: Op, rank: int, factor: float, deps: tuple[int, ...], ranks: int = 1) -> int:
    """``op`` for rank class ``rank`` (1: the slowest), as op rank ``op.rank + rank * ranks``."""
    demands = {k + SUFFIX: v for k, v in op.demands.items()} if rank else dict(op.demands)
    new = Op(
        len(prog.ops),
        op.name if rank == 0 else f"{op.name} [slowest rank]",
        op.stream,
        _stretched(op, factor),
        op.category,
        deps,
        op.intra_node_bytes if rank == 0 else 0.0,
        op.inter_node_bytes if rank == 0 else 0.0,
        op.compute_slowdown,
        demands,
        op.meta,
        op.rank + rank * ranks,
        op.collective,
    )
    prog.ops.append(new)
    return new.id


def with_rank_classes(
    program: Program, typical, slowest, ranks: int = 1, synchronises=None
) -> tuple[Program, dict]:
    """``program`` rewritten for a typical rank (compute factor ``typical``) and the slowest rank
    (``slowest``). Returns the program and, per collective's new id, its deps on the typical rank
    (to report how long the typical rank waits for the slowest).

    A program of several ranks (pipeline stages, ``ranks`` of them) is rewritten for a typical
    replica and the slowest one: the factors are then per stage (sequences indexed by ``op.rank``),
    the slowest replica's ops get ranks offset by ``ranks``, and only the collectives for which
    ``synchronises(op)`` holds (those over the data-parallel group) wait for both replicas; the
    others (tensor-parallel all-reduces, sends between stages) run inside each replica."""
    if synchronises is None:

        def synchronises(op: Op) -> bool:
            return op.collective is not None

    def factor(of, op: Op) -> float:
        return of if isinstance(of, float | int) else of[op.rank]

    out = Program({**program.links, **{k + SUFFIX: v for k, v in program.links.items()}})
    ids: list[tuple[int, int]] = []  # per old op: (its id for class 0, for class 1)
    waits: dict[int, tuple[int, ...]] = {}
    for op in program.ops:
        if synchronises(op):
            deps0 = tuple(ids[d][0] for d in op.deps)
            deps = tuple(dict.fromkeys(deps0 + tuple(ids[d][1] for d in op.deps)))
            new = _copy(out, op, 0, 1.0, deps)
            waits[new] = deps0
            ids.append((new, new))
            continue
        a = _copy(out, op, 0, factor(typical, op), tuple(ids[d][0] for d in op.deps))
        b = _copy(out, op, 1, factor(slowest, op), tuple(ids[d][1] for d in op.deps), ranks)
        ids.append((a, b))
    return out, waits


def waiting(program: Program, waits: dict, start: dict, end: dict, top: int = 5, ranks: int = 1) -> dict:
    """How long the typical rank waits at each collective for the slowest one: the collective's start
    minus when the typical rank's own dependencies and the op before it on its stream were done
    (streams are FIFO per rank and stream: ZeRO-3's gathers and reduce-scatters queue on their own).
    ``ranks``: op ranks per class (pipeline stages: the typical replica's stages are 0 .. ranks-1)."""
    rows = []
    prev: dict = {}  # the typical class's last op end per (rank, stream), in program (= stream) order
    for op in program.ops:
        if op.rank >= ranks:
            continue
        lane = (op.rank, op.stream)
        if op.id in waits:
            ready = max([end[d] for d in waits[op.id]] + [prev.get(lane, 0.0)])
            rows.append((start[op.id] - ready, op.name))
        prev[lane] = end[op.id]
    rows = [(w, n) for w, n in rows if w > 0]
    rows.sort(reverse=True)
    return {
        "delay_s": sum(w for w, _ in rows),
        "collectives_delayed": len(rows),
        "worst": [{"op": n, "delay_s": w} for w, n in rows[:top]],
    }
