"""Compare optimizers across GPU counts: iteration split, throughput, bytes, time-to-train.

Every optimizer is measured against one baseline: the uncompressed optimizer the team runs today (the
scenario's, or ``--baseline``), so BinSGDM on a transformer trained with Adam is compared with Adam,
not with the SGD-momentum its paper replaced. Speedup bands pair the draws (the same hardware draw
for both optimizers), as two runs on one real cluster would.

Convergence is not modelled: an optimizer's time to train is its step time x the steps it is given
(``StepsPlan``: one count for all, or one per optimizer when the team knows a compressed optimizer
needs more steps to the same loss). With a ``global_batch`` every GPU count trains the same recipe
(``split_global_batch``), so more GPUs means fewer samples each, not a larger batch.

Time-to-train over N steps: the baselines and BinSGDM run every step alike; 1-bit Adam runs its first
``w·N`` steps in the warmup stage (full-precision Adam) and the rest compressed; 0/1 Adam's average
step already weighs its schedule over ``total_steps = N``. With a warmup step as fast as the
baseline's, the end-to-end speedup is 1 / (w + (1 - w)/s) for a compression-stage speedup s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from clustersim.errors import InputError
from clustersim.optimizer_options import UpdateOptions
from clustersim.scenario import Scenario
from clustersim.simulator import simulate
from clustersim.simulator.strategies import registry
from clustersim.units import parse_count

DEFAULT_WARMUP = 0.15  # the 1-bit Adam paper's BERT-Large setting (15-25% recommended)
MAX_COUNT = 2**53  # steps and samples: the largest count a float time-to-train holds exactly


@dataclass
class CompareRow:
    """One cell of the table. A cell that cannot be simulated (out of GPU memory, say) keeps ``error``
    and no numbers, so the rest of the table still prints."""

    gpus: int
    optimizer: str
    iteration_time_s: float | None
    compute_s: float | None
    exposed_communication_s: float | None
    compression_s: float | None
    optimizer_s: float | None
    samples_per_s: float | None
    speedup: float | None
    intra_node_bytes: float | None
    inter_node_bytes: float | None
    warmup_iteration_time_s: float | None = None
    time_to_train_s: float | None = None
    time_to_train_speedup: float | None = None
    iteration_time_p10_s: float | None = None  # P10-P90 under parameter draws (simulator/uncertainty.py)
    iteration_time_p90_s: float | None = None
    speedup_p10: float | None = None  # draw by draw against the baseline (paired)
    speedup_p90: float | None = None
    time_to_train_speedup_p10: float | None = None  # paired too, with each optimizer's steps
    time_to_train_speedup_p90: float | None = None
    steps: int | None = None  # the steps this optimizer's time to train assumes
    error: str | None = None
    idle_s: float | None = None  # nothing running: a pipeline's bubble on its critical stage
    # the GPU waiting on its host's dispatch (run's "exposed host"), apart from communication
    exposed_host_s: float | None = None
    notes: list[str] = field(default_factory=list)  # the simulation's notes (run prints the same)
    # model FLOPs utilisation and tokens/s per GPU (a transformer's), as run computes them
    mfu: float | None = None
    tokens_per_s_per_gpu: float | None = None

    @classmethod
    def failed(cls, gpus: int, optimizer: str, error: str) -> "CompareRow":
        return cls(gpus, optimizer, *([None] * 9), error=error)

    def to_dict(self) -> dict:
        """The cell as plain data (what ``compare --json`` prints per row)."""
        return asdict(self)

    as_dict = to_dict  # the name this had before


def notes_by_cells(rows: list[CompareRow]) -> list[str]:
    """Each note of the table's simulations once, in order, naming the cells it came from unless it
    came from all of them (a key the model does not use is said once, not once per cell)."""
    cells: dict[str, list[CompareRow]] = {}
    simulated = [r for r in rows if r.error is None]
    for r in simulated:
        for n in r.notes:
            cells.setdefault(n, []).append(r)
    out = []
    for note, where in cells.items():
        if len(where) == len(simulated):
            out.append(note)
            continue
        per_opt: dict[str, list[str]] = {}
        for r in where:
            per_opt.setdefault(r.optimizer, []).append(f"{r.gpus:,}")
        named = "; ".join(f"{o} at {', '.join(g)} GPUs" for o, g in per_opt.items())
        out.append(f"{note} ({named})")
    return out


def mean_step_time(
    optimizer: str, iteration: float, warmup_iteration: float | None, warmup: float | None
) -> float:
    """Average seconds per step over a run: an optimizer with a warmup stage (1-bit Adam) spends the
    fraction ``warmup`` (default DEFAULT_WARMUP) of its steps there; others run every step alike."""
    if warmup_iteration is None or registry.get(optimizer).warmup_options({}) is None:
        return iteration
    w = DEFAULT_WARMUP if warmup is None else warmup
    return w * warmup_iteration + (1 - w) * iteration


def end_to_end_speedup(warmup_fraction: float, stage_speedup: float) -> float:
    """Amdahl's form for a warmup run at baseline speed: 1 / (w + (1 - w)/s)."""
    return 1.0 / (warmup_fraction + (1.0 - warmup_fraction) / stage_speedup)


