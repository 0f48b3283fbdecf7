"""The graph of one node for each intra-node fabric.

Nodes of the graph: ``gpuI``, ``pcieswJ`` (PCIe switches), ``cpuK`` (sockets / root complexes with
host memory), ``nicM`` and, for NVSwitch systems, ``nvswitch``. Edges are directed with a
``capacity`` in bytes/s per direction and a ``kind``.
"""

from __future__ import annotations

import networkx as nx

from clustersim.catalog import GpuSpec, hardware_defaults
from clustersim.scenario import ClusterSpec
from clustersim.topologies.links import LinkKind
from clustersim.topologies.links import add_link as _add_link


def add_link(graph, a: str, b: str, kind: LinkKind, bandwidth: float) -> None:
    _add_link(graph, a, b, kind, bandwidth, hop_latency(kind))


# DGX-1 with V100: NVLink pairs and link multiplicity (nvidia-smi topo -m on a DGX-1V; NVIDIA
# "DGX-1 With Tesla V100 System Architecture" whitepaper, fig. 3). Six links per GPU.
DGX1_V100_NVLINKS = {
    (0, 1): 1,
    (0, 2): 1,
    (0, 3): 2,
    (0, 4): 2,
    (1, 2): 2,
    (1, 3): 1,
    (1, 5): 2,
    (2, 3): 2,
    (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1,
    (4, 6): 1,
    (4, 7): 2,
    (5, 6): 2,
    (5, 7): 1,
    (6, 7): 2,
}


def pcie_bandwidth(gen: int) -> float:
    return hardware_defaults()["pcie_gbs"][gen] * 1e9


def nic_bandwidth(spec: ClusterSpec) -> float:
    """Achievable bytes/s of one NIC: the measured rate if given, else line rate x protocol efficiency."""
    nic = spec.nic
    if nic.effective_gbps is not None:
        return nic.effective_gbps * 1e9 / 8
    return nic.line_rate_gbps * 1e9 / 8 * hardware_defaults()["nic"][nic.kind]


def hop_latency(kind: LinkKind) -> float:
    """Per-hop latency of a link kind: NCCL's Simple-protocol constant for its class (tuning.cc)."""
    return hardware_defaults()["nccl"]["hop_latency_us"][kind.latency_class]["Simple"] * 1e-6


def build_node_graph(spec: ClusterSpec, gpu: GpuSpec) -> nx.DiGraph:
    g = nx.DiGraph()
    n_gpu = spec.gpus_per_node
    intra = spec.intra_node
    gen = gpu.pcie_generation(intra.pcie_gen)
    pcie = pcie_bandwidth(gen)
    per_switch = intra.gpus_per_pcie_switch
    n_switch = max(1, -(-n_gpu // per_switch))
    n_cpu = min(spec.host.sockets, n_switch)
    for c in range(n_cpu):
        g.add_node(f"cpu{c}", role="cpu")
    for c in range(1, n_cpu):
        add_link(g, "cpu0", f"cpu{c}", LinkKind.SOCKET, hardware_defaults()["socket_link_gbs"] * 1e9)
    for s in range(n_switch):
        g.add_node(f"pciesw{s}", role="pcie_switch")
        add_link(g, f"pciesw{s}", f"cpu{s * n_cpu // n_switch}", LinkKind.PCIE, pcie)
    for i in range(n_gpu):
        g.add_node(f"gpu{i}", role="gpu")
        add_link(g, f"gpu{i}", f"pciesw{i // per_switch}", LinkKind.PCIE, pcie)
    for m in range(spec.nic.count):
        g.add_node(f"nic{m}", role="nic")
        add_link(g, f"nic{m}", f"pciesw{m * n_switch // max(1, spec.nic.count)}", LinkKind.PCIE, pcie)
    per_link = gpu.nvlink.gbs_per_link * 1e9
    if intra.fabric == "nvswitch":
        g.add_node("nvswitch", role="nvswitch")
        for i in range(n_gpu):
            add_link(g, f"gpu{i}", "nvswitch", LinkKind.NVSWITCH, gpu.nvlink.links * per_link)
    elif intra.fabric == "nvlink_mesh":
        for (a, b), count in DGX1_V100_NVLINKS.items():
            if a < n_gpu and b < n_gpu:
                # Scale the pair's share by the GPU's link count (A100/H100 meshes have more links).
                add_link(g, f"gpu{a}", f"gpu{b}", LinkKind.NVLINK, count * per_link * gpu.nvlink.links / 6)
    return g
