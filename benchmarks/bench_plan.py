"""Time `clustersim plan` as a user runs it (a whole process), and check that pruning keeps the choice.

    nice -n 5 .venv/bin/python benchmarks/bench_plan.py [--runs N] [--model M --steps S --deadline D]

Default: `plan --model GPT-3-175B --steps 100000 --deadline 60d --json` (the target: within 5 s on a
2-core machine), then once more in-process with pruning off and one worker, to print what pruning and
the second core save and that the chosen candidate is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _cli(args: list[str]) -> tuple[float, dict]:
    """Wall seconds and the JSON answer of one `clustersim plan` process; its CPU seconds (with its
    workers') are added to CPU[0], which says what the work costs on a machine others share too."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "clustersim.cli", "plan", *args, "--json"],
        check=True,
        capture_output=True,
        text=True,
        env=os.environ,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU[0] += after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return time.perf_counter() - t, json.loads(out.stdout)


CPU = [0.0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="GPT-3-175B")
    ap.add_argument("--steps", default="100000")
    ap.add_argument("--deadline", default="60d")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--samples", default=None, help="plan --samples (default: the command's)")
    ap.add_argument("--no-reference", action="store_true", help="skip the unpruned one-core run")
    args = ap.parse_args()
    argv = ["--model", args.model, "--steps", args.steps, "--deadline", args.deadline]
    if args.samples is not None:
        argv += ["--samples", args.samples]
    times = []
    for _ in range(args.runs):
        elapsed, result = _cli(argv)
        times.append(elapsed)
    chosen = result["chosen"]
    each = ", ".join(f"{t:.1f}" for t in times)
    print(f"plan {' '.join(argv)}: {min(times):.1f} s best of {args.runs} ({each})")
    print(f"  CPU {CPU[0] / args.runs:.1f} s per run (the process and its workers; the wall time above is")
    print("  what two free cores give at best when it is about half of this)")
    where = chosen and chosen["cluster"]
    print(f"  {result['simulated']} simulated, {result['pruned']} pruned; chosen: {where}")
    if args.no_reference:
        return
    from clustersim.planner.planning import plan
    from clustersim.report.build import parse_duration

    t = time.perf_counter()
    hours = parse_duration(args.deadline)
    ref = plan(args.model, args.steps, hours, None, None, None, None, workers=1, prune=False)
    print(f"  unpruned, one core (in-process): {time.perf_counter() - t:.1f} s, {ref['simulated']} simulated")
    same = (ref["chosen"] or {}).get("cluster") == (chosen or {}).get("cluster")
    print(f"  same choice: {same} ({ref['chosen'] and ref['chosen']['cluster']})")


if __name__ == "__main__":
    main()
