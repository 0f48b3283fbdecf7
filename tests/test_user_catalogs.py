"""Issue #13: the GPUs people plan with now, user catalogs (--catalog, inline GPUs), models import."""

import json

import pytest
import yaml

from clustersim import catalog
from clustersim.cli import app

NEW_GPUS = ["B200", "GB200", "MI250X", "MI300X", "H20", "L40S", "L4", "A10G", "RTX-4090"]


def invoke(runner, *args):
    return runner.invoke(app, [str(a) for a in args])


def small_scenario(gpu, nodes=2, gpus_per_node=4) -> dict:
    fabric = "nvswitch" if (isinstance(gpu, dict) or catalog.gpu(gpu).nvlink.links) else "pcie"
    return {
        "name": f"small-{gpu if isinstance(gpu, str) else gpu['name']}",
        "cluster": {
            "nodes": nodes,
            "gpus_per_node": gpus_per_node,
            "gpu": gpu,
            "intra_node": {"fabric": fabric},
            "nic": {"kind": "infiniband", "count": 1, "line_rate_gbps": 200},
        },
        "workload": {
            "layers": [{"name": "block", "params": 5.0e7, "forward_flops": 2.0e11, "repeat": 8}],
            "micro_batch": 4,
            "precision": "bf16",
        },
        "training": {"optimizer": "adam"},
    }


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("name", NEW_GPUS)
def test_new_gpu_loads_with_its_source(name):
    g = catalog.gpu(name)
    assert g.name == name and g.peak_flops("bf16") > g.peak_flops("fp32") > 0
    assert g.hbm_gbs > 0 and g.memory_gib > 0 and g.cuda_name is not None
    source = catalog.resources.files("clustersim.catalogs").joinpath("gpus.yaml").read_text()
    block = source.split(f"\n{name}:\n", 1)[1].split("\n  description:", 1)[0]
    assert "#" in block, f"{name} has no source comment"


@pytest.mark.parametrize(
    "device,memory,expected",
    [
        ("NVIDIA B200", 179.0, "B200"),
        ("NVIDIA GB200", 185.0, "GB200"),
        ("NVIDIA H20", 95.0, "H20"),
        ("NVIDIA H200", 139.0, "H200"),
        ("NVIDIA L4", 22.0, "L4"),
        ("NVIDIA L40S", 44.0, "L40S"),
        ("NVIDIA A10G", 22.0, "A10G"),
        ("NVIDIA GeForce RTX 4090", 23.6, "RTX-4090"),
        ("AMD Instinct MI250X", 64.0, "MI250X"),
        ("AMD Instinct MI300X", 192.0, "MI300X"),
    ],
)
def test_cuda_names_find_the_new_gpus(device, memory, expected):
    assert catalog.gpu_for_cuda_name(device, memory) == expected


def test_hardware_list_shows_the_new_gpus(runner):
    r = invoke(runner, "hardware", "list", "--json")
    assert r.exit_code == 0, r.output
    assert set(NEW_GPUS) <= set(json.loads(r.stdout))
    r = invoke(runner, "hardware", "list")
    assert r.exit_code == 0 and all(n in r.output for n in NEW_GPUS)


@pytest.mark.parametrize("name", NEW_GPUS)
def test_a_scenario_runs_on_each_new_gpu(runner, tmp_path, name):
    path = write(tmp_path, "s.yaml", small_scenario(name))
    r = invoke(runner, "run", path, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["iteration_time_s"] > 0
