"""Bring the emulated hosts up and down: namespaces ``cst-h0..``, veth pairs to bridge ``cstbr0``.

Every object created carries the ``cst`` prefix and is written to a state file, so ``down`` removes
exactly what ``up`` made and nothing else; an ``up`` that fails or is interrupted half-way removes
what it had created. Addresses come from 10.77.0.0/24 and exist only inside the namespaces and on the
bridge, which has no address of its own: nothing leaves the machine.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from clustersim.errors import InputError
from clustersim.testbed import cpu_share
from clustersim.testbed.shaping import format_rate, tbf_args

STATE_FILE = Path(os.environ.get("CLUSTERSIM_TESTBED_STATE", "/run/clustersim-testbed.json"))
# Every name starts with this prefix (``down`` touches nothing else). Another prefix gives a second,
# independent testbed on the same machine (the tests use one, so they never meet a testbed left up).
_ASKED = os.environ.get("CLUSTERSIM_TESTBED_PREFIX", "cst")
PREFIX = _ASKED if _ASKED.startswith("cst") else "cst" + _ASKED


def down_on_sigterm(fn):
    """``fn`` (which brings the testbed up and takes it down in a ``finally``) with SIGTERM handled as
    Ctrl-C is: it raises SystemExit(143) where the process is, so the ``finally`` kills the hosts' jobs and
    removes the namespaces, bridge and CPU groups (by default SIGTERM ends the process at once and leaves
    them up). A second SIGTERM during the cleanup is ignored, so the cleanup finishes; the previous
    handler is back when ``fn`` returns. Signal handlers belong to the main thread: elsewhere ``fn`` runs
    as it is."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)
        previous = signal.signal(signal.SIGTERM, _terminated)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, previous)

    return wrapper


def _terminated(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the cleanup this starts must not be cut short
    raise SystemExit(128 + signum)


def bridge_name() -> str:
    return f"{PREFIX}br0"


SUBNET = "10.77.0"
HOST_IFACE = "cst0"  # the interface's name inside each host namespace
MAX_HOSTS = 64


@dataclass
class Testbed:
    hosts: int
    rate_bits: float
    shaper: str  # "tbf"
    created: list[str]  # namespaces, links and cgroups, in creation order
    # each host's CPU share (cpu_share.py): cores per host, None where the hosts share the machine's cores
    cpus_per_host: float | None = None
    cpu_shares: list[dict] = field(default_factory=list)  # per host: quota_us, period_us, cpus, groups

    def host(self, i: int) -> str:
        return f"{PREFIX}-h{i}"

    def address(self, i: int) -> str:
        return f"{SUBNET}.{i + 1}"

    def describe(self) -> dict:
        return {
            "hosts": self.hosts,
            "rate": format_rate(self.rate_bits),
            "rate_gbps": self.rate_bits / 1e9,
            "shaper": self.shaper,
            "bridge": bridge_name(),
            "cpus_per_host": self.cpus_per_host,
            "machine_cpus": len(cpu_share.machine_cpus()),
            "cfs_bandwidth_slice_us": cpu_share.bandwidth_slice_us() if self.cpu_shares else None,
            "members": [
                {"host": self.host(i), "address": self.address(i), "interface": HOST_IFACE} | self._share(i)
                for i in range(self.hosts)
            ],
        }

    def _share(self, i: int) -> dict:
        if not self.cpu_shares:
            return {}
        s = self.cpu_shares[i]
        return {"cpu_quota_us": s["quota_us"], "cpu_period_us": s["period_us"], "cpus": s["cpus"]}

    def groups(self, i: int) -> list[str]:
        """Host i's cgroup directories (none without a CPU share)."""
        return self.cpu_shares[i]["groups"] if self.cpu_shares else []


def require_tools() -> None:
    """Root, ``ip`` and ``tc``: the one place that says what is missing."""
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        raise InputError(
            f"the testbed needs {' and '.join(missing)} (Debian: apt-get install iproute2)", key="testbed"
        )
    if os.geteuid() != 0:
        raise InputError(
            "the testbed needs root (network namespaces and tc); run as root or under sudo", key="testbed"
        )


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise InputError(f"`{' '.join(args)}` failed: {proc.stderr.strip()[:200]}", key="testbed")
    return proc


def netem_available() -> bool:
    """Whether this kernel has sch_netem: try it on a dummy link of our own, then remove the link."""
    probe = "cstprobe0"
    _run("ip", "link", "add", probe, "type", "dummy", check=False)
    try:
        return (
            _run("tc", "qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms", check=False).returncode
            == 0
        )
    finally:
        _run("ip", "link", "del", probe, check=False)


def load_state() -> Testbed | None:
    try:
        return Testbed(**json.loads(STATE_FILE.read_text()))
    except (FileNotFoundError, ValueError, TypeError):  # ValueError: not JSON, or not UTF-8 at all
        return None


def _same_share(current: Testbed, cpus_per_host: float | None) -> bool:
    """None keeps whatever share the running testbed has; 0 asks for none."""
    if cpus_per_host is None:
        return True
    if cpus_per_host == 0:
        return current.cpus_per_host is None
    return current.cpus_per_host is not None and abs(current.cpus_per_host - cpus_per_host) < 1e-9


def _save(tb: Testbed) -> None:
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(tb)))
    os.replace(tmp, STATE_FILE)


