"""What a simulation returns: a timeline and the numbers derived from it.

The breakdown attributes every instant of the iteration to exactly one category, so its parts add
up to the iteration time: the compute stream's op when it is busy (forward, backward, compression,
optimizer, other), else "exposed communication" when a collective is running, else exposed host work
or transfers, else idle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clustersim.identifiers import COMPUTE_CATEGORIES, Category, Stream
from clustersim.simulator.program import Program
from clustersim.units import format_seconds

BREAKDOWN_KEYS = (
    "forward",
    "backward",
    "compression",
    "optimizer",
    "other",
    "exposed_communication",
    "exposed_host",
    "exposed_transfer",
    "idle",
)
_EXPOSED = {
    Category.COMMUNICATION: "exposed_communication",
    Category.HOST: "exposed_host",
    Category.TRANSFER: "exposed_transfer",
}


@dataclass
class OpRecord:
    name: str
    stream: str
    category: str
    start: float
    end: float
    meta: dict
    intra_node_bytes: float = 0.0
    inter_node_bytes: float = 0.0
    rank: int = 0  # rank class: 0 the representative (typical) rank, 1 the slowest (stragglers)
    deps: tuple[int, ...] = ()  # indices in ``SimulationResult.ops`` (program order) it waited for


class OpRecords(Sequence):
    """The main program's ops with their times, made into OpRecords the first time they are read.

    Most runs (sweeps, plan, compare, uncertainty draws) never read them, and a 1T-parameter pipeline
    has 196k ops: building every record up front took a third of such a run (issue #12's speed target).
    Behaves as the list it stands for (len, index, iterate, compare)."""

    def __init__(self, ops, start, end):
        self._source = (ops, start, end)
        self._records: list[OpRecord] | None = None

    def _all(self) -> list[OpRecord]:
        if self._records is None:
            ops, start, end = self._source
            self._records = [
                OpRecord(
                    op.name, op.stream, op.category, start[op.id], end[op.id], op.meta,
                    op.intra_node_bytes, op.inter_node_bytes, op.rank, op.deps,
                )
                for op in ops
            ]  # fmt: skip
            self._source = None
        return self._records

    def __len__(self) -> int:
        return len(self._source[0]) if self._records is None else len(self._records)

    def __getitem__(self, index):
        return self._all()[index]

    def __iter__(self):
        return iter(self._all())

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"OpRecords({len(self)} ops)"


@dataclass
class SimulationResult:
    scenario: str
    optimizer: str
    world_size: int
    nodes: int
    gpus_per_node: int
    samples_per_iteration: int
    iteration_time: float
    breakdown: dict[str, float]
    bytes_per_link_kind: dict[str, float]
    buckets: list[dict]
    ops: Sequence[OpRecord] = field(repr=False, default_factory=list)
    notes: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    interval: object = None  # uncertainty.Interval of iteration_time, when asked for
    #: what priced the compute: "measured" (the profile's own measurement of this model), "carried"
    #: (another model's measurement carried over) or "defaults" (rates: the profile's or the catalog's)
    compute_from: str = "defaults"
    #: where compute_from is "carried": whose measurement, e.g. "GPT-2-1.5B seq 1024"
    carried_from: str | None = None
    #: the kind of step whose ops ``ops`` holds (the most frequent, where the optimizer has several)
    ops_step: str = ""

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_iteration / self.iteration_time if self.iteration_time > 0 else float("inf")

    def to_dict(self, include_ops: bool = False) -> dict:
        out = {
            "scenario": self.scenario,
            "optimizer": self.optimizer,
            "world_size": self.world_size,
            "nodes": self.nodes,
            "gpus_per_node": self.gpus_per_node,
            "iteration_time_s": self.iteration_time,
            "samples_per_s": self.samples_per_s,
            "samples_per_iteration": self.samples_per_iteration,
            "breakdown_s": self.breakdown,
            "bytes_per_link_kind": self.bytes_per_link_kind,
            "buckets": self.buckets,
            "memory_bytes": self.memory,
            "sources": self.sources,
            "notes": self.notes,
            **self.extra,
        }
        if self.interval is not None:
            iv = self.interval
            out["iteration_time_interval_s"] = iv.as_dict()
            out["samples_per_s_interval"] = {
                "p10": self.samples_per_iteration / iv.p90,
                "p50": self.samples_per_iteration / iv.p50,
                "p90": self.samples_per_iteration / iv.p10,
                "samples": iv.samples,
            }
        if include_ops:
            out["ops"] = [vars(o) for o in self.ops]
        return out

    def _rank_name(self, rank: int) -> str:
        """What an op rank stands for: a pipeline stage (of the slowest replica where there are
        stragglers: ranks p .. 2p-1), else the representative rank or the slowest rank's class."""
        par = self.extra.get("parallelism")
        if par and par.get("stages"):
            p = len(par["stages"])
            return f"stage {rank % p}{' of the slowest replica' if rank >= p else ''} ({self.scenario})"
        return f"rank 0 ({self.scenario})" if rank == 0 else f"slowest rank ({self.scenario})"

    def traced_step(self) -> str | None:
        """Which kind of step ``ops`` (and so the trace) shows, where the optimizer has several (0/1
        Adam's variance, compressed and local steps; DiLoCo's inner steps and sync window), and that
        the iteration time is their weighted mean; None where every step is the one simulated."""
        kinds = self.extra.get("steps") or []
        shown = next((k for k in kinds if k["label"] == self.ops_step), None)
        if shown is None:
            return None
        others = ", ".join(
            f"{k['label']} {100 * k['weight']:.1f}% at {format_seconds(k['iteration_time_s'])}"
            for k in kinds
            if k is not shown
        )
        return (
            f"the step kind {shown['label']} ({100 * shown['weight']:.1f}% of steps, "
            f"{format_seconds(shown['iteration_time_s'])}), the most frequent kind; the iteration time "
            f"{format_seconds(self.iteration_time)} is the weighted mean with the other kinds ({others})"
        )

    def chrome_trace(self) -> dict:
        """Chrome / Perfetto trace: one process per rank class (the representative rank; the slowest
        rank where there are stragglers; each pipeline stage), one track (thread) per stream, times in
        microseconds. Its processes are named by the kind of step they show and its metadata
        (``otherData``) says which and, where the optimizer has several kinds, that the iteration time
        is their weighted mean."""
        tids: dict[tuple[int, str], int] = {}
        kind = f", step kind {self.ops_step}" if self.ops_step and self.ops_step != "step" else ""

        def process(rank: int) -> str:
            return self._rank_name(rank) + kind

        events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": process(0)}}]
        for op in self.ops:
            lane = (op.rank, op.stream)
            if lane not in tids:
                if op.rank and all(r != op.rank for r, _ in tids):
                    events.append(
                        {
                            "name": "process_name",
                            "ph": "M",
                            "pid": op.rank,
                            "args": {"name": process(op.rank)},
                        }
                    )
                tids[lane] = len(tids)
                events.append(
                    {
                        "name": "thread_name",
                        "ph": "M",
                        "pid": op.rank,
                        "tid": tids[lane],
                        "args": {"name": op.stream},
                    }
                )
            events.append(
                {
                    "name": op.name,
                    "cat": op.category,
                    "ph": "X",
                    "pid": op.rank,
                    "tid": tids[lane],
                    "ts": op.start * 1e6,
                    "dur": max(op.end - op.start, 0.0) * 1e6,
                    "args": {k: v for k, v in op.meta.items() if isinstance(v, (int, float, str))},
                }
            )
        meta = {
            "scenario": self.scenario,
            "optimizer": self.optimizer,
            "step_kind": self.ops_step,
            "iteration_time_s": self.iteration_time,
        }
        shows = self.traced_step()
        if shows is not None:
            meta["shows"] = shows
        return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}

    def write_trace(self, path: Path) -> None:
        from clustersim.io import write_json_atomically

        write_json_atomically(Path(path), self.chrome_trace())


