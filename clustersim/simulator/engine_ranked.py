"""The engine's path for programs of many ranks that share no links (pipeline stages, each its own GPU).

The fluid model of engine.py advances every running op at every completion: fine for one rank's
handful of streams, but a 64-stage pipeline keeps ~100 ops running and every op ends at its own
instant, so a 1T-parameter step (200k ops) spent most of its time advancing ops whose rate had not
changed. Here an op's rate can change only when an op of its own rank starts or ends (a NCCL
kernel's compute_slowdown applies to its rank; ops without link demands share nothing else), so
each running op keeps (work left at t0, t0, rate) and a projected end in a heap; an event touches
only its rank's ops. Same model, same answers as the general path up to float rounding.
"""

from __future__ import annotations

import heapq

from clustersim.identifiers import Stream
from clustersim.simulator.program import Op, Program

_EPS = 1e-15  # as engine._EPS: an op this short takes no time
DONE_TOL = 1e-12  # as engine.DONE_TOL
_INF = float("inf")


class _Op:
    __slots__ = ("op", "left", "t0", "rate", "version", "plain", "done_below")

    def __init__(self, op: Op, now: float):
        self.op = op
        self.left = op.duration
        self.t0 = now
        self.rate = 1.0
        self.version = 0
        self.plain = op.stream == Stream.COMPUTE and op.compute_slowdown == 0.0
        self.done_below = DONE_TOL * max(1.0, op.duration)


def applies(program: Program) -> bool:
    """Several ranks and no op that shares a link (no ``demands``)."""
    return any(op.rank for op in program.ops) and not any(op.demands for op in program.ops)


def run_ranked(
    program: Program, waiting: list[int], nxt: list[list[int]], time_limit: float, runaway
) -> tuple[dict[int, float], dict[int, float]]:
    """Start and end of every op. ``waiting``/``nxt``: unfinished predecessors and successors per op,
    as Engine builds them (FIFO per (rank, stream) included). ``runaway(now, ops)`` is raised past
    ``time_limit``."""
    return _Ranked(program, waiting, nxt, time_limit, runaway).run()


class _Ranked:
    def __init__(self, program: Program, waiting, nxt, time_limit: float, runaway):
        self.ops = program.ops
        self.waiting, self.nxt = waiting, nxt
        self.time_limit, self.runaway = time_limit, runaway
        self.start: dict[int, float] = {}
        self.end: dict[int, float] = {}
        self.running: dict[int, list[_Op]] = {}  # by rank
        self.heap: list = []
        self.seq = 0
        self.now = 0.0

    def run(self) -> tuple[dict[int, float], dict[int, float]]:
        touched: set[int] = set()
        self._release([i for i, w in enumerate(self.waiting) if w == 0], touched)
        heap = self.heap
        while True:
            for rank in touched:
                self._rerate(rank)
            while heap and heap[0][3] != heap[0][2].version:  # stale projections
                heapq.heappop(heap)
            if not heap:
                return self.start, self.end
            at = heap[0][0]
            if not at <= self.time_limit:
                raise self.runaway(at, [x.op for rs in self.running.values() for x in rs])
            self.now = max(self.now, at)
            touched = set()
            self._release(self._finish_due(touched), touched)

    def _finish_due(self, touched: set[int]) -> list[int]:
        """End every op whose work left at ``now`` is within its tolerance; return what they release."""
        heap, now, ready = self.heap, self.now, []
        while heap:
            at, _, r, version = heap[0]
            if version != r.version:
                heapq.heappop(heap)
                continue
            if at > now and r.left - (now - r.t0) * r.rate > r.done_below:
                break
            heapq.heappop(heap)
            i = r.op.id
            self.end[i] = now
            self.running[r.op.rank].remove(r)
            touched.add(r.op.rank)
            for j in self.nxt[i]:
                self.waiting[j] -= 1
                if self.waiting[j] == 0:
                    ready.append(j)
        return ready

    def _release(self, ready: list[int], touched: set[int]) -> None:
        """Start ``ready`` now; zero-length ops end at once and release their successors."""
        now = self.now
        while ready:
            i = ready.pop()
            self.start[i] = now
            op = self.ops[i]
            if not op.duration < _INF:  # inf or NaN: a broken input, never a time
                raise self.runaway(now, [op])
            if op.duration > _EPS:
                self.running.setdefault(op.rank, []).append(_Op(op, now))
                touched.add(op.rank)
                continue
            self.end[i] = now
            for j in self.nxt[i]:
                self.waiting[j] -= 1
                if self.waiting[j] == 0:
                    ready.append(j)

    def _rerate(self, rank: int) -> None:
        """Compute ops run at 1 - the largest slowdown among their rank's running NCCL kernels; an
        op whose rate changes (or that just started) gets a new projected end."""
        mine = self.running.get(rank, ())
        slow = max((r.op.compute_slowdown for r in mine), default=0.0)
        now = self.now
        for r in mine:
            rate = 1.0 - slow if r.plain else 1.0
            if rate != r.rate or r.version == 0:
                r.left -= (now - r.t0) * r.rate
                r.t0, r.rate = now, rate
                r.version += 1
                self.seq += 1
                heapq.heappush(self.heap, (now + r.left / rate, self.seq, r, r.version))
