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


class _Running:
    """A running op: work left (seconds at full speed), its current rate, and what the rate model reads
    precomputed once (the rate is recomputed at every start and end, the op's fields never change)."""

    __slots__ = ("op", "remaining", "rate", "demands", "plain_compute", "weight")

    def __init__(self, op: Op):
        self.op = op
        self.remaining = op.duration
        self.rate = 1.0
        self.demands = op.demands
        # Slowed by NCCL kernels: compute-stream ops that are not themselves NCCL kernels.
        self.plain_compute = op.stream == Stream.COMPUTE and op.compute_slowdown == 0.0
        peak = max(op.demands.values()) if op.demands else 0.0
        self.weight = 1.0 / peak if peak > 0 else 0.0


class Engine:
    """Runs a Program; ``run()`` returns each op's start and end time (seconds).

    Per op the engine schedules as few simpy events as the semantics allow, because a run's cost is
    per-event work (issue #15): a stream waits on each unfinished dependency in turn (no ``AllOf``
    condition object; an op that waits for nothing does not yield at all), the stream is resumed by the
    op's own ``finished`` event, and the fluid model is not a process but two kinds of plain timeouts
    with callbacks: a *settle* at the current instant, scheduled once however many ops start or end
    at that instant (so rates are computed once per instant, after every stream has started what it
    can), and a *tick* at the next completion. A change of the running set makes the pending tick
    stale (it fires and does nothing) instead of building a ``timeout | wake`` condition per step.
    """

    def __init__(self, program: Program):
        self.program = program
        self.env = simpy.Environment()
        self.finished = {op.id: self.env.event() for op in program.ops}
        self.start: dict[int, float] = {}
        self.end: dict[int, float] = {}
        self._running: list[_Running] = []
        self._last = 0.0
        self._settling = False  # a settle is scheduled at the current instant
        self._tick: simpy.Event | None = None  # the live completion timeout; others are stale

    def run(self) -> tuple[dict[int, float], dict[int, float]]:
        streams: dict[str, list[Op]] = {}
        for op in self.program.ops:
            streams.setdefault(op.stream, []).append(op)
        for ops in streams.values():
            self.env.process(self._stream(ops))
        self.env.run()
        missing = [op.name for op in self.program.ops if op.id not in self.end]
        if missing:
            raise RuntimeError(f"program deadlocked; ops never ran: {missing[:5]}")
        return self.start, self.end

    def _stream(self, ops: list[Op]):
        finished, env = self.finished, self.env
        for op in ops:
            for d in op.deps:
                # Waiting for each unfinished dependency in turn ends when the last one finishes, as
                # an AllOf would, without a condition event per op.
                if not finished[d].processed:
                    yield finished[d]
            now = env.now
            self.start[op.id] = now
            if op.duration <= _EPS:
                self.end[op.id] = now
                finished[op.id].succeed()
                continue
            self._advance()
            self._running.append(_Running(op))
            self._changed()
            yield finished[op.id]  # the fluid model records the end and succeeds it

    def _changed(self) -> None:
        """The running set changed at this instant: the pending tick is stale; settle once, after every
        stream resumed at this instant has started its op."""
        self._tick = None
        if not self._settling:
            self._settling = True
            self.env.timeout(0).callbacks.append(self._settle)

    def _settle(self, _event) -> None:
        self._settling = False
        self._update()

    def _on_tick(self, event) -> None:
        if event is self._tick:
            self._update()

    def _update(self) -> None:
        """Advance all running ops to now; finish those done, or set rates and schedule the next tick."""
        self._advance()
        running = self._running
        done = [r for r in running if r.remaining <= DONE_TOL * max(1.0, r.op.duration)]
        if done:
            self._running = [r for r in running if r.remaining > DONE_TOL * max(1.0, r.op.duration)]
            now = self.env.now
            for r in done:
                self.end[r.op.id] = now
                self.finished[r.op.id].succeed()
            self._changed()  # streams start their next ops at this instant; rates after that
            return
        if running:
            self._rerate()
            soonest = min(r.remaining / r.rate for r in running)
            self._tick = self.env.timeout(max(soonest, 0.0))
            self._tick.callbacks.append(self._on_tick)

    def _advance(self) -> None:
        dt = self.env.now - self._last
        if dt > 0:
            for r in self._running:
                r.remaining -= dt * r.rate
        self._last = self.env.now

    def _rerate(self) -> None:
        running = self._running
        slowdown = max(r.op.compute_slowdown for r in running)
        capped = 1.0 - slowdown
        sharing = []
        for r in running:
            r.rate = capped if r.plain_compute else 1.0
            if r.demands:
                sharing.append(r)
        if sharing and self._contended(sharing):
            self._fill(sharing)

    def _contended(self, flows: list[_Running]) -> bool:
        """Whether some link is asked for more than its capacity when every flow runs at its cap. If
        none is, max-min filling would give every flow its cap, which the flows already have."""
        load: dict[str, float] = {}
        for r in flows:
            for link, d in r.demands.items():
                load[link] = load.get(link, 0.0) + r.rate * d
        capacity = self.program.links
        return any(v > capacity.get(link, float("inf")) for link, v in load.items())

    def _fill(self, flows: list[_Running]) -> None:
        """Max-min fair bandwidth by progressive filling.

        A level t (bytes/s) rises for all unfrozen flows together; each flow's bandwidth on its
        heaviest link follows t, so its rate (fraction of full speed) is t / its peak demand. A flow
        freezes when it reaches full speed or when one of its links saturates.
        """
        capacity = self.program.links
        caps = {r: r.rate for r in flows}
        left = {link: capacity.get(link, float("inf")) for r in flows for link in r.demands}
        weight = {r: r.weight for r in flows}
        rate = {r: 0.0 for r in flows}
        active = {r for r in flows if weight[r] > 0}
        for r in flows:
            if weight[r] == 0:
                rate[r] = caps[r]
        while active:
            step = min((caps[r] - rate[r]) / weight[r] for r in active)
            for link, cap in left.items():
                load = sum(weight[r] * r.demands.get(link, 0.0) for r in active)
                if load > 0:
                    step = min(step, cap / load)
            for r in active:
                rate[r] += step * weight[r]
                for link, d in r.demands.items():
                    left[link] -= step * weight[r] * d
            saturated = {
                link for link, cap in left.items() if cap <= SATURATED * max(1.0, capacity.get(link, 1.0))
            }
            done = {
                r
                for r in active
                if rate[r] >= caps[r] - RATE_TOL
                or any(link in saturated and d > 0 for link, d in r.demands.items())
            }
            if not done:  # numerical safety: nothing froze, stop here
                break
            active -= done
        for r in flows:
            r.rate = max(rate[r], RATE_TOL)


def contention_free_end(program: Program) -> float:
    """When the program would end if no op were ever slowed: each op starts when its stream
    predecessor and its dependencies have ended and takes its ``duration``.

    A lower bound on what ``Engine.run`` gives: the engine only ever slows ops down (every rate is at
    most 1), and an op that starts no earlier and runs no faster ends no earlier, by induction in
    program order. The offload planner uses it to rule out a placement without simulating it.
    Returns 0.0 (no bound) for a program whose ops wait for later ops.
    """
    end: list[float] = []
    stream_end: dict[str, float] = {}
    for op in program.ops:
        t = stream_end.get(op.stream, 0.0)
        if op.deps:
            if max(op.deps) >= op.id:
                return 0.0
            t = max(t, max([end[d] for d in op.deps]))
        t += op.duration if op.duration > _EPS else 0.0
        end.append(t)
        stream_end[op.stream] = t
    return max(end, default=0.0)
