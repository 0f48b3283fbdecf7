"""Sweeps on Dask: results equal a serial run, resume, a dying worker, bad input."""

import copy
import csv
import json
import os

import pytest
import yaml
from typer.testing import CliRunner

from clustersim.cli import app
from clustersim.errors import InputError
from clustersim.sweeps.run import CRASH_ENV, run_sweep, simulate_row
from clustersim.sweeps.spec import load_sweep, row_id
from tests.conftest import SMALL_SCENARIO

SWEEP = {
    "name": "t",
    "base": "preset:default",
    "vary": {"gpus": [8, 16, 32], "nic_gbps": [10, 40], "optimizer": ["adam", "onebit-adam"]},
    "steps": 1000,
    "global_batch": 512,
}


def write(tmp_path, data=SWEEP, name="sweep.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def rows_of(out):
    with (out / "results.csv").open() as fh:
        return {r["row_id"]: r for r in csv.DictReader(fh)}


def test_serial_rows_and_columns(tmp_path):
    sweep = load_sweep(write(tmp_path))
    counts = run_sweep(sweep, tmp_path / "out")
    assert counts == {"total": 12, "skipped": 0, "written": 12}
    rows = rows_of(tmp_path / "out")
    assert all(r["status"] == "ok" for r in rows.values())
    r = next(iter(rows.values()))
    assert int(r["global_batch"]) == 512 and float(r["time_to_train_s"]) > 0
    scen = [json.loads(line) for line in (tmp_path / "out" / "scenarios.jsonl").read_text().splitlines()]
    assert {s["row_id"] for s in scen} == set(rows)


def test_local_cluster_with_two_workers_equals_serial(tmp_path):
    from dask.distributed import LocalCluster

    sweep = load_sweep(write(tmp_path))
    run_sweep(sweep, tmp_path / "serial")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        run_sweep(sweep, tmp_path / "dask", scheduler=cluster.scheduler_address, batch_size=2)
    a, b = rows_of(tmp_path / "serial"), rows_of(tmp_path / "dask")
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == b[k]


def test_a_worker_dying_mid_sweep_loses_no_rows(tmp_path, monkeypatch):
    from dask.distributed import LocalCluster

    marker = tmp_path / "crash-once"
    marker.write_text("x")
    monkeypatch.setenv(CRASH_ENV, str(marker))
    sweep = load_sweep(write(tmp_path))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        counts = run_sweep(sweep, tmp_path / "out", scheduler=cluster.scheduler_address, batch_size=1)
    assert not marker.exists()  # a worker process did exit
    assert counts["written"] == 12 and len(rows_of(tmp_path / "out")) == 12


def test_local_worker_processes_equal_serial_and_survive_a_dying_worker(tmp_path, monkeypatch):
    """The default local pool (forced on for a small sweep) gives the serial rows; a worker that dies
    loses nothing: the batches the broken pool did not finish run in this process."""
    from clustersim.sweeps import run as sweep_run

    monkeypatch.setattr(sweep_run, "MIN_PARALLEL_WORK_S", 0.0)
    sweep = load_sweep(write(tmp_path))
    run_sweep(sweep, tmp_path / "serial", workers=1)
    run_sweep(sweep, tmp_path / "pool", workers=2, batch_size=2)
    a, b = rows_of(tmp_path / "serial"), rows_of(tmp_path / "pool")
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a)
    marker = tmp_path / "crash-once"
    marker.write_text("x")
    monkeypatch.setenv(CRASH_ENV, str(marker))
    counts = run_sweep(sweep, tmp_path / "crash", workers=2, batch_size=1)
    assert not marker.exists()  # a worker process did exit
    assert counts["written"] == 12 and rows_of(tmp_path / "crash").keys() == a.keys()


