"""Which scenario key to blame when one iteration runs past the time limit.

An absurd value somewhere (a NIC of 1e-12 Gb/s, a degraded NIC at 1e-15 of its rate, a row of a
billionth of a byte) shows up as one op that takes forever. The error must name the key the user
actually set, not the first key on that op's path: a DiLoCo outer exchange over
``inter_worker_gbps``, a collective slowed by a degraded NIC or another job's traffic, an intra-node
all-reduce priced by a measured bus bandwidth, an input gather of tiny rows each name their own key.
"""

from __future__ import annotations

from clustersim.catalog import hardware_defaults
from clustersim.identifiers import Category, Stream
from clustersim.simulator.host import DRAM
from clustersim.simulator.input_pipeline import CPU_CACHE_LINE

HET = "cluster.heterogeneity"


def _communication(ctx, op, alone: float, limit: float) -> str:
    s = ctx.scenario
    c = s.cluster
    source = op.meta.get("source")
    if op.stream == Stream.OUTER and source in ("inter_worker_gbps", "inter_worker_latency_ms"):
        return f"training.optimizer_options.{source}"  # DiLoCo's links between workers
    h = c.heterogeneity
    if h is not None and alone < limit:  # slower together than alone: a degraded link or another job
        if h.degraded_nics:
            i = min(range(len(h.degraded_nics)), key=lambda i: h.degraded_nics[i].bandwidth_factor)
            return f"{HET}.degraded_nics.{i}.bandwidth_factor"
        if h.background:
            i = max(range(len(h.background)), key=lambda i: h.background[i].flows_per_link)
            return f"{HET}.background.{i}.flows_per_link"
    if op.inter_node_bytes > 0 or c.nodes > 1:
        gbps = c.nic.effective_gbps or c.nic.line_rate_gbps
        wire_s = op.inter_node_bytes / (gbps * 1e9 / 8 * max(1, c.nic.count))
        if c.nic.latency_us and c.nic.latency_us * 1e-6 > wire_s:
            return "cluster.nic.latency_us"
        if wire_s >= alone / 2:  # the NICs carry most of its time
            return "cluster.nic.effective_gbps" if c.nic.effective_gbps else "cluster.nic.line_rate_gbps"
    if c.intra_node.measured_allreduce_busbw_gbs is not None:
        return "cluster.intra_node.measured_allreduce_busbw_gbs"
    if ctx.profile is not None and ctx.profile.network is not None:
        return "network.parameters"  # the profile's fitted network model set the links' rates
    return "cluster.intra_node"


def _input(ctx) -> str:
    """An input-pipeline op: tiny rows (each padded to a cache line) or a slow host, whichever the
    user set further from its default; else the bytes per sample."""
    s = ctx.scenario
    inp = s.workload.input
    blow_up = {}
    if inp.row_bytes is not None:
        blow_up["workload.input.row_bytes"] = CPU_CACHE_LINE / inp.row_bytes
    if s.cluster.host.dram_gbs is not None:
        default = hardware_defaults()["host"]["dram_gbs"] * s.cluster.host.sockets
        blow_up["cluster.host.dram_gbs"] = default / s.cluster.host.dram_gbs
    if blow_up:
        return max(blow_up, key=blow_up.get)
    return "workload.input.bytes_per_sample"


def culprit_source(ctx, key: str) -> str | None:
    """The file that holds ``key``: the calibration profile for its sections (``network.*``,
    ``profile``), else None (the scenario, which the caller names)."""
    if ctx.profile is not None and key.split(".")[0] in ("network", "compute_model", "model_compute"):
        return ctx.profile.label
    return None


def culprit(ctx, op, alone: float, limit: float) -> str:
    """The scenario key that most likely makes ``op`` (alone ``alone`` seconds) absurdly slow."""
    c = ctx.scenario.cluster
    if op.category == Category.COMMUNICATION:
        return _communication(ctx, op, alone, limit)
    if ctx.scenario.workload.input is not None and ("dram_bytes" in op.meta or "pcie_bytes" in op.meta):
        return _input(ctx)
    if op.category == Category.HOST and "micro_steps" in op.meta:
        return "workload.gradient_accumulation"  # the host dispatching micro-step after micro-step
    if DRAM in op.demands or op.category == Category.HOST:
        return "cluster.host.dram_gbs"
    if op.category == Category.TRANSFER or op.demands:
        return "cluster.intra_node.pcie_gen"
    per_class = ctx.layout.pipeline if ctx.model_parallel else 1
    h = c.heterogeneity
    if h is not None and op.rank >= per_class:  # the slowest rank class's compute: its factor
        if h.slow_gpus:
            i = max(range(len(h.slow_gpus)), key=lambda i: h.slow_gpus[i].compute_factor)
            return f"{HET}.slow_gpus.{i}.compute_factor"
        return f"{HET}.jitter.sigma" if h.jitter is not None else f"{HET}.node_gpus"
    if ctx.profile is not None:
        return "profile"
    if not isinstance(c.gpu, str):  # the user's own GPU entry set the rates the compute ran at
        return "cluster.gpu"  # its peak_tflops and hbm_gbs
    return "workload.layers" if ctx.scenario.workload.layers is not None else "workload"
