"""Time and peak memory of each count a user can type, small to absurd (docs/scale-limits.md).

    nice -n 19 .venv/bin/python benchmarks/bench_counts.py [--only NAME] [--timeout S]

Every case runs in a fresh process (peak memory is that process's maximum resident set, imports
included: about 60 MB of it is numpy, scipy, pydantic and the catalogs), and prints its wall time,
its peak memory and what it returned: the result, or the one-line refusal and the key it names.
A count whose cost does not grow (extrapolated or counted) shows flat rows; a count with a limit
shows rows that grow up to it and a refusal past it that costs no more than a small run. The tests
hold results and op counts (tests/test_simulation.py, test_optimizers.py, ...); this file is where
the time and the memory are measured, never asserted.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each case: (count, value label, python code run in a fresh process that prints one line).
_RUN = """
import resource, sys
from clustersim.errors import InputError
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate
try:
    s = load_scenario({preset!r}).with_changes(**{changes!r})
    r = simulate(s, uncertainty_samples={samples})
    out = f"ok: {{r.iteration_time:.6g}} s per iteration, {{len(r.ops):,}} ops recorded"
except InputError as exc:
    out = f"refused ({{exc.key}}): {{exc.message[:90]}}"
print(out)
"""

_FIT = """
import numpy as np
from clustersim.calibration.fit import fit_segments
S = np.logspace(3, 10, {n})
noise = 1 + 0.02 * np.random.default_rng(0).standard_normal({n})
t = np.where(S < 1e6, 5e-6 + S / 5e9, 2e-5 + S / 2e10) * noise
print(f"ok: {{len(fit_segments(S, t)[0])}} segments")
"""

_SWEEP = """
from clustersim.errors import InputError
from clustersim.sweeps.spec import load_sweep
try:
    print(f"ok: {{len(load_sweep({path!r}).rows()):,}} rows")
except InputError as exc:
    print(f"refused ({{exc.key}}): {{exc.message[:90]}}")
