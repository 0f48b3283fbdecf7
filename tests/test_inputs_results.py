"""The input battery, sweep results read back by ``report``: a damaged results folder is refused with
the file and the line, never a traceback and never a number a sweep cannot write (a negative time
became a cost of "$-7")."""

from __future__ import annotations

import shutil

import pytest

from tests.inputs_support import invoke, refused


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from clustersim.sweeps.run import run_sweep
    from clustersim.sweeps.spec import load_sweep
    from tests.test_hardening import small_sweep

    tmp = tmp_path_factory.mktemp("results")
    run_sweep(load_sweep(small_sweep(tmp, {"gpus": [4, 8]})), tmp / "out")
    return tmp / "out"


def _set_cell(folder, column, value):
    path = folder / "results.csv"
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[1].split(",")
    cells[header.index(column)] = value
    lines[1] = ",".join(cells)
    path.write_text("\n".join(lines) + "\n")


def _append_jsonl(folder, text):
    with (folder / "scenarios.jsonl").open("a") as fh:
        fh.write(text + "\n")


def _replace_scenarios(folder, make):
    """Rewrite every scenarios.jsonl record with ``make(record)``."""
    import json

    path = folder / "scenarios.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path.write_text("".join(json.dumps(make(r)) + "\n" for r in records))


# (damage, file named, words)
DAMAGE = {
    "jsonl-not-a-scenario": (
        lambda f: _replace_scenarios(
            f, lambda r: {**r, "scenario": {"cluster": 5, "training": {"parallelism": 1}}}
        ),
        "scenarios.jsonl",
        "",
    ),
    "jsonl-empty": (
        lambda f: (f / "scenarios.jsonl").write_text(""),
        "scenarios.jsonl",
        "no scenario for row",
    ),
    "negative-time": (
        lambda f: _set_cell(f, "iteration_time_s", "-7"),
        "results.csv",
        "line 2: iteration_time_s",
    ),
    "negative-bytes": (lambda f: _set_cell(f, "inter_node_bytes", "-1e9"), "results.csv", "negative"),
    "jsonl-garbage": (lambda f: _append_jsonl(f, '{"row_id": "x", "scen'), "scenarios.jsonl", "line 3"),
    "jsonl-list": (lambda f: _append_jsonl(f, "[1, 2]"), "scenarios.jsonl", "not a scenario record"),
    "jsonl-no-scenario": (
        lambda f: _append_jsonl(f, '{"row_id": "x", "scenario": 5}'),
        "scenarios.jsonl",
        "mapping",
    ),
    "jsonl-deep": (lambda f: _append_jsonl(f, "[" * 5000 + "]" * 5000), "scenarios.jsonl", "nested deeper"),
    "jsonl-not-utf8": (
        lambda f: (f / "scenarios.jsonl").write_bytes(b"\xff\xfe\n"),
        "scenarios.jsonl",
        "UTF-8",
    ),
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_report_refuses_a_damaged_results_folder(results, tmp_path, how):
    damage, where, words = DAMAGE[how]
    folder = tmp_path / "copy"
    shutil.copytree(results, folder)
    damage(folder)
    out = tmp_path / "r.html"
    refused(invoke("report", folder, "--out", out), where, words)
    assert not out.exists()


def test_report_on_the_undamaged_folder_works(results, tmp_path):
    r = invoke("report", results, "--out", tmp_path / "r.html")
    assert r.exit_code == 0, r.output
