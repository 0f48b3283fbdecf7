"""Where a measurement came from: software versions, hardware, date and command."""

from __future__ import annotations

import datetime
import platform
import socket


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(
    torch, device: str, command: str, backend: str | None = None, ranks: int | None = None
) -> dict:
    from clustersim.calibration.torch_support import catalog_name_for

    info = {
        "source": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "cpu": cpu_model(),
        "host": socket.gethostname(),
        "device_count": ranks,
        # torch's intra-op threads: on a CPU they set how many cores run each GEMM (part of the rate)
        "threads": torch.get_num_threads(),
    }
    if device == "cuda":
        info["device_name"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
        info["driver"] = _driver_version()
        nccl = getattr(torch.cuda, "nccl", None)
        if nccl is not None:
            v = nccl.version()
            info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    else:
        info["device_name"] = f"CPU ({cpu_model()})"
    if backend == "gloo":
        info["gloo"] = f"bundled with torch {torch.__version__}"
    info["catalog_device"] = catalog_name_for(torch, device)
    return info


def _driver_version() -> str | None:
    try:
        import subprocess

        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


# The fields of a provenance that say which machine and software measured: what a profile's header keeps
# from ``calibrate model`` (a device's own measurements, no collectives); ``calibrate run`` adds its
# collective library and mode (PROFILE_FIELDS).
MACHINE_FIELDS = (
    "source",
    "date",
    "device_name",
    "device_count",
    "driver",
    "cuda",
    "torch",
    "cpu",
    "host",
    "threads",
)
PROFILE_FIELDS = (*MACHINE_FIELDS, "nccl", "gloo", "quick")

# The fields of a provenance (calibration/provenance.py) a profile's command record keeps (CommandRecord).
RECORD_FIELDS = ("source", "date", "device_name", "cpu", "host", "torch", "threads", "quick")


def command_record(info: dict, wrote: str) -> dict:
    """One command's record in a profile's ``provenance.commands``: where and how it measured, and what it
    wrote (``wrote``)."""
    return {**{k: info[k] for k in RECORD_FIELDS if info.get(k) is not None}, "wrote": wrote}


# What a profile keeps of the emulated testbed a sweep ran on (profile.TestbedRecord): the testbed's own
# record in the raw file's provenance (testbed/sweep.py), else the network the sweep's topology names.
TESTBED_FIELDS = (
    "emulated",
    "hosts",
    "kind",
    "line_rate_gbps",
    "shaper",
    "cpus_per_host",
    "host_cpu_shares",
    "cfs_bandwidth_slice_us",
    "machine_cpus",
    "machine",
    "kernel",
)
SHARE_FIELDS = ("cpu_quota_us", "cpu_period_us", "cpus")


def testbed_record(raw: dict) -> dict | None:
    """The profile's ``provenance.testbed`` from a raw file (or a profile's kept ``raw``): None unless the
    sweep says it ran on the emulated testbed (its network is ``emulated``). The raw file writes a host's
    CPU share as None where the hosts had none; the profile writes 0 there, keeping None for a sweep
    that did not record it (one taken before the testbed recorded CPU shares)."""
    prov = raw.get("provenance") if isinstance(raw.get("provenance"), dict) else {}
    topology = raw.get("topology") if isinstance(raw.get("topology"), dict) else {}
    found = [d for d in (topology.get("network"), prov.get("testbed")) if isinstance(d, dict)]
    merged = {k: v for d in found for k, v in d.items()}  # the testbed's own record wins
    if not merged.get("emulated"):
        return None
    record = {k: merged[k] for k in TESTBED_FIELDS if merged.get(k) is not None}
    if "cpus_per_host" in merged and merged["cpus_per_host"] is None:
        record["cpus_per_host"] = 0.0
    if isinstance(record.get("host_cpu_shares"), list):
        record["host_cpu_shares"] = [
            {k: s[k] for k in SHARE_FIELDS if k in s} if isinstance(s, dict) else s
            for s in record["host_cpu_shares"]
        ]
    return record


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _shared(r: object) -> bool:
    """A collective record across two or more ranks whose op, group and size can be read."""
    if not isinstance(r, dict) or not isinstance(r.get("op"), str) or not _positive(r.get("bytes")):
        return False
    return _whole(r.get("nodes")) and _whole(r.get("gpus_per_node")) and r["nodes"] * r["gpus_per_node"] > 1


def collective_sweep(records: object) -> dict | None:
    """The profile's ``provenance.collective_sweep`` from a raw file's collective records: the ops, group
    shapes, message sizes and fewest timed repetitions of those across two or more ranks (the ones the
    fits use); None where there are none. Records it cannot read are passed over (a profile's kept raw
    medians are not checked as a raw file is)."""
    shared = [r for r in records if _shared(r)] if isinstance(records, list) else []
    if not shared:
        return None
    sizes = {float(r["bytes"]) for r in shared}
    repeats = [r["repeats"] for r in shared if _whole(r.get("repeats"))]
    return {
        "ops": sorted({r["op"] for r in shared}),
        "groups": sorted({(r["nodes"], r["gpus_per_node"]) for r in shared}),
        "sizes": len(sizes),
        "min_bytes": min(sizes),
        "max_bytes": max(sizes),
        "repeats": min(repeats) if repeats else None,
    }
