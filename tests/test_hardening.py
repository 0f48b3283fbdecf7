"""Issue #13, "must never happen again": every input either simulates or is refused with one line naming
the file and the key, exit code 2, no traceback, nothing half-written, and never a hang."""

from __future__ import annotations

import json

import pytest
import yaml

from clustersim.cli import app
from clustersim.scenario import load_scenario

SMALL = {
    "name": "small",
    "cluster": {
        "nodes": 2,
        "gpus_per_node": 4,
        "gpu": "V100-PCIe",
        "intra_node": {"fabric": "pcie"},
        "nic": {"kind": "ethernet_tcp", "count": 1, "line_rate_gbps": 10},
    },
    "workload": {"model": "BERT-Large", "micro_batch": 16, "seq_len": 128, "precision": "fp16"},
    "training": {"optimizer": "adam"},
}


def scenario_file(tmp_path, name="s.yaml", text: str | None = None, **dotted) -> str:
    """SMALL with dotted-key changes, written as YAML (or ``text`` as it is)."""
    data = json.loads(json.dumps(SMALL))
    for key, value in dotted.items():
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    path = tmp_path / name
    path.write_text(text if text is not None else yaml.safe_dump(data))
    return str(path)


def one_line_error(r, *expected: str) -> str:
    """Exit 2, no traceback, one line that contains every expected piece."""
    out = r.output.strip()
    assert r.exit_code == 2, out
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert "Traceback" not in out
    assert len(out.splitlines()) == 1, out
    for piece in expected:
        assert piece in out, out
    return out


def invoke(runner, *args):
    return runner.invoke(app, [str(a) for a in args])


# --- 1. hangs: the engine finishes or stops with a clear error --------------------------------------


@pytest.mark.parametrize(
    "dotted,key",
    [
        (
            {
                "workload": {
                    "layers": [{"name": "l", "params": 1000, "forward_flops": 1e30}],
                    "micro_batch": 1,
                }
            },
            "workload.layers",
        ),
        (  # the slowest rank's compute: its factor, not the workload (found by the new-user trial)
            {"cluster.heterogeneity": {"slow_gpus": [{"rank": 1, "compute_factor": 1e9}]}},
            "cluster.heterogeneity.slow_gpus.0.compute_factor",
        ),
    ],
)
def test_absurdly_slow_iteration_stops_with_the_culprit(runner, tmp_path, dotted, key):
    path = scenario_file(tmp_path, **dotted)
    r = invoke(runner, "run", path, "--samples", "0")
    one_line_error(r, path, key, "simulated time exceeded 1e+06 s")


def test_an_error_line_keeps_brackets_in_names_and_paths(runner, tmp_path):
    """The error line went through rich markup: the slowest rank's op 'fwd block0 [slowest rank]'
    printed as 'fwd block0 ' and a file 'run[2].yaml' as 'run.yaml'."""
    slow = {"cluster.heterogeneity": {"slow_gpus": [{"rank": 1, "compute_factor": 1e9}]}}
    path = scenario_file(tmp_path, name="run[2].yaml", **slow)
    r = invoke(runner, "run", path, "--samples", "0")
    one_line_error(r, "run[2].yaml", "[slowest rank]'")


@pytest.mark.parametrize(
    "dotted,key,words",
    [
        ({"cluster.nic.line_rate_gbps": 1e-9}, "cluster.nic.line_rate_gbps", "below any real part"),
        (
            {"cluster.nic.line_rate_gbps": 1e-7, "cluster.nic.effective_gbps": 1e-9},
            "cluster.nic.line_rate_gbps",
            "below any real part",
        ),
        (
            {"cluster.nic.line_rate_gbps": 200, "cluster.nic.effective_gbps": 1e-9},
            "cluster.nic.effective_gbps",
            "below any real part",
        ),
        ({"cluster.nic.latency_us": 1e12}, "cluster.nic.latency_us", "beyond any real machine"),
    ],
)
def test_an_absurd_network_rate_is_refused_where_it_enters(runner, tmp_path, dotted, key, words):
    """Rates below the slowest link ever sold and latencies past a day never reach the simulator (they
    used to, and stopped it at 1e6 simulated seconds)."""
    path = scenario_file(tmp_path, **dotted)
    one_line_error(invoke(runner, "run", path, "--samples", "0"), path, f"{key}:", words)


def test_absurdly_slow_host_dram_is_refused_by_run_and_offload_plan(runner, tmp_path):
    data = json.loads(load_scenario("preset:offload-llama7b-h100").model_dump_json())
    data["cluster"]["host"]["dram_gbs"] = 1e-9
    path = tmp_path / "dram.yaml"
    path.write_text(yaml.safe_dump(data))
    for args in (("run", path, "--samples", "0"), ("offload", "plan", path)):
        one_line_error(invoke(runner, *args), str(path), "cluster.host.dram_gbs", "below any real part")


