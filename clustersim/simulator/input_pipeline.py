"""The input pipeline over PCIe: a micro-batch's features gathered from host memory (workload.input).

Two ways, after Min et al. (VLDB 2021, "Large Graph Convolutional Network Training with GPU-Oriented
Data Communication Architecture", PyTorch-Direct), both on the rank's share of the host resources
(simulator/host.py) so that they compete with offload copies, CPU optimizer work and staged NIC traffic:

* ``host_gather``: CPU threads read the scattered rows (whole 64-byte cache lines) and write them into a
  dense pinned buffer, both through DRAM; then one H2D copy of the buffer (DRAM read, PCIe).
* ``zero_copy``: a GPU kernel reads the rows straight from host memory. GPU loads from host memory
  travel as 128-byte requests: a row costs its 128-byte lines, plus one more when it does not start on
  a 128-byte boundary (the paper's reason for aligning rows). No CPU pass, no second DRAM trip.

With ``prefetch`` (the DataLoader's default) the next micro-batch is loaded while this one computes:
the ops run beside the step, sharing links, and only bound it when they are the slower chain. Without
it a micro-step's forward waits for its input.
"""

from __future__ import annotations

import math

from clustersim.simulator.host import DRAM, GPU_DOWN, SWITCH_DOWN
from clustersim.simulator.program import Program

CPU_CACHE_LINE = 64  # x86 cache line: a CPU gather reads whole lines
GPU_HOST_REQUEST = 128  # bytes per GPU read request to host memory over PCIe (PyTorch-Direct, sec. 4)


def _rows(spec, samples: int) -> tuple[float, float]:
    """(rows, bytes per row) gathered for ``samples`` samples."""
    row = spec.row_bytes or spec.bytes_per_sample
    return samples * spec.bytes_per_sample / row, row


def pcie_bytes(spec, samples: int) -> float:
    """Bytes a zero-copy gather moves over PCIe: whole 128-byte requests per row (+1 when unaligned)."""
    rows, row = _rows(spec, samples)
    lines = math.ceil(row / GPU_HOST_REQUEST) + (0 if spec.aligned else 1)
    return rows * lines * GPU_HOST_REQUEST


def gather_dram_bytes(spec, samples: int) -> float:
    """DRAM traffic of a CPU gather: read the rows' cache lines, write the dense buffer."""
    rows, row = _rows(spec, samples)
    return rows * (math.ceil(row / CPU_CACHE_LINE) * CPU_CACHE_LINE + row)


def add_input(prog: Program, ctx, micro: int) -> int | None:
    """The input ops of micro-step ``micro``; the op id its forward must wait for (None: nothing to wait
    for, because there is no input pipeline or it was prefetched)."""
    spec = ctx.scenario.workload.input
    if spec is None:
        return None
    samples = ctx.scenario.workload.micro_batch
    host = ctx.host
    if spec.mode == "zero_copy":
        nbytes = pcie_bytes(spec, samples)
        bw = min(host.pcie, host.switch_share, host.dram_share)
        last = prog.add(
            "zero-copy gather (GPU reads host memory)",
            "copy" if spec.prefetch else "compute",
            nbytes / bw,
            "transfer",
            meta={"micro": micro, "pcie_bytes": nbytes},
            demands={GPU_DOWN: bw, SWITCH_DOWN: bw, DRAM: bw},
        )
    else:
        dram = gather_dram_bytes(spec, samples)
        gather = prog.add(
            "CPU gather into pinned buffer",
            "host",
            dram / host.dram_share,
            "host",
            meta={"micro": micro, "dram_bytes": dram},
            demands={DRAM: host.dram_share},
        )
        secs, demands = host.copy(samples * spec.bytes_per_sample, to_host=False)
        last = prog.add(
            "H2D batch", "h2d", secs, "transfer", (gather,), demands=demands, meta={"micro": micro}
        )
    return None if spec.prefetch else last


def input_gpu_bytes(ctx) -> float:
    """GPU memory for input batches: one micro-batch, two with prefetch (the next one arriving)."""
    spec = ctx.scenario.workload.input
    if spec is None:
        return 0.0
    return ctx.scenario.workload.micro_batch * spec.bytes_per_sample * (2 if spec.prefetch else 1)
