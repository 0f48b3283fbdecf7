"""`calibrate run --testbed`: options that cannot measure anything are refused before the testbed comes
up, and SIGTERM takes the testbed down as Ctrl-C does (namespaces, bridge and CPU groups removed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.inputs_support import invoke, refused
from tests.test_testbed import namespaces


@pytest.mark.parametrize(
    "args, words",
    [
        (["--min-bytes", "32MiB", "--max-bytes", "1MiB"], ["--min-bytes", "no message size to measure"]),
        (["--ops", "all_reduce,foo"], ["--ops", "unknown collective 'foo'"]),
        (["--max-bytes", "lots"], ["--max-bytes", "cannot read size"]),
    ],
)
def test_calibrate_run_on_a_testbed_refuses_before_bringing_it_up(tmp_path, monkeypatch, args, words):
    from clustersim.testbed import hosts

    monkeypatch.setattr(hosts, "up", lambda *a, **k: pytest.fail("the testbed came up before the check"))
    r = invoke("calibrate", "run", "--testbed", "2", "--out", tmp_path / "p.json", *args)
    refused(r, *words)
    assert not list(tmp_path.iterdir())


def test_sigterm_runs_the_cleanup_and_exits_143():
    from clustersim.testbed.hosts import down_on_sigterm

    steps = []

    @down_on_sigterm
    def measure():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            steps.append("measured")
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # a second one during the cleanup is ignored
            steps.append("cleaned up")

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as info:
        measure()
    assert info.value.code == 143 and steps == ["cleaned up"]
    assert signal.getsignal(signal.SIGTERM) is before


@namespaces
def test_sigterm_during_calibrate_run_takes_the_testbed_down(tmp_path):
    env = {
        **os.environ,
        "CLUSTERSIM_TESTBED_PREFIX": "cstterm",
        "CLUSTERSIM_TESTBED_STATE": str(tmp_path / "state.json"),
    }
    args = ["calibrate", "run", "--testbed", "2", "--max-bytes", "4MiB", "--out", str(tmp_path / "p.json")]
    code = "import sys; from clustersim.cli import main; sys.argv = ['clustersim', *sys.argv[1:]]; main()"
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(240):
            if (tmp_path / "state.json").exists() or proc.poll() is not None:
                break
            time.sleep(0.25)
        assert (tmp_path / "state.json").exists(), "the testbed never came up"
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "Traceback" not in err, err
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "cstterm-h" not in left and not (tmp_path / "state.json").exists()


def test_ops_are_read_one_way_by_the_check_and_the_sweep():
    """`--ops "all_reduce, broadcast"` passed the early check (stripped) and then failed in the sweep's
    workers (not stripped), after the testbed was up; both now read it with parse_ops."""
    from clustersim.calibration.collectives import parse_ops

    assert parse_ops("all_reduce, broadcast") == ["all_reduce", "broadcast"]
    assert parse_ops("all_reduce,,broadcast,") == ["all_reduce", "broadcast"]
    assert parse_ops(" , ") == []
