"""The engine's exact shortcut for programs whose ops share no link: one pass in program order.

Without link demands (pipeline stages, each its own GPU; engine_ranked's programs) an op's rate can
change only through a NCCL kernel's ``compute_slowdown`` on its own rank (engine.py): every op that
is not plain compute runs at full speed and ends ``duration`` after it starts, and a plain compute op
runs at 1 - the largest slowdown among its rank's kernels running at the time. When every kernel that
overlaps a compute op comes before it in program order, one pass in program order gives each op its
start (the latest end of its dependencies and of its lane's previous op) and its end (its work
integrated over the known intervals of those kernels): no event queue, no rates to revisit. Megatron's
pipeline programs are built that way (a pass's tensor-parallel op and send come before the next
pass), and the 1T-parameter layout's 196k ops cost about a microsecond each here instead of ~10 in
engine_ranked's event loop (issue #12: a 3,072-GPU 3D-parallel run in under a second).

Whether the order holds is only known during the pass: a kernel that starts before the last compute
op already evaluated on its rank ended would have slowed that op. The pass then gives up and returns
None, as it does for ids that are not topological, durations that are not finite and times past the
limit; the caller runs the event engine, which has the same semantics and raises the proper errors.
tests/test_engine.py and tests/test_model_parallel.py compare the two on the same programs.
"""

from __future__ import annotations

from clustersim.identifiers import Stream
from clustersim.simulator.program import Program

_EPS = 1e-15  # as engine._EPS: an op this short takes no time
_INF = float("inf")


def run_in_order(program: Program, time_limit: float = _INF) -> tuple[dict, dict] | None:
    """Start and end of every op (dicts by op id), or None where the one-pass evaluation is not exact
    (a kernel after a compute op in program order overlaps it) or the input is broken."""
    ops = program.ops
    n = len(ops)
    start = [0.0] * n
    end = [0.0] * n
    lane_end: dict[tuple[int, str], float] = {}
    kernels: dict[int, list[tuple[float, float, float]]] = {}  # rank -> (start, end, slowdown), ending later
    compute_end: dict[int, float] = {}  # rank -> end of its last plain compute op evaluated
    compute = Stream.COMPUTE
    lane_end_get, compute_end_get = lane_end.get, compute_end.get
    for i, op in enumerate(ops):
        if op.id != i or op.demands:
            return None
        rank = op.rank
        lane = (rank, op.stream)
        t = lane_end_get(lane, 0.0)
        for d in op.deps:
            if d >= i:
                return None
            if end[d] > t:
                t = end[d]
        work = op.duration
        if not work < _INF:  # inf or NaN
            return None
        slowdown = op.compute_slowdown
        if work <= _EPS:
            e = t
        elif slowdown == 0.0 and lane[1] == compute:
            running = kernels.get(rank)
            if running:
                running = kernels[rank] = [k for k in running if k[1] > t]
            e = _slowed_end(t, work, running) if running else t + work
            if e is None:
                return None
            compute_end[rank] = e
        else:
            e = t + work
            if slowdown > 0.0:
                if t < compute_end_get(rank, 0.0):  # it would have slowed a compute op already placed
                    return None
                kernels.setdefault(rank, []).append((t, e, slowdown))
        if not e <= time_limit:
            return None
        start[i] = t
        end[i] = e
        lane_end[lane] = e
    return dict(enumerate(start)), dict(enumerate(end))


def _slowed_end(t: float, work: float, running: list[tuple[float, float, float]]) -> float | None:
    """When a compute op that starts at ``t`` with ``work`` seconds at full speed ends, running at
    1 - the largest slowdown among the ``running`` kernels (start, end, slowdown) that cover each
    instant. None if a kernel would stop it altogether (slowdown >= 1)."""
    points = sorted({p for a, b, _ in running for p in (a, b) if p > t})
    now = t
    for p in points:
        slow = max([s for a, b, s in running if a <= now < b], default=0.0)
        if slow >= 1.0:
            return None
        rate = 1.0 - slow
        if now + work / rate <= p:
            return now + work / rate
        work -= (p - now) * rate
        now = p
    return now + work
