"""Speedups per scale, and how errors move with scale inside a series of runs.

Where a validation dataset measures several optimizers on the same GPU counts (the 1-bit Adam
paper's Adam and 1-bit Adam at 1-32 GPUs): the predicted against the published speedup of each
optimizer over the baseline at every GPU count, their errors, and whether the speedup moves with
scale the way the measurement does. Users ask "how much faster at 64 GPUs", a ratio of two
predictions; two throughputs each within 10% can still give a speedup 20% off and falling where the
published one rises.

Where a dataset groups one system's runs at several sizes into a ``series``: each row's error
relative to the series' smallest run, so that a bias of the level shared by every size cancels and
what is left is the cost of scale. Both read the validation report (no new simulation)."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from clustersim.validation.published import RATE_METRICS

# metrics where more is faster; iteration_time is the one where less is
_RATES = {"samples_per_s", "tflops_per_gpu", "tokens_per_s_per_gpu"}


@dataclass
class ScaleSpeedup:
    gpus: int
    published: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.published - 1

    def as_dict(self) -> dict:
        return {**asdict(self), "error": self.error}


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


@dataclass
class SpeedupTrend:
    """One optimizer's speedup over the baseline at each GPU count both were measured at."""

    optimizer: str
    baseline: str
    points: list[ScaleSpeedup] = field(default_factory=list)
    experiment: str | None = None  # the rows' own scenario or label, where the dataset has several
    gpus_per_node: int = 1  # the trend is read across nodes, where communication decides it

    @property
    def trend_points(self) -> list[ScaleSpeedup]:
        """The points the trend is read over: those of two or more nodes where there are at least two
        of them (inside one node the speedup is set by compute and NVLink/PCIe, not by the network
        the question is about), else all."""
        multi = [p for p in self.points if p.gpus > self.gpus_per_node]
        return multi if len(multi) > 1 else self.points

    def _trend(self, attr: str) -> int:
        """+1 when the speedup at the largest GPU count is above the one at the smallest, -1 below."""
        pts = self.trend_points
        return _sign(getattr(pts[-1], attr) - getattr(pts[0], attr)) if len(pts) > 1 else 0

    @property
    def published_trend(self) -> int:
        return self._trend("published")

    @property
    def predicted_trend(self) -> int:
        return self._trend("predicted")

    @property
    def same_sign(self) -> bool:
        return self.published_trend == self.predicted_trend

    @property
    def steps(self) -> list[tuple[int, int, int, int]]:
        """(from GPUs, to GPUs, published direction, predicted direction) per consecutive GPU count."""
        return [
            (a.gpus, b.gpus, _sign(b.published - a.published), _sign(b.predicted - a.predicted))
            for a, b in zip(self.points, self.points[1:])
        ]

    def as_dict(self) -> dict:
        return {
            "optimizer": self.optimizer,
            "baseline": self.baseline,
            "experiment": self.experiment,
            "points": [p.as_dict() for p in self.points],
            "trend_from_gpus": self.trend_points[0].gpus,
            "trend_to_gpus": self.trend_points[-1].gpus,
            "published_trend": self.published_trend,
            "predicted_trend": self.predicted_trend,
            "trend_sign_matches": self.same_sign,
            "steps": [
                {"from_gpus": a, "to_gpus": b, "published": pub, "predicted": pred, "matches": pub == pred}
                for a, b, pub, pred in self.steps
            ],
        }


@dataclass
class SpeedupsByScale:
    trends: list[SpeedupTrend]

    @property
    def points(self) -> list[ScaleSpeedup]:
        return [p for t in self.trends for p in t.points]

    @property
    def median_abs_error(self) -> float | None:
        errs = [abs(p.error) for p in self.points]
        return statistics.median(errs) if errs else None

    @property
    def worst(self) -> tuple[SpeedupTrend, ScaleSpeedup] | None:
        pairs = [(t, p) for t in self.trends for p in t.points]
        return max(pairs, key=lambda tp: abs(tp[1].error)) if pairs else None

    def as_dict(self) -> dict:
        worst = self.worst
        return {
            "trends": [t.as_dict() for t in self.trends],
            "median_abs_error": self.median_abs_error,
            "max_abs_error": None if worst is None else abs(worst[1].error),
            "worst": None if worst is None else {"optimizer": worst[0].optimizer, **worst[1].as_dict()},
            "trend_signs_match": all(t.same_sign for t in self.trends),
        }


