"""`calibrate check` with one group size to fit: no node count can be held out, so it holds out message
sizes (fits the sizes up to 1/8 of the largest measured at that group size, predicts the larger ones)
and says that the node-count extrapolation was not checked. Files that cannot support it are refused
in one line naming the file and the key (exit 2). Measured on the shipped 8-host testbed sweep."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from tests.inputs_support import invoke, refused

SHIPPED = resources.files("clustersim.validation").joinpath("testbed", "gloo-8hosts-200mbit.json")
MiB = 2**20


@pytest.fixture(scope="module")
def sweep() -> dict:
    return json.loads(SHIPPED.read_text())


def _write(path, raw: dict, keep) -> str:
    path.write_text(json.dumps({**raw, "collectives": [r for r in raw["collectives"] if keep(r)]}))
    return str(path)


def test_one_group_size_holds_out_the_large_messages(tmp_path, sweep):
    """The 8-host groups alone (1-32 MiB): fitted on 1-4 MiB, the 8-32 MiB medians come out within 14%
    (median 4.6%), every one inside its P10-P90."""
    path = _write(tmp_path / "eight.json", sweep, lambda r: r["nodes"] == 8)
    r = invoke("calibrate", "check", path, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["mode"] == "message_sizes" and data["train_ranks"] == data["test_ranks"] == [8]
    assert data["held_out"] == "message sizes above 4.00 MiB at 8 ranks" and data["cut_bytes"] == 4 * MiB
    assert data["not_checked"] == "node-count extrapolation not checked: one group size measured"
    rows = data["rows"]
    assert len(rows) == 4 * 3  # four ops at 8, 16 and 32 MiB
    assert {r["bytes"] for r in rows} == {8 * MiB, 16 * MiB, 32 * MiB} and {r["nodes"] for r in rows} == {8}
    assert data["summary"]["median_abs_rel_error"] < 0.08 and data["summary"]["max_abs_rel_error"] < 0.2
    assert data["summary"]["p10_p90_coverage"] >= 0.8
    for row in rows:  # each band holds its own prediction and widens past the fitted sizes
        assert row["p10_s"] < row["predicted_s"] < row["p90_s"]
    text = " ".join(invoke("calibrate", "check", path).output.split())
    assert (
        "held out: message sizes above 4.00 MiB at 8 ranks (fitted on the sizes up to 4.00 MiB); "
        "node-count extrapolation not checked: one group size measured" in text
    )


def test_train_ranks_naming_one_group_size_holds_out_its_large_messages(sweep):
    r = invoke("calibrate", "check", str(SHIPPED), "--train-ranks", "4", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["mode"] == "message_sizes" and data["held_out"] == "message sizes above 4.00 MiB at 4 ranks"
    assert data["not_checked"] == "node-count extrapolation not checked: --train-ranks names one group size"
    assert {(r["nodes"], r["bytes"] > 4 * MiB) for r in data["rows"]} == {(4, True)}


def test_two_or_more_group_sizes_keep_the_node_count_check(sweep):
    r = invoke("calibrate", "check", str(SHIPPED), "--train-ranks", "2,4", "--test-ranks", "8", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["mode"] == "group_sizes" and data["train_ranks"] == [2, 4] and data["test_ranks"] == [8]
    assert "not_checked" not in data and {r["nodes"] for r in data["rows"]} == {8}
    assert len(data["rows"]) == 4 * 6  # every size, held out by node count


def test_too_few_sizes_below_the_cut_is_one_line(tmp_path, sweep):
    """4-32 MiB at 8 hosts: only 4 MiB lies at or below 1/8 of 32 MiB, and one size fixes no line."""
    path = _write(tmp_path / "big.json", sweep, lambda r: r["nodes"] == 8 and r["bytes"] >= 4 * MiB)
    refused(
        invoke("calibrate", "check", path), path, "collectives", "1 message size(s) up to 1/8", "4.00 MiB"
    )


def test_a_group_size_to_fit_that_was_not_measured_is_named(sweep):
    refused(invoke("calibrate", "check", str(SHIPPED), "--train-ranks", "16"), "--train-ranks", "16")


def test_predict_files_without_the_fitted_group_size_are_named(tmp_path, sweep):
    two = _write(tmp_path / "two.json", sweep, lambda r: r["nodes"] == 2)
    eight = _write(tmp_path / "eight.json", sweep, lambda r: r["nodes"] == 8)
    refused(invoke("calibrate", "check", two, "--predict", eight), eight, "--predict", "no group of 2 ranks")


def test_one_group_size_and_another_to_predict_is_refused_as_before(tmp_path, sweep):
    """Predicting another node count from one group size is what the node-count check refuses."""
    path = _write(tmp_path / "eight.json", sweep, lambda r: r["nodes"] == 8)
    refused(
        invoke("calibrate", "check", path, "--predict", str(SHIPPED), "--test-ranks", "4"),
        "--train-ranks",
        "two or more group sizes",
    )