def test_slow_but_finite_network_finishes(tmp_path):
    """The slowest link (10 Mb/s) under GPT-3 6.7B's ZeRO-3 traffic: an iteration of ~3e4 s used to loop
    forever once the clock's resolution was coarser than the work left; it now finishes."""
    from clustersim.simulator import simulate

    slow = {
        "cluster.nic.line_rate_gbps": 0.01,
        "cluster.nic.kind": "ethernet_tcp",
        "workload.model": "GPT-3-6.7B",
        "workload.seq_len": 2048,
        "workload.micro_batch": 1,
        "training.sharding": {"stage": 3},
    }
    s = load_scenario(scenario_file(tmp_path, **slow))
    t = simulate(s, uncertainty_samples=0).iteration_time
    assert 1e4 < t < 1e6


def test_engine_time_limit_and_nan_durations():
    from clustersim.simulator.engine import Engine, RunawaySimulation
    from clustersim.simulator.program import Program

    prog = Program()
    prog.add("long", "compute", 10.0, "forward")
    with pytest.raises(RunawaySimulation):
        Engine(prog, time_limit=5.0).run()
    assert Engine(prog, time_limit=50.0).run()[1][0] == pytest.approx(10.0)
    for bad in (float("nan"), float("inf")):
        prog = Program()
        prog.add("bad", "compute", bad, "forward")
        with pytest.raises(RunawaySimulation):
            Engine(prog, time_limit=1e6).run()


def test_a_sweep_row_with_an_absurd_network_is_recorded_invalid_not_hung(tmp_path):
    import csv

    from clustersim.sweeps.run import run_sweep
    from clustersim.sweeps.spec import load_sweep

    out = tmp_path / "out"
    run_sweep(load_sweep(small_sweep(tmp_path, {"nic_gbps": [10, 1e-9]})), out)
    with (out / "results.csv").open() as fh:
        rows = {r["nic_gbps"]: r for r in csv.DictReader(fh)}
    assert rows["10.0"]["status"] == "ok"
    assert rows["1e-09"]["status"] == "invalid" and "below any real part" in rows["1e-09"]["error"]


def test_subgroup_size_of_one_is_refused_not_a_memory_error(runner, tmp_path):
    data = json.loads(load_scenario("preset:offload-llama7b-h100").model_dump_json())
    data["training"]["offload"]["subgroup_size"] = 1
    path = tmp_path / "sub.yaml"
    path.write_text(yaml.safe_dump(data))
    one_line_error(invoke(runner, "run", path, "--samples", "0"), str(path), "training.offload.subgroup_size")


# --- 2. numbers for nonsense --------------------------------------------------------------------------

NONSENSE = {
    "inf_line_rate": ({"cluster.nic.line_rate_gbps": float("inf")}, "cluster.nic.line_rate_gbps"),
    "nan_line_rate": ({"cluster.nic.line_rate_gbps": float("nan")}, "cluster.nic.line_rate_gbps"),
    "huge_line_rate": ({"cluster.nic.line_rate_gbps": 1e300}, "cluster.nic.line_rate_gbps"),
    "bool_nodes": ({"cluster.nodes": True}, "cluster.nodes"),
    "float_nodes": ({"cluster.nodes": 2.5}, "cluster.nodes"),
    "bool_bandwidth": ({"cluster.nic.line_rate_gbps": True}, "cluster.nic.line_rate_gbps"),
    "ten_million_nodes": ({"cluster.nodes": 10_000_000}, "cluster.nodes"),
    "nvswitch_1000_gpus": (
        {"cluster.gpu": "H100-SXM", "cluster.intra_node.fabric": "nvswitch", "cluster.gpus_per_node": 1000},
        "cluster.gpus_per_node",
    ),
    "pcie_1000_gpus": ({"cluster.gpus_per_node": 1000}, "cluster.gpus_per_node"),
    "huge_leaf": (
        {"cluster.fabric": {"kind": "leaf_spine", "nodes_per_leaf": 100_000}},
        "cluster.fabric.nodes_per_leaf",
    ),
    "huge_dram": ({"cluster.host.dram_gbs": 1e12}, "cluster.host.dram_gbs"),
    "inf_subgroup": ({"training.offload.subgroup_size": float("inf")}, "training.offload.subgroup_size"),
    "bool_zero_stage": ({"training.sharding.stage": True}, "training.sharding.stage"),
    "huge_switch": (
        {"cluster.fabric": {"kind": "leaf_spine", "nodes_per_leaf": 2, "ports_per_switch": 100_000}},
        "cluster.fabric.ports_per_switch",
    ),
    "bool_optimizer_option": (
        {"training.optimizer": "onebit-adam", "training.optimizer_options": {"param_groups": True}},
        "param_groups",
    ),
}


