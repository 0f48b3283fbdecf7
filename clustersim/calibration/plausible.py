"""Rates no device of its kind runs at: a fitted number the simulator would price wrongly is refused.

Stalls that every size of a sweep shared (screen.py cannot see them) still leave a rate far from what
the device does: a CPU's Adam step read 0.1 GB/s where its copies ran at 200 GB/s and a clean run gave
23 GB/s. Two references bound a measured rate, each with a factor wide enough for any real difference:

* the catalog's entry for the device (gpus.yaml; a ``cpu`` profile is checked against the catalog's CPU
  host): a GEMM rate or copy rate below 1/CATALOG_FACTOR of its peak or streaming rate. The catalog's
  CPU is a 2-vCPU host, so a real CPU is rarely slower than it; a GPU's large GEMMs reach 40-80% of peak.
* the device's own copy rate (the catalog's where every copy stalled): a kernel below 1/KERNEL_FACTOR
  of it. The slowest
  modelled kernels (the 1-bit vote and requantize, bit operations over bytes the model counts small)
  ran at 1/250 of a copy on this project's CPU and 1/90 on the H200 (the shipped profiles). Kernels
  that only stream their bytes (STREAMING_KERNELS: Adam, momentum, error feedback) ran at 0.3-1.3x a
  copy on both, so they are held to 1/CATALOG_FACTOR of it.

What is refused is left out of the profile (the simulator keeps its defaults for it) with its reason.
"""

from __future__ import annotations

from clustersim import catalog
from clustersim.catalog import GpuSpec
from clustersim.errors import InputError

CATALOG_FACTOR = 30.0
KERNEL_FACTOR = 1000.0
# elementwise passes over fp32 buffers whose modelled bytes are the bytes they move (kernel_bytes.py)
STREAMING_KERNELS = frozenset(
    {"optimizer", "onebit_error_compensate", "onebit_momentum", "onebit_update", "binsgdm_update"}
)


def reference(device: str) -> GpuSpec | None:
    """The catalog entry a profile's device stands for: by name, else the one entry of its chip."""
    gpus = catalog.gpus()
    if device in gpus:
        return gpus[device]
    chip = catalog.chip_of(device)
    same = [g for g in gpus.values() if g.chip == chip]
    return same[0] if len(same) == 1 else None


def refuse_implausible(profile: dict, notes, copies_timed: bool) -> None:
    """Remove, in place, the rates of ``profile`` (a dict being built) no device of its kind runs at,
    noting each in ``notes.defaults``. ``copies_timed``: the raw file timed copies on the device (kept
    or dropped), so its kernels ran on it too."""
    ref = reference(profile["device"])
    if ref is not None:
        for prec, tflops in list((profile.get("matmul_tflops") or {}).items()):
            try:
                peak = ref.peak_flops(prec) / 1e12
            except InputError:  # a precision the catalog's device has no units for: nothing to check
                continue
            model = (profile.get("compute_model") or {}).get(prec)
            rate = max(tflops, model["r_max_tflops"]) if model else tflops
            if rate < peak / CATALOG_FACTOR:
                notes.leave(
                    f"GEMM {prec}",
                    f"{rate * 1e3:,.1f} GFLOP/s, under 1/{CATALOG_FACTOR:g} of "
                    f"{ref.name}'s {peak * 1e3:,.0f} (catalogs/gpus.yaml)",
                )
                drop_precision(profile, prec)
        memory = profile.get("memory_gbs")
        if memory is not None and memory < ref.hbm_gbs / CATALOG_FACTOR:
            notes.leave(
                "memory copy",
                f"{memory:,.2f} GB/s, under 1/{CATALOG_FACTOR:g} of {ref.name}'s "
                f"{ref.hbm_gbs:,.0f} GB/s (catalogs/gpus.yaml)",
            )
            del profile["memory_gbs"]
    # kernels against this device's copies; where every copy stalled, against the catalog's. Kernels
    # timed without copies (a testbed's hosts, each a fraction of a core) are no measurement of the
    # catalog's device and are not checked.
    copy, whose = profile.get("memory_gbs"), "the device's copy rate"
    if copy is None and copies_timed and ref is not None:
        copy, whose = ref.hbm_gbs, f"{ref.name}'s copy rate in catalogs/gpus.yaml"
    if copy is None:
        return
    for name, gbs in list((profile.get("kernels_gbs") or {}).items()):
        factor = CATALOG_FACTOR if name in STREAMING_KERNELS else KERNEL_FACTOR
        if gbs < copy / factor:
            notes.leave(
                f"kernel {name}", f"{gbs:,.3g} GB/s, under 1/{factor:g} of {whose} ({copy:,.1f} GB/s)"
            )
            del profile["kernels_gbs"][name]


def drop_precision(profile: dict, prec: str) -> None:
    """Leave one precision's GEMMs to the defaults: its rate, size table and shape model."""
    for key in ("matmul_tflops", "gemm_tflops_by_size", "compute_model"):
        if prec in (profile.get(key) or {}):
            del profile[key][prec]
