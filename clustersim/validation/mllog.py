"""Seconds per training step, or images per second, from MLPerf Training result logs, the way the
multinode_scale dataset's MLPerf rows were read (so a new round's submission can be added the same way):

    python -m clustersim.validation.mllog results/<system>/gpt3/result_*.txt
    python -m clustersim.validation.mllog results/<system>/resnet/result_*.txt

MLPerf scores time-to-train, which mixes the step with evaluation, warm-up and convergence; the
simulator predicts a step. The logs give the step two ways. NeMo's GPT-3 code of rounds v3.0 and v3.1
prints one ``tracked_stats`` line per step with ``train_step_timing`` (seconds): the step is their
median over every step of every run. Later rounds' logs print none; there each training block
(``block_start`` .. ``block_stop``, between evaluations) lasts ``time_ms`` from start to stop over
``epoch_count`` tokens, i.e. epoch_count / (global_batch_size x max_sequence_length) steps: the step
is the median over runs of each run's median block, leaving out the first block (it includes the
first steps' warm-up). A block also counts the few milliseconds between steps that
train_step_timing leaves out (0.2-2.5% longer on the v3.1 logs that have both).

NVIDIA's MXNet ResNet-50 code prints each epoch's whole-job throughput (``tracked_stats``
``throughput``, common/fit.py: train_samples / the epoch's seconds): the rate is the median over runs
of each run's median epoch, leaving out the first epoch (warm-up, CUDA graph capture). The median
over runs also leaves out a run whose log is off as a whole (v3.0's 64-node result_0.txt logs
3.2-7.9 million images/s, more than twice the per-GPU rate of one DGX H100; its four other runs log
2.24-2.25 million). An epoch is ceil(floor(train_samples / GPUs) / batch per GPU) full steps
(common/dali.py: each worker's shard of train_samples // GPUs, the last batch filled,
LastBatchPolicy.FILL), more images than train_samples (2.9% more at 3,584 GPUs of 16), so the images
the GPUs compute per second, global batch / step, which is what the simulator predicts, is the
logged rate times steps x global batch / train_samples."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

MARK = ":::MLLOG"


def events(text: str) -> list[dict]:
    """The MLLOG events of one log, in order (lines that are not MLLOG JSON are skipped)."""
    out = []
    for line in text.splitlines():
        if MARK not in line:
            continue
        try:
            out.append(json.loads(line.split(MARK, 1)[1]))
        except json.JSONDecodeError:
            continue
    return out


def logged(evs: list[dict], key: str):
    """The value of the last event named ``key`` (global_batch_size, max_sequence_length, ...)."""
    return next((e["value"] for e in reversed(evs) if e.get("key") == key), None)


def train_step_timings(evs: list[dict]) -> list[float]:
    """Every ``train_step_timing`` the log prints, in seconds (NeMo's per-step timer)."""
    return [
        e["value"]["train_step_timing"]
        for e in evs
        if e.get("key") == "tracked_stats"
        and isinstance(e.get("value"), dict)
        and "train_step_timing" in e["value"]
    ]


def block_step_times(evs: list[dict]) -> list[float]:
    """Seconds per step of each training block after the first: its duration over its steps."""
    gbs, seq = logged(evs, "global_batch_size"), logged(evs, "max_sequence_length") or 1
    if not gbs:
        return []
    out, start = [], None
    for e in evs:
        if e.get("key") == "block_start":
            start = e
        elif e.get("key") == "block_stop" and start is not None:
            tokens = (e.get("metadata") or {}).get("epoch_count")
            if tokens:
                out.append((e["time_ms"] - start["time_ms"]) / 1000 / (tokens / (gbs * seq)))
            start = None
    return out[1:]


def _epoch_rate(e: dict) -> float | None:
    """The whole-job samples/s an epoch's event logs: ``tracked_stats`` {"throughput": r} (NVIDIA's
    MXNet code from its v2.1 H100 preview on), or the older ``throughput`` key with the rate as its
    value (that code's common/fit.py in v1.0-v2.1, as Dell's v2.1 XE8545 logs print it)."""
    value = e.get("value")
    if e.get("key") == "tracked_stats" and isinstance(value, dict) and "throughput" in value:
        return value["throughput"]
    if e.get("key") == "throughput" and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def epoch_throughputs(evs: list[dict]) -> list[float]:
    """Each epoch's logged throughput (samples/s of the whole job) after the first."""
    rates = [r for r in map(_epoch_rate, evs) if r is not None]
    return rates[1:]


def throughput(texts: list[str]) -> tuple[float, str]:
    """The submission's logged whole-job samples/s (train_samples per epoch second) from its runs'
    logs, and how it was read."""
    per_run = [statistics.median(r) for r in (epoch_throughputs(events(t)) for t in texts) if r]
    if not per_run:
        raise ValueError("the logs have no per-epoch throughput after the first epoch")
    how = f"logged per-epoch throughput, median of {len(per_run)} runs' median epochs"
    return statistics.median(per_run), how


def steps_per_epoch(train_samples: int, gpus: int, batch_per_gpu: int) -> int:
    """Full steps of one epoch: each GPU's shard, train_samples // gpus, in batches, the last filled."""
    return math.ceil((train_samples // gpus) / batch_per_gpu)


def computed_samples_per_s(texts: list[str]) -> tuple[float, str]:
    """Samples the GPUs compute per second (global batch / step) from the logged rate: the rate times
    each epoch's steps x global batch over train_samples (module docstring)."""
    batches = {(logged(evs, "global_batch_size"), logged(evs, "d_batch_size")) for evs in map(events, texts)}
    if len(batches) > 1:
        # a rate is only a step at one batch: a submission whose runs differ (Dell's v2.1 XE8545 40 GB
        # runs: four at 256 images per GPU, one at 204) is read one batch at a time
        listed = ", ".join(
            f"{g} ({b} per GPU)"
            for g, b in sorted(batches, key=lambda b: [x if isinstance(x, int) else -1 for x in b])
        )
        raise ValueError(
            f"the logs were run at different global batches: {listed}; read each batch's logs alone"
        )
    rate, how = throughput(texts)
    evs = events(texts[0])
    gbs, per_gpu, samples = (logged(evs, k) for k in ("global_batch_size", "d_batch_size", "train_samples"))
    if not (gbs and per_gpu and samples):
        raise ValueError("the logs lack global_batch_size, d_batch_size or train_samples")
    steps = steps_per_epoch(samples, gbs // per_gpu, per_gpu)
    return rate * steps * gbs / samples, f"{how}, x {steps} steps x {gbs} / {samples}"


def step_time(texts: list[str]) -> tuple[float, str]:
    """The submission's seconds per step from its runs' logs, and how it was read."""
    runs = [events(t) for t in texts]
    timings = [x for evs in runs for x in train_step_timings(evs)]
    if timings:
        return statistics.median(timings), f"train_step_timing, median of {len(timings)} steps"
    per_run = [statistics.median(b) for b in map(block_step_times, runs) if b]
    if not per_run:
        raise ValueError("the logs have neither train_step_timing lines nor timed training blocks")
    return statistics.median(per_run), f"block timing, median of {len(per_run)} runs' median blocks"


def main(paths: list[str]) -> None:
    texts = [Path(p).read_text(encoding="utf-8") for p in paths]
    evs = events(texts[0])
    if epoch_throughputs(evs):
        logged_rate = throughput(texts)[0]
        try:
            rate, how = computed_samples_per_s(texts)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2)
        print(
            f"{rate:.1f} samples/s computed, {logged_rate:.1f} logged ({how}); "
            f"global batch {logged(evs, 'global_batch_size')}, "
            f"per GPU {logged(evs, 'd_batch_size')}, optimizer {logged(evs, 'opt_name')}"
        )
        return
    seconds, how = step_time(texts)
    print(
        f"{seconds:.4f} s per step ({how}); global batch {logged(evs, 'global_batch_size')}, "
        f"accumulation {logged(evs, 'gradient_accumulation_steps')}, "
        f"sequence {logged(evs, 'max_sequence_length')}"
    )


if __name__ == "__main__":  # pragma: no cover - a maintainer's tool
    main(sys.argv[1:])
