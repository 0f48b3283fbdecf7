"""Run a sweep: on this machine's cores by default (worker processes), or on a Dask cluster with
--scheduler.

Rows are batched into tasks (simulations take milliseconds, a task's overhead about as much). Each
batch's rows are written to disk as soon as its task finishes, so a worker that dies loses only its
own batch (Dask reschedules it; the local pool's lost batches are run again in this process); an
interrupted sweep resumes where it stopped. The simulation is pure Python and holds the interpreter
lock, so local parallelism needs processes, not threads.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from clustersim.errors import InputError
from clustersim.planner.compare import fit_micro_batch
from clustersim.sweeps.spec import Sweep, resolve_row, row_id
from clustersim.sweeps.store import ResultsFolder

# tests: path of a marker file; the first task in a worker process (never the sweep's own) to see it dies
CRASH_ENV = "CLUSTERSIM_TEST_CRASH_ONCE"
# Worker processes are started only when the rest of the sweep, estimated from its first batch, would
# take longer than this in one process: spawning interpreters that import numpy, pydantic and networkx
# took 1.5-2.5 s on the 2-vCPU development machine (an 80-row sweep without bands: 1.5 s in one
# process, 3.7 s on two), so shorter work stays here.
MIN_PARALLEL_WORK_S = 6.0


def default_workers() -> int:
    """The cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


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
    from clustersim.planner.compare import mean_step_time
    from clustersim.scenario import validate_scenario
    from clustersim.simulator import simulate
    from clustersim.simulator.strategies import registry

    rec: dict[str, Any] = {"row_id": row_id(values), **values}
    try:
        base = validate_scenario(base_json, source="base")
        scenario = resolve_row(base, values, steps, global_batch)
        r, scenario = fit_micro_batch(
            scenario, lambda s: simulate(s, uncertainty_samples=samples), global_batch is not None
        )
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
                "nic_count": c.nic.count,
                "iteration_time_s": r.iteration_time,
                "samples_per_s": r.samples_per_s,
                "forward_s": b["forward"],
                "backward_s": b["backward"],
                "compression_s": b["compression"],
                "optimizer_s": b["optimizer"],
                "other_s": b["other"],
                # the GPU waiting on the network or host<->device copies, and waiting on its host's
                # dispatch: two causes, two columns (run's breakdown keeps them apart too)
                "exposed_communication_s": b["exposed_communication"] + b["exposed_transfer"],
                "exposed_host_s": b["exposed_host"],
                "idle_s": b["idle"],  # pipeline bubbles: the stage waiting on its neighbours
                "intra_node_bytes": r.bytes_per_link_kind["intra_node_per_node"],
                "inter_node_bytes": r.bytes_per_link_kind["inter_node_per_node"],
                "gpu_memory_bytes": r.memory["total"],
                "micro_batch_used": scenario.workload.micro_batch,
                "global_batch": r.samples_per_iteration,
            }
        )
        flops = r.extra.get("model_flops") or {}
        rec["mfu"] = flops.get("mfu")
        rec["tokens_per_s_per_gpu"] = flops.get("tokens_per_s_per_gpu")
        hot = r.extra.get("hottest_links")
        if hot:  # flow backend rows: their busiest link (issue #11)
            rec["hottest_link"], rec["hottest_link_utilisation"] = hot[0]["link"], hot[0]["utilisation"]
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


