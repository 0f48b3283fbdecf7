"""`plan --have`: its file checked as every scenario is, its messages naming what was given, and its rent
rows priced where they are shown."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from clustersim.cli import app
from clustersim.errors import InputError
from clustersim.planner.upgrades import recommendation_text
from clustersim.scenario import validate_scenario

TEAM = "examples/team-a100-40gb-25gbe.yaml"
PLAN = ["plan", "--model", "BERT-Large", "--steps", "1000", "--samples", "0"]


def _team(tmp_path, edit) -> str:
    data = yaml.safe_load(open(TEAM).read())  # noqa: SIM115
    edit(data)
    path = tmp_path / "have.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_too_many_nodes_names_the_nodes_and_the_gpus_each_by_its_name():
    data = yaml.safe_load(open(TEAM).read())  # noqa: SIM115
    data["cluster"]["nodes"] = 100_000_000
    with pytest.raises(InputError) as exc:
        validate_scenario(data, source="team.yaml")
    assert exc.value.key == "cluster.nodes"
    assert exc.value.message.startswith("100,000,000 nodes x 8 GPUs = 800,000,000 GPUs is beyond")
    assert "GPUs in one cluster" in exc.value.message


def test_an_unknown_model_in_the_have_file_is_refused_naming_file_and_key(tmp_path):
    path = _team(tmp_path, lambda d: d["workload"].update(model="BERT-Largest"))
    r = CliRunner().invoke(app, [*PLAN, "--deadline", "30d", "--have", path])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1
    assert path in r.output and "workload.model" in r.output and "BERT-Largest" in r.output


def test_without_a_budget_the_verdict_names_only_the_deadline():
    slow = {"option": "keep", "what": "as owned", "optimizer": "adam", "layout": "DP", "ttt_h": 9.0}
    slow |= {"capital": 0, "run_cost": 10, "meets": False}
    assert recommendation_text(None, [slow], budget_given=False).startswith(
        "No option meets the deadline; the fastest is keep"
    )
    assert recommendation_text(None, [slow]).startswith("No option meets the deadline and budget;")


def test_rent_rows_show_their_instance_price_and_the_verdict_names_no_unasked_budget():
    runner = CliRunner()
    r = runner.invoke(app, [*PLAN, "--deadline", "1m", "--have", TEAM])
    assert r.exit_code == 1, r.output  # nothing meets the deadline: exit 1, as plan
    rent = [line for line in r.stdout.splitlines() if line.startswith("rent")]
    assert rent and all("/h" in line for line in rent)
    assert any("16 x p4d.24xlarge at $21.96/h each" in line for line in rent)  # per instance
    assert "No option meets the deadline; the fastest is" in r.stdout and "budget" not in r.stdout
    d = json.loads(runner.invoke(app, [*PLAN, "--deadline", "1m", "--have", TEAM, "--json"]).stdout)
    assert d["recommendation"].startswith("No option meets the deadline;")
