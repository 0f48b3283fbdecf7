"""How far the predicted speedups of the compressed optimizers are checked against published ones.

A compressed optimizer's speedup over Adam is a ratio of two predictions; its P10-P90 (paired draws)
holds what is uncertain about the hardware, which moves both alike and mostly cancels, not the model's
own error on the ratio. That error is measured where a source publishes both: the shipped validation
datasets (`clustersim validate`). This module gathers every such check, each on its own cluster (GPU
count, GPU, network), so that ``compare`` and ``report`` can say, beside a speedup, how far it was
checked, with what error, and whether the cluster asked about lies inside what was checked.

The checks are predicted without draws from the datasets on first use (about 0.2 s, once per process),
so they are always the model's as it stands.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Iterator

# what compare and report say of an optimizer no published speedup checks
UNCHECKED = "{name}: no published speedup checks it; its speedups are the model's alone"
# a check's cluster is "inside" the checked range up to this factor past its largest GPU count: one
# doubling is what the trend between the published sizes can speak for
GPU_REACH = 2


@dataclass(frozen=True)
class SpeedupCheck:
    """One published speedup of a compressed optimizer over an uncompressed one, and the prediction."""

    optimizer: str
    baseline: str
    dataset: str  # as `clustersim validate --dataset` names it
    label: str | None  # the row's own name, where the dataset gives one
    gpus: int
    gpu: str
    nic_kind: str
    network: str  # "40 Gb/s Ethernet (4.1 Gb/s effective)" per node
    published: float
    predicted: float

    @property
    def error(self) -> float:
        """predicted / published - 1: negative where the model predicts too small a speedup."""
        return self.predicted / self.published - 1


@dataclass(frozen=True)
class CheckedRange:
    """What one optimizer's checks cover and how far off they were."""

    optimizer: str
    checks: list[SpeedupCheck]

    @property
    def gpus(self) -> tuple[int, int]:
        counts = [c.gpus for c in self.checks]
        return min(counts), max(counts)

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(c.error) for c in self.checks)

    @property
    def worst(self) -> SpeedupCheck:
        return max(self.checks, key=lambda c: abs(c.error))

    def covers(self, gpus: int, nic_kind: str) -> bool:
        """Whether a comparison at ``gpus`` on ``nic_kind`` NICs lies inside what was checked: a NIC of a
        kind checked, at no more than GPU_REACH times the largest GPU count checked."""
        return nic_kind in {c.nic_kind for c in self.checks} and gpus <= GPU_REACH * self.gpus[1]

    def wrong_trends(self) -> list[tuple[int, int]]:
        """(smallest, largest GPU count) of each series of checks (one dataset's experiment at several
        GPU counts) whose predicted speedup moves the other way from the published one between them:
        the model's trend with scale has the wrong sign there, which is what extrapolating to more GPUs
        leans on."""
        series: dict[tuple, list[SpeedupCheck]] = {}
        for c in self.checks:
            series.setdefault((c.dataset, c.label, c.baseline), []).append(c)
        wrong = []
        for checks in series.values():
            if len({c.gpus for c in checks}) < 2:
                continue
            first, last = min(checks, key=lambda c: c.gpus), max(checks, key=lambda c: c.gpus)
            if (last.published - first.published) * (last.predicted - first.predicted) < 0:
                wrong.append((first.gpus, last.gpus))
        return wrong

    def describe(self) -> str:
        lo, hi = self.gpus
        counts = f"{lo:,}" if lo == hi else f"{lo:,}–{hi:,}"
        where = "; ".join(dict.fromkeys(f"{c.gpu}, {c.network}" for c in self.checks))
        worst = self.worst
        n = len(self.checks)
        named = worst.dataset + (f": {worst.label}" if worst.label else "")
        text = (
            f"checked against {n} published speedup{'s' * (n > 1)} at {counts} GPUs ({where}): "
            f"median error {self.median_abs_error:.0%}, worst {worst.error:+.0%} "
            f"({named}, {worst.gpus:,} GPUs)"
        )
        for a, b in self.wrong_trends():
            text += (
                f"; from {a:,} to {b:,} GPUs the published speedup and the predicted one move opposite "
                "ways (the trend with scale has the wrong sign: least certain where it is extrapolated)"
            )
        return text

    def as_dict(self) -> dict:
        lo, hi = self.gpus
        return {
            "optimizer": self.optimizer,
            "checks": [{**asdict(c), "error": c.error} for c in self.checks],
            "gpus": [lo, hi],
            "median_abs_error": self.median_abs_error,
            "worst": {**asdict(self.worst), "error": self.worst.error},
            "text": self.describe(),
        }


def _network(scenario) -> tuple[str, str]:
    from clustersim.report.costing import nic_label

    nic = scenario.cluster.nic
    text = nic_label(nic.model_dump())
    if nic.effective_gbps is not None:
        text += f" ({nic.effective_gbps:g} Gb/s effective)"
    return nic.kind, text + " per node"


def _check(name, data, row, optimizer, baseline, gpus, published, predicted, bases) -> SpeedupCheck:
    from clustersim.validation.published import row_scenario

    scenario = row_scenario(data, row, bases)
    kind, network = _network(scenario)
    gpu = scenario.cluster.gpu
    return SpeedupCheck(optimizer, baseline, name, row.label, gpus, gpu, kind, network, published, predicted)


