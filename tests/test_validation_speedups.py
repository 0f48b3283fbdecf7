"""Speedups per scale (clustersim.validation.speedups) against a hand-made validation report, and the
`validate` command's table and JSON for a dataset with two optimizers on the same GPU counts."""

import json

import pytest
from typer.testing import CliRunner

from clustersim.cli import app
from clustersim.validation.published import Dataset, Row, RowResult, ValidationReport
from clustersim.validation.speedups import speedups_by_scale


def _report(metric: str, values: dict[tuple[str, int], tuple[float, float]]) -> ValidationReport:
    rows = [Row(optimizer=o, gpus=g, published=pub) for (o, g), (pub, _) in values.items()]
    data = Dataset(name="t", description="t", source="t", scenario="preset:default", metric=metric, rows=rows)
    results = [
        RowResult(o, g, pub, pred, pred / pub - 1) for (o, g), (pub, pred) in values.items()
    ]  # fmt: skip
    return ValidationReport(data, results)


# adam then onebit at 4, 8, 16 GPUs (published, predicted samples/s); 4 GPUs per node below
HAND = {
    ("adam", 4): (100.0, 100.0),
    ("adam", 8): (50.0, 40.0),
    ("adam", 16): (80.0, 80.0),
    ("onebit", 4): (150.0, 120.0),
    ("onebit", 8): (200.0, 200.0),
    ("onebit", 16): (400.0, 320.0),
}


def test_speedups_per_gpu_count_by_hand():
    scale = speedups_by_scale(_report("samples_per_s", HAND), gpus_per_node={None: 4})
    (trend,) = scale.trends
    assert (trend.optimizer, trend.baseline) == ("onebit", "adam")  # the first-listed is the baseline
    got = [(p.gpus, p.published, p.predicted) for p in trend.points]
    # 150/100, 120/100; 200/50, 200/40; 400/80, 320/80
    assert got == [(4, 1.5, 1.2), (8, 4.0, 5.0), (16, 5.0, 4.0)]
    assert [round(p.error, 9) for p in trend.points] == [-0.2, 0.25, -0.2]
    assert scale.median_abs_error == pytest.approx(0.2)
    worst_trend, worst = scale.worst
    assert worst.gpus == 8 and worst.error == pytest.approx(0.25)
    # across nodes (8 -> 16 GPUs): published 4.0 -> 5.0 rises, predicted 5.0 -> 4.0 falls
    assert (trend.trend_points[0].gpus, trend.trend_points[-1].gpus) == (8, 16)
    assert (trend.published_trend, trend.predicted_trend, trend.same_sign) == (1, -1, False)
    assert trend.steps == [(4, 8, 1, 1), (8, 16, 1, -1)]
    d = scale.as_dict()
    assert d["trend_signs_match"] is False and d["max_abs_error"] == pytest.approx(0.25)


def test_trend_over_all_points_inside_one_node():
    # 16 GPUs per node: no two multi-node points, so the trend is read from 4 to 16 GPUs
    scale = speedups_by_scale(_report("samples_per_s", HAND), gpus_per_node={None: 16})
    (trend,) = scale.trends
    assert (trend.trend_points[0].gpus, trend.published_trend, trend.predicted_trend) == (4, 1, 1)
    assert trend.same_sign


def test_times_invert_into_speedups():
    # iteration times: the speedup is the baseline's time over the optimizer's
    times = {("adam", 8): (2.0, 3.0), ("onebit", 8): (1.0, 1.0)}
    (trend,) = speedups_by_scale(_report("iteration_time", times), gpus_per_node={None: 4}).trends
    (point,) = trend.points
    assert (point.published, point.predicted) == (2.0, 3.0)


def test_one_optimizer_or_published_speedups_give_no_trends():
    one = {("adam", 4): (1.0, 1.0), ("adam", 8): (2.0, 2.0)}
    assert speedups_by_scale(_report("samples_per_s", one), gpus_per_node={None: 4}).trends == []
    rows = [Row(optimizer="onebit", gpus=8, published=2.0, baseline="adam")]
    data = Dataset(
        name="s", description="s", source="s", scenario="preset:default", metric="speedup", rows=rows
    )
    report = ValidationReport(data, [RowResult("onebit", 8, 2.0, 2.0, 0.0, baseline="adam")])
    assert speedups_by_scale(report).trends == []