def warmup_fraction(scenario: Scenario, steps: int | None, warmup: float | None) -> float:
    if warmup is not None:
        if not 0.0 <= warmup < 1.0:
            raise InputError(f"warmup fraction must be in [0, 1), got {warmup}", key="--warmup")
        return warmup
    freeze = registry.get(scenario.training.optimizer).warmup_steps(scenario.training.optimizer_options)
    if freeze is not None and steps:
        if freeze > steps:
            raise InputError(
                f"freeze_step {freeze} is beyond the run's {steps} steps",
                key="training.optimizer_options.freeze_step",
            )
        return freeze / steps
    return DEFAULT_WARMUP


def scenario_for_optimizer(scenario: Scenario, optimizer: str, steps: int | None, **extra) -> Scenario:
    """The scenario with another optimizer (its options reset, 0/1 Adam's schedule fitted to ``steps``).
    The update's implementation (how the code runs Adam's or SGD's update) is the code's, not the
    optimizer's: it carries over to another optimizer that has one."""
    old = scenario.training.optimizer_options
    if scenario.training.optimizer == optimizer:
        opts = dict(old)
    else:
        carried = set(UpdateOptions.model_fields) & set(registry.get(optimizer).Options.model_fields)
        opts = {k: v for k, v in old.items() if k in carried}
    opts = registry.get(optimizer).run_options(opts, steps)
    opts.update(extra)
    return scenario.with_changes(**{"training.optimizer": optimizer, "training.optimizer_options": opts})


def is_uncompressed(optimizer: str) -> bool:
    """A full-precision optimizer (its strategy names no baseline): what others are measured against."""
    return registry.get(optimizer).baseline is None


def choose_baseline(scenario_optimizer: str, override: str | None = None, key: str = "--baseline") -> str:
    """What every speedup is measured against: ``override`` when given (an uncompressed optimizer), else
    the scenario's optimizer when it is uncompressed, else the one that compressed optimizer replaces."""
    if override is not None:
        try:
            strategy = registry.get(override)
        except InputError as exc:
            raise InputError(exc.message, key=key) from None
        if strategy.baseline is not None:
            raise InputError(
                f"{override} is a compressed optimizer; the baseline must be an uncompressed one "
                f"(e.g. {strategy.baseline})",
                key=key,
            )
        return override
    return (
        scenario_optimizer
        if is_uncompressed(scenario_optimizer)
        else registry.get(scenario_optimizer).baseline
    )


