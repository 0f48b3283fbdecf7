"""The CLI as a user runs it, including every kind of bad input (exit 2, one line, no traceback)."""

import json
import re

import pytest

from clustersim.cli import app


def invoke(runner, *args):
    return runner.invoke(app, list(args))


def test_run_default_prints_breakdown(runner):
    r = invoke(runner, "run", "preset:default")
    assert r.exit_code == 0, r.output
    assert "samples/s" in r.output and "exposed communication" in r.output


def test_run_shows_diloco_exchange_on_its_own_links_and_compute_utilization(runner):
    """Streaming DiLoCo's workers joined by their own links (inter_worker_gbps): the outer exchange never
    crosses the cluster's NICs, so the run names the bytes on those links instead of a lone 0 B; and the
    run says how much of the step the compute stream is busy (the paper's compute utilization)."""
    from clustersim.scenario import load_scenario
    from clustersim.simulator import simulate
    from clustersim.validation.published import compute_utilization

    r = invoke(runner, "run", "preset:streaming-diloco-1b", "--samples", "0")
    assert r.exit_code == 0, r.output
    row = next(line for line in r.stdout.splitlines() if line.startswith("inter-worker links"))
    result = simulate(load_scenario("preset:streaming-diloco-1b"))
    per_worker = result.extra["diloco"]["bytes_per_worker_per_inner_step"]
    assert per_worker > 0 and row.split()[-2:] == [f"{per_worker / 2**20:.2f}", "MiB"]
    assert f"compute utilization {compute_utilization(result):.1%} of the step" in r.stdout
    plain = invoke(runner, "run", "preset:default", "--samples", "0")
    assert "inter-worker links" not in plain.stdout and "compute utilization" in plain.stdout


def test_run_output_says_counts_and_flags_in_words(runner):
    """One GPU is '1 GPU', one sample '1 sample'; a flag reads 'on', never Python's True; counts past a
    thousand carry separators in tables and sizes alike."""
    from clustersim.commands.support import console, table
    from clustersim.units import format_bytes

    one = invoke(runner, "run", "preset:offload-llama7b-h100", "--samples", "0")
    assert one.exit_code == 0, one.output
    assert ": 1 GPU (1 x 1)" in one.stdout and "(1 sample per iteration)" in one.stdout
    assert not re.search(r"(?<![\d.,])1 (GPUs|samples)\b", one.stdout)
    mp = invoke(runner, "run", "preset:dgx-h100-gpt3-175b-3d", "--samples", "0")
    assert mp.exit_code == 0, mp.output
    line = next(x for x in mp.stdout.splitlines() if x.startswith("Model parallelism"))
    assert "sequence parallel: on" in line and "True" not in line and "1 chunk per stage" in line
    with console.capture() as cap:
        console.print(table("t", ["GPUs", "flag"], [[16384, True], [8, False]]))
    assert "16,384" in cap.get() and " on" in cap.get() and " off" in cap.get()
    assert format_bytes(12138 * 2**30) == "12,138.00 GiB"


def test_run_json_and_trace(runner, tmp_path):
    trace = tmp_path / "trace.json"
    r = invoke(runner, "run", "preset:default", "--json", "--trace", str(trace))
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["world_size"] == 32 and data["iteration_time_s"] > 0
    assert set(data["breakdown_s"]) >= {"forward", "backward", "exposed_communication", "optimizer", "other"}
    assert json.loads(trace.read_text())["traceEvents"]


@pytest.mark.parametrize("optimizer,shown", [("zero-one-adam", "local_sync"), ("onebit-adam", "compression")])
def test_a_trace_names_the_kind_of_step_it_shows(runner, tmp_path, optimizer, shown):
    """0/1 Adam's iteration time is the weighted mean of its kinds of step; its trace shows one kind
    (the most frequent), so the trace's process and metadata name it and both it and run's output say
    the headline is the mean. 1-bit Adam's run is its compression stage alone: labelled, no mean."""
    trace = tmp_path / "trace.json"
    r = invoke(
        runner, "run", "preset:default", "--set", f"training.optimizer={optimizer}", "--trace", str(trace)
    )
    assert r.exit_code == 0, r.output
    data = json.loads(trace.read_text())
    names = [e["args"]["name"] for e in data["traceEvents"] if e["name"] == "process_name"]
    assert names and all(n.endswith(f", step kind {shown}") for n in names)
    assert data["otherData"]["step_kind"] == shown
    mean = "is the weighted mean with the other kinds"
    if optimizer == "zero-one-adam":
        assert mean in data["otherData"]["shows"] and f"it shows the step kind {shown}" in r.output
        assert mean in " ".join(r.output.split())
    else:
        assert "shows" not in data["otherData"] and "it shows" not in r.output


