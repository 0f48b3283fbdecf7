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
