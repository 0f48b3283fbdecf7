"""Time 3D-parallel runs at 3,072 GPUs (issue #12: "a 3,072-GPU 3D-parallel run <= 1 s on one core").

    nice -n 19 .venv/bin/python benchmarks/bench_3d.py [--repeats N]

New code only (the baseline of bench_run.py has no model parallelism). A run is timed in a warm
process from the scenario to the result, as bench_run.py does; the table gives the median and the
fastest of ``--repeats`` runs (wall clock), the median CPU time of the process (what "on one core"
means on a shared machine, where the wall clock also counts other processes' turns) and the number
of simulated ops (a pipeline program simulates every stage: about p x m x 2 passes, each a compute
op, a tensor-parallel op and a send).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's clustersim

from clustersim.scenario import load_scenario  # noqa: E402
from clustersim.simulator import simulate  # noqa: E402

PRESET = "preset:dgx-h100-gpt3-175b-3d"
CASES = [
    # (label, changes): layouts people run; 3,072 GPUs = 384 DGX nodes
    (
        "GPT-3 175B, 3,072 H100, t=8 p=16 d=24, m=64 (global batch 1,536)",
        {"cluster.nodes": 384, "training.parallelism.pipeline": 16, "workload.gradient_accumulation": 64},
    ),
    (
        "GPT-3 175B, 3,072 H100, t=8 p=8 d=48, m=32 (global batch 1,536)",
        {"cluster.nodes": 384},
    ),
    (
        "1T (Narayanan et al. Table 1), 3,072 A100, t=8 p=64 d=6, m=512",
        {
            "cluster.nodes": 384,
            "cluster.gpu": "A100-80GB",
            "workload.model": "Megatron-GPT-1T",
            "training.parallelism.pipeline": 64,
            "training.parallelism.sequence_parallel": False,
            "workload.gradient_accumulation": 512,
        },
    ),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    base = load_scenario(PRESET)
    print(f"{'case':70s} {'median s':>9s} {'best s':>8s} {'cpu s':>8s} {'ops':>8s}")
    for label, changes in CASES:
        scenario = base.with_changes(**changes)
        times, cpu = [], []
        for _ in range(args.repeats):
            r = None  # the previous run's result is freed before the clock starts, not inside it
            t0, c0 = time.perf_counter(), time.process_time()
            r = simulate(scenario)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        wall, best, on_core = statistics.median(times), min(times), statistics.median(cpu)
        print(f"{label:70s} {wall:9.3f} {best:8.3f} {on_core:8.3f} {len(r.ops):8d}", flush=True)


if __name__ == "__main__":
    main()
