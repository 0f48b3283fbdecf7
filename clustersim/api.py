"""The Python API: what the CLI's commands do, as functions that return plain result objects.

``from clustersim import load_scenario, simulate, compare, sweep, plan`` is the stable surface (see
docs/api.md). Each result has ``to_dict()`` (the shape the command's ``--json`` prints) and, when
pandas is installed, ``to_dataframe()`` (one row per breakdown part, comparison cell, sweep row or
plan candidate). The functions are thin: validation, errors (:class:`clustersim.errors.InputError`,
naming the file and key) and numbers are the same as the CLI's, which calls the same modules.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from clustersim.errors import InputError
from clustersim.scenario import Scenario, validate_scenario
from clustersim.scenario import load_scenario as _load_ref
from clustersim.simulator import simulate as _simulate
from clustersim.simulator.result import SimulationResult

# The optimizers `compare` puts side by side when none are named: the CLI's default.
DEFAULT_OPTIMIZERS = ("adam", "onebit-adam", "zero-one-adam", "binsgdm")
# Draws of the uncertain parameters per band: every command's default (simulator.uncertainty).
DEFAULT_SAMPLES = 32
# The most draws a band takes: every command's --samples limit (commands/support.SamplesOpt).
MAX_SAMPLES = 1000


def _dataframe(records: list[dict[str, Any]]):
    try:
        import pandas as pd
    except ImportError:  # an optional extra, said in one line
        raise ImportError("to_dataframe() needs pandas: pip install 'clustersim[dataframe]'") from None
    return pd.DataFrame.from_records(records)


def load_scenario(source: str | Path | dict | Scenario, changes: dict[str, Any] | None = None) -> Scenario:
    """A validated scenario from ``preset:NAME``, a YAML/JSON file, or a mapping in the file's schema;
    ``changes`` replaces dotted keys (``{"cluster.nodes": 4, "training.optimizer": "binsgdm"}``)."""
    if isinstance(source, Scenario):
        scenario = source
    elif isinstance(source, dict):
        scenario = validate_scenario(source, source="<dict>")
    else:
        scenario = _load_ref(_scenario_ref(source))
    return scenario.with_changes(**_changes(changes)) if changes is not None else scenario


def _scenario_ref(source: Any) -> str:
    """``preset:NAME`` or a file path, as a string; anything else (None, a number, bytes, an empty
    string) is an InputError that says what a scenario may be, not "None: file not found"."""
    kinds = "preset:NAME, a YAML/JSON file path, a mapping or a Scenario"
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if not isinstance(source, str):
        raise InputError(f"expected {kinds}, got {_brief(source)}", key="scenario")
    if not source.strip():
        raise InputError(f"expected {kinds}, got an empty string", key="scenario")
    return source


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _changes(changes: Any) -> dict[str, Any]:
    """``changes`` as a mapping of dotted keys to values: a list of pairs or "key=value" text (the CLI's
    --set) is refused by name, not a TypeError from inside."""
    if not isinstance(changes, Mapping):
        raise InputError(
            f'expected a mapping of dotted keys to values ({{"cluster.nodes": 4}}), got {_brief(changes)}',
            key="changes",
        )
    for key in changes:
        if not isinstance(key, str):
            raise InputError(f"expected dotted keys (strings), got {_brief(key)}", key="changes")
    return dict(changes)


def _path(value: Any, argument: str) -> str | None:
    """A file or folder argument: None, a string or a pathlib.Path, as a string; anything else is an
    InputError naming the argument."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise InputError(f"expected a path (str or pathlib.Path), got {_brief(value)}", key=argument)


def _profile(value: Any) -> Any:
    """``profile``: a path (str or pathlib.Path), ``builtin:NAME`` or a loaded Profile."""
    from clustersim.calibration.profile import Profile

    return value if isinstance(value, Profile) else _path(value, "profile")