@pytest.mark.parametrize("case", sorted(NONSENSE))
def test_nonsense_scenarios_are_refused(runner, tmp_path, case):
    dotted, key = NONSENSE[case]
    path = scenario_file(tmp_path, **dotted)
    one_line_error(invoke(runner, "run", path), path, key)


def test_whole_floats_are_counts(tmp_path):
    """YAML reads ``params: 1.0e+9`` and ``nodes: 8.0`` as floats: whole ones are those integers."""
    path = scenario_file(tmp_path, **{"cluster.nodes": 2.0})
    assert load_scenario(str(path)).cluster.nodes == 2 and isinstance(
        load_scenario(str(path)).cluster.nodes, int
    )


def test_limits_live_in_the_catalog_with_sources():
    from clustersim.catalog import hardware_defaults

    lim = hardware_defaults()["limits"]
    assert {"nvswitch_gpus_per_node", "cluster_gpus", "nic_line_rate_gbps", "switch_radix"} <= set(lim)


def test_every_preset_is_within_the_limits():
    from clustersim.scenario import preset_names

    for name in preset_names():
        load_scenario(f"preset:{name}")


@pytest.mark.parametrize(
    "args,key",
    [
        (("collective", "preset:default", "--bytes", "1e400"), "--bytes"),
        (("collective", "preset:default", "--bytes", "1e400", "--json"), "--bytes"),
        (("collective", "preset:default", "--bytes", "nan"), "--bytes"),
        (("collective", "preset:onebit-adam-infiniband", "--group", "inter"), None),
        (("collective", "SINGLE", "--group", "intra"), "--group"),
        (("collective", "SINGLE", "--group", "world", "--json"), "--group"),
        (("report", "ignored", "--price", "nan"), "--price"),
        (("plan", "--model", "BERT-Large", "--steps", "10", "--deadline", "infh"), "--deadline"),
        (
            ("plan", "--model", "BERT-Large", "--steps", "10", "--deadline", "3d", "--budget", "nan"),
            "--budget",
        ),
        (("compare", "preset:default", "--warmup", "nan"), "--warmup"),
    ],
)
def test_non_finite_command_numbers_are_refused(runner, tmp_path, args, key):
    if args[1] == "preset:onebit-adam-infiniband":  # --group inter on a one-node cluster
        args = ("collective", scenario_file(tmp_path, **{"cluster.nodes": 1}), "--group", "inter")
        key = "--group"
    if args[1] == "SINGLE":  # a group of one GPU: its bandwidth would be infinite
        args = (
            args[0],
            scenario_file(tmp_path, **{"cluster.nodes": 1, "cluster.gpus_per_node": 1}),
            *args[2:],
        )
    one_line_error(invoke(runner, *args), key)


def test_json_output_never_holds_nan(monkeypatch, capsys):
    import typer

    from clustersim.commands.support import emit_json

    with pytest.raises(typer.Exit):
        emit_json({"time_s": float("nan")})
    assert "NaN" not in capsys.readouterr().out


PROFILE_BASE = {
    "format": "clustersim-profile",
    "format_version": 3,
    "device": "V100-PCIe",
    "provenance": {"source": "test"},
}


@pytest.mark.parametrize(
    "extra,key",
    [
        ({"memory_gbs": float("nan")}, "memory_gbs"),
        ({"matmul_tflops": {"fp16": float("nan")}}, "matmul_tflops"),
        ({"matmul_tflops": {"fp16": -3.0}}, "matmul_tflops"),
        ({"kernels_gbs": {"copy": float("inf")}}, "kernels_gbs"),
        (
            {
                "collectives": [
                    {"op": "all_reduce", "nodes": 2, "gpus_per_node": 4, "segments": [[0, -1.0837e-3, 1e-10]]}
                ]
            },
            "collectives",
        ),
        (
            {
                "collectives": [
                    {
                        "op": "all_reduce",
                        "nodes": 2,
                        "gpus_per_node": 4,
                        "segments": [[0, float("nan"), 1e-10]],
                    }
                ]
            },
            "collectives",
        ),
        ({"host": {"cpu_adam_params_per_s": {"8": float("nan")}}}, "host"),
    ],
)
def test_profiles_with_nan_or_negative_values_are_refused(runner, tmp_path, extra, key):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROFILE_BASE | extra))  # json writes NaN/Infinity, as a broken tool would
    r = invoke(runner, "run", scenario_file(tmp_path), "--profile", path, "--samples", "0")
    one_line_error(r, str(path), key)


