"""DeepSpeed's ``compressed_allreduce`` (runtime/comm/nccl.py), pass by pass.

Used by 1-bit Adam (on the momentum) and 0/1 Adam (on gradients or accumulated updates). n is the
padded element count of one parameter group (padded to a multiple of p*lcm(p, 8) so every rank's
chunk packs into whole bytes). The GPU work is a sequence of elementwise passes; each pass below
lists the bytes it reads and writes per element of n (``per_n``) or of the server chunk n/p
(``per_chunk``), mirroring the torch/cupy expressions of the DeepSpeed code:

  worker side   buffer_m.add_(worker_error); norm; sign().add_(1).bool().float().add_(-.5).mul_(2);
                worker_error.set_(buffer_m - scale*sign); sign_().add_(1).bool(); cupy.packbits
  phase 1       all_to_all_single(packed signs, n/8 bytes in all) + all_gather(p scales)
  server side   cupy.unpackbits -> (p, n/p) uint8 -> float().add_(-.5).mul_(2).mul_(scales/p).sum(0);
                add_(server_error); norm; sign/error update; packbits of one chunk
  phase 2       all_gather(packed server chunk, n/8 bytes in all) + all_gather(p scales)
  finish        unpackbits -> float().add_(-.5).mul_(2).mul_(scale) -> copy back into the buffer

Kernel time comes from the calibration profile's measured bandwidth for the kernel name when
present, else the roofline at the GPU's HBM bandwidth. The MPI backend variants send the same bytes
(phase 1 as p rounds of Isend/Irecv); without CUDA-aware MPI every phase also stages the packed
buffers device->host->device over PCIe with pageable copies and a host synchronisation.
"""

from __future__ import annotations

from clustersim.catalog import hardware_defaults
from clustersim.cost_models.kernel_bytes import (  # noqa: F401
    FINISH_PASSES,
    PADDING_PASS,
    SERVER_PASSES,
    WORKER_PASSES,
    padded_elements,
)
from clustersim.simulator.context import SimulationContext
from clustersim.simulator.program import Program
from clustersim.simulator.strategies.common import add_collective

HOST_SYNC_S = hardware_defaults()["host_sync_s"]  # per host-staged phase: catalogs/hardware_defaults.yaml


def compressed_allreduce_bytes(n: int, p: int, g: int) -> dict[str, float]:
    """Closed-form bytes per call (padded n): what each rank sends, what each node's NIC sends."""
    n = padded_elements(n, p)
    nodes = p // g
    phase1_rank = (p - 1) / p * n / 8
    phase2_rank = (p - 1) / p * n / 8
    phase1_nic = g * (p - g) * n / (8 * p) if nodes > 1 else 0.0
    phase2_nic = (p - 1) / p * n / 8 if nodes > 1 else 0.0
    return {
        "per_rank": phase1_rank + phase2_rank,
        "per_node_nic": phase1_nic + phase2_nic,
        "phase1_nic": phase1_nic,
        "phase2_nic": phase2_nic,
    }


def _kernels(
    prog: Program, ctx: SimulationContext, passes, n: int, p: int, dep, label: str, count: int
) -> int:
    for name, per_n, per_chunk in passes:
        nbytes = per_n * n + per_chunk * n / p
        dep = prog.add(
            f"{label} {name}",
            "compute",
            ctx.device.stream_time(nbytes, name) * count,
            "compression",
            (dep,),
            meta={"bytes": nbytes * count},
        )
    return dep


def _staging(
    prog: Program, ctx: SimulationContext, nbytes: float, dep, label: str, count: int, to_host: bool
) -> int:
    """Device->host (before) or host->device (after) copy of packed data, pageable (the host's bounce
    buffer, simulator/host.py pageable_copy), plus a host sync."""
    copy_s, _ = ctx.host.pageable_copy(nbytes, to_host=to_host)
    secs = (copy_s + HOST_SYNC_S) * count
    return prog.add(label, "copy", secs, "transfer", (dep,), meta={"bytes": nbytes * count})


def add_compressed_allreduce(
    prog: Program,
    ctx: SimulationContext,
    n_elements: int,
    dep,
    backend: str,
    label: str = "compressed_allreduce",
    count: int = 1,
) -> int:
    """Append one compressed_allreduce of ``n_elements`` after ``dep``; returns the last op id.

    ``count``: that many identical ones (parameter groups of one size) back to back, as one chain whose
    every op lasts ``count`` times as long. Exact: each op of the chain waits for the one before, and
    the chain starts after everything on its streams (the backward), so the k-th copy of an op starts
    when the (k-1)-th copy of the last op ended; the chain of k copies ends k chains after it began,
    as do the ops scaled by k (tests/test_optimizers.py compares both)."""
    p = ctx.world_size
    n = padded_elements(n_elements, p)
    if n != n_elements:
        dep = _kernels(prog, ctx, (PADDING_PASS,), n, p, dep, label, count)
    dep = _kernels(prog, ctx, WORKER_PASSES, n, p, dep, label, count)
    staged = backend == "mpi_host_staged"
    packed = n / 8
    coll = {"count": count, "backend_count": True}
    if staged:
        dep = _staging(prog, ctx, packed, dep, f"{label} phase1 D2H", count, to_host=True)
    # Phase 1: each rank sends n/(8p) bytes to every rank: all_to_all with S = n/8 per rank.
    dep = add_collective(
        prog, ctx, f"{label} phase1 all_to_all", "all_to_all", packed, deps=(dep,), phase=1, **coll
    )
    dep = add_collective(
        prog, ctx, f"{label} phase1 scales", "all_gather", 4.0 * p, deps=(dep,), phase=1, **coll
    )
    if staged:
        dep = _staging(prog, ctx, packed, dep, f"{label} phase1 H2D", count, to_host=False)
    dep = prog.add(f"{label} host sync", "host", HOST_SYNC_S * count, "host", (dep,))
    dep = _kernels(prog, ctx, SERVER_PASSES, n, p, dep, label, count)
    if staged:
        dep = _staging(prog, ctx, packed / p, dep, f"{label} phase2 D2H", count, to_host=True)
    # Phase 2: all-gather of every rank's packed server chunk (n/(8p) bytes each, n/8 in all).
    dep = add_collective(
        prog, ctx, f"{label} phase2 all_gather", "all_gather", packed, deps=(dep,), phase=2, **coll
    )
    dep = add_collective(
        prog, ctx, f"{label} phase2 scales", "all_gather", 4.0 * p, deps=(dep,), phase=2, **coll
    )
    if staged:
        dep = _staging(prog, ctx, packed, dep, f"{label} phase2 H2D", count, to_host=False)
    dep = prog.add(f"{label} host sync 2", "host", HOST_SYNC_S * count, "host", (dep,))
    return _kernels(prog, ctx, FINISH_PASSES, n, p, dep, label, count)


def error_buffer_bytes(n_elements: int, p: int) -> dict[str, float]:
    """Worker error (n fp32) and server error (n/p fp32) kept in GPU memory."""
    n = padded_elements(n_elements, p)
    return {"onebit_worker_error": 4.0 * n, "onebit_server_error": 4.0 * n / p}


def error_buffers_for_groups(groups: list[tuple[int, int]], p: int) -> dict[str, float]:
    """Error-feedback buffers of all parameter groups, given as (elements, how many groups of that
    size) (none with a single rank)."""
    out: dict[str, float] = {}
    if p <= 1:
        return out
    for n, count in groups:
        for k, v in error_buffer_bytes(n, p).items():
            out[k] = out.get(k, 0.0) + v * count
    return out