def compute(progress=None) -> list[SpeedupCheck]:
    """Every published speedup of a compressed optimizer over an uncompressed one in the shipped
    datasets, predicted without draws: a dataset's own speedup rows (the baseline on the same GPUs),
    and the speedups its throughput rows imply between two optimizers across nodes (the network is
    what the question is about; inside one node compute and NVLink/PCIe set them). The same published
    speedup in two datasets counts once."""
    from clustersim.planner.compare import is_uncompressed
    from clustersim.validation.published import datasets, load_dataset, predict_rows
    from clustersim.validation.speedups import speedups_by_scale

    checks: dict[tuple, SpeedupCheck] = {}
    for name in datasets():
        data = load_dataset(name)
        if all(is_uncompressed(r.optimizer) for r in data.rows):
            continue
        if progress:
            progress(name)
        report = predict_rows(data, None, samples=0, over_undisclosed=False)  # the rows' own predictions
        bases: dict = {}
        for row, result in zip(data.rows, report.rows):
            base = row.baseline
            if (row.metric or data.metric) != "speedup" or row.baseline_changes:
                continue
            if base is None or is_uncompressed(row.optimizer) or not is_uncompressed(base):
                continue
            c = _check(name, data, row, row.optimizer, base, row.gpus, row.published, result.predicted, bases)
            checks.setdefault((c.optimizer, c.baseline, c.gpus, c.published), c)
        for trend in speedups_by_scale(report).trends:
            if is_uncompressed(trend.optimizer) or not is_uncompressed(trend.baseline):
                continue
            for point in trend.trend_points:
                if point.gpus <= trend.gpus_per_node:
                    continue
                row = next(
                    r
                    for r in data.rows
                    if r.optimizer == trend.optimizer
                    and r.gpus == point.gpus
                    and (r.label or r.scenario) == trend.experiment
                )
                pair = (trend.optimizer, trend.baseline)
                c = _check(name, data, row, *pair, point.gpus, point.published, point.predicted, bases)
                checks.setdefault((c.optimizer, c.baseline, c.gpus, c.published), c)
    return sorted(checks.values(), key=lambda c: (c.optimizer, c.gpus, c.dataset, c.label or ""))


@lru_cache(maxsize=1)
def checked_ranges() -> dict[str, CheckedRange]:
    """Every check (compute), by optimizer; computed once per process."""
    by_optimizer: dict[str, list[SpeedupCheck]] = {}
    for c in compute():
        by_optimizer.setdefault(c.optimizer, []).append(c)
    return {name: CheckedRange(name, checks) for name, checks in by_optimizer.items()}


def _judged(names, points_of) -> Iterator[tuple[str, CheckedRange | None, dict[str, list[int]]]]:
    """The judgement notes and sweep_lines each word their own way: per compressed optimizer of
    ``names``, its checked range (None: no published speedup checks it) and the GPU counts of its
    points that lie outside that range, by network, in the points' order. ``points_of(name)``: the
    (network as said, NIC kind, GPU count) it ran at (asked only of a checked optimizer)."""
    from clustersim.planner.compare import is_uncompressed

    ranges = checked_ranges()
    for name in names:
        if is_uncompressed(name):
            continue
        checked = ranges.get(name)
        outside: dict[str, list[int]] = {}
        for network, nic_kind, gpus in points_of(name) if checked is not None else ():
            if not checked.covers(gpus, nic_kind):
                outside.setdefault(network, []).append(gpus)
        yield name, checked, outside


def notes(scenario, optimizers: list[str], gpu_counts: list[int]) -> list[dict]:
    """For each compressed optimizer of a comparison of ``scenario`` at ``gpu_counts``: how far its
    speedups are checked and whether the comparison's GPU counts and network lie inside that
    ({"optimizer", "checked", "outside", "text"})."""
    nic_kind, network = _network(scenario)
    out = []
    for name, checked, outside in _judged(optimizers, lambda _: [(network, nic_kind, g) for g in gpu_counts]):
        if checked is None:
            out.append(
                {
                    "optimizer": name,
                    "checked": None,
                    "outside": list(gpu_counts),
                    "text": UNCHECKED.format(name=name),
                }
            )
            continue
        counts = outside.get(network, [])
        text = f"{name}: {checked.describe()}"
        if counts:
            text += f"; {', '.join(f'{g:,}' for g in counts)} GPUs on {network} lie outside what was checked"
        out.append({"optimizer": name, "checked": checked.as_dict(), "outside": counts, "text": text})
    return out


def sweep_lines(rows: list[dict], scenarios: dict) -> list[str]:
    """``notes`` for a sweep's rows (a report's section), whose networks differ row by row: per
    compressed optimizer that ran, how far its speedups are checked, and which of its networks and GPU
    counts lie outside that."""
    ran = [r for r in rows if not r.get("error") and r.get("optimizer")]

    def points(name: str) -> list[tuple[str, str, int]]:
        return [
            (str(r["network"]), scenarios[r["row_id"]]["cluster"]["nic"]["kind"], int(r["world_size"]))
            for r in ran
            if r["optimizer"] == name and r.get("row_id") in scenarios
        ]

    lines = []
    for name, checked, outside in _judged(dict.fromkeys(r["optimizer"] for r in ran), points):
        if checked is None:
            lines.append(UNCHECKED.format(name=name))
            continue
        text = f"{name}: {checked.describe()}"
        if outside:
            said = "; ".join(
                f"{net} at {', '.join(f'{g:,}' for g in sorted(set(c)))} GPUs" for net, c in outside.items()
            )
            text += f"; outside what was checked: {said}"
        lines.append(text)
    return lines


def main() -> int:
    """``python -m clustersim.validation.speedup_checks``: each optimizer's checks, one per line."""
    for name, checked in checked_ranges().items():
        print(f"{name}: {checked.describe()}")
        for c in checked.checks:
            print(
                f"  {c.gpus:>5,} GPUs {c.dataset}: published {c.published:.2f}x, predicted {c.predicted:.2f}x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
