"""Time `clustersim run` (scenario validation + topology + program + simulation) for BERT-Large
on the default cluster shape (4 GPUs per node) at growing GPU counts.

Run on one core for the README's table:  taskset -c 0 .venv/bin/python benchmarks/bench_run.py
Each size is timed from a cold cache (topology caches cleared), median of --repeat runs.
"""

from __future__ import annotations

import argparse
import statistics
import time

from clustersim.scenario import load_scenario
from clustersim.simulator import simulate
from clustersim.topologies.cluster import build_cluster

SIZES = (8, 64, 1024, 16384, 65536)


def time_one(gpus: int, optimizer: str) -> tuple[float, float]:
    build_cluster.cache_clear()
    t0 = time.perf_counter()
    scenario = (
        load_scenario("preset:default")
        .with_world_size(gpus)
        .with_changes(**{"training.optimizer": optimizer})
    )
    result = simulate(scenario)
    return time.perf_counter() - t0, result.iteration_time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--optimizers", default="adam")
    args = ap.parse_args()
    time_one(8, "adam")  # warm imports
    print(f"{'optimizer':<14}{'GPUs':>8}{'wall s (median)':>18}{'simulated iteration s':>24}")
    for optimizer in args.optimizers.split(","):
        for gpus in SIZES:
            runs = [time_one(gpus, optimizer) for _ in range(args.repeat)]
            print(
                f"{optimizer:<14}{gpus:>8}{statistics.median(r[0] for r in runs):>18.4f}{runs[0][1]:>24.4f}"
            )


if __name__ == "__main__":
    main()
