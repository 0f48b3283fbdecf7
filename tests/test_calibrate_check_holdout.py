"""`calibrate check` says what it held out and never reports in-sample predictions as held out: group
sizes both fitted and predicted, or a --predict file that repeats the fitted measurements, are refused
in one line; --predict files at another link rate are named with their rates, and rows from several
files say which file each comes from. Unmeasured group sizes and malformed lists are named by option.
Measured on the shipped 8-host testbed sweeps (200 and 400 Mb/s)."""

from __future__ import annotations

import json
import shutil
from importlib import resources

import pytest

from tests.inputs_support import invoke, refused

TESTBED = resources.files("clustersim.validation").joinpath("testbed")
S200 = str(TESTBED.joinpath("gloo-8hosts-200mbit.json"))
S400 = str(TESTBED.joinpath("gloo-8hosts-400mbit.json"))


@pytest.fixture(scope="module")
def only8(tmp_path_factory) -> str:
    """The 200 Mb/s sweep's 8-host groups alone: a file that measured one group size."""
    raw = json.loads(TESTBED.joinpath("gloo-8hosts-200mbit.json").read_text())
    raw["collectives"] = [r for r in raw["collectives"] if r["nodes"] == 8]
    path = tmp_path_factory.mktemp("only8") / "only8.json"
    path.write_text(json.dumps(raw))
    return str(path)


@pytest.mark.parametrize(
    "train,test,shared",
    [("2,4", "4", "[4]"), ("2,4", "2,4", "[2, 4]"), ("2,4", "4,8", "[4]"), ("4,8", None, "[8]")],
)
def test_a_group_size_fitted_and_predicted_is_refused(train, test, shared):
    args = ["calibrate", "check", S200, "--train-ranks", train] + (["--test-ranks", test] if test else [])
    out = refused(invoke(*args), "--train-ranks", "--test-ranks", "is not held out")
    assert f"share {shared}" in out


def test_predicting_the_fitted_file_again_is_refused(tmp_path):
    copy = tmp_path / "copy.json"
    shutil.copy(S200, copy)
    for again in (S200, str(copy)):  # the same file, or another file holding the same measurements
        refused(
            invoke("calibrate", "check", S200, "--predict", again), again, "--predict", "same measurements"
        )


def test_disjoint_group_sizes_of_the_fitted_file_as_predict_are_held_out():
    r = invoke(
        "calibrate", "check", S200, "--predict", S200, "--train-ranks", "2,4", "--test-ranks", "8", "--json"
    )
    assert r.exit_code == 0, r.output
    assert {row["nodes"] for row in json.loads(r.stdout)["rows"]} == {8}


def test_predict_at_another_link_rate_names_the_files_and_rates():
    r = invoke("calibrate", "check", S200, "--predict", S400, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["held_out"] == "group sizes [8] of gloo-8hosts-400mbit.json (400 Mb/s)"
    assert data["fitted"] == [{"file": "gloo-8hosts-200mbit.json", "link_rate_gbps": 0.2}]
    assert data["predicted"] == [{"file": "gloo-8hosts-400mbit.json", "link_rate_gbps": 0.4}]
    assert {row["file"] for row in data["rows"]} == {"gloo-8hosts-400mbit.json"}
    text = " ".join(invoke("calibrate", "check", S200, "--predict", S400).output.split())
    assert (
        "fitted on 200 Mb/s at [2, 4, 8] ranks (gloo-8hosts-200mbit.json), predicting 400 Mb/s at [8] "
        "ranks (gloo-8hosts-400mbit.json)" in text
    )


def test_rows_from_two_files_say_which_file(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    r = invoke("calibrate", "check", S200, S400, "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["rows"]
    same = [row for row in rows if row["op"] == "all_reduce" and row["bytes"] == 8 * 2**20]
    assert sorted(row["file"] for row in same) == ["gloo-8hosts-200mbit.json", "gloo-8hosts-400mbit.json"]
    text = invoke("calibrate", "check", S200, S400).output
    assert "file" in text and "gloo-8hosts-400mbit.json" in text.split("all_reduce", 1)[1]
    assert "fitted on 200 Mb/s and 400 Mb/s at [2, 4] ranks" in " ".join(text.split())


def test_an_unmeasured_group_size_to_predict_names_test_ranks(only8):
    out = refused(invoke("calibrate", "check", only8, "--test-ranks", "4"), only8, "--test-ranks", "[4]")
    assert "--train-ranks" not in out and "measured group sizes [8]" in out


def test_an_unmeasured_group_size_to_fit_is_named_with_the_measured_ones():
    out = refused(invoke("calibrate", "check", S200, "--train-ranks", "2,16"), "--train-ranks", "[16]")
    assert "not measured" in out and "[2, 4, 8]" in out and "besides the predicted" not in out


def test_the_shipped_sweep_is_not_suggested_to_itself(tmp_path):
    out = refused(
        invoke("calibrate", "check", S200, "--train-ranks", "2", "--test-ranks", "8"), "--train-ranks"
    )
    assert "gloo-8hosts-200mbit.json" not in out
    raw = json.loads(TESTBED.joinpath("gloo-8hosts-200mbit.json").read_text())
    raw["collectives"] = [r for r in raw["collectives"] if r["nodes"] in (4, 8)]
    (tmp_path / "mine.json").write_text(json.dumps(raw))
    out = refused(invoke("calibrate", "check", tmp_path / "mine.json"), "--train-ranks", "two or more")
    assert "gloo-8hosts-200mbit.json" in out


@pytest.mark.parametrize("value,words", [("", "is empty"), ("2,,4", "empty entry"), ("2,", "empty entry")])
def test_empty_group_size_lists_are_refused(value, words):
    refused(invoke("calibrate", "check", S200, "--train-ranks", value), "--train-ranks", words)


@pytest.mark.parametrize(
    "name", ["mlp-200mbit-1.json", "transformer-200mbit-1.json", "paired-mlp-200mbit-1.json"]
)
def test_testbed_validate_files_are_checked_on_their_sweep(name):
    """A `testbed validate` file keeps the sweep its prediction was fitted on under `sweep`."""
    r = invoke("calibrate", "check", str(TESTBED.joinpath(name)), "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["train_ranks"] == [2, 4] and data["test_ranks"] == [8] and data["summary"]["points"] > 0
    assert data["fitted"] == [{"file": name, "link_rate_gbps": 0.2}]


def test_fit_points_to_a_validate_files_sweep(tmp_path):
    path = str(TESTBED.joinpath("mlp-200mbit-1.json"))
    refused(invoke("calibrate", "fit", path, "--out", tmp_path / "p.json"), path, "format", "`sweep`")
    assert not (tmp_path / "p.json").exists()
