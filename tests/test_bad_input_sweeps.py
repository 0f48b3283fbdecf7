"""Sweeps: two axes that set one key, or a value given twice, are refused (the CSV's columns would say
what was not simulated, or two rows share a row id); a --scheduler that does not answer leaves no results
folder; a report of a sweep that stopped part-way says it is unfinished."""

from __future__ import annotations

import pytest
import yaml

from tests.inputs_support import SCENARIO, invoke, refused


def _sweep(tmp_path, vary) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "base": SCENARIO, "vary": vary}))
    return str(path)


@pytest.mark.parametrize(
    "vary, key",
    [
        ({"nic_gbps": [100, 200], "cluster.nic.line_rate_gbps": [400]}, "cluster.nic.line_rate_gbps"),
        ({"gpus": [8], "nodes": [2]}, "cluster.nodes"),
        ({"gpus": [8], "cluster.nodes": [2]}, "cluster.nodes"),
        ({"model": ["BERT-Large"], "workload.model": ["BERT-Base"]}, "workload.model"),
    ],
)
def test_two_axes_that_set_one_key_are_refused(tmp_path, vary, key):
    r = invoke("sweep", _sweep(tmp_path, vary), "--out", tmp_path / "out", "--samples", "0")
    refused(r, "s.yaml", f"two axes set {key}")
    assert not (tmp_path / "out").exists()


def test_gpus_with_gpus_per_node_is_still_a_sweep(tmp_path):
    r = invoke("sweep", _sweep(tmp_path, {"gpus": [8], "gpus_per_node": [4, 8]}), "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("values, shown", [([100, 100], "100"), ([8, 8.0], "8")])
def test_a_value_given_twice_is_refused(tmp_path, values, shown):
    axis = "nic_gbps" if values[0] == 100 else "gpus"
    r = invoke("sweep", _sweep(tmp_path, {axis: values}), "--out", tmp_path / "out", "--samples", "0")
    refused(r, f"vary.{axis}", f"{shown} is given twice")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("scheduler", ["foo", "tcp://127.0.0.1:1"])
def test_a_scheduler_that_does_not_answer_leaves_no_folder(tmp_path, monkeypatch, scheduler):
    pytest.importorskip("dask.distributed")
    monkeypatch.setenv("CLUSTERSIM_SCHEDULER_TIMEOUT", "1s")
    sweep = _sweep(tmp_path, {"nic_gbps": [100, 200]})
    r = invoke("sweep", sweep, "--out", tmp_path / "out", "--samples", "0", "--scheduler", scheduler)
    refused(r, "--scheduler", "cannot reach")
    assert not (tmp_path / "out").exists()


def test_a_report_of_an_unfinished_sweep_says_so(tmp_path):
    from clustersim.sweeps.run import run_sweep
    from clustersim.sweeps.spec import load_sweep

    sweep = load_sweep(_sweep(tmp_path, {"nic_gbps": [100, 200, 400], "optimizer": ["adam", "binsgdm"]}))
    run_sweep(sweep, tmp_path / "out", batch_size=1, stop_after=2)
    r = invoke("report", tmp_path / "out", "--out", tmp_path / "r.html", "--samples", "0")
    assert r.exit_code == 0, r.output
    assert "the sweep is unfinished: 2 of its 6 rows" in " ".join(r.output.split())
    assert "the sweep is unfinished: 2 of its 6 rows" in (tmp_path / "r.html").read_text()
    r = invoke("sweep", tmp_path / "s.yaml", "--out", tmp_path / "out")  # resumed: the rest run
    assert r.exit_code == 0, r.output
    r = invoke("report", tmp_path / "out", "--out", tmp_path / "r.html", "--samples", "0")
    assert "sweep is unfinished" not in r.output + (tmp_path / "r.html").read_text()