@dataclass
class Simulation:
    """One simulated iteration. The fields most users want are properties; ``result`` is the full
    :class:`~clustersim.simulator.result.SimulationResult` (buckets, memory, op records, trace)."""

    scenario: Scenario
    result: SimulationResult

    @property
    def iteration_time_s(self) -> float:
        return self.result.iteration_time

    @property
    def samples_per_s(self) -> float:
        return self.result.samples_per_s

    @property
    def breakdown_s(self) -> dict[str, float]:
        """Where the iteration goes, in seconds; the parts add up to the iteration time."""
        return dict(self.result.breakdown)

    @property
    def p10_p90_s(self) -> tuple[float, float] | None:
        """The iteration time's P10-P90 band, when simulated with ``samples`` > 0."""
        iv = self.result.interval
        return None if iv is None else (iv.p10, iv.p90)

    def to_dict(self) -> dict[str, Any]:
        return self.result.to_dict()

    def to_dataframe(self):
        """The breakdown: one row per part, with its seconds and share of the iteration."""
        total = self.result.iteration_time
        return _dataframe(
            [
                {"part": k, "seconds": v, "share": v / total if total else 0.0}
                for k, v in self.breakdown_s.items()
            ]
        )

    def write_trace(self, path: str | Path) -> None:
        """A Chrome/Perfetto trace of the iteration, as ``run --trace`` writes it."""
        if _path(path, "path") is None:
            raise InputError("expected a path (str or pathlib.Path), got None", key="path")
        self.result.write_trace(Path(path))


def simulate(
    scenario: str | Path | dict | Scenario, profile: str | None = None, samples: int = 0
) -> Simulation:
    """One training iteration of ``scenario`` (anything :func:`load_scenario` takes); ``profile`` a
    calibration profile (path or ``builtin:NAME``); ``samples`` > 0 adds the P10-P90 band from that many
    draws of the uncertain parameters (the CLI's ``run`` uses 32)."""
    _samples(samples)
    profile = _profile(profile)
    s = load_scenario(scenario)
    return Simulation(s, _simulate(s, profile, uncertainty_samples=samples))


@dataclass
class Comparison:
    """Optimizers side by side per GPU count: the cells of ``clustersim compare``'s table, and each
    compressed optimizer's break-even NIC bandwidth against the baseline. A cell that could not be
    simulated (out of GPU memory, say) has ``error`` set and no numbers."""

    rows: list[Any]
    optimizers: list[str]
    gpu_counts: list[int]
    baseline: str = ""
    global_batch: int | None = None
    #: planner.breakeven.BreakEven per compressed optimizer, at ``break_even_gpus`` GPUs
    break_even: list[Any] = field(default_factory=list)
    break_even_gpus: int | None = None
    #: why there is no break-even (the scenario cannot be simulated at that count); None otherwise
    break_even_error: str | None = None
    #: given steps: each simulated cell's cost to train, its P10-P90 and the cost model that priced it
    #: (report.costing.price_compare_rows), as compare's table prints them
    costs: list[dict[str, Any]] = field(default_factory=list)
    #: why ``costs`` is empty although steps were given (the default model cannot price the GPU)
    cost_error: str | None = None
    #: per compressed optimizer, how far its speedups are checked against published ones and whether
    #: these GPU counts and this network lie inside that (validation.speedup_checks.notes)
    speedups_checked: list[dict[str, Any]] = field(default_factory=list)

    def row(self, optimizer: str, gpus: int):
        """The cell of one optimizer at one GPU count."""
        for r in self.rows:
            if r.optimizer == optimizer and r.gpus == gpus:
                return r
        raise KeyError(f"no cell for {optimizer} at {gpus} GPUs")

    @property
    def notes(self) -> list[str]:
        """What the simulations said of the scenario (a key its model does not use, ...), each once;
        a note of only some cells names them."""
        from clustersim.planner.compare import notes_by_cells

        return notes_by_cells(self.rows)

    def to_dict(self) -> dict[str, Any]:
        """What ``clustersim compare --json`` prints."""
        from clustersim.planner.compare import comparison_as_json

        return comparison_as_json(
            self.rows,
            self.baseline,
            self.global_batch,
            self.break_even,
            self.break_even_error,
            self.break_even_gpus,
            self.costs,
            self.cost_error,
            self.speedups_checked,
        )

    def to_dataframe(self):
        return _dataframe([r.to_dict() for r in self.rows])


