"""testbed repredict: a stored `testbed validate --out` file is predicted again from what it stores (its
sweep, each host count's compute and kernel calibration), so a model change is checked against real
runs without hosts. What it predicts must be what validate predicted from the same measurements."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from clustersim.cli import app
from clustersim.testbed import validate as tb_validate

STORED = "mlp-zero3-200mbit-1.json"  # a shipped run: its sweep has all-reduce, all-gather, reduce-scatter


def _stored() -> dict:
    return json.loads(resources.files("clustersim.validation").joinpath("testbed", STORED).read_text())


def _kernels(params: int) -> list[dict]:
    """The compressed optimizers' kernels as the kernel calibration records them (names, sizes)."""
    rates = {  # bytes per element, as compressed_job.py --mode kernels names and counts them
        "onebit_error_compensate": 12.0, "onebit_norm": 4.0, "onebit_sign_error": 62.0, "onebit_pack": 24.5,
        "onebit_unpack_sum": 36.125, "onebit_server_compress": 51.125, "onebit_unpack_copy": 38.375,
        "onebit_momentum": 20.0, "onebit_update": 68.0, "binsgdm_update": 20.0, "binsgdm_quantize": 8.125,
        "binsgdm_vote": 0.625, "binsgdm_requantize": 0.5625, "binsgdm_apply": 10.125,
    }  # fmt: skip
    return [
        {"name": k, "elements": params, "bytes": b * params, "median_s": b * params / 2e9}
        for k, b in rates.items()
    ]


@pytest.fixture
def validated(monkeypatch):
    """validate() on fake hosts: the stored run's sweep, its compute calibration, made-up kernels and
    measured steps; every prediction is the simulator's own."""
    stored = _stored()
    job = tb_validate.Job(**stored["job"])

    class Testbed:
        hosts, rate_bits, shaper = 8, 200e6, "tbf"

    monkeypatch.setattr(tb_validate.tb_hosts, "up", lambda *a, **k: (Testbed(), False))
    monkeypatch.setattr(tb_validate, "host_cpus", lambda tb: {"cpus_per_host": 0.25})
    monkeypatch.setattr(tb_validate, "_sweep", lambda *a, **k: stored["sweep"])
    calibration = {r["hosts"]: r["calibration_phases_s"] for r in stored["rows"]}

    def run_on_hosts(tb, module, args, env, progress, timeout, what, count):
        if "--mode" in args and args[args.index("--mode") + 1] == "local":
            return {"hosts": count, **{k: {"median_s": v} for k, v in calibration[count].items()}}
        if "kernels" in args:
            return {"kernels": _kernels(job.params)}
        step = 0.1 * count
        phases = {"step": {"median_s": step, "p10_s": 0.9 * step, "p90_s": 1.1 * step}}
        if module.endswith("compressed_job"):
            phases["compressed_allreduce"] = {"median_s": step / 2}
        return phases

    monkeypatch.setattr(tb_validate, "run_on_hosts", run_on_hosts)
    result = tb_validate.validate([2, 4, 8], "200mbit", job, ("adam", "onebit-adam", "binsgdm"), samples=8)
    return result


def test_repredict_gives_what_validate_predicted_from_the_same_measurements(validated):
    again = tb_validate.repredict(json.loads(json.dumps(validated)), "stored.json", samples=8)
    assert len(again["rows"]) == len(validated["rows"]) == 9
    for old, new in zip(validated["rows"], again["rows"]):
        for key in ("predicted_s", "predicted_p10_s", "predicted_p90_s", "error", "inside"):
            assert new[key] == pytest.approx(old[key], rel=1e-12), (old["optimizer"], old["hosts"], key)
        for key in ("measured_s", "measured_p10_s", "measured_p90_s", "calibration_kernels"):
            assert new[key] == old[key]
    compressed = [r for r in again["rows"] if r["optimizer"] != "adam"]
    assert all(r["calibration_kernels"] and r["predicted_breakdown_s"]["compression"] > 0 for r in compressed)


