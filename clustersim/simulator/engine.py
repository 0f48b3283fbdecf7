"""The simpy engine: streams as in-order queues, a fluid rate model for shared resources.

Each stream is a simpy process that takes its ops in order and waits for their dependencies. A
running op has remaining work (seconds at full speed) and a rate. Rates change only when an op starts
or ends, so between events they are constant and one central process advances all running ops
together (a fluid, flow-level model):

* compute ops run at ``1 - max(compute_slowdown of running ops)``: NCCL kernels hold SMs;
* ops on the same ``link`` share it max-min fairly (equal shares, each op a single flow).

The cost per event is proportional to the number of running ops (a handful: one per stream), so a
run costs O(ops), independent of how many GPUs the cluster has.
"""

from __future__ import annotations

import simpy

from clustersim.simulator.program import Op, Program

_EPS = 1e-15


class _Running:
    __slots__ = ("op", "remaining", "rate", "done")

    def __init__(self, op: Op, done: simpy.Event):
        self.op = op
        self.remaining = op.duration
        self.rate = 1.0
        self.done = done


class Engine:
    def __init__(self, program: Program):
        self.program = program
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
        links: dict[str, int] = {}
        for r in self._running:
            if r.op.link:
                links[r.op.link] = links.get(r.op.link, 0) + 1
        for r in self._running:
            rate = 1.0
            if r.op.stream == "compute" and r.op.compute_slowdown == 0.0:
                rate = 1.0 - slowdown
            if r.op.link:
                rate = min(rate, 1.0 / links[r.op.link])
            r.rate = rate

    def _fluid(self):
        while True:
            if not self._running:
                self._wake = self.env.event()
                yield self._wake
                if not self._running:
                    return
                continue
            soonest = min(r.remaining / r.rate for r in self._running)
            self._wake = self.env.event()
            yield self.env.timeout(max(soonest, 0.0)) | self._wake
            self._advance()
            done = [r for r in self._running if r.remaining <= 1e-12 * max(1.0, r.op.duration)]
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

    def _idle_forever(self) -> bool:
        return len(self.end) == len(self.program.ops)
