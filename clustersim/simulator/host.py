"""The host side of one representative rank: PCIe links, the switch uplink, DRAM and CPU cores.

Every rank of a node is symmetric, so shared host resources are split evenly: a PCIe switch uplink
carrying k GPUs gives each 1/k of it, the node's DRAM bandwidth and cores are divided by the GPUs per
node. The links go into the program so that the engine shares them between concurrent transfers,
NCCL traffic and CPU optimizer work (flow-level, max-min fair).

CPU Adam's rate: the profile's measured parameters/s (highest thread count measured, scaled by
threads) when present, else the documented typical node rate (hardware_defaults.yaml host.
cpu_adam_params_per_s, Deep Optimizer States' measurement) scaled by threads / cores; either is capped
by the DRAM roofline: DRAM bandwidth per rank / bytes of DRAM traffic per parameter (~28 for Adam;
../shared/reference/algorithms.md sec. 5).

``scale`` is one draw of the host's uncertainty (simulator/uncertainty.py host_sigma): a factor on the
time of the work the host's CPUs and memory system do (CPU Adam, streaming passes, the driver's
pageable copies, page faults, DeepSpeed's memory reports), not on PCIe's pinned copies.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustersim.catalog import hardware_defaults
from clustersim.topologies.node import pcie_bandwidth

GPU_UP, GPU_DOWN = "gpu_pcie_d2h", "gpu_pcie_h2d"
SWITCH_UP, SWITCH_DOWN = "switch_uplink_d2h", "switch_uplink_h2d"
DRAM = "host_dram"


def staging_rates(copy_gbs: dict[str, float]) -> tuple[float, float]:
    """The bounce buffer's memcpy rate, bytes/s, D2H and H2D: from a profile's measured pinned and
    pageable copies of one direction (1 / (1 / pageable - 1 / pinned): what the staging adds to the
    DMA), else hardware_defaults.yaml pageable_staging_gbs."""
    defaults = hardware_defaults()["pageable_staging_gbs"]
    rates = []
    for direction in ("d2h", "h2d"):
        pinned, pageable = copy_gbs.get(f"{direction}_pinned"), copy_gbs.get(f"{direction}_pageable")
        if pinned and pageable and pageable < pinned:
            rates.append(1e9 / (1.0 / pageable - 1.0 / pinned))
        else:
            rates.append(defaults[direction] * 1e9)
    return rates[0], rates[1]


@dataclass(frozen=True)
class HostModel:
    pcie: float
    switch_share: float
    dram_share: float
    threads: int
    measured_params_per_s: float | None  # at ``threads``, from a profile
    rdma: bool
    scale: float = 1.0  # a draw's factor on host CPU/memory time (uncertainty.host_sigma)
    page_fault_s: float | None = None  # the scenario's cluster.host.page_fault_us, in seconds
    huge_pages: bool = False  # transparent huge pages "always": fresh mappings fault 2 MiB at a time
    fault_scale: float = 1.0  # a draw's factor on the page-fault cost, apart from ``scale``
    # the CPU memcpy between the driver's bounce buffer and pageable memory, bytes/s (pageable_copy)
    staging_d2h: float = 19.6e9
    staging_h2d: float = 35.0e9

    @classmethod
    def of(cls, ctx) -> "HostModel":
        c = ctx.scenario.cluster
        gen = ctx.gpu.pcie_generation(c.intra_node.pcie_gen)
        pcie = pcie_bandwidth(gen)
        per_switch = min(c.intra_node.gpus_per_pcie_switch, c.gpus_per_node)
        dram_node = (c.host.dram_gbs or hardware_defaults()["host"]["dram_gbs"] * c.host.sockets) * 1e9
        threads = ctx.scenario.training.offload.cpu_threads or max(1, c.host.cores // c.gpus_per_node)
        if ctx.profile is not None and ctx.profile.host.cpu_adam_params_per_s:
            t_max, rate = max(ctx.profile.host.cpu_adam_params_per_s.items())
            measured = rate * threads / t_max
        else:  # the documented typical rate of a whole node (hardware_defaults.yaml), per thread share
            measured = (
                hardware_defaults()["host"]["cpu_adam_params_per_s"]
                * min(threads, c.host.cores)
                / c.host.cores
            )
        rdma = c.nic.gpudirect_rdma if c.nic.gpudirect_rdma is not None else c.nic.kind == "infiniband"
        scale = getattr(ctx, "_host_rate_scale", 1.0)
        fault = None if c.host.page_fault_us is None else c.host.page_fault_us * 1e-6
        share = dram_node / c.gpus_per_node
        d2h, h2d = staging_rates(ctx.profile.host.copy_gbs if ctx.profile is not None else {})
        faults = getattr(ctx, "_fault_scale", 1.0)
        thp = c.host.transparent_hugepages or hardware_defaults()["host"]["transparent_hugepages"]
        return cls(
            pcie, pcie / per_switch, share, threads, measured, rdma, scale=scale, page_fault_s=fault,
            huge_pages=thp == "always", fault_scale=faults, staging_d2h=d2h, staging_h2d=h2d,
        )  # fmt: skip

    def links(self) -> dict[str, float]:
        return {
            GPU_UP: self.pcie,
            GPU_DOWN: self.pcie,
            SWITCH_UP: self.switch_share,
            SWITCH_DOWN: self.switch_share,
            DRAM: self.dram_share,
        }

    def copy(self, nbytes: float, to_host: bool) -> tuple[float, dict[str, float]]:
        """Standalone duration of a pinned copy and the bytes/s it pushes through each link."""
        path = (GPU_UP, SWITCH_UP) if to_host else (GPU_DOWN, SWITCH_DOWN)
        bw = min(self.pcie, self.switch_share, self.dram_share)
        t = nbytes / bw if nbytes > 0 else 0.0
        return t, ({path[0]: bw, path[1]: bw, DRAM: bw} if t > 0 else {})

    def pageable_copy(self, nbytes: float, to_host: bool) -> tuple[float, dict[str, float]]:
        """A copy to or from pageable host memory: the driver moves it through a pinned bounce buffer,
        the DMA at the link's pinned rate and one CPU thread's memcpy on to (or from) the pageable
        memory at the staging rate, chunk after chunk, so their times add (hardware_defaults.yaml
        pageable_staging_gbs, or the profile's measured copies); host DRAM carries it twice. The
        host's uncertainty scales the memcpy, not the DMA."""
        path = (GPU_UP, SWITCH_UP) if to_host else (GPU_DOWN, SWITCH_DOWN)
        link = min(self.pcie, self.switch_share, self.dram_share / 2)
        staging = (self.staging_d2h if to_host else self.staging_h2d) / self.scale
        bw = 1.0 / (1.0 / link + 1.0 / staging)
        t = nbytes / bw if nbytes > 0 else 0.0
        return t, ({path[0]: bw, path[1]: bw, DRAM: 2 * bw} if t > 0 else {})

    def cpu_stream(self, elements: float, dram_bytes_per_element: float) -> tuple[float, dict[str, float]]:
        """A streaming pass of the rank's CPU threads over ``elements`` (a dtype conversion, a copy)
        moving ``dram_bytes_per_element`` through host DRAM: at the rank's DRAM share (its threads
        together saturate it, as STREAM does with a few cores per socket)."""
        bw = self.dram_share / self.scale
        t = elements * dram_bytes_per_element / bw if elements > 0 else 0.0
        return t, ({DRAM: bw} if t > 0 else {})

    def first_touch(self, nbytes: float, unaligned_share: float = 1.0) -> float:
        """Seconds one thread spends faulting in ``nbytes`` of freshly mapped buffers on first write.
        Without transparent huge pages (or with "madvise", which PyTorch's buffers do not ask for): one
        demand-zero fault per 4 KiB page (the scenario's cluster.host.page_fault_us, else
        hardware_defaults.yaml host.first_touch_s_per_page). With "always" the kernel backs each whole
        aligned 2 MiB range of a mapping with a huge page at its first fault, allocated and zeroed at
        host.huge_page_fault_gbs; ``unaligned_share`` of the bytes (the mappings' ends outside such
        ranges: ``unaligned_share()`` below) still fault 4 KiB at a time."""
        d = hardware_defaults()["host"]
        per_page = d["first_touch_s_per_page"] if self.page_fault_s is None else self.page_fault_s
        nbytes = max(nbytes, 0.0)
        small = nbytes * min(max(unaligned_share, 0.0), 1.0) if self.huge_pages else nbytes
        seconds = small / d["page_bytes"] * per_page + (nbytes - small) / (d["huge_page_fault_gbs"] * 1e9)
        return seconds * self.fault_scale

    def cpu_rate(self, dram_bytes_per_param: float) -> float:
        roofline = self.dram_share / dram_bytes_per_param
        rate = min(roofline, self.measured_params_per_s) if self.measured_params_per_s else roofline
        return rate / self.scale

    def cpu_update(self, params: float, dram_bytes_per_param: float) -> tuple[float, dict[str, float]]:
        rate = self.cpu_rate(dram_bytes_per_param)
        t = params / rate if params > 0 else 0.0
        return t, ({DRAM: rate * dram_bytes_per_param} if t > 0 else {})

    def nic_traffic(self, inter_bytes_per_gpu: float, duration: float) -> dict[str, float]:
        """Links a collective's inter-node bytes cross on the way to the NIC (both directions)."""
        if duration <= 0 or inter_bytes_per_gpu <= 0:
            return {}
        bw = inter_bytes_per_gpu / duration
        demands = {GPU_UP: bw, GPU_DOWN: bw}
        if not self.rdma:  # staged through host memory
            demands.update({SWITCH_UP: bw, SWITCH_DOWN: bw, DRAM: 2 * bw})
        return demands


def fresh_buffer_shares(layers, bytes_per_element: float) -> tuple[float, float]:
    """Where a per-tensor host buffer of ``bytes_per_element`` each (the blocking copy's pageable
    tensors) faults, in one pass over the model's tensors: (``freshly_mapped_share``,
    ``unaligned_share``)."""
    d = hardware_defaults()["host"]
    limit, huge = d["mmap_threshold_max_bytes"], d["huge_page_bytes"]
    total = big = unaligned = 0.0
    for layer in layers:
        for n in layer.param_tensors:
            total += n
            if n * bytes_per_element >= limit:
                big += n
                unaligned += min(n * bytes_per_element, huge)
    fresh = big * bytes_per_element
    return (big / total if total > 0 else 0.0), (unaligned / fresh if fresh > 0 else 0.0)


def freshly_mapped_share(layers, bytes_per_element: float) -> float:
    """The share of parameter elements whose per-tensor host buffer of ``bytes_per_element`` each is
    at least glibc's largest mmap threshold (hardware_defaults.yaml mmap_threshold_max_bytes; with
    malloc's chunk header such a request is above it): malloc maps each such buffer afresh and unmaps it
    at free, so every use faults its pages in again. Smaller buffers may come from malloc's heap, whose
    pages stay mapped, depending on the threshold's history: none of their faults are counted (a lower
    bound)."""
    return fresh_buffer_shares(layers, bytes_per_element)[0]


def unaligned_share(layers, bytes_per_element: float) -> float:
    """Of the bytes in the freshly mapped per-tensor buffers (``freshly_mapped_share``), the share that
    lies outside whole aligned huge pages (hardware_defaults.yaml host.huge_page_bytes, H): malloc's
    mmap returns a page-aligned address, not a huge-page-aligned one, so a buffer of S >= H bytes has a
    head before its first H boundary and a tail after its last, each uniform in [0, H) over where the
    mapping lands: H bytes on average (a smaller buffer: all S), faulted 4 KiB at a time even with
    transparent huge pages."""
    return fresh_buffer_shares(layers, bytes_per_element)[1]


def page_fault_source(spec) -> str:
    """One line for `run` where the blocking gradient copy faults in fresh pageable buffers: how the
    host's kernel pages them (``spec``: the scenario's cluster.host) and what that costs."""
    d = hardware_defaults()["host"]
    mode = spec.transparent_hugepages or d["transparent_hugepages"]
    whence = (
        "cluster.host.transparent_hugepages"
        if spec.transparent_hugepages
        else "the Linux kernel's default; cluster.host.transparent_hugepages sets the host's"
    )
    us = spec.page_fault_us if spec.page_fault_us is not None else d["first_touch_s_per_page"] * 1e6
    small = f"4 KiB pages at {us:g} us each"
    if mode == "always":
        return (
            f"transparent huge pages {mode} ({whence}): the blocking copy's fresh pageable buffers fault "
            f"in 2 MiB pages at {d['huge_page_fault_gbs']:g} GB/s, their unaligned ends in {small}"
        )
    return (
        f"transparent huge pages {mode} ({whence}): the blocking copy's fresh pageable buffers fault in "
        f"{small}"
    )