def test_repredict_cli_prints_the_table_and_writes_the_file(runner, validated, tmp_path):
    stored, out = tmp_path / "run.json", tmp_path / "again.json"
    stored.write_text(json.dumps(validated))
    res = runner.invoke(app, ["testbed", "repredict", str(stored), "--samples", "8", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "binsgdm" in res.output and "median |error|" in res.output
    assert json.loads(out.read_text())["rows"][-1]["predicted_s"] == pytest.approx(
        validated["rows"][-1]["predicted_s"]
    )


@pytest.mark.parametrize(
    "change, key",
    [
        (lambda d: d["rows"][1].update(calibration_kernels=None), "rows.1.calibration_kernels"),
        (lambda d: d["rows"][0].pop("calibration_phases_s"), "rows.0.calibration_phases_s"),
        (lambda d: d.pop("sweep"), "sweep"),
        (lambda d: d.update(rows=[]), "rows"),
        (lambda d: d.update(job={"model": "mlp", "colour": 3}), "job"),
        (lambda d: d["rows"][0].update(measured_s=0), "rows.0.measured_s"),
        (lambda d: d["rows"][0].update(hosts=float("inf")), "rows.0.hosts"),
        (lambda d: d["rows"][0].update(hosts=True), "rows.0.hosts"),
        (lambda d: d["rows"][2]["calibration_kernels"][0].update(median_s=0), "rows.2.calibration_kernels.0"),
        (lambda d: d["rows"][0]["calibration_phases_s"].update(forward="x"), "rows.0.calibration_phases_s"),
        (lambda d: d["job"].update(width=10**9), "rows.0"),  # a model too large to simulate
        (lambda d: d.update(rate="fast"), "rate"),
        (lambda d: d["sweep"]["collectives"][0].update(median_s=-1), "sweep.collectives.0.median_s"),
    ],
)
def test_a_file_it_cannot_repredict_is_one_line_naming_the_key(runner, validated, tmp_path, change, key):
    stored = json.loads(json.dumps(validated))  # as read from a file: no row shares another's lists
    change(stored)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(stored))
    res = runner.invoke(app, ["testbed", "repredict", str(path)])
    assert res.exit_code == 2, res.output
    assert f"{path}: {key}" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_a_shipped_run_without_compressed_rows_is_repredicted_as_is(runner):
    """Files written before the kernels were stored still re-predict their DDP and ZeRO-3 rows."""
    again = tb_validate.repredict(_stored(), STORED, samples=0)
    assert [r["measured_s"] for r in again["rows"]] == [r["measured_s"] for r in _stored()["rows"]]
    assert all(r["predicted_s"] > 0 for r in again["rows"])


REFERENCE = {  # docs/testbed.md's table: (label, files) per block of rows
    "MLP, 200 Mb/s": ("mlp-200mbit-1.json", "mlp-200mbit-2.json"),
    "transformer, 200 Mb/s": ("transformer-200mbit-1.json", "transformer-200mbit-2.json"),
    "MLP, 1 Gb/s": ("mlp-1gbit.json",),
}


def _reference(name: str) -> dict:
    return json.loads(resources.files("clustersim.validation").joinpath("testbed", name).read_text())


@pytest.mark.parametrize(
    "name",
    [n for files in REFERENCE.values() for n in files]
    + ["mlp-zero3-200mbit-shares.json", "transformer-200mbit-3.json"],
)
def test_the_shipped_reference_runs_repredict_to_what_they_store(name):
    """The reference runs' predicted columns are today's model's. When a model change moves them on
    purpose: `clustersim testbed repredict F --out F` for each, and docs/testbed.md's table (below)."""
    stored = _reference(name)
    again = tb_validate.repredict(stored, name)
    for old, new in zip(stored["rows"], again["rows"]):
        where = (name, old["optimizer"], old["hosts"])
        assert new["predicted_s"] == pytest.approx(old["predicted_s"], rel=1e-9), where
        assert new["inside"] == old["inside"], where


def test_the_docs_table_is_what_the_reference_runs_say():
    def cell(r: dict) -> str:
        mark = " ✓" if r["inside"] else ""
        return f"{r['measured_s'] * 1e3:.0f} → {r['predicted_s'] * 1e3:.0f} ({r['error'] * 100:+.0f}%){mark}"

    docs = (Path(__file__).parents[1] / "docs" / "testbed.md").read_text()
    for label, files in REFERENCE.items():
        runs = [_reference(f)["rows"] for f in files]
        for j, n in enumerate((2, 4, 8)):
            cells = [
                "; ".join(cell(r) for rows in runs for r in rows if r["hosts"] == n and r["optimizer"] == opt)
                for opt in ("adam", "onebit-adam", "binsgdm")
            ]
            line = f"| {label if j == 0 else ''} | {n} | " + " | ".join(cells) + " |"
            assert line in docs, line
