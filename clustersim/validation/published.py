"""Compare predictions with published measurements (data files in this folder)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from clustersim.errors import InputError
from clustersim.io import load_yaml
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate

Metric = Literal[
    "samples_per_s",
    "tflops_per_gpu",
    "tokens_per_s_per_gpu",
    "iteration_time",
    "speedup",
    "slowdown",
    "compute_utilization",
]

# metrics that compare the row's run with a baseline run (the same draws for both)
RATIO_METRICS = ("speedup", "slowdown")
# metrics where more is faster: validate's tables turn their error's sign, so that every row's error
# reads the same way, + predicted too slow (a step too long, a rate too low), - predicted too fast
RATE_METRICS = ("samples_per_s", "tflops_per_gpu", "tokens_per_s_per_gpu", "compute_utilization")


def slowness(error: float, metric: str) -> float:
    """A row's error (predicted - published) / published with the sign of 'predicted too slow', as
    validate's tables print it: turned for rates (RATE_METRICS), kept for times; a speedup's is kept
    (a ratio of two runs, said apart). ``--json`` gives it as ``slowness_error`` beside the raw
    ``error``."""
    return -error if metric in RATE_METRICS else error


class Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    optimizer: str
    gpus: int = Field(gt=0)
    published: float = Field(gt=0)
    # the row's own published setup as dotted scenario keys (model, layout, micro-batches): what the
    # paper ran, never a fitted factor
    changes: dict[str, Any] = Field(default_factory=dict)
    # metric "speedup": the optimizer the published speedup is over, on the same GPUs
    baseline: str | None = None
    # a row of another experiment than the dataset's scenario (a path or preset:NAME)
    scenario: str | None = None
    # what the row's source publishes, where it is not the dataset's metric (a dataset gathered from
    # several sources: one prints step times, another tokens per second per GPU)
    metric: Metric | None = None
    # a short name for the row (benchmark, system, size) and where exactly its number was read
    label: str | None = None
    source: str | None = None
    # rows of one system and software (an MLPerf round's submissions on one cluster, one paper's
    # table) at several sizes: how the error moves with scale inside a series, where a constant bias
    # of the level (a compute rate) cancels
    series: str | None = None
    # metric "speedup" (the baseline's step time over the row's) or "slowdown" (the row's over the
    # baseline's: a published "hours at 1 Gbit/s over hours at +inf") between two configurations of the
    # same optimizer (offload modes, input pipelines, links): the baseline's dotted scenario keys, applied
    # over the row's; the baseline optimizer is then the row's own unless ``baseline`` names another
    baseline_changes: dict[str, Any] = Field(default_factory=dict)
    # metric "speedup" end to end: the fraction of the run's steps in the optimizer's warmup stage (1-bit
    # Adam's freeze_step / total steps), each simulated; the speedup is of the mean step over the run
    warmup: float | None = Field(None, ge=0, lt=1)
    # a published threshold, not a value: the source gives the first setting of its grid at which its own
    # result reaches ``published`` (Streaming DiLoCo's Table 4: the bandwidth at which a compute
    # utilization is reached), and, reaching the next threshold only at a later setting, stays below
    # ``published_below`` there (the last threshold: below what the metric can be, 1.0 for a share). Its
    # own value then lies between the two: the row's band holds it when the two ranges overlap; its
    # error is 0 for a prediction between the two, else the distance to the nearer one (row_error).
    published_below: float | None = Field(None, gt=0)
    # a setting the result depends on that the source does not disclose: the row says which, and
    # validate shows its prediction over the setting's plausible values (the row itself keeps the
    # preset's choice)
    undisclosed: "Undisclosed | None" = None


class Undisclosed(BaseModel):
    """A setting a published result depends on that its source does not give: a dotted scenario key
    (or ``gpus``, where the source does not say at which size its figure falls), the values it could
    plausibly take, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str = Field(min_length=1)
    values: list[float | str] = Field(min_length=2, description="numbers, or a key's named choices")
    why: str = Field(min_length=1)
    unit: str = Field("", description="the values' unit, as printed after each (us, GPUs, samples per GPU)")


Row.model_rebuild()


class Dataset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str
    source: str
    scenario: str
    metric: Metric = "samples_per_s"
    optimizer_options: dict[str, dict] = Field(default_factory=dict)
    changes: dict[str, Any] = Field(default_factory=dict)  # the published cluster, for every row
    rows: list[Row]

    @model_validator(mode="after")
    def _speedups_name_their_baseline(self) -> "Dataset":
        for r in self.rows:
            metric = r.metric or self.metric
            if metric in RATIO_METRICS and r.baseline is None and not r.baseline_changes:
                raise ValueError(
                    f"every {metric} row needs its 'baseline' optimizer or its 'baseline_changes'"
                )
            if r.baseline_changes and metric not in RATIO_METRICS:
                raise ValueError("'baseline_changes' are for speedup and slowdown rows only")
            if r.warmup is not None and metric != "speedup":
                raise ValueError("'warmup' is for speedup rows only")
            if r.published_below is not None and r.published_below <= r.published:
                raise ValueError("'published_below' must be above 'published' (the next threshold)")
        return self


