"""The graph of one node for each intra-node fabric.

Nodes of the graph: ``gpuI``, ``pcieswJ`` (PCIe switches), ``cpuK`` (sockets / root complexes with
host memory), ``nicM`` and, for NVSwitch systems, ``nvswitch``. Edges are directed with a
``capacity`` in bytes/s per direction and a ``kind``.
"""

from __future__ import annotations

import networkx as nx

from clustersim.catalog import GpuSpec, hardware_defaults
from clustersim.identifiers import IntraNodeFabric
from clustersim.scenario import ClusterSpec
from clustersim.topologies.links import LinkKind
from clustersim.topologies.links import add_link as _add_link


def add_link(graph, a: str, b: str, kind: LinkKind, bandwidth: float) -> None:
    _add_link(graph, a, b, kind, bandwidth, hop_latency(kind))


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
    FABRICS[IntraNodeFabric(intra.fabric)](g, n_gpu, gpu)
    return g


def _nvswitch(g: nx.DiGraph, n_gpu: int, gpu: GpuSpec) -> None:
    """Every GPU's NVLinks to one switch (DGX/HGX A100, H100)."""
    g.add_node("nvswitch", role="nvswitch")
    for i in range(n_gpu):
        add_link(
            g, f"gpu{i}", "nvswitch", LinkKind.NVSWITCH, gpu.nvlink.links * gpu.nvlink.gbs_per_link * 1e9
        )


def _nvlink_mesh(g: nx.DiGraph, n_gpu: int, gpu: GpuSpec) -> None:
    """DGX-1's hybrid cube-mesh: the pairs and link counts of catalogs/hardware_defaults.yaml."""
    mesh = hardware_defaults()["dgx1_nvlink_mesh"]
    per_link = gpu.nvlink.gbs_per_link * 1e9
    for a, b, count in mesh["pairs"]:
        if a < n_gpu and b < n_gpu:
            # Scale the pair's share by the GPU's link count (A100/H100 meshes have more links).
            add_link(
                g,
                f"gpu{a}",
                f"gpu{b}",
                LinkKind.NVLINK,
                count * per_link * gpu.nvlink.links / mesh["links_per_gpu"],
            )


def _infinity_fabric(g: nx.DiGraph, n_gpu: int, gpu: GpuSpec) -> None:
    """A Frontier node (catalogs/hardware_defaults.yaml frontier_infinity_fabric): the GCDs' xGMI links,
    and each GCD's own Infinity Fabric link to the CPU in place of a PCIe link (the ``pciesw`` of a
    package, shared by its two GCDs and its NIC, stands for the package's attachment to the host: its
    uplink carries both GCDs' CPU links)."""
    node = hardware_defaults()["frontier_infinity_fabric"]
    for a, b, gbs in node["pairs"]:
        if a < n_gpu and b < n_gpu:
            add_link(g, f"gpu{a}", f"gpu{b}", LinkKind.INFINITY_FABRIC, gbs * 1e9)
    cpu_link = node["cpu_link_gbs"] * 1e9
    for i in range(n_gpu):
        for _, sw in list(g.out_edges(f"gpu{i}")):
            if g.nodes[sw].get("role") == "pcie_switch":
                g[f"gpu{i}"][sw]["capacity"] = g[sw][f"gpu{i}"]["capacity"] = cpu_link
    for sw, data in list(g.nodes(data=True)):
        if data.get("role") == "pcie_switch":
            gcds = sum(1 for p in g.successors(sw) if g.nodes[p].get("role") == "gpu")
            for _, cpu in list(g.out_edges(sw)):
                if g.nodes[cpu].get("role") == "cpu":
                    g[sw][cpu]["capacity"] = g[cpu][sw]["capacity"] = max(1, gcds) * cpu_link


def _pcie_only(g: nx.DiGraph, n_gpu: int, gpu: GpuSpec) -> None:
    """No NVLink: GPUs reach each other through the PCIe tree built above."""


FABRICS = {
    IntraNodeFabric.NVSWITCH: _nvswitch,
    IntraNodeFabric.NVLINK_MESH: _nvlink_mesh,
    IntraNodeFabric.PCIE: _pcie_only,
    IntraNodeFabric.INFINITY_FABRIC: _infinity_fabric,
}
