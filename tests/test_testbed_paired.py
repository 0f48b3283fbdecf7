"""Paired measurement on the testbed: speedups as medians of ratios between neighbours in time, the
drift check, the interleaved job, and a paired file predicted again (`testbed repredict`)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from clustersim.cli import app
from clustersim.testbed import paired
from clustersim.testbed import validate as tb_validate
from clustersim.testbed.paired_job import rotation


def test_a_drift_shared_by_both_arms_of_a_pair_cancels():
    """The machine slows by 40% over the run and wobbles round to round; Adam's burst always takes twice
    the compressed optimizer's at the same moment. Every paired ratio is 2; a ratio of block medians
    (Adam's rounds early, the other's late, as blocks measure them) is off by a third."""
    speed = [1.0 + 0.4 * r / 9 + (0.05 if r % 2 else -0.05) for r in range(10)]
    bursts = {"adam": [2.0 * s for s in speed], "binsgdm": [1.0 * s for s in speed]}
    got = paired.paired_ratios(bursts)["binsgdm"]
    assert got["ratios"] == pytest.approx([2.0] * 10)
    assert (got["speedup"], got["p10"], got["p90"]) == pytest.approx((2.0, 2.0, 2.0))
    blocks = (2.0 * sum(speed[:5]) / 5) / (sum(speed[5:]) / 5)
    assert abs(blocks / 2.0 - 1) > 0.15


def test_the_paired_speedup_is_the_median_of_the_rounds_ratios_with_their_spread():
    bursts = {"adam": [4.0, 4.0, 4.0, 4.0, 4.0], "onebit-adam": [2.0, 1.0, 4.0, 2.0, 2.5]}
    got = paired.paired_ratios(bursts)["onebit-adam"]
    assert got["ratios"] == [2.0, 4.0, 1.0, 2.0, 1.6]
    assert got["speedup"] == 2.0
    assert got["p10"] < 1.6 < 2.0 < 4.0 and got["p10"] >= 1.0 and got["p90"] <= 4.0 and got["p90"] > 2.0
    assert "adam" not in paired.paired_ratios(bursts)
    with pytest.raises(ValueError, match="bursts"):
        paired.paired_ratios({"adam": [1.0, 1.0], "binsgdm": [1.0]})


def test_the_drift_check_tells_slow_drift_from_fast():
    """A slow drift (1% per point, 25% over the run) is what pairing cancels: a large spread, small
    changes between neighbours, not flagged. The same spread reached by jumps between neighbours is."""
    slow = [[1.0 + 0.01 * (5 * r + k) for k in range(5)] for r in range(5)]
    d = paired.drift_check(slow)
    assert d["spread"] > 0.15 and d["neighbour_change"] < 0.011 and not d["exceeded"]
    assert d["slowest_over_fastest"] == pytest.approx(1.24 / 1.0)
    fast = [[1.0, 1.25, 1.0, 1.25, 1.0] for _ in range(5)]
    d = paired.drift_check(fast, tolerance=0.05)
    assert d["neighbour_change"] == pytest.approx(math.log(1.25)) and d["exceeded"]
    assert paired.drift_check(fast, tolerance=0.25)["exceeded"] is False


def test_each_optimizer_takes_each_place_in_turn():
    names = ["adam", "onebit-adam", "binsgdm", "zero-one-adam"]
    orders = [rotation(names, r) for r in range(4)]
    assert all(sorted(o) == sorted(names) for o in orders)
    for place in range(4):
        assert sorted(o[place] for o in orders) == sorted(names)


def test_the_zero_one_adam_scenario_syncs_once_per_interval():
    """What the testbed runs (a sync every `interval` steps past the freeze) is what the scenario's
    schedule weighs: a quarter of the steps sync at interval 4, within 10^-5."""
    from clustersim.optimizer_options import ZeroOneAdamOptions
    from clustersim.simulator.strategies.zero_one_adam import schedule

    for interval in (2, 4, 8):
        counts = schedule(ZeroOneAdamOptions(**tb_validate.zero_one_options(interval)))
        total = sum(counts.values())
        assert set(counts) == {"local", "local_sync"}
        assert counts["local_sync"] / total == pytest.approx(1 / interval, abs=1e-5)


PAIRED_JOB_ARGS = [
    *("--mode", "paired", "--model", "mlp", "--layers", "2", "--width", "40", "--batch", "4"),
    *("--steps", "4", "--burst", "2", "--interval", "2", "--warmup", "2", "--elements", "1024"),
]


def test_the_paired_job_interleaves_every_optimizer_with_the_calibration(tmp_path):
    """On loopback gloo (no root): two rounds, each optimizer once per round in the rotated order, a
    reference time before every burst and at the round's end, the compute and kernel calibration once
    per round, every timed step of every optimizer kept."""
    pytest.importorskip("torch")
    out = tmp_path / "paired.json"
    res = subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"),
            *("--master-port", "29641", "-m", "clustersim.testbed.paired_job", *PAIRED_JOB_ARGS),
            *("--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(out.read_text())
    names = ["adam", "onebit-adam", "binsgdm", "zero-one-adam"]
    assert got["optimizers"] == names and got["rounds"] == 2 and got["hosts"] == 2
    assert got["orders"] == [names, names[1:] + names[:1]]
    assert all(len(got["burst_s"][n]) == 2 and min(got["burst_s"][n]) > 0 for n in names)
    assert [len(r) for r in got["reference_s"]] == [5, 5]
    assert len(got["local_s"]) == 2 and set(got["local_s"][0]) == {"forward", "backward", "optimizer"}
    assert {k["name"] for k in got["kernels"]} >= {"onebit_update", "binsgdm_quantize"}
    assert all(len(k["rounds_s"]) == 2 and k["elements"] == 1024 for k in got["kernels"])
    assert all(got["steps"][n]["step"]["samples"] == 4 for n in names)
    # 0/1 Adam syncs every 2nd step: its mean compressed exchange is half a sync's, never zero
    assert got["step_means_s"]["zero-one-adam"]["collectives"] > 0


def _job_result(hosts: int, rounds: int = 5) -> dict:
    """What paired_job.py returns on ``hosts`` hosts, made up: Adam's bursts twice the others', the
    machine 30% slower in the last rounds."""
    names = list(paired.PAIRED)
    slow = [1.0 if r < (rounds + 1) // 2 else 1.3 for r in range(rounds)]
    per_step = {"adam": 0.3, "onebit-adam": 0.15, "binsgdm": 0.12, "zero-one-adam": 0.1}
    kernels = json.loads(json.dumps(KERNELS))
    return {
        "optimizers": names,
        "burst": 4,
        "rounds": rounds,
        "orders": [rotation(names, r) for r in range(rounds)],
        "burst_s": {n: [4 * per_step[n] * s for s in slow] for n in names},
        "reference_s": [[0.08 * s] * 5 for s in slow],
        "local_s": [{"forward": 0.014 * s, "backward": 0.03 * s, "optimizer": 0.009 * s} for s in slow],
        "kernels": [{**k, "rounds_s": [k["median_s"] * s for s in slow]} for k in kernels],
        "step_means_s": {
            n: {"step": v, "forward": 0.014, "backward": 0.03, "compressed_allreduce": v / 3}
            for n, v in per_step.items()
        },
    }


KERNELS = [
    {"name": k, "elements": 1050624, "bytes": b * 1050624, "median_s": b * 1050624 / 2e10}
    for k, b in {
        "onebit_error_compensate": 12.0, "onebit_norm": 4.0, "onebit_sign_error": 62.0, "onebit_pack": 24.5,
        "onebit_unpack_sum": 36.125, "onebit_server_compress": 51.125, "onebit_unpack_copy": 38.375,
        "onebit_momentum": 20.0, "onebit_update": 68.0, "binsgdm_update": 20.0, "binsgdm_quantize": 8.125,
        "binsgdm_vote": 0.625, "binsgdm_requantize": 0.5625, "binsgdm_apply": 10.125,
    }.items()
]  # fmt: skip


@pytest.fixture
def validated(monkeypatch):
    """validate_paired() on fake hosts: a shipped run's sweep, made-up paired jobs; every prediction
    is the simulator's own."""
    from importlib import resources

    stored = json.loads(
        resources.files("clustersim.validation").joinpath("testbed", "mlp-200mbit-1.json").read_text()
    )

    class Testbed:
        hosts, rate_bits, shaper = 8, 200e6, "tbf"

    monkeypatch.setattr(tb_validate.tb_hosts, "up", lambda *a, **k: (Testbed(), False))
    monkeypatch.setattr(tb_validate, "host_cpus", lambda tb: {"cpus_per_host": 0.25})
    monkeypatch.setattr(tb_validate, "_sweep", lambda *a, **k: stored["sweep"])
    calls = []

    def run_on_hosts(tb, module, args, env, progress, timeout, what, count):
        calls.append((module, args, env))
        return _job_result(count)

    monkeypatch.setattr(tb_validate, "run_on_hosts", run_on_hosts)
    partials = []
    job = tb_validate.Job(steps=20)
    result = paired.validate_paired(
        [2, 4, 8], "200mbit", job, samples=4, partial=lambda r: partials.append(len(r["rows"]))
    )
    return result, calls, partials