@dataclass
class RowResult:
    optimizer: str
    gpus: int
    published: float
    predicted: float
    error: float  # (predicted - published) / published
    p10: float | None = None  # the prediction's P10-P90 band, in the metric's units
    p90: float | None = None
    baseline: str | None = None  # speedup rows: the optimizer the speedup is over
    scenario: str | None = None  # the row's own experiment, where it is not the dataset's
    band_note: str | None = None  # why the band has fewer draws than asked (or none), as run says
    metric: str | None = None  # the row's own metric, where it is not the dataset's
    label: str | None = None  # the row's name (benchmark, system, size)
    series: str | None = None  # the rows of one system and software at several sizes
    published_below: float | None = None  # a threshold row: the source's own value is below this
    # a setting the source does not disclose: its key, why, and the prediction at each plausible value
    undisclosed_key: str | None = None
    undisclosed_why: str | None = None
    undisclosed_unit: str | None = None
    undisclosed_used: float | str | None = None  # the value the row itself was predicted at
    # (value, predicted): numbers in value order, named choices in the dataset's order
    undisclosed_range: list[tuple[float | str, float]] | None = None
    # what the row's GPUs stand for where its source counts something else: Streaming DiLoCo's
    # simulation runs each of its workers (a datacenter in the paper) as one device
    workers: int | None = None

    @property
    def inside(self) -> bool | None:
        """Whether the band holds the published value (a threshold row: meets published..published_below)."""
        if self.p10 is None:
            return None
        if self.published_below is not None:
            return self.p90 >= self.published and self.p10 <= self.published_below
        return self.p10 <= self.published <= self.p90

    def as_dict(self, dataset_metric: str | None = None) -> dict:
        """The row as plain data: ``error`` raw, (predicted - published) / published, and, given the
        dataset's metric (a row's own ``metric`` wins), ``slowness_error``, the error as the tables sign
        it (+ predicted too slow, - too fast: a rate's is turned; slowness)."""
        out = asdict(self)
        metric = self.metric or dataset_metric
        if metric is not None:
            out["slowness_error"] = slowness(self.error, metric)
        return out


@dataclass
class ValidationReport:
    dataset: Dataset
    rows: list[RowResult]

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(r.error) for r in self.rows)

    @property
    def max_abs_error(self) -> float:
        return max(abs(r.error) for r in self.rows)

    @property
    def coverage(self) -> float | None:
        """Share of published values inside the predicted P10-P90 band."""
        flags = [r.inside for r in self.rows if r.inside is not None]
        return sum(flags) / len(flags) if flags else None


def datasets() -> list[str]:
    folder = resources.files("clustersim.validation")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_dataset(name: str) -> Dataset:
    if name not in datasets():
        from clustersim.validation.throughput_data import THROUGHPUT_DATASETS

        known = sorted([*datasets(), *THROUGHPUT_DATASETS])
        raise InputError(f"unknown validation dataset {name!r} (known: {', '.join(known)})", key="--dataset")
    text = resources.files("clustersim.validation").joinpath(f"{name}.yaml").read_text()
    try:
        return Dataset.model_validate(load_yaml(text))
    except ValidationError as exc:  # pragma: no cover - a broken shipped file
        raise InputError(f"dataset is invalid: {exc.errors()[0]['msg']}", source=name) from None


def megatron_flops(scenario) -> float:
    """FLOPs of one iteration as Narayanan et al. SC'21 (sec. 5.1, eq. 3) count them for Table 1:
    96 B s l h^2 (1 + s/(6h) + V/(16 l h)), forward, backward and the recomputed forward of a GPT
    with B sequences of s tokens, l layers, hidden h, vocabulary V."""
    from clustersim.catalog import model

    arch, w = model(scenario.workload.model), scenario.workload
    par, c = scenario.training.parallelism, scenario.cluster
    batch = w.micro_batch * w.gradient_accumulation * c.world_size // (par.tensor * par.pipeline)
    s, h, layers = w.seq_len or arch.default_seq_len, arch.hidden, arch.layers
    return 96 * batch * s * layers * h**2 * (1 + s / (6 * h) + arch.vocab / (16 * layers * h))


def tokens_per_iteration(result, scenario) -> int:
    """Tokens one iteration trains on: its samples (micro-batch x accumulation x data-parallel
    replicas) times the sequence length, what NeMo's and TorchTitan's tokens/s/GPU divide by time."""
    from clustersim.catalog import model

    w = scenario.workload
    return result.samples_per_iteration * (w.seq_len or model(w.model).default_seq_len)


