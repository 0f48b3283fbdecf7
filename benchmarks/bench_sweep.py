"""Time a 1,000-row sweep (BERT-Large, 8-1,024 GPUs x 5 NIC rates x 5 optimizers x 5 micro-batches,
each row with its P10-P90 band) with the default executor (the old code: an in-process Dask cluster;
the new: a plain loop), old code against new.

    nice -n 19 .venv/bin/python benchmarks/bench_sweep.py [--baseline REF] [--pairs N]

Each pair runs the whole sweep once with the old code and once with the new (order alternating),
after one untimed sweep of each that checks they write the same number of rows; see _abtest.py.
Each sweep starts from an empty results folder. Every row also draws its P10-P90 band (8 draws),
so a row is 9 simulations.

Then issue #15's target, on the working tree alone: the same sweep as a user runs it
(`clustersim sweep FILE --out DIR`, default settings: every core), against rows x single-row time /
cores, the single-row time measured in this process just before (50 rows at random, warm caches).
Each repeat measures both, so a busy moment shows in both; the ratio's median and spread are printed
(target: at most 1.3), also against the row time measured with every core busy. ``--target-only``
skips the old-vs-new part.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from _abtest import AB, DEFAULT_BASELINE, HEADER
from cases import SWEEP, sweep_row_seconds


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _row_seconds_all_cores(cores: int) -> float:
    """Seconds per row when ``cores`` processes measure it at once: what one core delivers while every
    core works. On the 2-vCPU development machine two processes each ran 1.4x slower than one alone
    (shared caches and memory bandwidth), so rows x (row alone) / cores is not reachable there."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from cases import sweep_row_seconds; print(sweep_row_seconds())"
    )
    here = str(Path(__file__).resolve().parent)
    procs = [
        subprocess.Popen([sys.executable, "-c", code, here], stdout=subprocess.PIPE, text=True)
        for _ in range(cores)
    ]
    return statistics.mean(float(p.communicate()[0]) for p in procs)


def target(repeats: int) -> None:
    """The default sweep through the CLI vs rows x single-row time / cores, ``repeats`` times; the
    single-row time measured alone (the issue's definition) and with every core busy."""
    rows, cores = 1000, _cores()
    alone_ratios, busy_ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sweep.yaml"
        path.write_text(yaml.safe_dump(SWEEP))
        for i in range(repeats):
            alone = sweep_row_seconds()
            busy = _row_seconds_all_cores(cores)
            t0 = time.perf_counter()
            cmd = [sys.executable, "-m", "clustersim.cli", "sweep", str(path), "--out", f"{tmp}/out{i}"]
            subprocess.run(cmd, check=True, capture_output=True)
            real = time.perf_counter() - t0
            alone_ratios.append(real / (alone * rows / cores))
            busy_ratios.append(real / (busy * rows / cores))
            print(
                f"  {rows} rows on {cores} cores: {real:.1f} s; one row {alone * 1e3:.1f} ms alone "
                f"(ratio {alone_ratios[-1]:.2f}), {busy * 1e3:.1f} ms with every core busy "
                f"(ratio {busy_ratios[-1]:.2f})",
                flush=True,
            )
    for label, ratios in (("row alone", alone_ratios), ("row, every core busy", busy_ratios)):
        lo, hi = min(ratios), max(ratios)
        print(f"sweep / (rows x {label} / cores): median {statistics.median(ratios):.2f} [{lo:.2f}-{hi:.2f}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default=DEFAULT_BASELINE)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="repeats of the target check")
    ap.add_argument("--target-only", action="store_true", help="skip the old-vs-new comparison")
    args = ap.parse_args()
    if args.target_only:
        target(args.repeats)
        return
    ab = AB(args.baseline)
    try:
        print(f"old = {args.baseline}, new = working tree; {args.pairs} interleaved pairs")
        print(HEADER)
        c = ab.compare("sweep", args.pairs, None, "1,000-row sweep (default executor)", warm=False)
        print(c.line())
        best = min(c.new_s)
        rows = c.new_info["result"]
        print(f"new: {rows:.0f} rows in {best:.1f} s at best ({1000 * best / rows:.1f} ms per row)")
    finally:
        ab.close()
    target(args.repeats)


if __name__ == "__main__":
    main()
