"""Timing with warm-up, repetitions, medians and spread: the one way every benchmark is timed.

On a loaded host a timed call can stall: a thread of the op is descheduled and the call waits out
another process's scheduler slice (milliseconds, where the op itself takes microseconds). A stall only
ever adds time, so a sample far above the fastest of its repeats is left out of the median
(``stalled`` counts them), and several measurements can be timed in turn (``measure_interleaved``) so
that a slow stretch of the machine falls on all of them alike instead of on one size of a sweep.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

#: A sample this much slower than the fastest of its repeats, and at least STALL_MIN_S, is a stall:
#: the spread of an op that runs undisturbed is tens of percent (P90/P10 of the shipped profiles'
#: measurements: median 1.28 and at most 2.7 on the CPU, at most 1.6 on the H100 and H200), while a
#: descheduled thread waits out a scheduler slice of milliseconds.
STALL_FACTOR = 10.0
#: The least time a stall adds: Linux CFS's minimum granularity (0.75 ms at its defaults, 3 ms on
#: many distributions; the testbed sets a 5 ms slice). A launch or dispatch costs microseconds.
STALL_MIN_S = 1e-3


@dataclass(frozen=True)
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    repeats: int
    stalled: int = 0

    def as_dict(self) -> dict:
        out = {"median_s": self.median_s, "p10_s": self.p10_s, "p90_s": self.p90_s, "repeats": self.repeats}
        if self.stalled:
            out["stalled"] = self.stalled
        return out


def summarize(samples: list[float]) -> Timing:
    """Median and P10/P90 of the samples that are not stalls (see STALL_FACTOR); all of them where
    every sample is slow alike (then no sample says what the op costs undisturbed). The inclusive
    method keeps the percentiles within the measured range: the default (exclusive) one extrapolates
    beyond it with few samples, and five timings of a noisy collective gave a negative P10."""
    fastest = min(samples)
    kept = [x for x in samples if x < max(STALL_FACTOR * fastest, STALL_MIN_S)]
    s = sorted(kept)
    q = statistics.quantiles(s, n=10, method="inclusive") if len(s) >= 2 else [s[0]] * 9
    return Timing(statistics.median(s), q[0], q[-1], len(samples), len(samples) - len(kept))


def _enough(samples: list[float], repeat: int, min_time_s: float) -> bool:
    return len(samples) >= repeat and (sum(samples) >= min_time_s or len(samples) >= 10 * repeat)


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
    return measure_interleaved([fn], sync, warmup, repeat, min_time_s)[0]


def measure_interleaved(
    fns: list[Callable[[], object]],
    sync: Callable[[], None],
    warmup: int = 3,
    repeat: int = 10,
    min_time_s: float = 0.0,
) -> list[Timing]:
    """``measure`` for several functions at once, one timed call of each in turn (round-robin) until
    each has its repetitions: drift and slow stretches of a shared machine hit every size of a sweep
    alike, so they cannot bend the sweep's shape (as nccl-tests' and torch.utils.benchmark's
    repetitions do for one size)."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    sync()
    samples: list[list[float]] = [[] for _ in fns]
    while True:
        pending = [i for i, s in enumerate(samples) if not _enough(s, repeat, min_time_s)]
        if not pending:
            break
        for i in pending:
            t0 = time.perf_counter()
            fns[i]()
            sync()
            samples[i].append(time.perf_counter() - t0)
    return [summarize(s) for s in samples]
