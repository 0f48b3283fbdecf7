"""Emulated hosts with their own cores: each host's cgroup CPU quota and cpuset, applied to every
process started in it, recorded in the state file, removed by ``down``, refused in one line where
cgroups are not writable."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clustersim.cli import app
from clustersim.errors import InputError
from clustersim.testbed import cpu_share, hosts
from clustersim.testbed.shaping import parse_rate
from tests.test_testbed import namespaces


@pytest.mark.parametrize(
    "hosts_, share, cpus, expected",
    [
        # a quarter core each: four hosts to a core, dealt round so that the first two (a 2-host job)
        # run on different cores
        (8, 0.25, [0, 1], [[0], [1]] * 4),
        (4, 0.5, [0, 1], [[0], [1], [0], [1]]),
        (3, 0.5, [0, 1], [[0], [1], [0]]),
        (2, 1.0, [0, 1], [[0], [1]]),  # a core each
        (2, 0.75, [0, 1], [[0], [1]]),  # fits one to a core
        # two 0.6-core hosts do not fit on one core: laid end to end, the second spans the end of core 0
        (3, 0.6, [0, 1], [[0], [0, 1], [1]]),
        (2, 2.0, [0, 1, 2, 3], [[0, 1], [2, 3]]),
        (2, 1.0, [4, 7], [[4], [7]]),  # the cores this process may use, not 0..n-1
        (3, 1.0, [0, 1], [None] * 3),  # more than the machine has: the quota alone caps each host
    ],
)
def test_each_host_gets_the_cores_its_share_covers(hosts_, share, cpus, expected):
    assert [cpu_share.cores_of(i, share, hosts_, cpus) for i in range(hosts_)] == expected


def test_default_is_the_machines_cores_divided_among_the_hosts():
    assert cpu_share.default_share(4) == len(os.sched_getaffinity(0)) / 4


def test_not_writable_is_refused_in_one_line_before_any_network(runner, monkeypatch, tmp_path):
    """No cgroup hierarchy: `testbed up` says so (and how to go without) with exit 2, and nothing is
    created: the refusal comes before any namespace or link."""
    monkeypatch.setattr(hosts, "require_tools", lambda: None)
    monkeypatch.setattr(hosts, "STATE_FILE", tmp_path / "state.json")
    monkeypatch.setattr(cpu_share, "_mounts", lambda: {})
    ran = []
    monkeypatch.setattr(hosts, "_run", lambda *a, **k: ran.append(a))
    r = runner.invoke(app, ["testbed", "up", "--hosts", "2", "--rate", "100mbit", "--cpus-per-host", "1"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "cgroup v1 'cpu' controller" in r.output and "--cpus-per-host 0" in r.output
    assert len(r.output.strip().splitlines()) == 1
    assert ran == [] and not (tmp_path / "state.json").exists()
    assert cpu_share.unavailable() is not None


def test_the_period_is_the_shortest_whose_quota_is_one_bandwidth_slice():
    assert cpu_share.period_us(1.0, 5_000) == 5_000 and cpu_share.period_us(2.0, 5_000) == 2_500
    assert cpu_share.period_us(0.25, 5_000) == 20_000 and cpu_share.period_us(0.3, 5_000) == 16_667
    assert cpu_share.period_us(4.0, 2_000) == 1_000  # never below the kernel's 1 ms
    assert cpu_share.period_us(0.002, 5_000) == 1_000_000  # nor above its 1 s: the quota shrinks instead


def test_the_slice_is_read_from_the_kernel_or_defaults(monkeypatch, tmp_path):
    slice_file = tmp_path / "slice"
    slice_file.write_text("3000\n")
    monkeypatch.setattr(cpu_share, "SLICE_FILE", slice_file)
    assert cpu_share.bandwidth_slice_us() == 3_000
    monkeypatch.setattr(cpu_share, "SLICE_FILE", tmp_path / "missing")
    assert cpu_share.bandwidth_slice_us() == cpu_share.DEFAULT_SLICE_US


def test_shares_are_cut_to_one_ms_slices_and_down_puts_the_kernels_back(monkeypatch, tmp_path):
    """A testbed with shares sets the kernel's bandwidth slice to 1 ms (a quarter core: 1 ms per 4 ms,
    not 5 per 20), recorded as it goes so that down restores it; where /proc is read-only it keeps the
    kernel's slice and records nothing."""
    slice_file = tmp_path / "slice"
    slice_file.write_text("5000\n")
    monkeypatch.setattr(cpu_share, "SLICE_FILE", slice_file)
    created, saves = [], []
    assert cpu_share.use_fine_slice(created, lambda: saves.append(list(created))) == 1_000
    assert slice_file.read_text() == "1000" and created == ["sysctl:5000"] and saves == [["sysctl:5000"]]
    assert cpu_share.period_us(0.25) == 4_000 and cpu_share.period_us(1.0) == 1_000
    assert cpu_share.use_fine_slice([], lambda: None) == 1_000  # already fine: nothing to record
    assert cpu_share.restore_slice(5_000) and slice_file.read_text() == "5000"

    monkeypatch.setattr(cpu_share, "SLICE_FILE", tmp_path / "no-such-dir" / "slice")
    created = []
    assert cpu_share.use_fine_slice(created, lambda: None) == cpu_share.DEFAULT_SLICE_US and created == []


