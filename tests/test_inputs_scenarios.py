"""The input battery, scenario keys: each bad value is refused naming the key the user set (never a key
on the same path the user did not touch), without a traceback, and never becomes a number."""

from __future__ import annotations

import pytest

from tests.inputs_support import SCENARIO, changed, invoke, refused, write_yaml

FLOW = {"training.network": "flow"}
DILOCO = {"training.optimizer": "diloco"}
BINSGDM = {"training.optimizer": "binsgdm"}
OFFLOAD = {"training.offload": {"mode": "zero"}, "training.sharding": {"stage": 2}}

# (name, keys set on the base scenario, key the error must name, words it must say)
BAD = [
    ("micro_batch 1e308", {"workload.micro_batch": 1e308}, "workload.micro_batch", "2**53"),
    (
        "accumulation 1e308",
        {"workload.gradient_accumulation": 1e308},
        "workload.gradient_accumulation",
        "2**53",
    ),
    ("nodes true", {"cluster.nodes": True}, "cluster.nodes", "true"),
    (
        "seq_len beyond memory",
        # ZeRO-3 over the 8 GPUs: the model's states fit, so the sequence is what does not
        {"workload.model": "LLaMA-7B", "workload.seq_len": 2**53, "training.sharding": {"stage": 3}},
        "workload.seq_len",
        "",
    ),
    (
        "subgroup 1e-300",
        {**OFFLOAD, "training.offload": {"mode": "zero", "subgroup_size": 1e-300}},
        "training.offload.subgroup_size",
        "greater than or equal to 1",
    ),
    (
        "binsgdm empty scheme",
        {**BINSGDM, "training.optimizer_options": {"scheme": []}},
        "training.optimizer_options.scheme",
        "at least 1",
    ),
    (
        "binsgdm bits 0",
        {
            **BINSGDM,
            "training.optimizer_options": {
                "scheme": [{"primitive": "all_reduce", "group": "world", "bits": 0}]
            },
        },
        "training.optimizer_options.scheme.0.bits",
        "greater than or equal to 1",
    ),
    (
        "diloco fragments beyond layers",
        {**DILOCO, "training.optimizer_options": {"fragments": 1000, "inner_steps": 1000}},
        "training.optimizer_options.fragments",
        "24 layers",
    ),
    (
        "diloco inter_worker_gbps tiny",
        {**DILOCO, "training.optimizer_options": {"inter_worker_gbps": 1e-12}},
        "training.optimizer_options.inter_worker_gbps",
        "below any real link",
    ),
    (
        "degraded NIC factor tiny",
        {**FLOW, "cluster.heterogeneity": {"degraded_nics": [{"node": 1, "bandwidth_factor": 1e-15}]}},
        "cluster.heterogeneity.degraded_nics.0.bandwidth_factor",
        "below any real part",
    ),
    (
        "measured busbw tiny (2 nodes)",
        {"cluster.intra_node.measured_allreduce_busbw_gbs": 1e-12},
        "cluster.intra_node.measured_allreduce_busbw_gbs",
        "below any real part",
    ),
    (
        "measured busbw tiny (1 node)",
        {"cluster.nodes": 1, "cluster.intra_node.measured_allreduce_busbw_gbs": 1e-12},
        "cluster.intra_node.measured_allreduce_busbw_gbs",
        "below any real part",
    ),
    (
        "input row_bytes tiny",
        {"workload.input": {"bytes_per_sample": 1e6, "row_bytes": 1e-9}},
        "workload.input.row_bytes",
        "less than one byte",
    ),
    (
        "host dram tiny with input rows",
        {"workload.input": {"bytes_per_sample": 1e6, "row_bytes": 4096}, "cluster.host.dram_gbs": 1e-9},
        "cluster.host.dram_gbs",
        "below any real part",
    ),
    ("line rate tiny", {"cluster.nic.line_rate_gbps": 1e-9}, "cluster.nic.line_rate_gbps", "below"),
]


@pytest.mark.parametrize("keys,where,words", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_scenario_value_is_refused_by_its_own_key(tmp_path, keys, where, words):
    data = SCENARIO
    for key, value in keys.items():
        data = changed(data, key, value)
    path = write_yaml(tmp_path / "s.yaml", data)
    refused(invoke("run", path, "--samples", "0"), path, f"{where}:", words)


@pytest.mark.parametrize("mode", ["zero", "interleaved"])
@pytest.mark.parametrize("command", ["run", "offload plan", "compare"])
def test_a_subgroup_below_one_parameter_is_refused_on_a_7b_model(tmp_path, mode, command):
    """1e-300 parameters per subgroup split LLaMA-7B into an infinite count (OverflowError)."""
    import json

    from clustersim.scenario import load_scenario

    data = json.loads(load_scenario("preset:offload-llama7b-h100").model_dump_json())
    data["training"]["offload"].update(mode=mode, subgroup_size=1e-300)
    path = write_yaml(tmp_path / "s.yaml", data)
    r = (
        invoke(*command.split(), path, "--samples", "0")
        if command != "offload plan"
        else invoke("offload", "plan", path)
    )
    refused(r, path, "training.offload.subgroup_size", "greater than or equal to 1")


@pytest.mark.parametrize(
    "size,words",
    [("1e308", "memory"), ("1e12", "memory"), ("0", ""), ("-5", ""), ("nan", ""), ("inf", "")],
)
def test_collective_refuses_a_size_no_gpu_can_hold(size, words):
    refused(invoke("collective", "preset:default", "--bytes", size), "--bytes", words)


def test_collective_of_a_real_size_works():
    r = invoke("collective", "preset:default", "--bytes", "256MiB")
    assert r.exit_code == 0, r.output


BAD_DILOCO_BOOL = {**DILOCO, "training.optimizer_options": {"inter_worker_gbps": True}}


def test_a_boolean_is_not_a_bandwidth(tmp_path):
    data = SCENARIO
    for key, value in BAD_DILOCO_BOOL.items():
        data = changed(data, key, value)
    path = write_yaml(tmp_path / "s.yaml", data)
    refused(
        invoke("run", path, "--samples", "0"), path, "training.optimizer_options.inter_worker_gbps", "true"
    )


# (sweep key, bad value, words)
BAD_SWEEP = [
    ("steps", True, "true"),
    ("steps", 2.5, "integer"),
    ("samples", True, "true"),
    ("global_batch", 1e308, "2**53"),
    ("warmup", float("nan"), "finite"),
]


@pytest.mark.parametrize("key,value,words", BAD_SWEEP, ids=[f"{k}={v!r}" for k, v, _ in BAD_SWEEP])
def test_a_bad_sweep_key_is_refused(tmp_path, key, value, words):
    sweep = {"name": "s", "base": "preset:default", "vary": {"nodes": [1, 2]}, key: value}
    path = write_yaml(tmp_path / "sweep.yaml", sweep)
    refused(invoke("sweep", path, "--out", tmp_path / "out"), path, f"{key}:", words)
