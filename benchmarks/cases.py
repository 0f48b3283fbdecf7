"""The benchmark cases, and the worker loop that runs them (``python cases.py --serve``, started by
_abtest.py). Cases use only the public API that the baseline commit has too, so the same function
times the old and the new code."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _scenario(name: str, optimizer: str | None = None):
    from clustersim.scenario import load_scenario

    s = load_scenario(f"preset:{name}")
    return s.with_changes(**{"training.optimizer": optimizer}) if optimizer else s


def run_preset(arg):
    """One `run` in a warm process: load the preset (and change the optimizer), simulate."""
    from clustersim.simulator import simulate

    name, optimizer = (arg.split("/") + [None])[:2]
    return simulate(_scenario(name, optimizer)).iteration_time


# Per-process caches of scenario-derived objects, in either version (those a version lacks are skipped).
_COLD = (
    ("clustersim.topologies.cluster", "build_cluster"),
    ("clustersim.scenario", "_preset"),
    ("clustersim.workloads.builder", "_catalog_workload"),
)


def run_cold(arg):
    """`run_preset` with the topology, preset and workload caches cleared first, as in a fresh process
    (the catalogs stay loaded: both versions parse them once per process)."""
    import importlib

    for module, name in _COLD:
        fn = getattr(importlib.import_module(module), name, None)
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()
    clusters = getattr(importlib.import_module("clustersim.topologies.cluster"), "_CLUSTERS", None)
    if clusters is not None:  # build_cluster's cache became a dict (no cache_clear) after the speed work
        clusters.clear()
    return run_preset(arg)


def run_gpus(arg):
    """The default preset (Adam) scaled to ``arg`` GPUs."""
    from clustersim.simulator import simulate

    return simulate(_scenario("default").with_world_size(arg)).iteration_time


def run_gpt3_175b(arg=None):
    """GPT-3 175B on 16 DGX H100 nodes; it does not fit in 80 GB, so the memory check is off."""
    from unittest import mock

    from clustersim.simulator import runner, simulate

    s = _scenario("dgx-h100-gpt3-1.3b").with_changes(**{"workload.model": "GPT-3-175B"})
    with mock.patch.object(runner, "check_fits", lambda ctx, mem: None):
        return simulate(s).iteration_time


def run_scaling(arg):
    """A custom model of ``layers`` identical layers, with DDP buckets of ``bucket_mb``: cost vs size."""
    from clustersim.simulator import simulate

    layers, bucket_mb = arg
    layer = {"name": "mlp", "params": 1_000_000, "forward_flops": 2e9, "forward_bytes": 0, "repeat": layers}
    s = _scenario("default").with_changes(
        **{"workload.model": None, "workload.layers": [layer], "training.ddp_bucket_cap_mb": bucket_mb}
    )
    return simulate(s).iteration_time


# Megatron-LM's GPT configurations (Narayanan et al., SC'21, Table 1): (layers, hidden size) of the
# 1.7B, 18B, 175B and 1T models; 12*h^2 parameters per transformer block.
MODEL_SIZES = {"1.7B": (24, 2304), "18B": (40, 6144), "175B": (96, 12288), "1T": (128, 25600)}


def run_model_size(arg):
    """A GPT block stack of Megatron's ``arg`` configuration on 16 DGX H100 nodes, data parallel, memory
    check off (the large ones do not fit without sharding): cost vs model size up to 1T parameters."""
    from unittest import mock

    from clustersim.simulator import runner, simulate

    layers, h = MODEL_SIZES[arg]
    block = {
        "name": "block",
        "params": 12 * h * h,
        "forward_flops": 2 * 12 * h * h * 2048,  # 2 FLOPs per parameter per token, 2,048 tokens
        "forward_bytes": 0,
        "repeat": layers,
    }
    s = _scenario("dgx-h100-gpt3-1.3b").with_changes(**{"workload.model": None, "workload.layers": [block]})
    with mock.patch.object(runner, "check_fits", lambda ctx, mem: None):
        return simulate(s).iteration_time


def sweep_row_seconds(n: int = 50) -> float:
    """Mean seconds per row of the 1,000-row sweep (with its band), over ``n`` rows drawn at random
    (fixed seed), in this warm process: the "single-run time" of issue #15's sweep target."""
    import random

    import yaml

    from clustersim.sweeps.run import simulate_row
    from clustersim.sweeps.spec import load_sweep

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sweep.yaml"
        path.write_text(yaml.safe_dump(SWEEP))
        sweep = load_sweep(path)
    rows = random.Random(1).sample(sweep.rows(), n + 5)
    base, spec = sweep.base.model_dump(mode="json"), sweep.spec
    args = (spec.steps, spec.warmup, spec.global_batch, spec.samples)
    for values in rows[:5]:  # warm the per-process caches, as a long sweep's worker has them
        simulate_row(base, values, *args)
    t0 = time.perf_counter()
    for values in rows[5:]:
        simulate_row(base, values, *args)
    return (time.perf_counter() - t0) / n


