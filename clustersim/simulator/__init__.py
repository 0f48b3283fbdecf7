"""The discrete-event simulator: programs of ops executed on streams by a simpy engine."""

from clustersim.simulator.runner import simulate

__all__ = ["simulate"]
