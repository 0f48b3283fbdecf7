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


def cpu_bert_scenario(micro_batch: int = 2, **workload):
    """BERT-Base (seq 32, fp32, SGD with momentum) on one CPU-2vCPU device: the scenario the tests of a
    CPU profile's measured models price; ``workload`` adds keys (execution, implementation)."""
    return validate_scenario(
        {
            "name": "cpu",
            "cluster": {
                "nodes": 1,
                "gpus_per_node": 1,
                "gpu": "CPU-2vCPU",
                "intra_node": {"fabric": "pcie"},
                "nic": {"kind": "ethernet_tcp", "count": 1, "line_rate_gbps": 10},
            },
            "workload": {"model": "BERT-Base", "micro_batch": micro_batch, "seq_len": 32, "precision": "fp32"}
            | workload,
            "training": {"optimizer": "sgdm"},
        },
        "test",
    )


def swept_results(tmp_path_factory, name: str, spec: dict):
    """Run the sweep ``spec`` once into a fresh folder; its results folder (reports read it)."""
    import yaml

    from clustersim.sweeps.run import run_sweep
    from clustersim.sweeps.spec import load_sweep

    tmp = tmp_path_factory.mktemp(name)
    (tmp / "s.yaml").write_text(yaml.safe_dump(spec))
    run_sweep(load_sweep(tmp / "s.yaml"), tmp / "out")
    return tmp / "out"
