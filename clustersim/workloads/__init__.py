"""Workloads: turn a model architecture into the layers the simulator schedules."""

from clustersim.workloads.builder import build_workload
from clustersim.workloads.layers import Kernel, Layer, Workload

__all__ = ["Kernel", "Layer", "Workload", "build_workload"]
