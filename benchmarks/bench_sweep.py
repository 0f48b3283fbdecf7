"""Time a 1,000-row sweep (BERT-Large, 8-1,024 GPUs x 5 NIC rates x 5 optimizers x 5 micro-batches,
each row with its P10-P90 band) with the default executor (the old code: an in-process Dask cluster;
the new: a plain loop), old code against new.

    nice -n 19 .venv/bin/python benchmarks/bench_sweep.py [--baseline REF] [--pairs N]

Each pair runs the whole sweep once with the old code and once with the new (order alternating),
after one untimed sweep of each that checks they write the same number of rows; see _abtest.py.
Each sweep starts from an empty results folder. Every row also draws its P10-P90 band (8 draws),
so a row is 9 simulations.
"""

from __future__ import annotations

import argparse

from _abtest import AB, DEFAULT_BASELINE, HEADER


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default=DEFAULT_BASELINE)
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
