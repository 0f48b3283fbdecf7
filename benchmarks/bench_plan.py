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


def _cli(args: list[str], tree: str | None = None) -> tuple[float, dict]:
    """Wall seconds and the JSON answer of one `clustersim plan` process (``tree``: import clustersim
    from that source tree instead); its CPU seconds (with its workers') are added to CPU[0], which says
    what the work costs on a machine others share too."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "clustersim.cli", "plan", *args, "--json"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": tree} if tree else os.environ,
        cwd=tree,  # `python -m` puts the working directory first on the path, before PYTHONPATH
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
    ap.add_argument(
        "--against",
        metavar="TREE",
        help="another source tree (e.g. main's checkout): its runs alternate with this tree's, so that "
        "both see the same load, and the per-pair ratios are printed",
    )
    ap.add_argument(
        "--against-args",
        default="",
        metavar="ARGS",
        help="more plan arguments for the --against tree's runs only, e.g. '--candidates FILE --cost "
        "own' (a grid the other tree held in a file)",
    )
    args = ap.parse_args()
    argv = ["--model", args.model, "--steps", args.steps, "--deadline", args.deadline]
    if args.samples is not None:
        argv += ["--samples", args.samples]
    if args.against:
        _interleaved(argv, args.against, args.runs, args.against_args.split())
        return
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


def _interleaved(argv: list[str], other: str, runs: int, other_args: list[str] = ()) -> None:
    """Runs of ``other``'s tree and this one's, alternating (the load on a shared machine moves between
    minutes, so pairs are compared, not two batches): medians, spreads and the per-pair ratio, and
    whether both chose the same candidate."""
    import statistics

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    old, new, ratios, cpu_old, cpu_new = [], [], [], [], []
    for _ in range(runs):
        c = CPU[0]
        t_old, r_old = _cli([*argv, *other_args], other)
        cpu_old.append(CPU[0] - c)
        c = CPU[0]
        t_new, r_new = _cli(argv, here)
        cpu_new.append(CPU[0] - c)
        old.append(t_old)
        new.append(t_new)
        ratios.append(t_new / t_old)
        same = (r_old["chosen"] or {}).get("cluster") == (r_new["chosen"] or {}).get("cluster")
        print(
            f"  pair: {other} {t_old:.2f} s ({cpu_old[-1]:.1f} s CPU), this tree {t_new:.2f} s "
            f"({cpu_new[-1]:.1f} s CPU), {t_new / t_old:.2f}x; same choice: {same}"
        )
    for name, ts, cpu in ((other, old, cpu_old), ("this tree", new, cpu_new)):
        print(
            f"{name}: wall median {statistics.median(ts):.2f} s (min {min(ts):.2f}, max {max(ts):.2f}, "
            f"n={runs}); CPU median {statistics.median(cpu):.2f} s (min {min(cpu):.2f}, max {max(cpu):.2f})"
        )
    print(
        f"wall ratio this/other: median {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
    )
    chosen = r_new["chosen"] and r_new["chosen"]["cluster"]
    print(f"this tree: {r_new['simulated']} simulated, {r_new['pruned']} pruned; chosen: {chosen}")


if __name__ == "__main__":
    main()
