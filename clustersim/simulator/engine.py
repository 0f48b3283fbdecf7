"""The simpy engine: streams as in-order queues, a fluid rate model for shared resources.

Each stream runs its ops in order, each after all its dependencies ended. A running op has remaining
work (seconds at full speed) and a rate. Rates change only when an op starts or ends, so between
events they are constant and the engine advances all running ops together (a fluid, flow-level
model):

* compute ops run at ``1 - max(compute_slowdown of running ops)``: NCCL kernels hold SMs;
* ops that push bytes through the same links share them max-min fairly (progressive filling: all
  rates rise together until a link saturates or an op reaches full speed; those freeze, the rest
  continue). Two copies that each alone would fill a PCIe link run at half speed; a NIC-bound
  collective that uses a tenth of that link barely notices a copy beside it.

Ops start only when another op ends (or at time 0), so the only future events are completions:
simpy's clock holds one timeout, the next completion, and ops are started by counting unfinished
predecessors rather than by a simpy process per stream waiting on events. Issue #15 measured that a
run cost ~20 us per simpy event and 7.5 events per op (an ``AllOf`` per op, a ``timeout | wake``
condition per step, a wake-up per start); this way a run has about one event per completion instant.

Collective ops carry a description (``Op.collective``); when a network backend is given
(simulator/network/), the engine asks it for the op's duration as it starts the op, and scales the
op's host-link demands to match. Without one (the analytical path) the op's own duration stands.
Streams are FIFO per (rank class, stream). A backend may also name the fabric links a collective keeps
busy (``fabric_demands``: the flow backend's NICs, leaf and core uplinks); they join the op's demands,
so collectives that run at the same time share those links max-min fairly like any other.

A program may hold several ranks (``Op.rank``: pipeline stages simulated stage by stage, or a
straggler's rank class): a NCCL kernel's ``compute_slowdown`` then applies to its own rank's compute
only. A single-rank program takes exactly the old path.

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
_INF = float("inf")


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
    """A running op: work left (seconds at full speed), its current rate, and what the rate model reads
    precomputed once (rates are recomputed at every start and end; the op's fields never change)."""

    __slots__ = (
        "op",
        "remaining",
        "rate",
        "demands",
        "plain_compute",
        "slowdown",
        "weight",
        "done_below",
        "rank",
    )

    def __init__(self, op: Op, duration: float | None = None, fabric: dict[str, float] | None = None):
        self.op = op
        self.remaining = op.duration if duration is None else duration
        self.rate = 1.0
        self.demands = op.demands
        if duration is not None and duration != op.duration and op.demands:
            # The same bytes over a longer (shorter) time: proportionally lower (higher) rates.
            scale = op.duration / duration
            self.demands = {k: v * scale for k, v in op.demands.items()}
        if fabric:  # a network backend's fabric links (NICs, leaf uplinks), shared with other collectives
            self.demands = {**self.demands, **fabric}
        # Slowed by NCCL kernels: compute-stream ops that are not themselves NCCL kernels.
        self.plain_compute = op.stream == Stream.COMPUTE and op.compute_slowdown == 0.0
        self.slowdown = op.compute_slowdown
        peak = max(self.demands.values()) if self.demands else 0.0
        self.weight = 1.0 / peak if peak > 0 else 0.0
        self.done_below = DONE_TOL * max(1.0, self.remaining)
        self.rank = op.rank


class Engine:
    """Runs a Program; ``run()`` returns each op's start and end time (seconds). Past ``time_limit``
    simulated seconds (or at a NaN time) it stops with RunawaySimulation instead of running forever."""

    def __init__(
        self,
        program: Program,
        time_limit: float = float("inf"),
        network=None,
        ranked: bool | None = None,
        in_order: bool = True,
    ):
        """``network``: a NetworkBackend (None: collectives keep their analytical time). ``ranked``: use
        engine_ranked's path for a multi-rank program without shared links (None: whenever it applies
        and no network backend is given; False: always this general path, for comparing the two).
        ``in_order``: without a network backend, first try engine_inorder's one pass, exact where no
        link is ever over capacity and no kernel overlaps an earlier compute op (False: the event loops
        only)."""
        self.program = program
        self._ranked = ranked
        self._in_order = in_order
        self.time_limit = time_limit
        self.network = network  # a NetworkBackend, or None: collectives keep their analytical time
        self.env = simpy.Environment()
        self.start: dict[int, float] = {}
        self.end: dict[int, float] = {}
        self._running: list[_Running] = []
        self._last = 0.0
        self._multi_rank = any(op.rank for op in program.ops)

    def _build_graph(self) -> None:
        """Per op: how many predecessors (dependencies, and the previous op on its stream) have not
        ended, and whom to tell when it ends. A dependency listed twice is counted and told twice."""
        program = self.program
        n = len(program.ops)
        self._waiting = [len(op.deps) for op in program.ops]
        self._next: list[list[int]] = [[] for _ in range(n)]
        last_on: dict[tuple[int, str], int] = {}
        for op in program.ops:
            for d in op.deps:
                self._next[d].append(op.id)
            lane = (op.rank, op.stream)
            prev = last_on.get(lane)
            if prev is not None:
                self._next[prev].append(op.id)
                self._waiting[op.id] += 1
            last_on[lane] = op.id

    def run(self) -> tuple[dict[int, float], dict[int, float]]:
        if self._ranked is not False and self.network is None and self._in_order:
            from clustersim.simulator import engine_inorder

            # The one pass first: it gives up (None) where it would not be exact.
            times = engine_inorder.run_in_order(self.program, self.time_limit)
            if times is not None:
                self.start, self.end = times
                return times
        if self._multi_rank and self._ranked is not False and self.network is None:
            from clustersim.simulator import engine_ranked

            if engine_ranked.applies(self.program):
                self._build_graph()
                self.start, self.end = engine_ranked.run_ranked(
                    self.program, self._waiting, self._next, self.time_limit, RunawaySimulation
                )
                self._check_all_ran()
                return self.start, self.end
        self._build_graph()
        self._release([i for i, w in enumerate(self._waiting) if w == 0])
        self._update(None)
        self.env.run()
        self._check_all_ran()
        return self.start, self.end

    def _check_all_ran(self) -> None:
        if len(self.end) < len(self.program.ops):
            missing = [op.name for op in self.program.ops if op.id not in self.end]
            raise RuntimeError(f"program deadlocked; ops never ran: {missing[:5]}")

    def _release(self, ready: list[int]) -> None:
        """Start the ops in ``ready`` now; zero-length ones end at once and release their successors."""
        ops, now, waiting, nxt = self.program.ops, self.env.now, self._waiting, self._next
        network = self.network
        while ready:
            i = ready.pop()
            self.start[i] = now
            op = ops[i]
            duration = op.duration
            fabric = None
            if network is not None and op.collective is not None and duration > 0:
                duration = network.duration(op, now)
                if hasattr(network, "fabric_demands") and duration > _EPS:
                    fabric, capacity = network.fabric_demands(op, duration)
                    self.program.links.update(capacity)
            if not duration < _INF:  # inf or NaN: a broken input, never a time
                raise RunawaySimulation(now, [op])
            if duration > _EPS:
                self._running.append(_Running(op, duration if duration != op.duration else None, fabric))
                continue
            self.end[i] = now
            for j in nxt[i]:
                waiting[j] -= 1
                if waiting[j] == 0:
                    ready.append(j)

    def _update(self, _event) -> None:
        """At a completion instant: advance every running op to now; end those done and start what
        they release (until nothing more ends at this instant); then set rates and schedule the next
        completion."""
        self._advance()
        now, waiting, nxt = self.env.now, self._waiting, self._next
        while True:
            running = self._running
            done = [r for r in running if r.remaining <= r.done_below]
            if not done:
                break
            if len(done) < len(running):
                self._running = [r for r in running if r.remaining > r.done_below]
            else:
                self._running = []
            ready = []
            for r in done:
                i = r.op.id
                self.end[i] = now
                for j in nxt[i]:
                    waiting[j] -= 1
                    if waiting[j] == 0:
                        ready.append(j)
            self._release(ready)
        if running:
            self._rerate()
            soonest = min(r.remaining / r.rate for r in running)
            self._guard(soonest)
            self.env.timeout(max(soonest, 0.0)).callbacks.append(self._update)

    def _advance(self) -> None:
        dt = self.env.now - self._last
        if dt > 0:
            for r in self._running:
                r.remaining -= dt * r.rate
        self._last = self.env.now

    def _rerate(self) -> None:
        running = self._running
        sharing = []
        if self._multi_rank:
            slow: dict[int, float] = {}
            for r in running:
                if r.slowdown > slow.get(r.rank, 0.0):
                    slow[r.rank] = r.slowdown
            for r in running:
                r.rate = 1.0 - slow.get(r.rank, 0.0) if r.plain_compute else 1.0
                if r.demands:
                    sharing.append(r)
        else:
            capped = 1.0 - max([r.slowdown for r in running])
            for r in running:
                r.rate = capped if r.plain_compute else 1.0
                if r.demands:
                    sharing.append(r)
        if sharing and self._contended(sharing):
            self._fill(sharing)

    def _contended(self, flows: list[_Running]) -> bool:
        """Whether some link is asked for more than its capacity when every flow runs at its cap. If
        none is, max-min filling would give every flow its cap, which the flows already have."""
        capacity = self.program.links
        if len(flows) == 1:
            r = flows[0]
            return any(r.rate * d > capacity.get(link, _INF) for link, d in r.demands.items())
        load: dict[str, float] = {}
        for r in flows:
            for link, d in r.demands.items():
                load[link] = load.get(link, 0.0) + r.rate * d
        return any(v > capacity.get(link, _INF) for link, v in load.items())

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


def contention_free_end(program: Program) -> float:
    """When the program would end if no op were ever slowed: each op starts when its stream
    predecessor and its dependencies have ended and takes its ``duration``.

    A lower bound on what ``Engine.run`` gives: the engine only ever slows ops down (every rate is at
    most 1), and an op that starts no earlier and runs no faster ends no earlier, by induction in
    program order. The offload planner uses it to rule out a placement without simulating it.
    Returns 0.0 (no bound) for a program whose ops wait for later ops.
    """
    end: list[float] = []
    stream_end: dict[tuple[int, str], float] = {}
    for op in program.ops:
        t = stream_end.get((op.rank, op.stream), 0.0)
        if op.deps:
            if max(op.deps) >= op.id:
                return 0.0
            t = max(t, max([end[d] for d in op.deps]))
        t += op.duration if op.duration > _EPS else 0.0
        end.append(t)
        stream_end[(op.rank, op.stream)] = t
    return max(end, default=0.0)