def up(
    hosts: int, rate_bits: float, delay_ms: float | None = None, cpus_per_host: float | None = None
) -> tuple[Testbed, bool]:
    """Create the testbed (or keep the one that is up with the same parameters). Returns it and
    whether it was created now. ``cpus_per_host``: each host's CPU share in cores (cpu_share.py);
    None keeps a running testbed's and gives a new one the machine's cores divided among the hosts;
    0 gives none (the hosts share the machine's cores)."""
    require_tools()
    if not 2 <= hosts <= MAX_HOSTS:
        raise InputError(f"--hosts must be 2..{MAX_HOSTS}, got {hosts}", key="--hosts")
    if cpus_per_host is not None and (cpus_per_host < 0 or cpus_per_host != cpus_per_host):
        raise InputError(f"--cpus-per-host must be 0 or more, got {cpus_per_host:g}", key="--cpus-per-host")
    if delay_ms is not None and not netem_available():
        raise InputError(
            "--delay needs tc netem, which this kernel lacks (module sch_netem); the testbed "
            "shapes rate with tbf only",
            key="--delay",
        )
    current = load_state()
    if current is not None:
        same = current.hosts == hosts and abs(current.rate_bits - rate_bits) < 1 and delay_ms is None
        if same and _same_share(current, cpus_per_host):
            return current, False
        down()
    share = cpu_share.default_share(hosts) if cpus_per_host is None else cpus_per_host or None
    tb = Testbed(hosts, rate_bits, "tbf", [], share)
    try:
        if share is not None:  # first: where cgroups are not writable, refuse before any network exists
            names = [tb.host(i) for i in range(hosts)]
            tb.cpu_shares = cpu_share.create(names, share, tb.created, lambda: _save(tb))
            _save(tb)
        _run("ip", "link", "add", bridge_name(), "type", "bridge")
        tb.created.append(f"link:{bridge_name()}")
        _save(tb)
        _run("ip", "link", "set", bridge_name(), "up")
        for i in range(hosts):
            _add_host(tb, i, rate_bits, delay_ms)
            _save(tb)
    except BaseException:
        down(tb)
        raise
    return tb, True


def _add_host(tb: Testbed, i: int, rate_bits: float, delay_ms: float | None) -> None:
    ns, outer = tb.host(i), f"{PREFIX}-h{i}-br"
    _run("ip", "netns", "add", ns)
    tb.created.append(f"netns:{ns}")
    _run("ip", "link", "add", outer, "type", "veth", "peer", "name", HOST_IFACE, "netns", ns)
    tb.created.append(f"link:{outer}")
    _run("ip", "link", "set", outer, "master", bridge_name())
    _run("ip", "link", "set", outer, "up")
    ex = ("ip", "netns", "exec", ns)
    _run(*ex, "ip", "link", "set", "lo", "up")
    _run(*ex, "ip", "addr", "add", f"{tb.address(i)}/24", "dev", HOST_IFACE)
    _run(*ex, "ip", "link", "set", HOST_IFACE, "up")
    # Upload: the host's own interface; download: the bridge side of its cable.
    _run(*ex, "tc", "qdisc", "replace", "dev", HOST_IFACE, "root", *tbf_args(rate_bits))
    _run("tc", "qdisc", "replace", "dev", outer, "root", *tbf_args(rate_bits))
    if delay_ms is not None:  # netem as the child of tbf: rate first, then one-way delay
        for cmd in ((*ex, "tc"), ("tc",)):
            dev = HOST_IFACE if len(cmd) > 1 else outer
            _run(*cmd, "qdisc", "replace", "dev", dev, "root", "handle", "1:", *tbf_args(rate_bits))
            _run(
                *cmd,
                "qdisc",
                "add",
                "dev",
                dev,
                "parent",
                "1:1",
                "handle",
                "10:",
                "netem",
                "delay",
                f"{delay_ms}ms",
            )


def down(tb: Testbed | None = None) -> list[str]:
    """Remove what the testbed created (from the state file), in reverse order. Returns what went."""
    tb = tb or load_state()
    removed = []
    if tb is not None:
        for item in reversed(tb.created):
            kind, _, name = item.partition(":")
            if kind == "sysctl":  # the CFS bandwidth slice the shares were cut to (cpu_share.py)
                if cpu_share.restore_slice(int(name)):
                    removed.append(item)
                continue
            if not Path(name).name.startswith("cst"):  # every prefix starts so
                continue  # never touch anything we did not name
            if kind == "cgroup":
                if cpu_share.remove(name):
                    removed.append(item)
                continue
            cmd = ("ip", "netns", "del", name) if kind == "netns" else ("ip", "link", "del", name)
            if _run(*cmd, check=False).returncode == 0:
                removed.append(item)
    STATE_FILE.unlink(missing_ok=True)
    return removed


def exec_in(host: str, command: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """Start ``command`` inside one host's namespace and, where the testbed gives hosts a CPU share,
    inside that host's cgroups (joined before exec: nothing it runs escapes its share)."""
    tb = load_state()
    if tb is None:
        raise InputError("no testbed is up (clustersim testbed up --hosts N --rate R)", key="testbed")
    names = [tb.host(i) for i in range(tb.hosts)]
    if host not in names:
        alias = {f"h{i}": n for i, n in enumerate(names)} | {str(i): n for i, n in enumerate(names)}
        if host not in alias:
            raise InputError(
                f"unknown host {host!r} (hosts: {', '.join(names)}, or h0..h{tb.hosts - 1})", key="HOST"
            )
        host = alias[host]
    full_env = {**os.environ, **(env or {})}
    groups = tb.groups(names.index(host))
    try:
        return subprocess.Popen(
            ["ip", "netns", "exec", host, *command],
            env=full_env,
            preexec_fn=(lambda: cpu_share.join(groups)) if groups else None,  # only os calls run in the child
            **kwargs,
        )
    except subprocess.SubprocessError as exc:  # the child could not join its groups (removed meanwhile?)
        raise InputError(
            f"cannot start a process in {host}'s CPU share ({', '.join(groups)}): {exc}; "
            "clustersim testbed down, then up again",
            key="testbed",
        ) from None