# --- 3. tracebacks: bad paths, full disks, broken results --------------------------------------------


def test_trace_into_a_folder_or_a_missing_folder(runner, tmp_path):
    path = scenario_file(tmp_path)
    one_line_error(invoke(runner, "run", path, "--trace", tmp_path), str(tmp_path), "folder")
    missing = tmp_path / "no" / "such" / "t.json"
    one_line_error(invoke(runner, "run", path, "--trace", missing), "does not exist")
    assert not (tmp_path / "no").exists()  # never created silently


def test_calibrate_out_into_a_folder(runner, tmp_path):
    nccl = tmp_path / "nccl.txt"
    nccl.write_text("# nothing\n")
    one_line_error(invoke(runner, "calibrate", "import-nccl-tests", nccl, "--out", tmp_path), "folder")


def test_calibrate_model_out_into_a_read_only_folder_fails_before_measuring(runner, tmp_path, monkeypatch):
    """`calibrate model --out` into a folder it may not write measured for seconds before it refused: the
    folder's permission (a read-only folder or file system) is checked with the rest of --out, up front.
    os.access stands in for the read-only folder (the tests may run as root, whom chmod does not stop)."""
    import os

    from clustersim.calibration import model_calibration

    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False if str(p) == str(ro) else real(p, mode))
    measured = []
    monkeypatch.setattr(model_calibration, "calibrate_model", lambda *a, **k: measured.append(1))
    result = invoke(runner, "calibrate", "model", "--model", "BERT-Base", "--out", ro / "p.json")
    one_line_error(result, "not writable")
    assert not measured and not (ro / "p.json").exists()


