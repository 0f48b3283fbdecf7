"""An --out (or --trace, --raw-out) that names one of the command's inputs is refused before any work
and leaves the input as it was; `models import --out` adds to a YAML models catalog only."""

from __future__ import annotations

import shutil
from importlib import resources

import pytest

from tests.inputs_support import LLAMA2_7B, SCENARIO, invoke, refused, write_json, write_yaml


def _unchanged(path, before: bytes) -> None:
    assert path.read_bytes() == before


def test_run_trace_onto_the_scenario_is_refused(tmp_path, monkeypatch):
    scenario = tmp_path / "s.yaml"
    write_yaml(scenario, SCENARIO)
    before = scenario.read_bytes()
    monkeypatch.chdir(tmp_path)
    for trace in (scenario, "s.yaml", "./s.yaml"):
        refused(invoke("run", scenario, "--samples", "0", "--trace", trace), "this command's input")
    _unchanged(scenario, before)


def test_a_symlink_to_the_input_is_the_input(tmp_path):
    scenario = tmp_path / "s.yaml"
    write_yaml(scenario, SCENARIO)
    (tmp_path / "link.json").symlink_to(scenario)
    before = scenario.read_bytes()
    refused(invoke("run", scenario, "--samples", "0", "--trace", tmp_path / "link.json"), "input")
    _unchanged(scenario, before)


def test_calibrate_fit_onto_its_raw_file_is_refused(tmp_path):
    raw = tmp_path / "raw.json"
    shutil.copy(resources.files("clustersim.validation").joinpath("testbed", "gloo-8hosts-200mbit.json"), raw)
    before = raw.read_bytes()
    refused(invoke("calibrate", "fit", raw, "--out", raw), str(raw), "this command's input")
    _unchanged(raw, before)


def test_calibrate_run_raw_out_and_out_the_same_file_is_refused(tmp_path, monkeypatch):
    from clustersim.calibration import run

    monkeypatch.setattr(run, "calibrate", lambda *a, **k: pytest.fail("measured before refusing"))
    p = tmp_path / "p.json"
    refused(invoke("calibrate", "run", "--device", "cpu", "--out", p, "--raw-out", p), "--raw-out", "--out")
    assert not p.exists()


def test_report_onto_the_results_folder_files_is_refused(tmp_path_factory):
    from tests.conftest import swept_results

    out = swept_results(tmp_path_factory, "rep", {"name": "r", "base": SCENARIO, "vary": {"nic_gbps": [100]}})
    for name in ("results.csv", "sweep.json", "scenarios.jsonl"):
        before = (out / name).read_bytes()
        refused(invoke("report", out, "--out", out / name, "--samples", "0"), "this command's input")
        _unchanged(out / name, before)


def test_models_import_onto_its_config_a_scenario_or_a_json_file_is_refused(tmp_path):
    config = write_json(tmp_path / "cfg.json", LLAMA2_7B)
    scenario = write_yaml(tmp_path / "s.yaml", SCENARIO)
    before = {p: (tmp_path / p).read_bytes() for p in ("cfg.json", "s.yaml")}
    refused(invoke("models", "import", config, "--out", config), "this command's input")
    refused(invoke("models", "import", config, "--out", scenario), "s.yaml", "not a catalog", "nothing added")
    refused(invoke("models", "import", config, "--out", tmp_path / "m.json"), "m.json", ".yaml")
    for name, data in before.items():
        _unchanged(tmp_path / name, data)
    assert not (tmp_path / "m.json").exists()


def test_models_import_adds_to_a_models_catalog(tmp_path):
    config = write_json(tmp_path / "cfg.json", LLAMA2_7B)
    before = (tmp_path / "cfg.json").read_bytes()
    out = tmp_path / "models.yaml"
    r = invoke("models", "import", config, "--out", out, "--name", "first")
    assert r.exit_code == 0, r.output
    r = invoke("models", "import", config, "--out", out, "--name", "second")
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "first:" in text and "second:" in text
    _unchanged(tmp_path / "cfg.json", before)