def test_collective_command(runner):
    r = invoke(runner, "collective", "preset:default", "--op", "all_reduce", "--bytes", "32MiB", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["algorithm"] in ("ring", "tree") and d["busbw_gbs"] > 0 and d["ranks"] == 32


@pytest.mark.parametrize(
    "args",
    [
        ("hardware", "list"),
        ("hardware", "show", "H100-SXM"),
        ("models", "list"),
        ("models", "show", "BERT-Large"),
        ("topology", "show", "preset:default"),
        ("presets", "list"),
    ],
)
def test_catalog_commands(runner, args):
    r = invoke(runner, *args)
    assert r.exit_code == 0, r.output
    r = invoke(runner, *args, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)


@pytest.mark.parametrize(
    "preset",
    [
        "default",
        "onebit-adam-ethernet",
        "onebit-adam-infiniband",
        "binsgdm-resnet50",
        "binsgdm-bert-base",
        "dgx-h100-gpt3-1.3b",
    ],
)
def test_every_preset_runs(runner, preset):
    assert invoke(runner, "run", f"preset:{preset}", "--json").exit_code == 0


BAD = {
    "malformed": ("cluster: [nodes: 2\n", "invalid YAML"),
    "unknown_key": (
        "cluster: {nodes: 1, gpus_per_node: 1, gpu: A100-80GB, colour: red}\nworkload: "
        "{model: BERT-Base, micro_batch: 1}\n",
        "cluster.colour: unknown key",
    ),
    "misspelt_key": (
        "cluster: {nodes: 1, gpus_per_node: 1, gpu: A100-80GB}\n"
        "workload: {model: BERT-Base, micro_bach: 1}\n",
        "workload.micro_bach: unknown key (did you mean micro_batch?)",
    ),
    "unknown_bool_key": (
        "cluster: {nodes: 1, gpus_per_node: 1, gpu: A100-80GB}\n"
        "workload: {model: BERT-Base, micro_batch: 1}\ntraining: {overlapp: true}\n",
        "training.overlapp: unknown key (did you mean overlap?)",
    ),
    "unknown_gpu": (
        "cluster: {nodes: 1, gpus_per_node: 1, gpu: Z100}\nworkload: {model: BERT-Base, micro_batch: 1}\n",
        "cluster.gpu: unknown GPU 'Z100'",
    ),
    "unknown_model": (
        "cluster: {nodes: 1, gpus_per_node: 1, gpu: A100-80GB}\nworkload: "
        "{model: BERT-Huge, micro_batch: 1}\n",
        "workload.model: unknown model",
    ),
    "negative_bandwidth": (
        "cluster: {nodes: 2, gpus_per_node: 1, gpu: A100-80GB, nic: {line_rate_gbps: -5}}\n"
        "workload: {model: BERT-Base, micro_batch: 1}\n",
        "cluster.nic.line_rate_gbps",
    ),
    "zero_nodes": (
        "cluster: {nodes: 0, gpus_per_node: 1, gpu: A100-80GB}\nworkload: "
        "{model: BERT-Base, micro_batch: 1}\n",
        "cluster.nodes",
    ),
    "mesh_does_not_fit": (
        "cluster: {nodes: 1, gpus_per_node: 6, gpu: V100-SXM2, intra_node: {fabric: nvlink_mesh}}\n"
        "workload: {model: BERT-Base, micro_batch: 1}\n",
        "cluster.gpus_per_node",
    ),
    "nvlink_on_pcie_gpu": (
        "cluster: {nodes: 1, gpus_per_node: 4, gpu: V100-PCIe}\nworkload: "
        "{model: BERT-Base, micro_batch: 1}\n",
        "cluster.intra_node.fabric",
    ),
    "no_nic": (
        "cluster: {nodes: 2, gpus_per_node: 1, gpu: A100-80GB, nic: {count: 0}}\nworkload: "
        "{model: BERT-Base, micro_batch: 1}\n",
        "cluster.nic.count",
    ),
    "unknown_optimizer": (
        "cluster: {nodes: 1, gpus_per_node: 1, gpu: A100-80GB}\nworkload: "
        "{model: BERT-Base, micro_batch: 1}\n"
        "training: {optimizer: lion}\n",
        "training.optimizer: unknown optimizer",
    ),
    "not_a_mapping": ("- 1\n- 2\n", "must be a mapping"),
    "both_model_and_layers": (
        "cluster: {nodes: 1, gpus_per_node: 1, gpu: A100-80GB}\nworkload: {model: BERT-Base, micro_batch: 1, "
        "layers: [{name: x, params: 1, forward_flops: 1}]}\n",
        "exactly one of",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_scenarios_fail_with_one_line_and_exit_2(runner, tmp_path, case):
    text, expected = BAD[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    r = invoke(runner, "run", str(path))
    assert r.exit_code == 2, r.output
    out = r.output.strip()
    assert "Traceback" not in out
    assert len(out.splitlines()) == 1, out
    assert str(path) in out and expected in out
    if case == "unknown_bool_key":  # an unknown key's value is not the problem
        assert out.endswith("unknown key (did you mean overlap?)"), out


@pytest.mark.parametrize(
    "args,expected",
    [
        (("run", "preset:nope"), "unknown preset"),
        (("run", "/no/such/file.yaml"), "file not found"),
        (("hardware", "show", "Z100"), "unknown GPU"),
        (("collective", "preset:default", "--bytes", "12 parsecs"), "--bytes"),
        (("collective", "preset:default", "--op", "gossip"), "unknown collective"),
        # the option named as typed ("--algo", as "--op" and "--bytes"), not the cost model's "algo"
        (("collective", "preset:default", "--algo", "magic"), "error: --algo: unknown algorithm 'magic'"),
        (
            ("collective", "preset:default", "--algo", "tre"),
            "--algo: unknown algorithm 'tre'; did you mean tree",
        ),
        (
            ("collective", "preset:default", "--algo", "hier", "--group", "intra"),
            # the name, not the enum's repr
            "error: --algo: algorithm 'hier' does not apply to all_reduce on 1 node(s)",
        ),
        (("run", "preset:default", "--profile", "/no/profile.json"), "profile.json: file not found"),
    ],
)
def test_bad_arguments_exit_2(runner, args, expected):
    r = invoke(runner, *args)
    assert r.exit_code == 2 and expected in r.output and "Traceback" not in r.output


def test_json_scenarios_are_accepted(runner, tmp_path):
    path = tmp_path / "s.json"
    path.write_text(
        json.dumps(
            {
                "cluster": {"nodes": 1, "gpus_per_node": 2, "gpu": "A100-80GB"},
                "workload": {"model": "ResNet-50", "micro_batch": 32},
            }
        )
    )
    assert invoke(runner, "run", str(path)).exit_code == 0


def test_custom_layer_workload(runner, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(
        "cluster: {nodes: 2, gpus_per_node: 8, gpu: H100-SXM}\n"
        "workload: "
        "{micro_batch: 4, layers: [{name: mlp, params: 50000000, forward_flops: 1.0e+11, repeat: 4}]}\n"
    )
    r = invoke(runner, "run", str(path), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["iteration_time_s"] > 0


def test_a_closed_pipe_ends_the_command_quietly():
    """`clustersim run ... | head -1`: no traceback or error when the reader stops reading."""
    import subprocess
    import sys

    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from clustersim.cli import main; main()",
            "run",
            "preset:default",
            "--samples",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.readline()
    proc.stdout.close()  # the reader goes away after one line
    _, err = proc.communicate(timeout=60)
    # ended by SIGPIPE as Unix tools are (the shell shows 141), not exit 1 as a failed command
    assert proc.returncode in (0, -13), (proc.returncode, err)
    assert b"Traceback" not in err and b"Error" not in err, err


def test_compare_defaults_to_gpu_counts_the_layout_can_hold(runner):
    """The 3D preset (tensor 8 x pipeline 8) cannot run on 8-32 GPUs: without --gpus, compare takes the
    default counts that hold the layout (multiples of 64) instead of failing on the first."""
    r = invoke(
        runner, "compare", "preset:dgx-h100-gpt3-175b-3d", "--optimizers", "adam", "--samples", "0", "--json"
    )
    assert r.exit_code == 0, r.output
    counts = sorted({row["gpus"] for row in json.loads(r.stdout)["rows"]})
    assert counts == [64, 128, 256, 512, 1024]
    bad = invoke(runner, "compare", "preset:dgx-h100-gpt3-175b-3d", "--gpus", "8", "--samples", "0")
    assert bad.exit_code == 2 and "--gpus" in bad.output  # a count given explicitly is still checked


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (("--set", "cluster.gpu=H100-SMX"), "unknown GPU 'H100-SMX' (did you mean H100-SXM? known: "),
        (("--set", "workload.model=GPT-3-13X"), "unknown model 'GPT-3-13X' (did you mean GPT-3-13B? known: "),
        (("--set", "workload.model=LLaMA-2-7B"), "unknown model 'LLaMA-2-7B' (known: "),  # not 70B
        (("--set", "cluster.gpu=Z100"), "unknown GPU 'Z100' (known: "),
    ],
)
def test_an_unknown_gpu_or_model_suggests_a_near_name_with_the_same_numbers(runner, args, hint):
    """A misspelt GPU or model named every known one but not the one meant; a suggestion never changes a
    number (LLaMA-2-7B is 0.95 similar to LLaMA-2-70B, another model)."""
    r = runner.invoke(app, ["run", "preset:default", "--samples", "0", *args])
    assert r.exit_code == 2 and hint in r.output and "Traceback" not in r.output


def test_run_of_1bit_adam_says_which_stage_it_simulated(runner):
    """1-bit Adam's two stages step at different speeds; run simulates one, and says which and how to
    get the other (a trial read the compression stage's step as 1-bit Adam's step)."""
    args = ["run", "preset:onebit-adam-ethernet", "--samples", "0"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "the compression stage's step" in res.output
    assert "stage=warmup simulates the other stage" in res.output
    res = runner.invoke(app, [*args, "--set", "training.optimizer_options.stage=warmup"])
    assert res.exit_code == 0 and "the warm-up stage's step" in res.output
    res = runner.invoke(app, ["run", "preset:default", "--samples", "0"])
    assert "stage" not in res.output.split("Where the iteration goes")[0]  # Adam has one kind of step


def test_collective_names_all_to_all_pairwise_and_prints_small_rates(runner):
    res = runner.invoke(
        app, ["collective", "preset:dgx-h100-gpt3-1.3b", "--op", "all_to_all", "--bytes", "64MiB"]
    )
    assert res.exit_code == 0 and "with pairwise/" in res.output and "ring/" not in res.output
    res = runner.invoke(
        app, ["collective", "preset:dgx-h100-gpt3-1.3b", "--op", "all_reduce", "--bytes", "1"]
    )
    assert res.exit_code == 0 and "0.00 GB/s" not in res.output and " KB/s" in res.output


def test_compare_takes_the_network_backend_and_names_degraded_nics(runner):
    args = ["compare", "preset:dgx-h100-gpt3-1.3b", "--gpus", "16", "--optimizers", "adam", "--samples", "0"]
    bad = runner.invoke(app, [*args, "--network", "fluid"])
    assert bad.exit_code == 2 and "--network" in bad.output
    degraded = "cluster.heterogeneity={degraded_nics: [{node: 1, nic: 0, bandwidth_factor: 0.25}]}"
    res = runner.invoke(app, [*args, "--break-even-at", "0", "--network", "flow", "--set", degraded])
    assert res.exit_code == 0, res.output
    header = next(line for line in res.output.splitlines() if " per node; " in line)
    assert "1 degraded NIC (cluster.heterogeneity)" in header


def test_roce_on_ethernet_takes_rdma_latency_and_run_says_which(runner):
    """25 GbE RoCE is modelled as ethernet_tcp with gpudirect_rdma: its transport runs in the NIC, so a
    message costs RDMA's latency, not kernel TCP's 25 us, unless latency_us says otherwise."""
    base = ["run", "preset:dgx-h100-gpt3-1.3b", "--samples", "0", "--set", "cluster.nic.kind=ethernet_tcp"]
    base += ["--set", "cluster.nic.line_rate_gbps=25"]
    tcp = runner.invoke(app, base)
    assert "inter_node_latency: 25 us per message, one way (default for ethernet_tcp)" in tcp.output
    roce = runner.invoke(app, [*base, "--set", "cluster.nic.gpudirect_rdma=true"])
    assert "inter_node_latency: 1.5 us per message, one way (default for rdma_ethernet)" in roce.output
    own = runner.invoke(
        app, [*base, "--set", "cluster.nic.gpudirect_rdma=true", "--set", "cluster.nic.latency_us=5"]
    )
    assert "5 us per message, one way (cluster.nic.latency_us)" in own.output


def test_validate_with_few_draws_says_its_coverage_is_uncertain(runner):
    few = runner.invoke(app, ["validate", "--dataset", "binsgdm_speedups", "--samples", "8"])
    assert few.exit_code == 0 and "bands from 8 draws move more" in few.output
    default = runner.invoke(app, ["validate", "--dataset", "binsgdm_speedups"])
    assert default.exit_code == 0 and "bands from" not in default.output
