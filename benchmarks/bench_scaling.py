"""How the cost of a run grows with layers and with DDP buckets, old code against new, in one run.

    nice -n 19 .venv/bin/python benchmarks/bench_scaling.py [--baseline REF] [--pairs N]

A custom model of L identical layers (1M parameters each, fp16) on the default cluster (32 V100s, Adam +
DDP). First L grows at a 25 MB bucket cap (buckets grow with it), then L = 96 is fixed and the bucket
cap shrinks from one bucket to one per layer. Last, Megatron-LM's GPT configurations from 1.7B to 1T
parameters (Narayanan et al. SC'21) on 16 DGX H100 nodes, data parallel, memory check off. Columns: ops
simulated, median ms per run of each side, microseconds per op of each side's fastest run ("best"), the
median ratio old/new and its p10-p90. Linear cost means constant microseconds per op down each table.
"""

from __future__ import annotations

import argparse
import statistics

from _abtest import AB, DEFAULT_BASELINE
from cases import MODEL_SIZES

LAYERS = (12, 24, 48, 96, 192, 384, 768)
BUCKET_MB = (400.0, 100.0, 25.0, 6.25, 1.5625)


def _row(ab: AB, label: str, arg, pairs: int, case: str = "scaling") -> str:
    c = ab.compare(case, pairs, arg, label)
    old, new = statistics.median(c.old_s), statistics.median(c.new_s)
    lo, hi = c.spread()
    ops = c.new_info["ops"]
    # the curve's shape from each side's fastest run: other jobs on the machine only add time
    per_op = f"{min(c.old_s) / ops * 1e6:>10.1f}{min(c.new_s) / ops * 1e6:>10.1f}"
    return (
        f"{label:<28}{ops:>6}{old * 1e3:>10.2f}{new * 1e3:>10.2f}{per_op}"
        f"{statistics.median(c.ratios):>8.2f}x  [{lo:.2f}-{hi:.2f}]"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default=DEFAULT_BASELINE)
    ap.add_argument("--pairs", type=int, default=11)
    args = ap.parse_args()
    ab = AB(args.baseline)
    head = (
        f"{'':<28}{'ops':>6}{'old ms':>10}{'new ms':>10}{'old best':>10}{'new best':>10}"
        f"{'old/new':>9}  [p10-p90]"
    )
    try:
        print(f"old = {args.baseline}, new = working tree; {args.pairs} interleaved pairs per row")
        print("layers (25 MB buckets)")
        print(head)
        for n in LAYERS:
            print(_row(ab, f"{n} layers", (n, 25.0), args.pairs), flush=True)
        print("buckets (96 layers of 2 MB)")
        print(head)
        for mb in BUCKET_MB:
            print(_row(ab, f"bucket cap {mb:g} MB", (96, mb), args.pairs), flush=True)
        print("model size (Megatron GPT configurations, 25 MB buckets)")
        print(head)
        for name, (layers, hidden) in MODEL_SIZES.items():
            label = f"{name} ({layers} x h={hidden})"
            print(_row(ab, label, name, args.pairs, "model-size"), flush=True)
    finally:
        ab.close()


if __name__ == "__main__":
    main()
