"""Time whole `clustersim` processes (interpreter start, imports, catalogs, the command), old code
against new, in one run.

    nice -n 19 .venv/bin/python benchmarks/bench_cli.py [--baseline REF] [--pairs N]

Commands: `--help` (start-up alone), `presets list` (issue #13: both within 0.3 s),
`run preset:default --samples 0 --json` (one simulation), and
`run preset:default --json` (with its default P10-P90 band: 16 more simulations). See _abtest.py.
"""

from __future__ import annotations

import argparse

from _abtest import AB, DEFAULT_BASELINE, HEADER

COMMANDS = [
    (["--help"], "clustersim --help"),
    (["presets", "list"], "clustersim presets list"),
    (["run", "preset:default", "--samples", "0", "--json"], "run preset:default --samples 0"),
    (["run", "preset:default", "--json"], "run preset:default (16 draws)"),
    (["run", "preset:offload-llama7b-h100", "--samples", "0", "--json"], "run offload preset --samples 0"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default=DEFAULT_BASELINE)
    ap.add_argument("--pairs", type=int, default=9)
    args = ap.parse_args()
    ab = AB(args.baseline)
    try:
        print(f"old = {args.baseline}, new = working tree; {args.pairs} interleaved pairs per command")
        print(HEADER)
        for argv, label in COMMANDS:
            print(ab.compare("cli", args.pairs, argv, label, warm=False).line(), flush=True)
    finally:
        ab.close()


if __name__ == "__main__":
    main()