def _as_argument(exc: InputError) -> InputError:
    """``exc`` keyed by the keyword argument the caller gave, not by the CLI option it stands for."""
    key = exc.key.removeprefix("--").replace("-", "_") if exc.key and exc.key.startswith("--") else exc.key
    return InputError(exc.message, source=exc.source, key=key)


def _count(value: Any, argument: str, least: int = 1) -> int:
    """A whole number >= ``least`` given to the API (not a bool, a float or a string)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InputError(f"expected a whole number of at least {least}, got {value!r}", key=argument)
    return value


def _samples(value: Any) -> int:
    """``samples`` as every function takes it: a whole number of draws, 0 (no band) or 2 to MAX_SAMPLES,
    as the commands' --samples; 1, 2.5, "8" or -1 is an InputError naming it, before any work is done."""
    from clustersim.simulator.uncertainty import draws_refusal

    _count(value, "samples", least=0)
    if value > MAX_SAMPLES:
        raise InputError(f"at most {MAX_SAMPLES} draws, got {value}", key="samples")
    if why := draws_refusal(value):
        raise InputError(why, key="samples")
    return value


def _check_compare_types(optimizers, gpus, samples, baseline, global_batch, break_even_at, steps, warmup):
    """What typer checks for the command, checked for a Python caller: each wrong type or range is an
    InputError naming the keyword argument, never a TypeError from deep inside."""
    if isinstance(optimizers, str) or not isinstance(optimizers, Iterable):
        raise InputError("expected a list of optimizer names", key="optimizers")
    if any(not isinstance(o, str) for o in optimizers):
        raise InputError("expected optimizer names (strings)", key="optimizers")
    if gpus is not None:
        if isinstance(gpus, str) or not isinstance(gpus, Iterable):
            raise InputError("expected a list of GPU counts", key="gpus")
        for g in gpus:
            _count(g, "gpus")
    _samples(samples)
    if baseline is not None and not isinstance(baseline, str):
        raise InputError("expected an optimizer name", key="baseline")
    if global_batch is not None:
        _count(global_batch, "global_batch")
    if break_even_at is not None:
        _count(break_even_at, "break_even_at", least=0)
    if isinstance(steps, bool):
        raise InputError("expected a step count, a mapping per optimizer or the command's text", key="steps")
    if warmup is not None and (isinstance(warmup, bool) or not isinstance(warmup, int | float)):
        raise InputError(f"expected a fraction in [0, 1), got {warmup!r}", key="warmup")