class _FullDisk:
    """A file that writes ten bytes and then fails as a full disk does."""

    def __init__(self, fh):
        self.fh = fh

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()

    def write(self, data):
        import errno

        self.fh.write(data[:10])
        raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_while_writing_a_trace_leaves_nothing(runner, tmp_path, monkeypatch):
    import clustersim.io as io

    real = io.os.fdopen
    monkeypatch.setattr(io.os, "fdopen", lambda fd, mode: _FullDisk(real(fd, mode)))
    trace = tmp_path / "t.json"
    r = invoke(runner, "run", scenario_file(tmp_path), "--trace", trace, "--samples", "0")
    one_line_error(r, str(trace), "No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]  # no trace, no temporary file


def test_disk_full_while_writing_chakra_traces_leaves_none_of_them(runner, tmp_path, monkeypatch):
    """Two rank classes (a straggler): the second .et fails on a full disk. It used to end in an
    OSError traceback with the first file and half the second left in the folder."""
    import clustersim.io as io

    real, calls = io.os.fdopen, []

    def fdopen(fd, mode):
        calls.append(mode)
        return _FullDisk(real(fd, mode)) if len(calls) == 2 else real(fd, mode)

    monkeypatch.setattr(io.os, "fdopen", fdopen)
    out = tmp_path / "et"
    out.mkdir()
    slow = {"cluster.heterogeneity": {"slow_gpus": [{"rank": 1, "compute_factor": 1.2}]}}
    r = invoke(runner, "run", scenario_file(tmp_path, **slow), "--chakra", out, "--samples", "0")
    one_line_error(r, ".1.et", "No space left on device")
    assert calls == ["wb", "wb"] and list(out.iterdir()) == []  # no trace, no temporary file


def test_a_key_given_twice_is_refused_naming_the_line(runner, tmp_path):
    """PyYAML keeps the last of two equal keys: a second training: block (here pasted at the end to try
    another optimizer) silently replaced the first, and its sharding went with it."""
    text = yaml.safe_dump(SMALL) + "training: {optimizer: sgdm}\n"
    lines = text.splitlines()
    r = invoke(runner, "run", scenario_file(tmp_path, text=text), "--samples", "0")
    one_line_error(r, "s.yaml", f"line {len(lines)}", "'training' given twice")


def test_yaml_merge_keys_may_still_be_overridden():
    from clustersim.io import load_yaml

    assert load_yaml("a: &a {x: 1, y: 2}\nb:\n  <<: *a\n  y: 3\n")["b"] == {"x": 1, "y": 3}


def test_nan_rows_in_nccl_tests_files(runner, tmp_path):
    text = (
        "#  out-of-place in-place\n"
        "#  size  count  type  redop  root  time  algbw  busbw #wrong  time  algbw  busbw #wrong\n"
        "   1048576  262144  float  sum  -1  nan  nan  nan  0  nan  nan  nan  0\n"
    )
    path = tmp_path / "all_reduce.txt"
    path.write_text(text)
    r = invoke(runner, "calibrate", "import-nccl-tests", path, "--ranks", "8", "--out", tmp_path / "p.json")
    one_line_error(r, str(path))
    assert not (tmp_path / "p.json").exists()


def small_sweep(tmp_path, vary=None, name="sweep.yaml") -> str:
    base = scenario_file(tmp_path, name="base.yaml")
    data = {"name": "t", "base": base, "samples": 0, "vary": vary or {"gpus": [4, 8]}}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture
def results(tmp_path_factory):
    from clustersim.sweeps.run import run_sweep
    from clustersim.sweeps.spec import load_sweep

    tmp = tmp_path_factory.mktemp("results")
    out = tmp / "out"
    run_sweep(load_sweep(small_sweep(tmp, {"gpus": [4, 8], "optimizer": ["adam", "onebit-adam"]})), out)
    return out


def test_sweep_out_is_a_file(runner, tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("x")
    one_line_error(invoke(runner, "sweep", small_sweep(tmp_path), "--out", target), str(target), "file")


def test_disk_full_mid_sweep_keeps_whole_rows_and_resumes(tmp_path, monkeypatch):
    import csv
    import errno

    from clustersim.errors import InputError
    from clustersim.sweeps.run import run_sweep
    from clustersim.sweeps.spec import load_sweep

    sweep = load_sweep(small_sweep(tmp_path, {"gpus": [4, 8, 16, 32]}))
    out = tmp_path / "out"
    real = csv.DictWriter.writerow
    calls = {"n": 0}

    def writerow(self, row):
        calls["n"] += 1
        if (
            calls["n"] == 4
        ):  # the header, two rows, then the third row: half of it reaches the disk, then the disk is full
            self.writer.writerow(list(row.values())[:5])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, row)

    monkeypatch.setattr(csv.DictWriter, "writerow", writerow)
    with pytest.raises(InputError, match="No space left on device"):
        run_sweep(sweep, out, batch_size=1)
    text = (out / "results.csv").read_text()
    assert text.endswith("\n") and len(text.splitlines()) == 3  # header + two whole rows, no half line
    monkeypatch.setattr(csv.DictWriter, "writerow", real)
    counts = run_sweep(sweep, out, batch_size=1)
    assert counts["skipped"] == 2 and counts["written"] == 2


def _damage(results, tmp_path, how):
    import shutil

    folder = tmp_path / how
    shutil.copytree(results, folder)
    csv_path = folder / "results.csv"
    text = csv_path.read_text()
    if how == "truncated":
        csv_path.write_text(text[: len(text) - 60])
        return folder, "results.csv", "cut short"
    if how == "nan_cell":
        lines = text.splitlines()
        header = lines[0].split(",")
        cells = lines[1].split(",")
        cells[header.index("iteration_time_s")] = "nan"
        lines[1] = ",".join(cells)
        csv_path.write_text("\n".join(lines) + "\n")
        return folder, "line 2: iteration_time_s", "finite"
    if how == "garbage":
        csv_path.write_text(text + "<<<<<<< HEAD\n")
        return folder, "results.csv", f"line {len(text.splitlines()) + 1}"
    if how == "corrupt_json":
        (folder / "sweep.json").write_text('{"format": "clustersim-sweep-res')
        return folder, "sweep.json", "corrupt"
    if how == "json_list":
        (folder / "sweep.json").write_text("[1, 2]")
        return folder, "sweep.json", "not a clustersim sweep"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["truncated", "nan_cell", "garbage", "corrupt_json", "json_list"])
def test_report_on_a_damaged_results_folder(runner, results, tmp_path, how):
    folder, where, what = _damage(results, tmp_path, how)
    report = tmp_path / "report.html"
    one_line_error(invoke(runner, "report", folder, "--out", report), where, what)
    assert not report.exists()


def test_report_out_into_a_missing_folder(runner, results, tmp_path):
    out = tmp_path / "nope" / "r.html"
    one_line_error(invoke(runner, "report", results, "--out", out), "does not exist")
    assert not (tmp_path / "nope").exists()


# --- 4. concurrent sweeps into one folder ------------------------------------------------------------


def test_a_second_sweep_into_a_locked_folder_is_refused(runner, tmp_path):
    from clustersim.sweeps.spec import load_sweep
    from clustersim.sweeps.store import ResultsFolder

    sweep_file = small_sweep(tmp_path)
    out = tmp_path / "out"
    with ResultsFolder(out, load_sweep(sweep_file)).locked():  # the first sweep, still running
        r = invoke(runner, "sweep", sweep_file, "--out", out)
        one_line_error(r, str(out), "another sweep", f"pid {__import__('os').getpid()}")
        assert not (out / "results.csv").exists()
    r = invoke(runner, "sweep", sweep_file, "--out", out)  # released on exit: the folder works again
    assert r.exit_code == 0, r.output
    r = invoke(runner, "sweep", sweep_file, "--out", out)  # and a finished sweep can be resumed
    assert r.exit_code == 0 and "nothing to simulate: all 2 rows were already done" in r.output


