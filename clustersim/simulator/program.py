"""A Program: the ops one representative rank runs in one training iteration.

Strategies (optimizers, offload schemes) build programs; the engine runs them and knows nothing of
optimizers. An op runs on one stream (CUDA-stream semantics: in the order it was added to that
stream, after all its dependencies finished). Its ``duration`` is the time it takes alone; while
other ops run it can take longer: an op with ``compute_slowdown`` > 0 (a NCCL kernel holding SMs)
slows the compute stream by that fraction, and ops that push bytes through the same link share its
capacity max-min fairly. ``demands`` says how many bytes/s an op pushes through each link when it
runs alone at full speed; the program's ``links`` give each link's capacity in bytes/s.

A collective op also carries its description as data (``collective``: op, bytes, group shape,
algorithm, protocol), so that a network backend (simulator/network/) can give its duration when the
engine starts it; ``duration`` is the analytical cost model's time, which the default backend keeps.
``rank`` is the rank (class) running the op: 0 for the representative rank; a pipeline stage when
stages are simulated one by one; the slowest rank's class for stragglers. Streams are FIFO per
(rank, stream), and a NCCL kernel slows only its own rank's compute.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import NamedTuple

from clustersim.identifiers import COMPUTE_CATEGORIES, Category, Stream

# Breakdown categories, in the order they are attributed when several streams are busy at once.
CATEGORIES = tuple(Category)
__all__ = ["COMPUTE_CATEGORIES", "CATEGORIES", "CollectiveSpec", "Op", "Program"]
_STREAM = {s.value: s for s in Stream}

# The most ops one program may hold. The engine and the builders cost about 3-60 us and 1 KB per op at
# this scale (benchmarks/bench_counts.py and bench_3d.py: a 3D pipeline's ops are the cheap end, ZeRO-3
# on the flow backend, its many concurrent streams, the dear end: 274,000 ops in 11 s and 316 MB, 346,000
# ZeRO-3 ops in 10 s and 403 MB), so this bounds one run at under half a minute and under 0.5 GB; the
# largest published layout the validation runs (Megatron-LM's 1T model, 512 micro-batches on 64 stages
# with sequence parallelism) has 261,000. Not a model constant: a program that cannot be shortened
# without changing it is refused above it (docs/scale-limits.md).
MAX_PROGRAM_OPS = 400_000
op_budget: ContextVar[int] = ContextVar("op_budget", default=MAX_PROGRAM_OPS)


class ProgramTooLarge(Exception):
    """A program reached its op budget (``op_budget``) while being built; the runner names the count."""

    def __init__(self, limit: int):
        super().__init__(limit)
        self.limit = limit


_CATEGORY = {c.value: c for c in Category}


class CollectiveSpec(NamedTuple):
    """What a collective does, not how long it takes: a network backend prices it. ``shape`` is the
    communicator (topologies.GroupShape); ``algorithm`` and ``protocol`` are the ones the analytical
    model chose (or the scenario forced), so every backend runs the same algorithm."""

    op: str
    nbytes: float
    shape: object
    algorithm: str
    protocol: str
    count: int = 1  # that many back to back (identical parameter groups): the backend's time x count


@dataclass(slots=True)
class Op:
    id: int
    name: str
    stream: str
    duration: float
    category: str
    deps: tuple[int, ...] = ()
    intra_node_bytes: float = 0.0
    inter_node_bytes: float = 0.0
    compute_slowdown: float = 0.0
    demands: dict[str, float] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    rank: int = 0
    collective: CollectiveSpec | None = None


class Program:
    def __init__(self, links: dict[str, float] | None = None) -> None:
        self.ops: list[Op] = []
        self.links: dict[str, float] = dict(links or {})
        self._limit = op_budget.get()

    def add(
        self,
        name: str,
        stream: str,
        duration: float,
        category: str,
        deps=(),
        *,
        intra_node_bytes: float = 0.0,
        inter_node_bytes: float = 0.0,
        compute_slowdown: float = 0.0,
        demands: dict[str, float] | None = None,
        meta: dict | None = None,
        rank: int = 0,
        collective: CollectiveSpec | None = None,
    ) -> int:
        """Add an op; ``deps`` any iterable of op ids (None entries are dropped). Returns its id."""
        if type(deps) is not tuple:
            deps = tuple(deps)
        if None in deps:
            deps = tuple(d for d in deps if d is not None)
        return self.add_op(
            name, stream, float(duration), category, deps, intra_node_bytes, inter_node_bytes,
            compute_slowdown, {} if demands is None else demands, {} if meta is None else meta, rank,
            collective,
        )  # fmt: skip

    def add_op(
        self,
        name: str,
        stream: str,
        duration: float,
        category: str,
        deps: tuple[int, ...],
        intra_node_bytes: float,
        inter_node_bytes: float,
        compute_slowdown: float,
        demands: dict[str, float],
        meta: dict,
        rank: int,
        collective: CollectiveSpec | None,
    ) -> int:
        """``add`` with every field given, in Op's order: for builders that add ops by the hundred
        thousand (a pipeline's passes), where packing and unpacking keywords cost twice what making
        the op does. ``deps`` must be a tuple of op ids; stream, category and sign are checked."""
        # Dict lookups, not Stream(stream) / Category(category): an Enum call costs microseconds and
        # programs have thousands of ops (StrEnum members hash and compare equal to their strings).
        try:
            category = _CATEGORY[category]
        except KeyError:
            raise ValueError(f"unknown op category {category!r}") from None
        try:
            stream = _STREAM[stream]
        except KeyError:
            raise ValueError(f"unknown stream {stream!r} (known: {', '.join(Stream)})") from None
        if duration < 0:
            raise ValueError(f"op {name} has negative duration {duration}")
        ops = self.ops
        i = len(ops)
        if i >= self._limit:
            raise ProgramTooLarge(self._limit)
        ops.append(
            Op(
                i, name, stream, duration, category, deps, intra_node_bytes, inter_node_bytes,
                compute_slowdown, demands, meta, rank, collective,
            )
        )  # fmt: skip
        return i

    def refuse_beyond(self, more: int) -> None:
        """Raise ProgramTooLarge now if ``more`` ops (a lower bound on what the builder is about to add)
        cannot fit the budget: the same refusal the op that crosses it would raise, without building
        hundreds of thousands of ops first."""
        if len(self.ops) + more > self._limit:
            raise ProgramTooLarge(self._limit)

    def last_on(self, stream: str, rank: int = 0) -> int | None:
        for op in reversed(self.ops):
            if op.stream == stream and op.rank == rank:
                return op.id
        return None

    @property
    def ranks(self) -> int:
        """How many ranks the program simulates (1 for a representative-rank program)."""
        return 1 + max((op.rank for op in self.ops), default=0)
