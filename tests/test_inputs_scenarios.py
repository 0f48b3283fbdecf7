"""The input battery, scenario keys: each bad value is refused naming the key the user set (never a key
on the same path the user did not touch), without a traceback, and never becomes a number."""

from __future__ import annotations

import pytest

from tests.inputs_support import GPU, SCENARIO, changed, invoke, refused, write_yaml

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
    # accepted and simulated as if nothing were odd, or refused naming another key
    (
        "measured busbw 1e308",
        {"cluster.intra_node.measured_allreduce_busbw_gbs": 1e308},
        "cluster.intra_node.measured_allreduce_busbw_gbs",
        "beyond any real machine",
    ),
    ("host dram 1e-300", {"cluster.host.dram_gbs": 1e-300}, "cluster.host.dram_gbs", "below any real part"),
    (
        "oversubscription on a single switch",
        {"cluster.fabric": {"oversubscription": 1e308}},
        "cluster.fabric.oversubscription",
        "a single switch has none",
    ),
    (
        "oversubscription 1e308 on a leaf-spine",
        {"cluster.fabric": {"kind": "leaf_spine", "oversubscription": 1e308}},
        "cluster.fabric.oversubscription",
        "one uplink at the least",
    ),
    (
        "line rate 1e308 with custom layers",
        {
            "workload": {"layers": [{"name": "l", "params": 1000, "forward_flops": 1e9}], "micro_batch": 1},
            "cluster.nic.line_rate_gbps": 1e308,
        },
        "cluster.nic.line_rate_gbps",
        "beyond any real machine",
    ),
    ("InfiniBand at 25 Gb/s", {"cluster.nic.line_rate_gbps": 25}, "cluster.nic.line_rate_gbps", "HDR100"),
    ("NIC latency 1e300", {"cluster.nic.latency_us": 1e300}, "cluster.nic.latency_us", "beyond"),
    (
        "inline GPU of 1e-9 GB/s",
        {"cluster.gpu": {**GPU, "name": "X", "hbm_gbs": 1e-9}},
        "cluster.gpu.hbm_gbs",
        "below any real part",
    ),
    (
        "degraded NIC below 10 Mb/s",
        {**FLOW, "cluster.heterogeneity": {"degraded_nics": [{"node": 1, "bandwidth_factor": 1e-6}]}},
        "cluster.heterogeneity.degraded_nics.0.bandwidth_factor",
        "0.01 Gb/s",
    ),
    (  # the op alone is quick: the line says the sharing is what stretches it (it read "exceeded
        # 1e+06 s ... alone takes 0.0025 s")
        "another job's 1e8 flows per link",
        {**FLOW, "cluster.heterogeneity": {"background": [{"flows_per_link": 10**8}]}},
        "cluster.heterogeneity.background.0.flows_per_link",
        "sharing its links, it runs past that",
    ),
    (
        "diloco latency 1e9 ms",
        {**DILOCO, "training.optimizer_options": {"inter_worker_latency_ms": 1e9}},
        "training.optimizer_options.inter_worker_latency_ms",
        "a day",
    ),
    (
        "diloco latency 1e308 ms",
        {**DILOCO, "training.optimizer_options": {"inter_worker_latency_ms": 1e308}},
        "training.optimizer_options.inter_worker_latency_ms",
        "a day",
    ),
    (
        "diloco inter_worker_gbps 1e308",
        {**DILOCO, "training.optimizer_options": {"inter_worker_gbps": 1e308}},
        "training.optimizer_options.inter_worker_gbps",
        "beyond any real machine",
    ),
    (
        "input sample of a thousandth of a byte",
        {"workload.input": {"bytes_per_sample": 1e-3}},
        "workload.input.bytes_per_sample",
        "less than one byte",
    ),
    (
        "an L4 node in a job of 80 GB ranks",
        {
            "workload.model": "GPT-3-1.3B",
            "workload.seq_len": 2048,
            "cluster.heterogeneity": {"node_gpus": [{"node": 1, "gpu": "L4"}]},
        },
        "cluster.heterogeneity.node_gpus.0.gpu",
        "node 1's L4 has 24.00 GiB",
    ),
    # an FP8 scaling recipe beside another precision would change nothing: the file contradicts itself
    (
        "fp8_recipe on fp16",
        {"workload.fp8_recipe": "current"},
        "workload.fp8_recipe",
        "applies to precision fp8 only; this workload's precision is fp16",
    ),
    (
        "fp8_recipe delayed on bf16",
        {"workload.precision": "bf16", "workload.fp8_recipe": "delayed"},
        "workload.fp8_recipe",
        "set workload.precision: fp8, or drop fp8_recipe",
    ),
    (
        "0/1 Adam's own buffers on A100-40GB",
        {
            "cluster.gpu": "A100-40GB",
            "workload.model": "GPT-2-1.5B",
            "workload.seq_len": 1024,
            "workload.micro_batch": 1,
            "training.optimizer": "zero-one-adam",
        },
        "training.optimizer",
        "zero-one-adam's own buffers",
    ),
    # names brought from other tools get the spelling here (io._SYNONYMS), keyed by nic.kind
    ("nic kind roce", {"cluster.nic.kind": "roce"}, "cluster.nic.kind", "100-800 Gb/s is 'infiniband'"),
    ("nic kind IB", {"cluster.nic.kind": "IB"}, "cluster.nic.kind", "InfiniBand is 'infiniband'"),
    (
        "compressed offloaded",
        {**BINSGDM, "training.offload": {"mode": "zero"}},
        "training.offload.mode",
        "GPU",
    ),
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
    [
        ("1e308", "memory"),
        ("1e12", "memory"),
        ("0", ""),
        ("-5", ""),
        ("nan", ""),
        ("inf", ""),
        ("0.001", "less than one byte"),
    ],
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


