"""Timing with warm-up, repetitions, medians and spread: the one way every benchmark is timed."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    repeats: int

    def as_dict(self) -> dict:
        return {"median_s": self.median_s, "p10_s": self.p10_s, "p90_s": self.p90_s, "repeats": self.repeats}


def summarize(samples: list[float]) -> Timing:
    """Median and P10/P90 of the samples. The inclusive method keeps the percentiles within the measured
    range: the default (exclusive) one extrapolates beyond it with few samples, and five timings of a
    noisy collective gave a negative P10."""
    s = sorted(samples)
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) >= 2 else [s[0]] * 9
    return Timing(statistics.median(s), q[0], q[-1], len(s))


def measure(
    fn: Callable[[], object],
    sync: Callable[[], None],
    warmup: int = 3,
    repeat: int = 10,
    min_time_s: float = 0.0,
) -> Timing:
    """Run ``fn`` ``warmup`` times, then time ``repeat`` runs (each bracketed by ``sync``).

    ``min_time_s`` adds repetitions (up to 10x) until that much time was measured, so tiny kernels
    are not timed from a single noisy call.
    """
    for _ in range(warmup):
        fn()
    sync()
    samples: list[float] = []
    total = 0.0
    while len(samples) < repeat or (total < min_time_s and len(samples) < 10 * repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        dt = time.perf_counter() - t0
        samples.append(dt)
        total += dt
    return summarize(samples)