def test_interrupted_sweep_resumes_without_duplicates(tmp_path):
    sweep = load_sweep(write(tmp_path))
    first = run_sweep(sweep, tmp_path / "out", batch_size=1, stop_after=5)
    kept = rows_of(tmp_path / "out")
    assert 5 <= first["written"] < 12 and len(kept) == first["written"]
    second = run_sweep(sweep, tmp_path / "out")
    assert second["skipped"] == len(kept) and second["skipped"] + second["written"] == 12
    with (tmp_path / "out" / "results.csv").open() as fh:
        ids = [r["row_id"] for r in csv.DictReader(fh)]
    assert len(ids) == len(set(ids)) == 12
    assert all(rows_of(tmp_path / "out")[k] == v for k, v in kept.items())  # finished rows untouched


def test_invalid_combinations_are_recorded_not_fatal(tmp_path):
    data = dict(SWEEP, vary={"gpus": [8, 6], "optimizer": ["adam"]})
    sweep = load_sweep(write(tmp_path, data))
    run_sweep(sweep, tmp_path / "out")
    rows = rows_of(tmp_path / "out")
    assert sorted(r["status"] for r in rows.values()) == ["invalid", "ok"]


@pytest.mark.parametrize("gpus", [[8, 16], [8, 6]])
def test_a_resumed_sweep_with_nothing_left_says_so(tmp_path, runner, gpus):
    """Re-running a finished sweep said "0 rows simulated, N already done" and then "every row was
    simulated": it says there was nothing to simulate, how many rows were done, and still counts the
    invalid rows of the folder."""
    spec = write(tmp_path, dict(SWEEP, vary={"gpus": gpus, "optimizer": ["adam"]}))
    out = tmp_path / "out"
    args = ["sweep", str(spec), "--out", str(out), "--workers", "1", "--samples", "0"]
    assert runner.invoke(app, args).exit_code == 0
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert f"nothing to simulate: all 2 rows were already done in {out}/" in text
    assert "0 rows" not in text and "every row was simulated" not in text
    assert ("(none invalid)" in text) == (6 not in gpus)
    assert ("1 row(s) could not be simulated" in text) == (6 in gpus)


@pytest.mark.parametrize(
    "data,match",
    [
        ({**SWEEP, "vary": {"colour": [1]}}, "unknown axis 'colour'"),
        ({**SWEEP, "vary": {"gpus": []}}, "empty axis"),
        ({**SWEEP, "vary": {}}, "nothing to vary"),
        ({**SWEEP, "frobnicate": 1}, "frobnicate: unknown key"),
        ({**SWEEP, "base": "preset:nope"}, "unknown preset"),
    ],
)
def test_bad_sweep_files(tmp_path, data, match):
    with pytest.raises(InputError, match=match):
        load_sweep(write(tmp_path, data))


def test_dotted_axes_are_accepted(tmp_path):
    data = dict(SWEEP, vary={"cluster.nic.count": [1, 2], "gpus": [16]})
    assert len(load_sweep(write(tmp_path, data)).rows()) == 2