@pytest.mark.parametrize(("text", "empty"), [("", True), ("# nothing yet\n", True), ("- 1\n", False)])
def test_a_scenario_that_is_not_a_mapping_names_the_required_and_optional_keys(tmp_path, text, empty):
    """It said "a mapping with keys cluster, workload, training", but a file without training runs: the
    line says which keys the schema requires and which are optional, and that an empty file is empty."""
    path = tmp_path / "s.yaml"
    path.write_text(text)
    out = refused(invoke("run", path, "--samples", "0"), str(path))
    assert out.endswith(
        "a scenario must be a mapping with the keys cluster and workload (required) "
        "and optionally name, description, profile, training"
    )
    assert ("the file is empty" in out) == empty
    without_training = {k: v for k, v in SCENARIO.items() if k != "training"}
    r = invoke("run", write_yaml(tmp_path / "t.yaml", without_training), "--samples", "0")
    assert r.exit_code == 0, r.output


# (sweep key, bad value, words)
BAD_SWEEP = [
    ("steps", True, "true"),
    ("steps", 2.5, "not a whole number: 2.5"),
    ("samples", True, "true"),
    ("global_batch", 1e308, "2**53"),
    ("warmup", float("nan"), "finite"),
]


@pytest.mark.parametrize("key,value,words", BAD_SWEEP, ids=[f"{k}={v!r}" for k, v, _ in BAD_SWEEP])
def test_a_bad_sweep_key_is_refused(tmp_path, key, value, words):
    sweep = {"name": "s", "base": "preset:default", "vary": {"nodes": [1, 2]}, key: value}
    path = write_yaml(tmp_path / "sweep.yaml", sweep)
    refused(invoke("sweep", path, "--out", tmp_path / "out"), path, f"{key}:", words)


# The same bounds on every other way in: --set, a sweep's axis, the Python API.
def test_a_bound_holds_through_set():
    refused(
        invoke("run", "preset:default", "--samples", "0", "--set", "cluster.host.dram_gbs=1e-300"),
        "--set",
        "cluster.host.dram_gbs:",
        "below any real part",
    )