def compare(
    scenario: str | Path | dict | Scenario,
    optimizers: Iterable[str] = DEFAULT_OPTIMIZERS,
    gpus: Iterable[int] | None = None,
    *,
    profile: str | None = None,
    samples: int = DEFAULT_SAMPLES,
    baseline: str | None = None,
    global_batch: int | None = None,
    break_even_at: int | None = None,
    steps: "int | str | dict[str, int] | None" = None,
    warmup: float | None = None,
    cost: str | None = None,
    instance: str | None = None,
) -> Comparison:
    """``clustersim compare``: each optimizer at each GPU count (default: the scenario's own), with
    speedups over the baseline (the scenario's uncompressed optimizer, or ``baseline``) and their paired
    P10-P90 (``samples`` draws; 0 turns bands off), and each compressed optimizer's break-even NIC
    bandwidth at ``break_even_at`` GPUs (default: the largest count; 0 skips it). ``global_batch``
    keeps the samples per step the same at every count; ``steps`` (a count, a mapping per optimizer or
    the command's text) and ``warmup`` give the time to train, as the command's options do; given steps,
    ``costs`` prices each cell's run by ``cost`` ("own" or "rent", with ``instance`` an instance type),
    by default owned where the ownership catalog prices the GPU, else rented, as the command does."""
    from clustersim.planner.breakeven import break_evens_or_reason
    from clustersim.planner.compare import check_request
    from clustersim.planner.compare import compare as _compare
    from clustersim.report.costing import compare_costs, refuse_costs_without_steps

    # read once: a generator is used up by the first pass over it
    if isinstance(optimizers, Iterable) and not isinstance(optimizers, str):
        optimizers = list(optimizers)
    if isinstance(gpus, Iterable) and not isinstance(gpus, str):
        gpus = list(gpus)
    _check_compare_types(optimizers, gpus, samples, baseline, global_batch, break_even_at, steps, warmup)
    profile = _profile(profile)
    s = load_scenario(scenario)
    names = optimizers
    counts = [s.cluster.world_size] if gpus is None else list(dict.fromkeys(gpus))  # each count once
    try:
        request = check_request(s, names, counts, steps, baseline, warmup, global_batch, break_even_at)
        base, at = request.baseline, request.break_even_at
        refuse_costs_without_steps(request.plan, cost=cost, instance=instance)
        rows = _compare(
            s, names, counts, steps, warmup, profile, samples=samples, baseline=base,
            global_batch=global_batch,
        )  # fmt: skip
        evens, why_none = break_evens_or_reason(
            s, names, at, profile, samples, base, global_batch, request.plan, warmup
        )
        priced, cost_error = compare_costs(s, rows, cost, instance) if request.plan else ([], None)
    except InputError as exc:
        raise _as_argument(exc) from None
    from clustersim.validation.speedup_checks import notes as checked_notes

    checked = checked_notes(s, names, counts)
    return Comparison(
        rows, names, counts, base, global_batch, evens, at or None, why_none, priced, cost_error, checked
    )


@dataclass
class SweepResults:
    """A finished sweep's folder: what was swept (``meta``, sweep.json) and one dict per row
    (results.csv, typed), invalid combinations included with their reason."""

    out: Path
    meta: dict[str, Any]
    rows: list[dict[str, Any]]
    counts: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # e.g. an axis that no row's model uses

    def to_dict(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            **self.counts,
            "meta": self.meta,
            "rows": self.rows,
            "notes": self.notes,
        }

    def to_dataframe(self):
        """One row per sweep row; a column of counts stays whole numbers (pandas' nullable Int64 where
        invalid rows leave it empty), not floats."""
        frame = _dataframe(self.rows)
        for column in frame.columns:
            if frame[column].dtype.kind != "f":  # int64 already, or text
                continue
            values = [r[column] for r in self.rows if r.get(column) is not None]
            if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                frame[column] = frame[column].astype("Int64")  # counts with gaps, not 1.0 and NaN
        return frame


def sweep(
    sweep_file: str | Path,
    out: str | Path,
    *,
    workers: int | None = None,
    scheduler: str | None = None,
    profile: str | None = None,
    samples: int | None = None,
) -> SweepResults:
    """``clustersim sweep``: run the rows of ``sweep_file`` not yet in the results folder ``out``
    (created; a re-run resumes it) on ``workers`` processes (default one per core) or a Dask
    ``scheduler``, and read the folder back."""
    from clustersim.sweeps.run import default_workers, run_sweep
    from clustersim.sweeps.spec import load_sweep
    from clustersim.sweeps.store import read_results

    if samples is not None:  # None: the sweep file's own `samples`, checked with the file
        _samples(samples)
    if workers is not None:  # as --workers: 1 or more (None: one per core)
        _count(workers, "workers")
    if scheduler is not None and not isinstance(scheduler, str):
        raise InputError(
            f"expected a scheduler address (tcp://HOST:PORT), got {_brief(scheduler)}", key="scheduler"
        )
    sweep_file = _path(sweep_file, "sweep_file")
    out = _path(out, "out")
    if sweep_file is None or out is None:
        raise InputError(
            "expected a path (str or pathlib.Path), got None", key="out" if out is None else "sweep_file"
        )
    profile = _profile(profile)
    sw = load_sweep(sweep_file, profile=profile, samples=samples)
    with sw.catalogs_in_use():
        notes = sw.unused_axes()
        counts = run_sweep(sw, Path(out), scheduler, workers or default_workers())
    meta, rows = read_results(Path(out))
    return SweepResults(Path(out), meta, rows, counts, notes)