def compute_utilization(result) -> float:
    """The share of the step the compute stream is busy (forward, backward, update, compression):
    Douillard et al.'s "compute utilization" (arXiv:2501.18512, Figure 4: "0.8 means 80% of the time is
    spent in computation, and 20% in communication")."""
    from clustersim.identifiers import COMPUTE_CATEGORIES

    busy = sum(result.breakdown[str(c)] for c in COMPUTE_CATEGORIES)
    # a step that is all compute sums its parts to the step time but for the last bit of rounding
    return min(1.0, busy / result.iteration_time)


def _utilization_band(scenario, profile, samples: int) -> tuple[float | None, float | None]:
    """P10-P90 of the compute utilization over the draws of the uncertain parameters (the compute time
    and the network move both the busy time and the step, so the band is taken draw by draw)."""
    if samples <= 0:
        return None, None
    import numpy as np

    from clustersim.simulator.context import build_context
    from clustersim.simulator.uncertainty import perturbations

    draws = perturbations(build_context(scenario, profile), samples)
    values = [compute_utilization(simulate(scenario, profile, perturbation=p)) for p in draws]
    return float(np.percentile(values, 10)), float(np.percentile(values, 90))


def _metric(result, scenario, metric: str) -> float:
    if metric == "compute_utilization":
        return compute_utilization(result)
    if metric == "tflops_per_gpu":  # Narayanan et al.'s achieved teraFLOP/s per GPU
        return megatron_flops(scenario) / (result.iteration_time * result.world_size) / 1e12
    if metric == "tokens_per_s_per_gpu":
        return tokens_per_iteration(result, scenario) / (result.iteration_time * result.world_size)
    return getattr(result, metric)


def _band(result, metric: str, scenario=None) -> tuple[float | None, float | None]:
    iv = result.interval
    if iv is None:
        return None, None
    if metric == "samples_per_s":  # faster iteration, more samples: the time band inverts
        n = result.samples_per_iteration
        return n / iv.p90, n / iv.p10
    if metric == "tflops_per_gpu":
        work = megatron_flops(scenario) / result.world_size / 1e12
        return work / iv.p90, work / iv.p10
    if metric == "tokens_per_s_per_gpu":
        work = tokens_per_iteration(result, scenario) / result.world_size
        return work / iv.p90, work / iv.p10
    if metric == "iteration_time":
        return iv.p10, iv.p90
    return None, None


def _speedup(
    baseline, scenario, profile, samples: int, warmup: float | None = None
) -> tuple[float, float | None, float | None]:
    """The step speedup of ``scenario`` over ``baseline`` and its paired P10-P90 (both under the same
    draws of the uncertain hardware parameters, as `compare` pairs them). With ``warmup``, the end-to-end
    speedup of a run whose first ``warmup`` of steps are the optimizer's warmup stage (simulated too):
    the baseline's step over the run's mean step, as `compare --steps` times a run."""
    from clustersim.planner.compare import StepsPlan, mean_step_time, paired_band
    from clustersim.simulator.strategies import registry

    base = simulate(baseline, profile).iteration_time
    step = simulate(scenario, profile).iteration_time
    name = scenario.training.optimizer
    if warmup is not None:
        warm_opts = registry.get(name).warmup_options(scenario.training.optimizer_options)
        if warm_opts is None:
            raise InputError(f"{name} has no warmup stage for the row's 'warmup'", key="warmup")
        warm = simulate(scenario.with_changes(**{"training.optimizer_options": warm_opts}), profile)
        step = mean_step_time(name, step, warm.iteration_time, warmup)
    point = base / step
    if samples <= 0:
        return point, None, None
    if warmup is None:
        lo, hi = paired_band(baseline, scenario, profile, samples)["speedup"]
    else:  # one step count for both: the ratio of mean steps, draw by draw
        band = paired_band(baseline, scenario, profile, samples, StepsPlan(default=1), warmup)
        lo, hi = band["ttt_speedup"]
    return point, lo, hi


