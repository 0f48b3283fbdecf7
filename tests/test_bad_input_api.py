"""The Python API called with the wrong types: each is an InputError naming the argument (never an
AttributeError, TypeError or KeyError from inside), and a pathlib.Path is taken wherever a path is."""

from __future__ import annotations

import pathlib

import pytest

from clustersim import api
from clustersim.errors import InputError
from tests.inputs_support import SCENARIO, write_json, write_yaml


def _refused(call, key: str, *words: str) -> str:
    with pytest.raises(InputError) as info:
        call()
    assert info.value.key == key, str(info.value)
    for word in words:
        assert word in str(info.value), str(info.value)
    return str(info.value)


@pytest.mark.parametrize("source", [None, 42, b"cluster: {}", ["a.yaml"], "", "  "])
def test_load_scenario_says_what_a_scenario_may_be(source):
    _refused(lambda: api.load_scenario(source), "scenario", "preset:NAME", "a mapping")


@pytest.mark.parametrize("changes", [[("cluster.nodes", 4)], "cluster.nodes=4", {1: 2}])
def test_load_scenario_changes_must_be_a_mapping_of_dotted_keys(changes):
    _refused(lambda: api.load_scenario(SCENARIO, changes=changes), "changes", "dotted keys")


def test_load_scenario_with_empty_changes_is_the_scenario():
    assert api.load_scenario(SCENARIO, changes={}).cluster.nodes == SCENARIO["cluster"]["nodes"]


def test_a_profile_may_be_a_pathlib_path_and_anything_else_is_refused(tmp_path):
    bad = pathlib.Path(write_json(tmp_path / "p.json", {"format": "nothing"}))
    with pytest.raises(InputError) as info:
        api.simulate(SCENARIO, profile=bad)
    assert str(bad) in str(info.value)  # read as a profile file, not an AttributeError
    for value in (123, {}):
        _refused(lambda value=value: api.simulate(SCENARIO, profile=value), "profile", "path")
        _refused(lambda value=value: api.compare(SCENARIO, ["adam"], samples=0, profile=value), "profile")


@pytest.mark.parametrize("model", [None, ["GPT-3-1.3B"], 7, ""])
def test_plan_model_must_be_a_name(model):
    _refused(lambda: api.plan(model, 1000, "30d", samples=0), "model", "model name")


@pytest.mark.parametrize("catalog", [5, {"a": 1}])
def test_plan_catalog_must_be_paths(catalog):
    _refused(lambda: api.plan("BERT-Large", 1000, "30d", catalog=catalog, samples=0), "catalog")


@pytest.mark.parametrize("workers", [0, "2", 1.5, True, -1])
def test_sweep_workers_is_a_count_of_one_or_more(tmp_path, workers):
    sweep = write_yaml(tmp_path / "s.yaml", {"name": "w", "base": SCENARIO, "vary": {"nic_gbps": [100]}})
    _refused(lambda: api.sweep(sweep, tmp_path / "out", workers=workers), "workers", "at least 1")
    assert not (tmp_path / "out").exists()


def test_sweep_paths_are_named(tmp_path):
    sweep = write_yaml(tmp_path / "s.yaml", {"name": "w", "base": SCENARIO, "vary": {"nic_gbps": [100]}})
    _refused(lambda: api.sweep(None, tmp_path / "out"), "sweep_file")
    _refused(lambda: api.sweep(sweep, None), "out")
    _refused(lambda: api.sweep({"base": SCENARIO}, tmp_path / "out"), "sweep_file")


def test_write_trace_needs_a_path():
    sim = api.simulate(SCENARIO)
    _refused(lambda: sim.write_trace(None), "path")
