"""Max-min fair sharing of links by many flows, vectorised (numpy), and the makespan of a flow set.

The flow backend expands one step of a collective into flows (each a list of link indices and a
size in bytes). All flows start together; rates are max-min fair (progressive filling: every
unfrozen flow's rate rises together until a link saturates; the flows through it freeze). When the
first flows finish, the rest are re-shared, until all have finished: the step's makespan. Background
flows (another job's traffic) have no size: they take their fair share and never finish.

Identical flows (the same links, the same size, started together) always get the same max-min rate:
the max-min allocation is unique and swapping two of them leaves it one. So ``weights`` gives a flow
the multiplicity of that many copies, counted k times on each of its links: a billion background
flows on a link cost one entry, not a billion (tests/test_flow_network.py compares both).

A step of p identical flows freezes in one filling round; a step with a slow link in two. Each
round is one ``np.bincount`` over the flows' link entries, so a step of 100,000 flows costs
milliseconds.
"""

from __future__ import annotations

import numpy as np

# Numerical tolerances, not model constants: link capacities are 1e8..1e12 bytes/s and rates sums of
# at most ~1e6 flows; a link with less than this fraction of its capacity left is saturated.
_SATURATED = 1e-9
_MAX_ROUNDS = 64  # completion rounds simulated exactly; after that the rest finish at their last rates


class FlowSet:
    """Flows as a CSR structure: ``entries`` (link index per flow-link pair), ``owner`` (flow of each
    entry), ``size`` (bytes per flow; ``inf`` for a background flow), ``weight`` (identical copies the
    flow stands for; its rate and size are one copy's)."""

    __slots__ = ("entries", "owner", "size", "weight")

    def __init__(self, paths: list[list[int]], sizes: list[float], weights: list[float] | None = None):
        lengths = np.fromiter((len(p) for p in paths), dtype=np.int64, count=len(paths))
        self.owner = np.repeat(np.arange(len(paths)), lengths)
        self.entries = np.fromiter((x for p in paths for x in p), dtype=np.int64, count=int(lengths.sum()))
        self.size = np.asarray(sizes, dtype=float)
        self.weight = None if weights is None else np.asarray(weights, dtype=float)


def _count(entries, owner, weight, live, n_links: int) -> np.ndarray:
    """Flows (copies) through each link among the ``live`` entries."""
    if weight is None:
        return np.bincount(entries[live], minlength=n_links)
    return np.bincount(entries[live], weights=weight[owner[live]], minlength=n_links)


def fair_rates(
    entries, owner, n_flows: int, active: np.ndarray, capacity: np.ndarray, weight=None
) -> np.ndarray:
    """Max-min fair rates (bytes/s) of the ``active`` flows, each copy's; inactive flows get 0."""
    rate = np.zeros(n_flows)
    left = capacity.astype(float).copy()
    unfrozen = active.copy()
    n_links = len(capacity)
    while unfrozen.any():
        live = unfrozen[owner]
        count = _count(entries, owner, weight, live, n_links)
        used = count > 0
        if not used.any():  # flows with no links: unlimited, never the case for routed flows
            rate[unfrozen] = np.inf
            break
        step = np.min(left[used] / count[used])
        rate[unfrozen] += step
        left -= step * count
        full = used & (left <= _SATURATED * capacity)
        hit = np.zeros(n_flows, dtype=bool)
        hit[owner[live & full[entries]]] = True
        if not hit.any():  # numerical safety: nothing froze
            break
        unfrozen &= ~hit
    return rate


def makespan(flows: FlowSet, capacity: np.ndarray) -> tuple[float, np.ndarray]:
    """Seconds until every sized flow has finished, and the bytes each link carried meanwhile
    (background flows included)."""
    n = len(flows.size)
    remaining = flows.size.copy()
    sized = np.isfinite(remaining)
    active = np.ones(n, dtype=bool)
    carried = np.zeros(n)
    t = 0.0
    for _ in range(_MAX_ROUNDS):
        if not (active & sized).any():
            break
        rate = fair_rates(flows.entries, flows.owner, n, active, capacity, flows.weight)
        live = active & sized
        dt = np.min(remaining[live] / rate[live])
        t += dt
        carried += rate * dt * active
        remaining[live] -= rate[live] * dt
        active &= ~(sized & (remaining <= 1e-12 * flows.size))
    else:  # too many distinct finishing times: let the rest run at their last rates
        live = active & sized
        if live.any():
            rate = fair_rates(flows.entries, flows.owner, n, active, capacity, flows.weight)
            dt = np.max(remaining[live] / rate[live])
            t += dt
            carried += rate * dt * active
    if flows.weight is not None:
        carried *= flows.weight
    link_bytes = np.bincount(flows.entries, weights=carried[flows.owner], minlength=len(capacity))
    return t, link_bytes