def test_only_shares_that_can_burst_get_the_fine_slice():
    assert cpu_share.bursts(0.25, 8, [0, 1]) and cpu_share.bursts(1.5, 2, [0, 1, 2, 3])
    assert cpu_share.bursts(1.0, 3, [0, 1])  # no cores of its own: the quota alone caps it
    assert not cpu_share.bursts(1.0, 2, [0, 1]) and not cpu_share.bursts(2.0, 2, [0, 1, 2, 3])


def test_a_share_too_small_for_the_kernel_is_refused(monkeypatch):
    with pytest.raises(InputError, match="smallest share"):
        cpu_share.create(["cst-x"], 0.0005, [], lambda: None)
    with pytest.raises(InputError, match="more than this machine's"):
        cpu_share.create(["cst-x"], 1e300, [], lambda: None)
    with pytest.raises(InputError, match="must be 0 or more"):
        monkeypatch.setattr(hosts, "require_tools", lambda: None)
        hosts.up(2, 1e8, cpus_per_host=-1)


cgroups = pytest.mark.skipif(
    os.geteuid() != 0 or cpu_share.unavailable() is not None,
    reason=f"needs root with writable cgroup v1 cpu and cpuset ({cpu_share.unavailable() or 'root'})",
)

CHECK = r"""
import time
from pathlib import Path
print(" ".join(l for l in Path("/proc/self/cgroup").read_text().split() if ":cpu:" in l or ":cpuset:" in l))
status = Path("/proc/self/status").read_text().splitlines()
print([l.split()[1] for l in status if l.startswith("Cpus_allowed_list")][0])
t = time.monotonic()
while time.monotonic() - t < 0.5:
    pass
"""


@pytest.fixture
def testbed(tmp_path, monkeypatch):
    monkeypatch.setattr(hosts, "PREFIX", "cstc")
    monkeypatch.setattr(hosts, "STATE_FILE", tmp_path / "state.json")
    yield
    hosts.down()


@namespaces
@cgroups
def test_each_host_runs_in_its_share_and_down_removes_it(testbed, tmp_path, runner):
    cpus = cpu_share.machine_cpus()
    share = len(cpus) / 4  # four hosts: half a core each on two cores
    slice_before = cpu_share.bandwidth_slice_us()
    tb, created = hosts.up(4, parse_rate("100mbit"), cpus_per_host=share)
    assert cpu_share.bandwidth_slice_us() == min(slice_before, cpu_share.FINE_SLICE_US)
    assert created and tb.cpus_per_host == share
    # kept while the share is the same or not asked for; another share rebuilds
    assert hosts.up(4, parse_rate("100mbit"))[1] is False
    assert hosts.up(4, parse_rate("100mbit"), cpus_per_host=share)[1] is False
    state = hosts.load_state()  # recorded in the state file
    assert state.cpus_per_host == share and len(state.cpu_shares) == 4
    groups = [Path(g) for s in state.cpu_shares for g in s["groups"]]
    assert all(g.is_dir() and g.name.startswith("cstc-h") for g in groups)

    script = tmp_path / "check.py"
    script.write_text(CHECK)
    for i in (0, 3):
        proc = hosts.exec_in(f"h{i}", [sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
        out, _ = proc.communicate(timeout=30)
        membership, allowed = out.strip().splitlines()
        own = cpu_share._own_group("cpu")
        assert f":cpu:/{own + '/' if own else ''}{tb.host(i)}" in membership, membership
        assert _cores(allowed) == cpu_share.cores_of(i, share, 4, cpus)
        quota_dir = Path(state.cpu_shares[i]["groups"][0])
        period = cpu_share.period_us(share)
        assert (quota_dir / "cpu.cfs_period_us").read_text().strip() == str(period)
        assert (quota_dir / "cpu.cfs_quota_us").read_text().strip() == str(round(share * period))
        # half a core, busy for half a second: the quota ran out in some periods
        stat = dict(line.split() for line in (quota_dir / "cpu.stat").read_text().splitlines())
        assert int(stat["nr_throttled"]) > 0, stat

    described = tb.describe()["members"]
    assert [m["cpus"] for m in described] == [cpu_share.cores_of(i, share, 4, cpus) for i in range(4)]
    removed = hosts.down()
    assert sum(r.startswith("cgroup:") for r in removed) == len(groups)
    assert not any(g.exists() for g in groups)
    assert cpu_share.bandwidth_slice_us() == slice_before  # the kernel's own slice is back

    # --cpus-per-host 0: no groups at all
    tb, _ = hosts.up(2, parse_rate("100mbit"), cpus_per_host=0)
    assert tb.cpus_per_host is None and tb.cpu_shares == [] and tb.groups(0) == []
    status = json.loads(runner.invoke(app, ["testbed", "status", "--json"]).stdout)
    assert status["cpus_per_host"] is None and "cpus" not in status["members"][0]


def _cores(allowed: str) -> list[int]:
    """/proc's Cpus_allowed_list ('0-1,3') as a list of cores."""
    out = []
    for part in allowed.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out
