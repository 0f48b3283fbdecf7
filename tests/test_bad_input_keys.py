"""A key at the wrong level says where it belongs (not a near-miss spelling of an unrelated sibling); a
derived or another tool's key says what to write instead; an integer error shows the value given; no
pydantic class name reaches a message. Both ways in: a scenario file and --set."""

from __future__ import annotations

import pytest

from tests.inputs_support import SCENARIO, changed, invoke, refused, write_yaml

WRONG_LEVEL = [
    ("workload.optimizer", "adam", "training.optimizer"),
    ("cluster.line_rate_gbps", 100, "cluster.nic.line_rate_gbps"),
    ("training.micro_batch", 4, "workload.micro_batch"),
    ("training.tensor", 2, "training.parallelism.tensor"),
    ("training.zero_stage", 3, "training.sharding.stage"),
    ("training.parallelism.data", 2, "derived"),
    ("cluster.model", "BERT-Large", "workload.model"),
    ("cluster.gpus", 8, "cluster.gpus_per_node"),
]


@pytest.mark.parametrize("key, value, hint", WRONG_LEVEL)
def test_a_key_at_the_wrong_level_says_where_it_belongs(tmp_path, key, value, hint):
    path = write_yaml(tmp_path / "s.yaml", changed(SCENARIO, key, value))
    out = refused(invoke("run", path, "--samples", "0"), str(path), key, hint)
    assert "did you mean" not in out  # cluster.model was "did you mean nodes?", cluster.gpus "gpu?"


@pytest.mark.parametrize("key, value, hint", WRONG_LEVEL)
def test_a_set_key_at_the_wrong_level_says_where_it_belongs(tmp_path, key, value, hint):
    path = write_yaml(tmp_path / "s.yaml", SCENARIO)
    refused(invoke("run", path, "--samples", "0", "--set", f"{key}={value}"), "--set", key, hint)


def test_a_misspelt_key_still_gets_its_near_miss(tmp_path):
    path = write_yaml(tmp_path / "s.yaml", changed(SCENARIO, "cluster.nodez", 2))
    refused(invoke("run", path, "--samples", "0"), "cluster.nodez", "did you mean nodes?")


@pytest.mark.parametrize(
    "value, shown", [(2.5, "not a whole number: 2.5"), ("2.5", "not a whole number: '2.5'"), (True, ": true")]
)
def test_an_integer_error_shows_the_value_given(tmp_path, value, shown):
    path = write_yaml(tmp_path / "s.yaml", changed(SCENARIO, "cluster.nodes", value))
    out = refused(invoke("run", path, "--samples", "0"), "cluster.nodes", shown)
    assert "Input should be" not in out


@pytest.mark.parametrize("section, value", [("cluster", None), ("workload", 5), ("training", "adam")])
def test_no_pydantic_class_name_in_a_section_error(tmp_path, section, value):
    path = write_yaml(tmp_path / "s.yaml", changed(SCENARIO, section, value))
    out = refused(invoke("run", path, "--samples", "0"), section, "expected a section of keys")
    assert "Spec" not in out and "instance of" not in out
