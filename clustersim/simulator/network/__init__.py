"""Network backends: who gives a collective op its duration when the engine starts it (issue #11)."""

from clustersim.simulator.network.backend import AnalyticalBackend, NetworkBackend

__all__ = ["AnalyticalBackend", "NetworkBackend"]
