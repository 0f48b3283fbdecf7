"""Each emulated host's own CPU share: a cgroup per host with a CFS quota and, where cores allow, a cpuset.

Without it the emulated hosts share the machine's cores, so a host computes faster while its neighbours
wait on the network and slower while they compute: no real cluster behaves so, and no model can follow
it. With a quota of X cores a host never runs faster than X, whatever the others do; with a cpuset it
also stays on its own cores (hosts of a fraction of a core share one core, each capped at its share).

cgroup v1 only (the ``cpu`` and ``cpuset`` hierarchies, found in /proc/self/mounts); the groups are
made below this process's own group in each hierarchy, named like the host's namespace (``cst-h0``),
and removed by ``down``. Where that is not writable the testbed is refused with one line.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

from clustersim.errors import InputError

# The kernel's limits on a CFS quota and period (Documentation/scheduler/sched-bwc.rst: "the minimum
# quota allowed for the quota or period is 1ms", "an upper bound on the period length of 1s").
MIN_US, MAX_PERIOD_US = 1_000, 1_000_000
# sched-bwc.rst: run-time moves from a group's global pool to each CPU "in a batch fashion", slices of
# sched_cfs_bandwidth_slice_us (default 5 ms). A quota below one slice is throttled far below its
# share: on this project's CI machine a one-core host with a 1 ms quota per 1 ms period ran a 1M-element
# quantize kernel in 25 ms, against 7-15 ms with a 5 ms quota per 5 ms or with no quota at all.
SLICE_FILE = Path("/proc/sys/kernel/sched_cfs_bandwidth_slice_us")
DEFAULT_SLICE_US = 5_000
# The slice a testbed with CPU shares runs under (set by create, the previous value put back by down):
# the kernel's smallest period, so a quarter-core host gets 1 ms per 4 ms instead of 5 ms per 20 ms. The
# same matmul loop on two quarter-core hosts at once (6.65 ms on a whole core, 3 ms waits between
# runs, as a host waiting on the network) took a median of 20 ms, P10 6 ms and P90 36 ms with 5 ms per
# 20 ms: whole-core bursts, then stalls. With 1 ms per 4 ms: 28.5 ms (4.3x the whole-core time, a
# quarter core's 4x and the throttling's cost), P90 30-36 ms. A host then runs at its share, not in
# bursts, down to a few ms: what a slower device does.
FINE_SLICE_US = MIN_US


def bandwidth_slice_us() -> int:
    """The kernel's CFS bandwidth slice (its default where /proc does not say)."""
    try:
        return max(MIN_US, int(SLICE_FILE.read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        return DEFAULT_SLICE_US


def use_fine_slice(created: list[str], save) -> int:
    """Set the kernel's CFS bandwidth slice to FINE_SLICE_US where it is larger and writable, recording
    the previous value in ``created`` (``sysctl:5000``, put back by restore_slice) and saving at once.
    Returns the slice the shares will be cut to (the current one where it cannot be written)."""
    current = bandwidth_slice_us()
    if current <= FINE_SLICE_US:
        return current
    try:
        SLICE_FILE.write_text(str(FINE_SLICE_US))
    except OSError:
        return current  # read-only /proc (a container): coarser periods, recorded with the shares
    created.append(f"sysctl:{current}")
    save()
    return FINE_SLICE_US


def bursts(share: float, hosts: int, cpus: list[int]) -> bool:
    """Whether a host of this share could run faster than its share between throttles, so that the
    period's length matters: a fraction of a core, or a share without cores of its own. A whole number
    of cores on a cpuset of exactly those cores never exceeds its share, and keeps the kernel's slice."""
    return share % 1 > 1e-9 or cores_of(0, share, hosts, cpus) is None


def restore_slice(previous: int) -> bool:
    """Put the slice back where a testbed set it (and nobody has changed it since)."""
    try:
        if bandwidth_slice_us() == FINE_SLICE_US:
            SLICE_FILE.write_text(str(previous))
        return True
    except OSError:
        return False


def period_us(share: float, slice_us: int | None = None) -> int:
    """The shortest CFS period whose quota is at least one bandwidth slice (1 ms while a testbed is up,
    where the slice can be set; the kernel's 5 ms by default): with 1 ms slices 1 ms for a core or
    more, 4 ms for a quarter core. The quota is refilled every period and does not carry
    over, so a host that waited on the network runs at full core speed until its quota is spent, then
    stalls for the rest of the period: with the kernel's default 100 ms period a quarter-core host runs
    25 ms bursts and stalls 75 ms, so a step's kernels between collectives run faster than the same
    kernels back to back (the calibration). A short period makes a host's speed hold at its share down
    to a few ms; a quota under one slice throttles the host well below its share (above). A share too
    small for a slice within the longest period (1 s) gets that period and a smaller quota."""
    quota = slice_us or bandwidth_slice_us()
    return min(MAX_PERIOD_US, max(MIN_US, math.ceil(quota / share - 1e-9)))


NO_LIMIT_HINT = "--cpus-per-host 0 lets the hosts share the machine's cores instead"


def machine_cpus() -> list[int]:
    """The cores this process may run on (a container's or taskset's limit included)."""
    return sorted(os.sched_getaffinity(0))


def default_share(hosts: int) -> float:
    """The machine's cores divided among the hosts."""
    return len(machine_cpus()) / hosts


def _mounts(mounts_file: str = "/proc/self/mounts") -> dict[str, Path]:
    """controller -> mount point of its cgroup v1 hierarchy."""
    found: dict[str, Path] = {}
    for line in Path(mounts_file).read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "cgroup":
            for opt in parts[3].split(","):
                found.setdefault(opt, Path(parts[1]))
    return found


def _own_group(controller: str) -> str:
    """This process's group in the hierarchy holding ``controller`` (/proc/self/cgroup)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.lstrip("/")
    return ""


def _parent(controller: str) -> Path:
    """The directory new host groups go into, or InputError saying why there is none."""
    mount = _mounts().get(controller)
    if mount is None:
        raise InputError(
            f"--cpus-per-host needs the cgroup v1 '{controller}' controller, which is not mounted; "
            + NO_LIMIT_HINT,
            key="--cpus-per-host",
        )
    parent = mount / _own_group(controller)
    if not os.access(parent, os.W_OK):
        raise InputError(
            f"--cpus-per-host needs write access to {parent} (cgroups not writable here); " + NO_LIMIT_HINT,
            key="--cpus-per-host",
        )
    return parent


def unavailable() -> str | None:
    """Why hosts cannot have a CPU share here, or None where they can."""
    try:
        _parent("cpu")
        _parent("cpuset")
    except InputError as exc:
        return str(exc)
    return None


def cores_of(i: int, share: float, hosts: int, cpus: list[int]) -> list[int] | None:
    """Host i's cores. Hosts of a fraction of a core that fit whole on the cores dealt round (the
    ceil(hosts / cores) hosts of the fullest core take at most one core) are dealt round: host i on
    core i mod cores, so the first k hosts, which a k-host job uses, run on k different cores where
    there are k, instead of contending for one while the others idle. Otherwise the cores overlapping
    [i·X, (i+1)·X) of the machine's cores laid end to end, so a host of several has its own; None where
    the shares add up to more than the machine has (then the quota alone caps each host)."""
    if share * hosts > len(cpus) + 1e-9:
        return None
    if share < 1 and math.ceil(hosts / len(cpus)) * share <= 1 + 1e-9:
        return [cpus[i % len(cpus)]]
    lo, hi = i * share, (i + 1) * share
    return [cpus[c] for c in range(int(math.floor(lo + 1e-9)), len(cpus)) if c < hi - 1e-9]


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise InputError(
            f"cannot write {value!r} to {path} ({exc.strerror}); " + NO_LIMIT_HINT, key="--cpus-per-host"
        ) from None


def create(names: list[str], share: float, created: list[str], save) -> list[dict]:
    """One group per host in the cpu hierarchy (quota) and, where cores allow, the cpuset hierarchy.
    Each directory is appended to ``created`` (as ``cgroup:PATH``) and ``save()`` called as soon as it
    exists, so an interrupted ``up`` leaves nothing behind. Returns per host its quota, period, cores
    and group directories."""
    if share <= 0 or not math.isfinite(share):
        raise InputError(f"--cpus-per-host must be positive, got {share:g}", key="--cpus-per-host")
    cores = len(machine_cpus())
    if share > cores:
        raise InputError(
            f"--cpus-per-host {share:g} is more than this machine's {cores} cores", key="--cpus-per-host"
        )
    if share * MAX_PERIOD_US < MIN_US:
        raise InputError(
            f"--cpus-per-host {share:g} is below the kernel's smallest share "
            f"({MIN_US / MAX_PERIOD_US:g} of a core: a 1 ms quota per 1 s period)",
            key="--cpus-per-host",
        )
    cpus = machine_cpus()
    fine = use_fine_slice(created, save) if bursts(share, len(names), cpus) else None
    period = period_us(share, fine)
    quota = max(MIN_US, round(share * period))
    cpu_parent = _parent("cpu")
    cpuset_parent = _parent("cpuset") if cores_of(0, share, len(names), cpus) is not None else None
    shares = []
    for i, name in enumerate(names):
        group = cpu_parent / name
        _mkdir(group, created, save)
        _write(group / "cpu.cfs_quota_us", "-1")  # no limit while the period changes (a quota > period fails)
        _write(group / "cpu.cfs_period_us", str(period))
        _write(group / "cpu.cfs_quota_us", str(quota))
        paths = [str(group)]
        cores = cores_of(i, share, len(names), cpus)
        if cpuset_parent is not None and cores is not None:
            cs = cpuset_parent / name
            _mkdir(cs, created, save)
            _write(cs / "cpuset.cpus", ",".join(map(str, cores)))
            _write(cs / "cpuset.mems", (cpuset_parent / "cpuset.mems").read_text().strip())
            paths.append(str(cs))
        shares.append({"host": name, "quota_us": quota, "period_us": period, "cpus": cores, "groups": paths})
    return shares


def _mkdir(path: Path, created: list[str], save) -> None:
    try:
        path.mkdir()
    except FileExistsError:
        pass  # left by a crashed run under this very name (names start with the testbed's prefix)
    except OSError as exc:
        raise InputError(
            f"cannot create {path} ({exc.strerror}); " + NO_LIMIT_HINT, key="--cpus-per-host"
        ) from None
    created.append(f"cgroup:{path}")
    save()


def join(groups: list[str]) -> None:
    """Move the calling process into ``groups`` (run in the child between fork and exec, so the command
    and everything it starts run inside its host's share from its first instruction)."""
    pid = str(os.getpid()).encode()
    for g in groups:
        fd = os.open(os.path.join(g, "cgroup.procs"), os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)


def remove(path: str) -> bool:
    """Remove one host group; its processes have exited (a group still busy is retried for 2 s, as the
    kernel releases a killed process's membership asynchronously)."""
    for _ in range(20):
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return False
        except OSError:
            time.sleep(0.1)
    return False
