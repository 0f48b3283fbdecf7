"""Seconds per simulated iteration with the flow network backend at 1,024 and 16,384 GPUs.

    nice -n 19 .venv/bin/python benchmarks/bench_flow.py [--gpus 1024 16384] [--repeats 3]

The case: the DGX H100 preset (GPT-3 1.3B, Adam + DDP, 8 x NDR per node) on a leaf-spine of 32-node
leaves, scaled to each GPU count, ``training.network: flow``. A run builds its own backend, so every
collective pattern is simulated afresh (the analytical preset at the same size is timed beside it).
Issue #11's targets: <= 2 s per iteration at 1,024 GPUs and <= 30 s at 16,384 on one core. Not a
timed test: timings on a shared machine vary; report the median of the repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time

from clustersim.scenario import load_scenario
from clustersim.simulator import simulate


def scenario(gpus: int, network: str):
    s = load_scenario("preset:dgx-h100-gpt3-1.3b").with_world_size(gpus)
    return s.with_changes(**{"training.network": network})


def timed(gpus: int, network: str, repeats: int) -> tuple[float, float]:
    times, result = [], None
    for _ in range(repeats):
        s = scenario(gpus, network)
        t0 = time.perf_counter()
        result = simulate(s)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result.iteration_time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, nargs="+", default=[1024, 16384])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print("GPUs     backend      wall s/iteration  simulated iteration ms")
    for gpus in args.gpus:
        for network in ("analytical", "flow"):
            wall, it = timed(gpus, network, args.repeats)
            print(f"{gpus:<8} {network:<12} {wall:>16.3f}  {it * 1e3:>22.2f}", flush=True)


if __name__ == "__main__":
    main()
