"""`clustersim plan`: the cheapest cluster and optimizer that trains a model within a deadline.

Every candidate (a sweep file, or the built-in grid in catalogs/plan_candidates.yaml) is simulated
for the model with a fixed global batch, so every row trains the same recipe (global batch x steps);
time-to-train and cost follow, and the cheapest row meeting the deadline (and budget) wins.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from clustersim import catalog
from clustersim.errors import InputError
from clustersim.io import load_yaml
from clustersim.planner.layout_search import candidate_layouts, layout_label, running_micro_batch
from clustersim.report import analysis, costing
from clustersim.report.analysis import EQUIVALENT_GAIN
from clustersim.scenario import MEGATRON_KEYS, validate_scenario, with_one_pointwise_code
from clustersim.simulator.strategies.megatron import reusing_pipelines
from clustersim.sweeps.run import simulate_row
from clustersim.sweeps.spec import Sweep, SweepFile, load_sweep, resolve_profile_ref, resolve_row, row_id

# A row that fits in no layout even at micro-batch 1 (the compressed optimizers, data-parallel only, on
# a model too large for a GPU) is recorded from one simulation at micro-batch 1, where the fixed global
# batch's halving would end with the same "does not fit" reason, instead of one at each micro-batch.
NOTHING_FITS = {"micro_batch": 1}


def say_stage(progress, message: str) -> None:
    """Tell a progress display that counted work is done and ``message`` runs now, when it can be told
    (the CLI's progress gives its callback a ``say``; a plain callable is left alone)."""
    say = getattr(progress, "say", None)
    if say is not None:
        say(message)


def with_layouts(
    base, rows: list[dict[str, Any]], steps: int, global_batch: int, workers: int = 1
) -> list[dict[str, Any]]:
    """Each candidate row once per layout worth simulating on it (layout_search.py): itself when data
    parallelism fits, else its ZeRO and tensor x pipeline layouts that fit (sequence parallel, 1F1B or
    interleaved). A row that cannot be resolved stays as it is, to be recorded with its reason; one where
    nothing fits even at micro-batch 1 is simulated there (NOTHING_FITS). Rows that come to the same
    scenario (a candidates file varying tensor x pipeline names a layout the search also finds for
    another row) are kept once. The search decides by memory alone, which the network does not change,
    so rows that differ only in their NICs are searched once (_memory_key). It runs on ``workers``
    processes (0: every core), in chunks of such groups; the order is the rows' own."""
    base_json = base.model_dump(mode="json")
    groups: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(_memory_key(row), []).append((i, row))
    grouped = list(groups.values())
    with _pool(workers) as pool:
        size = max(1, -(-len(grouped) // (4 * pool.size)))
        chunks = [[r for g in grouped[i : i + size] for r in g] for i in range(0, len(grouped), size)]
        laid_out = any(k.startswith(_LAYOUT_KEYS) for row in rows for k in row)
        jobs = [(base_json, chunk, steps, global_batch, laid_out) for chunk in chunks]
        found = pool.starmap(_layouts_of, jobs)
    out, seen = [], set()
    for _, row, key in sorted((t for chunk in found for t in chunk), key=lambda t: t[0]):
        if key is None or key not in seen:
            out.append(row)
            seen.add(key)
    return out


# A row's values that name its network: the layout search, which decides by memory, ignores them.
_NIC_AXES = ("nic_kind", "nic_gbps", "nic_count")


def _memory_key(values: dict[str, Any]) -> str:
    """What a row's layouts depend on: its values without its network's."""
    return row_id(
        {k: v for k, v in values.items() if k not in _NIC_AXES and not k.startswith("cluster.nic.")}
    )


def _layouts_of(
    base_json: dict, rows: list[tuple[int, dict[str, Any]]], steps: int, global_batch: int, laid_out: bool
) -> list[tuple]:
    """(position, row with a layout, its _scenario_key) for each layout worth simulating on each of
    ``rows`` ((position, values); with_layouts), the search made once per _memory_key."""
    from clustersim.scenario import validate_scenario

    base = validate_scenario(base_json, source="base")
    searched: dict[str, list[dict[str, Any]]] = {}
    out = []
    for i, values in rows:
        try:
            resolve_row(base, values, steps, global_batch)  # a row that cannot run is recorded as it is
            key = _memory_key(values)
            if key not in searched:  # searched from the micro-batch the row starts at, before the split
                searched[key] = candidate_layouts(resolve_row(base, values, steps), global_batch) or [
                    NOTHING_FITS
                ]
            layouts = searched[key]
        except InputError:
            layouts = [{}]
        for row in [{**values, **layout} for layout in layouts]:
            out.append((i, row, _scenario_key(base, row, steps, global_batch, laid_out)))
    return out


def _scenario_key(base, row: dict[str, Any], steps: int, global_batch: int, laid_out: bool) -> str | None:
    """What makes two rows the same candidate (with_layouts): their scenario, where the candidates name
    layouts themselves (``laid_out``: a row may then come to a layout the search found for another);
    else the row's values, which differ between rows (resolving each row again would cost more than the
    search). None for a row that cannot be resolved, recorded with its reason."""
    try:
        if laid_out:
            return resolve_row(base, row, steps, global_batch).model_dump_json()
        return row_id(row)
    except InputError:
        return None


def simulate_rows(
    base_json: dict,
    rows: list[dict[str, Any]],
    steps: int,
    global_batch: int,
    progress: Callable[[int, int], None] | None = None,
    prune: "Pruning | None" = None,
) -> tuple[list[dict[str, Any]], int] | tuple[list[dict[str, Any]], int, int]:
    """Simulate the rows, the interleaved ones last and only those that could still be the fastest
    layout on their cluster (where the fastest is also the cheapest): the interleaved schedule removes
    idle pipeline time, not work, so a row whose 1F1B twin spends at least the cluster's best step time
    computing (and updating) on its critical rank cannot win, and is not simulated. Returns the records
    and how many rows were skipped so. With ``prune`` (a plan's constraints), rows go in order of their
    cost's lower bound, and a row whose lower bounds (planner.bounds) can make it neither one of the
    cheapest that meet the constraints nor the fastest is not simulated either; the rows are then
    simulated on every core, and the count of those pruned comes third."""
    later = [r for r in rows if r.get(SCHEDULE) == "interleaved"]
    first = [r for r in rows if r.get(SCHEDULE) != "interleaved"]
    if prune is not None:
        return _simulate_pruned(base_json, first, later, steps, global_batch, progress, prune)
    records: list[dict[str, Any]] = []
    fastest: dict[str, float] = {}
    skipped = 0
    for i, values in enumerate(first + later):
        if _twin_cannot_win(values, records, fastest):
            skipped += 1
        else:
            _record(records, fastest, values, simulate_row(base_json, values, steps, None, global_batch))
        if progress:
            progress(i + 1, len(rows))
    return records, skipped


def _twin_cannot_win(values, records, fastest) -> bool:
    twin = _one_f_one_b_twin(values, records) if values.get(SCHEDULE) == "interleaved" else None
    return twin is not None and _busy_s(twin) >= fastest.get(_cluster_id(values), float("inf"))


def _record(records, fastest, values, rec) -> None:
    rec["layout"] = layout_label(rec["scenario"]) if "scenario" in rec else "DP"
    records.append(rec)
    if rec["status"] == "ok":
        key = _cluster_id(values)
        fastest[key] = min(fastest.get(key, float("inf")), rec["iteration_time_s"])


@dataclass
class Pruning:
    """What a plan asks, to rule out candidates unsimulated: the cost of a row as the plan prices it
    (``cost_of(record) -> (hours, dollars, spend)``: the run's cost, by which the cheapest are ranked,
    and what it asks to spend, which the budget is held against as the choice holds it: an owned
    cluster's capital and the run's power, a rental's hours, report/analysis.outlay), the deadline and
    budget, and how many of the cheapest rows that meet them must be exact (the choice, the runners-up
    and look-alikes among them)."""

    cost_of: Callable[[dict[str, Any]], tuple[float, float, float]]
    deadline_h: float
    budget: float | None
    keep: int = 10
    workers: int = 0  # 0: every core this process may use
    # Work for this process while its workers simulate (once, when the first rows are in flight, on a
    # thread of its own: _Background): what it does then costs no core that would otherwise be idle
    # later (the bands' sampler import).
    meanwhile: Callable[[], None] | None = None
    # Records by row id of rows already simulated (a plan's first search, when its second searches
    # every candidate): taken as they are instead of simulated again.
    done: dict[str, dict[str, Any]] = field(default_factory=dict)

    def meets(self, hours: float, spend: float) -> bool:
        return hours <= self.deadline_h and (self.budget is None or spend <= self.budget)

    def could_win(
        self,
        bound: tuple[float, float, float] | None,
        met: list[float],
        fastest_h: float,
        fastest_met_h: float = float("inf"),
        least_spend: float = float("inf"),
    ) -> bool:
        """Whether a row with lower bounds ``bound`` (hours, dollars, spend; None: unknown) could still be
        the fastest, the fastest that meets the constraints (``fastest_met_h``: of those simulated so far;
        the plan names it where the fastest of all is over the budget), or among the ``keep`` cheapest
        that meet them (``met``: the dollars of those simulated so far, sorted), within twice the plan's
        equivalence margin; while none meets them, also the least spend of all (``least_spend``: of
        those simulated so far), which the answer then quotes ("the cheapest needs ...")."""
        if bound is None:
            return True
        hours, dollars, spend = bound
        if hours < fastest_h:
            return True
        if not self.meets(hours, spend):
            return not met and spend < least_spend
        if hours < fastest_met_h:
            return True
        return len(met) < self.keep or dollars <= met[self.keep - 1] * (1 + 2 * EQUIVALENT_GAIN)


def _bound_record(values: dict[str, Any], scenario, step_s: float) -> dict[str, Any]:
    """A record as simulate_row writes it, at a step of ``step_s``: what the plan's pricing reads."""
    c = scenario.cluster
    return {
        **values,
        "row_id": row_id(values),
        "status": "ok",
        "world_size": c.world_size,
        "nodes": c.nodes,
        "gpus_per_node": c.gpus_per_node,
        "gpu": c.gpu_name,
        "model": scenario.workload.model or "custom",
        "optimizer": scenario.training.optimizer,
        "nic_kind": c.nic.kind,
        "nic_gbps": c.nic.line_rate_gbps,
        "nic_effective_gbps": c.nic.effective_gbps,
        "nic_count": c.nic.count,
        "iteration_time_s": step_s,
        "scenario": scenario.model_dump(mode="json"),
    }


def _bounds(base_json, rows, steps, global_batch, pool) -> dict[str, dict[str, Any]]:
    """Row id -> its record at its lower-bound step (planner.bounds), where one is known, found on the
    workers (a few chunks each); Pruning.cost_of prices them here."""
    size = max(1, -(-len(rows) // (2 * pool.size)))
    chunks = [(base_json, rows[i : i + size], steps, global_batch) for i in range(0, len(rows), size)]
    return {rec["row_id"]: rec for part in pool.starmap(_bound_records, chunks) for rec in part}


def _fastest_twins(rows: list[dict[str, Any]], kinds: bool = False) -> dict[str, list[str]]:
    """Row id -> the ids of its twins on a NIC at least as fast (the same row, NIC count, another
    ``nic_gbps``), for the rows in a layout the search added (sharded or model parallel) that have
    one: the twin of its kind at the highest line rate among the candidates and, with ``kinds``
    (_kinds_rank), for an Ethernet row the InfiniBand twin at the highest rate, if no slower. More
    bandwidth is never slower (an invariant of the simulator, tested in test_simulation.py,
    test_sharding.py, test_optimizers.py), so each such twin's simulated step bounds this row's from
    below, tighter than its compute bound wherever the network shows. Data-parallel rows are left to
    their own bounds: they are cheap to simulate, and the lines on where compression stops paying
    (analysis.optimizer_lines: speedups over the baseline on each network) read them."""
    drop = ("nic_gbps", "nic_kind") if kinds else ("nic_gbps",)
    groups: dict[str, list[dict[str, Any]]] = {}
    for v in rows:
        if isinstance(v.get("nic_gbps"), (int, float)) and any(k.startswith(_LAYOUT_KEYS) for k in v):
            groups.setdefault(row_id({k: x for k, x in v.items() if k not in drop}), []).append(v)
    out: dict[str, list[str]] = {}
    for group in groups.values():
        tops = {}
        for v in group:  # the fastest of each kind
            kind = v.get("nic_kind")
            if kind not in tops or v["nic_gbps"] > tops[kind]["nic_gbps"]:
                tops[kind] = v
        infiniband = tops.get("infiniband") if kinds else None
        for v in group:
            mine = tops[v.get("nic_kind")]
            faster = [mine] if v["nic_gbps"] < mine["nic_gbps"] else []
            if infiniband is not None and v is not infiniband and infiniband["nic_gbps"] >= v["nic_gbps"]:
                faster.append(infiniband)
            if faster:
                out[row_id(v)] = [row_id(t) for t in faster if t is not v]
    return out


def _kinds_rank(base) -> bool:
    """Whether InfiniBand is never slower than Ethernet at one line rate for the plan's rows: without a
    calibration profile (which may fit each kind's network on its own) and with the base's NIC left to
    the catalog's figures for its kind, InfiniBand's are at least as good in every respect the model
    prices: a larger share of the line rate, a lower latency, no more pacing, and RDMA where Ethernet
    stages through host memory (hardware_defaults.yaml nic; topologies/cluster.py)."""
    from clustersim.catalog import hardware_defaults

    nic = base.cluster.nic
    if base.profile is not None or nic.latency_us or nic.pacing_cv is not None or nic.gpudirect_rdma:
        return False
    d = hardware_defaults()["nic"]
    ib, eth = "infiniband", "ethernet_tcp"
    return (
        d[ib] >= d[eth]
        and d["latency_s"][ib] <= d["latency_s"][eth]
        and d["pacing_cv"][ib] <= d["pacing_cv"][eth]
    )


def _unbeatable_step(values, nic_twin, busy: dict[str, float]) -> dict[str, Any] | None:
    """A record whose step ``values``' row cannot beat, where one is known (_raised): its faster-NIC
    twin's; for an interleaved row also the least that a 1F1B twin's critical stage computes at any line
    rate of its NIC (``busy``, by _busy_key; more bandwidth is never slower)."""
    steps = [nic_twin["iteration_time_s"]] if nic_twin else []
    if values.get(SCHEDULE) == "interleaved" and _busy_key(values) in busy:
        steps.append(busy[_busy_key(values)])
    return {"iteration_time_s": max(steps)} if steps else None


def _busy_key(values: dict[str, Any]) -> str:
    """A row's values without its schedule and its line rate (_unbeatable_step)."""
    drop = (SCHEDULE, "training.parallelism.virtual_stages", "nic_gbps")
    return row_id({k: v for k, v in values.items() if k not in drop})


def _note_busy(busy: dict[str, float], values: dict[str, Any], rec: dict[str, Any]) -> None:
    """Keep the least a simulated 1F1B row's critical stage computes, by _busy_key."""
    if values.get(SCHEDULE) != "interleaved":
        key = _busy_key(values)
        busy[key] = min(busy.get(key, float("inf")), _busy_s(rec))


def _raised(bound_rec: dict[str, Any], twin: dict[str, Any], prune: Pruning) -> tuple[float, float, float]:
    """(hours, dollars, spend) of a row at the larger of its lower-bound step and a step it cannot beat: its
    faster-NIC twin's simulated one (_fastest_twins), or what its 1F1B twin's critical stage computes
    (an interleaved row, _busy_s)."""
    step = max(bound_rec["iteration_time_s"], twin["iteration_time_s"] * _TIE)
    return prune.cost_of({**bound_rec, "iteration_time_s": step})


# A twin's step, as a bound, is scaled by this: a row as fast as its faster-NIC twin (its network unused)
# may tie the fastest row, and a tie must still be simulated (the first of equals is the fastest).
_TIE = 1 - 1e-9


def _bound_records(base_json: dict, rows, steps, global_batch) -> list[dict[str, Any]]:
    """Each row's record at its compute-only step (_bound_record), where a bound is known."""
    from clustersim.planner.bounds import step_time_lower_bound
    from clustersim.scenario import validate_scenario

    base = validate_scenario(base_json, source="base")
    out = []
    running: dict[str, Any] = {}  # _memory_key -> the row's scenario at the micro-batch it will run at
    resolved: dict[str, Any] = {}  # _memory_key -> a row's scenario: its NIC twins are it with their NIC
    for values in rows:
        key = _memory_key(values)
        try:
            if key in resolved:
                scenario = resolved[key].with_changes(**_nic_changes(values))
            else:
                scenario = resolved[key] = resolve_row(base, values, steps, global_batch)
        except InputError:
            continue  # simulated, to be recorded with its reason
        if scenario.training.sharding.stage == 3:
            # ZeRO-3 gathers the parameters in every micro-step (bounds._data_parallel_exchange): its
            # bound counts the micro-steps the row will run, from the memory check alone (no network)
            if key not in running:
                running[key] = running_micro_batch(scenario)
            if running[key] is None:
                continue  # nothing fits: simulated, to be recorded with its reason
            scenario = scenario.with_changes(
                **{k: running[key].workload.model_dump()[k.split(".")[1]] for k in _MICRO_KEYS}
            )
        lb = step_time_lower_bound(scenario)
        if lb > 0:
            out.append(_bound_record(values, scenario, lb))
    return out


_MICRO_KEYS = ("workload.micro_batch", "workload.gradient_accumulation")


def _nic_changes(values: dict[str, Any]) -> dict[str, Any]:
    """A row's NIC values as the scenario keys resolve_row sets (a NIC given by kind or rate loses
    the base's measured effective rate): what makes its scenario from a NIC twin's."""
    from clustersim.sweeps.spec import AXES

    changes = {AXES[k]: v for k, v in values.items() if k in _NIC_AXES}
    changes.update({k: v for k, v in values.items() if k.startswith("cluster.nic.")})
    if ("nic_gbps" in values or "nic_kind" in values) and "nic_effective_gbps" not in values:
        changes["cluster.nic.effective_gbps"] = None
    return changes


def _cheapest_first(rows, bounds) -> list[dict[str, Any]]:
    """The cheapest bounds first, so that the rows that set the bar are simulated early; and first of
    all the one whose bound is fastest, which sets the bar for the fastest."""
    order = sorted(rows, key=lambda v: bounds.get(row_id(v), (0.0, 0.0))[1])
    if order:
        quickest = min(order, key=lambda v: bounds.get(row_id(v), (float("inf"), 0.0))[0])
        order = [quickest] + [v for v in order if v is not quickest]
    return order


def _missing_baselines(records, values_of, baseline: str) -> list[str]:
    """Row ids of the baseline rows on the simulated rows' clusters that were not simulated."""
    done = {r["row_id"] for r in records}
    out: list[str] = []
    for rec in records:
        values = values_of.get(rec["row_id"])
        if rec["status"] == "ok" and values is not None:
            tid = row_id({**values, "optimizer": baseline})
            if tid in values_of and tid not in done and tid not in out:
                out.append(tid)
    return out


def _simulate_pruned(base_json, first, later, steps, global_batch, progress, prune: Pruning):
    """simulate_rows with pruning (its docstring), a window of rows in flight on the workers."""
    from clustersim.planner.compare import choose_baseline
    from clustersim.scenario import validate_scenario

    base = validate_scenario(base_json, source="base")
    records: list[dict[str, Any]] = []
    fastest: dict[str, float] = {}
    met: list[float] = []  # dollars of the simulated rows that meet the constraints, sorted
    best_h = [float("inf")]
    best_met_h = [float("inf")]  # the fastest simulated row that meets the constraints
    least_spend = [float("inf")]  # the least any simulated row asks to spend
    done_ok: dict[str, dict[str, Any]] = {}  # row id -> its simulated record, where it ran
    busy: dict[str, float] = {}  # _busy_key -> what a simulated 1F1B row's critical stage computes
    skipped = pruned = done = 0

    def could_win(values) -> bool:
        rid = row_id(values)
        ran = [done_ok[t]["iteration_time_s"] for t in twins.get(rid, ()) if t in done_ok]
        twin = _unbeatable_step(values, {"iteration_time_s": max(ran)} if ran else None, busy)
        bound = _raised(bounds[rid], twin, prune) if twin and rid in bounds else priced.get(rid)
        return prune.could_win(bound, met, best_h[0], best_met_h[0], least_spend[0])

    def take(values, rec) -> None:
        _record(records, fastest, values, rec)
        if rec["status"] == "ok":
            done_ok[rec["row_id"]] = rec
            _note_busy(busy, values, rec)
            hours, dollars, spend = prune.cost_of(rec)
            best_h[0] = min(best_h[0], hours)
            least_spend[0] = min(least_spend[0], spend)
            if prune.meets(hours, spend):
                best_met_h[0] = min(best_met_h[0], hours)
                met.append(dollars)
                met.sort()

    _KEPT.clear()  # only this plan's programs (its catalogs): in this process with one worker
    with _pool(prune.workers) as pool, _emptied(_KEPT):
        bounds = _bounds(base_json, first + later, steps, global_batch, pool)
        priced = {rid: prune.cost_of(rec) for rid, rec in bounds.items()}
        # the rows with a faster-NIC twin go after the rest, when their twins' steps are known
        twins = _fastest_twins(first + later, kinds=_kinds_rank(base))
        order = [
            *_cheapest_first([v for v in first if row_id(v) not in twins], priced),
            *_cheapest_first([v for v in first if row_id(v) in twins], priced),
            *[v for v in later if row_id(v) not in twins],
            *[v for v in later if row_id(v) in twins],
        ]
        total = len(order)
        # A window of rows in flight, their results taken in the order they were sent: a row is decided
        # on the results of every row sent before the last `ahead` - 1, whatever the timing, so the rows
        # pruned are the same on every run; one more row than workers keeps every worker busy while the
        # oldest is awaited (waves of one row per worker left a core idle behind each wave's slowest).
        ahead = pool.size + 1 if pool.executor is not None else 1
        flight: deque = deque()
        side = _Background()
        early = _EarlySends(
            order,
            pool.size if pool.executor is not None else 0,
            wanted=lambda v: not _twin_cannot_win(v, records, fastest) and could_win(v),
            send=lambda v: _send(pool, prune, base_json, v, steps, global_batch),
        )

        def land() -> None:
            nonlocal done
            values, future = flight.popleft()
            early.await_(future, [f for _, f in flight])
            take(values, future.result())
            done += 1
            if progress:
                progress(done, total)

        for values in order:
            if len(flight) >= ahead and prune.meanwhile is not None:
                side.start(prune.meanwhile)
                prune.meanwhile = None
            while len(flight) >= ahead:
                land()
            sent = early.turn()  # this row's future if it was sent ahead, else None
            if _twin_cannot_win(values, records, fastest):
                skipped += 1
            elif not could_win(values):
                pruned += 1
            else:
                flight.append((values, sent or _send(pool, prune, base_json, values, steps, global_batch)))
                continue
            _EarlySends.drop(sent)
            done += 1
            if progress:
                progress(done, total)
        while flight:
            land()
        # a kept row's baseline on its cluster (its speedup, "Over adam on the same cluster")
        values_of = {row_id(v): v for v in order}
        twins = _missing_baselines(records, values_of, choose_baseline(base.training.optimizer))
        for tid, rec in zip(twins, pool.map(base_json, [values_of[t] for t in twins], steps, global_batch)):
            take(values_of[tid], rec)
            pruned -= 1
        side.join()  # before this process forks again (the bands' workers)
    # in the candidates' own order, as without pruning: ties (the same cost on two networks) go the same way
    position = {row_id(v): i for i, v in enumerate(first + later)}
    records.sort(key=lambda r: position.get(r["row_id"], len(position)))
    return records, skipped, pruned


@contextmanager
def _emptied(kept: dict) -> Iterator[dict]:
    """``kept``, emptied on the way out (the programs' memory back before the bands' workers fork)."""
    try:
        yield kept
    finally:
        kept.clear()


class _Background:
    """Pruning.meanwhile run on a thread of this process, while its main thread keeps the workers fed
    (run on the main thread, the bands' sampler import left both workers idle for half a second: the
    rows in flight were done long before it). Started once the workers are forked (a fork-context pool
    forks them all at its first task) and joined before this process forks again: a fork while the
    thread imports could leave the child an import lock it never gets back."""

    def __init__(self):
        self.thread = None

    def start(self, work: Callable[[], None]) -> None:
        import threading

        self.thread = threading.Thread(target=work, name="plan-meanwhile", daemon=True)
        self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None


# Rows in flight per worker, counting those sent ahead of their turn (_EarlySends): enough that a worker
# finds another row queued whenever it finishes one while the oldest is still running.
EARLY_ROWS = 3


class _EarlySends:
    """Rows of ``order`` sent to the workers ahead of their turn, so that a worker is not left idle
    while _simulate_pruned awaits the oldest row in flight, a long one (the rows sent after it may be
    quick ones, a row that does not fit in memory takes a millisecond): each row is still decided in its
    turn on exactly the results its window gives it (its future is taken if it is to be simulated;
    cancelled, or its result dropped, if not), so the rows simulated, pruned and skipped are the same as
    without. A row is sent early where it could win on what is known at the time (``wanted``): a
    guess, which the decision in its turn may overrule (a few rows per plan)."""

    def __init__(self, order: list, workers: int, wanted: Callable, send: Callable):
        self.order, self.workers, self.wanted, self.send = order, workers, wanted, send
        self.futures: dict[int, Any] = {}  # position in ``order`` -> its future
        self.position = -1  # the row whose turn it is
        self.scan = 0  # the next position to consider

    def turn(self):
        """The next row's turn: its future, if it was sent early (else None)."""
        self.position += 1
        return self.futures.pop(self.position, None)

    def await_(self, awaited, in_flight) -> None:
        """Wait for ``awaited`` (the oldest row in flight), meanwhile keeping EARLY_ROWS rows per worker
        running or queued: whenever a row finishes, the next rows that could win on what is known now
        are sent (``in_flight``: the futures of the other rows in flight in their turn). With one
        worker, nothing is sent early (its rows run as they are sent)."""
        from concurrent.futures import FIRST_COMPLETED, wait

        while self.workers and not awaited.done():
            running = [awaited, *(f for f in in_flight if not f.done())]
            running += [f for f in self.futures.values() if not f.done()]
            room = EARLY_ROWS * self.workers - len(running)
            self.scan = max(self.scan, self.position + 1)
            while room > 0 and self.scan < len(self.order):
                values = self.order[self.scan]
                if self.wanted(values):
                    running.append(self.send(values))
                    self.futures[self.scan] = running[-1]
                    room -= 1
                self.scan += 1
            wait(running, return_when=FIRST_COMPLETED)

    @staticmethod
    def drop(future) -> None:
        """A row sent early that is not to be simulated after all: not run, or its result dropped."""
        if future is not None:
            future.cancel()


def _send(pool: "_pool", prune: Pruning, base_json, values, steps, global_batch):
    """The future record of a row: its record as already simulated (Pruning.done), or its simulation
    on a worker."""
    known = prune.done.get(row_id(values))
    if known is not None:
        return _finished(dict(known))
    return pool.submit(base_json, values, steps, global_batch)


def _finished(result):
    """A future already done with ``result``."""
    from concurrent.futures import Future

    done: Future = Future()
    done.set_result(result)
    return done


def _starmap_on(workers: int):
    """``starmap(fn, args_list)`` on ``workers`` processes (_pool), started only for two jobs or more."""

    def starmap(fn, args_list: list[tuple]) -> list:
        if len(args_list) < 2:
            return [fn(*args) for args in args_list]
        with _pool(workers) as pool:
            return pool.starmap(fn, args_list)

    return starmap


class _pool:
    """simulate_row on ``workers`` processes (0: every core this process may use; 1: this process),
    forked so that they start with this process's imports and catalogs. Entered again (a pool handed
    to a function that also takes a count), it is the same pool, shut down when the outermost exits."""

    def __init__(self, workers: int):
        from clustersim.sweeps.run import default_workers

        self.size = workers or default_workers()
        self.executor = None
        self._entered = 0

    def __enter__(self):
        if self.size > 1 and self.executor is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            from clustersim.sweeps.run import quiet_on_sigint, sigint_held

            self.executor = ProcessPoolExecutor(
                self.size, mp_context=multiprocessing.get_context("fork"), initializer=quiet_on_sigint
            )
            with sigint_held():  # the first submit forks every worker: Ctrl-C is the parent's alone
                self.executor.submit(int).result()
        self._entered += 1
        return self

    def __exit__(self, *exc):
        self._entered -= 1
        if self.executor is not None and not self._entered:
            self.executor.shutdown(cancel_futures=True)
            self.executor = None

    def map(self, base_json, rows, steps, global_batch, samples: int = 0) -> list[dict[str, Any]]:
        if self.executor is None or len(rows) < 2:
            return [_simulate_row(base_json, v, steps, global_batch, samples) for v in rows]
        jobs = [self.executor.submit(_simulate_row, base_json, v, steps, global_batch, samples) for v in rows]
        return [f.result() for f in jobs]

    def submit(self, base_json, values, steps, global_batch):
        """simulate_row of one row on a worker: a future (with one worker, one already done here)."""
        if self.executor is None:
            return _finished(_simulate_row(base_json, values, steps, global_batch))
        return self.executor.submit(_simulate_row, base_json, values, steps, global_batch)

    def starmap(self, fn, args_list: list[tuple], one_too: bool = False) -> list:
        """``fn(*args)`` for each, on the workers (in this process with one worker, or for one job
        unless ``one_too``: a worker keeps what the job builds for the next call)."""
        if self.executor is None or len(args_list) < (1 if one_too else 2):
            return [fn(*args) for args in args_list]
        return [f.result() for f in [self.executor.submit(fn, *args) for args in args_list]]


def _simulate_row(base_json: dict, values: dict[str, Any], steps: int, global_batch: int, samples: int = 0):
    """simulate_row of a plan's row, re-pricing the pipeline program this process built for a row that
    differs from it only in its NIC (megatron.reusing_pipelines, _KEPT): the plan's rows are every
    candidate layout on each NIC. A banded row (``samples``) is simulated as it is: its draws run in the
    same process, and a draw must not re-price the program its nominal run's result holds."""
    if samples:
        return simulate_row(base_json, values, steps, None, global_batch, samples)
    with reusing_pipelines(_KEPT):
        return simulate_row(base_json, values, steps, None, global_batch)


# The pipeline programs this process's simulations keep for rows on another NIC (_simulate_row): in a
# worker, those of its rows; in the plan's own process (one worker), emptied when the simulation ends, so
# that a later plan (another catalog) starts from none.
_KEPT: dict = {}


SCHEDULE = "training.parallelism.schedule"
_LAYOUT_KEYS = ("training.parallelism.", "training.sharding.", "workload.activation_checkpointing")


def _cluster_id(values: dict[str, Any]) -> str:
    """The candidate a row belongs to: its values without the layout the search added."""
    return row_id({k: v for k, v in values.items() if not k.startswith(_LAYOUT_KEYS)})


def _one_f_one_b_twin(values: dict[str, Any], records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The simulated record of the same layout under 1F1B, if it ran."""
    twin = {k: v for k, v in values.items() if k not in (SCHEDULE, "training.parallelism.virtual_stages")}
    tid = row_id(twin)
    return next((r for r in records if r["row_id"] == tid and r["status"] == "ok"), None)


def _busy_s(rec: dict[str, Any]) -> float:
    """What the critical rank computes per step (forward, backward with its recomputation, optimizer,
    other): no schedule can take less on that stage, nor at a smaller micro-batch."""
    return rec["forward_s"] + rec["backward_s"] + rec["optimizer_s"] + rec["other_s"]


def candidate_sweep(path: Path | None) -> Sweep:
    if path is not None:
        return load_sweep(path)
    raw = load_yaml(resources.files("clustersim.catalogs").joinpath("plan_candidates.yaml").read_text())
    _with_user_gpus(raw)
    spec = SweepFile.model_validate(raw)
    return Sweep(spec, validate_scenario(spec.base, source="plan_candidates.yaml"), BUILT_IN)


def _with_user_gpus(raw: dict[str, Any]) -> None:
    """The built-in grid is every GPU of the catalog: the GPUs a user catalog adds (--catalog) join it,
    each in a node of its kind as the grid's per_gpu says of the shipped ones: no NVLink, a PCIe server;
    no bf16, fp16 mixed precision."""
    for name in catalog.user_gpu_names():
        raw["vary"]["gpu"].append(name)
        spec = catalog.gpu(name)
        node = {}
        if not spec.nvlink.links:
            node["fabric"] = "pcie"
        if not spec.peak_tflops.get("bf16"):
            node["precision"] = "fp16"
        if node:
            raw.setdefault("per_gpu", {})[name] = node


BUILT_IN = "built-in candidates"  # the source of catalogs/plan_candidates.yaml's Sweep


DEFAULT_GLOBAL_BATCH = 1024  # plan's samples per step when neither --global-batch nor the file sets one


def default_global_batch(sweep: Sweep) -> int:
    """The samples per step of a plan whose batch nobody set: DEFAULT_GLOBAL_BATCH, or, where the largest
    candidate has more GPUs than that, the smallest multiple of it that gives that candidate's every GPU
    a sample (1,024 samples cannot be split over 2,048 data-parallel ranks, and a batch that leaves
    candidates out would make the plan choose among the small ones only). Every candidate trains with
    this one batch, so all of them train the same recipe; give --global-batch for your own."""
    per_node = sweep.base.cluster.gpus_per_node

    def world(row: dict[str, Any]) -> int:
        if isinstance(row.get("gpus"), int):
            return row["gpus"]
        nodes = row.get("nodes", sweep.base.cluster.nodes)
        return int(nodes) * int(row.get("gpus_per_node", per_node)) if isinstance(nodes, int) else 0

    largest = max([sweep.base.cluster.world_size, *(world(r) for r in sweep.rows())])
    return DEFAULT_GLOBAL_BATCH * max(1, -(-largest // DEFAULT_GLOBAL_BATCH))


def plan(
    model: str,
    steps,
    deadline_h: float,
    budget: float | None,
    candidates: Path | None,
    global_batch: int | None,
    price: float | None,
    progress: Callable[[int, int], None] | None = None,
    profile: str | None = None,
    samples: int = 32,  # uncertainty.DEFAULT_SAMPLES
    baseline: str | None = None,
    network="default",
    costs=None,
    workers: int = 0,
    prune: bool = True,
    tokens: int | None = None,
) -> dict[str, Any]:
    """Simulate every candidate once and choose; then give the five cheapest that meet the constraints (and
    the choice) their P10-P90 time-to-train (``samples`` draws each; banding every candidate would cost 9x
    more) and the choice its paired speedup band over its baseline, and choose again: a cheaper but more
    complex option (compressed optimizer, offload) is only recommended when it saves more than
    analysis.EQUIVALENT_GAIN or its band does not overlap.

    ``steps`` (an int, "adam=100000,binsgdm=110000" or a StepsPlan) and ``global_batch`` default to the
    candidates file's ``steps`` and ``global_batch``; a value given here wins, and the result says which
    was used (``recipe``). ``tokens`` instead of ``steps``: the steps that train that many tokens,
    tokens / (global batch x the model's sequence length), rounded up.

    ``costs``: the cost model (report/costing.py; default: costing.auto_model, owned where the catalog
    prices every candidate GPU, or rented at ``price`` per GPU-hour).
    Rented without a candidates file or a flat --price, the candidates are the instances as sold.
    ``workers``: processes that simulate (0: every core); ``prune``: skip candidates whose lower
    bounds cannot win (planner/bounds.py; the answer is the same)."""
    sweep = candidate_sweep(candidates)
    seq = None
    if tokens is not None:
        steps, seq = _steps_for_tokens(sweep, model, tokens, steps, global_batch)
    recipe = _recipe(sweep, steps, global_batch, "--tokens" if tokens is not None else "--steps")
    if tokens is not None:
        recipe["notes"].append(tokens_note(tokens, steps, recipe["global_batch"], seq))
    as_sold = (
        costs is not None and candidates is None and costs.model == "rent" and costs.per_gpu_hour is None
    )
    with sweep.catalogs_in_use(), _fewer_collections():  # the candidates file's own `catalog:`
        return _plan(
            sweep, model, recipe, deadline_h, budget, price, progress, profile, samples, baseline, network,
            costs=costs, as_sold=as_sold, workers=workers, prune=prune, priced_only=candidates is None,
        )  # fmt: skip


# The cyclic garbage collector's young-generation threshold while a plan runs (Python's default is 700
# allocations). A plan allocates millions of short-lived op records, most of them in no cycle, and
# scans them again and again at the default: at 50,000 the GPT-3 175B plan of docs/speed.md takes 3%
# less time (5 interleaved pairs on a quiet 2-core machine: 4.65 s median against 4.80, 0.2 CPU-s less),
# the same answer, and memory is still bounded (a collection every 50,000 allocations). Forked workers
# inherit it.
PLAN_GC_THRESHOLD0 = 50_000


@contextmanager
def _fewer_collections():
    """The plan runs with the young generation collected every PLAN_GC_THRESHOLD0 allocations; the
    caller's thresholds come back afterwards (the API's caller keeps its own)."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], PLAN_GC_THRESHOLD0), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


# Rounding --tokens up to whole steps that trains more than this share over the tokens asked for is said
# as a warning with the tokens trained (a presentation threshold: a step count within 1% reads as exact).
TOKENS_ROUNDING_NOTED = 0.01


def tokens_note(tokens: int, steps: int, global_batch: int, seq: int) -> str:
    """The arithmetic behind --tokens, printed under the plan's header; where whole steps train
    noticeably more tokens than asked for, how many more."""
    trained = steps * global_batch * seq
    note = (
        f"{tokens:,} tokens = {steps:,} steps x {global_batch:,} samples x {seq:,} tokens per sample "
        "(rounded up)"
    )
    if trained > tokens * (1 + TOKENS_ROUNDING_NOTED):
        note += (
            f"; warning: {steps:,} steps train {trained:,} tokens, {100 * (trained / tokens - 1):,.0f}% more"
        )
    return note


def _steps_for_tokens(sweep: Sweep, model: str, tokens, steps, global_batch: int | None) -> tuple[int, int]:
    """Steps = tokens / (global batch x sequence length), rounded up: how teams state a training run."""
    import math

    from clustersim.workloads import build_workload

    if steps is not None:
        # worded for both the command and the API (api._as_argument renames the key, not the message)
        raise InputError(
            "give the steps or the tokens, not both: the steps follow from the tokens", key="--tokens"
        )
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
        raise InputError(f"tokens must be a positive whole number, got {tokens!r}", key="--tokens")
    try:
        spec = sweep.base.workload.model_copy(update={"model": model, "seq_len": None})
        seq = build_workload(spec).seq_len
    except InputError as exc:
        raise InputError(exc.message, key="--model") from None
    if not seq:
        raise InputError(f"{model} has no sequence length: give --steps", key="--tokens")
    batch = global_batch or sweep.spec.global_batch or default_global_batch(sweep)
    if tokens < batch * seq:  # 1 step, many times the tokens asked for: a typo (1.5e3 for 1.5e12)
        raise InputError(
            f"{tokens:,} tokens is less than one step ({batch:,} samples x {seq:,} tokens = "
            f"{batch * seq:,} tokens); it would run 1 step: give at least {batch * seq:,} tokens, or --steps",
            key="--tokens",
        )
    return math.ceil(tokens / (batch * seq)), seq


def _recipe(sweep: Sweep, steps, global_batch: int | None, steps_from: str = "--steps") -> dict[str, Any]:
    """Steps and global batch: the command's, else the candidates file's, else (batch only) the default;
    with where each came from, and a note when the command overrides the file (naming the option the
    user gave: ``steps_from``, --steps or --tokens). ``batch_key``: what an error about the global
    batch names, the option where the command gave it, else the file's key."""
    from clustersim.planner.compare import StepsPlan

    notes = []
    file_steps, file_batch = sweep.spec.steps, sweep.spec.global_batch
    given_batch = global_batch
    plan_steps = StepsPlan.parse(steps)
    if plan_steps is None:
        if file_steps is None:
            raise InputError("give the training steps (the candidates file sets no `steps`)", key="--steps")
        plan_steps = StepsPlan(default=file_steps)
        notes.append(f"steps {file_steps:,} from the candidates file")
    elif file_steps is not None and plan_steps != StepsPlan(default=file_steps):
        notes.append(f"{steps_from} overrides the candidates file's steps ({file_steps:,})")
    if global_batch is None:
        global_batch = file_batch or default_global_batch(sweep)
        if file_batch and sweep.source != BUILT_IN:  # the built-in grid's is the default recipe's
            notes.append(f"global batch {file_batch:,} from the candidates file")
        elif global_batch != DEFAULT_GLOBAL_BATCH:
            notes.append(
                f"global batch {global_batch:,}: a sample for each GPU of the largest candidate "
                f"(at least {DEFAULT_GLOBAL_BATCH:,}); --global-batch sets your own"
            )
    elif file_batch is not None and global_batch != file_batch and sweep.source != BUILT_IN:
        notes.append(f"--global-batch overrides the candidates file's global_batch ({file_batch:,})")
    batch_key = "global_batch" if given_batch is None else "--global-batch"
    return {"steps": plan_steps, "global_batch": global_batch, "notes": notes, "batch_key": batch_key}


def rented_rows(rows: list[dict[str, Any]], rent) -> list[dict[str, Any]]:
    """A rented cluster is the instance as sold: the candidates' GPU counts and optimizers on every
    instance (--instance: that one) whose GPUs per instance divide the count and that may be rented that
    many at a time, with the instance's GPU, GPUs per node and network in place of the candidates'."""
    counts = sorted({int(r["gpus"]) for r in rows if "gpus" in r}) or [8]
    optimizers = list(dict.fromkeys(r["optimizer"] for r in rows if r.get("optimizer"))) or [None]
    chosen = [rent.instances[rent.instance]] if rent.instance else list(rent.instances.values())
    out = []
    for inst in chosen:
        for n in counts:
            nodes = n // inst["gpus"]
            if n % inst["gpus"] or (inst["max_instances"] is not None and nodes > inst["max_instances"]):
                continue
            for opt in optimizers:
                row = {
                    "gpu": inst["gpu"],
                    "gpus_per_node": inst["gpus"],
                    "nic_kind": inst["nic"]["kind"],
                    "nic_count": inst["nic"]["count"],
                    "nic_gbps": inst["nic"]["line_rate_gbps"],
                    "gpus": n,
                }
                out.append(row if opt is None else {**row, "optimizer": opt})
    if not out:
        raise InputError("no instance can be rented at the candidates' GPU counts", key="--instance")
    return out


# A candidate row's axes that leave the model's FLOPs as they are: _beyond_reach may bound such rows.
_FLOPS_KEEPING = {"gpu", "gpus", "precision", "fabric", "optimizer", "oversubscription", *_NIC_AXES}


def _laid_out(base, candidates, steps, global_batch, workers, reach: bool, deadline_h: float, fewest: int):
    """(the candidates left out unsearched, the others' rows in their layouts, the base priced as the
    layouts' code: with_one_pointwise_code). With ``reach``, the candidates beyond the deadline at
    peak rate (_beyond_reach, ``fewest`` steps) are left out, unless the others name no Megatron layout:
    then whether theirs would (and so the code every candidate is priced as) is not known unsearched,
    and every candidate is searched."""
    far, near = (
        _beyond_reach(base, candidates, fewest, global_batch, deadline_h) if reach else ([], candidates)
    )
    rows = with_layouts(base, near, steps, global_batch, workers)
    pinned = with_one_pointwise_code(base, (r.get(k) for r in rows for k in MEGATRON_KEYS))
    if far and pinned is base:
        far, rows = [], with_layouts(base, candidates, steps, global_batch, workers)
        pinned = with_one_pointwise_code(base, (r.get(k) for r in rows for k in MEGATRON_KEYS))
    return far, rows, pinned


def _beyond_reach(base, rows: list[dict[str, Any]], steps: int, global_batch: int, deadline_h: float):
    """The rows (candidate clusters, before the layout search) that even at their GPUs' peak FLOP rate
    need longer than the deadline (bounds.peak_rate_hours), and the others. Left out unsearched, they
    cannot change the plan while some candidate meets the deadline (then the fastest does too); _plan
    searches them after all where none does."""
    from clustersim.planner.bounds import peak_rate_hours

    far, near = [], []
    for r in rows:
        n = r.get("gpus")
        hours = 0.0
        if isinstance(n, int) and not isinstance(n, bool) and set(r) <= _FLOPS_KEEPING:
            gpu = r.get("gpu", base.cluster.gpu)
            hours = peak_rate_hours(
                base, gpu, r.get("precision", base.workload.precision), n, global_batch, steps
            )
        (far if hours > deadline_h else near).append(r)
    return far, near


def _priced_only(base, rows: list[dict[str, Any]], costs, price, network, notes: list[str], only: bool):
    """Owned, candidates whose GPU has no server price in the ownership catalog cannot be priced, and are
    left out, said once in the header (the built-in grid holds every catalog GPU; a
    candidates file's only where --cost own is asked: without --cost, a file with such a GPU is priced
    as rented instead, costing.auto_model)."""
    # the built-in grid: whichever model prices it; a candidates file: only where --cost own was asked
    model = costs if costs is not None else (costing.cost_model(None, price, network) if only else None)
    if not isinstance(model, costing.Own):
        return rows
    missing = sorted(g for g in _candidate_gpus(base, rows) if g not in model.o["servers"])
    if not missing:
        return rows
    kept = [r for r in rows if str(r.get("gpu", base.cluster.gpu_name)) not in missing]
    if not kept:  # nothing left to price: the one-line error naming the GPU and the catalog
        model.server(missing[0])
    notes.append(
        f"owned: {', '.join(missing)} left out, no server price in {model.o['source']} (--own-prices FILE "
        "with their server prices, or a flat --price per GPU-hour, prices them)"
    )
    return kept


def _as_sold(rows: list[dict[str, Any]], costs, as_sold: bool, notes: list[str]) -> list[dict[str, Any]]:
    if not as_sold:
        return rows
    notes.append("rented: every candidate is an instance as sold (catalogs/instances.yaml)")
    return rented_rows(rows, costs)


def _plan(
    sweep: Sweep,
    model,
    recipe,
    deadline_h,
    budget,
    price,
    progress,
    profile,
    samples,
    baseline,
    network,
    costs=None,
    as_sold=False,
    workers: int = 0,
    prune: bool = True,
    priced_only: bool = False,
    reach: bool = True,
    done: dict[str, dict[str, Any]] | None = None,
):
    steps_plan, global_batch = recipe["steps"], recipe["global_batch"]
    try:  # a clear error for an unknown model before any work
        catalog.model(model)
    except InputError as exc:
        raise InputError(exc.message, key="--model") from None
    if budget is not None and not 0 < budget < float("inf"):  # NaN fails too
        raise InputError("budget must be positive and finite", key="--budget")
    base = sweep.base.with_changes(**{"workload.model": model, "workload.seq_len": None})
    if profile is not None:
        base = base.with_changes(profile=resolve_profile_ref(profile))
    preferred = baseline or base.training.optimizer
    if baseline is not None:
        from clustersim.planner.compare import choose_baseline

        choose_baseline(baseline, baseline)
    steps = steps_plan.of(preferred, preferred) or steps_plan.default or max(n for _, n in steps_plan.per)
    notes_before = list(recipe["notes"])  # a second search (below) says its own notes again
    candidates = _as_sold(_for_model(sweep.rows(), model, recipe["notes"]), costs, as_sold, recipe["notes"])
    only = priced_only and not as_sold
    candidates = _priced_only(base, candidates, costs, price, network, recipe["notes"], only)
    fewest = min([steps_plan.default or steps, *(n for _, n in steps_plan.per)])
    far, rows, pinned = _laid_out(
        base, candidates, steps, global_batch, workers, reach and prune, deadline_h, fewest
    )
    if pinned is not base:
        note = "Megatron layouts among the candidates: every candidate priced as framework code"
        recipe["notes"].append(note + " (pointwise: fused)")
    base = pinned
    base_json = base.model_dump(mode="json")

    # the cost model is chosen from every candidate's GPU before any is simulated, so that pruning
    # prices the rows as the plan does (a row's GPU as its scenario names it)
    costs = costs or costing.auto_model(_candidate_gpus(base, candidates), price, network)

    def cost_of(record: dict[str, Any]) -> tuple[float, float, float]:
        (priced,) = analysis.enrich(
            [record], steps_plan, price, baseline=preferred, network=network, costs=costs
        )
        return priced["ttt_h"], priced["cost"], analysis.outlay(priced)

    # With bands to draw, the sampler's import (scipy.stats, about half a second) is made here while the
    # workers simulate, once, instead of in each of the bands' workers, which are forked from this process
    meanwhile = _load_band_sampler if samples > 0 and workers != 1 else None
    pruning = (
        Pruning(cost_of, deadline_h, budget, workers=workers, meanwhile=meanwhile, done=done or {})
        if prune
        else None
    )
    records, skipped, *pruned = simulate_rows(base_json, rows, steps, global_batch, progress, pruning)
    ok = [r for r in records if r["status"] == "ok"]
    # no row ran: the fallback search below, or one line saying why (enrich refuses an empty set)
    enriched = (
        analysis.enrich(ok, steps_plan, price, baseline=preferred, network=network, costs=costs) if ok else []
    )
    if far and not any(r["ttt_h"] <= deadline_h for r in enriched):  # the fastest may be among them
        recipe["notes"][:] = notes_before
        return _plan(
            sweep, model, recipe, deadline_h, budget, price, progress, profile, samples, baseline, network,
            costs=costs, as_sold=as_sold, workers=workers, prune=prune, priced_only=priced_only, reach=False,
            done={r["row_id"]: r for r in records},  # simulated already: not again
        )  # fmt: skip
    if not ok:
        _nothing_runs(records, model, recipe.get("batch_key", "global_batch"))
    say_stage(progress, "choosing: break-evens and the bands of the choice and its runners-up")
    # the compressed optimizers' break-even line rates that choosing reports: bisected on every core
    analysis.bisect_break_evens(enriched, _starmap_on(workers))
    rec = analysis.recommendation(enriched, deadline_h, budget)
    feasible = sorted(rec["feasible"], key=lambda r: (r["cost"], r["ttt_h"]))
    # the fastest that meets the constraints: the fastest of all unless that one is over the budget
    fastest_within = analysis.fastest_within(feasible)

    # One pool of workers for every round of bands, forked once the parent has the draws' imports
    # (_load_band_sampler), each keeping the programs it built for the next round (_BUILT)
    with _pool(workers if samples > 0 else 1) as bands_pool:
        drawn: dict[int, list] = {}  # the draws of rows banded ahead (the five cheapest), by row id

        def band(chosen_rows: list[dict[str, Any]]) -> None:
            # the five cheapest that meet the constraints are drawn with the first rows banded: they are
            # the runners-up as a rule, and their draws run in the same passes as the choice's look-alikes
            quick = [
                r
                for r in (rec["fastest"], fastest_within)
                if r is not None and all(r is not f for f in feasible[:5])
            ]
            ahead = feasible[:5] + list({id(r): r for r in quick}.values())  # the fastest's too
            _add_bands(chosen_rows, base_json, rows, steps, global_batch, samples, bands_pool, ahead, drawn)
            only = [r for r in chosen_rows if r.get("baseline")]
            analysis.add_paired_bands(enriched, {}, samples, only=only)

        chosen, runners_up, rec = _choose_and_runners_up(
            rec, feasible, band, samples, enriched, deadline_h, budget
        )
    return {
        "model": model,
        "steps": steps,
        "steps_per_optimizer": dict(steps_plan.per),
        "global_batch": global_batch,
        "recipe_notes": recipe["notes"],
        "deadline_h": deadline_h,
        "budget": budget,
        "candidates": len(records) + (pruned[0] if pruned else 0),
        "simulated": len(ok),
        "invalid": len(records) - len(ok),
        "interleaved_not_simulated": skipped,
        "not_searched": len(far),
        "pruned": pruned[0] if pruned else 0,
        "chosen": chosen,
        "runners_up": runners_up,
        "fastest": rec["fastest"],
        "fastest_within": fastest_within,
        "text": rec["text"],
        "missed_deadline": sum(1 for r in enriched if r["ttt_h"] > deadline_h),
        "optimizers_not_run": optimizers_not_run(records, base.cluster.gpu_name),
        "memory_notes": memory_notes(chosen, rec["fastest"]),
        "pricing": costs.describe(),
    }


def _choose_and_runners_up(rec, feasible, band, samples, enriched, deadline_h, budget):
    """The choice, chosen again once its rows have their bands (_choose_with_bands), and up to four
    runners-up, each with its band."""
    if samples > 0:
        again = lambda: analysis.recommendation(enriched, deadline_h, budget)  # noqa: E731
        rec = _choose_with_bands(rec, feasible[:5], band, again, deadline_h)
    chosen = rec["chosen"]
    runners_up: list[dict[str, Any]] = []
    for r in feasible:  # distinct options only: one that reads as the choice (or as another) adds nothing
        said = {why_not(o, chosen) for o in runners_up} if chosen is not None else set()
        if (
            r is not chosen
            and not any(_same_numbers(r, o) for o in [chosen, *runners_up])
            and (chosen is None or why_not(r, chosen) not in said)  # reads as another runner-up
        ):
            runners_up.append(r)
        if len(runners_up) == 4:
            break
    if samples > 0:
        # a runner-up past the first five (a look-alike was skipped) and the fastest get their bands too
        # (the fastest's draws ran with the first rows banded: band's ``ahead``)
        quickest = analysis.fastest_within(feasible)
        unbanded = [
            r for r in [*runners_up, rec["fastest"], quickest] if r is not None and "ttt_p10_h" not in r
        ]
        band(list({id(r): r for r in unbanded}.values()))
        rec = analysis.retold(rec, enriched, deadline_h, budget)  # the risk line reads their bands too
    return chosen, runners_up, rec


def _choose_with_bands(rec, top, band, choose, deadline_h: float) -> dict[str, Any]:
    """The recommendation once the rows it reads have their bands (_bands_that_choose): ``band`` gives
    rows their bands, ``choose`` chooses again."""
    banded = _bands_that_choose(top, rec)
    band(banded)
    if banded:  # choose again: the bands say whether a small saving is real (analysis.equivalent)
        rec = choose()
    if (rec["chosen"] or {}).get("ttt_p90_h", 0.0) > deadline_h:  # the risk line names the cheapest
        band([r for r in top if "ttt_p10_h" not in r])  # of them whose P90 is within the deadline
        rec = choose()
    return rec


def _bands_that_choose(top: list[dict[str, Any]], rec: dict[str, Any]) -> list[dict[str, Any]]:
    """Of the five cheapest rows that meet the constraints (``top``), those whose bands can change the
    choice (analysis.recommendation: a simpler row that saves less than EQUIVALENT_GAIN is preferred
    unless both rows' bands tell them apart): the cheapest and each simpler row that close to it; and
    the choice, and the fastest where it is among them. The others get a band only if shown (as a
    runner-up), not for a table that skips them as look-alikes, or where the choice's P90 misses the
    deadline (the risk line looks among them for one whose P90 meets it)."""
    out = [r for r in (rec["chosen"],) if r is not None]
    if top:
        cheapest = top[0]
        out += [
            r
            for r in top
            if r is cheapest
            or r is rec["fastest"]
            or (
                analysis.complexity(r) < analysis.complexity(cheapest)
                and cheapest["cost"] >= r["cost"] * (1 - EQUIVALENT_GAIN)
            )
        ]
    return list({id(r): r for r in out}.values())


def _candidate_gpus(base, rows: list[dict[str, Any]]) -> set[str]:
    """The GPU of every candidate row (the base's where a row does not set one), as the catalog names it."""
    return {str(r["gpu"]) if isinstance(r.get("gpu"), str) else base.cluster.gpu_name for r in rows}


def optimizers_not_run(records: list[dict[str, Any]], base_gpu: str | None = None) -> dict[str, str]:
    """The candidates' optimizers of which no row could run, each with one of its rows' reasons (out of
    GPU memory, refused under sharding or model parallelism): a plan that leaves an optimizer out says
    why, instead of dropping it without a word. The example is a row on the candidates' GPU with the
    most memory (the closest to fitting; ``base_gpu``: a row's GPU where it does not vary one), the
    shortest of its reasons."""
    out: dict[str, str] = {}
    # a row invalid before it ran (not a valid cluster as given) names no optimizer unless it varied one
    for name in dict.fromkeys(r["optimizer"] for r in records if r.get("optimizer")):
        mine = [r for r in records if r.get("optimizer") == name]
        if all(r["status"] != "ok" for r in mine):
            # a row with more GPUs than the batch has samples says less about the optimizer than one
            # that ran out of memory: its reason is given only where every row failed so
            example = min(
                mine,
                key=lambda r: ("global_batch:" in r["error"], -_gpu_memory(r, base_gpu), len(r["error"])),
            )
            out[name] = example["error"].removeprefix("row: ")
    return out


def memory_notes(chosen: dict[str, Any] | None, fastest: dict[str, Any] | None) -> list[str]:
    """The note `run` gives a rank that fits with little to spare (memory.thin_headroom_note, the same
    threshold), said of the choice and of the fastest where they fit that closely."""
    from clustersim.simulator.memory import thin_headroom_note

    out = []
    for label, row in (("the choice", chosen), ("the fastest", fastest)):
        if row is None or row.get("gpu_memory_bytes") is None or "scenario" not in row:
            continue
        if label == "the fastest" and row is chosen:
            break
        gpu = catalog.gpu(validate_scenario(row["scenario"], source="row").cluster.gpu)
        note = thin_headroom_note(row["gpu_memory_bytes"], gpu.memory_bytes)
        if note is not None:
            out.append(f"{label} ({row['cluster']}): {note}")
    return out


def _gpu_memory(record: dict[str, Any], base_gpu: str | None) -> float:
    """The memory of a row's GPU (the catalog's; 0 for one the catalog does not name)."""
    name = record.get("gpu", base_gpu)
    try:
        return catalog.gpu(name).memory_bytes if isinstance(name, str) else 0.0
    except InputError:
        return 0.0


def _for_model(rows: list[dict[str, Any]], model: str, notes: list[str]) -> list[dict[str, Any]]:
    """The candidates for ``model`` only: a candidates file that varies ``model`` (a sweep file reused)
    has that axis dropped, each remaining row once, and a note saying so."""
    if not any("model" in r for r in rows):
        return rows
    notes.append(f"--model {model} replaces the candidates file's model axis")
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        kept = {k: v for k, v in r.items() if k not in ("model", "seq_len")}
        out.setdefault(row_id(kept), kept)
    return list(out.values())


def _same_numbers(row: dict[str, Any], other: dict[str, Any] | None) -> bool:
    """Whether ``row`` reads as ``other`` in the runners-up table ("$0 (0.0%) more, 0.0 h slower"): the
    same cost and time to train to the precision shown (e.g. one node, where the network is unused)."""
    if other is None:
        return False
    return round(row["cost"]) == round(other["cost"]) and round(row["ttt_h"], 1) == round(other["ttt_h"], 1)


def _nothing_runs(records: list[dict[str, Any]], model: str, batch_key: str = "global_batch") -> None:
    """Why no candidate ran, as one error; a global batch the command gave (``batch_key``
    --global-batch) is named as the option, not as the file key the rows report."""
    memory = [r for r in records if "does not fit in GPU memory" in r["error"]]
    if len(memory) == len(records):
        smallest = min(memory, key=lambda r: len(r["error"]))
        need = smallest["error"].split("does not fit in GPU memory: ")[-1].split(" per rank")[0]
        raise InputError(
            f"none of the {len(records)} candidates can train {model}: in every layout searched (data "
            "parallel; ZeRO stages and tensor x pipeline splits within the candidates' GPU counts) it "
            f"does not fit, e.g. {need} per GPU; give --candidates a sweep with more or larger GPUs, "
            "or whose base sets training.offload (mode: zero or interleaved)"
        )
    why = records[0]["error"][:200]
    if batch_key != "global_batch" and why.startswith("global_batch: "):
        raise InputError(
            f"none of the {len(records)} candidates can train {model}: {why.removeprefix('global_batch: ')}",
            key=batch_key,
        )
    raise InputError(f"none of the {len(records)} candidates can train {model}: {why}")


def _add_bands(
    chosen_rows: list[dict[str, Any]],
    base_json: dict,
    rows: list[dict[str, Any]],
    steps: int,
    global_batch: int,
    samples: int,
    workers: "int | _pool",
    ahead: list[dict[str, Any]] = (),
    drawn: dict[int, list] | None = None,
) -> None:
    """Each candidate's time-to-train band in hours, scaled from its step's band as the report scales it
    (analysis.enrich), so it holds the row's own step count, and its cost band (analysis.set_cost_band).
    The step's band is the one `run` gives the row's scenario (runner.iteration_interval: the same draws,
    the same estimator), its draws shared out over the workers so that every core stays busy (``workers``:
    a count, or a pool already started, whose workers keep what they built for the next call).
    ``ahead``: rows whose draws are run now too, to be kept in ``drawn`` (by the row's id) for a later
    call that bands them; a row is given its band only when it is among ``chosen_rows``."""
    drawn = {} if drawn is None else drawn
    todo = list({id(r): r for r in [*chosen_rows, *ahead] if id(r) not in drawn}.values())
    with workers if isinstance(workers, _pool) else _pool(workers) as pool:
        # Rows that differ only in their NIC (a layout's look-alikes among the cheapest) run their draws
        # together (runner.draw_times_many: one pass over all their programs). A pipeline's draws are
        # not split over the workers: they go through that one pass whatever their number, so a part on
        # another worker would only build the program and make the pass again; its look-alikes are,
        # where the group is more than a quarter of a worker's share: a pass over half the NICs costs
        # well over half the whole (the program, each op's arithmetic), but the other core is idle
        # otherwise (_split_look_alikes). Another group (each of its draws a simulation of its own) is
        # split over the workers by draws where its draws are more than a quarter of a worker's share.
        # The jobs go largest first, so that the small ones fill in behind the large
        # (longest-processing-time-first list scheduling).
        together: dict[str, list[int]] = {}
        for i, row in enumerate(todo):
            together.setdefault(_band_group(row["scenario"]), []).append(i)
        groups = _split_look_alikes(list(together.values()), [r["scenario"] for r in todo], pool.size)
        cost = [sum(_draw_cost(todo[i]["scenario"]) for i in g) for g in groups]
        share = sum(cost) / pool.size
        parts_of = [
            pool.size if c > share / 4 and not _pipelined(todo[g[0]]["scenario"]) else 1
            for g, c in zip(groups, cost)
        ]
        jobs = [(g, k) for g, n in enumerate(parts_of) for k in range(n)]
        jobs.sort(key=lambda j: -cost[j[0]] / parts_of[j[0]])
        results = pool.starmap(
            _band_draws,
            [([todo[i]["scenario"] for i in groups[g]], samples, k, parts_of[g]) for g, k in jobs],
            one_too=True,
        )
        got: dict[int, dict[int, tuple[list[float], int]]] = {}
        for (g, k), result in zip(jobs, results):
            for i, one in zip(groups[g], result):
                got.setdefault(i, {})[k] = one
        for g, members in enumerate(groups):
            for i in members:
                drawn[id(todo[i])] = [got[i][k] for k in range(parts_of[g])]
        for row in chosen_rows:
            _set_band(row, drawn[id(row)], samples, pool, base_json, rows, steps, global_batch)


def _split_look_alikes(groups: list[list[int]], scenarios: list[dict], workers: int) -> list[list[int]]:
    """``groups`` (indices into ``scenarios``, rows whose draws run together) with each pipelines' group
    of more rows than one, and more than a quarter of a worker's share of the draws, split into one
    group of consecutive rows per worker (rows come cheapest first: a group's rows on the faster NICs
    together). Measured on the GPT-3 175B plan's choice (TP1 PP16 interleaved, four NICs x 32 draws):
    one pass 1.26 s; the two 400 Gb/s rows 0.58 s and the two 200 Gb/s rows 1.05 s side by side."""
    if workers < 2:
        return groups
    cost = [sum(_draw_cost(scenarios[i]) for i in g) for g in groups]
    share = sum(cost) / workers
    out = []
    for g, c in zip(groups, cost):
        if len(g) > 1 and c > share / 4 and _pipelined(scenarios[g[0]]):
            k = min(workers, len(g))
            out += [g[len(g) * j // k : len(g) * (j + 1) // k] for j in range(k)]
        else:
            out.append(g)
    return out


def _set_band(row, mine, samples, pool, base_json, rows, steps, global_batch) -> None:
    """A row's time-to-train and cost bands from its draws' step times and ops, ``mine`` (part k holds
    draws k, k + parts, ...: _band_draws)."""
    from clustersim.simulator.runner import band_samples
    from clustersim.simulator.uncertainty import Interval

    parts = len(mine)
    # the draws in their own order: the band's sums are the same to the last bit however the draws
    # were shared out
    times = [mine[j % parts][0][j // parts] for j in range(sum(len(t) for t, _ in mine))]
    ops = max(n for _, n in mine)
    if band_samples(samples, ops)[0] == samples:
        lo, hi, mid = Interval.of(times).p10, Interval.of(times).p90, row["iteration_time_s"]
    else:  # a program too large for every draw: the band `run` gives it, from fewer draws
        values = next(v for v in rows if _same_row(v, row))
        (banded,) = pool.map(base_json, [values], steps, global_batch, samples)
        lo, hi, mid = (
            banded.get(k) for k in ("iteration_time_p10_s", "iteration_time_p90_s", "iteration_time_s")
        )
    if lo is not None and hi is not None and mid:
        row["ttt_p10_h"] = row["ttt_h"] * lo / mid
        row["ttt_p90_h"] = row["ttt_h"] * hi / mid
        analysis.set_cost_band(row)


def _load_band_sampler() -> None:
    """Import what the bands' draws need (uncertainty.quasi_normals: scipy's Sobol sequence), so that the
    workers forked after it have it."""
    from clustersim.simulator.uncertainty import quasi_normals

    quasi_normals(1, 1)


def _draw_cost(scenario_json: dict) -> int:
    """What one draw of a row costs to simulate, relatively: a pipeline program's passes (stages x model
    chunks x micro-batches), most of its ops; 1 for a data-parallel one."""
    par = scenario_json.get("training", {}).get("parallelism") or {}
    micro_batches = scenario_json.get("workload", {}).get("gradient_accumulation") or 1
    return max(1, int(par.get("pipeline") or 1) * int(par.get("virtual_stages") or 1) * int(micro_batches))


def _pipelined(scenario_json: dict) -> bool:
    """Whether a row's program is a pipeline's (runner.draw_times_many runs its draws in one pass)."""
    return int((scenario_json.get("training", {}).get("parallelism") or {}).get("pipeline") or 1) > 1


def _band_group(scenario_json: dict) -> str:
    """What rows whose draws run together share: their scenario but for the NIC."""
    import json

    cluster = {k: v for k, v in scenario_json.get("cluster", {}).items() if k != "nic"}
    return json.dumps({**scenario_json, "cluster": cluster}, sort_keys=True)


def _band_draws(
    scenario_jsons: list[dict], samples: int, part: int, parts: int
) -> list[tuple[list[float], int]]:
    """Iteration times of each scenario under every ``parts``-th of its ``samples`` draws, from
    ``part`` (runner.iteration_interval's draws), and the ops a run of it has."""
    from clustersim.scenario import validate_scenario
    from clustersim.simulator.context import build_context
    from clustersim.simulator.runner import draw_times_many
    from clustersim.simulator.uncertainty import perturbations

    jobs = []
    for scenario_json in scenario_jsons:
        s = validate_scenario(scenario_json, source="row")
        jobs.append((s, perturbations(build_context(s), samples)[part::parts]))
    return draw_times_many(jobs, programs=_BUILT)  # the plan simulated each


# The pipeline programs a band worker built, for the plan's next round of bands (the same layouts on
# other NICs are the runners-up): runner.draw_times_many's ``programs``.
_BUILT: dict = {}


def _same_row(values: dict[str, Any], row: dict[str, Any]) -> bool:
    return row_id(values) == row.get("row_id")


def why_not(row: dict[str, Any], chosen: dict[str, Any]) -> str:
    dc = row["cost"] - chosen["cost"]
    dt = row["ttt_h"] - chosen["ttt_h"]
    speed = f"{abs(dt):,.1f} h {'slower' if dt > 0 else 'faster'}"
    if round(abs(dc)) == 0:  # "$0 (0.0%) more" would read as a difference where the table shows none
        return f"same cost, {speed}"
    more = "more" if dc >= 0 else "less"
    return f"${abs(dc):,.0f} ({100 * abs(dc) / chosen['cost']:.1f}%) {more}, {speed}"


# What a candidate says in plan's JSON (and the API's Plan.to_dict): its own numbers, not the rows it
# links to (a candidate's baseline is another candidate whose baseline is itself).
CANDIDATE_KEYS = (
    "optimizer",
    "layout",
    "cluster",
    "world_size",
    "gpu",
    "network",
    "ttt_h",
    "ttt_p10_h",
    "ttt_p90_h",
    "cost",
    "cost_p10",
    "cost_p90",
    "cost_model",
    "cost_basis",
    "cost_warning",
    "capital",
    "outlay",
    "gpu_cost",
    "network_cost",
    "samples_per_s",
    "mfu",
    "tokens_per_s_per_gpu",
    "speedup",
    "speedup_p10",
    "speedup_p90",
    "steps",
    "iteration_time_s",
    # the resolved scenario as it ran (layout, micro-batch, accumulation, sharding: Scenario.to_dict), which
    # `clustersim run` and api.load_scenario read back: the choice rebuilt from the answer alone
    "scenario",
)


def plan_as_json(result: dict) -> dict:
    """``plan``'s answer as plain data (``clustersim plan --json``): the chosen candidate, the
    runners-up and the fastest by their own numbers, beside the plan's settings and text. A runner-up
    says, as the console table's "*" does, whether it is cheaper than the choice but equivalent to it
    and more complex (``kept_simpler``, with ``kept_simpler_reason``: analysis.kept_simpler_reason)."""

    def one(row):
        return row and {k: row.get(k) for k in CANDIDATE_KEYS}

    def runner_up(row):
        reason = analysis.kept_simpler_reason(result["chosen"], row) if result["chosen"] else None
        return {**one(row), "kept_simpler": reason is not None, "kept_simpler_reason": reason}

    return {
        **{k: v for k, v in result.items() if k not in ("chosen", "runners_up", "fastest", "fastest_within")},
        "chosen": one(result["chosen"]),
        "runners_up": [runner_up(r) for r in result["runners_up"]],
        "fastest": one(result["fastest"]),
        "fastest_within": one(result["fastest_within"]),
    }