def simulate_batch(
    base_json: dict,
    batch: list[dict[str, Any]],
    steps,
    warmup,
    global_batch=None,
    samples: int = 0,
    catalogs: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """Rows on a worker (a local process, a Dask thread or process, or this process), with the sweep's
    user catalogs in use."""
    import multiprocessing

    from clustersim.catalog import user_catalogs

    marker = os.environ.get(CRASH_ENV)
    if marker and multiprocessing.parent_process() is not None:
        try:  # the one worker that takes the marker dies; two that saw it at once must not both try
            os.unlink(marker)
        except FileNotFoundError:
            pass
        else:
            os._exit(1)  # a worker process dying mid-sweep (tests only)
    with user_catalogs(catalogs):
        return [simulate_row(base_json, values, steps, warmup, global_batch, samples) for values in batch]


# How often a worker process checks that the sweep that started it is still alive (seconds): a killed
# sweep's workers are gone within this, and a check is one getppid() call.
PARENT_CHECK_S = 0.2


class sigint_held:
    """Holds Ctrl-C back (blocks SIGINT in this thread) while a pool starts its workers: a forked or
    spawned worker inherits the blocked mask, so the interrupt the terminal sends to the whole process
    group waits in the worker until its initializer (ignore_sigint) discards it, instead of raising
    KeyboardInterrupt inside an import or a queue read and printing a traceback per worker. This
    process gets its interrupt as soon as the block is lifted."""

    def __enter__(self):
        self._old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        return self

    def __exit__(self, *exc):
        signal.pthread_sigmask(signal.SIG_SETMASK, self._old)


def ignore_sigint() -> None:
    """A pool worker's first step: ignore Ctrl-C (the parent stops the work and says what was kept),
    then let through the signals sigint_held blocked while the worker started."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _exit_quietly(signum, frame) -> None:
    os._exit(128 + signum)


def quiet_on_sigint() -> None:
    """A plan worker's first step: Ctrl-C ends it at once and without a word (the parent, interrupted
    too, says the plan was stopped). Not ignored, as a sweep's workers do: a plan's job can run for
    minutes, and the parent's exit would wait for it; a worker that ends releases the parent at once."""
    signal.signal(signal.SIGINT, _exit_quietly)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _worker_init(parent: int) -> None:
    """Workers leave Ctrl-C to the parent, which stops the sweep and says how to resume; and they die
    with it. A pool's workers otherwise outlive a parent killed by SIGKILL or SIGTERM (no cleanup runs):
    each holds its own copy of the task queue's pipe, so it never sees an end of file, and it keeps the
    caller's stdout and stderr open. A daemon thread watches the parent's pid (a dead parent's children
    are re-parented, so getppid() changes) and ends the process; the pool's resource tracker then sees
    its last writer gone and exits too."""
    import threading

    ignore_sigint()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _run_on_processes(batches: list, base_json: dict, args: tuple, workers: int, written) -> list:
    """Run batches on this process and ``workers - 1`` spawned ones, storing each as it finishes;
    returns the batches that did not finish because a worker died (the caller runs them itself), or []
    (done, or stopped early).

    This process works too, instead of waiting: a spawned interpreter spends 1.5-2.5 s importing
    numpy, pydantic and networkx before its first row, and a waiting parent leaves a core idle for
    that long (a 1,000-row sweep with bands took 1.40x rows x run / cores with ``workers`` spawned
    processes and an idle parent; issue #15's target is 1.3x). Batches go to the pool one at a time,
    at most two per spawned worker ahead, so that whatever the parent has not taken yet is never
    stuck behind a slow or still-importing worker."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads (progress)
    spawned = max(1, workers - 1)
    pool = ProcessPoolExecutor(
        max_workers=spawned, mp_context=ctx, initializer=_worker_init, initargs=(os.getpid(),)
    )
    queue = list(enumerate(batches))
    queue.reverse()  # pop() takes the next batch in order
    pending: dict = {}
    lost: list[int] = []
    broken = False

    def collect(timeout: float | None) -> bool:
        """Store what the pool finished; whether to stop."""
        nonlocal broken
        done, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
        for fut in done:
            i = pending.pop(fut)
            try:
                records = fut.result()
            except BrokenProcessPool:
                broken = True
                lost.append(i)
                continue
            if written(records):
                return True
        return False

    try:
        while queue or pending:
            while queue and not broken and len(pending) < 2 * spawned:
                i, batch = queue.pop()
                with sigint_held():  # a submit may spawn a worker
                    pending[pool.submit(simulate_batch, base_json, batch, *args)] = i
            if pending and collect(0):
                return []
            if queue:  # this process takes the next batch itself
                if written(simulate_batch(base_json, queue.pop()[1], *args)):
                    return []
            elif pending and collect(None):
                return []
        return [batches[i] for i in sorted(lost)]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def open_client(scheduler: str, workers: int):
    """(client, in-process cluster or None): ``scheduler``'s Dask cluster, or, for an empty address, one
    started in this process with ``workers`` threads."""
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


@contextmanager
def dask_client(scheduler: str | None, workers: int = 1) -> Iterator[Any]:
    """The Dask client a sweep runs on, connected once and closed on leaving (None without a
    scheduler: the sweep runs on local processes). Entered before a results folder is made, so that an
    address that is not one, or a scheduler that does not answer, is refused with nothing written (the
    folder, its sweep.json and lock were left behind when the connection failed after they were made)."""
    if scheduler is None:
        yield None
        return
    client, cluster = open_client(scheduler, workers)
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def run_sweep(
    sweep: Sweep,
    out,
    scheduler: str | None = None,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
    batch_size: int | None = None,
    stop_after: int | None = None,
) -> dict[str, int]:
    """Run the rows not yet in ``out``. ``stop_after`` (tests) stops after that many rows are written.

    Without a scheduler the batches run on ``workers`` local processes (one: a plain loop in this
    process, also when the first batch says the rest takes under MIN_PARALLEL_WORK_S); an in-process
    Dask cluster cost about 15% of a sweep in scheduling and, being threads, used one core (issue #15).
    ``--scheduler`` uses that Dask cluster's workers."""
    with dask_client(scheduler, workers) as client:
        folder = ResultsFolder(out, sweep)
        with folder.locked():
            return run_locked(sweep, folder, client, workers, progress, batch_size, stop_after)


def run_locked(
    sweep: Sweep,
    folder: ResultsFolder,
    client=None,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
    batch_size: int | None = None,
    stop_after: int | None = None,
) -> dict[str, int]:
    """run_sweep on a folder the caller holds (``ResultsFolder.locked()``), on ``client`` (dask_client;
    None: local processes)."""
    done = folder.open()
    rows = [r for r in sweep.rows() if row_id(r) not in done]
    total = len(sweep.rows())
    counts = {"total": total, "skipped": total - len(rows), "written": 0}
    if progress:
        progress(counts["skipped"], total)
    if not rows:
        return counts
    base_json = sweep.base.model_dump(mode="json")
    spec = sweep.spec
    args = (spec.steps, spec.warmup, spec.global_batch, spec.samples, sweep.catalogs)

    def written(records) -> bool:
        """Store a finished batch; whether to stop (``stop_after``)."""
        folder.append(records)
        counts["written"] += len(records)
        if progress:
            progress(counts["skipped"] + counts["written"], total)
        return stop_after is not None and counts["written"] >= stop_after

    if client is None:
        size = batch_size or max(1, min(25, len(rows) // (4 * workers) or 1))
        batches = [rows[i : i + size] for i in range(0, len(rows), size)]
        t0 = time.perf_counter()
        if written(simulate_batch(base_json, batches[0], *args)):
            return counts
        left = batches[1:]
        per_row = (time.perf_counter() - t0) / len(batches[0])
        if workers > 1 and per_row * sum(map(len, left)) > MIN_PARALLEL_WORK_S:
            left = _run_on_processes(left, base_json, args, workers, written)
        for batch in left:  # one worker, short work, or what a broken pool did not finish
            if written(simulate_batch(base_json, batch, *args)):
                break
        return counts
    from dask.distributed import as_completed

    n_workers = max(1, len(client.scheduler_info().get("workers", {})))
    size = batch_size or max(1, min(25, len(rows) // (4 * n_workers) or 1))
    batches = [rows[i : i + size] for i in range(0, len(rows), size)]
    futures = [client.submit(simulate_batch, base_json, b, *args, pure=False) for b in batches]
    for fut in as_completed(futures):
        if written(fut.result()):
            for f in futures:
                f.cancel()
            break
    return counts