def _rank(op) -> tuple[int, str]:
    """Which busy op labels an instant, as (precedence, label): the compute stream's op, then a
    collective, host work, a transfer, then compute-category work on another stream."""
    if op.category in COMPUTE_CATEGORIES:
        return (0, op.category) if op.stream == Stream.COMPUTE else (4, op.category)
    if op.category in _EXPOSED:
        return (1 + _EXPOSED_ORDER.index(op.category), _EXPOSED[op.category])
    return (5, "idle")


_EXPOSED_ORDER = (Category.COMMUNICATION, Category.HOST, Category.TRANSFER)


def attribute_timeline(
    program: Program, start: dict[int, float], end: dict[int, float]
) -> tuple[float, dict[str, float]]:
    """Sweep the timeline and attribute each interval to one breakdown category.

    Each interval between consecutive start/end instants goes to the label of the highest-precedence
    op running through it (``_rank``; among equals the one that started first, in program order on
    ties), summed in time order. Ranks are computed once per op, not per interval (issue #15).

    A program of several ranks (pipeline stages): the step ends when the slowest rank ends, and the
    breakdown is that critical rank's (the one whose last op ends last; the lowest rank on ties), its
    pipeline bubbles counted as idle.
    """
    total = max(end.values(), default=0.0)
    ops = program.ops
    if any(o.rank for o in ops):
        last: dict[int, float] = {}
        for o in ops:
            if end[o.id] > last.get(o.rank, -1.0):
                last[o.rank] = end[o.id]
        # The rank ending last; in a straggler's typical view (the typical replica's stages) that
        # may be before the total, which the slowest replica's stages set.
        latest = max(last.values())
        critical = min(r for r, e in last.items() if e == latest)
        ops = [o for o in ops if o.rank == critical]
        points = sorted({0.0, total, *(start[o.id] for o in ops), *(end[o.id] for o in ops)})
    else:
        points = sorted({0.0, *start.values(), *end.values()})
    breakdown = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    spans = [(start[o.id], end[o.id], *_rank(o)) for o in ops if end[o.id] > start[o.id]]
    spans.sort(key=lambda s: s[0])
    active: list = []
    idx = 0
    n = len(spans)
    for a, b in zip(points, points[1:]):
        while idx < n and spans[idx][0] <= a:
            active.append(spans[idx])
            idx += 1
        active = [s for s in active if s[1] > a]
        # min() keeps the first of equal ranks: the earliest-started op, as the label's scan did
        label = min(active, key=_precedence)[3] if active else "idle"
        breakdown[label] += b - a
    return total, breakdown


def _precedence(span) -> int:
    return span[2]
