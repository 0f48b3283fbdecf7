"""`clustersim testbed ...`: an emulated multi-host cluster on this machine (namespaces, veth, tc)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Optional

import typer

from clustersim.commands.support import (
    JsonOpt,
    console,
    emit_json,
    samples_option,
    spinner,
    table,
    user_errors,
)

CpusOpt = typer.Option(
    None,
    "--cpus-per-host",
    min=0,
    help="Each host's CPU share in cores (cgroup CFS quota, and its own cores where they allow); "
    "default: this machine's cores divided among the hosts (a running testbed keeps its own); "
    "0: none, the hosts share the machine's cores.",
)

testbed_app = typer.Typer(
    help="An emulated cluster on one Linux machine: N hosts in network namespaces, "
    "each on a shaped link (tc tbf) to one bridge. Needs root, ip and tc.",
    no_args_is_help=True,
)


@testbed_app.command("up")
@user_errors
def testbed_up(
    hosts: int = typer.Option(..., "--hosts", help="Number of emulated hosts (2..64)."),
    rate: str = typer.Option(
        ..., "--rate", help="Link rate per host and direction, tc units: 200mbit, 1gbit."
    ),
    delay: Optional[float] = typer.Option(None, "--delay", help="One-way delay, ms (needs tc netem)."),
    cpus_per_host: Optional[float] = CpusOpt,
    json_out: bool = JsonOpt,
):
    """Create the hosts (idempotent: the same parameters keep a running testbed; others rebuild it)."""
    from clustersim.testbed.hosts import up
    from clustersim.testbed.shaping import parse_rate

    tb, created = up(hosts, parse_rate(rate), delay, cpus_per_host)
    if json_out:
        emit_json({**tb.describe(), "created": created})
        return
    console.print(
        ("created" if created else "already up:") + f" {tb.hosts} hosts at {tb.describe()['rate']} "
        f"per direction, shaped with {tb.shaper}"
    )
    _print(tb)


@testbed_app.command("down")
@user_errors
def testbed_down():
    """Remove everything the testbed created (and nothing else)."""
    from clustersim.testbed.hosts import down, require_tools

    require_tools()
    removed = down()
    if not removed:
        console.print("no testbed was up")
        return
    made = [r for r in removed if not r.startswith("sysctl:")]
    restored = [int(r.partition(":")[2]) for r in removed if r.startswith("sysctl:")]
    console.print(
        f"removed {len(made)} namespaces, links and CPU groups"
        + (f"; the kernel's CFS bandwidth slice is back to {restored[0] / 1e3:g} ms" if restored else "")
    )


@testbed_app.command("status")
@user_errors
def testbed_status(json_out: bool = JsonOpt):
    """Hosts, addresses, rate and shaper of the running testbed."""
    from clustersim.testbed.hosts import load_state

    tb = load_state()
    if json_out:
        emit_json(tb.describe() if tb else None)
        return
    if tb is None:
        console.print("no testbed is up")
        return
    _print(tb)


@testbed_app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@user_errors
def testbed_exec(ctx: typer.Context, host: str = typer.Argument(..., help="h0, h1, ... (or cst-h0)")):
    """Run a command on one host: clustersim testbed exec h1 -- python -c 'print(1)'. Exits with its code."""
    from clustersim.errors import InputError
    from clustersim.testbed.hosts import exec_in, require_tools

    require_tools()
    if not ctx.args:
        raise InputError("give the command after --", key="CMD")
    raise typer.Exit(exec_in(host, list(ctx.args)).wait())


MODEL_DEFAULTS = {
    "mlp": {"layers": 4, "width": 512, "batch": 256},
    "transformer": {"layers": 2, "width": 256, "batch": 16},
}


@testbed_app.command("validate")
@user_errors
def testbed_validate(
    hosts: str = typer.Option(
        "2,4,8", "--hosts", help="Host counts to run the job on (comma-separated, each 2 or more)."
    ),
    rate: str = typer.Option("200mbit", "--rate", help="Link rate per host and direction, tc units."),
    model: str = typer.Option(
        "mlp", "--model", help="mlp (Linear(width, width) layers) or transformer (post-norm encoder layers)."
    ),
    optimizers: str = typer.Option(
        "adam",
        "--optimizers",
        help="Comma-separated: adam (PyTorch DDP), onebit-adam (1-bit Adam's compression stage), "
        "binsgdm, zero-one-adam (0/1 Adam past its variance freeze, a sync every --interval steps); the "
        "compressed ones implement their compressed all-reduce in torch over gloo; zero3 (Adam under "
        "PyTorch FSDP2, one unit per layer: ZeRO-3, predicted as training.sharding stage 3 with blocking "
        "gathers and reduce-scatters, which is what FSDP2 does on CPU; --blocks only).",
    ),
    layers: Optional[int] = typer.Option(None, "--layers", min=1, help="Layers (mlp: 4, transformer: 2)."),
    width: Optional[int] = typer.Option(
        None, "--width", min=16, help="MLP width or transformer d_model (mlp: 512, transformer: 256)."
    ),
    batch: Optional[int] = typer.Option(
        None, "--batch", min=1, help="Samples per host per step (mlp: 256, transformer: 16)."
    ),
    seq: int = typer.Option(64, "--seq", min=1, help="Transformer: tokens per sample."),
    steps: int = typer.Option(
        20,
        "--steps",
        min=2,
        help="Measured steps per optimizer (after 3 warm-up steps); paired, in rounds of --burst steps.",
    ),
    blocks: bool = typer.Option(
        False,
        "--blocks",
        help="Measure each optimizer's steps in a block of its own, after the calibration, instead of "
        "interleaved with the others' (paired, the default: every speedup is a median of ratios between "
        "neighbours in time, which cancels the machine's drift).",
    ),
    burst: int = typer.Option(4, "--burst", min=1, help="Paired: steps of one optimizer in a row per round."),
    interval: int = typer.Option(
        4, "--interval", min=1, help="0/1 Adam: steps between two syncs (its local_step_clipper)."
    ),
    samples: int = samples_option(
        32,
        "Parameter draws for the P10–P90.",
    ),
    out: Optional[Path] = typer.Option(
        None,
        "--out",
        help="Also write the result, with machine, kernel and torch version, to this JSON file; it keeps "
        "the calibrations the predictions used, so `testbed repredict` predicts it again later.",
    ),
    cpus_per_host: Optional[float] = CpusOpt,
    json_out: bool = JsonOpt,
):
    """Predict real training steps on the emulated hosts, then run them: measured vs predicted.

    The network model is fitted on a collective sweep over the smaller host groups; each host's compute
    (and, for compressed optimizers, its compression kernels) is measured by running the same work on
    all hosts at once without communication. By default the optimizers' steps are measured paired:
    interleaved in bursts with each other and with that calibration, each speedup over Adam the median
    of ratios between neighbours in time, beside the predicted speedup; --blocks measures each
    optimizer on its own after the calibration."""
    from clustersim.errors import InputError
    from clustersim.testbed.hosts import require_tools
    from clustersim.testbed.validate import JOBS, Job, validate

    counts = _host_counts(hosts)
    if model not in MODEL_DEFAULTS:
        raise InputError(f"unknown model {model!r} (known: {', '.join(MODEL_DEFAULTS)})", key="--model")
    chosen = tuple(dict.fromkeys(x.strip() for x in optimizers.split(",") if x.strip()))
    unknown = [o for o in chosen if o not in JOBS]
    if unknown or not chosen:
        raise InputError(
            f"unknown optimizer {(unknown or [''])[0]!r} (known: {', '.join(JOBS)})", key="--optimizers"
        )
    if blocks and "zero-one-adam" in chosen:
        raise InputError(
            "zero-one-adam is measured paired only (its steps differ: a sync every --interval steps, "
            "so a burst of whole intervals is its unit): leave out --blocks",
            key="--optimizers",
        )
    if not blocks and "zero3" in chosen:
        raise InputError("zero3 is measured in blocks: add --blocks", key="--optimizers")
    if not blocks and "adam" not in chosen:
        raise InputError("paired runs measure speedups over Adam: add adam", key="--optimizers")
    if not blocks and (burst % interval or steps < burst):
        raise InputError(
            f"--burst {burst} must be a whole number of 0/1 Adam's --interval {interval} and at most "
            f"--steps {steps}",
            key="--burst",
        )
    d = MODEL_DEFAULTS[model]
    job = Job(
        model=model,
        layers=layers or d["layers"],
        width=width or d["width"],
        batch=batch or d["batch"],
        seq=seq,
        steps=steps,
        interval=interval,
    )
    if out is not None:
        from clustersim.io import check_writable_file

        check_writable_file(out)  # before minutes of measuring, not after
    require_tools()
    command = _command(hosts, rate, model, optimizers, job, blocks, burst)

    def partial(result: dict) -> None:  # a paired run's --out after each host count, as it goes
        if out is not None:
            from clustersim.io import write_json_atomically

            write_json_atomically(out, {**result, "provenance": _provenance(command, result["testbed"])})

    with spinner("testbed validation", json_out) as progress:
        if blocks:
            result = validate(
                counts, rate, job, chosen, samples=samples, progress=progress, cpus_per_host=cpus_per_host
            )
        else:
            from clustersim.testbed.paired import validate_paired

            result = validate_paired(
                counts, rate, job, chosen, samples, progress, cpus_per_host=cpus_per_host, burst=burst,
                partial=partial,
            )  # fmt: skip
    result["provenance"] = _provenance(command, result["testbed"])
    _emit_validation(result, out, json_out)


@testbed_app.command("repredict")
@user_errors
def testbed_repredict(
    file: Path = typer.Argument(..., help="A `clustersim testbed validate --out` file."),
    samples: int = samples_option(
        32,
        "Parameter draws for the P10–P90.",
    ),
    out: Optional[Path] = typer.Option(
        None, "--out", help="Also write the file back out with the new predictions to this JSON file."
    ),
    json_out: bool = JsonOpt,
):
    """Predict a stored validation's measured steps again with this version's model, without hosts or
    root: the network model is refitted on the file's own collective sweep and each host count's
    compute and kernels come from the calibration stored beside it. The measured columns are the
    file's; the predicted ones are new. Use it to see what a model change does to real runs."""
    from clustersim.io import read_structured_file
    from clustersim.testbed.paired import repredict

    stored = read_structured_file(file, "json")
    if out is not None:
        from clustersim.io import check_writable_file

        check_writable_file(out)
    with spinner("re-predicting", json_out) as progress:
        result = repredict(stored, str(file), samples=samples, progress=progress)
    _emit_validation(result, out, json_out)