def test_duplicate_rows_are_read_once(runner, results, tmp_path):
    import shutil

    from clustersim.sweeps.store import read_results

    folder = tmp_path / "dup"
    shutil.copytree(results, folder)
    csv_path = folder / "results.csv"
    lines = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join(lines + lines[1:]) + "\n")  # what two concurrent sweeps used to write
    _, rows = read_results(folder)
    assert len(rows) == len(lines) - 1
    assert invoke(runner, "report", folder, "--out", tmp_path / "r.html", "--price", "3").exit_code == 0


# --- 5. sweep values checked before any work -----------------------------------------------------------


def test_bad_axis_values_are_refused_up_front_one_line_per_kind(runner, tmp_path):
    sweep_file = small_sweep(
        tmp_path, {"gpus": [8, -4, 0], "optimizer": ["adam", "lion"], "nic_gbps": [10, float("nan"), True]}
    )
    out = tmp_path / "out"
    r = invoke(runner, "sweep", sweep_file, "--out", out)
    assert r.exit_code == 2 and "Traceback" not in r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 4, r.output  # gpus, optimizer, nic_gbps NaN, nic_gbps true
    assert all(sweep_file in line for line in lines)
    assert "vary.gpus: -4, 0: a GPU count must be a positive integer" in lines[0]
    assert any("vary.optimizer: \"lion\": unknown optimizer 'lion'" in line for line in lines)
    assert sum("vary.nic_gbps" in line for line in lines) == 2
    assert not out.exists()  # nothing written


def test_invalid_combinations_are_counted_before_and_after(runner, tmp_path):
    r = invoke(runner, "sweep", small_sweep(tmp_path, {"gpus": [8, 6, 16]}), "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "1 of 3 rows are not a valid cluster as given" in r.output
    assert "1 row(s) could not be simulated" in r.output and "6 GPUs is not a whole number" in r.output
    r = invoke(runner, "sweep", small_sweep(tmp_path, {"gpus": [8]}, "ok.yaml"), "--out", tmp_path / "ok")
    assert "none invalid" in r.output


def test_ctrl_c_during_a_sweep_says_how_to_resume(runner, tmp_path, monkeypatch):
    import clustersim.sweeps.run as sweep_run

    def interrupted(sweep, folder, *args, **kwargs):
        folder.open()
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep_run, "run_locked", interrupted)
    r = invoke(runner, "sweep", small_sweep(tmp_path), "--out", tmp_path / "out")
    assert r.exit_code == 130
    assert (
        "interrupted: 0 of 2 rows are saved" in r.output
        and "run the same command again to resume" in r.output
    )
    assert "Traceback" not in r.output


def test_with_world_size_refuses_non_positive_counts(default_scenario):
    from clustersim.errors import InputError

    for bad in (0, -4, True):
        with pytest.raises(InputError, match="positive integer"):
            default_scenario.with_world_size(bad)


# --- 6. compare: a cell out of memory does not abort the table -------------------------------------


def test_compare_marks_a_cell_out_of_memory_and_prints_the_rest(runner, tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "A100-80GB"},
                # Adam fits in 80 GB; 1-bit Adam's error-feedback buffers tip it over.
                "workload": {
                    "layers": [{"name": "l", "params": 4_000_000_000, "forward_flops": 1e9}],
                    "micro_batch": 1,
                },
            }
        )
    )
    args = ("compare", path, "--gpus", "8,1024", "--optimizers", "adam,onebit-adam", "--samples", "2")
    r = invoke(runner, *args)
    assert r.exit_code == 0, r.output
    assert "1,024 GPUs, onebit-adam: not simulated" in r.output and "does not fit in GPU memory" in r.output
    assert "break-even at 1,024 GPUs not computed" in r.output
    r = invoke(runner, *args, "--json")
    assert r.exit_code == 0, r.output
    rows = {(row["gpus"], row["optimizer"]): row for row in json.loads(r.stdout)["rows"]}
    assert rows[(1024, "adam")]["error"] is None and rows[(1024, "adam")]["speedup"] == 1.0
    assert rows[(1024, "onebit-adam")]["iteration_time_s"] is None
    assert "does not fit" in rows[(1024, "onebit-adam")]["error"]


