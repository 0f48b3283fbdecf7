"""Time one `run` (scenario, topology, program, simulation) per case, old code against new, in one run.

    nice -n 19 .venv/bin/python benchmarks/bench_run.py [--baseline REF] [--pairs N]

Cases: each optimizer on the default preset (BERT-Large, 32 V100s; 0/1 Adam included), the offload
preset (LLaMA-7B, interleaved offload), GPT-3 175B on 128 H100s (memory check off: it does not fit
in 80 GB), and the default preset at 8 and 65,536 GPUs (the cost is flat in GPU count). A run is
timed in a warm process (imports done, catalogs loaded), from the preset name to the result; the
"cold caches" rows first clear the per-process caches of topologies, presets and workloads, as a
single `clustersim run` would see them (bench_cli.py times whole processes).

The baseline is the code before the speed work (issue #15) unless --baseline names another commit;
see _abtest.py for how old and new are interleaved. Columns: median ms per run of each, the median
of the per-pair ratios old/new and its 10th-90th percentile, then per side the simpy events of one
run, events per simulated op and microseconds of the whole run per event.
"""

from __future__ import annotations

import argparse

from _abtest import AB, DEFAULT_BASELINE, HEADER

CASES = [
    ("run", "default", "default / adam"),
    ("run", "default/sgdm", "default / sgdm"),
    ("run", "default/onebit-adam", "default / onebit-adam"),
    ("run", "default/zero-one-adam", "default / zero-one-adam"),
    ("run", "default/binsgdm", "default / binsgdm"),
    ("run", "offload-llama7b-h100", "offload-llama7b-h100"),
    ("gpt3-175b", None, "GPT-3 175B, 128 H100 (no mem check)"),
    ("cold", "default", "default / adam, cold caches"),
    ("cold", "offload-llama7b-h100", "offload, cold caches"),
    ("gpus", 8, "default / adam, 8 GPUs"),
    ("gpus", 65536, "default / adam, 65,536 GPUs"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default=DEFAULT_BASELINE, help="git commit to compare against")
    ap.add_argument("--pairs", type=int, default=31, help="old/new pairs of runs per case")
    args = ap.parse_args()
    ab = AB(args.baseline)
    try:
        print(f"one run, old = {args.baseline}, new = working tree; {args.pairs} interleaved pairs per case")
        print(HEADER)
        for case, arg, label in CASES:
            print(ab.compare(case, args.pairs, arg, label).line(), flush=True)
    finally:
        ab.close()


if __name__ == "__main__":
    main()
