"""Compare optimizers across GPU counts: iteration split, throughput, bytes, time-to-train.

Time-to-train over N steps: the baselines and BinSGDM run every step alike; 1-bit Adam runs its first
``w·N`` steps in the warmup stage (full-precision Adam) and the rest compressed; 0/1 Adam's average
step already weighs its schedule over ``total_steps = N``. With a warmup step as fast as the
baseline's, the end-to-end speedup is 1 / (w + (1 - w)/s) for a compression-stage speedup s.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from clustersim.errors import InputError
from clustersim.scenario import Scenario
from clustersim.simulator import simulate
from clustersim.simulator.strategies import registry

DEFAULT_WARMUP = 0.15  # the 1-bit Adam paper's BERT-Large setting (15-25% recommended)


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
    error: str | None = None
    idle_s: float | None = None  # nothing running: a pipeline's bubble on its critical stage

    @classmethod
    def failed(cls, gpus: int, optimizer: str, error: str) -> "CompareRow":
        return cls(gpus, optimizer, *([None] * 9), error=error)

    def as_dict(self) -> dict:
        return asdict(self)


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
    """The scenario with another optimizer (its options reset, 0/1 Adam's schedule fitted to ``steps``)."""
    opts = dict(scenario.training.optimizer_options) if scenario.training.optimizer == optimizer else {}
    opts = registry.get(optimizer).run_options(opts, steps)
    opts.update(extra)
    return scenario.with_changes(**{"training.optimizer": optimizer, "training.optimizer_options": opts})


def baseline_of_list(optimizers: list[str]) -> str:
    """What speedups are measured against: the first baseline optimizer given (Adam, SGD-momentum),
    else the first optimizer."""
    return next((n for n in optimizers if registry.get(n).baseline is None), optimizers[0])


def compare(
    scenario: Scenario,
    optimizers: list[str],
    gpu_counts: list[int],
    steps: int | None = None,
    warmup: float | None = None,
    profile=None,
    progress=None,
    samples: int = 0,
) -> list[CompareRow]:
    if not optimizers:
        raise InputError("no optimizers given", key="--optimizers")
    for name in optimizers:
        try:
            registry.get(name)
        except InputError as exc:
            raise InputError(exc.message, key="--optimizers") from None
    if steps is not None and steps <= 0:
        raise InputError(f"steps must be positive, got {steps}", key="--steps")
    w = warmup_fraction(scenario, steps, warmup)
    baseline = baseline_of_list(optimizers)
    rows: list[CompareRow] = []
    for gpus in gpu_counts:
        if gpus <= 0:
            raise InputError(f"GPU counts must be positive, got {gpus}", key="--gpus")
        sized = scenario.with_world_size(gpus)
        per_opt: dict[str, CompareRow] = {}
        scenarios: dict[str, Scenario] = {}
        for name in optimizers:
            try:  # an optimizer the scenario's sharding refuses fails its cell only
                s = scenario_for_optimizer(sized, name, steps)
                per_opt[name] = _row(s, gpus, name, steps, w, profile)
                scenarios[name] = s
            except InputError as exc:  # this cell only: the rest of the table still prints
                per_opt[name] = CompareRow.failed(gpus, name, exc.message)
            if progress:
                progress()
        base = per_opt[baseline]
        if samples > 0 and baseline in scenarios:
            _add_bands(per_opt, scenarios, baseline, profile, samples)
        for row in per_opt.values():
            if row.error is None and base.error is None:
                row.speedup = base.iteration_time_s / row.iteration_time_s
                if steps:
                    row.time_to_train_speedup = base.time_to_train_s / row.time_to_train_s
            rows.append(row)
    return rows


def _row(s: Scenario, gpus: int, name: str, steps: int | None, w: float, profile) -> CompareRow:
    r = simulate(s, profile)
    b = r.breakdown
    row = CompareRow(
        gpus=gpus,
        optimizer=name,
        iteration_time_s=r.iteration_time,
        compute_s=b["forward"] + b["backward"],
        exposed_communication_s=b["exposed_communication"] + b["exposed_transfer"] + b["exposed_host"],
        compression_s=b["compression"],
        optimizer_s=b["optimizer"] + b["other"],
        idle_s=b["idle"],
        samples_per_s=r.samples_per_s,
        speedup=None,
        intra_node_bytes=r.bytes_per_link_kind["intra_node_per_node"],
        inter_node_bytes=r.bytes_per_link_kind["inter_node_per_node"],
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


def _add_bands(
    per_opt: dict[str, CompareRow], scenarios: dict[str, Scenario], baseline: str, profile, samples: int
) -> None:
    """P10-P90 of each optimizer's step and of its speedup, all under the same parameter draws."""
    import numpy as np

    from clustersim.simulator.runner import paired_times
    from clustersim.simulator.uncertainty import QUANTILES

    names = list(scenarios)
    times = paired_times([scenarios[n] for n in names], profile, samples)
    base = times[names.index(baseline)]
    for i, name in enumerate(names):
        row = per_opt[name]
        lo, _, hi = np.quantile(times[i], QUANTILES)
        row.iteration_time_p10_s, row.iteration_time_p90_s = float(lo), float(hi)
        slo, _, shi = np.quantile(base / times[i], QUANTILES)
        row.speedup_p10, row.speedup_p90 = float(slo), float(shi)


def break_evens(scenario: Scenario, optimizers: list[str], gpus: int, profile=None, samples: int = 8) -> list:
    """Break-even NIC bandwidth (breakeven.py) of each compressed optimizer against its baseline, at
    ``gpus`` GPUs: Adam for the Adam family, SGD with momentum for BinSGDM."""
    from clustersim.breakeven import break_even

    sized = scenario.with_world_size(gpus)
    out = []
    for name in optimizers:
        base = registry.get(name).baseline
        if base is None:
            continue
        comp = scenario_for_optimizer(sized, name, None)
        out.append(break_even(comp, scenario_for_optimizer(sized, base, None), profile, samples))
    return out