def speedups_by_scale(report, gpus_per_node: dict[str | None, int] | None = None) -> SpeedupsByScale:
    """The speedups a validation report implies: rows of one experiment (same scenario, metric and
    label) at one GPU count, one per optimizer, are compared with the experiment's first-listed
    optimizer as the baseline (the dataset lists its baseline first, as the 1-bit Adam table lists
    Adam). Datasets of published speedups (metric "speedup") or of one optimizer give no trends.
    ``gpus_per_node`` maps a row's scenario (None: the dataset's) to its node size; default: read
    from the scenarios."""
    if report.dataset.metric == "speedup":
        return SpeedupsByScale([])
    per_node = dict(gpus_per_node or {})
    experiments: dict[tuple, dict[int, dict[str, object]]] = {}
    order: dict[tuple, list[str]] = {}
    for r in report.rows:
        key = (r.scenario, r.metric or report.dataset.metric, r.label)
        experiments.setdefault(key, {}).setdefault(r.gpus, {})[r.optimizer] = r
        names = order.setdefault(key, [])
        if r.optimizer not in names:
            names.append(r.optimizer)
    trends = []
    for key, by_gpus in experiments.items():
        names = order[key]
        if len(names) < 2:
            continue
        scenario, metric, label = key
        if scenario not in per_node:
            from clustersim.scenario import load_scenario

            per_node[scenario] = load_scenario(scenario or report.dataset.scenario).cluster.gpus_per_node
        base = names[0]
        for name in names[1:]:
            trend = SpeedupTrend(name, base, experiment=label or scenario, gpus_per_node=per_node[scenario])
            for gpus in sorted(by_gpus):
                rows = by_gpus[gpus]
                if base not in rows or name not in rows:
                    continue
                b, o = rows[base], rows[name]
                if metric in _RATES:
                    pub, pred = o.published / b.published, o.predicted / b.predicted
                else:  # a time: the faster optimizer takes less of it
                    pub, pred = b.published / o.published, b.predicted / o.predicted
                trend.points.append(ScaleSpeedup(gpus, pub, pred))
            if trend.points:
                trends.append(trend)
    return SpeedupsByScale(trends)


@dataclass
class SeriesPoint:
    gpus: int
    label: str | None
    error: float  # the row's own error
    relative: float  # (1 + error) / (1 + the series' first row's error) - 1


@dataclass
class ScaleSeries:
    """One system's runs at several sizes: each row's error relative to the series' smallest run.
    A bias that is the same at every size (a compute rate) cancels, what is left is how the
    prediction's cost of scale (pipeline bubble, data-parallel communication, stragglers) compares
    with the measurement's: a positive relative error on a time is a step predicted to grow more
    with scale than it did; on a rate, to shrink less."""

    name: str
    points: list[SeriesPoint]
    rate: bool = False  # the series measures a rate (RATE_METRICS): its errors' sign is turned as printed

    def as_dict(self) -> dict:
        """Each point's ``error`` and ``relative`` raw (on the series' metric), and as validate's table
        signs them, + predicted too slow (``slowness_error``, ``slowness_relative``: turned on a rate)."""
        sign = -1.0 if self.rate else 1.0
        points = [
            {**asdict(p), "slowness_error": sign * p.error, "slowness_relative": sign * p.relative}
            for p in self.points
        ]
        return {"series": self.name, "points": points}


def scaling_by_series(report) -> list[ScaleSeries]:
    """The report's rows grouped by their ``series`` (rows without one are left out), ordered by GPU
    count; series with a single size give nothing."""
    groups: dict[str, list] = {}
    for r in report.rows:
        if r.series:
            groups.setdefault(r.series, []).append(r)
    out = []
    for name, rows in groups.items():
        rows = sorted(rows, key=lambda r: r.gpus)
        if len({r.gpus for r in rows}) < 2:
            continue
        first = 1 + rows[0].error
        rate = (rows[0].metric or report.dataset.metric) in RATE_METRICS
        out.append(
            ScaleSeries(
                name, [SeriesPoint(r.gpus, r.label, r.error, (1 + r.error) / first - 1) for r in rows], rate
            )
        )
    return out


def median_relative_error(series: list[ScaleSeries]) -> float | None:
    """The median |relative error| over every series' rows past its first."""
    errs = [abs(p.relative) for s in series for p in s.points[1:]]
    return statistics.median(errs) if errs else None