def test_a_paired_run_reports_measured_and_predicted_speedups_and_the_drift(validated):
    result, calls, partials = validated
    assert [c[0] for c in calls] == ["clustersim.testbed.paired_job"] * 3
    assert all(c[2]["MALLOC_MMAP_THRESHOLD_"] for c in calls)  # glibc caches, as a GPU allocator does
    assert partials == [4, 8, 12]  # written as it goes, host count by host count
    assert result["protocol"] == "paired" and len(result["rows"]) == 12
    for r in result["rows"]:
        if r["optimizer"] == "adam":
            assert "measured_speedup" not in r
            continue
        expected = {"onebit-adam": 2.0, "binsgdm": 2.5, "zero-one-adam": 3.0}[r["optimizer"]]
        assert r["measured_speedup"] == pytest.approx(expected)  # the slow rounds cancel
        assert r["pair_ratios"] == pytest.approx([expected] * 5)
        assert r["predicted_speedup_p10"] <= r["predicted_speedup"] <= r["predicted_speedup_p90"]
        assert r["speedup_error"] == pytest.approx(r["predicted_speedup"] / expected - 1)
        assert r["speedup_side_agrees"] == (r["predicted_speedup"] > 1)
    # the calibration is the median over the rounds: 3 of 5 rounds were at the fast speed
    assert result["rows"][0]["calibration_phases_s"]["forward"] == pytest.approx(0.014)
    drift = result["paired"]["hosts"][0]["drift"]
    assert drift["slowest_over_fastest"] == pytest.approx(1.3) and not drift["exceeded"]


