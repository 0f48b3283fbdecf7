"""The rate of a fused attention kernel, by library, head dimension, sequence length, pass and mask.

A fused attention kernel (FlashAttention, cuDNN's) is not a GEMM: each thread block holds one block of
queries and streams the keys and values past it, so its rate depends on the library's pipelining far more
than on the GPU's GEMM efficiency, and it ramps with the sequence length (a fixed cost per query block
amortised over its key blocks). The published curves (catalogs/attention_kernels.yaml) give the rate
per library on the H100's chip; this module reads them as a fraction of that chip's dense 16-bit peak.

    fraction(kernel, d, s, pass, causal, dropout)
        = forward_d(s) / peak                          the head dimension's forward table
          x backward_128(s) / forward_128(s)           backward only
          x causal_forward_128(s) / forward_128(s)     causal only
          x dropout_rate_factor                        dropout only

The FLOPs it divides are FlashAttention's count: 4 s^2 d per head forward, half of it under a causal
mask (the kernel skips the masked key blocks), 2.5x forward for the backward.
"""

from __future__ import annotations

import math
from functools import lru_cache

from clustersim import catalog
from clustersim.workloads.layers import AttentionShape


def _interp_log(xs: list[float], ys: list[float], x: float) -> float:
    """Linear interpolation of ys in log x, clamped to the table's ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for i in range(1, len(xs)):
        if x <= xs[i]:
            t = (math.log(x) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
            return ys[i - 1] + t * (ys[i] - ys[i - 1])
    return ys[-1]


def _ramp_fit(lengths: list[float], rates: list[float]) -> tuple[float, float]:
    """R and s0 of rate(s) = R s / (s + s0), by least squares on 1/rate = 1/R + (s0/R)(1/s)."""
    xs = [1.0 / s for s in lengths]
    ys = [1.0 / r for r in rates]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    intercept = my - slope * mx
    r = 1.0 / intercept
    return r, max(slope * r, 0.0)


class _KernelCurves:
    def __init__(self, entry: dict, lengths: list[float], peak: float):
        self.forward = {int(d): [v / peak for v in vals] for d, vals in entry["forward"].items()}
        f128 = self.forward[128]
        self.backward_ratio = [b / peak / f for b, f in zip(entry["backward_128"], f128)]
        self.causal_ratio = [c / peak / f for c, f in zip(entry["causal_forward_128"], f128)]
        self.lengths = lengths
        self.ramps = {d: _ramp_fit(lengths, vals) for d, vals in self.forward.items()}

    def _forward_at(self, d: int, s: float) -> float:
        vals = self.forward[d]
        if s >= self.lengths[0]:
            return _interp_log(self.lengths, vals, s)
        r, s0 = self.ramps[d]  # below the grid: the fitted ramp, scaled to meet the table at its start
        s_min = self.lengths[0]
        return vals[0] * (s / (s + s0)) / (s_min / (s_min + s0))

    def forward_fraction(self, head_dim: int, s: float) -> float:
        dims = sorted(self.forward)
        if head_dim <= dims[0]:
            return self._forward_at(dims[0], s)
        if head_dim >= dims[-1]:
            return self._forward_at(dims[-1], s)
        lo = max(d for d in dims if d <= head_dim)
        hi = min(d for d in dims if d >= head_dim)
        a, b = self._forward_at(lo, s), self._forward_at(hi, s)
        if lo == hi:
            return a
        t = (math.log(head_dim) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return a + t * (b - a)


@lru_cache(maxsize=None)
def _table() -> tuple[dict[str, _KernelCurves], frozenset[str], dict]:
    raw = catalog.attention_kernels()
    lengths = [float(x) for x in raw["lengths"]]
    curves = {
        name: _KernelCurves(e, lengths, float(raw["peak_tflops"])) for name, e in raw["kernels"].items()
    }
    return curves, frozenset(raw["chips"]), raw


def kernel_names() -> list[str]:
    return list(_table()[0])


def has_curves(chip: str) -> bool:
    """Whether published curves of fused attention kernels exist for this chip."""
    return chip in _table()[1]


def peak_fraction(kernel: str, shape: AttentionShape, dropout: bool) -> float:
    """The fraction of the chip's dense 16-bit peak the kernel reaches on this shape (FlashAttention's
    FLOP count: halved under a causal mask)."""
    curves = _table()[0][kernel]
    s = float(shape.seq_len)
    fraction = curves.forward_fraction(shape.head_dim, s)
    if shape.backward:
        fraction *= _interp_log(curves.lengths, curves.backward_ratio, s)
    if shape.causal:
        fraction *= _interp_log(curves.lengths, curves.causal_ratio, s)
    if dropout:
        fraction *= float(_table()[2]["dropout_rate_factor"])
    return fraction
