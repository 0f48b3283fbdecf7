"""The seam between the engine and the network model.

Strategies describe a collective as data (``Op.collective``: op, bytes, group shape, algorithm,
protocol) and keep calling ``strategies/common.add_collective``; the engine asks a backend for the
op's duration when it starts the op. The analytical backend is today's closed-form cost model
(cost_models/collectives.py), whose time the op already carries: it is the default and the fast path
(the engine skips the call entirely when it is in use). The flow backend (network/flow.py) simulates
the algorithm's flows over the topology instead.
"""

from __future__ import annotations

from typing import Protocol

from clustersim.simulator.program import Op


class NetworkBackend(Protocol):
    name: str

    def duration(self, op: Op, now: float) -> float:
        """Seconds ``op`` (a collective, ``op.collective`` set) takes alone, started at ``now``."""
        ...


class AnalyticalBackend:
    """The α-β topology model: the duration the cost model gave when the program was built."""

    name = "analytical"

    def duration(self, op: Op, now: float) -> float:
        return op.duration
