"""Run a sweep on Dask: in-process by default, or on an existing cluster with --scheduler.

Rows are batched into tasks (simulations take milliseconds, a task's overhead about as much). The
client writes each batch's rows to disk as soon as its task finishes, so a worker that dies loses
only its own batch, which Dask reschedules; an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from clustersim.errors import InputError
from clustersim.sweeps.spec import Sweep, resolve_row, row_id
from clustersim.sweeps.store import ResultsFolder

CRASH_ENV = "CLUSTERSIM_TEST_CRASH_ONCE"  # tests: path of a marker file; the first task to see it dies


def simulate_row(
    base_json: dict,
    values: dict[str, Any],
    steps: int | None,
    warmup: float | None,
    global_batch: int | None = None,
    samples: int = 0,
) -> dict[str, Any]:
    """One row: resolve, simulate, summarize. Never raises for bad combinations; records them.
    ``samples`` > 0 adds the P10/P90 of the iteration time and time-to-train (simulator/uncertainty.py)."""
    from clustersim.compare import mean_step_time
    from clustersim.scenario import validate_scenario
    from clustersim.simulator import simulate
    from clustersim.simulator.strategies import registry

    rec: dict[str, Any] = {"row_id": row_id(values), **values}
    try:
        base = validate_scenario(base_json, source="base")
        scenario = resolve_row(base, values, steps, global_batch)
        r, scenario = _simulate_fitting(scenario, adapt=global_batch is not None, samples=samples)
        rec["scenario"] = scenario.model_dump(mode="json")
        b = r.breakdown
        c = scenario.cluster
        rec.update(
            {
                "status": "ok",
                "error": "",
                "world_size": r.world_size,
                "nodes": r.nodes,
                "gpus_per_node": r.gpus_per_node,
                "gpu": c.gpu_name,
                "model": scenario.workload.model or "custom",
                "optimizer": r.optimizer,
                "nic_kind": c.nic.kind,
                "nic_gbps": c.nic.line_rate_gbps,
                "nic_effective_gbps": c.nic.effective_gbps,
                "iteration_time_s": r.iteration_time,
                "samples_per_s": r.samples_per_s,
                "forward_s": b["forward"],
                "backward_s": b["backward"],
                "compression_s": b["compression"],
                "optimizer_s": b["optimizer"],
                "other_s": b["other"],
                "exposed_communication_s": b["exposed_communication"]
                + b["exposed_transfer"]
                + b["exposed_host"],
                "intra_node_bytes": r.bytes_per_link_kind["intra_node_per_node"],
                "inter_node_bytes": r.bytes_per_link_kind["inter_node_per_node"],
                "gpu_memory_bytes": r.memory["total"],
                "micro_batch_used": scenario.workload.micro_batch,
                "global_batch": r.samples_per_iteration,
            }
        )
        warm_opts = registry.get(r.optimizer).warmup_options(scenario.training.optimizer_options)
        if warm_opts is not None:
            warm = simulate(scenario.with_changes(**{"training.optimizer_options": warm_opts}))
            rec["warmup_iteration_time_s"] = warm.iteration_time
        per_step = mean_step_time(r.optimizer, r.iteration_time, rec.get("warmup_iteration_time_s"), warmup)
        if r.interval is not None:
            rec["iteration_time_p10_s"], rec["iteration_time_p90_s"] = r.interval.p10, r.interval.p90
        if steps:
            rec["steps"] = steps
            rec["time_to_train_s"] = steps * per_step
            rec["gpu_hours"] = rec["time_to_train_s"] / 3600 * r.world_size
            if r.interval is not None:  # the band scales the mean step as it scales the iteration
                rec["time_to_train_p10_s"] = rec["time_to_train_s"] * r.interval.p10 / r.iteration_time
                rec["time_to_train_p90_s"] = rec["time_to_train_s"] * r.interval.p90 / r.iteration_time
    except InputError as exc:
        rec.update({"status": "invalid", "error": str(exc)})
    return rec


def _simulate_fitting(scenario, adapt: bool, samples: int = 0):
    """Simulate; with a fixed global batch, halve the micro-batch (accumulating more) until it fits."""
    from clustersim.simulator import simulate

    while True:
        try:
            return simulate(scenario, uncertainty_samples=samples), scenario
        except InputError as exc:
            w = scenario.workload
            if not adapt or "does not fit in GPU memory" not in exc.message or w.micro_batch == 1:
                raise
            mb = w.micro_batch // 2
            share = w.micro_batch * w.gradient_accumulation
            while share % mb:
                mb -= 1
            scenario = scenario.with_changes(
                **{"workload.micro_batch": mb, "workload.gradient_accumulation": share // mb}
            )


def simulate_batch(
    base_json: dict,
    batch: list[dict[str, Any]],
    steps,
    warmup,
    global_batch=None,
    samples: int = 0,
    catalogs: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """Rows on a Dask worker (a thread or another process), with the sweep's user catalogs in use."""
    from clustersim.catalog import user_catalogs

    marker = os.environ.get(CRASH_ENV)
    if marker and os.path.exists(marker):
        os.unlink(marker)
        os._exit(1)  # a worker process dying mid-sweep (tests only)
    with user_catalogs(catalogs):
        return [simulate_row(base_json, values, steps, warmup, global_batch, samples) for values in batch]