"""

_CLI = """
import sys
from typer.testing import CliRunner
from clustersim.cli import app
r = CliRunner().invoke(app, {args!r})
print(("ok: " if r.exit_code == 0 else f"exit {{r.exit_code}}: ") + r.output.strip().splitlines()[-1][:100])
"""


def _run(preset: str, changes: dict, samples: int = 0) -> str:
    return _RUN.format(preset=preset, changes=changes, samples=samples)


def _sweep_file(tmp: Path, name: str, vary_yaml: str) -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(f"name: {name}\nbase: preset:default\nvary:\n{vary_yaml}")
    return str(path)


def cases(tmp: Path) -> list[tuple[str, str, str]]:
    default, dgx, three_d = "preset:default", "preset:dgx-h100-gpt3-1.3b", "preset:dgx-h100-gpt3-175b-3d"
    out: list[tuple[str, str, str]] = []
    for m in (1, 100, 10_000, 1_000_000):
        out.append(
            ("gradient_accumulation (DDP)", f"{m:,}", _run(default, {"workload.gradient_accumulation": m}))
        )
    for m in (10, 100, 1_000, 100_000):
        zero2 = {"workload.gradient_accumulation": m, "training.sharding": {"stage": 2}}
        out.append(("gradient_accumulation (ZeRO-2)", f"{m:,}", _run(default, zero2)))
    for m in (32, 320, 3_200, 1_000_000):
        out.append(("pipeline micro-batches", f"{m:,}", _run(three_d, {"workload.gradient_accumulation": m})))
    for m in (32, 320):
        out.append(
            (
                "pipeline micro-batches, --samples 16",
                f"{m:,}",
                _run(three_d, {"workload.gradient_accumulation": m}, 16),
            )
        )
    layer = {"name": "l", "params": 1000, "forward_flops": 1e9}
    for n in (10, 10_000, 100_000_000):
        custom = {"workload.model": None, "workload.layers": [{**layer, "repeat": n}]}
        out.append(("layers[].repeat", f"{n:,}", _run(default, custom)))
    for g in (1, 1_000, 1_000_000):
        onebit = {
            "training.optimizer": "onebit-adam",
            "training.optimizer_options": {"param_groups": g, "stage": "compression"},
        }
        out.append(("1-bit Adam param_groups", f"{g:,}", _run(default, onebit)))
    for f in (1, 1_000, 1_000_000_000):
        bg = {
            "cluster.nodes": 2,
            "training.network": "flow",
            "cluster.heterogeneity": {"background": [{"links": "nics", "flows_per_link": f}]},
        }
        out.append(("background.flows_per_link", f"{f:,}", _run(dgx, bg)))
    for steps in (100_000, 10**12, 10**18):
        zo = {"training.optimizer": "zero-one-adam", "training.optimizer_options": {"total_steps": steps}}
        out.append(("0/1 Adam total_steps", f"{steps:.0e}", _run(default, zo)))
    for steps in ("100000", "1000000000000000000000000"):
        out.append(
            (
                "compare --steps",
                steps if len(steps) < 10 else "1e24",
                _CLI.format(args=["compare", default, "--steps", steps, "--samples", "0"]),
            )
        )
    for nodes in (64, 512, 4096, 131072):
        flow = {"cluster.nodes": nodes, "cluster.fabric.leaves_per_pod": 64, "training.network": "flow"}
        out.append(("flow backend nodes (x8 GPUs)", f"{nodes:,}", _run(dgx, flow)))
    for n in (30, 300, 2_000):
        out.append(("calibrate fit sizes", f"{n:,}", _FIT.format(n=n)))
    axes = [
        "gpus",
        "nic_gbps",
        "micro_batch",
        "seq_len",
        "nic_count",
        "oversubscription",
        "nic_effective_gbps",
        "gpus_per_node",
    ]
    for k in (2, 3, 8):
        vary = "".join(f"  {a}: [{', '.join(str(i + 1) for i in range(40))}]\n" for a in axes[:k])
        out.append(
            (
                "sweep rows (40 values per axis)",
                f"40^{k}",
                _SWEEP.format(path=_sweep_file(tmp, f"rows{k}", vary)),
            )
        )
    nested = "[8, 8, 8, 8, 8, 8, 8, 8, 8, 8]"
    for i in range(9):
        nested = "[" + ", ".join([f"&b{i} {nested}"] + [f"*b{i}"] * 9) + "]"
    bomb = _sweep_file(tmp, "bomb", f"  micro_batch: {nested}\n")
    out.append(("sweep vary alias bomb", "10^10 values", _SWEEP.format(path=bomb)))
    return out


def measure(code: str, timeout: float) -> tuple[float, float, str]:
    """Wall seconds, peak resident MB and the printed line of ``code`` in a fresh interpreter."""
    wrapper = (
        "import resource, runpy, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        f"exec(compile({code!r}, 'case', 'exec'))\n"
        "print('@peak', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-c", wrapper], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, float("nan"), f"timed out after {timeout:.0f} s"
    wall = time.perf_counter() - t0
    lines = done.stdout.strip().splitlines()
    peak = next((int(x.split()[1]) / 1024 for x in lines if x.startswith("@peak")), float("nan"))
    said = next(
        (x for x in lines if not x.startswith("@peak")), done.stderr.strip().splitlines()[-1:] or ["?"]
    )
    return wall, peak, said if isinstance(said, str) else said[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="run the cases whose count contains this text")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per case (default 300)")
    ap.add_argument("--json", action="store_true", help="one JSON object per case instead of a table")
    args = ap.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        todo = [c for c in cases(Path(tmp)) if not args.only or args.only in c[0]]
        if not args.json:
            print(f"{'count':38} {'value':>14} {'wall s':>8} {'peak MB':>8}  result")
        for count, value, code in todo:
            wall, peak, said = measure(code, args.timeout)
            if args.json:
                print(
                    json.dumps(
                        {"count": count, "value": value, "wall_s": wall, "peak_mb": peak, "result": said}
                    )
                )
            else:
                print(f"{count:38} {value:>14} {wall:8.2f} {peak:8.0f}  {said}", flush=True)


if __name__ == "__main__":
    main()
