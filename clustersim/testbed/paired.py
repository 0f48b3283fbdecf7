"""Paired validation on the emulated testbed: the compressed optimizers' speedups over Adam, measured as
the median of ratios between neighbours in time and compared with the predicted speedups.

Why paired: the quantity predicted is a ratio (a compressed optimizer's step over Adam's on the same
cluster), and this machine's speed drifts by up to a quarter within minutes. Measured in blocks (all
of Adam's steps, then all of 1-bit Adam's), a ratio carries whatever the machine did between the
blocks; measured in alternation (A B C D, B C D A, ...) each round's ratio compares steps seconds
apart, and the median over rounds cancels drift slower than a round. paired_job.py runs the rounds;
this module turns them into:

* per optimizer and host count, the **paired ratios** (Adam's burst over the optimizer's, one per
  round), their median (the measured speedup) and P10-P90;
* the **drift check**: a reference kernel timed before every burst; its spread over the run is the
  machine's drift (what blocks would have suffered), its change between neighbouring points is the
  drift the pairing cannot cancel, flagged past a tolerance;
* the calibration for the prediction (compute phases and kernels, medians over the rounds: measured
  interleaved with the jobs, not minutes before them) and the **predicted speedup** with its paired
  band (every parameter draw moves both optimizers: simulator/runner.py paired_times).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable

from clustersim.simulator.uncertainty import Interval
from clustersim.testbed.hosts import down_on_sigterm
from clustersim.testbed.shaping import parse_rate
from clustersim.testbed.validate import Job, _profile, _row, scenario_for

BASE = "adam"
PAIRED = ("adam", "onebit-adam", "binsgdm", "zero-one-adam")  # paired_job.py's MODES
# Drift between neighbouring points the pairing is taken to absorb: a ratio of two bursts seconds apart
# moves with the machine's speed change between them; 5% is the agreement asked of two repeats' speedups.
DRIFT_TOLERANCE = 0.05
# glibc's allocator as a caching allocator, as PyTorch's CUDA one is: allocations up to 32 MiB (glibc's
# largest mmap threshold; every buffer of these jobs is smaller) come from the heap, and freed memory is
# kept up to 1 GiB instead of being returned to the kernel. By default glibc gives freed top-of-heap
# memory back, and the optimizers' per-step temporaries fault fresh zeroed pages in every step: 1-bit
# Adam's update (five 4 MiB temporaries on the MLP) took 24 ms on a half-core host against the 1.1 ms
# of the same expression timed in a loop (its kernel calibration), and 1.1 ms with these settings.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def band(values: list[float]) -> tuple[float, float, float]:
    """Median, P10 and P90 of measured rounds (Hazen's plotting position)."""
    iv = Interval.empirical(values)
    return iv.p50, iv.p10, iv.p90


def paired_ratios(burst_s: dict[str, list[float]], base: str = BASE) -> dict[str, dict]:
    """Per optimizer other than ``base``: round by round, ``base``'s burst over the optimizer's (its
    speedup in that round), and their median and P10-P90. Both lists hold one burst per round, in
    round order."""
    out = {}
    for name, bursts in burst_s.items():
        if name == base:
            continue
        if len(bursts) != len(burst_s[base]) or not bursts:
            raise ValueError(f"{name}: {len(bursts)} bursts against {len(burst_s[base])} of {base}")
        ratios = [b / x for b, x in zip(burst_s[base], bursts)]
        mid, p10, p90 = band(ratios)
        out[name] = {"ratios": ratios, "speedup": mid, "p10": p10, "p90": p90}
    return out


def drift_check(reference_s: list[list[float]], tolerance: float = DRIFT_TOLERANCE) -> dict:
    """The machine's drift from the reference kernel's times, round by round (each round's points in
    time order: before each burst and at the round's end).

    ``spread``: P10-P90 of every point over the run, relative to the median (what a measurement in
    blocks would carry). ``neighbour_change``: the median relative change between consecutive points
    of a round (|ln(later / earlier)|), i.e. across one burst (what a pair's ratio carries, as its two
    bursts are at most a round apart); ``exceeded`` when it is above ``tolerance``: then the machine
    moves faster than the pairing cancels and the paired ratios scatter with it (more rounds narrow
    their median; a quieter machine narrows each ratio)."""
    points = [v for r in reference_s for v in r]
    mid, p10, p90 = band(points)
    changes = [abs(math.log(b / a)) for r in reference_s for a, b in zip(r, r[1:])]  # either way alike
    neighbour = statistics.median(changes) if changes else 0.0
    return {
        "reference_median_s": mid,
        "spread": (p90 - p10) / mid,
        "slowest_over_fastest": max(points) / min(points),
        "neighbour_change": neighbour,
        "neighbour_change_p90": band(changes)[2] if changes else 0.0,
        "tolerance": tolerance,
        "exceeded": neighbour > tolerance,
    }


def calibration(job_result: dict, hosts: int) -> tuple[dict, list[dict] | None]:
    """The compute calibration (medians over rounds of the slowest rank's local forward, backward and
    optimizer) and the kernels (median over rounds of each kernel's slowest rank), as validate's
    _profile takes them."""
    local = {"hosts": hosts}
    for key in ("forward", "backward", "optimizer"):
        local[key] = {"median_s": statistics.median(r[key] for r in job_result["local_s"])}
    kernels = [
        {**{k: v for k, v in row.items() if k != "rounds_s"}, "median_s": statistics.median(row["rounds_s"])}
        for row in job_result["kernels"]
    ] or None
    return local, kernels


def measured(job_result: dict, name: str) -> dict:
    """An optimizer's measured step as validate's _row takes it: median and P10-P90 over its bursts of
    the burst's mean step, and the mean per step of each phase (the slowest rank's, step by step)."""
    burst = job_result["burst"]
    mid, p10, p90 = band([b / burst for b in job_result["burst_s"][name]])
    out = {k: {"median_s": v} for k, v in job_result["step_means_s"][name].items() if k != "step"}
    out["step"] = {"median_s": mid, "p10_s": p10, "p90_s": p90}
    return out


def predicted_speedup(
    job: Job, hosts: int, rate_bits: float, name: str, profile, samples: int, point: float
) -> dict:
    """Adam's predicted step over ``name``'s (``point``, from the two rows' predictions) and its P10-P90
    under the same parameter draws."""
    from clustersim.simulator.runner import paired_times

    base_s = scenario_for(hosts, rate_bits, job, BASE)
    other_s = scenario_for(hosts, rate_bits, job, name)
    if samples <= 0:
        return {"predicted_speedup": point, "predicted_speedup_p10": point, "predicted_speedup_p90": point}
    times = paired_times([base_s, other_s], profile, samples)
    iv = Interval.of(times[0] / times[1])
    return {"predicted_speedup": point, "predicted_speedup_p10": iv.p10, "predicted_speedup_p90": iv.p90}


def speedup_fields(ratios: dict, predicted: dict) -> dict:
    """A row's measured and predicted speedup side by side."""
    speedup = ratios["speedup"]
    return {
        "pair_ratios": ratios["ratios"],
        "measured_speedup": speedup,
        "measured_speedup_p10": ratios["p10"],
        "measured_speedup_p90": ratios["p90"],
        **predicted,
        "speedup_error": predicted["predicted_speedup"] / speedup - 1,
        "speedup_inside": predicted["predicted_speedup_p10"] <= speedup <= predicted["predicted_speedup_p90"],
        # the prediction says the same as the measurement about whether compression pays
        "speedup_side_agrees": (predicted["predicted_speedup"] > 1) == (speedup > 1),
    }


def host_count_rows(
    job: Job, hosts: int, rate_bits: float, job_result: dict, sweep: dict, fit_below: int, samples: int
) -> tuple[list[dict], dict]:
    """One host count's rows (every optimizer: measured, predicted, and beside each compressed one its
    paired and predicted speedup) and its paired record (bursts, reference, drift, calibration rounds)."""
    from clustersim.simulator import simulate

    local, kernels = calibration(job_result, hosts)
    profile = _profile(sweep, fit_below, local, job, kernels)
    fitted_on = sorted({r["ranks"] for r in sweep["collectives"] if r["ranks"] < fit_below})
    ratios = paired_ratios(job_result["burst_s"])
    rows = []
    for name in job_result["optimizers"]:
        result = simulate(scenario_for(hosts, rate_bits, job, name), profile, uncertainty_samples=samples)
        rows.append(_row(hosts, name, measured(job_result, name), result, fitted_on, local, kernels))
    base = next(r for r in rows if r["optimizer"] == BASE)
    for row in rows:
        if row["optimizer"] in ratios:
            point = base["predicted_s"] / row["predicted_s"]
            predicted = predicted_speedup(job, hosts, rate_bits, row["optimizer"], profile, samples, point)
            row.update(speedup_fields(ratios[row["optimizer"]], predicted))
    record = {
        "hosts": hosts,
        **{k: job_result[k] for k in ("orders", "burst_s", "reference_s", "local_s", "kernels")},
        "drift": drift_check(job_result["reference_s"]),
    }
    return rows, record


@down_on_sigterm
def validate_paired(
    host_counts: list[int],
    rate: str,
    job: Job = Job(steps=32),  # noqa: B008 - frozen dataclass
    optimizers: tuple[str, ...] = PAIRED,
    samples: int = 32,
    progress=None,
    sweep_bytes: tuple[int, int] = (1 << 12, 1 << 23),
    sweep_repeat: int = 5,
    cpus_per_host: float | None = None,
    burst: int = 4,
    partial: Callable[[dict], None] | None = None,
) -> dict:
    """The paired protocol: one sweep (as validate), then per host count one paired_job run of
    ``job.steps // burst`` rounds, every optimizer's bursts, the calibration and the reference kernel
    interleaved. ``partial(result)`` is called with the result so far after each host count."""
    from clustersim.cost_models.kernel_bytes import padded_elements
    from clustersim.testbed import hosts as tb_hosts
    from clustersim.testbed import validate as tb_validate

    if BASE not in optimizers or any(o not in PAIRED for o in optimizers):
        raise ValueError(f"paired runs take {', '.join(PAIRED)}, Adam included; got {optimizers}")
    bits = parse_rate(rate)
    top = max(host_counts)
    tb, created = tb_hosts.up(top, bits, cpus_per_host=cpus_per_host)
    testbed = {"hosts": tb.hosts, "rate_gbps": tb.rate_bits / 1e9, "shaper": tb.shaper}
    testbed.update(tb_validate.host_cpus(tb))
    result = {
        "protocol": "paired",
        "rate": rate,
        "model": job.model,
        "label": job.label,
        "job": job.__dict__,
        "params": job.params,
        "batch": job.batch,
        "testbed": testbed,
        "paired": {"burst": burst, "rounds": job.steps // burst, "hosts": []},
        "rows": [],
    }
    try:
        raw = tb_validate._sweep(tb, list(optimizers), rate, progress, sweep_bytes, sweep_repeat)
        result["sweep"] = raw
        fit_below = top if top > 2 else 3
        for n in sorted(host_counts):
            args = [
                *("--mode", "paired", *job.args(), "--optimizers", ",".join(optimizers)),
                *("--burst", str(burst), "--interval", str(job.interval)),
                *("--elements", str(padded_elements(job.params, n))),
            ]
            job_result = tb_validate.run_on_hosts(
                tb,
                "clustersim.testbed.paired_job",
                args,
                ALLOCATOR_ENV,
                progress,
                3600,
                "the paired job",
                count=n,
            )
            rows, record = host_count_rows(job, n, bits, job_result, raw, fit_below, samples)
            result["rows"] += rows
            result["paired"]["hosts"].append(record)
            if partial is not None:
                partial(result)
    finally:
        if created:
            tb_hosts.down(tb)
    return result


def repredict(stored: dict, source: str, samples: int = 32, progress=None) -> dict:
    """A stored validation predicted again (validate.repredict); for a paired file each compressed
    row's speedup too, from the profile its row was re-predicted with, beside its stored ratios."""
    from clustersim.testbed.validate import repredict as repredict_rows

    profiles: list = []
    result = repredict_rows(stored, source, samples, progress, profiles)
    if any("pair_ratios" in r for r in result["rows"]):
        _repredict_speedups(stored, result["rows"], profiles, parse_rate(stored["rate"]), samples)
    return result


def _repredict_speedups(stored: dict, rows: list[dict], profiles: list, rate_bits: float, samples: int):
    j = stored["job"]
    job = Job(
        j["model"],
        j["layers"],
        j["width"],
        j["batch"],
        j["seq"],
        j["heads"],
        j["steps"],
        j.get("interval", 4),
    )
    base = {r["hosts"]: r for r in rows if r["optimizer"] == BASE}
    for row, profile in zip(rows, profiles):
        if "pair_ratios" not in row:
            continue
        mid, p10, p90 = band(row["pair_ratios"])
        ratios = {"ratios": row["pair_ratios"], "speedup": mid, "p10": p10, "p90": p90}
        point = base[row["hosts"]]["predicted_s"] / row["predicted_s"]
        predicted = predicted_speedup(job, row["hosts"], rate_bits, row["optimizer"], profile, samples, point)
        row.update(speedup_fields(ratios, predicted))
