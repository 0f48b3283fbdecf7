"""One break-even: `compare` (bisecting from the whole bandwidth range) and `report` (bisecting between a
sweep's two line rates around the crossing) give the same line rate per NIC, for the same whole run."""

import json
import shutil
from pathlib import Path

import pytest

from clustersim.api import compare, load_scenario, sweep
from clustersim.cli import app

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    folder = tmp_path_factory.mktemp("agree")
    shutil.copy(EXAMPLES / "a100-8gpu-ethernet.yaml", folder / "base.yaml")
    (folder / "sweep.yaml").write_text(
        "name: agree\nbase: base.yaml\nvary:\n  gpus: [16, 32]\n  nic_gbps: [25, 400]\n"
        "  optimizer: [adam, onebit-adam]\nsteps: 1000\nglobal_batch: 512\nsamples: 0\n"
    )
    sweep(folder / "sweep.yaml", folder / "res", workers=1)
    return folder


@pytest.mark.parametrize("steps", ["1000", "adam=1000,onebit-adam=1200"])
def test_compare_and_report_agree_on_every_break_even(runner, swept, steps):
    res = runner.invoke(
        app,
        ["report", str(swept / "res"), "--out", str(swept / "r.html"), "--steps", steps, "--json"],
    )
    assert res.exit_code == 0, res.output
    reported = json.loads(res.stdout)["models"]["BERT-Large"]["break_even"]
    assert sorted(b["gpus"] for b in reported) == [16, 32]  # the sweep crosses at both counts
    for b in reported:
        table = compare(
            swept / "base.yaml",
            ["adam", "onebit-adam"],
            [b["gpus"]],
            samples=0,
            global_batch=512,
            steps=steps,
        )
        (found,) = table.break_even
        assert found.verdict == "crossing" and b["rate"] == found.to_dict()["rate"]
        assert found.gbps == pytest.approx(b["gbps"], rel=0.01), b["gpus"]
        assert (found.steps, found.baseline_steps) == (b["steps"], b["baseline_steps"])


def test_a_break_even_where_the_micro_batch_was_shrunk_to_fit_is_reports(runner, tmp_path):
    """GPT-2 1.5B on 40 GB A100s at a global batch of 4,096: the table's cells run with the micro-batch
    halved to fit (their notes say so), but the break-even search used the unfitted one and said
    "not computed: does not fit in GPU memory". It fits as the cells do, and agrees with report's
    break-even on a sweep of the same settings (whose rows fit the same way)."""
    shutil.copy(EXAMPLES / "team-a100-40gb-25gbe.yaml", tmp_path / "base.yaml")
    (tmp_path / "sweep.yaml").write_text(
        "name: fitted\nbase: base.yaml\nvary:\n  model: [GPT-2-1.5B]\n  gpus: [64]\n  nic_gbps: [25, 200]\n"
        "  optimizer: [adam, onebit-adam, binsgdm]\nsteps: 100000\nglobal_batch: 4096\nsamples: 0\n"
    )
    sweep(tmp_path / "sweep.yaml", tmp_path / "res", workers=1)
    steps = "adam=100000,binsgdm=110000"
    res = runner.invoke(
        app, ["report", str(tmp_path / "res"), "--out", str(tmp_path / "r.html"), "--steps", steps, "--json"]
    )
    assert res.exit_code == 0, res.output
    reported = {b["optimizer"]: b for b in json.loads(res.stdout)["models"]["GPT-2-1.5B"]["break_even"]}
    assert set(reported) == {"onebit-adam", "binsgdm"}
    scenario = load_scenario(tmp_path / "base.yaml", {"workload.model": "GPT-2-1.5B"})
    table = compare(scenario, ["onebit-adam", "binsgdm"], [64], samples=0, global_batch=4096, steps=steps)
    assert table.break_even_error is None, table.break_even_error
    assert any("does not fit in GPU memory" in note for note in table.notes)  # the cells were fitted
    for found in table.break_even:
        b = reported[found.optimizer]
        assert found.verdict == "crossing"
        assert found.gbps == pytest.approx(b["gbps"], rel=0.01), found.optimizer
