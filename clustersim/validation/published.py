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


class Dataset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str
    source: str
    scenario: str
    metric: Literal["samples_per_s", "tflops_per_gpu", "iteration_time", "speedup"] = "samples_per_s"
    optimizer_options: dict[str, dict] = Field(default_factory=dict)
    changes: dict[str, Any] = Field(default_factory=dict)  # the published cluster, for every row
    rows: list[Row]

    @model_validator(mode="after")
    def _speedups_name_their_baseline(self) -> "Dataset":
        if self.metric == "speedup" and any(r.baseline is None for r in self.rows):
            raise ValueError("every row of a speedup dataset needs its 'baseline' optimizer")
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

    @property
    def inside(self) -> bool | None:
        return None if self.p10 is None else self.p10 <= self.published <= self.p90

    def as_dict(self) -> dict:
        return asdict(self)


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


def _metric(result, scenario, metric: str) -> float:
    if metric == "tflops_per_gpu":  # Narayanan et al.'s achieved teraFLOP/s per GPU
        return megatron_flops(scenario) / (result.iteration_time * result.world_size) / 1e12
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
    if metric == "iteration_time":
        return iv.p10, iv.p90
    return None, None


def _speedup(baseline, scenario, profile, samples: int) -> tuple[float, float | None, float | None]:
    """The step speedup of ``scenario`` over ``baseline`` and its paired P10-P90 (both under the same
    draws of the uncertain hardware parameters, as `compare` pairs them)."""
    from clustersim.planner.compare import paired_band

    point = simulate(baseline, profile).iteration_time / simulate(scenario, profile).iteration_time
    if samples <= 0:
        return point, None, None
    lo, hi = paired_band(baseline, scenario, profile, samples)["speedup"]
    return point, lo, hi


def validate(name: str, profile=None, samples: int = 32, progress=None) -> ValidationReport:
    """Predict every row of dataset ``name``; ``progress(done, total)`` after each row."""
    data = load_dataset(name)
    bases = {data.scenario: load_scenario(data.scenario)}
    results = []
    for row in data.rows:
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
            scenario = base.with_changes(**changes, **{"cluster.nodes": row.gpus // per_node})
        else:
            scenario = base.with_world_size(row.gpus).with_changes(**changes)
        if data.metric == "speedup":
            baseline = scenario.with_changes(
                **{
                    "training.optimizer": row.baseline,
                    "training.optimizer_options": data.optimizer_options.get(row.baseline, {}),
                }
            )
            predicted, lo, hi = _speedup(baseline, scenario, profile, samples)
            note = None
        else:
            r = simulate(scenario, profile, uncertainty_samples=samples)
            predicted = _metric(r, scenario, data.metric)
            lo, hi = _band(r, data.metric, scenario)
            note = next((n for n in r.notes if "P10-P90 band" in n), None)
        results.append(
            RowResult(
                row.optimizer,
                row.gpus,
                row.published,
                predicted,
                predicted / row.published - 1,
                lo,
                hi,
                row.baseline,
                row.scenario,
                note,
            )  # fmt: skip
        )
        if progress:
            progress(len(results), len(data.rows))
    return ValidationReport(data, results)
