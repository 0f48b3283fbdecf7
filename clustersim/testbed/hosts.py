"""Bring the emulated hosts up and down: namespaces ``cst-h0..``, veth pairs to bridge ``cstbr0``.

Every object created carries the ``cst`` prefix and is written to a state file, so ``down`` removes
exactly what ``up`` made and nothing else; an ``up`` that fails or is interrupted half-way removes
what it had created. Addresses come from 10.77.0.0/24 and exist only inside the namespaces and on the
bridge, which has no address of its own: nothing leaves the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from clustersim.errors import InputError
from clustersim.testbed.shaping import format_rate, tbf_args

STATE_FILE = Path(os.environ.get("CLUSTERSIM_TESTBED_STATE", "/run/clustersim-testbed.json"))
# Every name starts with this prefix (``down`` touches nothing else). Another prefix gives a second,
# independent testbed on the same machine (the tests use one, so they never meet a testbed left up).
_ASKED = os.environ.get("CLUSTERSIM_TESTBED_PREFIX", "cst")
PREFIX = _ASKED if _ASKED.startswith("cst") else "cst" + _ASKED


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
    created: list[str]  # namespaces and links, in creation order

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
            "members": [
                {"host": self.host(i), "address": self.address(i), "interface": HOST_IFACE}
                for i in range(self.hosts)
            ],
        }


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
    except (FileNotFoundError, json.JSONDecodeError, TypeError):
        return None


def _save(tb: Testbed) -> None:
    STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(tb)))
    os.replace(tmp, STATE_FILE)


def up(hosts: int, rate_bits: float, delay_ms: float | None = None) -> tuple[Testbed, bool]:
    """Create the testbed (or keep the one that is up with the same parameters). Returns it and
    whether it was created now."""
    require_tools()
    if not 2 <= hosts <= MAX_HOSTS:
        raise InputError(f"--hosts must be 2..{MAX_HOSTS}, got {hosts}", key="--hosts")
    if delay_ms is not None and not netem_available():
        raise InputError(
            "--delay needs tc netem, which this kernel lacks (module sch_netem); the testbed "
            "shapes rate with tbf only",
            key="--delay",
        )
    current = load_state()
    if current is not None:
        if current.hosts == hosts and abs(current.rate_bits - rate_bits) < 1 and delay_ms is None:
            return current, False
        down()
    tb = Testbed(hosts, rate_bits, "tbf", [])
    try:
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
            if not name.startswith("cst"):  # every prefix starts so: never touch a name we did not make
                continue  # never touch anything we did not name
            cmd = ("ip", "netns", "del", name) if kind == "netns" else ("ip", "link", "del", name)
            if _run(*cmd, check=False).returncode == 0:
                removed.append(item)
    STATE_FILE.unlink(missing_ok=True)
    return removed


def exec_in(host: str, command: list[str], env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    """Start ``command`` inside one host's namespace."""
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
    return subprocess.Popen(["ip", "netns", "exec", host, *command], env=full_env, **kwargs)
