"""Link kinds and the attributes every edge of a topology graph carries."""

from __future__ import annotations

from enum import Enum


class LinkKind(str, Enum):
    NVLINK = "nvlink"  # GPU-GPU direct NVLink (DGX-1 hybrid cube-mesh)
    NVSWITCH = "nvswitch"  # GPU to NVSwitch plane (all of a GPU's NVLinks)
    PCIE = "pcie"  # GPU/NIC to PCIe switch, switch to CPU root complex
    SOCKET = "socket"  # CPU to CPU (UPI/QPI)
    NETWORK = "network"  # NIC to the fabric (InfiniBand or Ethernet)
    INFINITY_FABRIC = "infinity_fabric"  # AMD GPU-GPU xGMI links (MI250X GCDs on a Frontier node)

    @property
    def latency_class(self) -> str:
        """Which of NCCL's per-hop latency rows applies to a hop over this link."""
        return {
            "nvlink": "nvlink",
            "nvswitch": "nvlink",
            "pcie": "pcie",
            "socket": "pcie",
            "network": "network",
            # RCCL over xGMI is priced with NCCL's NVLink hop latency: both are direct GPU-GPU
            # load/store links (an approximation; RCCL's own tuning tables are not modelled).
            "infinity_fabric": "nvlink",
        }[self.value]


def add_link(graph, a: str, b: str, kind: LinkKind, bandwidth: float, latency: float = 0.0) -> None:
    """A full-duplex link: two directed edges, each with the per-direction bandwidth (bytes/s)."""
    for u, v in ((a, b), (b, a)):
        if graph.has_edge(u, v):  # parallel NVLinks between one GPU pair add up
            graph[u][v]["capacity"] += bandwidth
        else:
            graph.add_edge(u, v, kind=kind, capacity=bandwidth, latency=latency)