def test_compare_refuses_a_gpu_count_beyond_the_limits_up_front(runner):
    one_line_error(invoke(runner, "compare", "preset:default", "--gpus", "8,4000000"), "--gpus", "4000000")


# --- 7. out of memory names the key that makes it not fit -------------------------------------------


@pytest.mark.parametrize(
    "workload,key",
    [
        ({"model": "GPT-3-1.3B", "micro_batch": 64, "seq_len": 2048}, "workload.micro_batch"),
        ({"model": "LLaMA-7B", "micro_batch": 1, "seq_len": 2048}, "workload.model"),
        (
            {"layers": [{"name": "l", "params": 6_000_000_000, "forward_flops": 1e9}], "micro_batch": 1},
            "workload.layers",
        ),
    ],
)
def test_out_of_memory_names_the_culprit(runner, tmp_path, workload, key):
    path = tmp_path / "oom.yaml"
    path.write_text(
        yaml.safe_dump(
            {"cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "A100-80GB"}, "workload": workload}
        )
    )
    out = one_line_error(invoke(runner, "run", path), f"{path}: {key}: does not fit in GPU memory")
    if key == "workload.micro_batch":
        assert "a micro_batch of at most 17 fits" in out  # fused attention keeps no s^2 scores


@pytest.mark.parametrize("text", ['{"format": "clustersim-sweep-res', "[1, 2]", "null"])
def test_resuming_into_a_folder_with_a_damaged_sweep_json(runner, tmp_path, text):
    sweep_file = small_sweep(tmp_path)
    out = tmp_path / "out"
    assert invoke(runner, "sweep", sweep_file, "--out", out).exit_code == 0
    (out / "sweep.json").write_text(text)
    before = (out / "results.csv").read_text()
    one_line_error(invoke(runner, "sweep", sweep_file, "--out", out), str(out / "sweep.json"))
    assert (out / "results.csv").read_text() == before


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"workload.input": {"bytes_per_sample": 100, "row_bytes": 512}}, "workload.input.row_bytes"),
        (
            {"cluster.fabric": {"kind": "leaf_spine", "core_oversubscription": 2.0}},
            "cluster.fabric.core_oversubscription",
        ),
    ],
)
def test_settings_that_would_mean_nothing_are_refused(overrides, key):
    """A row larger than a sample's features, a core tier's oversubscription without a core tier: refused
    naming the key instead of running as if they were not there."""
    from conftest import make_scenario

    from clustersim.errors import InputError

    with pytest.raises(InputError) as exc:
        make_scenario(**overrides)
    assert key in str(exc.value)


def test_a_scenario_name_with_brackets_prints_as_written(runner, tmp_path):
    """run's header went through rich markup: a scenario named 'my[test]run' printed as 'myrun'."""
    text = yaml.safe_dump({**SMALL, "name": "my[test]run"})
    r = invoke(runner, "run", scenario_file(tmp_path, text=text), "--samples", "0")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("my[test]run: 8 GPUs"), r.output


def test_a_json_key_given_twice_is_refused(runner, tmp_path):
    """json keeps the last of two equal keys silently, as PyYAML did: refused as in YAML."""
    path = tmp_path / "s.json"
    body = json.dumps(SMALL)
    path.write_text(body[:-1] + ', "training": {"optimizer": "sgdm"}}')
    r = invoke(runner, "run", str(path), "--samples", "0")
    one_line_error(r, "s.json", "'training' given twice")


def test_table_cells_are_text_not_markup(runner, tmp_path):
    """A name in brackets is printed whole in a table (rich took '[x]' for a style tag and dropped it)."""
    from clustersim.commands.support import console, table

    with console.capture() as captured:
        console.print(table("t", ["name", "value"], [["stage 0 [slowest rank]", 1]]))
    assert "stage 0 [slowest rank]" in captured.get()


@pytest.mark.parametrize(
    ("optimizer", "says"),
    [
        ("onebit-adam", "NCCL-based 1-bit Adam runs under its PipelineEngine"),
        ("zero-one-adam", "NCCL-based 0/1 Adam runs under its PipelineEngine"),
        ("binsgdm", "over data-parallel replicas"),
    ],
)
def test_compressed_optimizers_with_model_parallelism_say_their_own_reason(optimizer, says):
    from clustersim.errors import InputError
    from clustersim.scenario import load_scenario

    with pytest.raises(InputError) as exc:
        load_scenario("preset:dgx-h100-gpt3-175b-3d").with_changes(**{"training.optimizer": optimizer})
    assert says in str(exc.value) and exc.value.key.endswith("training.optimizer")


