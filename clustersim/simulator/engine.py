"""The simpy engine: streams as in-order queues, a fluid rate model for shared resources.

Each stream is a simpy process that takes its ops in order and waits for their dependencies. A
running op has remaining work (seconds at full speed) and a rate. Rates change only when an op starts
or ends, so between events they are constant and one central process advances all running ops
together (a fluid, flow-level model):

* compute ops run at ``1 - max(compute_slowdown of running ops)``: NCCL kernels hold SMs;
* ops that push bytes through the same links share them max-min fairly (progressive filling: all
  rates rise together until a link saturates or an op reaches full speed; those freeze, the rest
  continue). Two copies that each alone would fill a PCIe link run at half speed; a NIC-bound
  collective that uses a tenth of that link barely notices a copy beside it.

The cost per event is proportional to the number of running ops (a handful: one per stream), so a
run costs O(ops), independent of how many GPUs the cluster has.
"""

from __future__ import annotations

import simpy

from clustersim.identifiers import Stream
from clustersim.simulator.program import Op, Program

# Floating-point tolerances, not model constants. Simulated times are seconds (1e-6 .. 1e4) and rates
# are fractions of a link (0 .. 1) summed over at most thousands of flows, so double precision keeps
# about 1e-16 relative; the tolerances sit a few orders above that accumulated rounding.
_EPS = 1e-15  # an op this short (seconds) takes no time: below any kernel or message by 9 orders
SATURATED = 1e-9  # a link with this fraction of its capacity left is full (max-min fair filling)
RATE_TOL = 1e-12  # a flow within this of its cap is capped, and no flow runs slower than this
DONE_TOL = 1e-12  # work left, relative to the op's duration, below which the op is finished


class RunawaySimulation(Exception):
    """The simulated clock passed ``Engine.time_limit``: the inputs make an iteration absurdly long.
    ``running`` are the ops in flight."""

    def __init__(self, now: float, running: list[Op]):
        super().__init__(now, running)  # simpy re-raises a failed process as type(exc)(*exc.args)
        self.now = now
        self.running = running

    def __str__(self) -> str:
        return f"simulated time passed the limit at {self.now:g} s"


class _Running:
    __slots__ = ("op", "remaining", "rate", "done")

    def __init__(self, op: Op, done: simpy.Event):
        self.op = op
        self.remaining = op.duration
        self.rate = 1.0
        self.done = done


class Engine:
    def __init__(self, program: Program, time_limit: float = float("inf")):
        self.program = program
        self.time_limit = time_limit
        self.env = simpy.Environment()
        self.finished = {op.id: self.env.event() for op in program.ops}
        self.start: dict[int, float] = {}
        self.end: dict[int, float] = {}
        self._running: list[_Running] = []
        self._last = 0.0
        self._wake = self.env.event()

    def run(self) -> tuple[dict[int, float], dict[int, float]]:
        streams: dict[str, list[Op]] = {}
        for op in self.program.ops:
            streams.setdefault(op.stream, []).append(op)
        for ops in streams.values():
            self.env.process(self._stream(ops))
        self.env.process(self._fluid())
        self.env.run()
        missing = [op.name for op in self.program.ops if op.id not in self.end]
        if missing:
            raise RuntimeError(f"program deadlocked; ops never ran: {missing[:5]}")
        return self.start, self.end

    def _stream(self, ops: list[Op]):
        for op in ops:
            if op.deps:
                yield simpy.AllOf(self.env, [self.finished[d] for d in op.deps])
            self.start[op.id] = self.env.now
            if op.duration <= _EPS:
                self.end[op.id] = self.env.now
                self.finished[op.id].succeed()
                continue
            done = self.env.event()
            self._advance()
            self._running.append(_Running(op, done))
            self._rerate()
            if not self._wake.triggered:
                self._wake.succeed()
            yield done
            self.end[op.id] = self.env.now
            self.finished[op.id].succeed()

    def _advance(self) -> None:
        dt = self.env.now - self._last
        if dt > 0:
            for r in self._running:
                r.remaining -= dt * r.rate
        self._last = self.env.now

    def _rerate(self) -> None:
        slowdown = max((r.op.compute_slowdown for r in self._running), default=0.0)
        caps = {}
        for r in self._running:
            caps[r] = (
                1.0 - slowdown if (r.op.stream == Stream.COMPUTE and r.op.compute_slowdown == 0.0) else 1.0
            )
        sharing = [r for r in self._running if r.op.demands]
        for r in self._running:
            r.rate = caps[r]
        if sharing:
            self._fill(sharing, caps)

    def _fill(self, flows: list[_Running], caps: dict) -> None:
        """Max-min fair bandwidth by progressive filling.

        A level t (bytes/s) rises for all unfrozen flows together; each flow's bandwidth on its
        heaviest link follows t, so its rate (fraction of full speed) is t / its peak demand. A flow
        freezes when it reaches full speed or when one of its links saturates.
        """
        capacity = self.program.links
        left = {link: capacity.get(link, float("inf")) for r in flows for link in r.op.demands}
        weight = {
            r: 1.0 / max(r.op.demands.values()) if max(r.op.demands.values()) > 0 else 0.0 for r in flows
        }
        rate = {r: 0.0 for r in flows}
        active = {r for r in flows if weight[r] > 0}
        for r in flows:
            if weight[r] == 0:
                rate[r] = caps[r]
        while active:
            step = min((caps[r] - rate[r]) / weight[r] for r in active)
            for link, cap in left.items():
                load = sum(weight[r] * r.op.demands.get(link, 0.0) for r in active)
                if load > 0:
                    step = min(step, cap / load)
            for r in active:
                rate[r] += step * weight[r]
                for link, d in r.op.demands.items():
                    left[link] -= step * weight[r] * d
            saturated = {
                link for link, cap in left.items() if cap <= SATURATED * max(1.0, capacity.get(link, 1.0))
            }
            done = {
                r
                for r in active
                if rate[r] >= caps[r] - RATE_TOL
                or any(link in saturated and d > 0 for link, d in r.op.demands.items())
            }
            if not done:  # numerical safety: nothing froze, stop here
                break
            active -= done
        for r in flows:
            r.rate = max(rate[r], RATE_TOL)

    def _fluid(self):
        while True:
            if not self._running:
                self._wake = self.env.event()
                yield self._wake
                if not self._running:
                    return
                continue
            soonest = min(r.remaining / r.rate for r in self._running)
            self._guard(soonest)
            self._wake = self.env.event()
            yield self.env.timeout(max(soonest, 0.0)) | self._wake
            self._advance()
            done = [r for r in self._running if r.remaining <= DONE_TOL * max(1.0, r.op.duration)]
            if done:
                self._running = [r for r in self._running if r not in done]
                for r in done:
                    r.done.succeed()
                self._rerate()
            if not self._running:
                # Let the stream processes start their next ops before deciding to stop.
                self._wake = self.env.event()
                yield self._wake | self.env.timeout(0)
                if not self._running and self._idle_forever():
                    return

    def _guard(self, soonest: float) -> None:
        """Stop a runaway run past the time limit (NaN included). An op whose work left is below the
        clock's resolution at this time is finished: otherwise the clock would never move again."""
        later = self.env.now + soonest
        if not later <= self.time_limit:
            raise RunawaySimulation(later, [r.op for r in self._running])
        if soonest > 0 and later == self.env.now:
            for r in self._running:
                if self.env.now + r.remaining / r.rate == self.env.now:
                    r.remaining = 0.0

    def _idle_forever(self) -> bool:
        return len(self.end) == len(self.program.ops)