@dataclass
class Plan:
    """``clustersim plan``'s answer: the chosen candidate (None when nothing meets the constraints), the
    runners-up, the fastest, the recommendation's text, and counts of what was simulated."""

    summary: dict[str, Any]

    @property
    def chosen(self) -> dict[str, Any] | None:
        """The chosen candidate by its own numbers (plain data: ``json.dumps`` takes it), as
        ``to_dict()["chosen"]``; None when nothing meets the constraints."""
        return self.to_dict()["chosen"]

    @property
    def runners_up(self) -> list[dict[str, Any]]:
        return self.to_dict()["runners_up"]

    @property
    def fastest(self) -> dict[str, Any] | None:
        """The fastest candidate of all, whatever it costs (``to_dict()["fastest"]``)."""
        return self.to_dict()["fastest"]

    @property
    def fastest_within(self) -> dict[str, Any] | None:
        """The fastest candidate that meets the deadline and the budget (the text's "Fastest within the
        budget"); None when none does."""
        return self.to_dict()["fastest_within"]

    @property
    def text(self) -> list[str]:
        return self.summary["text"]

    def to_dict(self) -> dict[str, Any]:
        """What ``clustersim plan --json`` prints: plain data, each candidate by its own numbers."""
        from clustersim.planner.planning import plan_as_json

        return plan_as_json(self.summary)

    def to_dataframe(self):
        """The chosen candidate and the runners-up, one row each, ``role`` saying which."""
        rows = [{"role": "chosen", **self.chosen}] if self.chosen else []
        rows += [{"role": "runner-up", **r} for r in self.runners_up]
        return _dataframe(rows)


@dataclass
class HavePlan:
    """``clustersim plan --have``'s answer: what to do with the cluster you own (keep it, upgrade its NICs,
    add nodes, rent), each option with its capital, time to train and payback; ``recommended`` the one
    to take (None when no option meets the deadline and budget)."""

    summary: dict[str, Any]

    @property
    def recommended(self) -> Any:
        return self.summary["recommended"]

    @property
    def options(self) -> list[dict[str, Any]]:
        return self.summary["options"]

    def to_dict(self) -> dict[str, Any]:
        """What ``clustersim plan --have FILE --json`` prints."""
        return self.summary

    def to_dataframe(self):
        return _dataframe(self.options)


def _deadline_hours(deadline: Any) -> float:
    """``deadline`` as the CLI's --deadline takes it: a duration with its unit ("30d", "720h", "90m",
    "2w") or a ``datetime.timedelta``. A bare number is refused, as the command refuses one: 30 read as
    hours was a 30-day deadline typed without its unit, silently 24 times shorter."""
    from clustersim.report.build import check_duration_hours, parse_duration

    if isinstance(deadline, datetime.timedelta):
        return check_duration_hours(deadline.total_seconds() / 3600, repr(deadline), key="deadline")
    if isinstance(deadline, str):
        return parse_duration(deadline, key="deadline")
    raise InputError(
        f'must be a duration with its unit ("30d", "720h") or a datetime.timedelta, got {deadline!r} '
        "(a bare number is ambiguous: hours or days?)",
        key="deadline",
    )


def _whole(value: Any, argument: str) -> Any:
    """A count given to the API as the CLI takes it: an int, a float with no fraction (300e9) or the
    command's text ("300e9"); anything else is passed on for the command's own check to refuse."""
    from clustersim.units import parse_count

    if isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return parse_count(repr(value), argument)
    if isinstance(value, str):
        return parse_count(value, argument)
    return value


