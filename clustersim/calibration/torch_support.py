"""torch is optional: only calibration needs it. Import it through here for a clear message."""

from __future__ import annotations

from clustersim.errors import InputError

INSTALL_HINT = (
    "torch is not installed; calibration needs it: pip install 'clustersim[calibrate]' "
    "(on a CPU-only machine: pip install torch==2.13.0 for the CPU wheel)"
)


def require_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        raise InputError(INSTALL_HINT, key="torch") from None
    return torch


def resolve_device(torch, device: str) -> str:
    if device not in ("cpu", "cuda"):
        raise InputError(f"unknown device {device!r} (cpu or cuda)", key="--device")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError(
            "cuda was asked for but torch sees no CUDA GPU "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); use --device cpu",
            key="--device",
        )
    return device


def catalog_name_for(torch, device: str) -> str:
    """Map the CUDA device name to a catalog GPU name ('cpu' on the CPU or when unknown)."""
    if device != "cuda":
        return "cpu"
    props = torch.cuda.get_device_properties(0)
    return catalog_name_from_string(torch.cuda.get_device_name(0), props.total_memory / 2**30)


def catalog_name_from_string(device_name: str, mem_gb: float | None = None) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100-SXM'; 'cpu' when no catalog GPU matches."""
    from clustersim.catalog import gpu_for_cuda_name

    name = device_name.upper()
    if mem_gb is None:
        mem_gb = 80.0 if "80GB" in name else 40.0 if "40GB" in name else 0.0
    return gpu_for_cuda_name(name, mem_gb) or "cpu"