SWEEP = {
    "name": "bench-1000",
    "base": "preset:default",
    "vary": {
        "gpus": [8, 16, 32, 64, 128, 256, 512, 1024],  # 8
        "nic_gbps": [10, 25, 40, 100, 200],  # 5
        "optimizer": ["adam", "onebit-adam", "zero-one-adam", "binsgdm", "sgdm"],  # 5
        "micro_batch": [8, 16, 32, 64, 128],  # 5 -> 1,000 rows
    },
    "steps": 100000,
}


def run_sweep(arg=None):
    """A 1,000-row sweep (BERT-Large, 8-1,024 GPUs x 5 NIC rates x 5 optimizers x 5 micro-batches)
    with the sweep runner's default executor."""
    import shutil

    import yaml

    from clustersim.sweeps.run import run_sweep as sweep
    from clustersim.sweeps.spec import load_sweep

    tmp = Path(tempfile.mkdtemp())
    try:
        (tmp / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))
        return float(sweep(load_sweep(tmp / "sweep.yaml"), tmp / "out")["written"])
    finally:
        shutil.rmtree(tmp)


def run_cli(arg):
    """A whole `clustersim ...` process: interpreter start, imports, the command."""
    code = "import sys; from clustersim.cli import main; sys.argv[0] = 'clustersim'; main()"
    out = subprocess.run([sys.executable, "-c", code, *arg], capture_output=True, text=True, check=True)
    if "--json" in arg:
        return json.loads(out.stdout)["iteration_time_s"]
    return float(len(out.stdout) > 0)


CASES = {
    "run": run_preset,
    "cold": run_cold,
    "gpus": run_gpus,
    "gpt3-175b": run_gpt3_175b,
    "scaling": run_scaling,
    "model-size": run_model_size,
    "sweep": run_sweep,
    "cli": run_cli,
}


def _count_events(fn, arg) -> dict:
    """Run once with simpy's event loop and the engine instrumented: events processed, ops simulated."""
    import simpy.core

    from clustersim.simulator.engine import Engine

    counts = {"events": 0, "ops": 0}
    step, run = simpy.core.Environment.step, Engine.run

    def counting_step(env):
        counts["events"] += 1
        return step(env)

    def counting_run(engine):
        counts["ops"] += len(engine.program.ops)
        return run(engine)

    simpy.core.Environment.step, Engine.run = counting_step, counting_run
    try:
        result = fn(arg)
    finally:
        simpy.core.Environment.step, Engine.run = step, run
    return {"result": result, **counts}


def serve() -> None:
    for line in sys.stdin:
        msg = json.loads(line)
        fn = CASES.get(msg.get("case"))
        arg = msg.get("arg")
        if msg["cmd"] == "where":
            import clustersim

            out = {"file": str(Path(clustersim.__file__).resolve())}
        elif msg["cmd"] == "info":
            out = _count_events(fn, arg) if msg["case"] not in ("sweep", "cli") else {"result": fn(arg)}
        else:
            times = []
            for _ in range(msg["repeat"]):
                t0 = time.perf_counter()
                fn(arg)
                times.append(time.perf_counter() - t0)
            # The least-disturbed of the round's runs: on a shared machine a run is only ever slowed.
            out = {"best_s": min(times), "median_s": statistics.median(times)}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__" and "--serve" in sys.argv:
    os.environ.setdefault("PYTHONHASHSEED", "0")
    serve()
