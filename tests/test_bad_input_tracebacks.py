"""Bad input that used to end in a traceback: a price catalog that is not UTF-8 or is a folder, a
calibration with no multi-rank collective given to `calibrate check`, a results.csv whose columns were
renamed, a corrupt testbed state file, Ctrl-C while a plan's or a sweep's workers start. Each is one
line on stderr and exit code 2 (Ctrl-C: no worker traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.inputs_support import SCENARIO, invoke, refused, write_yaml

CP1252 = "instances:\n  caf\xe9:\n    price_per_hour: 1\n".encode("cp1252")


@pytest.mark.parametrize("option", ["--network-prices", "--instances", "--own-prices"])
@pytest.mark.parametrize("content", [CP1252, bytes(range(256)) * 4], ids=["cp1252", "binary"])
def test_a_price_catalog_that_is_not_utf8_is_one_line(tmp_path, option, content):
    bad = tmp_path / "prices.yaml"
    bad.write_bytes(content)
    scenario = write_yaml(tmp_path / "s.yaml", SCENARIO)
    extra = ["--cost", "rent"] if option == "--instances" else []
    args = ["compare", scenario, "--samples", "0", "--gpus", "8", "--optimizers", "adam", *extra]
    r = invoke(*args, option, bad)
    refused(r, str(bad), "not UTF-8")


def test_a_price_catalog_that_is_a_folder_says_so(tmp_path):
    folder = tmp_path / "adir.yaml"
    folder.mkdir()
    args = ["plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d", "--samples", "0"]
    refused(invoke(*args, "--network-prices", folder), str(folder), "--network-prices", "is a folder")
    refused(invoke(*args, "--own-prices", folder), str(folder), "is a folder")


def test_calibrate_check_on_a_file_without_multi_rank_collectives_is_one_line(tmp_path):
    """A single-GPU calibration (an H200 session's raw file) measures collectives on one rank only."""
    from importlib import resources

    shipped = resources.files("clustersim.validation").joinpath("testbed", "gloo-8hosts-200mbit.json")
    raw = json.loads(shipped.read_text())
    one = {**raw["collectives"][0], "nodes": 1, "gpus_per_node": 1, "ranks": 1}
    raw["collectives"] = [one, {**one, "bytes": 2 * one["bytes"]}]
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(raw))
    # a cluster on the links the file records (one that contradicts them is refused before this)
    nic = {"kind": "ethernet_tcp", "count": 1, "line_rate_gbps": 0.2, "gpudirect_rdma": False}
    cluster = write_yaml(tmp_path / "c.yaml", {**SCENARIO, "cluster": {**SCENARIO["cluster"], "nic": nic}})
    for extra in ([], ["--cluster", cluster]):
        r = invoke("calibrate", "check", path, *extra)
        refused(r, str(path), "collectives", "2 or more ranks")


def test_report_on_a_results_csv_with_a_renamed_column_names_the_header(tmp_path_factory):
    from tests.conftest import swept_results

    spec = {"name": "cols", "base": SCENARIO, "vary": {"nic_gbps": [100, 200]}}
    out = swept_results(tmp_path_factory, "cols", spec)
    csv = out / "results.csv"
    lines = csv.read_text().splitlines(keepends=True)
    csv.write_text(lines[0].replace("iteration_time_s", "iteration_tme_s", 1) + "".join(lines[1:]))
    r = invoke("report", out, "--out", out.parent / "r.html", "--samples", "0")
    refused(r, str(csv), "line 1: not a clustersim results header", "iteration_time_s")
    assert not (out.parent / "r.html").exists()


def test_a_corrupt_testbed_state_file_reads_as_no_testbed(tmp_path, monkeypatch):
    from clustersim.testbed import hosts

    state = tmp_path / "state.json"
    monkeypatch.setattr(hosts, "STATE_FILE", state)
    for content in (b"\xff\xfe\x00binary", b"{not json", b"[1, 2]"):
        state.write_bytes(content)
        assert hosts.load_state() is None


def test_workers_started_while_sigint_is_held_inherit_the_block():
    """A worker spawned or forked while the parent holds SIGINT starts with it blocked (the terminal's
    Ctrl-C reaches the whole process group: it must not raise KeyboardInterrupt in a worker's imports);
    the pool's initializer then ignores it (sweeps) or ends quietly on it (plans)."""
    import signal

    from clustersim.sweeps.run import sigint_held

    probe = "import signal; print(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))"
    with sigint_held():
        held = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout
    after = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout
    assert held.strip() == "True" and after.strip() == "False"
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def _pool_worker_pid_and_handler():
    import os
    import signal

    blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    return os.getpid(), signal.getsignal(signal.SIGINT), blocked


def test_a_plan_worker_ends_quietly_on_ctrl_c(capfd):
    import os
    import signal
    import time

    from clustersim.planner.planning import _pool
    from clustersim.sweeps.run import _exit_quietly

    with _pool(2) as pool:
        pid, handler, blocked = pool.executor.submit(_pool_worker_pid_and_handler).result()
        assert handler is _exit_quietly and not blocked
        os.kill(pid, signal.SIGINT)
        for _ in range(100):
            if not any(p.pid == pid and p.is_alive() for p in pool.executor._processes.values()):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the worker outlived Ctrl-C")
        pool.executor = None  # the pool is broken now: nothing to shut down gracefully
    assert "Traceback" not in capfd.readouterr().err