def row_scenario(data: Dataset, row: Row, bases: dict | None = None):
    """The scenario one row predicts: the dataset's (or the row's own) experiment with the row's
    optimizer, the dataset's published cluster and the row's own published setup; ``bases`` caches
    loaded base scenarios by name."""
    bases = {} if bases is None else bases
    source = row.scenario or data.scenario
    base = bases.get(source) or bases.setdefault(source, load_scenario(source))
    changes = {
        "training.optimizer": row.optimizer,
        "training.optimizer_options": data.optimizer_options.get(row.optimizer, {}),
        **data.changes,
        **row.changes,
    }
    if row.changes:  # one validation: a layout may only fit the row's GPU count
        per_node = base.cluster.gpus_per_node
        if row.gpus % per_node:
            raise InputError(f"{row.gpus} GPUs is not a whole number of {per_node}-GPU nodes", key="gpus")
        return base.with_changes(**changes, **{"cluster.nodes": row.gpus // per_node})
    return base.with_world_size(row.gpus).with_changes(**changes)


def _predict(data: Dataset, row: Row, scenario, profile, samples: int):
    """(predicted, P10, P90, band note) of one row on ``scenario``."""
    metric = row.metric or data.metric
    if metric in RATIO_METRICS:
        against = row.baseline or row.optimizer
        baseline = scenario.with_changes(
            **{
                "training.optimizer": against,
                "training.optimizer_options": data.optimizer_options.get(against, {}),
                **row.baseline_changes,
            }
        )
        predicted, lo, hi = _speedup(baseline, scenario, profile, samples, row.warmup)
        if metric == "slowdown":  # the row's time over the baseline's: the speedup inverted
            inverted = (None if hi is None else 1 / hi), (None if lo is None else 1 / lo)
            predicted, (lo, hi) = 1 / predicted, inverted
        return predicted, lo, hi, None
    r = simulate(scenario, profile, uncertainty_samples=samples)
    predicted = _metric(r, scenario, metric)
    if metric == "compute_utilization":
        lo, hi = _utilization_band(scenario, profile, samples)
    else:
        lo, hi = _band(r, metric, scenario)
    return predicted, lo, hi, next((n for n in r.notes if "P10-P90 band" in n), None)


def _over_undisclosed(data: Dataset, row: Row, profile, bases: dict) -> list[tuple[float | str, float]]:
    """The row's point prediction at each plausible value of its undisclosed setting."""
    spec = row.undisclosed
    out = []
    numeric = all(isinstance(v, (int, float)) for v in spec.values)
    for value in sorted(spec.values) if numeric else spec.values:
        if spec.key == "gpus":
            variant = row.model_copy(update={"gpus": int(value), "undisclosed": None})
            scenario = row_scenario(data, variant, bases)
        else:
            scenario = row_scenario(data, row, bases).with_changes(**{spec.key: value})
        out.append((value, _predict(data, row, scenario, profile, 0)[0]))
    return out


def _used_value(row: Row, scenario) -> float | str | None:
    """The value of the row's undisclosed setting that its own prediction used (None: unset, a default)."""
    if row.undisclosed.key == "gpus":
        return float(row.gpus)
    value = scenario.model_dump()
    for part in row.undisclosed.key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None or isinstance(value, str):
        return value
    return float(value)


def row_error(row: Row, predicted: float) -> float:
    """The row's relative error. A published range (``published_below``: the source's own value lies
    anywhere from ``published`` to ``published_below``) scores 0 for a prediction inside it, else the
    relative distance to its nearer end; a published value, (predicted - published) / published."""
    if row.published_below is not None and predicted > row.published_below:
        return predicted / row.published_below - 1
    if row.published_below is not None and predicted >= row.published:
        return 0.0
    return predicted / row.published - 1


def _workers(base) -> int | None:
    """The DiLoCo workers of a row's experiment (each one device in its simulation), else None."""
    if base.training.optimizer != "diloco":
        return None
    return (base.training.optimizer_options or {}).get("workers")


def validate(name: str, profile=None, samples: int = 32, progress=None) -> ValidationReport:
    """Predict every row of dataset ``name``; ``progress(done, total)`` after each row."""
    return predict_rows(load_dataset(name), profile, samples, progress)


def predict_rows(
    data: Dataset, profile=None, samples: int = 32, progress=None, over_undisclosed: bool = True
) -> ValidationReport:
    """Predict every row of a loaded dataset (validate, for a caller that has read it already).
    ``over_undisclosed=False`` leaves out each row's predictions across its undisclosed setting's
    plausible values (``undisclosed_range`` None; one more prediction per value), for a caller that
    reads only the rows' own predictions."""
    bases = {data.scenario: load_scenario(data.scenario)}
    results = []
    for row in data.rows:
        scenario = row_scenario(data, row, bases)
        predicted, lo, hi, note = _predict(data, row, scenario, profile, samples)
        spec = row.undisclosed
        results.append(
            RowResult(
                row.optimizer,
                row.gpus,
                row.published,
                predicted,
                row_error(row, predicted),
                lo,
                hi,
                row.baseline,
                row.scenario,
                note,
                row.metric,
                row.label,
                row.series,
                row.published_below,
                spec.key if spec else None,
                spec.why if spec else None,
                spec.unit if spec else None,
                _used_value(row, scenario) if spec else None,
                _over_undisclosed(data, row, profile, bases) if spec and over_undisclosed else None,
                _workers(bases[row.scenario or data.scenario]),
            )  # fmt: skip
        )
        if progress:
            progress(len(results), len(data.rows))
    return ValidationReport(data, results)