@dataclass(frozen=True)
class StepsPlan:
    """Training steps per optimizer: ``default`` for any optimizer not named in ``per``. An optimizer
    with neither takes its baseline's count (the same loss in as many steps: convergence is not
    modelled, and saying so is the caller's job, see ``assumption``)."""

    default: int | None = None
    per: tuple[tuple[str, int], ...] = ()

    @classmethod
    def parse(cls, text: "str | int | dict | StepsPlan | None", key: str = "--steps") -> "StepsPlan | None":
        """``100000``, ``adam=100000,binsgdm=110000`` or both (``100000,binsgdm=110000``); from Python
        also a mapping (``{"adam": 100000, "binsgdm": 110000}``), read as that text."""
        if text is None or isinstance(text, StepsPlan):
            return text
        if isinstance(text, dict):
            if not text:
                raise InputError("no steps given", key=key)
            text = ",".join(f"{name}={n}" for name, n in text.items())
        if isinstance(text, int):
            cls._checked(text, None, key)
            return cls(default=text)
        default, per = None, {}
        for part in [p.strip() for p in str(text).split(",") if p.strip()]:
            name, _, value = part.rpartition("=")
            try:  # as the CLI's --steps reads it (commands/counts.py): 1e5 is a count, 4_00 is not
                n = parse_count(value, key, least=None)
            except InputError as exc:
                said = f"{part!r}: {exc.message}" if name else exc.message
                raise InputError(said, key=key) from None
            cls._checked(n, name or None, key)
            if name:
                try:
                    registry.get(name.strip())
                except InputError as exc:
                    raise InputError(exc.message, key=key) from None
                if name.strip() in per:  # adam=100,adam=200 kept the last without a word
                    raise InputError(f"{name.strip()} is given steps twice ({part!r})", key=key)
                per[name.strip()] = n
            else:
                if default is not None:
                    raise InputError(f"steps for every optimizer given twice ({part!r})", key=key)
                default = n
        if default is None and not per:
            raise InputError("no steps given", key=key)
        return cls(default=default, per=tuple(sorted(per.items())))

    @staticmethod
    def _checked(n: int, name: str | None, key: str) -> bool:
        if n <= 0:
            raise InputError(f"steps must be positive, got {n}" + (f" for {name}" if name else ""), key=key)
        if n > MAX_COUNT:
            raise InputError(f"{n:,} steps is more than 2^53, the largest exact count", key=key)
        return True

    def of(self, optimizer: str, baseline: str | None = None) -> int | None:
        own = dict(self.per)
        if optimizer in own:
            return own[optimizer]
        if self.default is not None:
            return self.default
        return own.get(baseline) if baseline else None

    def assumption(self, optimizers: list[str], baseline: str) -> str:
        """The caveat any recommendation that changes the optimizer must carry: which steps it assumed."""
        others = [o for o in dict.fromkeys(optimizers) if o != baseline]
        counts = ", ".join(f"{o} {_count(self.of(o, baseline))}" for o in [baseline, *others])
        example = f"{baseline}=N," + ",".join(f"{o}=M" for o in others[:1])
        return (
            f"Convergence is not modelled: time to train assumes the same loss after {counts} steps; "
            f"give --steps {example} with the counts your runs need."
        )


def _count(n: int | None) -> str:
    return "?" if n is None else f"{n:,}"


