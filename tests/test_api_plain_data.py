"""Every API result is plain data: ``json.dumps(x.to_dict())`` works, and so do the attributes the
docs name (a plan's chosen candidate, a comparison's rows and break-evens)."""

import json

import pytest

from clustersim.api import compare, load_scenario, plan, simulate, sweep


@pytest.mark.parametrize(
    "source", ["preset:default", "examples/diloco-two-datacenters.yaml", "examples/h100-gpt3.yaml"]
)
def test_a_scenario_is_plain_data_that_loads_back_equal(source):
    """docs/api.md says each function's result has to_dict(); the Scenario had none. Its dict is JSON and
    load_scenario reads it (or its JSON text) back to the same scenario, changes included."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    scenario = load_scenario(source if source.startswith("preset:") else root / source)
    scenario = scenario.with_changes(**{"cluster.nodes": 2})
    data = scenario.to_dict()
    again = load_scenario(json.loads(json.dumps(data)))
    assert again.to_dict() == data
    assert again.cluster.world_size == scenario.cluster.world_size
    assert again.model_dump() == scenario.model_dump()


def test_a_simulation_is_plain_data():
    json.dumps(simulate("preset:default", samples=4).to_dict())


def test_a_comparison_and_its_rows_and_break_evens_are_plain_data():
    table = compare("preset:onebit-adam-infiniband", ["adam", "onebit-adam"], [16], samples=0)
    json.dumps(table.to_dict())
    json.dumps([r.to_dict() for r in table.rows])  # the documented name
    (b,) = table.break_even
    text = json.dumps(b.to_dict())
    assert b.describe().startswith("onebit-adam vs adam") and "line rate per NIC" in text


def test_a_plan_and_its_chosen_candidate_are_plain_data():
    result = plan("BERT-Large", 1000, "72h", samples=0)
    json.dumps(result.to_dict())
    json.dumps(result.chosen)  # it used to hold its baseline, whose baseline was itself
    json.dumps(result.runners_up)
    assert result.chosen["cost"] == result.to_dict()["chosen"]["cost"]


def test_a_sweep_is_plain_data(tmp_path):
    (tmp_path / "s.yaml").write_text(
        "name: s\nbase: preset:default\nvary:\n  gpus: [8, 16]\nsamples: 0\n", encoding="utf-8"
    )
    json.dumps(sweep(tmp_path / "s.yaml", tmp_path / "out", workers=1).to_dict())


@pytest.mark.parametrize("name", ["to_dict", "as_dict"])
def test_compare_rows_answer_to_both_names(name):
    (row,) = compare("preset:default", ["adam"], [8], samples=0, break_even_at=0).rows
    assert getattr(row, name)()["optimizer"] == "adam"
