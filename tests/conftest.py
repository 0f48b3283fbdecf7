import copy

import pytest
from typer.testing import CliRunner

from clustersim.scenario import load_scenario, validate_scenario


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def default_scenario():
    return load_scenario("preset:default")


# A small valid scenario (2 nodes of 4 A100s, BERT-Large): make_scenario's base, and the input battery's.
SMALL_SCENARIO = {
    "name": "small",
    "cluster": {
        "nodes": 2,
        "gpus_per_node": 4,
        "gpu": "A100-80GB",
        "intra_node": {"fabric": "nvswitch"},
        "nic": {"kind": "infiniband", "count": 1, "line_rate_gbps": 200},
    },
    "workload": {"model": "BERT-Large", "micro_batch": 8, "seq_len": 128, "precision": "fp16"},
    "training": {"optimizer": "adam"},
}


def make_scenario(**overrides):
    """A small valid scenario with dotted-key overrides."""
    base = {**copy.deepcopy(SMALL_SCENARIO), "name": "t"}
    for key, value in overrides.items():
        node = base
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return validate_scenario(base, source="test")


def swept_results(tmp_path_factory, name: str, spec: dict):
    """Run the sweep ``spec`` once into a fresh folder; its results folder (reports read it)."""
    import yaml

    from clustersim.sweeps.run import run_sweep
    from clustersim.sweeps.spec import load_sweep

    tmp = tmp_path_factory.mktemp(name)
    (tmp / "s.yaml").write_text(yaml.safe_dump(spec))
    run_sweep(load_sweep(tmp / "s.yaml"), tmp / "out")
    return tmp / "out"