def _emit_validation(result: dict, out: Optional[Path], json_out: bool) -> None:
    """A validation's result to ``out`` (whole, atomically) and to the terminal as JSON or the table."""
    if out is not None:
        from clustersim.io import write_json_atomically

        write_json_atomically(out, result)
    if json_out:
        emit_json(result)
        return
    _print_validation(result)


def _host_counts(hosts: str) -> list[int]:
    from clustersim.errors import InputError

    try:
        counts = sorted({int(x) for x in hosts.split(",") if x.strip()})
    except ValueError:
        raise InputError(f"expected comma-separated host counts, got {hosts!r}", key="--hosts") from None
    if not counts or counts[0] < 2:
        raise InputError("host counts must be 2 or more", key="--hosts")
    return counts


def _command(hosts: str, rate: str, model: str, optimizers: str, job, blocks: bool, burst: int) -> str:
    protocol = " --blocks" if blocks else f" --burst {burst} --interval {job.interval}"
    return (
        f"clustersim testbed validate --hosts {hosts} --rate {rate} --model {model} "
        f"--optimizers {optimizers} --layers {job.layers} --width {job.width} --batch {job.batch} "
        f"--seq {job.seq} --steps {job.steps}{protocol}"
    )


def _provenance(command: str, testbed: dict) -> dict:
    import datetime
    import os
    import platform
    import socket
    from importlib.metadata import version

    from clustersim.calibration.provenance import cpu_model

    return {
        "command": f"{command} --cpus-per-host {testbed['cpus_per_host'] or 0:g}",
        "machine": socket.gethostname(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _print_validation(result: dict) -> None:
    def ms(mid: float, lo: float, hi: float) -> str:
        return f"{1e3 * mid:,.0f} ({1e3 * lo:,.0f}–{1e3 * hi:,.0f})"

    rows = []
    compressed = any("compressed_allreduce_measured_s" in r for r in result["rows"])
    for r in result["rows"]:
        row = [
            r.get("optimizer", "adam"),
            r["hosts"],
            ms(r["measured_s"], r["measured_p10_s"], r["measured_p90_s"]),
            ms(r["predicted_s"], r["predicted_p10_s"], r["predicted_p90_s"])
            + (" ✓" if r["inside"] else " ✗"),
            f"{100 * r['error']:+.1f}%",
        ]
        if compressed:
            row.append(
                f"{1e3 * r['compressed_allreduce_measured_s']:,.1f} / "
                f"{1e3 * r['compressed_allreduce_predicted_s']:,.1f} "
                f"({100 * r['compressed_allreduce_error']:+.0f}%)"
                if "compressed_allreduce_measured_s" in r
                else "—"
            )
        rows.append(row)
    columns = ["optimizer", "hosts", "measured", "predicted", "error"]
    if compressed:
        columns.append("compressed all-reduce: measured / predicted, ms")
    label = result.get("label", "MLP")
    console.print(
        table(
            f"training step of a {result['params']:,}-parameter {label} at {result['rate']}, ms (P10–P90)",
            columns,
            rows,
        )
    )
    errors = sorted(abs(r["error"]) for r in result["rows"])
    console.print(
        f"median |error| {100 * errors[len(errors) // 2]:.1f}% over {len(errors)} cases; network model "
        f"fitted on groups of {result['rows'][-1]['network_fitted_on_ranks']} hosts; "
        "[dim]✓: the measured median is inside the predicted P10–P90[/]"
    )
    for line in sharded_ratios(result["rows"]):
        console.print(line)
    if any("measured_speedup" in r for r in result["rows"]):
        _print_speedups(result)


def _times(r: dict, key: str) -> str:
    return f"{r[key]:.2f}× ({r[key + '_p10']:.2f}–{r[key + '_p90']:.2f})"


def _print_speedups(result: dict) -> None:
    """A paired run: each optimizer's speedup over Adam, the median of its paired ratios (P10–P90 of the
    pairs) beside the predicted speedup (P10–P90 under the same draws), and the machine's drift."""
    rows = [
        [
            r["optimizer"],
            r["hosts"],
            _times(r, "measured_speedup"),
            _times(r, "predicted_speedup") + (" ✓" if r["speedup_inside"] else " ✗"),
            f"{100 * r['speedup_error']:+.1f}%",
            f"{len(r['pair_ratios'])}",
        ]
        for r in result["rows"]
        if "measured_speedup" in r
    ]
    console.print(
        table(
            "speedup over Adam: measured (median of paired ratios, P10–P90 of the pairs) and predicted",
            ["optimizer", "hosts", "measured", "predicted", "error", "pairs"],
            rows,
        )
    )
    errors = sorted(abs(r["speedup_error"]) for r in result["rows"] if "speedup_error" in r)
    inside = sum(r["speedup_inside"] for r in result["rows"] if "speedup_inside" in r)
    sides = sum(r["speedup_side_agrees"] for r in result["rows"] if "speedup_side_agrees" in r)
    console.print(
        f"speedups: median |error| {100 * statistics.median(errors):.1f}%, {inside} of {len(errors)} inside "
        f"the predicted P10–P90, {sides} of {len(errors)} on the measured side of 1.0"
    )
    for record in result.get("paired", {}).get("hosts", []):
        d = record["drift"]
        line = (
            f"{record['hosts']} hosts: reference kernel {1e3 * d['reference_median_s']:.0f} ms, drift "
            f"over the run {100 * d['spread']:.0f}% (P10–P90; slowest ÷ fastest "
            f"{d['slowest_over_fastest']:.2f}), between neighbours "
            f"{100 * d['neighbour_change']:.1f}% (median)"
        )
        if d["exceeded"]:
            line += (
                f" [bold]— more than the {100 * d['tolerance']:.0f}% the pairing absorbs: the paired "
                "ratios carry the drift (more rounds, or a quieter machine)[/]"
            )
        console.print(line)


def sharded_ratios(rows: list[dict]) -> list[str]:
    """ZeRO-3's step over DDP's, measured in the same run and predicted: a ratio of two jobs measured
    minutes apart on the same hosts is steadier than either step on this shared machine."""
    by = {(r["hosts"], r.get("optimizer", "adam")): r for r in rows}
    lines = []
    for (n, opt), r in sorted(by.items()):
        ddp = by.get((n, "adam"))
        if opt == "zero3" and ddp is not None:
            lines.append(
                f"{n} hosts: ZeRO-3 ÷ DDP step, measured {r['measured_s'] / ddp['measured_s']:.2f}×, "
                f"predicted {r['predicted_s'] / ddp['predicted_s']:.2f}×"
            )
    return lines


def _print(tb) -> None:
    d = tb.describe()
    console.print(
        table(
            f"testbed: bridge {d['bridge']}, {d['rate']} per host and direction ({d['shaper']}), "
            + share_text(d),
            ["host", "address", "interface", "CPU share"],
            [[m["host"], m["address"], m["interface"], _member_share(m)] for m in d["members"]],
        )
    )


def share_text(d: dict) -> str:
    """The hosts' CPU share in words (a testbed's describe())."""
    if not d.get("cpus_per_host"):
        return f"hosts share the machine's {d['machine_cpus']} cores"
    text = f"{d['cpus_per_host']:g} cores per host of the machine's {d['machine_cpus']}"
    if d["cpus_per_host"] * len(d["members"]) > d["machine_cpus"] + 1e-9:
        text += " (more than it has: hosts will wait for each other's cores)"
    return text


def _member_share(m: dict) -> str:
    if "cpu_quota_us" not in m:
        return "shared"
    cores = ",".join(map(str, m["cpus"])) if m["cpus"] is not None else "any"
    share = m["cpu_quota_us"] / m["cpu_period_us"]
    quota = f"{m['cpu_quota_us'] / 1e3:g} ms per {m['cpu_period_us'] / 1e3:g} ms"
    return f"{share:g} {'cores' if share > 1 else 'core'} on {cores} ({quota})"
