"""engine_inorder's one pass over many programs of one shape at once: the same ops, lanes and
dependencies, other durations (a band's draws, simulator/uncertainty.py, re-priced by
strategies.megatron.PipelineRepricer, and the same layout on another NIC). Each op's start and end are
computed for every program together, as numpy columns, with engine_inorder's arithmetic op for op, so
a column's times are run_in_order's to the last bit: a pipeline's tens of thousands of ops cost a few
numpy calls each for all the draws instead of a Python pass per draw.

A column where run_in_order would give up (a kernel that starts before the last compute op on its
rank ended or that stops compute altogether, a time past the limit) comes back as NaN, and the caller
runs that program alone, as before. A compute op under several kernels (an interleaved pipeline's send
forward and send back on one rank) is followed over each column's kernel starts and ends as
run_in_order follows it, so such programs stay in the pass. Programs whose ops push bytes through links (whose
exactness needs engine_inorder's per-link bookkeeping), or whose zero-length and kernel ops are not the
same in every column, are not batched at all (None). tests/test_engine.py compares the two.
"""

from __future__ import annotations

import numpy as np

from clustersim.identifiers import Stream
from clustersim.simulator.engine_inorder import _EPS


def shape_of(ops) -> tuple:
    """What must be the same for programs to be run together: each op's id, rank, stream and
    dependencies, and that it pushes no bytes through links."""
    return tuple((op.id, op.rank, op.stream, tuple(op.deps), not op.demands) for op in ops)


def run_columns(ops, durations: np.ndarray, slowdowns: np.ndarray, time_limit: float) -> np.ndarray | None:
    """The last end (a step of weight 1, as draw_times reads run_in_order's) of ``ops`` under each
    column of ``durations`` and ``slowdowns`` (ops x programs): NaN where run_in_order would give up on
    that column, None where this pass does not apply to the programs at all (module docstring)."""
    n, k = durations.shape
    if n != len(ops) or n == 0:
        return None
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(durations).all(axis=0)
    short = durations <= _EPS
    slowed = slowdowns > 0.0
    # the branch an op takes must be the same in every column (engine_inorder's per-op branches)
    if (short.any(axis=1) != short.all(axis=1)).any() or (slowed.any(axis=1) != slowed.all(axis=1)).any():
        return None
    short, slowed = short[:, 0], slowed[:, 0]
    compute = Stream.COMPUTE
    end = np.empty((n, k))
    bad = ~finite
    zero = np.zeros(k)
    lane_end: dict[tuple[int, str], np.ndarray] = {}
    kernels: dict[int, list[tuple]] = {}
    compute_end: dict[int, np.ndarray] = {}
    maximum, where = np.maximum, np.where
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for i, op in enumerate(ops):
            if op.id != i or op.demands:
                return None
            rank = op.rank
            lane = (rank, op.stream)
            t = lane_end.get(lane, zero)
            for d in op.deps:
                if d >= i:
                    return None
                t = maximum(t, end[d])
            work = durations[i]
            if short[i]:
                e = t
            elif not slowed[i] and lane[1] == compute:
                running = kernels.get(rank)
                if running:
                    running = kernels[rank] = [kn for kn in running if (kn[1] > t).any()]
                e = _slowed_end(t, work, running, bad) if running else t + work
                compute_end[rank] = e
            else:
                e = t + work
                if slowed[i]:
                    before = compute_end.get(rank)
                    if before is not None:
                        bad |= t < before  # it would have slowed a compute op already placed
                    slow = slowdowns[i]
                    # (start, end, slowdown, the rate it leaves compute, whether it stops it somewhere)
                    kernels.setdefault(rank, []).append((t, e, slow, 1.0 - slow, bool((slow >= 1.0).any())))
            end[i] = e
            lane_end[lane] = e
    last = end.max(axis=0)
    bad |= ~(last <= time_limit)  # every op ends by the last one's end
    return where(bad, np.nan, last)


def _slowed_end(t: np.ndarray, work: np.ndarray, running: list, bad: np.ndarray) -> np.ndarray:
    """engine_inorder._slowed_end in every column: when a compute op that starts at ``t`` with ``work``
    seconds at full speed ends, running at 1 - the largest slowdown among the ``running`` kernels
    (start, end, slowdown, 1 - slowdown, whether it is ever >= 1) that cover each instant. The common
    case (in every column at most one kernel running at ``t``, started by then) in a few calls; else
    engine_inorder's general walk over the kernels' starts and ends after ``t``, column by column in
    step (_walk). A column where a kernel would stop the op altogether (slowdown >= 1) is marked
    ``bad`` (its program is run alone)."""
    if len(running) > 1:
        count = sum((kb > t).astype(np.int64) for _, kb, _, _, _ in running)
        if (count > 1).any():
            return _walk(t, work, running, bad)
        a, b, slow, rate, stops = running[0]
        for kernel in running[1:]:  # the one running in each column, if any
            on = kernel[1] > t
            a, b = np.where(on, kernel[0], a), np.where(on, kernel[1], b)
            slow, rate = np.where(on, kernel[2], slow), np.where(on, kernel[3], rate)
            stops = stops or kernel[4]
    else:
        a, b, slow, rate, stops = running[0]
    if (a > t).any():  # a kernel that starts after the op (and so runs at t in no column so far)
        return _walk(t, work, running, bad)
    active = b > t
    if stops:
        bad |= active & (slow >= 1.0)
    alone = t + work / rate
    slowed = np.where(alone <= b, alone, b + (work - (b - t) * rate))
    return np.where(active, slowed, t + work)


def _walk(t: np.ndarray, work: np.ndarray, running: list, bad: np.ndarray) -> np.ndarray:
    """engine_inorder._slowed_end's general loop, every column in step: from ``t``, over each column's
    distinct kernel starts and ends after ``t`` in increasing order, the op runs at 1 - the largest
    slowdown among the kernels covering the interval's start, until its work is done; past the last
    of them, at full speed. The same arithmetic as the scalar loop, op for op, in each column (its
    one-kernel case is the loop's first step), so the ends are its ends to the last bit."""
    starts = np.stack([kernel[0] for kernel in running])  # kernels x columns
    ends = np.stack([kernel[1] for kernel in running])
    slows = np.stack([np.broadcast_to(kernel[2], t.shape) for kernel in running])
    points = np.concatenate([starts, ends, np.full((1, *t.shape), np.inf)])
    points = np.sort(np.where(points > t, points, np.inf), axis=0)  # a point at or before t: none
    now, work = t, work
    out = np.full_like(t, np.nan)
    going = np.ones(t.shape, dtype=bool)
    previous = t
    for p in points:
        step = going & (p != previous)  # a point met twice is met once (the scalar loop's set)
        previous = p
        # the largest slowdown among the kernels covering now (slowdowns are positive: 0.0 if none)
        slow = np.where((starts <= now) & (now < ends), slows, 0.0).max(axis=0)
        bad |= step & (slow >= 1.0)
        rate = 1.0 - slow
        done = now + work / rate
        ended = step & (done <= p)
        out = np.where(ended, done, out)
        going &= ~ended
        if not going.any():
            break
        on = step & ~ended
        work = np.where(on, work - (p - now) * rate, work)
        now = np.where(on, p, now)
    return out