def split_global_batch(scenario: Scenario, global_batch: int, key: str = "global_batch") -> Scenario:
    """Micro-batch and gradient accumulation so that every step trains ``global_batch`` samples, split
    over the data-parallel replicas (world / (tensor x pipeline): model-parallel ranks share a batch)."""
    par = scenario.training.parallelism
    p = scenario.cluster.world_size // (par.tensor * par.pipeline)
    if global_batch % p:
        what = "GPUs" if p == scenario.cluster.world_size else "data-parallel replicas"
        raise InputError(f"global batch {global_batch} does not split evenly over {p} {what}", key=key)
    share = global_batch // p
    mb = min(scenario.workload.micro_batch, share)
    while share % mb:
        mb -= 1
    return scenario.with_changes(
        **{"workload.micro_batch": mb, "workload.gradient_accumulation": share // mb}
    )


def halve_micro_batch(scenario: Scenario) -> Scenario:
    """The same samples per replica in smaller micro-batches (half, or the next smaller divisor of the
    share), accumulating more: what a fixed-global-batch row does when its micro-batch does not fit."""
    w = scenario.workload
    mb = w.micro_batch // 2
    share = w.micro_batch * w.gradient_accumulation
    while share % mb:
        mb -= 1
    return scenario.with_changes(
        **{"workload.micro_batch": mb, "workload.gradient_accumulation": share // mb}
    )


def fit_micro_batch(
    scenario: Scenario, attempt: Callable[[Scenario], Any], adapt: bool
) -> tuple[Any, Scenario]:
    """``attempt(scenario)`` and the scenario it succeeded on: with ``adapt`` (a fixed global batch), a
    micro-batch that does not fit in GPU memory is halved (halve_micro_batch) until it fits or is 1."""
    while True:
        try:
            return attempt(scenario), scenario
        except InputError as exc:
            fits_smaller = "does not fit in GPU memory" in exc.message and scenario.workload.micro_batch > 1
            if not (adapt and fits_smaller):
                raise
            scenario = halve_micro_batch(scenario)


def check_optimizers(names: list[str]) -> None:
    """Refuse an empty list or an unknown name under --optimizers, before any work starts."""
    if not names:
        raise InputError("no optimizers given", key="--optimizers")
    for name in names:
        try:
            registry.get(name)
        except InputError as exc:
            raise InputError(exc.message, key="--optimizers") from None


@dataclass
class CompareRequest:
    """A comparison's arguments once checked: the optimizers with the baseline first when it was not
    among them, the steps plan, and the GPU count of the break-even search (0: none)."""

    optimizers: list[str]
    plan: "StepsPlan | None"
    baseline: str
    break_even_at: int


def check_request(
    scenario: Scenario,
    optimizers: list[str],
    counts: list[int],
    steps=None,
    baseline: str | None = None,
    warmup: float | None = None,
    global_batch: int | None = None,
    break_even_at: int | None = None,
) -> CompareRequest:
    """Every argument of a comparison checked before any work starts, each error keyed by the command's
    option (the API names its keyword arguments instead): the optimizers, steps, baseline and warmup, and
    every GPU count (and the break-even's, default the largest) as a whole layout of the scenario with
    the global batch split evenly over it."""
    check_optimizers(optimizers)
    if not counts:
        raise InputError("empty list", key="--gpus")
    plan = StepsPlan.parse(steps)
    base = choose_baseline(scenario.training.optimizer, baseline)
    warmup_fraction(scenario, plan and plan.of(scenario.training.optimizer, base), warmup)
    compared = list(dict.fromkeys([base, *optimizers]))
    # options that would change nothing are refused, not ignored: steps for an optimizer not compared,
    # a warmup fraction where no compared optimizer has a warmup stage (1-bit Adam's full-precision one)
    if plan is not None and (others := [name for name, _ in plan.per if name not in compared]):
        raise InputError(
            f"{', '.join(others)} given steps but not compared (the optimizers: {', '.join(compared)})",
            key="--steps",
        )
    if warmup is not None and all(registry.get(o).warmup_options({}) is None for o in compared):
        raise InputError(
            f"{warmup:g}: none of {', '.join(compared)} has a warmup stage (1-bit Adam's); nothing to apply "
            "it to",
            key="--warmup",
        )
    if global_batch is not None and not 0 < global_batch <= MAX_COUNT:
        raise InputError(f"{global_batch}: a positive number of samples up to 2^53", key="--global-batch")
    at = max(counts) if break_even_at is None else break_even_at
    if break_even_at is not None and break_even_at < 0:
        raise InputError(f"{at}: a GPU count, or 0 to skip the break-even", key="--break-even-at")
    for g, key in [(g, "--gpus") for g in counts] + ([(at, "--break-even-at")] if at else []):
        if g <= 0:
            raise InputError(f"GPU counts must be positive, got {g}", key=key)
        try:
            sized = scenario.with_world_size(g)
            if global_batch:
                split_global_batch(sized, global_batch, key="--global-batch")
        except InputError as exc:
            raise InputError(
                f"{g}: {exc.message}",
                key="--global-batch" if global_batch and exc.key == "--global-batch" else key,
            ) from None
    return CompareRequest(([] if base in optimizers else [base]) + list(optimizers), plan, base, at)


def compare(
    scenario: Scenario,
    optimizers: list[str],
    gpu_counts: list[int],
    steps: "int | str | StepsPlan | None" = None,
    warmup: float | None = None,
    profile=None,
    progress=None,
    samples: int = 0,
    baseline: str | None = None,
    global_batch: int | None = None,
) -> list[CompareRow]:
    """One row per GPU count and optimizer, speedups over ``baseline`` (``choose_baseline``; simulated
    first when not among ``optimizers``). ``global_batch`` fixes the samples per step at every count.
    The arguments are checked as :func:`check_request` checks them (callers that want the errors before
    other work call it first)."""
    request = check_request(scenario, optimizers, gpu_counts, steps, baseline, warmup, global_batch, 0)
    plan, base_name, optimizers = request.plan, request.baseline, request.optimizers
    if isinstance(profile, str):
        # a bad profile is every cell's error: refused once, naming its file and key, not as each cell's
        # reason without them ("no optimizer ... could be simulated: Input should be a finite number")
        from clustersim.calibration.profile import load_profile

        load_profile(profile)
    w = warmup_fraction(scenario, plan and plan.of(scenario.training.optimizer, base_name), warmup)
    rows: list[CompareRow] = []
    for gpus in gpu_counts:
        sized = scenario.with_world_size(gpus)
        if global_batch:
            sized = split_global_batch(sized, global_batch, key="--global-batch")
        per_opt: dict[str, CompareRow] = {}
        scenarios: dict[str, Scenario] = {}
        for name in optimizers:
            n = plan and plan.of(name, base_name)
            try:  # an optimizer the scenario's sharding refuses fails its cell only
                s = scenario_for_optimizer(sized, name, n)
                per_opt[name], scenarios[name] = _fitting_row(
                    s, gpus, name, n, w, profile, bool(global_batch)
                )
            except InputError as exc:  # this cell only: the rest of the table still prints
                per_opt[name] = CompareRow.failed(gpus, name, exc.message)
            if progress:
                progress()
        base = per_opt[base_name]
        for row in per_opt.values():
            if row.error is None and base.error is None:
                row.speedup = base.iteration_time_s / row.iteration_time_s
                if plan:
                    row.time_to_train_speedup = base.time_to_train_s / row.time_to_train_s
            rows.append(row)
        if samples > 0 and base_name in scenarios:
            _add_bands(per_opt, scenarios, base_name, profile, samples, plan, w)
    return rows


def _add_bands(per_opt, scenarios, base_name, profile, samples, plan, w) -> None:
    for name, s in scenarios.items():
        band = paired_band(scenarios[base_name], s, profile, samples, plan, w)
        row = per_opt[name]
        row.iteration_time_p10_s, row.iteration_time_p90_s = band["iteration"]
        row.speedup_p10, row.speedup_p90 = band["speedup"]
        if plan:
            row.time_to_train_speedup_p10, row.time_to_train_speedup_p90 = band["ttt_speedup"]


def _fitting_row(
    s: Scenario, gpus, name, steps, w, profile, fixed_batch: bool
) -> tuple[CompareRow, Scenario]:
    """The cell, and the scenario it ran. With a fixed global batch a micro-batch that does not fit in
    GPU memory is halved (accumulating more steps, the same samples per step), as sweep and plan do, and
    the cell's notes say so."""
    asked = s.workload.micro_batch
    row, s = fit_micro_batch(s, lambda t: _row(t, gpus, name, steps, w, profile), fixed_batch)
    if s.workload.micro_batch != asked:
        row.notes.append(
            f"micro-batch {asked} does not fit in GPU memory: it runs as micro-batch "
            f"{s.workload.micro_batch} x {s.workload.gradient_accumulation} accumulation steps "
            "(the global batch is kept)"
        )
    return row, s


def _row(s: Scenario, gpus: int, name: str, steps: int | None, w: float, profile) -> CompareRow:
    r = simulate(s, profile)
    b = r.breakdown
    row = CompareRow(
        gpus=gpus,
        optimizer=name,
        iteration_time_s=r.iteration_time,
        compute_s=b["forward"] + b["backward"],
        exposed_communication_s=b["exposed_communication"] + b["exposed_transfer"],
        exposed_host_s=b["exposed_host"],
        compression_s=b["compression"],
        optimizer_s=b["optimizer"] + b["other"],
        idle_s=b["idle"],
        samples_per_s=r.samples_per_s,
        speedup=None,
        intra_node_bytes=r.bytes_per_link_kind["intra_node_per_node"],
        inter_node_bytes=r.bytes_per_link_kind["inter_node_per_node"],
        steps=steps,
        notes=list(r.notes),
        mfu=(r.extra.get("model_flops") or {}).get("mfu"),
        tokens_per_s_per_gpu=(r.extra.get("model_flops") or {}).get("tokens_per_s_per_gpu"),
    )
    warm_opts = registry.get(name).warmup_options(s.training.optimizer_options)
    if warm_opts is not None:
        warm = simulate(s.with_changes(**{"training.optimizer_options": warm_opts}), profile)
        row.warmup_iteration_time_s = warm.iteration_time
    if steps:
        row.time_to_train_s = steps * mean_step_time(
            name, row.iteration_time_s, row.warmup_iteration_time_s, w
        )
    return row


def paired_band(
    baseline: Scenario,
    other: Scenario,
    profile,
    samples: int,
    steps: "StepsPlan | None" = None,
    warmup: float | None = None,
    seed: int = 0,
) -> dict[str, tuple[float, float]]:
    """P10-P90 of ``other``'s step, of its step speedup over ``baseline`` and (with ``steps``) of its
    time-to-train speedup, draw by draw under the same parameter draws (simulator/uncertainty.py): what
    is uncertain about the hardware moves both, so only what differs between them widens the band. An
    optimizer with a warmup stage (1-bit Adam) has that stage simulated under the same draws too."""
    from clustersim.simulator.runner import paired_times

    name, base_name = other.training.optimizer, baseline.training.optimizer
    scenarios = [baseline, other]
    warm_opts = registry.get(name).warmup_options(other.training.optimizer_options)
    if warm_opts is not None:
        scenarios.append(other.with_changes(**{"training.optimizer_options": warm_opts}))
    times = paired_times(scenarios, profile, samples, seed)
    tb, to = times[0], times[1]
    out = {
        "iteration": _p10_p90(to),
        "speedup": _p10_p90(tb / to),
    }
    if steps is not None:
        warm = times[2] if warm_opts is not None else None
        w = DEFAULT_WARMUP if warmup is None else warmup
        per_step = to if warm is None else w * warm + (1 - w) * to
        ratio = steps.of(base_name, base_name) * tb / (steps.of(name, base_name) * per_step)
        out["ttt_speedup"] = _p10_p90(ratio)
    return out


def _p10_p90(draws) -> tuple[float, float]:
    """The draws' P10-P90 as every band is read (uncertainty.Interval.of)."""
    from clustersim.simulator.uncertainty import Interval

    iv = Interval.of(draws)
    return iv.p10, iv.p90


def comparison_as_json(
    rows: list[CompareRow],
    baseline: str,
    global_batch: int | None,
    evens: list,
    why_no_break_even: str | None,
    break_even_gpus: int | None,
    costs: list[dict] | None = None,
    cost_error: str | None = None,
    checked: list[dict] | None = None,
) -> dict:
    """``clustersim compare --json``'s document, which the API's ``Comparison.to_dict()`` returns too.
    ``costs``: each cell's cost to train (report.costing.price_compare_rows), given steps; empty without
    them, and ``cost_error`` says why where the default cost model cannot price the cluster's GPU.
    ``checked``: how far each compressed optimizer's speedups are checked (validation.speedup_checks)."""
    return {
        "baseline": baseline,
        "global_batch": global_batch,
        "rows": [r.to_dict() for r in rows],
        "break_even": [b.to_dict() | {"gpus": break_even_gpus} for b in evens],
        "break_even_error": why_no_break_even,
        "costs": costs or [],
        "cost_error": cost_error,
        "speedups_checked": checked or [],
        "notes": notes_by_cells(rows),
    }
