"""The rate of a fused attention kernel, by library, head dimension, sequence length, pass and mask.

A fused attention kernel (FlashAttention, cuDNN's) is not a GEMM: each thread block holds one block of
queries and streams the keys and values past it, so its rate depends on the library's pipelining far more
than on the GPU's GEMM efficiency, and it ramps with the sequence length (a fixed cost per query block
amortised over its key blocks). The published curves (catalogs/attention_kernels.yaml) give the rate
per library on the H100's chip; this module reads them as a fraction of that chip's dense 16-bit peak.

    fraction(kernel, d, s, pass, causal, dropout)
        = forward_d(s) / peak                          the head dimension's forward table
          x backward_d(s) / forward_d(s)               backward only (the head dims with backward tables)
          x causal_forward_128(s) / forward_128(s)     causal only
          x dropout_rate_factor                        dropout only

It also owns the FLOP count those rates divide: FlashAttention's, 4 s^2 d per head forward, half of it
under a causal mask (the kernel skips the masked key blocks), 2.5x the forward for the backward.
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
    i = next((i for i in range(1, len(xs)) if x <= xs[i]), None)
    if i is None:
        return ys[-1]
    t = (math.log(x) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
    return ys[i - 1] + t * (ys[i] - ys[i - 1])


def _ramp_s0(lengths: list[float], rates: list[float]) -> float:
    """s0 of rate(s) = R s / (s + s0), by least squares on 1/rate = 1/R + (s0/R)(1/s)."""
    xs = [1.0 / s for s in lengths]
    ys = [1.0 / r for r in rates]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    intercept = my - slope * mx
    return max(slope / intercept, 0.0)


class _KernelCurves:
    """One library's published curves as fractions of peak: forward by head dimension, the backward's
    ratio to the forward where a backward table exists, the causal mask's ratio at head dim 128."""

    def __init__(self, entry: dict, lengths: list[float], peak: float):
        self.lengths = lengths
        self.forward = {int(d): [v / peak for v in vals] for d, vals in entry["forward"].items()}
        self.backward_ratio = {
            int(d): [b / peak / f for b, f in zip(vals, self.forward[int(d)])]
            for d, vals in entry["backward"].items()
        }
        f128 = self.forward[128]
        self.causal_ratio = [c / peak / f for c, f in zip(entry["causal_forward_128"], f128)]
        self.ramp_s0: dict[int, float] = {}  # set by _table: one per head dim, shared by the libraries

    def _forward_at(self, d: int, s: float) -> float:
        vals = self.forward[d]
        if s >= self.lengths[0]:
            return _interp_log(self.lengths, vals, s)
        s0, s_min = self.ramp_s0[d], self.lengths[0]  # below the grid: the ramp, met at its first length
        return vals[0] * (s / (s + s0)) / (s_min / (s_min + s0))

    def _ratio(self, table: list[float], s: float) -> float:
        return _interp_log(self.lengths[: len(table)], table, s)

    def forward_fraction(self, head_dim: int, s: float) -> float:
        return _across_head_dims(self.forward, head_dim, lambda d: self._forward_at(d, s))

    def backward_ratio_at(self, head_dim: int, s: float) -> float:
        return _across_head_dims(
            self.backward_ratio, head_dim, lambda d: self._ratio(self.backward_ratio[d], s)
        )


def _across_head_dims(tables: dict[int, object], head_dim: int, value) -> float:
    """``value(d)`` at ``head_dim``: at a published head dimension its own, between two log-interpolated
    in d, outside the nearer one's."""
    dims = sorted(tables)
    if head_dim <= dims[0]:
        return value(dims[0])
    if head_dim >= dims[-1]:
        return value(dims[-1])
    hi = next(d for d in dims if d >= head_dim)
    lo = max(d for d in dims if d <= head_dim)
    if lo == hi:
        return value(lo)
    t = (math.log(head_dim) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return value(lo) + t * (value(hi) - value(lo))


@lru_cache(maxsize=None)
def _table() -> tuple[dict[str, _KernelCurves], frozenset[str], float]:
    """The catalog's curves per library, the chips they were measured on, the dropout factor."""
    raw = catalog.attention_kernels()
    lengths = [float(x) for x in raw["lengths"]]
    peak = float(raw["peak_tflops"])
    curves = {name: _KernelCurves(e, lengths, peak) for name, e in raw["kernels"].items()}
    for d in next(iter(curves.values())).forward:
        s0 = sum(_ramp_s0(lengths, c.forward[d]) for c in curves.values()) / len(curves)
        for c in curves.values():
            c.ramp_s0[d] = s0
    return curves, frozenset(raw["chips"]), float(raw["dropout_rate_factor"])


def kernel_name(kernel: str) -> str:
    """The library's name, as the catalog gives it."""
    return str(catalog.attention_kernels()["kernels"][kernel]["name"])


def has_curves(chip: str) -> bool:
    """Whether published curves of fused attention kernels exist for this chip."""
    return chip in _table()[1]


def counted_flops(flops: float, shape: AttentionShape) -> float:
    """FlashAttention's count of a kernel group's FLOPs (the workload counts the full s x s product):
    half under a causal mask, whose masked key blocks the kernel skips."""
    return flops * (0.5 if shape.causal else 1.0)


@lru_cache(maxsize=4096)
def peak_fraction(kernel: str, shape: AttentionShape, dropout: bool) -> float:
    """The fraction of the chip's dense 16-bit peak the kernel reaches on this shape, on FlashAttention's
    FLOP count (``counted_flops``)."""
    curves, _, dropout_factor = _table()
    curve = curves[kernel]
    s = float(shape.seq_len)
    fraction = curve.forward_fraction(shape.head_dim, s)
    if shape.backward:
        fraction *= curve.backward_ratio_at(shape.head_dim, s)
    if shape.causal:
        fraction *= curve._ratio(curve.causal_ratio, s)
    if dropout:
        fraction *= dropout_factor
    return fraction
