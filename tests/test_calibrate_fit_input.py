"""`calibrate fit` refuses a raw file with nothing to fit (one line naming the file and key, nothing
written), says in one warning line when it cannot fit the collective model (no network recorded), and
`calibrate show` says when a network fit's node-count extrapolation is unchecked (one group size)."""

from __future__ import annotations

import json
from importlib import resources

import pytest
from typer.testing import CliRunner

from clustersim.cli import app
from clustersim.cost_models.network_params import NODE_EXTRAPOLATION_SIGMA
from tests.inputs_support import invoke, refused
from tests.test_inputs_calibration import _raw as compute_raw

SHIPPED = resources.files("clustersim.validation").joinpath("testbed", "gloo-8hosts-200mbit.json")


@pytest.fixture
def sweep() -> dict:
    return json.loads(SHIPPED.read_text())


@pytest.mark.parametrize("empty", [[], None])
def test_a_raw_file_with_nothing_to_fit_is_refused(tmp_path, sweep, empty):
    if empty is None:
        del sweep["collectives"]
    else:
        sweep["collectives"] = empty
    raw, out = tmp_path / "raw.json", tmp_path / "p.json"
    raw.write_text(json.dumps(sweep))
    refused(invoke("calibrate", "fit", raw, "--out", out), str(raw), "collectives", "nothing to fit")
    assert not out.exists()


def test_one_rank_collectives_alone_are_nothing_to_fit(tmp_path, sweep):
    sweep["collectives"] = [{**r, "nodes": 1, "ranks": 1} for r in sweep["collectives"] if r["nodes"] == 2]
    raw, out = tmp_path / "raw.json", tmp_path / "p.json"
    raw.write_text(json.dumps({**sweep, "topology": {"nodes": 1, "gpus_per_node": 1}}))
    refused(invoke("calibrate", "fit", raw, "--out", out), str(raw), "collectives", "nothing to fit")


def test_compute_measurements_without_collectives_are_fitted(tmp_path):
    raw, out = tmp_path / "raw.json", tmp_path / "p.json"
    raw.write_text(json.dumps({**compute_raw(), "collectives": []}))
    r = invoke("calibrate", "fit", raw, "--out", out, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["matmul_tflops"]


def test_collectives_without_a_network_say_the_collective_model_was_not_fitted(tmp_path, sweep):
    del sweep["topology"]["network"]
    sweep["provenance"].pop("testbed", None)
    raw, out = tmp_path / "raw.json", tmp_path / "p.json"
    raw.write_text(json.dumps(sweep))
    r = CliRunner().invoke(app, ["calibrate", "fit", str(raw), "--out", str(out)])
    assert r.exit_code == 0, r.output
    lines = [line for line in r.stderr.splitlines() if "collective model" in line]
    assert len(lines) == 1 and "--cluster" in lines[0] and "topology.network" in lines[0], r.stderr
    profile = json.loads(out.read_text())
    assert "network" not in profile and profile["collectives"]
    assert any(d.startswith("collective model:") for d in profile["provenance"]["defaults"])


def test_the_shipped_sweep_fits_its_network_without_that_warning(tmp_path):
    r = CliRunner().invoke(app, ["calibrate", "fit", str(SHIPPED), "--out", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    assert "collective model" not in r.stderr


def test_show_says_a_one_group_fit_leaves_node_counts_unchecked(tmp_path, monkeypatch, sweep):
    monkeypatch.setenv("COLUMNS", "200")
    sweep["collectives"] = [r for r in sweep["collectives"] if r["nodes"] == 8]
    raw, out = tmp_path / "only8.json", tmp_path / "p8.json"
    raw.write_text(json.dumps(sweep))
    assert invoke("calibrate", "fit", raw, "--out", out).exit_code == 0
    text = " ".join(invoke("calibrate", "show", out).output.split())
    assert "the fit measured one group size (8x1), so its node-count extrapolation is unchecked" in text
    assert f"past 8 nodes its P10–P90 widens by a log-σ of {NODE_EXTRAPOLATION_SIGMA}" in text
    full = tmp_path / "full.json"
    assert invoke("calibrate", "fit", SHIPPED, "--out", full).exit_code == 0
    text = " ".join(invoke("calibrate", "show", full).output.split())
    assert "unchecked" not in text and "extrapolation check: fitted on [2, 4] ranks" in text