def test_a_paired_file_repredicts_to_what_it_predicted(validated):
    result, _, _ = validated
    again = paired.repredict(json.loads(json.dumps(result)), "paired.json", samples=4)
    for old, new in zip(result["rows"], again["rows"]):
        for key in ("predicted_s", "predicted_speedup", "predicted_speedup_p10", "predicted_speedup_p90"):
            if key in old:
                assert new[key] == pytest.approx(old[key], rel=1e-12), (old["optimizer"], old["hosts"], key)
        for key in ("measured_speedup", "pair_ratios", "speedup_inside"):
            assert new.get(key) == old.get(key)


def test_repredict_prints_the_speedup_table(runner, validated, tmp_path):
    result, _, _ = validated
    path = tmp_path / "paired.json"
    path.write_text(json.dumps(result))
    res = runner.invoke(app, ["testbed", "repredict", str(path), "--samples", "4"])
    assert res.exit_code == 0, res.output
    assert "speedup over Adam" in res.output and "zero-one-adam" in res.output
    assert "on the measured side of 1.0" in res.output and "drift over the run 30%" in res.output


def test_a_paired_file_with_a_bad_ratio_is_one_line_naming_it(runner, validated, tmp_path):
    result, _, _ = validated
    stored = json.loads(json.dumps(result))
    stored["rows"][1]["pair_ratios"][2] = -1.0
    path = tmp_path / "paired.json"
    path.write_text(json.dumps(stored))
    res = runner.invoke(app, ["testbed", "repredict", str(path)])
    assert res.exit_code == 2 and f"{path}: rows.1.pair_ratios.2" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--optimizers", "adam,zero3"], "zero3 is measured in blocks"),
        (["--optimizers", "onebit-adam,binsgdm"], "add adam"),
        (["--optimizers", "adam,zero-one-adam", "--blocks"], "paired only"),
        (["--burst", "3"], "whole number"),
        (["--steps", "2", "--burst", "4"], "at most --steps 2"),
    ],
)
def test_paired_validate_refuses_what_it_cannot_pair_before_any_work(runner, args, expected, monkeypatch):
    monkeypatch.setattr(paired, "validate_paired", lambda *a, **k: pytest.fail("measured before refusing"))
    res = runner.invoke(app, ["testbed", "validate", *args])
    assert res.exit_code == 2 and expected in res.output and "Traceback" not in res.output, res.output


