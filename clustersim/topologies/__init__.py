"""Cluster topologies: typed-link graphs of one node plus the fabric between nodes.

Every node of a data-parallel cluster is identical, so the graph holds one node in full detail
(GPUs, NVLink/NVSwitch, PCIe switches, CPU sockets, NICs) and the inter-node fabric as a
per-node injection bandwidth with its oversubscription. That keeps a 65,536-GPU cluster as cheap
to build as an 8-GPU one while still deriving every bandwidth from links.
"""

from clustersim.topologies.cluster import Cluster, GroupShape, build_cluster

__all__ = ["Cluster", "GroupShape", "build_cluster"]