def test_a_bound_holds_through_a_sweep_axis(tmp_path):
    import csv

    sweep = {"name": "s", "base": write_yaml(tmp_path / "b.yaml", SCENARIO), "vary": {"nic_gbps": [25, 200]}}
    path = write_yaml(tmp_path / "sweep.yaml", sweep)
    r = invoke("sweep", path, "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    with (tmp_path / "out" / "results.csv").open() as fh:
        rows = {float(row["nic_gbps"]): row for row in csv.DictReader(fh)}
    assert rows[200.0]["status"] == "ok"
    assert rows[25.0]["status"] == "invalid" and "no InfiniBand port runs at 25 Gb/s" in rows[25.0]["error"]


def test_a_bound_holds_through_the_api():
    from clustersim import api
    from clustersim.errors import InputError

    data = changed(SCENARIO, "cluster.intra_node.measured_allreduce_busbw_gbs", 1e308)
    with pytest.raises(InputError, match="measured_allreduce_busbw_gbs: 1e\\+308 is beyond"):
        api.simulate(data)


def test_a_bound_holds_through_a_user_catalog(tmp_path):
    catalog = write_yaml(tmp_path / "c.yaml", {"X": {**GPU, "hbm_gbs": 1e-300}})
    path = write_yaml(tmp_path / "s.yaml", changed(SCENARIO, "cluster.gpu", "X"))
    refused(invoke("run", path, "--samples", "0", "--catalog", catalog), catalog, "X.hbm_gbs", "below")


# Command options: one line naming the option, never a traceback.
BAD_OPTIONS = [
    (("models", "show", "BERT-Large", "--seq-len", "100000"), "--seq-len", "512 learned positions"),
    (("models", "show", "GPT-3-175B", "--micro-batch", str(10**20)), "--micro-batch", "2**53"),
    (("report", "no-such-results", "--price", "1e308"), "--price", "USD per GPU-hour"),
    (
        ("plan", "--model", "BERT-Large", "--deadline", "3d", "--price", "1e308"),
        "--price",
        "USD per GPU-hour",
    ),
]


@pytest.mark.parametrize(
    "args,where,words", BAD_OPTIONS, ids=[" ".join(a[:2]) + " " + w for a, w, _ in BAD_OPTIONS]
)
def test_a_bad_command_option_is_refused_by_its_name(args, where, words):
    refused(invoke(*args), f"{where}:", words)


def test_a_sweep_summary_is_cut_at_a_clause_never_inside_a_number():
    from clustersim.errors import shortened

    reason = (
        "does not fit in GPU memory: 58.64 GiB per rank needed but A100-40GB has 40.00 GiB; "
        "zero-one-adam's own buffers (onebit worker error 5.80 GiB, onebit server error 185.68 MiB) "
        "leave no room for one sample's activations (2.59 GiB); per rank: parameters 8.70 GiB, gradients "
        "2.90 GiB, ddp buckets 2.90 GiB, optimizer state 17.41 GiB, activations 20.74 GiB"
    )
    short = shortened(reason, 200)
    assert len(short) <= 200 and short.endswith(" ...")
    assert "zero-one-adam's own buffers (...)" in short
    assert not short.removesuffix(" ...")[-1].isdigit() and "17." not in short


def test_roce_is_infiniband_at_its_ethernet_rate_and_said_where_a_user_looks():
    """RoCE runs NCCL's IB verbs transport over Ethernet: the reference's nic.kind says to model it as
    infiniband at the Ethernet rate, which 100/200/400 GbE pass; 25 and 50 GbE (no InfiniBand port) are
    refused with the RoCE way out (ethernet_tcp with gpudirect_rdma), which is accepted; and the price
    catalog prices infiniband as Ethernet of the same rate, as docs/network.md says."""
    from importlib import resources

    import yaml

    from clustersim.errors import InputError
    from clustersim.scenario import load_scenario
    from clustersim.scenario_reference import scenario_schema

    kind = scenario_schema()["$defs"]["NicSpec"]["properties"]["kind"]["description"]
    assert "RoCE" in kind and "infiniband at the Ethernet rate" in kind
    base = load_scenario("preset:default")
    for rate in (100, 200, 400):
        nic = base.with_changes(**{"cluster.nic.kind": "infiniband", "cluster.nic.line_rate_gbps": rate})
        assert nic.cluster.nic.line_rate_gbps == rate
    for rate in (25, 50):
        with pytest.raises(InputError, match="with gpudirect_rdma: true for RoCE"):
            base.with_changes(**{"cluster.nic.kind": "infiniband", "cluster.nic.line_rate_gbps": rate})
        roce = {"kind": "ethernet_tcp", "line_rate_gbps": rate, "gpudirect_rdma": True, "latency_us": 2}
        assert base.with_changes(**{"cluster.nic": roce}).cluster.nic.gpudirect_rdma is True
    prices = yaml.safe_load(
        resources.files("clustersim.catalogs").joinpath("network_prices.yaml").read_text()
    )
    for rate in (100, 200, 400):
        assert prices["infiniband"][rate] == prices["ethernet_tcp"][rate]