def test_validate_prints_and_emits_speedups_per_scale():
    runner = CliRunner()
    out = runner.invoke(app, ["validate", "--samples", "0"])
    assert out.exit_code == 0, out.output
    assert "speedup per GPU count" in out.output
    assert "onebit-adam over adam from 8 to 32 GPUs" in out.output
    got = runner.invoke(app, ["validate", "--samples", "0", "--json"])
    assert got.exit_code == 0, got.output
    scale = json.loads(got.output)["speedups_by_scale"]
    (trend,) = scale["trends"]
    assert [p["gpus"] for p in trend["points"]] == [1, 2, 4, 8, 16, 32]
    # the published speedups are the dataset's own ratios: 1-bit Adam 245 / Adam 45 samples/s at 8 GPUs
    assert trend["points"][3]["published"] == pytest.approx(245 / 45)
    assert (trend["trend_from_gpus"], trend["trend_to_gpus"]) == (8, 32)
    assert trend["published_trend"] == 1
    assert scale["median_abs_error"] >= 0 and scale["worst"]["optimizer"] == "onebit-adam"


def test_megatron_weak_scaling_has_no_speedup_table():
    args = ["validate", "--dataset", "megatron_weak_scaling", "--samples", "0", "--json"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    assert "speedups_by_scale" not in json.loads(out.output)


def test_errors_relative_to_each_series_smallest_run_by_hand():
    from clustersim.validation.speedups import median_relative_error, scaling_by_series

    rows = [Row(optimizer="adam", gpus=g, published=1.0) for g in (8, 16, 64, 8)]
    data = Dataset(name="t", description="t", source="t", scenario="preset:default", rows=rows)
    results = [
        RowResult("adam", 64, 1.0, 1.32, 0.32, series="a"),  # listed out of order on purpose
        RowResult("adam", 8, 1.0, 1.2, 0.2, series="a"),
        RowResult("adam", 16, 1.0, 1.26, 0.26, series="a"),
        RowResult("adam", 8, 1.0, 0.9, -0.1, series="alone"),  # one size: no series
    ]
    (series,) = scaling_by_series(ValidationReport(data, results))
    assert series.name == "a" and [p.gpus for p in series.points] == [8, 16, 64]
    # (1 + e) / (1 + 0.2) - 1: a +20% level shared by every size cancels
    assert [round(p.relative, 9) for p in series.points] == [0.0, 0.05, 0.1]
    assert median_relative_error([series]) == pytest.approx(0.075)


def test_multinode_dataset_prints_errors_with_scale():
    out = CliRunner().invoke(app, ["validate", "--dataset", "multinode_scale", "--samples", "0", "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.output)
    names = {s["series"] for s in got["scaling_by_series"]}
    assert "MLPerf v3.1 GPT-3, NVIDIA Eos-DFW" in names and got["median_abs_relative_error"] >= 0
    assert "speedups_by_scale" not in got  # one optimizer


def test_json_carries_the_tables_signed_error_beside_the_raw_one():
    """`validate --json` gave each row's error as (predicted - published) / published while the tables
    sign a rate's the other way (+ predicted too slow): a throughput predicted 6.3% high read +6.3% in
    the JSON and -6.3% in the table. The JSON keeps the raw ``error`` and adds ``slowness_error``, the
    table's sign, for rows, series points and single-GPU throughput rows."""
    from clustersim.validation.speedups import scaling_by_series

    rows = [Row(optimizer="adam", gpus=g, published=1.0) for g in (8, 16, 8, 8)]
    data = Dataset(name="t", description="t", source="t", scenario="preset:default", rows=rows)
    results = [
        RowResult("adam", 8, 1.0, 1.063, 0.063, metric="tokens_per_s_per_gpu", series="rate"),
        RowResult("adam", 16, 1.0, 1.10, 0.10, metric="tokens_per_s_per_gpu", series="rate"),
        RowResult("adam", 8, 1.0, 1.05, 0.05),  # the dataset's metric: a time
        RowResult("adam", 8, 1.0, 1.2, 0.2, metric="speedup", baseline="adam"),
    ]
    said = [r.as_dict("iteration_time") for r in results]
    assert [d["error"] for d in said] == [0.063, 0.10, 0.05, 0.2]  # raw, as before
    assert [d["slowness_error"] for d in said] == [-0.063, -0.10, 0.05, 0.2]  # a rate's turned
    (series,) = scaling_by_series(ValidationReport(data, results))
    second = series.as_dict()["points"][1]
    assert second["slowness_error"] == -second["error"] and second["slowness_relative"] == -second["relative"]
    # the command: each throughput row's JSON slowness_error is the error its table prints
    args = ["validate", "--dataset", "gpu_steps", "--samples", "0"]
    table = CliRunner().invoke(app, args)
    got = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)["rows"]
    import re

    printed = [m.group(1) for line in table.output.splitlines() if (m := re.search(r"([+-]\d+\.\d)%", line))]
    assert printed == [f"{100 * r['slowness_error']:+.1f}" for r in got], (printed, table.output)
    assert any(r["error"] > 0 > r["slowness_error"] or r["error"] < 0 < r["slowness_error"] for r in got)