def test_a_change_below_a_value_is_refused_by_its_key_not_replaced():
    """``with_changes`` (the API's what-if, sweeps, plans) descends into sections; a dotted key that
    goes below a value (``workload.model`` is a name) is refused, where it used to replace the value
    with an empty section and fail on something else."""
    from clustersim.errors import InputError

    base = load_scenario("preset:default")
    with pytest.raises(InputError) as exc:
        base.with_changes(**{"workload.model.name": "GPT-3-1.3B"})
    assert exc.value.key == "workload.model.name"
    assert "workload.model is 'BERT-Large', a value, not a section" in str(exc.value)
    # an unset section is still created (offload is left to its default by the preset)
    assert base.with_changes(**{"training.offload.mode": "zero"}).training.offload.mode == "zero"


def test_a_change_below_a_default_value_or_a_list_is_refused_and_null_resets():
    """The check reads the scenario with its defaults, so a key the file left to its default is a value
    too; a list is named by its size, not printed; None resets a key to its default."""
    from clustersim.errors import InputError

    base = load_scenario("preset:default")
    with pytest.raises(InputError) as exc:
        base.with_changes(**{"workload.batch_norm.x": 1})
    assert "workload.batch_norm is 'separate', a value, not a section" in str(exc.value)
    changed = base.with_changes(**{"workload.attention": "eager"})
    assert changed.with_changes(**{"workload.attention": None}).workload.attention == base.workload.attention
    assert "attention" not in changed.with_changes(**{"workload.attention": None}).workload.model_fields_set


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("workload.batchnorm", "batch_norm"),
        ("training.gradient_cliping", "gradient_clipping"),
        ("cluster.nic.line_rate", "line_rate_gbps"),
    ],
)
def test_a_misspelt_optional_key_names_the_key_it_resembles(tmp_path, key, meant):
    """A typo of a key with a default has no missing sibling to pair with: the schema's own keys at that
    place are what it is matched against."""
    from typer.testing import CliRunner

    out = CliRunner().invoke(app, ["run", "preset:default", "--set", f"{key}=1", "--samples", "0"])
    assert out.exit_code == 2
    assert f"{key}: unknown key (did you mean {meant}?)" in out.output
    out = CliRunner().invoke(app, ["run", "preset:default", "--set", "workload.zzz=1"])
    assert out.exit_code == 2 and out.output.strip().endswith("workload.zzz: unknown key")


def test_a_change_below_a_list_is_refused_by_its_key():
    """A dotted key through a list of layers is refused by the list's key, for the API as for --set."""
    from clustersim.errors import InputError

    base = load_scenario("examples/testbed-cpu-hosts.yaml")
    with pytest.raises(InputError) as exc:
        base.with_changes(**{"workload.layers.params": 3})
    assert exc.value.key == "workload.layers.params"
    assert "workload.layers is a list: a dotted key changes keys, not a list's items" in str(exc.value)


@pytest.mark.parametrize("gpu", ["V100-SXM2", "MI250X"])
def test_tf32_on_a_gpu_without_tf32_units_is_refused_not_priced_as_tensor_cores(gpu):
    """TF32 mode on a V100 (or an MI250X) is plain fp32: a tf32 scenario there is one line asking for
    fp32, not a price on tensor cores the GPU does not have (it came out slower than fp32)."""
    from clustersim.errors import InputError
    from clustersim.simulator import simulate

    base = load_scenario("preset:default").with_changes(
        **{"cluster.gpu": gpu, "cluster.intra_node.fabric": "pcie"}
    )
    with pytest.raises(InputError) as exc:
        simulate(base.with_changes(**{"workload.precision": "tf32"}))
    assert exc.value.key == "workload.precision"
    assert f"{gpu} has no tf32 tensor cores" in exc.value.message and "give fp32" in exc.value.message
    assert simulate(base.with_changes(**{"workload.precision": "fp32"})).iteration_time > 0


def test_an_overrun_of_a_collective_priced_by_a_profile_names_its_network_section():
    """A collective inside one node whose rate the profile's fitted network model set: the overrun
    names network.parameters in the profile's file, not the scenario's cluster.intra_node."""
    from types import SimpleNamespace

    from clustersim.identifiers import Category
    from clustersim.simulator.culprit import culprit, culprit_source
    from clustersim.simulator.program import Op
    from tests.conftest import make_scenario

    s = make_scenario(**{"cluster.nodes": 1})
    op = Op(0, "all_reduce bucket0", "comm", 2e6, Category.COMMUNICATION)
    for profile, key, source in [
        (None, "cluster.intra_node", None),
        (SimpleNamespace(network=object(), label="p.json"), "network.parameters", "p.json"),
    ]:
        ctx = SimpleNamespace(scenario=s, profile=profile)
        assert culprit(ctx, op, 2e6, 1e6) == key
        assert culprit_source(ctx, key) == source
