"""The engine's exact shortcut for programs whose ops never contend for a link: one pass in program order.

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

Ops that push bytes through links (PCIe, NICs) take part when no link is ever asked for more than
its capacity (_LinkLoads): max-min sharing then leaves every op at its own rate. Data-parallel
programs, one bucket all-reduce at a time on the NICs, are such programs.

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
    links = _LinkLoads(program.links)
    for i, op in enumerate(ops):
        if op.id != i:
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
        if op.demands and e > t and not links.admit(t, e, op.demands):
            return None
        start[i] = t
        end[i] = e
        lane_end[lane] = e
    return dict(enumerate(start)), dict(enumerate(end))


def _slowed_end(t: float, work: float, running: list[tuple[float, float, float]]) -> float | None:
    """When a compute op that starts at ``t`` with ``work`` seconds at full speed ends, running at
    1 - the largest slowdown among the ``running`` kernels (start, end, slowdown) that cover each
    instant. None if a kernel would stop it altogether (slowdown >= 1)."""
    if len(running) == 1 and running[0][0] <= t:  # the common case, the general loop's arithmetic
        _, b, slow = running[0]
        if slow >= 1.0:
            return None
        rate = 1.0 - slow
        if t + work / rate <= b:
            return t + work / rate
        return b + (work - (b - t) * rate)
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


class _LinkLoads:
    """What the ops placed so far push through each link, to confirm that no link is ever asked for
    more than its capacity: then max-min sharing (engine.py) leaves every op at its own rate and the
    one pass is exact. Each link keeps the intervals (start, end, bytes/s) that may still overlap a
    later op; those that ended before an op starts are dropped, and a later op starting before the
    last of them ended makes the pass give up (ops on a link are placed close to time order)."""

    def __init__(self, capacity: dict[str, float]):
        self.capacity = capacity
        self.active: dict[str, list[tuple[float, float, float]]] = {}
        self.horizon: dict[str, float] = {}

    def admit(self, t: float, e: float, demands: dict[str, float]) -> bool:
        """Place an op pushing ``demands`` during [t, e); False if a link would be over capacity at
        some instant, or the check cannot be made."""
        for link, d in demands.items():
            cap = self.capacity.get(link, _INF)
            if d > cap or t < self.horizon.get(link, -_INF):
                return False
            placed = self.active.get(link, [])
            kept = [iv for iv in placed if iv[1] > t]
            if len(kept) < len(placed):
                self.horizon[link] = max(iv[1] for iv in placed if iv[1] <= t)
            overlapping = [iv for iv in kept if iv[0] < e]
            if overlapping and _peak(t, overlapping) + d > cap:
                return False
            kept.append((t, e, d))
            self.active[link] = kept
        return True


def _peak(t: float, intervals: list[tuple[float, float, float]]) -> float:
    """The largest sum of rates of ``intervals`` (all ending after ``t``) at any instant from ``t`` on:
    a sum can only rise where an interval starts, so it is enough to look at ``t`` and those starts."""
    return max(
        sum(r for a, b, r in intervals if a <= p < b) for p in {t, *(a for a, _, _ in intervals if a > t)}
    )
