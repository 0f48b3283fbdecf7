"""Break-even bandwidth: the NIC bandwidth below which a compressed optimizer beats its baseline.

Compression trades kernel time on the GPU for bytes on the network, so on a given cluster and model
there is one effective per-NIC bandwidth b* where the compressed step and the baseline step take the
same time: below b* compression wins, above it loses. It is found by bisection on log(bandwidth) of
``t_compressed(b) / t_baseline(b) - 1``, each side a full simulation with the scenario's NIC delivering
``b`` (``cluster.nic.effective_gbps``; what iperf or ib_write_bw would measure, not the line rate).

Its interval pairs the two simulations under the same parameter draw (simulator/uncertainty.py):
both optimizers run on the same hardware, so what is uncertain about the hardware moves both, and
only what differs between them (compression kernels vs bytes) widens b*. The compressed optimizer's
compression-stage step is compared; a warmup run at the baseline's speed (1-bit Adam) leaves b*
unchanged, since w·t_base + (1-w)·t_c = t_base exactly when t_c = t_base.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from clustersim.catalog import nic_line_rate_at_least
from clustersim.scenario import Scenario
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.simulator.uncertainty import Interval, perturbations

SEARCH_GBPS = (0.01, 10_000.0)  # 10 Mb/s .. 10 Tb/s per NIC: beyond any NIC sold
NOMINAL_STEPS = 14  # bisection steps over the full range: 2^-14 of 6 decades = 0.04% in bandwidth
SAMPLE_STEPS = 9  # per parameter draw, inside a bracket of 16x around the nominal answer


@dataclass(frozen=True)
class BreakEven:
    optimizer: str
    baseline: str
    gbps: float | None  # None: no crossing in SEARCH_GBPS (see ``verdict``)
    verdict: str  # "crossing" | "always faster" | "never faster" | "single node"
    interval: Interval | None = None

    def as_dict(self) -> dict:
        return {
            "optimizer": self.optimizer,
            "baseline": self.baseline,
            "gbps": self.gbps,
            "verdict": self.verdict,
            "interval_gbps": self.interval.as_dict() if self.interval else None,
        }

    def describe(self) -> str:
        if self.verdict == "single node":
            return "no network in a single node"
        # the search varies what each NIC delivers (cluster.nic.effective_gbps), and compares steps
        if self.verdict == "always faster":
            return f"faster per step at every effective NIC bandwidth up to {SEARCH_GBPS[1]:,.0f} Gb/s"
        if self.verdict == "never faster":
            return f"slower per step at every effective NIC bandwidth down to {SEARCH_GBPS[0]} Gb/s"
        band = f" (P10–P90 {_gbps(self.interval.p10)}–{_gbps(self.interval.p90)})" if self.interval else ""
        return f"faster per step below {_gbps(self.gbps)} Gb/s effective per NIC{band}"


def _gbps(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _at(scenario: Scenario, gbps: float) -> Scenario:
    nic = scenario.cluster.nic
    # a faster NIC than the scenario's where needed, at a rate such NICs are sold at
    line = max(nic.line_rate_gbps, nic_line_rate_at_least(nic.kind, gbps))
    return scenario.with_changes(**{"cluster.nic.line_rate_gbps": line, "cluster.nic.effective_gbps": gbps})


def _ratio(compressed: Scenario, baseline: Scenario, gbps: float, profile, perturbation) -> float:
    tc = simulate(_at(compressed, gbps), profile, perturbation=perturbation).iteration_time
    tb = simulate(_at(baseline, gbps), profile, perturbation=perturbation).iteration_time
    return tc / tb


def _bisect(compressed, baseline, profile, perturbation, lo: float, hi: float, steps: int) -> float:
    """log-space bisection for ratio == 1, assuming ratio(lo) < 1 <= ratio(hi)."""
    a, b = math.log(lo), math.log(hi)
    for _ in range(steps):
        mid = 0.5 * (a + b)
        if _ratio(compressed, baseline, math.exp(mid), profile, perturbation) < 1.0:
            a = mid
        else:
            b = mid
    return math.exp(0.5 * (a + b))


def break_even(
    compressed: Scenario, baseline: Scenario, profile=None, samples: int = 8, seed: int = 0
) -> BreakEven:
    """The effective per-NIC bandwidth where ``compressed`` and ``baseline`` take equally long per step."""
    opt, base = compressed.training.optimizer, baseline.training.optimizer
    if compressed.cluster.nodes <= 1:
        return BreakEven(opt, base, None, "single node")
    lo, hi = SEARCH_GBPS
    r_lo = _ratio(compressed, baseline, lo, profile, None)
    r_hi = _ratio(compressed, baseline, hi, profile, None)
    if r_hi < 1.0:
        return BreakEven(opt, base, None, "always faster")
    if r_lo >= 1.0:
        return BreakEven(opt, base, None, "never faster")
    nominal = _bisect(compressed, baseline, profile, None, lo, hi, NOMINAL_STEPS)
    interval = None
    if samples > 0:
        ctx = build_context(compressed, profile)
        found = []
        for p in perturbations(ctx, samples, seed):
            a, b = max(lo, nominal / 16), min(hi, nominal * 16)
            if _ratio(compressed, baseline, a, profile, p) >= 1.0:
                found.append(a)
            elif _ratio(compressed, baseline, b, profile, p) < 1.0:
                found.append(b)
            else:
                found.append(_bisect(compressed, baseline, profile, p, a, b, SAMPLE_STEPS))
        q = np.quantile(found, [0.1, 0.5, 0.9])
        interval = Interval(float(q[0]), float(q[1]), float(q[2]), len(found))
    return BreakEven(opt, base, nominal, "crossing", interval)
