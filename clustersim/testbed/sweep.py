"""Run the collective sweep (calibration/collectives.py) across the emulated hosts over gloo/TCP.

One process per host, each inside its namespace, joined by torch.distributed's env:// rendezvous on
host 0's address; gloo binds to the host's own interface. Each process is told its host name (the
namespaces share the machine's hostname) and the network it runs on, which the raw file records so
that the fit knows the modelled links (calibration/network_fit.py measured_cluster).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from clustersim.calibration.collectives import HOST_ENV, NETWORK_ENV
from clustersim.errors import InputError
from clustersim.testbed import hosts as tb_hosts
from clustersim.testbed.hosts import HOST_IFACE, Testbed

PORT = 29517


def _package_root() -> str:
    """So that the processes import this clustersim, also from a source checkout."""
    import clustersim

    return str(Path(clustersim.__file__).resolve().parent.parent)


def run(
    tb: Testbed,
    out_raw: Path,
    ops: str,
    min_bytes: int,
    max_bytes: int,
    repeat: int,
    warmup: int,
    subgroups: bool = True,
    progress=None,
    timeout_s: float = 3600,
    command: str | None = None,
) -> dict:
    """Run the sweep on every host of ``tb``; returns the raw measurement dict rank 0 wrote."""
    network = {
        "kind": "ethernet_tcp",
        "line_rate_gbps": tb.rate_bits / 1e9,
        "shaper": tb.shaper,
        "hosts": tb.hosts,
        "emulated": "network namespaces + veth + bridge on one machine",
        **host_cpus(tb),
    }
    args = [
        "--device",
        "cpu",
        "--raw",
        "--ops",
        ops,
        "--min-bytes",
        str(min_bytes),
        "--max-bytes",
        str(max_bytes),
        "--repeat",
        str(repeat),
        "--warmup",
        str(warmup),
    ] + (["--subgroups"] if subgroups else [])
    raw = run_on_hosts(
        tb,
        "clustersim.calibration.collectives",
        args,
        {NETWORK_ENV: json.dumps(network)},
        progress,
        timeout_s,
        "the sweep",
    )
    raw["provenance"]["testbed"] = network | {"kernel": os.uname().release, "machine": socket.gethostname()}
    raw["provenance"]["source"] = command or f"clustersim calibrate run --testbed {tb.hosts}"
    from clustersim.io import write_json_atomically

    write_json_atomically(out_raw, raw)
    return raw


def host_cpus(tb: Testbed) -> dict:
    """What each emulated host computes on, for every raw and reference file: its CPU share in cores
    (None: the hosts share the machine's cores), its quota and cores, and the machine's cores."""
    d = tb.describe()
    shares = [{k: m[k] for k in ("cpu_quota_us", "cpu_period_us", "cpus") if k in m} for m in d["members"]]
    return {
        "cpus_per_host": d["cpus_per_host"],
        "machine_cpus": d["machine_cpus"],
        "host_cpu_shares": shares if d["cpus_per_host"] else None,
        "cfs_bandwidth_slice_us": d["cfs_bandwidth_slice_us"],
    }


def run_on_hosts(
    tb: Testbed,
    module: str,
    args: list[str],
    extra_env: dict[str, str],
    progress,
    timeout_s: float,
    what: str,
    count: int | None = None,
) -> dict:
    """Run ``python -m module args --out FILE`` once per host, as ranks 0..N-1 of one torch.distributed job
    (env:// rendezvous on host 0, gloo bound to each host's interface); returns the JSON rank 0 wrote.

    A job that fails is run once more, on another rendezvous port (the first job's may still be held on
    host 0), before the failure is reported: on a shared 2-core machine a host's process has died once
    in a fresh-clone CI run where the same job passed in every other run (tens of them). A job that
    fails both times is reported with the second failure; the retry only costs time where a job cannot
    run at all."""
    n_hosts = count or tb.hosts  # the first ``count`` hosts only, for a smaller job on a larger testbed
    failure = None
    for port in (PORT, PORT + 1):
        envs = [_host_env(tb, i, n_hosts, port, extra_env) for i in range(n_hosts)]
        try:
            return _run_job(tb, [sys.executable, "-m", module, *args], envs, progress, timeout_s, what)
        except _JobFailed as exc:
            failure = exc
    raise InputError(f"{failure} (failed twice)", key="testbed")


class _JobFailed(Exception):
    """A host's process of a testbed job exited with an error (its message says which and why)."""


def _host_env(tb: Testbed, i: int, n_hosts: int, port: int, extra_env: dict[str, str]) -> dict[str, str]:
    """Host i's environment: its rank in the job, the rendezvous on host 0, gloo on its interface."""
    return {
        "RANK": str(i),
        "WORLD_SIZE": str(n_hosts),
        "MASTER_ADDR": tb.address(0),
        "MASTER_PORT": str(port),
        "GLOO_SOCKET_IFNAME": HOST_IFACE,
        HOST_ENV: f"h{i}",
        "OMP_NUM_THREADS": "1",
        **extra_env,
        "PYTHONPATH": _package_root() + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def _run_job(tb: Testbed, cmd: list[str], envs: list[dict], progress, timeout_s: float, what: str) -> dict:
    """``cmd --out FILE`` on host i with ``envs[i]``; the JSON rank 0 wrote, or _JobFailed naming the
    host whose process exited with an error."""
    procs = []
    with tempfile.TemporaryDirectory(prefix="cst-run-") as tmp:
        out = Path(tmp) / "out.json"
        # one log per host process, open for the processes' lifetime and closed in `finally` below
        logs = [open(Path(tmp) / f"h{i}.log", "w+") for i in range(len(envs))]  # noqa: SIM115
        try:
            for i, env in enumerate(envs):
                procs.append(
                    tb_hosts.exec_in(
                        tb.host(i),
                        [*cmd, "--out", str(out)],
                        env=env,
                        stdout=logs[i],
                        stderr=logs[i],
                        text=True,
                    )
                )
            _wait(procs, logs[0], progress, timeout_s)
            # The host whose process exited with an error, not one still waiting for it (_wait returns
            # a second after the first error; the others are stopped below).
            failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
            if failed:
                i = failed[0]
                logs[i].seek(0)
                lines = [ln.strip() for ln in logs[i].read().splitlines() if ln.strip()]
                # torch's c10d warnings ("[W1123 ...] ... hostname ... cannot be retrieved") come last
                # and say nothing of why the job failed: the error is in the last other lines
                tail = ([ln for ln in lines if not ln.startswith("[W")] or lines)[-3:]
                code = procs[i].returncode
                how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
                raise _JobFailed(f"{what} failed on host h{i} ({how}): " + " | ".join(tail)[-400:])
            return json.loads(out.read_text())
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for fh in logs:
                fh.close()


def _wait(procs, log0, progress, timeout_s: float) -> None:
    start, seen = time.monotonic(), 0
    while any(p.poll() is None for p in procs):
        if any(p.poll() not in (None, 0) for p in procs):
            time.sleep(1.0)  # let the others notice and exit, then stop them
            return
        if time.monotonic() - start > timeout_s:
            raise InputError(f"the sweep did not finish in {timeout_s:.0f} s", key="testbed")
        if progress:
            log0.seek(seen)
            chunk = log0.read()
            seen = log0.tell()
            # torch's own warnings ("[W1123 ... socket.cpp ...]") are not progress
            lines = [ln for ln in chunk.splitlines() if ln.strip() and not ln.startswith("[W")]
            if lines:
                progress(lines[-1])
        time.sleep(0.5)
