"""What plan, report and compare print: the option the user gave, one number format, no silent cuts."""

from __future__ import annotations

import json

import pytest
import yaml

from clustersim.cli import app
from clustersim.planner.breakeven import BreakEven, gbps_text, span_text


def _candidates(tmp_path, optimizers: list[str], global_batch: int, steps: int):
    cand = tmp_path / "cand.yaml"
    body = {"base": "preset:default", "vary": {"gpus": [8, 32], "optimizer": optimizers}}
    cand.write_text(yaml.safe_dump({**body, "global_batch": global_batch, "steps": steps}))
    return cand


def test_tokens_override_note_names_tokens_not_steps(runner, tmp_path):
    """`plan --tokens 1e9 --candidates FILE` said "--steps overrides the candidates file's steps"."""
    cand = _candidates(tmp_path, ["adam"], global_batch=512, steps=3000)
    args = ["plan", "--model", "BERT-Large", "--deadline", "30d", "--candidates", str(cand)]
    args += ["--samples", "0", "--price", "3", "--json"]
    d = json.loads(runner.invoke(app, [*args, "--tokens", "1e9"]).stdout)
    assert "--tokens overrides the candidates file's steps (3,000)" in d["recipe_notes"]
    assert not any(n.startswith("--steps") for n in d["recipe_notes"])
    d = json.loads(runner.invoke(app, [*args, "--steps", "4000"]).stdout)
    assert "--steps overrides the candidates file's steps (3,000)" in d["recipe_notes"]


def test_a_global_batch_no_candidate_can_split_names_the_option(runner, tmp_path):
    """`plan --global-batch 3` failed with "global_batch: ...", the file key, not the option given."""
    cand = _candidates(tmp_path, ["adam"], global_batch=512, steps=3000)
    args = ["plan", "--model", "BERT-Large", "--deadline", "30d", "--candidates", str(cand)]
    args += ["--samples", "0", "--price", "3"]
    r = runner.invoke(app, [*args, "--global-batch", "3"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "--global-batch: none of the" in r.output and "global_batch:" not in r.output
    bad = tmp_path / "bad.yaml"  # the file's own key is still named as the key
    bad.write_text(cand.read_text().replace("global_batch: 512", "global_batch: 3"))
    r = runner.invoke(app, [*args[:6], str(bad), *args[7:]])
    assert r.exit_code == 2 and "global_batch: global batch 3" in r.output


def test_one_rank_is_singular(runner):
    r = runner.invoke(
        app,
        ["run", "preset:default", "--set", "cluster.nodes=1", "--set", "cluster.gpus_per_node=1"]
        + ["--set", "training.sharding.stage=3"],
    )
    assert r.exit_code == 0, r.output
    assert "over 1 rank," in r.output and "over 1 ranks" not in r.output


@pytest.mark.parametrize(
    ("gbps", "text"),
    [(66.04840977593088, "66.0"), (66.06, "66.1"), (80.0, "80.0"), (5.0, "5.00"), (213.4, "213")],
)
def test_break_even_rates_in_three_significant_figures(gbps, text):
    """compare printed "below 66 Gb/s" where report printed "66.1": one format, three figures."""
    assert gbps_text(gbps) == text
    found = BreakEven("onebit-adam", "adam", gbps, "crossing", gpus=64, steps=1000)
    assert f"below {text} Gb/s" in found.describe()  # compare and the API
    assert f"below {text} Gb/s" in span_text([found])  # report and plan