def open_client(scheduler: str | None, workers: int):
    from dask.distributed import Client, LocalCluster

    if scheduler:
        try:
            return Client(scheduler, timeout=os.environ.get("CLUSTERSIM_SCHEDULER_TIMEOUT", "10s")), None
        except (OSError, TimeoutError, ValueError) as exc:
            raise InputError(
                f"cannot reach the Dask scheduler at {scheduler}: {str(exc).splitlines()[0][:120]}",
                key="--scheduler",
            ) from None
    cluster = LocalCluster(
        n_workers=1, threads_per_worker=max(1, workers), processes=False, dashboard_address=":0"
    )
    return Client(cluster), cluster


def run_sweep(
    sweep: Sweep,
    out,
    scheduler: str | None = None,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
    batch_size: int | None = None,
    stop_after: int | None = None,
) -> dict[str, int]:
    """Run the rows not yet in ``out``. ``stop_after`` (tests) stops after that many rows are written."""
    folder = ResultsFolder(out, sweep)
    with folder.locked():
        return run_locked(sweep, folder, scheduler, workers, progress, batch_size, stop_after)


def run_locked(
    sweep: Sweep,
    folder: ResultsFolder,
    scheduler: str | None = None,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
    batch_size: int | None = None,
    stop_after: int | None = None,
) -> dict[str, int]:
    """run_sweep on a folder the caller holds (``ResultsFolder.locked()``)."""
    done = folder.open()
    rows = [r for r in sweep.rows() if row_id(r) not in done]
    total = len(sweep.rows())
    counts = {"total": total, "skipped": total - len(rows), "written": 0}
    if progress:
        progress(counts["skipped"], total)
    if not rows:
        return counts
    from dask.distributed import as_completed

    client, cluster = open_client(scheduler, workers)
    try:
        n_workers = max(1, len(client.scheduler_info().get("workers", {})))
        size = batch_size or max(1, min(25, len(rows) // (4 * n_workers) or 1))
        base_json = sweep.base.model_dump(mode="json")
        batches = [rows[i : i + size] for i in range(0, len(rows), size)]
        futures = [
            client.submit(
                simulate_batch,
                base_json,
                b,
                sweep.spec.steps,
                sweep.spec.warmup,
                sweep.spec.global_batch,
                sweep.spec.samples,
                sweep.catalogs,
                pure=False,
            )
            for b in batches
        ]
        for fut in as_completed(futures):
            records = fut.result()
            folder.append(records)
            counts["written"] += len(records)
            if progress:
                progress(counts["skipped"] + counts["written"], total)
            if stop_after is not None and counts["written"] >= stop_after:
                for f in futures:
                    f.cancel()
                break
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return counts
