"""simulate(): scenario in, SimulationResult out. The one function the CLI, sweeps and reports call."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from clustersim import catalog
from clustersim.calibration.profile import Profile, load_profile
from clustersim.catalog import ResNetArch, TransformerArch
from clustersim.cost_models.attention import kernel_name
from clustersim.cost_models.kernel_bytes import CLIP_BYTES, CLIP_KERNELS_PER_TENSOR, UPDATE_BYTES
from clustersim.errors import InputError
from clustersim.identifiers import Category, PlacementKind, Stream
from clustersim.scenario import Scenario
from clustersim.simulator import engine_batched
from clustersim.simulator.context import SimulationContext, build_context, device_costs
from clustersim.simulator.culprit import culprit, culprit_source
from clustersim.simulator.engine import Engine, RunawaySimulation
from clustersim.simulator.host import page_fault_source
from clustersim.simulator.memory import check_fits, gpu_memory
from clustersim.simulator.program import ProgramTooLarge, op_budget
from clustersim.simulator.result import BREAKDOWN_KEYS, OpRecords, SimulationResult, attribute_timeline
from clustersim.simulator.stragglers import (
    rank_factors,
    replica_factors,
    typical_factor,
    waiting,
    with_rank_classes,
)
from clustersim.simulator.strategies import registry
from clustersim.simulator.strategies.common import MERGE_MICRO_STEPS_ABOVE
from clustersim.simulator.strategies.megatron import repriceable
from clustersim.simulator.uncertainty import (
    DEFAULT_SAMPLES,
    Interval,
    compute_band_source,
    host_band_source,
    network_band_source,
    perturbations,
)
from clustersim.workloads.builder import build_workload

# Longest simulated iteration (s, ~12 days). Not a model constant: a bound that stops runaway inputs
# (a NIC of 1 bit/s) with a clear error instead of running forever; at 1e6 s the clock's resolution
# (double precision, ~1e-10 s) is still far below the shortest op.
MAX_ITERATION_S = 1e6


def simulate(
    scenario: Scenario,
    profile: Profile | str | None = None,
    *,
    perturbation=None,
    uncertainty_samples: int = 0,
) -> SimulationResult:
    """One iteration of ``scenario``. ``perturbation`` runs it with one draw of the uncertain parameters;
    ``uncertainty_samples`` > 0 adds the P10/P50/P90 of the iteration time over that many draws
    (simulator/uncertainty.py) as ``result.interval``."""
    try:
        with _collector_paused():
            return _simulate(scenario, profile, perturbation, uncertainty_samples)
    except InputError as exc:  # name the scenario's file (a profile's own errors keep theirs)
        raise exc.located(source=scenario.source) from None
    except ProgramTooLarge as exc:
        raise InputError(_too_large(scenario, exc.limit), key=_count_key(scenario)).located(
            source=scenario.source
        ) from None


def _fewest_ops(ctx: SimulationContext) -> int:
    """A lower bound on the ops of the program, known before it is built: a forward and a backward op
    per layer (per pipeline chunk with Megatron's pipeline, which passes a stage's layers as one op)
    in every micro-step that is listed. Plain data-parallel micro-steps are merged above 64
    (strategies/common.add_micro_steps); ZeRO's, tensor-parallel ones, those with an input pipeline
    and pipeline schedules are each listed."""
    w, t = ctx.scenario.workload, ctx.scenario.training
    listed = w.gradient_accumulation
    if ctx.megatron_program:
        return 2 * listed * t.parallelism.pipeline * t.parallelism.virtual_stages
    # ZeRO lists its micro-steps, but for ZeRO-Offload at stage 1/2, which runs the DDP program
    zero_lists = t.sharding.stage >= 3 or (t.sharding.stage >= 1 and t.offload.mode == "none")
    if not zero_lists and not ctx.tensor_sharded and w.input is None:
        listed = min(listed, MERGE_MICRO_STEPS_ABOVE + 1)
    return 2 * listed * len(ctx.workload.layers)


def _count_key(scenario: Scenario) -> str:
    """The count that made a program too large: the micro-steps, else the most repeated layer."""
    w = scenario.workload
    if w.gradient_accumulation > 1:
        return "workload.gradient_accumulation"
    if w.layers:
        i = max(range(len(w.layers)), key=lambda k: w.layers[k].repeat)
        return f"workload.layers.{i}.repeat"
    return "workload.model"


def _too_large(scenario: Scenario, limit: int) -> str:
    w = scenario.workload
    what = (
        f"{w.gradient_accumulation:,} micro-steps, each listed op by op (ZeRO-2/3, tensor parallelism, an "
        "input pipeline, pipeline schedules, and a host whose dispatch binds, as eager PyTorch's at small "
        "micro-batches, simulate every micro-step)"
        if w.gradient_accumulation > 1
        else "one op or more per layer"
    )
    return f"the iteration would list more than {limit:,} ops ({what}); lower it (docs/scale-limits.md)"


# The most op runs the uncertainty band may cost: each draw re-runs the whole simulation, so a program
# of n ops gets at most MAX_BAND_OP_RUNS // n draws (the 1T layout's 196,000 ops: 10 of the default
# 32). Not a model constant: it keeps a band within about two minutes (docs/scale-limits.md); doubled
# with the default draws (16 to 32) so that the programs that get every draw are the same as before.
MAX_BAND_OP_RUNS = 2_000_000
_ops_per_run: ContextVar[int] = ContextVar("ops_per_run", default=0)


def ops_of_last_run() -> int:
    """The ops of the last program this context ran (what band_samples weighs)."""
    return _ops_per_run.get()


def band_samples(samples: int, ops: int) -> tuple[int, str | None]:
    """The draws the band can afford for a program of ``ops`` ops, and a note when fewer than asked."""
    fit = MAX_BAND_OP_RUNS // max(ops, 1)
    if samples <= fit:
        return samples, None
    if fit < 4:  # fewer than 4 draws give no P10-P90 worth printing
        return 0, (
            f"no P10-P90 band: the program's {ops:,} ops would take {samples} more runs "
            "(docs/scale-limits.md)"
        )
    return (
        fit,
        f"P10-P90 band from {fit} draws, not {samples}: the program has {ops:,} ops (docs/scale-limits.md)",
    )


@contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while a simulation builds and runs its program.

    A program's ops, their metadata and the engine's tables are hundreds of thousands of objects that
    live for the whole run and form no reference cycles; the collector's passes, triggered by the
    allocation count, walk them again and again: 40% of a 1T-parameter pipeline run (issue #12). What
    the run frees is freed by reference counting as before. Afterwards what survived (the result's
    records) goes straight to the oldest generation (freeze, then unfreeze: a list splice), where the
    first young collection would otherwise walk all of it once more, and the collector resumes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if enabled:
            gc.enable()


def _simulate(scenario: Scenario, profile, perturbation, uncertainty_samples: int) -> SimulationResult:
    if isinstance(profile, str):
        profile = load_profile(profile)
    ctx = build_context(scenario, profile, perturbation)
    if _fewest_ops(ctx) > op_budget.get():  # refused before any of it is built
        raise ProgramTooLarge(op_budget.get())
    result = _run(ctx)
    off = scenario.training.offload
    if off.mode == "interleaved" and off.placement == "auto":
        result = _best_placement(scenario, profile, ctx, result, perturbation)
    if perturbation is None:  # the reported run only: a draw or a placement trial throws it away
        result.extra["model_flops"] = _model_flops(ctx, result.samples_per_iteration, result.iteration_time)
    if uncertainty_samples > 0:
        samples, note = band_samples(uncertainty_samples, _ops_per_run.get())
        if samples:
            result.interval = iteration_interval(scenario, profile, ctx, samples, checked=True)
        if note:
            result.notes.append(note)
    return result


def iteration_interval(
    scenario: Scenario,
    profile,
    ctx: SimulationContext,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    checked: bool = False,
) -> Interval:
    """P10/P50/P90 of the iteration time (the mean over a strategy's weighted steps); ``checked``: the
    nominal run has passed simulate's checks (draw_times)."""
    return Interval.of(draw_times(scenario, profile, perturbations(ctx, samples, seed), checked))


def draw_times(scenario: Scenario, profile, draws, checked: bool = False) -> list[float]:
    """``simulate(scenario, profile, perturbation=p).iteration_time`` for each of ``draws``, the same
    numbers at less cost: a draw changes what ops cost, not which ops there are, so a Megatron pipeline's
    program (most of whose cost is building its passes) is built once and re-priced for each further
    draw (strategies.megatron.PipelineRepricer). The first draw runs as ``simulate`` does, with its
    checks (memory, op budget), unless ``checked`` says the scenario's nominal run has just passed them
    (a draw changes costs, not memory or op counts): then a pipeline's first draw is re-priced too,
    which saves a build per call (a band split over workers makes one call per worker). Other programs,
    and any whose shape a draw changes, are rebuilt."""
    from clustersim.simulator.strategies.ddp import AdamDDP
    from clustersim.simulator.strategies.megatron import PipelineRepricer

    times: list[float] = []
    repricer = None
    for i, p in enumerate(draws):
        prog = None
        ctx = build_context(scenario, profile, p) if (i > 0 or checked) and repricer is not False else None
        if ctx is not None and repricer is None:
            strategy = registry.create(ctx) if repriceable(ctx) else None
            if (
                strategy is not None
                and type(strategy).steps is AdamDDP.steps
                and type(strategy).build_program is AdamDDP.build_program
            ):
                label = f"{strategy.name} update"
                repricer = PipelineRepricer(ctx, strategy.update_bytes_per_param, label)
            else:
                repricer = False  # not a pipeline's program: every draw is simulated
        if repricer:
            prog = repricer.program_for(ctx)
        if prog is None:
            times.append(simulate(scenario, profile, perturbation=p).iteration_time)
            continue
        with _collector_paused():
            prog.links = dict(ctx.link_capacities())  # as _simulate_steps joins them, the program having none
            _ops_per_run.set(len(prog.ops))
            try:
                _, end = _run_engine(ctx, prog)
            except InputError as exc:
                raise exc.located(source=scenario.source) from None
        times.append(max(end.values(), default=0.0))  # attribute_timeline's total, a step of weight 1
    return times


def draw_times_many(
    jobs: list[tuple[Scenario, list]], profile=None, programs: dict | None = None
) -> list[tuple[list[float], int]]:
    """``draw_times(scenario, profile, draws, checked=True)`` for each (scenario, draws) of ``jobs``, and
    the ops a run of it has (ops_of_last_run): the same numbers, at less cost where they are Megatron
    pipelines whose re-priced programs have one shape (the draws of a band, and the same layout on
    another NIC): those programs run together in engine_batched's one pass, each draw's op durations a
    column. A draw that pass cannot give exactly (a NaN column), and every scenario whose program is
    not a pipeline's, run as draw_times runs them. Every nominal run must have passed simulate's
    checks (draw_times' ``checked``). ``programs``: a dict that keeps the built pipeline programs for
    the next call (a plan bands its rows in two rounds), the last few."""
    from clustersim.simulator.strategies.ddp import AdamDDP
    from clustersim.simulator.strategies.megatron import PipelineRepricer

    out: list = [None] * len(jobs)
    # (pass shape, tail shape) -> the group's ops, its columns (job, draw) and their durations and
    # slowdowns (ops x columns)
    groups: dict[tuple, dict] = {}
    passes_seen: dict[tuple, tuple] = {}  # one object per distinct pass shape, compared by identity
    repricers: dict[tuple, tuple] = programs if programs is not None else {}
    with _collector_paused():
        for j, (scenario, draws) in enumerate(jobs):
            ctx = build_context(scenario, profile, draws[0]) if draws else None
            strategy = registry.create(ctx) if ctx is not None and repriceable(ctx) else None
            if (
                strategy is None
                or type(strategy).steps is not AdamDDP.steps
                or type(strategy).build_program is not AdamDDP.build_program
            ):
                out[j] = (draw_times(scenario, profile, draws, checked=True), ops_of_last_run())
                continue
            # One program serves the scenarios that differ only in their NIC: re-priced for another
            # NIC's context as for another draw's (PipelineRepricer.program_for checks the shape)
            label = f"{strategy.name} update"
            key = (
                scenario.model_dump_json(exclude={"cluster": {"nic"}}),
                repr(profile),
                strategy.update_bytes_per_param,
                label,
            )
            if key not in repricers:
                while len(repricers) >= KEPT_PROGRAMS:  # the oldest goes
                    del repricers[next(iter(repricers))]
                repricer = PipelineRepricer(ctx, strategy.update_bytes_per_param, label)
                head = engine_batched.shape_of(repricer.program.ops[: repricer.passes])
                repricers[key] = repricer, passes_seen.setdefault(head, head), _price_groups(repricer)
            repricer, head, prices_of = repricers[key]
            out[j] = ([float("nan")] * len(draws), 0)
            for i, p in enumerate(draws):
                column = _repriced_column(
                    repricer, prices_of, ctx if i == 0 else build_context(scenario, profile, p)
                )
                if column is None:  # its shape changed: run alone below
                    continue
                durations, slowdowns, tail = column
                group = groups.get((id(head), engine_batched.shape_of(tail)))
                if group is None:  # its columns, as many as the draws left at most, filled in place
                    room = sum(len(d) for _, d in jobs[j:]) - i
                    group = groups[(id(head), engine_batched.shape_of(tail))] = {
                        "ops": repricer.program.ops[: repricer.passes] + tail,
                        "columns": [],
                        "durations": np.empty((len(durations), room)),
                        "slowdowns": np.empty((len(durations), room)),
                    }
                k = len(group["columns"])
                group["durations"][:, k] = durations
                group["slowdowns"][:, k] = slowdowns
                group["columns"].append((j, i))
                out[j] = (out[j][0], len(durations))
        for group in groups.values():
            columns = group["columns"]
            k = len(columns)
            ends = engine_batched.run_columns(
                group["ops"], group["durations"][:, :k], group["slowdowns"][:, :k], MAX_ITERATION_S
            )
            if ends is None:
                continue
            for (j, i), end in zip(columns, ends.tolist()):
                out[j][0][i] = end
    for j, (scenario, draws) in enumerate(jobs):  # what the batched pass could not give, one at a time
        times, ops = out[j]
        for i, t in enumerate(times):
            if t != t:  # NaN
                times[i] = draw_times(scenario, profile, [draws[i]], checked=False)[0]
                ops = ops or ops_of_last_run()
        out[j] = (times, ops)
    return out


# Built pipeline programs draw_times_many keeps for its next call (``programs``): a plan's banded rows are
# a few layouts, each on several NICs; a 16-stage interleaved GPT-3 175B program is ~50k ops.
KEPT_PROGRAMS = 4


def _price_groups(repricer) -> dict:
    """The passes' op ids by what prices them (PipelineRepricer.groups), and their slowdowns as built
    (a pass's compute op has none; a collective's is re-priced): _repriced_column's index."""
    ops = repricer.program.ops[: repricer.passes]
    return {
        "groups": [(key, np.array([op.id for op in group])) for key, group in repricer.groups.items()],
        "durations": np.array([op.duration for op in ops]),
        "slowdowns": np.array([op.compute_slowdown for op in ops]),
    }


def _repriced_column(repricer, index: dict, ctx: SimulationContext):
    """The durations and compute slowdowns of every op of ``repricer.program_for(ctx)``, and its ops
    after the passes (each stage's finish, built for ``ctx``): the passes' from their prices, one
    numpy assignment per price, instead of each op's attributes (what engine_batched reads of them).
    None where program_for would not re-price (another shape) or a collective pushes bytes through
    links (engine_batched does not run such programs)."""
    from clustersim.simulator.strategies.megatron import _finish_stage, pipeline_prices

    prices = pipeline_prices(ctx)
    if not prices.same_shape(repricer.prices):
        return None
    durations, slowdowns = index["durations"].copy(), index["slowdowns"].copy()
    for key, ids in index["groups"]:
        if key not in ("send", "send_across") and key[0] == "pass":  # ("pass", chunk, forward)
            durations[ids] = prices.times[key[1]][0 if key[2] else 1]
            continue
        priced = prices.priced(key)
        if priced.demands:
            return None
        durations[ids] = priced.duration
        slowdowns[ids] = priced.compute_slowdown
    prog = repricer.program
    del prog.ops[repricer.passes :]
    for s in range(ctx.layout.pipeline):
        _finish_stage(prog, ctx, s, repricer.tails[s], repricer.update_bytes, repricer.label)
    tail = prog.ops[repricer.passes :]
    return (
        np.concatenate([durations, [op.duration for op in tail]]),
        np.concatenate([slowdowns, [op.compute_slowdown for op in tail]]),
        tail,
    )


def paired_times(scenarios: list[Scenario], profile, samples: int, seed: int = 0) -> np.ndarray:
    """Iteration times of several scenarios under the *same* parameter draws: ``out[i, k]`` is scenario i
    under draw k. Ratios taken draw by draw (speedups) keep only the uncertainty of what differs between
    the scenarios, as two runs on one real cluster would. Each scenario's draws are made from its own
    context with the same seed: on one cluster they are the same draws; where a scenario changes the
    network (a slower NIC, another link kind), the same normals move its links by their own spread, not
    by the first scenario's."""
    from clustersim.simulator.context import build_context

    return np.array(
        [
            [
                simulate(s, profile, perturbation=p).iteration_time
                for p in perturbations(build_context(s, profile), samples, seed)
            ]
            for s in scenarios
        ]
    )


def _best_placement(
    scenario, profile, ctx: SimulationContext, planned: SimulationResult, perturbation=None
) -> SimulationResult:
    """Check the performance model's plan against all-CPU and all-GPU placements; keep the fastest.

    An alternative is simulated only when it could win: one whose placement equals the plan's is the
    plan, and one whose contention-free time (``engine.contention_free_end``, a lower bound on its
    simulated time) is already no shorter than the plan's simulated time cannot be faster, so it is
    ruled out unsimulated and reported with that bound under ``ruled_out``. The choice is the same
    as simulating everything (ties went to the plan before too); on the offload preset this skips
    both alternatives, which were 60% of a run (issue #15).
    """
    from clustersim.simulator.engine import contention_free_end
    from clustersim.simulator.offload import Placement

    plan = ctx.offload_placement
    n = len(plan.kinds)
    resident = plan.count(PlacementKind.GPU_RESIDENT)
    alternatives = {"all on the CPU": [PlacementKind.CPU] * n}
    if plan.count(PlacementKind.GPU_STREAMED) or resident < n:
        alternatives["all on the GPU (streamed)"] = [PlacementKind.GPU_RESIDENT] * resident + [
            PlacementKind.GPU_STREAMED
        ] * (n - resident)
    candidates = {"performance model": planned}
    ruled_out: dict[str, float] = {}
    for name, kinds in alternatives.items():
        if kinds == list(plan.kinds):
            candidates[name] = planned  # the same program, so the same time (and the plan wins the tie)
            continue
        alt_ctx = build_context(scenario, profile, perturbation)
        alt_ctx.offload_placement = Placement(plan.subgroup_params, kinds, plan.partition_params, name)
        strategy = registry.create(alt_ctx)
        steps = strategy.steps()
        memory = gpu_memory(alt_ctx, strategy)
        check_fits(alt_ctx, memory)  # an alternative that does not fit is an error, as when simulated
        total = sum(s.weight for s in steps)
        bound = sum(s.weight / total * contention_free_end(s.program) for s in steps)
        if bound >= planned.iteration_time:
            ruled_out[name] = bound
            continue
        candidates[name] = _run(alt_ctx, strategy, steps, memory)
    best_name = min(candidates, key=lambda k: candidates[k].iteration_time)
    best = candidates[best_name]
    best.extra.setdefault("offload", {})["candidates"] = {k: v.iteration_time for k, v in candidates.items()}
    best.extra["offload"]["ruled_out"] = ruled_out
    best.extra["offload"]["chosen_by"] = best_name
    return best


@dataclass
class _StepsOutcome:
    """The weighted mean over a strategy's step programs, and the records of the most frequent one."""

    iteration: float = 0.0
    breakdown: dict = field(default_factory=lambda: dict.fromkeys(BREAKDOWN_KEYS, 0.0))
    intra: float = 0.0
    inter: float = 0.0
    per_step: list = field(default_factory=list)
    main_records: list = field(default_factory=list)
    main_times: tuple = ({}, {})
    hottest_links: list = field(default_factory=list)
    straggler: dict = field(default_factory=dict)


def _alone_time(op, links: dict[str, float]) -> float:
    """How long ``op`` takes with nothing else running: its duration, stretched by a link it overfills."""
    over = max((d / links[k] for k, d in op.demands.items() if links.get(k)), default=1.0)
    return op.duration * max(1.0, over)


def _run_engine(ctx: SimulationContext, program) -> tuple[dict, dict]:
    try:
        return Engine(program, time_limit=MAX_ITERATION_S, network=ctx.network).run()
    except RunawaySimulation as exc:
        slowest = max(exc.running or program.ops, key=lambda op: _alone_time(op, program.links))
        alone = _alone_time(slowest, program.links)
        key = culprit(ctx, slowest, alone, MAX_ITERATION_S)
        source = culprit_source(ctx, key)
        where = (
            f"'{slowest.name}' alone takes {alone:.3g} s"
            if alone >= MAX_ITERATION_S
            else f"'{slowest.name}' would take {alone:.3g} s alone; sharing its links, it runs past that"
        )
        raise InputError(
            f"simulated time exceeded {MAX_ITERATION_S:.0e} s in one iteration ({where}): check {key}"
            + (f" in {source}" if source else ""),
            key=key,
            source=source,
        ) from None


def _simulate_steps(
    ctx: SimulationContext, steps, links: dict[str, float], stragglers: dict | None = None
) -> _StepsOutcome:
    out = _StepsOutcome()
    total_weight = sum(s.weight for s in steps)
    main = max(steps, key=lambda s: s.weight)
    for step in steps:
        # Every program shares the rank's host links (PCIe, switch uplink, DRAM); strategies need not know.
        step.program.links = {**links, **step.program.links}
        if ctx.network is not None:
            ctx.network.reset()
        start, end = _run_engine(ctx, step.program)
        view = step.program
        # Op ranks per rank class: pipeline stages (the typical replica's are 0 .. p-1), else 1.
        per_class = ctx.layout.pipeline if ctx.model_parallel else 1
        if stragglers is not None:  # the typical rank's view; its waits for the slowest rank are idle
            view = SimpleNamespace(ops=[op for op in step.program.ops if op.rank < per_class])
        t, parts = attribute_timeline(view, start, end)
        if step.covers != 1:  # per training step
            t, parts = t / step.covers, {k: v / step.covers for k, v in parts.items()}
        if ctx.network is not None and step is main:
            out.hottest_links = ctx.network.utilisation(t)
        if stragglers is not None and step is main:
            out.straggler = waiting(step.program, stragglers[id(step)], start, end, ranks=per_class)
        w = step.weight / total_weight
        out.iteration += w * t
        for k, v in parts.items():
            out.breakdown[k] += w * v
        # Per node: a program of p pipeline stages holds each stage's per-node traffic once; the
        # stages occupy equal shares of the nodes, so a node's average is the mean over stages. A
        # program covering several steps (DiLoCo's sync window) counts per step. Rank classes
        # (stragglers) are not stages: only the typical rank's copy carries bytes.
        per = (per_class if stragglers is not None else step.program.ranks) * step.covers
        ops = step.program.ops
        s_intra = sum([op.intra_node_bytes for op in ops]) / per
        s_inter = sum([op.inter_node_bytes for op in ops]) / per
        out.intra += w * s_intra
        out.inter += w * s_inter
        out.per_step.append(
            {
                "label": step.label,
                "weight": w,
                "iteration_time_s": t,
                "breakdown_s": parts,
                "intra_node_bytes": s_intra,
                "inter_node_bytes": s_inter,
            }
        )
        if step is main:
            out.main_times = (start, end)
            out.main_records = OpRecords(step.program.ops, start, end)
    return out


def _pointwise_source(scenario) -> str:
    """How a transformer's pointwise work was priced, and whether the scenario said so."""
    code = scenario.pointwise_code
    given = "workload.pointwise" if scenario.workload.pointwise is not None else "default"
    if code == "unfused":
        return f"plain PyTorch model code, one kernel per pointwise op ({given})"
    return f"framework kernels, pointwise ops fused ({given})"


_ATTENTION_PATHS = {
    "fused": "fused: one kernel that never writes the scores (FlashAttention, scaled_dot_product_attention)",
    "unfused": "unfused: scores in memory, through a fused scale-mask-softmax kernel and dropout",
    "eager": "eager: scores in memory, scale, mask, softmax and dropout each a kernel (plain PyTorch ops)",
}


def _attention_source(ctx: SimulationContext) -> str:
    """How a transformer's attention was priced, and whether the scenario said so: for a fused kernel,
    the library's published rate where the chip has one (cost_models/attention.py), else the GEMM rate."""
    scenario = ctx.scenario
    given = "workload.attention" if "attention" in scenario.workload.model_fields_set else "default"
    text = f"{_ATTENTION_PATHS[scenario.workload.attention]} ({given})"
    if scenario.workload.attention != "fused":
        return text
    if ctx.device.attention_kernel is None:
        return f"{text}; at the GEMM rate: no published rates of fused attention kernels on {ctx.gpu.chip}"
    kernel = ctx.device.attention_kernel
    said = (
        "workload.attention_kernel" if scenario.workload.attention_kernel != "auto" else "the code's default"
    )
    dropout = scenario.attention_dropout
    drop = f", dropout {dropout:g} in the kernel" if dropout > 0 else ""
    return (
        f"{text}; {kernel_name(kernel)} ({said}) at its published rate for the shape{drop} "
        "(catalogs/attention_kernels.yaml)"
    )


def _conv_source(ctx: SimulationContext) -> str:
    """How a convolution network's kernels were priced (cost_models/compute.py, catalogs/execution.yaml)."""
    layout = ctx.scenario.workload.memory_format
    transposes = any(k.name == "layout_transpose" for layer in ctx.workload.layers for k in layer.forward)
    rate = (
        "the matmul efficiency (fp32, SIMT cores)"
        if ctx.precision == "fp32"
        else f"{ctx.device.conv_eff:.2f} of tensor-core peak"
    )
    moved = " (cuDNN transposes each tensor-core convolution's input and output)" if transposes else ""
    fusion = ctx.scenario.workload.batch_norm
    if fusion != "separate":  # only set by the scenario: the default is separate
        applied = "in the next convolution's prologue" if fusion == "fused_into_conv" else "in one pass"
        batch_norm = (
            f"batch-norm fused ({fusion}, workload.batch_norm): statistics from the convolutions' "
            f"epilogues, normalisation and ReLU {applied}, the residual add with the block's last, at "
            "HBM's streaming rate (the stem's batch-norm as separate kernels)"
        )
    elif ctx.gpu.sm_cycles_per_s is not None:
        batch_norm = "batch-norm bound by the multiprocessors, ReLU and residual adds by HBM"
    else:
        batch_norm = (
            "batch-norm at the H200's rates per HBM byte (the GPU entry gives no multiprocessors or "
            "boost_clock_mhz), ReLU and residual adds by HBM"
        )
    return (
        f"each convolution its own roofline, at {rate} or HBM's streaming rate; {batch_norm}; "
        f"{layout} tensors{moved}"
    )


def _lm_head_source(ctx: SimulationContext) -> str | None:
    """The LM head's vocabulary: padded by the code, or unaligned for the tensor cores (and at what
    rate its matmuls run); None when neither applies."""
    name = ctx.scenario.workload.model
    arch = catalog.model(name) if name is not None else None
    if not isinstance(arch, TransformerArch):
        return None
    head = ctx.workload.layers[-1]
    vocab_gemms = [k for k in head.forward if k.name == "gemm" and k.alignment_bytes < 16]
    given = (
        "default"
        if ctx.scenario.workload.pad_vocab_to_multiple_of is None
        else "workload.pad_vocab_to_multiple_of"
    )
    padded = ctx.layout.arch.vocab  # padded as build_workload pads it (Layout.of)
    vocab = (
        f"vocabulary of {arch.vocab:,} unpadded"
        if padded == arch.vocab
        else (f"vocabulary padded from {arch.vocab:,} to {padded:,}")
    )
    precision = vocab_gemms[0].precision or ctx.precision if vocab_gemms else ctx.precision
    if vocab_gemms and precision != "fp32":
        width = vocab_gemms[0].alignment_bytes
        unaligned = ctx.device.unaligned_gemm_rate(precision, width)
        if unaligned < ctx.device.flops_rate(precision):
            return (
                f"{vocab} ({given}): its matmuls load {width} bytes at a time, "
                f"{unaligned / 1e12:,.0f} TFLOP/s (unaligned tensor-core kernels)"
            )
    return f"{vocab} ({given})" if padded != arch.vocab else None


_UPDATE_PATHS = {
    "fused": "fused: one pass over parameters, gradients and state",
    "foreach": "foreach: a multi-tensor kernel per op of the update, each a pass of its own",
    "for_loop": "for_loop: every op a kernel per parameter tensor, each dispatched by the host",
}


def _update_source(ctx: SimulationContext) -> str | None:
    """How Adam's or SGD's update runs and whether the scenario said so; None for other optimizers."""
    training = ctx.scenario.training
    if training.optimizer not in ("adam", "sgdm"):
        return None
    impl = ctx.update_implementation
    given = (
        "training.optimizer_options.implementation"
        if "implementation" in training.optimizer_options
        else "default"
    )
    return (
        f"{_UPDATE_PATHS[impl]}, {UPDATE_BYTES[(training.optimizer, impl)]:g} bytes per parameter ({given})"
    )


def _sync_source(ctx: SimulationContext, ops) -> str | None:
    """Whether the optimizer's host work waits for backward (training.host_sync_before_update), where
    the scenario says so or fp16's loss scaler implies it; None where neither applies. Only programs
    that model the optimizer step's host work (an op marked ``waits_for_backward``) can wait."""
    given = ctx.scenario.training.host_sync_before_update
    if given is None and not ctx.host_syncs_before_update:
        return None
    flags = [op.meta["waits_for_backward"] for op in ops if "waits_for_backward" in op.meta]
    if not flags:
        if given is None:
            return None
        return "not modelled here: this program prices no host work of its own for the optimizer step"
    if given is None:
        why = "default for fp16: its loss scaler reads the inf check on the host every step"
    else:
        why = "training.host_sync_before_update"
    if not any(flags):
        return f"none: the host dispatches the optimizer step while backward runs ({why})"
    return f"the optimizer step's host work starts after backward's kernels ({why})"


def _measured_compute_sources(ctx: SimulationContext) -> dict[str, str]:
    """Host dispatch's source, and the compute rates' where a measurement of this model (or another one
    carried over) sets each phase's total: the rates then only split that total over the layers."""
    mc, carried = ctx.model_compute, ctx.transferred_from
    if mc is None and carried is None:
        return {"host dispatch": ctx.dispatch.source}
    if mc is None:  # another model's rates: host per launch; the device keeps its own sources
        return {
            "host dispatch": f"{carried.model}'s measured host time per launch "
            f"({carried.fingerprint.implementation or 'unrecorded'} code), over this model's launches"
        }
    out = {"host dispatch": f"{mc.model}'s own measured phases"}
    scaled = "scaled to its own measured phases"
    out["matmul"] = f"{ctx.device.matmul_source(ctx.precision)}, {scaled}"
    out["memory"] = f"{ctx.device.sources['memory']}, {scaled}"
    return out


def _inter_node_sources(ctx: SimulationContext) -> dict[str, str]:
    """The NIC bandwidth's source and, when the slowest node paces the cluster's lockstep collectives
    (cost_models/collectives.CollectiveModel.pacing), by how much."""
    c = ctx.scenario.cluster
    if c.nodes <= 1:
        return {}
    latency, origin = ctx.cluster.nic_latency()
    out = {
        "inter_node_bandwidth": ctx.cluster.injection().bottleneck,
        "inter_node_latency": f"{latency * 1e6:g} us per message, one way ({origin})",
    }
    pace = ctx.collectives.pacing(c.nodes)
    if pace > 1.0:
        cv = ctx.collectives.params.pacing_cv.get(f"net_{c.nic.kind}")
        origin = "calibrated" if cv is not None else "cluster.nic.pacing_cv"
        cv = ctx.cluster.pacing_cv() if cv is None else cv
        out["network pacing"] = (
            f"rings, trees and halving-doubling across {c.nodes} nodes wait for the slowest node: "
            f"network time x{pace:.3f} (per-chunk rate spread {cv:g}, {origin}); all-to-all not paced"
        )
    return out


def _sources(ctx: SimulationContext, ops) -> dict[str, str]:
    """Where every number came from: compute rates, link bandwidths, and each collective's cost model."""
    c = ctx.scenario.cluster
    sources = dict(ctx.device.sources) | {"matmul": ctx.device.matmul_source(ctx.precision)}
    sources |= _measured_compute_sources(ctx)
    measured = ctx.update_from
    if not ctx.drawn:  # a draw's result is a time; the carry errors behind this line cost a band's worth
        sources["compute band"] = compute_band_source(ctx)
    if any(layer.name.startswith("block") for layer in ctx.workload.layers):
        sources["pointwise"] = _pointwise_source(ctx.scenario)
        sources["attention"] = _attention_source(ctx)
        head = _lm_head_source(ctx)
        if head is not None:
            sources["LM head"] = head
    if any(k.name == "conv" for layer in ctx.workload.layers for k in layer.forward):
        sources["convolutions"] = _conv_source(ctx)
    update = _update_source(ctx)
    if update is not None:
        if measured is not None:
            update += f"; its time scaled to {measured.model}'s measured optimizer phase"
        sources["optimizer update"] = update
    clipping = ctx.scenario.training.gradient_clipping
    if clipping == "none" and "gradient_clipping" in ctx.scenario.training.model_fields_set:
        sources["gradient clipping"] = "none (training.gradient_clipping)"
    elif clipping != "none":
        per_tensor = CLIP_KERNELS_PER_TENSOR[clipping]
        launches = f", {per_tensor} kernels per tensor from the host" if per_tensor else ""
        sources["gradient clipping"] = (
            f"{clipping}: a norm and a scaling pass over the fp32 gradients, {CLIP_BYTES:g} bytes per "
            f"parameter{launches} (training.gradient_clipping)"
        )
        if any(op.stream == "cpu" for op in ops):
            sources["gradient clipping"] += "; priced on the GPU's updates, not on the CPU's"
    sync = _sync_source(ctx, ops)
    if sync is not None:
        sources["host sync before update"] = sync
    sources["intra_node_bandwidth"] = ctx.cluster.intra_ring(c.gpus_per_node).bottleneck
    sources.update(_inter_node_sources(ctx))
    communication = Category.COMMUNICATION
    pairs = {(op.meta.get("source"), op.meta.get("op")) for op in ops if op.category == communication}
    by_source: dict[str, set] = {}
    for src, what in pairs:
        if src not in (None, "none"):
            by_source.setdefault(src, set()).add(what)
    for src, what in sorted(by_source.items()):
        label = "collectives (measured fits)" if src.startswith("measured fit") else f"collectives ({src})"
        sources[label] = ", ".join(sorted(o for o in what if o))
    measured = ctx.collectives.measured
    if measured is not None and measured.skipped:
        sources["collectives (measured fits not used)"] = "measured on other hardware: " + "; ".join(
            sorted(measured.skipped)
        )
    return sources


def _offload_summary(ctx: SimulationContext, sources: dict[str, str]) -> dict:
    p, host = ctx.offload_placement, ctx.host
    sources["CPU optimizer rate"] = (
        "measured CPU Adam, scaled to threads, capped by DRAM"
        if ctx.profile is not None and ctx.profile.host.cpu_adam_params_per_s
        else "default CPU Adam (Deep Optimizer States' measured rate), scaled to threads, capped by DRAM"
    )
    return {
        "mode": ctx.scenario.training.offload.mode,
        "subgroups": len(p.kinds),
        "subgroup_params": p.subgroup_params,
        # DeepSpeed's subgroups of whole tensors differ in size (the gap placement): smallest and largest
        "subgroup_params_range": (min(p.sizes), max(p.sizes)) if p.sizes is not None else None,
        "placement": {str(k): p.count(k) for k in PlacementKind},
        "ranges": p.ranges(),
        "chosen_by": p.chosen_by,
        "cpu_params_per_s": host.cpu_rate(ctx.offload_spec.cpu_dram),
        "pcie_gbs": host.pcie / 1e9,
        "host_dram_gbs_per_gpu": host.dram_share / 1e9,
    }


def _model_flops(ctx: SimulationContext, samples: int, iteration_s: float) -> dict:
    """The model's own FLOPs per iteration (forward and backward of every layer as the simulator prices
    them, without recomputation: what model FLOPs utilisation counts, after Chowdhery et al. 2022,
    PaLM, appendix B), the rate they are done at per GPU and its share of the GPU's dense peak at the
    workload's precision (MFU); tokens per second per GPU for a transformer."""
    spec = ctx.scenario.workload
    # custom layers are never recomputed (builder.recomputed leaves them): the context's own serve
    base = (
        ctx.workload
        if spec.model is None
        else build_workload(spec.model_copy(update={"activation_checkpointing": False}))
    )
    per_sample = (base.forward_flops + base.backward_flops) / spec.micro_batch
    gpus = ctx.scenario.cluster.world_size
    per_gpu = per_sample * samples / iteration_s / gpus
    out = {
        "per_iteration": per_sample * samples,
        "per_gpu_per_s": per_gpu,
        "mfu": per_gpu / ctx.gpu.peak_flops(ctx.precision),
        "precision": ctx.precision,
    }
    if spec.model is not None and not isinstance(catalog.model(spec.model), ResNetArch):
        out["tokens_per_s_per_gpu"] = samples * base.seq_len / iteration_s / gpus
    return out


def _parallelism_summary(ctx: SimulationContext, program, times) -> dict:
    """The placement (which ranks form each group, inside or across nodes) and, per stage, when it
    ends and how long it computes: the step is the slowest stage's end, the breakdown that stage's."""
    start, end = times
    summary = ctx.layout.describe()
    busy: dict[int, float] = {}
    last: dict[int, float] = {}
    compute = Stream.COMPUTE
    for op in program.ops:
        rank, e = op.rank, end[op.id]
        if op.stream == compute:
            busy[rank] = busy.get(rank, 0.0) + e - start[op.id]
        if e > last.get(rank, 0.0) or rank not in last:
            last[rank] = e
    p = ctx.layout.pipeline
    summary["stages"] = [
        {"stage": s, "end_s": last[s], "compute_s": busy.get(s, 0.0)} for s in sorted(last) if s < p
    ]
    summary["critical_stage"] = max(last, key=lambda s: (last[s], -s)) % p
    if max(last) >= p:  # stragglers: ranks p .. 2p-1 are the slowest replica's stages
        summary["slowest_replica_stages"] = [
            {"stage": s - p, "end_s": last[s], "compute_s": busy.get(s, 0.0)} for s in sorted(last) if s >= p
        ]
    return summary


def _gpu_factor(ctx: SimulationContext, name: str) -> float:
    """How much longer forward and backward take on catalog GPU ``name`` than on the cluster's GPU, both
    priced the same way (the scenario's code, no profile: a profile measured the cluster's GPU only)."""
    mine_device = device_costs(ctx.scenario, ctx.gpu)
    other = device_costs(ctx.scenario, catalog.gpu(name))
    layers = ctx.workload.layers
    mine = sum(mine_device.kernels_time(x.forward + x.backward, ctx.precision) for x in layers)
    theirs = sum(other.kernels_time(x.forward + x.backward, ctx.precision) for x in layers)
    return theirs / mine if mine > 0 else 1.0


def _rank_classes(ctx: SimulationContext, steps) -> tuple[dict | None, dict]:
    """With stragglers (cluster.heterogeneity), rewrite every step program for two rank classes
    (simulator/stragglers.py); returns each program's collective waits and the straggler's summary."""
    c = ctx.scenario.cluster
    factors = rank_factors(
        c.heterogeneity, ctx.world_size, c.gpus_per_node, lambda name: _gpu_factor(ctx, name)
    )
    if factors is None:
        return None, {}
    slow = int(np.argmax(factors))
    waits = {}
    if ctx.model_parallel:  # classes of replicas, factors per stage (stragglers.replica_factors)
        L = ctx.layout
        typical, slowest, (stage, replica) = replica_factors(factors, L.tensor, L.data, L.pipeline)
        dp = ctx.data_parallel

        def over_replicas(op) -> bool:  # the data-parallel collectives; the rest run inside a replica
            return op.collective is not None and op.collective.shape is dp

        for step in steps:
            step.program, waits[id(step)] = with_rank_classes(
                step.program, typical, slowest, L.pipeline, over_replicas
            )
        summary = {"stage": stage, "replica": replica, "typical_factor": typical[stage]}
        return waits, {"rank": slow, "compute_factor": float(factors[slow]), **summary}
    typical = float(typical_factor(factors, slow))
    for step in steps:
        step.program, waits[id(step)] = with_rank_classes(step.program, typical, float(factors[slow]))
    return waits, {"rank": slow, "compute_factor": float(factors[slow]), "typical_factor": typical}


def _run(ctx: SimulationContext, strategy=None, steps=None, memory=None) -> SimulationResult:
    """Simulate ``ctx``; ``strategy``, its ``steps`` and checked ``memory`` when already built."""
    scenario = ctx.scenario
    if strategy is None:
        strategy = registry.create(ctx)
        if ctx.offload_placement is None and scenario.training.offload.mode == "none":
            # before the program is built: a row that does not fit costs no program (an offloaded
            # one's placement, which its memory depends on, is made while its program is built)
            check_fits(ctx, gpu_memory(ctx, strategy))
        steps = strategy.steps()
        memory = gpu_memory(ctx, strategy)
        check_fits(ctx, memory)
    stragglers, slow = _rank_classes(ctx, steps)
    _ops_per_run.set(sum(len(s.program.ops) for s in steps))
    out = _simulate_steps(ctx, steps, ctx.link_capacities(), stragglers)
    main = max(steps, key=lambda s: s.weight)
    starts, ends = out.main_times
    buckets = [
        {"bucket": b["bucket"], "bytes": b["bytes"], "start_s": starts[b["op"]], "end_s": ends[b["op"]]}
        for b in main.buckets
    ]
    sources = _sources(ctx, main.program.ops)
    extra: dict = {"steps": out.per_step} if len(steps) > 1 else {}
    if ctx.offload_placement is not None:
        extra["offload"] = _offload_summary(ctx, sources)
    if ctx.offload_placement is not None or scenario.training.memory_breakdown:
        sources["host band"] = host_band_source()
    network_band = None if ctx.drawn else network_band_source(ctx)
    if network_band is not None:
        sources["network band"] = network_band
    if scenario.training.offload.gradient_copy == "blocking":
        sources["page faults"] = page_fault_source(scenario.cluster.host)
    if ctx.profile is not None:
        sources["profile"] = ctx.profile.provenance.source
    own, own_notes = strategy.result_extra(out.per_step)
    extra.update(own)
    if ctx.model_parallel:
        extra["parallelism"] = _parallelism_summary(ctx, main.program, out.main_times)
    # Samples: micro-batch x micro-batches x data-parallel replicas (tensor/pipeline ranks share one).
    replicas = ctx.layout.data if ctx.model_parallel else scenario.cluster.world_size
    samples = scenario.workload.micro_batch * scenario.workload.gradient_accumulation * replicas

    if slow:
        extra["straggler"] = {**slow, **out.straggler}
    hetero = scenario.cluster.heterogeneity
    if ctx.network is None and hetero is not None and (hetero.degraded_nics or hetero.background):
        ctx.notes.append(
            "cluster.heterogeneity: degraded NICs and background jobs act on the flow backend only "
            "(training.network: flow / run --network flow); the analytical model ignores them"
        )
    if ctx.network is not None:
        sources["collective durations"] = (
            "flow backend: each algorithm's flows routed over the topology, links shared max-min fairly"
        )
        extra["hottest_links"] = out.hottest_links
        ctx.notes.extend(n for n in ctx.network.notes if n not in ctx.notes)
        for what in sorted(ctx.network.fallbacks):
            ctx.notes.append(f"flow backend: no flow model for {what}; its analytical time is used")
    # sizes priced outside what their fit measured (the band widens past the largest: network_params)
    if not ctx.drawn:
        ctx.notes.extend(n for n in ctx.collectives.extrapolation_notes() if n not in ctx.notes)
    return SimulationResult(
        scenario=scenario.name,
        optimizer=strategy.name,
        world_size=scenario.cluster.world_size,
        nodes=scenario.cluster.nodes,
        gpus_per_node=scenario.cluster.gpus_per_node,
        samples_per_iteration=samples,
        iteration_time=out.iteration,
        breakdown=out.breakdown,
        bytes_per_link_kind={
            "intra_node_per_node": out.intra,
            "inter_node_per_node": out.inter,
            "intra_node_link": "infinity_fabric"
            if scenario.cluster.intra_node.fabric == "infinity_fabric"
            else ctx.cluster.intra_ring(scenario.cluster.gpus_per_node).latency_class,
        },
        buckets=buckets,
        ops=out.main_records,
        ops_step=main.label,
        notes=[*ctx.notes, *own_notes],
        sources=sources,
        memory=memory,
        extra=extra,
        compute_from=(
            "measured"
            if ctx.model_compute is not None
            else "carried"
            if ctx.transferred_from is not None
            else "defaults"
        ),
        carried_from=(
            f"{carried.model} seq {carried.seq_len}"
            if ctx.model_compute is None and (carried := ctx.transferred_from) is not None
            else None
        ),
    )