def test_results_folder_of_another_sweep_is_refused(tmp_path, runner):
    run_sweep(load_sweep(write(tmp_path)), tmp_path / "out")
    before = (tmp_path / "out" / "results.csv").read_text()
    other = write(tmp_path, dict(SWEEP, vary={"gpus": [8]}), "other.yaml")
    r = runner.invoke(app, ["sweep", str(other), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "run with other settings" in r.output  # same name, other values
    assert (tmp_path / "out" / "results.csv").read_text() == before  # finished rows kept
    r = runner.invoke(app, ["sweep", str(write(tmp_path)), "--out", str(tmp_path / "out"), "--samples", "3"])
    assert r.exit_code == 2 and "samples" in r.output and "there, 3 now" in r.output
    renamed = write(tmp_path, dict(SWEEP, name="renamed", vary={"gpus": [8]}), "renamed.yaml")
    r = runner.invoke(app, ["sweep", str(renamed), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "another sweep" in r.output
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("x")
    r = runner.invoke(app, ["sweep", str(other), "--out", str(tmp_path / "junk")])
    assert r.exit_code == 2 and "not empty" in r.output


def test_unreachable_scheduler(tmp_path, runner, monkeypatch):
    monkeypatch.setenv("CLUSTERSIM_SCHEDULER_TIMEOUT", "2s")
    r = runner.invoke(
        app,
        ["sweep", str(write(tmp_path)), "--out", str(tmp_path / "out"), "--scheduler", "tcp://127.0.0.1:9"],
    )
    assert r.exit_code == 2 and "cannot reach the Dask scheduler" in r.output and "Traceback" not in r.output


def test_a_sweep_on_a_scheduler_connects_once_and_closes_its_client(tmp_path, runner, monkeypatch):
    """The CLI and run_sweep reach --scheduler once (the connection that refuses an address that does
    not answer is the one the rows run on) and close that client when the sweep ends."""
    from dask.distributed import LocalCluster

    from clustersim.sweeps import run as sweep_run

    opened = []

    def counted(scheduler, workers):
        opened.append(sweep_run_open_client(scheduler, workers))
        return opened[-1]

    sweep_run_open_client = sweep_run.open_client
    monkeypatch.setattr(sweep_run, "open_client", counted)
    small = {**SWEEP, "vary": {"gpus": [8, 16], "optimizer": ["adam"]}, "samples": 0}
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        args = ["sweep", str(write(tmp_path, small)), "--scheduler", cluster.scheduler_address]
        r = runner.invoke(app, [*args, "--out", str(tmp_path / "cli")])
        assert r.exit_code == 0, r.output
        assert "2 rows simulated" in r.output and len(opened) == 1
        counts = run_sweep(load_sweep(write(tmp_path, small)), tmp_path / "api", cluster.scheduler_address)
        assert counts["written"] == 2 and len(opened) == 2
    assert all(client.status == "closed" and own is None for client, own in opened)
    assert rows_of(tmp_path / "cli") == rows_of(tmp_path / "api")


def test_sweep_cli_progress_and_json(tmp_path, runner):
    r = runner.invoke(app, ["sweep", str(write(tmp_path)), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert "12 rows simulated" in r.output
    r = runner.invoke(app, ["sweep", str(write(tmp_path)), "--out", str(tmp_path / "out"), "--json"])
    assert json.loads(r.stdout)["skipped"] == 12


def test_global_batch_must_split(tmp_path):
    rec = simulate_row(load_sweep(write(tmp_path)).base.model_dump(mode="json"), {"gpus": 16}, 10, None, 100)
    assert rec["status"] == "invalid" and "does not split" in rec["error"]
    assert rec["row_id"] == row_id({"gpus": 16})


def test_a_folder_begun_before_new_columns_resumes_in_its_own_columns(tmp_path):
    """results.csv written by an older clustersim (without the hottest_link, nic_count, mfu and
    tokens_per_s_per_gpu columns) is resumed with its own header: appended rows stay aligned and the
    whole file reads back."""
    from clustersim.sweeps.store import read_results

    sweep = load_sweep(write(tmp_path))
    run_sweep(sweep, tmp_path / "out", batch_size=1, stop_after=3)
    path = tmp_path / "out" / "results.csv"
    with path.open(newline="") as fh:
        old = [r[:-5] for r in csv.reader(fh)]  # drop the five newest columns, as an older version wrote
    assert old[0][-1] == "gpu_hours"
    with path.open("w", newline="") as fh:
        csv.writer(fh).writerows(old)
    run_sweep(sweep, tmp_path / "out")
    _, rows = read_results(tmp_path / "out")
    assert len(rows) == len(sweep.rows()) and all(r["status"] in ("ok", "invalid") for r in rows)
    with path.open(newline="") as fh:
        assert {len(r) for r in csv.reader(fh)} == {len(old[0])}


def _python(code: str) -> list[str]:
    """A command running ``code`` in a fresh interpreter that imports this worktree's clustersim."""
    import sys

    return [sys.executable, "-c", code]


def _env() -> dict:
    import os

    return dict(os.environ, PYTHONPATH=os.getcwd())


def test_a_file_size_limit_leaves_a_folder_that_resumes(tmp_path):
    """``ulimit -f 4``: the first batch does not fit in 4 KiB, its write is undone (an empty
    results.csv, its header gone with it). The re-run without the limit starts the file again with its
    header and finishes every row once."""
    import subprocess

    sweep_file = write(tmp_path)
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))\n"
        "from clustersim.errors import InputError\n"
        "from clustersim.sweeps.run import run_sweep\n"
        "from clustersim.sweeps.spec import load_sweep\n"
        f"try:\n    run_sweep(load_sweep({str(sweep_file)!r}), {str(tmp_path / 'out')!r}, batch_size=12)\n"
        "except InputError as exc:\n    print(exc); sys.exit(2)\n"
    )
    done = subprocess.run(_python(code), capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 2 and "File too large" in done.stdout, done.stderr[-2000:]
    assert (tmp_path / "out" / "results.csv").stat().st_size == 0
    counts = run_sweep(load_sweep(sweep_file), tmp_path / "out")
    assert counts == {"total": 12, "skipped": 0, "written": 12}
    with (tmp_path / "out" / "results.csv").open() as fh:
        ids = [r["row_id"] for r in csv.DictReader(fh)]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 12


@pytest.mark.parametrize(
    "csv_text,jsonl_text",
    [
        ("", ""),  # the write of the first batch undone: an empty file
        ("row_id,sta", ""),  # a header cut short by a crash
        (None, '{"row_id": "x", "scen'),  # a scenarios line cut short
    ],
)
def test_torn_results_files_are_repaired_on_resume(tmp_path, csv_text, jsonl_text):
    sweep = load_sweep(write(tmp_path))
    out = tmp_path / "out"
    run_sweep(sweep, out, batch_size=1, stop_after=3)
    if csv_text is not None:
        (out / "results.csv").write_text(csv_text)
    with (out / "scenarios.jsonl").open("a") as fh:
        fh.write(jsonl_text)
    counts = run_sweep(sweep, out)
    assert counts["written"] + counts["skipped"] == 12
    assert len(rows_of(out)) == 12
    scen = [json.loads(line) for line in (out / "scenarios.jsonl").read_text().splitlines()]
    assert {s["row_id"] for s in scen} == set(rows_of(out))


def _children(pid: int) -> set[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    from pathlib import Path

    out = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.add(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    from pathlib import Path

    try:  # a zombie has exited; only its parent's wait is missing
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_worker_processes_die_with_a_killed_sweep(tmp_path, sig):
    """The sweep's process is killed while its pool runs (it blocks in storing its first batch): the
    spawned workers and the pool's resource tracker exit within seconds instead of holding the
    caller's pipes."""
    import signal
    import subprocess
    import time

    code = (
        "import sys, time\n"
        "from clustersim.sweeps import run\n"
        "from clustersim.sweeps.spec import load_sweep\n"
        f"sweep = load_sweep({str(write(tmp_path))!r})\n"
        "rows = [[r] for r in sweep.rows()]\n"
        "base = sweep.base.model_dump(mode='json')\n"
        "def written(records):\n"
        "    print('pool started', flush=True)\n"
        "    time.sleep(600)\n"
        "run._run_on_processes(rows, base, (None, None, None, 0, ()), 3, written)\n"
    )
    child = subprocess.Popen(_python(code), stdout=subprocess.PIPE, text=True, env=_env())
    workers: set[int] = set()
    try:
        assert child.stdout.readline().strip() == "pool started"
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline:  # 2 workers (+ the resource tracker)
            workers = _children(child.pid)
            time.sleep(0.1)
        assert len(workers) >= 2
        child.send_signal(getattr(signal, sig))
        child.wait(timeout=30)
        deadline = time.monotonic() + 20
        while any(map(_alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(_alive, workers)), [p for p in workers if _alive(p)]
    finally:
        for pid in [child.pid, *workers]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_sweep_of_too_many_rows_is_refused_before_it_expands(tmp_path):
    vary = {k: list(range(1, 41)) for k in ("gpus", "nic_gbps", "micro_batch", "seq_len")}
    with pytest.raises(InputError) as err:
        load_sweep(write(tmp_path, dict(SWEEP, vary=vary)))
    assert err.value.key == "vary" and "40 x 40 x 40 x 40 = 2,560,000 rows" in str(err.value)


def test_a_yaml_alias_bomb_in_vary_is_refused_before_it_is_walked(tmp_path):
    """Nine nested aliases of a list of ten: 10^10 values in a few hundred bytes of YAML, which
    printing, hashing or validating value by value would walk for hours."""
    nested = "[8, 8, 8, 8, 8, 8, 8, 8, 8, 8]"
    for i in range(9):
        nested = "[" + ", ".join([f"&b{i} {nested}"] + [f"*b{i}"] * 9) + "]"
    path = tmp_path / "bomb.yaml"
    path.write_text(f"name: bomb\nbase: preset:default\nvary:\n  micro_batch: {nested}\n")
    with pytest.raises(InputError) as err:
        load_sweep(path)
    # the file reader counts aliases as it expands them and stops first (io.read_input_text), naming the file
    assert "aliases are expanded" in str(err.value) and str(path) in str(err.value.source)


@pytest.mark.parametrize("name", ["results.csv", "sweep.json", ".lock"])
def test_a_named_pipe_in_a_results_folder_is_refused_not_waited_on(tmp_path, name):
    """Opening a FIFO blocks until someone writes to it; the folder's files are checked with stat first."""
    from clustersim.sweeps.store import read_results

    sweep = load_sweep(write(tmp_path))
    out = tmp_path / "out"
    run_sweep(sweep, out, stop_after=1, batch_size=1)
    (out / name).unlink()
    os.mkfifo(out / name)
    with pytest.raises(InputError, match="not a regular file"):
        run_sweep(sweep, out)
    if name != ".lock":
        with pytest.raises(InputError, match="not a regular file"):
            read_results(out)


def test_rows_varying_megatron_layouts_share_one_model_code(tmp_path):
    """A tensor-parallel axis makes some rows Megatron layouts (framework code, fused pointwise kernels);
    with the base's workload.pointwise open, every row is priced so, and a data-parallel sweep keeps its
    own default."""
    base = copy.deepcopy(SMALL_SCENARIO)
    base["cluster"].update({"nodes": 1, "gpus_per_node": 8})
    base["workload"] = {"model": "GPT-3-1.3B", "micro_batch": 1, "seq_len": 2048, "precision": "bf16"}
    megatron = tmp_path / "tp.yaml"
    megatron.write_text(yaml.safe_dump({"base": base, "vary": {"training.parallelism.tensor": [1, 8]}}))
    assert load_sweep(megatron).base.pointwise_code == "fused"
    plain = tmp_path / "dp.yaml"
    plain.write_text(yaml.safe_dump({"base": base, "vary": {"gpus": [8, 16]}}))
    assert load_sweep(plain).base.workload.pointwise is None
    assert load_sweep(plain).base.pointwise_code == "unfused"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"implementation": "abc"}, "training.optimizer_options.implementation: Input should be"),
        ({"implementation": True}, "training.optimizer_options.implementation: Input should be"),
        ({"fooo": 1}, "training.optimizer_options.fooo: unknown key"),
    ],
)
def test_optimizer_options_no_optimizer_accepts_are_refused_before_any_work(runner, tmp_path, options, says):
    """An options mapping valid for no optimizer can never make a valid row: one line, exit 2. A mapping
    some optimizer takes ({scheme: flat}, BinSGDM's) is left to the rows."""
    data = {"base": "preset:default", "vary": {"training.optimizer_options": [{"scheme": "flat"}, options]}}
    r = runner.invoke(app, ["sweep", str(write(tmp_path, data)), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2
    assert says in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_rows_time_split_adds_up_and_keeps_host_waits_apart_from_communication(tmp_path):
    """The CSV's parts add up to the iteration (pipeline bubbles included), and the GPU waiting on its
    host's dispatch is its own column, as run's breakdown reports it, not exposed communication."""
    from clustersim.scenario import load_scenario
    from clustersim.simulator import simulate

    sweep = {
        "name": "split",
        "base": "preset:default",
        "vary": {"optimizer": ["adam"], "gpus": [8]},
        "steps": 10,
    }
    run_sweep(load_sweep(write(tmp_path, sweep)), tmp_path / "out")
    (row,) = rows_of(tmp_path / "out").values()
    parts = ("forward", "backward", "compression", "optimizer", "other", "exposed_communication")
    total = sum(float(row[f"{p}_s"]) for p in (*parts, "exposed_host", "idle"))
    assert total == pytest.approx(float(row["iteration_time_s"]), rel=1e-6)
    breakdown = simulate(load_scenario("preset:default").with_world_size(8), uncertainty_samples=0).breakdown
    assert breakdown["exposed_host"] > 0  # fp16: the host waits before the update (default preset)
    assert float(row["exposed_host_s"]) == pytest.approx(breakdown["exposed_host"], rel=1e-6)
    expected = breakdown["exposed_communication"] + breakdown["exposed_transfer"]
    assert float(row["exposed_communication_s"]) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize(
    ("base_model", "axis", "values", "says"),
    [
        ("BERT-Large", "workload.batch_norm", ["separate", "fused"], "BERT-Large (a transformer)"),
        ("ResNet-50", "workload.attention", ["fused", "eager"], "ResNet-50 (a convolution network)"),
    ],
)
def test_an_axis_no_rows_model_uses_is_a_note_not_silence(tmp_path, base_model, axis, values, says):
    from clustersim import api

    base = copy.deepcopy(SMALL_SCENARIO)
    base["workload"] = {"model": base_model, "micro_batch": 8, "precision": "fp16"}
    sweep = {"name": "n", "base": base, "vary": {axis: values}, "samples": 0}
    path = write(tmp_path, sweep)
    result = api.sweep(path, tmp_path / "api", workers=1)
    (note,) = result.notes
    assert note.startswith(f"vary.{axis}: {axis} does not apply to {says}")
    out = CliRunner().invoke(app, ["sweep", str(path), "--out", str(tmp_path / "cli"), "--workers", "1"])
    assert out.exit_code == 0, out.output
    assert f"note: vary.{axis}: {axis} does not apply" in out.output
    # an axis the model uses, or a mix of both kinds of model, says nothing
    mixed = {**sweep, "vary": {axis: values, "model": ["BERT-Large", "ResNet-50"]}}
    assert api.sweep(write(tmp_path, mixed, "mixed.yaml"), tmp_path / "mixed", workers=1).notes == []


def test_one_optimizer_option_is_an_axis_applied_to_each_rows_optimizer(tmp_path):
    """training.optimizer_options.implementation varies by itself: each row's optimizer runs with it
    (Adam's and SGD-M's update times differ along it), an optimizer without the option runs as it is
    with a note, and the rows equal scenarios given the option by hand."""
    from clustersim import api
    from clustersim.scenario import validate_scenario
    from clustersim.simulator import simulate

    axis = "training.optimizer_options.implementation"
    sweep = {
        "name": "o",
        "base": SMALL_SCENARIO,
        "vary": {"optimizer": ["adam", "binsgdm"], axis: ["fused", "for_loop"]},
        "samples": 0,
    }
    result = api.sweep(write(tmp_path, sweep), tmp_path / "out", workers=1)
    assert result.notes == [
        f"vary.{axis}: binsgdm has no option implementation: its rows along it are the same"
    ]
    rows = {
        (r["optimizer"], r[axis]): float(r["iteration_time_s"]) for r in rows_of(tmp_path / "out").values()
    }
    assert rows[("binsgdm", "fused")] == rows[("binsgdm", "for_loop")]
    assert rows[("adam", "for_loop")] > rows[("adam", "fused")]
    by_hand = copy.deepcopy(SMALL_SCENARIO)
    by_hand["training"] = {**by_hand.get("training", {}), "optimizer": "adam"}
    by_hand["training"]["optimizer_options"] = {"implementation": "for_loop"}
    assert rows[("adam", "for_loop")] == pytest.approx(simulate(validate_scenario(by_hand)).iteration_time)


@pytest.mark.parametrize(
    ("axis", "values", "says"),
    [
        (
            "training.optimizer_options.implementation",
            ["fast"],
            "Input should be 'fused', 'foreach' or 'for_loop'",
        ),
        (
            "training.optimizer_options.implementaton",
            ["fused"],
            "did you mean training.optimizer_options.implementation?",
        ),
        ("training.optimizer_options.colour", ["red"], "unknown axis 'training.optimizer_options.colour'"),
    ],
)
def test_a_bad_optimizer_option_axis_is_one_line_naming_it(tmp_path, axis, values, says):
    sweep = {"name": "b", "base": "preset:default", "vary": {axis: values}}
    out = CliRunner().invoke(app, ["sweep", str(write(tmp_path, sweep)), "--out", str(tmp_path / "o")])
    assert out.exit_code == 2, out.output
    assert f"vary.{axis}:" in out.output and says in out.output
    assert "Traceback" not in out.output and not (tmp_path / "o").exists()


def test_a_model_axis_keeps_the_bases_sequence_length_for_the_bases_model_and_says_so_for_others(tmp_path):
    """The base's own model keeps the base's seq_len along a model axis (it used to fall back to the
    model's default silently); another model takes its own default, with a note before the rows run."""
    from clustersim import api

    base = copy.deepcopy(SMALL_SCENARIO)
    base["workload"] = {**base["workload"], "seq_len": 512}
    sweep = {"name": "m", "base": base, "vary": {"model": ["BERT-Large", "GPT-2-355M"]}, "samples": 0}
    result = api.sweep(write(tmp_path, sweep), tmp_path / "out", workers=1)
    lengths = {}
    for line in (tmp_path / "out" / "scenarios.jsonl").read_text().splitlines():
        s = json.loads(line)["scenario"]
        lengths[s["workload"]["model"]] = s["workload"].get("seq_len")
    assert lengths == {"BERT-Large": 512, "GPT-2-355M": None}
    assert result.notes == [
        "vary.model: rows of GPT-2-355M use each model's default seq_len, not the base's 512; "
        "vary seq_len to set it"
    ]
    varied = {**sweep, "vary": {**sweep["vary"], "seq_len": [256]}}
    assert api.sweep(write(tmp_path, varied, "v.yaml"), tmp_path / "v", workers=1).notes == []


def test_the_results_folder_is_made_but_not_its_parents_nor_under_a_file(tmp_path):
    """`--out` creates the results folder itself, in a folder that exists: a missing parent is one line
    naming it (as run, report and calibrate say it), exit 2, and nothing is created; so is a path under a
    file, before any row runs."""
    runner = CliRunner()
    spec = write(tmp_path)
    out = tmp_path / "nodir" / "deeper" / "res"
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(out), "--workers", "1", "--samples", "0"])
    assert r.exit_code == 2, r.output
    assert "nodir" in r.output and "does not exist" in r.output and "Traceback" not in r.output
    assert not (tmp_path / "nodir").exists()
    (tmp_path / "results").mkdir()
    out = tmp_path / "results" / "bert-gpt"
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(out), "--workers", "1", "--samples", "0"])
    assert r.exit_code == 0, r.output
    assert len(rows_of(out)) == 12
    (tmp_path / "afile").write_text("x")
    r = runner.invoke(app, ["sweep", str(spec), "--out", str(tmp_path / "afile" / "x"), "--workers", "1"])
    assert r.exit_code == 2 and "afile is not a folder" in r.output


@pytest.mark.parametrize("where", ["parent", "folder"])
def test_a_results_folder_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, monkeypatch, where):
    """A read-only parent (`--out rodir/res`) or a read-only results folder (`--out rodir`, its .lock) was
    a PermissionError traceback, exit 1; it is one line naming the folder, exit 2, and nothing written.
    The refusals are the system's own (mkdir and open raising EACCES), as a non-root user gets them."""
    import errno
    from pathlib import Path

    spec = write(tmp_path)
    rodir = tmp_path / "rodir"
    rodir.mkdir()
    out = rodir / "res" if where == "parent" else rodir
    real_mkdir, real_open = Path.mkdir, Path.open

    def denied(path):
        return PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    def mkdir(self, *args, **kwargs):
        if self.parent == rodir:
            raise denied(self)
        return real_mkdir(self, *args, **kwargs)

    def open_(self, mode="r", *args, **kwargs):
        if self.parent == rodir and any(m in mode for m in "wax+"):
            raise denied(self)
        return real_open(self, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(Path, "open", open_)
    r = CliRunner().invoke(app, ["sweep", str(spec), "--out", str(out), "--workers", "1", "--samples", "0"])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == (
        f"error: {out}: cannot create the results folder (Permission denied); nothing written"
        if where == "parent"
        else f"error: {out}: cannot write in this folder (Permission denied: .lock); nothing written"
    )
    assert list(rodir.iterdir()) == []


def test_true_on_a_number_axis_keeps_the_whole_reason(tmp_path):
    """The line lists the axis's bad values itself and drops ", not VALUE" from the reason, but not a
    word that only starts like the value ("not true/false" stays whole)."""
    from clustersim.sweeps.spec import _without_value

    assert _without_value("expected a number, not true/false", True) == "expected a number, not true/false"
    assert _without_value("must be one of a, b, not 'maybe'", "maybe") == "must be one of a, b"


RECOMPUTE = "training.parallelism.recompute_num_layers"


@pytest.mark.parametrize(
    ("vary", "why"),
    [
        ({RECOMPUTE: [100], "training.parallelism.recompute": ["full"]}, "100 exceeds the 24 blocks"),
        ({RECOMPUTE: [4]}, "applies to recompute: full (whole blocks), not none"),  # the base's recompute
        ({"gpus": [6]}, "6 GPUs is not a whole number of 4-GPU nodes"),
    ],
)
def test_a_value_no_row_of_the_grid_can_take_is_a_file_error(tmp_path, runner, vary, why):
    """recompute_num_layers beyond every row's pipeline stage (or without recompute: full) was recorded
    as an invalid row in a folder of nothing but invalid rows; a grid with no valid row is refused before
    any work, naming the file and the key, as a value invalid on its own is."""
    path = write(tmp_path, {"base": "preset:default", "samples": 0, "vary": vary})
    key = RECOMPUTE if RECOMPUTE in vary else "gpus"
    r = runner.invoke(app, ["sweep", str(path), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"{path}: {key}: " in r.output and why in r.output and "every row of the sweep" in r.output
    assert not (tmp_path / "out").exists()


def test_recompute_layers_beyond_some_rows_stages_are_invalid_rows_said_once(tmp_path, runner):
    """Where only some combinations cannot take the value (4 recomputed blocks fit 2 stages of 12 blocks,
    not 8 stages of 3), those rows are invalid with their reason and key, said before the run and
    counted, not said again, after it (the reason before lacked the key the recorded one had)."""
    vary = {"gpus": [8], "training.parallelism.pipeline": [2, 8], "training.parallelism.recompute": ["full"]}
    path = write(tmp_path, {"base": "preset:default", "samples": 0, "vary": {**vary, RECOMPUTE: [4]}})
    r = runner.invoke(app, ["sweep", str(path), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output
    assert f"1 x {RECOMPUTE}: 4 exceeds the 3 blocks of one model chunk" in r.output
    assert "1 row(s) could not be simulated, 1 of them the invalid rows above" in r.output
    rows = rows_of(tmp_path / "out")
    assert sorted(row["status"] for row in rows.values()) == ["invalid", "ok"]
    (bad,) = [row for row in rows.values() if row["status"] == "invalid"]
    assert f"{RECOMPUTE}: 4 exceeds the 3 blocks" in bad["error"]
    assert bad["training.parallelism.pipeline"] == "8"
