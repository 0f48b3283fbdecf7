"""One break-even: `compare` (bisecting from the whole bandwidth range) and `report` (bisecting between a
sweep's two line rates around the crossing) give the same line rate per NIC, for the same whole run."""

import json
import shutil
from pathlib import Path

import pytest

from clustersim.api import compare, sweep
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