def _budget(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise InputError(f"budget must be positive and finite, got {value!r}", key="budget")
    return float(value)


def plan(
    model: str,
    steps: "int | str | dict[str, int] | None",
    deadline: "str | datetime.timedelta",
    *,
    tokens: "int | float | str | None" = None,
    budget: float | None = None,
    candidates: str | Path | None = None,
    global_batch: int | None = None,
    price: float | None = None,
    baseline: str | None = None,
    network_prices: str | None = None,
    cost: str | None = None,
    instance: str | None = None,
    instances: str | None = None,
    own_prices: str | None = None,
    have: str | Path | None = None,
    catalog: "str | Path | list[str | Path] | None" = None,
    profile: str | None = None,
    samples: int = DEFAULT_SAMPLES,
) -> "Plan | HavePlan":
    """``clustersim plan``: the cheapest candidate cluster, optimizer and layout that trains ``model``
    for ``steps`` steps (a count, a mapping per optimizer or the command's text) of ``global_batch``
    samples within ``deadline`` (``"5d"``, ``"72h"`` or a ``datetime.timedelta``; a bare number is
    refused) and ``budget`` (USD). ``candidates`` is a sweep file (default: the built-in grid).
    ``tokens`` instead of ``steps`` (give None): tokens / (global batch x sequence length) steps.
    The other keyword arguments are the command's options of the same names (``network_prices`` is
    --network-prices, ``catalog`` one or more --catalog files); ``have`` (the cluster you own) answers
    with a :class:`HavePlan`, as ``plan --have`` does. Errors name the argument, not the option."""
    from clustersim.catalog import user_catalogs
    from clustersim.planner.planning import plan as _plan
    from clustersim.planner.upgrades import plan_have
    from clustersim.report.costing import have_models, model_from_options, network_option

    _samples(samples)
    if not isinstance(model, str) or not model.strip():
        raise InputError(f"expected a model name (a string), got {_brief(model)}", key="model")
    if global_batch is not None:
        _count(global_batch, "global_batch")
    hours = _deadline_hours(deadline)
    budget = _budget(budget)
    if catalog is not None and isinstance(catalog, str | os.PathLike):
        catalog = [catalog]
    if catalog is not None and not isinstance(catalog, list | tuple):
        raise InputError(
            f"expected a catalog path or a list of them, got {_brief(catalog)}",
            key="catalog",
        )
    catalogs = None if catalog is None else [Path(_path(c, "catalog")) for c in catalog]
    candidates, have, profile = _path(candidates, "candidates"), _path(have, "have"), _profile(profile)
    network_prices, instances = _path(network_prices, "network_prices"), _path(instances, "instances")
    own_prices = _path(own_prices, "own_prices")
    path = None if candidates is None else Path(candidates)
    try:
        tokens = _whole(tokens, "tokens")
        if price is not None:
            from clustersim.catalog import beyond

            if isinstance(price, bool) or not isinstance(price, int | float) or not 0 < price < float("inf"):
                raise InputError(f"expected a finite positive number, got {price!r}", key="price")
            if why := beyond(price, "price_per_gpu_hour", "USD per GPU-hour", "any real price"):
                raise InputError(why, key="price")
        with user_catalogs(catalogs):
            if have is not None:
                own, rent = have_models(
                    network_prices, instances, own_prices, cost=cost, price=price, instance=instance
                )
                summary = plan_have(
                    model, steps, Path(have), path, global_batch, own, rent, samples,
                    deadline_h=hours, budget=budget, tokens=tokens, baseline=baseline,
                )  # fmt: skip
                return HavePlan(summary)
            summary = _plan(
                model, steps, hours, budget, path, global_batch, price,
                profile=profile, samples=samples, tokens=tokens, baseline=baseline,
                network=network_option(network_prices),
                costs=model_from_options(cost, price, network_prices, instance, instances, own_prices),
            )  # fmt: skip
    except InputError as exc:
        raise _as_argument(exc) from None
    return Plan(summary)