PAIRED_RUNS = {m: [f"paired-{m}-200mbit-{r}.json" for r in (1, 2)] for m in ("mlp", "transformer")}
NAMES = {"onebit-adam": "1-bit Adam", "binsgdm": "BinSGDM", "zero-one-adam": "0/1 Adam"}


def _stored(name: str) -> dict:
    from importlib import resources

    return json.loads(resources.files("clustersim.validation").joinpath("testbed", name).read_text())


@pytest.mark.parametrize("name", [n for names in PAIRED_RUNS.values() for n in names])
def test_the_stored_paired_runs_repredict_to_what_they_store(name):
    """Their predicted steps and speedups are today's model's. When a model change moves them on purpose:
    `clustersim testbed repredict F --out F` for each, and docs/testbed.md's paired table."""
    stored = _stored(name)
    again = paired.repredict(stored, name)
    for old, new in zip(stored["rows"], again["rows"]):
        where = (name, old["optimizer"], old["hosts"])
        for key in ("predicted_s", "predicted_speedup", "predicted_speedup_p10", "predicted_speedup_p90"):
            if key in old:
                assert new[key] == pytest.approx(old[key], rel=1e-9), (*where, key)


def _speedup_rows() -> list[tuple[str, int, str, list[dict]]]:
    out = []
    for model, names in PAIRED_RUNS.items():
        runs = [_stored(n)["rows"] for n in names]
        for hosts in (2, 4, 8):
            for opt in NAMES:
                out.append(
                    (
                        model,
                        hosts,
                        opt,
                        [r for rows in runs for r in rows if (r["hosts"], r["optimizer"]) == (hosts, opt)],
                    )
                )
    return out


def test_the_stored_paired_speedups_are_predicted():
    """What the paired runs are for: the predicted speedup within 10% of the measured one (median over
    both repeats' 18 cases), the measured one inside the predicted P10-P90 in at least 80%, and the
    prediction on the measured side of 1.0 every time."""
    rows = [r for *_, rs in _speedup_rows() for r in rs]
    assert len(rows) == 36
    errors = sorted(abs(r["speedup_error"]) for r in rows)
    assert (errors[17] + errors[18]) / 2 <= 0.10
    assert sum(r["speedup_inside"] for r in rows) >= 0.8 * len(rows)
    assert all(r["speedup_side_agrees"] for r in rows)


def test_the_docs_paired_table_is_what_the_stored_runs_say():
    from pathlib import Path

    docs = (Path(__file__).parents[1] / "docs" / "testbed.md").read_text()
    label = {"mlp": "MLP", "transformer": "transformer"}

    def speedup(r: dict, key: str) -> str:
        return f"{r[key]:.2f} ({r[key + '_p10']:.2f}–{r[key + '_p90']:.2f})"

    for model, hosts, opt, (one, two) in _speedup_rows():
        measured = "; ".join(speedup(r, "measured_speedup") for r in (one, two))
        agree = abs(one["measured_speedup"] / two["measured_speedup"] - 1)
        predicted = "; ".join(
            speedup(r, "predicted_speedup") + (" ✓" if r["speedup_inside"] else "") for r in (one, two)
        )
        line = f"| {label[model]} | {hosts} | {NAMES[opt]} | {measured} | {100 * agree:.1f}% | {predicted} |"
        assert line in docs, line
