"""`clustersim calibrate ...`: measure hardware, fit and inspect profiles."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Optional

import typer

from clustersim.commands.support import (
    JsonOpt,
    console,
    emit_json,
    spinner,
    table,
    user_errors,
    with_catalogs,
)
from clustersim.commands.support import ms as _ms
from clustersim.errors import InputError
from clustersim.io import check_writable_file, same_file
from clustersim.units import format_bytes, format_link_rate, format_rate

calibrate_app = typer.Typer(
    help="Measure your own hardware (torch microbenchmarks, collectives, nccl-tests) "
    "and fit a versioned profile that --profile feeds to every simulating command.",
    no_args_is_help=True,
)


# calibrate model and import-trace add a model's measurement to a profile
MergedOutOpt = typer.Option(Path("profile.json"), "--out", help="Profile to write (merged if it exists).")
AddToProfileOpt = typer.Option(None, "--profile", help="Profile to add to (default: --out when it exists).")
ClusterOpt = typer.Option(
    None,
    "--cluster",
    help="Scenario file or preset whose `cluster` is the hardware the collectives ran on "
    "(nodes and GPUs per node are taken from each measurement). With it the collective "
    "model's parameters are fitted, so predictions at any scale use them.",
)
# calibrate fit and check read raw files, which may record the network they ran on
RawClusterOpt = typer.Option(
    None,
    "--cluster",
    help="Scenario file or preset whose `cluster` is the hardware the collectives ran on "
    "(nodes and GPUs per node are taken from each measurement). With it the collective "
    "model's parameters are fitted, so predictions at any scale use them. A file that records its "
    "network (a testbed sweep) needs none; a NIC kind or line rate that contradicts it is refused.",
)


ThreadsOpt = typer.Option(
    None,
    "--threads",
    min=1,
    max=1024,
    help="torch intra-op threads (default: torch's, from OMP_NUM_THREADS or the cores). Recorded in the "
    "profile: a CPU's rates depend on them, so measure hardware rates and models with the same count.",
)


def interruptible(fn):
    """Ctrl-C during a measurement (or the imports before it): one line saying nothing was written
    (every output of the measuring commands is written once, at the end, atomically) and exit 130, as a
    shell reports an interrupt."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from clustersim.commands.support import err_console

        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt:
            err_console.print("interrupted: nothing written")
            raise typer.Exit(130) from None

    return wrapper


def _cluster(ref: Optional[str]):
    if ref is None:
        return None
    from clustersim.scenario import load_scenario

    return load_scenario(ref).cluster


@calibrate_app.command("run")
@user_errors
@interruptible
def calibrate_run(
    device: Optional[str] = typer.Option(
        None, "--device", help="cuda | cpu (default cuda; a --testbed run measures gloo on CPUs)"
    ),
    out: Path = typer.Option(Path("profile.json"), "--out", help="Profile to write (atomically)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer sizes and repetitions (a minute or less)."),
    ranks: Optional[int] = typer.Option(
        None, "--ranks", min=1, help="Processes for the collective sweep (default: GPUs, or 2 on the CPU)."
    ),
    raw_out: Optional[Path] = typer.Option(None, "--raw-out", help="Also keep the raw medians."),
    testbed: Optional[int] = typer.Option(
        None,
        "--testbed",
        min=2,
        help=(
            "Measure collectives over gloo across N emulated hosts (clustersim testbed) instead of "
            "on this machine's devices; brings the testbed up and down if it is not up."
        ),
    ),
    rate: str = typer.Option("200mbit", "--rate", help="--testbed: link rate per host (tc units)."),
    min_bytes: str = typer.Option("1MiB", "--min-bytes", help="--testbed: smallest message."),
    max_bytes: str = typer.Option("32MiB", "--max-bytes", help="--testbed: largest message."),
    ops: str = typer.Option(
        "all_reduce,all_gather,all_to_all,broadcast",
        "--ops",
        show_default=False,  # rich would cut the long default; the help says it whole
        help="--testbed: collectives to measure, comma-separated (default: all_reduce, all_gather, "
        "all_to_all, broadcast).",
    ),
    repeat: int = typer.Option(5, "--repeat", min=1, help="--testbed: timed repetitions per size."),
    cpus_per_host: Optional[float] = typer.Option(
        None,
        "--cpus-per-host",
        min=0,
        help="--testbed: each host's CPU share in cores (default: a running testbed's, else this "
        "machine's cores divided among the hosts; 0: none).",
    ),
    cluster: Optional[str] = ClusterOpt,
    threads: Optional[int] = ThreadsOpt,
    json_out: bool = JsonOpt,
):
    """Microbenchmark this machine with torch and write a fitted profile.

    GEMMs, HBM copies, 1-bit Adam and BinSGDM kernels, Adam on the device and on host cores,
    host<->device copies, and collectives through torch.distributed (NCCL on GPUs, gloo on CPUs)
    started with torchrun on 127.0.0.1.
    """
    import sys

    from clustersim.calibration.run import calibrate

    command = "clustersim " + " ".join(sys.argv[1:])
    for path in (out, raw_out):  # a bad output path fails before minutes of measurements
        if path is not None:
            check_writable_file(path, inputs=(cluster,))
    if raw_out is not None and same_file(raw_out, out):
        raise InputError(f"{raw_out} is also --out: the profile would replace the raw file", key="--raw-out")
    _refuse_options_of_the_other_mode(testbed is not None, locals())
    if testbed is not None:
        from clustersim.testbed.calibrate import calibrate_on_testbed

        with spinner(f"collectives over {testbed} emulated hosts at {rate}", json_out) as progress:
            profile = calibrate_on_testbed(
                testbed,
                rate,
                out,
                raw_out,
                min_bytes,
                max_bytes,
                ops,
                repeat,
                progress=progress,
                cpus_per_host=cpus_per_host,
            )
        _written_profile(profile, out, json_out, f" ({testbed} emulated hosts at {rate})")
        return
    with spinner("calibrate", json_out) as progress:
        profile = calibrate(
            device or "cuda",
            out,
            quick,
            ranks,
            raw_out,
            progress=None if json_out else progress,
            command=command,
            cluster=_cluster(cluster),
            threads=threads,
        )
    _written_profile(profile, out, json_out, f" (device {profile.device})")


# calibrate run's options that only one of its two modes reads: a testbed sweep (--testbed) measures
# collectives over gloo on emulated hosts; without it the sweep runs on this machine's devices
_TESTBED_ONLY = ("rate", "min_bytes", "max_bytes", "ops", "repeat", "cpus_per_host")
_DEVICE_ONLY = ("device", "quick", "ranks", "cluster")


def _refuse_options_of_the_other_mode(on_testbed: bool, given: dict) -> None:
    """An option the chosen mode would ignore, set to other than its default, is refused by name
    (--rate without --testbed calibrated the devices without a word about the rate)."""
    import inspect

    defaults = inspect.signature(calibrate_run).parameters
    for name in _DEVICE_ONLY if on_testbed else _TESTBED_ONLY:
        default = defaults[name].default
        if given[name] != getattr(default, "default", default):
            option = "--" + name.replace("_", "-")
            why = (
                "does not apply to a --testbed run (it measures collectives over gloo on the emulated hosts)"
                if on_testbed
                else "applies to a --testbed run only (this run measures this machine's devices)"
            )
            raise InputError(why, key=option)


@calibrate_app.command("fit")
@user_errors
def calibrate_fit(
    raw: Path = typer.Argument(
        ...,
        help="Raw measurement file (calibrate run --raw-out, with or without --testbed, or the torchrun "
        "sweep's --raw --out).",
    ),
    out: Path = typer.Option(Path("profile.json"), "--out", help="Profile to write (atomically)."),
    cluster: Optional[str] = RawClusterOpt,
    json_out: bool = JsonOpt,
):
    """Fit a profile from a raw measurement file and write it to --out.

    Fits the hardware rates the file holds, a segmented α-β fit and efficiency table per measured
    collective shape and, where the file records its network or --cluster describes it, the collective
    model's parameters (per link class bandwidth and latency, per-op efficiency, with their uncertainty)
    that price any scale. A refused file writes nothing."""
    import sys

    from clustersim.calibration.run import fit_file

    check_writable_file(out, inputs=(raw, cluster))
    command = "clustersim " + " ".join(sys.argv[1:])
    _written_profile(fit_file(raw, out, _cluster(cluster), command), out, json_out)


@calibrate_app.command("import-nccl-tests")
@user_errors
def calibrate_import(
    files: list[Path] = typer.Argument(..., help="nccl-tests outputs (text, or -J JSON)."),
    out: Path = typer.Option(Path("profile.json"), "--out", help="Profile to write (atomically)."),
    op: Optional[str] = typer.Option(None, "--op", help="Collective, if the files do not say."),
    ranks: Optional[int] = typer.Option(None, "--ranks", min=1, help="Ranks, if the files do not say."),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1, help="Nodes, if the files do not say."),
    cluster: Optional[str] = ClusterOpt,
    json_out: bool = JsonOpt,
):
    """Fit a profile from nccl-tests results (all_reduce_perf, all_gather_perf, ...)."""
    import sys

    from clustersim.calibration.nccl_tests import parse_file, to_raw
    from clustersim.calibration.run import save_profile

    check_writable_file(out, inputs=(*files, cluster))
    parsed = [parse_file(f, op, ranks, nodes) for f in files]
    profile = save_profile(to_raw(parsed, "clustersim " + " ".join(sys.argv[1:])), out, _cluster(cluster))
    _written_profile(profile, out, json_out, f" from {len(files)} file(s)")


@calibrate_app.command("model")
@user_errors
@interruptible
@with_catalogs
def calibrate_model(
    model: Optional[str] = typer.Option(None, "--model", help="Catalog model (shipped or --catalog)."),
    scenario: Optional[str] = typer.Option(None, "--scenario", help="Scenario file or preset: its workload."),
    hf_config: Optional[Path] = typer.Option(
        None, "--hf-config", help="Hugging Face config.json (needs transformers)."
    ),
    module: Optional[str] = typer.Option(
        None, "--module", help="MODULE:FUNCTION returning (nn.Module, batch); see docs/gpu-compute.md."
    ),
    name: Optional[str] = typer.Option(None, "--name", help="Name to store it under (default: the model's)."),
    implementation: Optional[str] = typer.Option(
        None,
        "--implementation",
        help="A catalog model's code: hf (its Hugging Face class; default where transformers is "
        "installed), torchvision (ResNets), plain (clustersim's plain-torch build).",
    ),
    layers: Optional[int] = typer.Option(None, "--layers", min=1, help="Fewer layers (stored as NAME-<N>L)."),
    seq_len: Optional[int] = typer.Option(
        None, "--seq-len", min=1, help="Default: the model's (ResNet: image side)."
    ),
    micro_batches: str = typer.Option("2,4,8", "--micro-batches", help="At least 3 sizes to fit."),
    holdout: Optional[int] = typer.Option(
        6, "--holdout", min=1, help="A size left out of the fit and predicted."
    ),
    device: str = typer.Option("cuda", "--device", help="cuda | cpu"),
    precision: Optional[str] = typer.Option(
        None,
        "--precision",
        help="fp32 | bf16 | fp16 autocast (default: the scenario's, else bf16 on cuda, fp32 on cpu).",
    ),
    attention: str = typer.Option("sdpa", "--attention", help="Catalog transformers: sdpa | eager."),
    optimizer: str = typer.Option("adamw", "--optimizer", help="adamw (fused on cuda) | sgd (momentum 0.9)."),
    steps: int = typer.Option(10, "--steps", min=2, help="Timed steps per micro-batch (median)."),
    warmup: int = typer.Option(3, "--warmup", min=0, help="Untimed steps first."),
    threads: Optional[int] = ThreadsOpt,
    out: Path = MergedOutOpt,
    base: Optional[Path] = AddToProfileOpt,
    catalog_out: Optional[Path] = typer.Option(
        None,
        "--catalog-out",
        help="--hf-config: also add the model's catalog entry (as `clustersim models import` makes it) "
        "under --name to this models file, so `clustersim run --catalog FILE` knows the model.",
    ),
    json_out: bool = JsonOpt,
):
    """Time your model on this machine: per phase (forward, backward, optimizer) host dispatch time,
    device busy time and kernel count at several micro-batch sizes, fitted linear in the micro-batch,
    one size held out and predicted, stored in a profile with the software's fingerprint."""
    import sys

    from clustersim.calibration.model_calibration import ModelChoice, calibrate_model

    check_writable_file(out)
    entry = _catalog_entry(hf_config, name, catalog_out)  # refused before minutes of measuring
    if attention not in ("sdpa", "eager"):
        raise InputError(f"unknown attention {attention!r} (sdpa or eager)", key="--attention")
    if optimizer not in ("adamw", "sgd"):
        raise InputError(f"unknown optimizer {optimizer!r} (adamw or sgd)", key="--optimizer")
    sizes = _int_list(micro_batches, "--micro-batches")
    choice = ModelChoice(model, scenario, hf_config, module, layers, name, implementation)
    command = "clustersim " + " ".join(sys.argv[1:])
    with spinner("calibrate model", json_out) as progress:
        profile, report = calibrate_model(
            choice,
            device,
            sizes,
            holdout,
            seq_len,
            precision,
            attention,
            optimizer,
            steps,
            warmup,
            out,
            base,
            threads,
            progress=progress,
            command=command,
        )
    if entry is not None:
        from clustersim.model_import import append_entry

        append_entry(catalog_out, entry[0], entry[1])
        report["catalog_out"] = str(catalog_out)
    if json_out:
        emit_json(report)
        return
    from clustersim.commands.support import err_console

    for warning in report["warnings"]:
        err_console.print(f"[yellow]warning: {warning}[/]")
    if report["note"]:
        console.print(f"note: {report['note']}")
    rows = []
    for m in report["measured"]:
        for phase, p in m["phases"].items():
            rows.append(
                [
                    f"{m['micro_batch']}{' (held out)' if m['held_out'] else ''}",
                    phase,
                    _ms(p["wall_s"]),
                    _ms(p["host_s"]),
                    _ms(p["device_s"]),
                    p["kernels"],
                    p["ops"],
                    _ms(p["profiled_wall_s"]),
                ]
            )
    console.print(
        table(
            f"{report['model']} {_shape(report['image'], report['seq_len'])} on {report['device']} "
            f"({report['precision']}{_threads(report['threads'])}), times in ms",
            ["micro-batch", "phase", "wall", "host", "device", "kernels", "ops", "profiled"],
            rows,
        )
    )
    if report["profiler_overhead_s_per_op"] is not None:
        console.print(
            f"profiler cost {report['profiler_overhead_s_per_op'] * 1e6:.2f} µs per recorded op "
            "(measured here, removed from the host times)"
        )
    _print_compute(profile)
    console.print(f"profile written to [bold]{out}[/]")
    if entry is not None:
        console.print(
            f"catalog entry {entry[0]!r} added to [bold]{catalog_out}[/]: run scenarios of it with "
            f"--catalog {catalog_out} --profile {out}"
        )
    elif hf_config is not None:
        console.print(
            f"to run scenarios of it, add its catalog entry: clustersim models import {hf_config} "
            f"--name {report['model']} --out models.yaml, then --catalog models.yaml "
            "(or measure with --catalog-out models.yaml)"
        )


def _catalog_entry(hf_config: Optional[Path], name: Optional[str], catalog_out: Optional[Path]):
    """(name, entry) that --catalog-out adds for --hf-config: `clustersim models import`'s entry of the
    same config, made and checked before anything is measured (an importer that refuses the config, a
    name the file already has, an unwritable file cost nothing)."""
    if catalog_out is None:
        return None
    if hf_config is None:
        raise InputError("--catalog-out writes the entry of an --hf-config model", key="--catalog-out")
    from clustersim import catalog
    from clustersim.io import shown_key
    from clustersim.model_import import arch_from_hf_config, check_append, read_hf_config

    file = hf_config / "config.json" if hf_config.is_dir() else hf_config
    entry = arch_from_hf_config(read_hf_config(file), str(file))
    name = name or (hf_config.parent.name if hf_config.is_file() else hf_config.name)  # as it is stored
    if shown_key(name) != name:  # a catalog refuses such a name when it is read back
        raise InputError(
            "not a name a catalog accepts (letters, digits and _ . + - / ( ) or spaces, at most 64)",
            key="--name",
        )
    catalog.check_model_name(name, key="--name")
    check_append(catalog_out, name, file)  # the refusals `models import --out` gives, before measuring
    return name, entry


def _shape(image: bool, seq_len: int) -> str:
    """How a measurement's input size reads: a CNN's image side, a transformer's sequence length."""
    return f"image {seq_len}x{seq_len}" if image else f"seq {seq_len}"


def _threads(threads: Optional[int]) -> str:
    return f", {threads} thread{'s' if threads != 1 else ''}" if threads else ""


def _int_list(text: str, key: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{text!r} is not a comma-separated list of integers", key=key) from None
    if any(v <= 0 for v in values):
        raise InputError("sizes must be positive", key=key)
    return values


@calibrate_app.command("import-trace")
@user_errors
@with_catalogs
def calibrate_import_trace(
    trace: Path = typer.Argument(..., help="torch.profiler Kineto JSON trace (.json or .json.gz)."),
    et: Optional[Path] = typer.Option(
        None, "--et", help="The same job's PyTorch execution trace (parameter tensors and count)."
    ),
    model: Optional[str] = typer.Option(None, "--model", help="Model name the scenario uses."),
    implementation: Optional[str] = typer.Option(
        None,
        "--implementation",
        help="The job's model code (workload.implementation): hf, torchvision, megatron, deepspeed, or "
        "your own name (default: the --model's default code).",
    ),
    micro_batch: Optional[int] = typer.Option(
        None, "--micro-batch", min=1, max=2**20, help="Micro-batch of the trace."
    ),
    seq_len: Optional[int] = typer.Option(
        None, "--seq-len", min=1, help="Sequence length (ResNet: image side)."
    ),
    step_time: Optional[float] = typer.Option(
        None,
        "--step-time",
        help="The same step timed without the profiler, in seconds (measures its overhead).",
    ),
    torch_version: Optional[str] = typer.Option(
        None,
        "--torch",
        help="The job's torch version, e.g. 2.11.0 (a Kineto trace does not record it; stored in the "
        "entry's fingerprint).",
    ),
    out: Path = MergedOutOpt,
    base: Optional[Path] = AddToProfileOpt,
    json_out: bool = JsonOpt,
):
    """A model's measured compute from your own training job's torch.profiler trace: per phase
    (forward, backward, optimizer) host dispatch time, device busy time and kernel count, and the
    per-op dispatch rates, stored in a profile."""
    import sys

    from clustersim.calibration.trace_import import import_trace
    from clustersim.commands.support import finite_option

    check_writable_file(out)
    step_time = finite_option(step_time, "--step-time")
    code_name = r"[A-Za-z0-9][A-Za-z0-9._:/+-]{0,199}"  # as workload.implementation takes it
    if implementation is not None and not re.fullmatch(code_name, implementation):
        raise InputError(f"{implementation[:80]!r} is not a code's name", key="--implementation")
    if torch_version is not None and not re.fullmatch(r"[0-9][A-Za-z0-9.+_-]{0,63}", torch_version):
        raise InputError(f"{torch_version[:80]!r} is not a torch version (e.g. 2.11.0)", key="--torch")
    profile, report = import_trace(
        trace,
        out,
        et,
        model,
        micro_batch,
        seq_len,
        step_time,
        base,
        "clustersim " + " ".join(sys.argv[1:]),
        implementation,
        torch_version,
    )
    if json_out:
        emit_json(report)
        return
    phases = report["phases"]
    console.print(
        table(
            f"{trace.name}: {report['steps_used']} of {report['steps_in_trace']} step(s), {report['device']}",
            ["phase", "profiled ms", "ops", "kernels", "host ms", "device ms"],
            [
                [
                    name,
                    _ms(p["profiled_wall_s"]),
                    f"{p['ops']:,.0f}",
                    f"{p['kernels']:,.0f}",
                    _ms(p["host_s"]),
                    _ms(p["device_s"]),
                ]
                for name, p in phases.items()
            ],
        )
    )
    console.print(
        f"profiler overhead {report['profiler_overhead_s_per_op'] * 1e6:.2f} µs per op "
        f"({report['profiler_overhead_source']})"
    )
    if report["execution_trace"]:
        console.print(
            f"execution trace: {report['param_tensors']:,} parameter tensors, "
            f"{report['params']:,} parameters (the optimizer's host time is per tensor)"
        )
    _print_compute(profile)
    note = "" if report["model_compute"] else " (dispatch rates only: name --model, --micro-batch, --seq-len)"
    console.print(f"profile written to [bold]{out}[/]{note}")


# The held-out error above which a model's fit is flagged: the target every held-out check of the
# calibration states (collective fits, `calibrate show`: "target <= 10%").
HOLDOUT_TARGET = 0.10


def _fit_warnings(m) -> list[str]:
    """What makes a measured model's fit untrustworthy, said where it is printed: a held-out size off
    by more than the target, or forward/backward time that did not grow with the micro-batch (the fit
    keeps per-sample times at zero or above, so noise that made a larger batch faster hides there)."""
    out = []
    if m.holdout is not None and abs(m.holdout.rel_error) > HOLDOUT_TARGET:
        out.append(
            f"the held-out micro-batch is {100 * m.holdout.rel_error:+.1f}% off (target within "
            f"{100 * HOLDOUT_TARGET:.0f}%): these times do not follow intercept + per-sample x "
            "micro-batch; a busy or throttled machine, or too few --steps, makes them scatter. "
            "Re-measure on a quiet machine with more --steps before pricing with this profile"
        )
    for name, ph in (("forward", m.forward), ("backward", m.backward)):
        if ph.device_s.per_sample_s <= 0 and ph.host_s.per_sample_s <= 0:
            out.append(
                f"{name}'s time did not grow with the micro-batch (0 ms per sample): the measurements "
                "scatter more than the work they add; re-measure with more --steps or larger micro-batches"
            )
    return out


def _print_compute(p) -> None:
    """A profile's measured model compute and dispatch rates."""
    from clustersim.calibration.profile import thread_mismatch

    for m in p.model_compute:
        fp = m.fingerprint
        console.print(
            table(
                f"{m.model} {_shape(_is_cnn(m.model), m.seq_len)}, micro-batches {m.micro_batches} on "
                f"{fp.device} ({fp.precision}, {fp.execution}{', ' + fp.attention if fp.attention else ''}): "
                "time = intercept + per-sample x micro-batch",
                ["phase", "host ms", "host ms/sample", "device ms", "device ms/sample", "kernels"],
                [
                    [
                        name,
                        _ms(ph.host_s.intercept_s),
                        _ms(ph.host_s.per_sample_s),
                        _ms(ph.device_s.intercept_s),
                        _ms(ph.device_s.per_sample_s),
                        ph.kernels,
                    ]
                    for name, ph in (
                        ("forward", m.forward),
                        ("backward", m.backward),
                        ("optimizer", m.optimizer),
                    )
                ],
            )
        )
        console.print(f"  {_measured_how(fp)}")
        if m.source:
            console.print(f"  source: {m.source}")
        mismatch = thread_mismatch(p, m)
        if mismatch:
            console.print(f"[yellow]warning: {mismatch}[/]")
        if m.holdout is not None:
            h = m.holdout
            console.print(
                f"held out micro-batch {h.micro_batch}: measured {_ms(h.measured_s)} ms, predicted "
                f"{_ms(h.predicted_s)} ms ({100 * h.rel_error:+.1f}%)"
            )
        for warning in _fit_warnings(m):
            console.print(f"[yellow]warning: {warning}[/]")
    d = p.dispatch
    if d is not None:
        console.print(
            f"dispatch rates ({d.fingerprint.device}{_threads(d.fingerprint.threads)}): host "
            f"{d.host_s_per_kernel_forward * 1e6:.1f} µs per "
            f"forward kernel, {d.host_s_per_kernel_backward * 1e6:.1f} µs per backward kernel, "
            f"{d.host_s_per_param_tensor * 1e6:.1f} µs per parameter tensor in the optimizer; device "
            f"{d.device_s_per_kernel * 1e6:.2f} µs fixed per kernel"
        )


@calibrate_app.command("check")
@user_errors
def calibrate_check(
    raw: list[Path] = typer.Argument(
        ...,
        help="Raw measurements to fit (calibrate run --raw-out, "
        "the torchrun sweep's --raw, a testbed sweep).",
    ),
    predict: list[Path] = typer.Option(
        [], "--predict", help="Raw files to predict (default: the same files); e.g. another link rate."
    ),
    train_ranks: Optional[str] = typer.Option(
        None,
        "--train-ranks",
        help="Group sizes to fit on, e.g. 2,4 (default: all but the largest). One group size (or files "
        "that measured one): message sizes above 1/8 of the largest are held out instead.",
    ),
    test_ranks: Optional[str] = typer.Option(
        None, "--test-ranks", help="Group sizes to predict, e.g. 8 (default: the largest)."
    ),
    cluster: Optional[str] = RawClusterOpt,
    json_out: bool = JsonOpt,
):
    """How well does a calibration extrapolate? Fit the collective model on small groups, predict larger
    groups (or another link rate) that were measured too, and report error and P10–P90 coverage.

    With one group size to fit (the files measured one, or --train-ranks names one) no node count can be
    held out: check fits the message sizes up to 1/8 of the largest measured at that group size and
    predicts the larger ones, and says that the node-count extrapolation was not checked."""
    from clustersim.calibration.check import run_check

    result = run_check(raw, predict, train_ranks, test_ranks, _cluster(cluster))
    if json_out:
        emit_json(result)
        return
    several = len(result["predicted"]) > 1  # rows of one op, group and size from two files
    rows = [
        [
            r["op"],
            *([r["file"]] if several else []),
            f"{r['nodes']}x{r['gpus_per_node']}",
            format_bytes(r["bytes"]),
            _ms(r["measured_s"]),
            _ms(r["predicted_s"]),
            f"{_ms(r['p10_s'])}–{_ms(r['p90_s'])}" + (" ✓" if r["inside"] else " ✗"),
            f"{100 * r['error']:+.1f}%",
        ]
        for r in result["rows"]
    ]
    console.print(
        table(
            _check_title(result, bool(predict)),
            ["op", *(["file"] if several else []), "nodes x ranks", "size", "measured", "predicted"]
            + ["P10–P90", "error"],
            rows,
        )
    )
    summary = result["summary"]
    for op, v in summary["by_op"].items():
        console.print(
            f"  {op}: median |error| {100 * v['median_abs_rel_error']:.1f}%, "
            f"max {100 * v['max_abs_rel_error']:.1f}%, inside P10–P90 {100 * v['p10_p90_coverage']:.0f}%"
        )
    console.print(
        f"[bold]all: median |error| {100 * summary['median_abs_rel_error']:.1f}%, max "
        f"{100 * summary['max_abs_rel_error']:.1f}%, inside P10–P90 {100 * summary['p10_p90_coverage']:.0f}% "
        f"of {summary['points']}[/]"
    )


def _check_title(result: dict, predicting: bool) -> str:
    """What `calibrate check` fitted and predicted: group sizes, and where the files are more than one
    or --predict names others, which files at which link rates."""

    def at(files: list[dict], ranks: list[int]) -> str:
        rates = sorted({f["link_rate_gbps"] for f in files if f["link_rate_gbps"]})
        names = ", ".join(f["file"] for f in files)
        rate = " and ".join(format_link_rate(r) for r in rates)
        return f"{rate + ' at ' if rate else ''}{ranks} ranks ({names})"

    if result["mode"] == "message_sizes":
        cut = format_bytes(result["cut_bytes"])
        fitted = f" of {', '.join(f['file'] for f in result['fitted'])}" if predicting else ""
        return (
            f"held out: {result['held_out']} (fitted on the sizes up to {cut}{fitted}); "
            f"{result['not_checked']} (times in ms)"
        )
    if predicting:
        return (
            f"fitted on {at(result['fitted'], result['train_ranks'])}, predicting "
            f"{at(result['predicted'], result['test_ranks'])} (times in ms)"
        )
    if len(result["fitted"]) > 1:
        return (
            f"fitted on {at(result['fitted'], result['train_ranks'])}, predicting {result['test_ranks']} "
            "(times in ms)"
        )
    return f"fitted on {result['train_ranks']} ranks, predicting {result['test_ranks']} (times in ms)"


@calibrate_app.command("show")
@user_errors
def calibrate_show(
    profile: str = typer.Argument(..., help="Profile file or builtin:NAME."), json_out: bool = JsonOpt
):
    """Show a profile: what it measured, on what, and how well its fits hold.

    Provenance, whether a collective and a network between nodes were measured (where not, collectives
    are priced by the defaults), measured rates (memory and kernels in bytes/s, links and collectives
    in bits/s), collective fits and their held-out accuracy. --json gives the profile's fields in the
    units its format names (rates in GB/s, a fit's β in s per byte, line rates in Gb/s) and
    network_coverage."""
    from clustersim.calibration.profile import load_profile

    p = load_profile(profile)
    if json_out:
        emit_json(_profile_json(p))
        return
    _print_profile(p)


def _profile_json(profile) -> dict:
    """A profile as --json prints it: its fields in the units the profile format documents (rates in GB/s,
    a fit's β in seconds per byte, link rates in Gb/s), without the raw measurements, and
    ``network_coverage``: whether a collective and a network were measured, and what the defaults price."""
    from clustersim.calibration.coverage import network_coverage

    return {**profile.model_dump(exclude={"raw"}), "network_coverage": network_coverage(profile)}


def _written_profile(profile, out: Path, json_out: bool, note: str = "") -> None:
    if json_out:
        emit_json(_profile_json(profile))
        return
    console.print(f"profile written to [bold]{out}[/]{note}")
    _print_profile(profile)
    _print_left_out(profile)


def _print_left_out(profile) -> None:
    """One warning line on stderr per block the fit left to the simulator's defaults, and one saying
    how many measurements it dropped (the profile's provenance lists each with its reason)."""
    from clustersim.commands.support import err_console

    prov = profile.provenance
    if prov.dropped:
        err_console.print(
            f"[yellow]warning: {len(prov.dropped)} stalled or outlying measurement(s) not fitted "
            "(listed with their reasons under provenance.dropped)[/]"
        )
    for line in prov.defaults:
        err_console.print(f"[yellow]warning: left at the simulator's defaults: {line}[/]")


def _alpha(alpha_s: float) -> str:
    """A segment's fixed cost: below 0.05 µs the fit found none it could tell from zero (a segment of
    large messages is all bandwidth), said so rather than '0.0 µs'."""
    if alpha_s < 0.05e-6:
        return "α ≈ 0 (none resolved)"
    return f"α {alpha_s * 1e6:,.1f} µs"


def _print_network(net) -> None:
    """The fitted collective model: what it found per link class and op, and how well it extrapolates."""
    import math

    sd = {name: math.sqrt(max(net.log_covariance[i][i], 0.0)) for i, name in enumerate(net.parameters)}

    def band(name: str, value: float, unit: float, fmt: str) -> str:
        lo, hi = value * math.exp(-1.2816 * sd[name]), value * math.exp(1.2816 * sd[name])
        return f"{fmt.format(value * unit)} [{fmt.format(lo * unit)}–{fmt.format(hi * unit)}]"

    rows = []
    for name, value in net.parameters.items():
        kind = name.partition(".")[0]
        # a factor to three decimals, three significant figures below 0.1 (0.00150, not 0.002)
        factor = "{:.3f}" if value * math.exp(-1.2816 * sd[name]) >= 0.1 else "{:#.3g}"
        unit, fmt = (1e6, "{:,.1f} µs") if kind in ("base_s", "hop_s") else (1.0, factor)
        rows.append([name, band(name, value, unit, fmt)])
    console.print(
        table(
            f"Fitted collective model ({net.backend}, {net.points} points, shapes "
            f"{', '.join(f'{n}x{g}' for n, g in net.shapes)}): value [P10–P90]",
            ["parameter", "value"],
            rows,
        )
    )
    links = _fitted_links(net)
    if links:
        console.print(links)
    algos = ", ".join(f"{k}: {v}" for k, v in net.algorithms.items()) or "NCCL's own choice (ring/tree)"
    console.print(
        f"algorithms: {algos}; scatter of medians about the model: {100 * net.residual_sigma:.1f}% (1σ)"
    )
    x = net.extrapolation
    if x is not None:
        ok = "✓" if x.median_abs_rel_error <= 0.05 and x.max_abs_rel_error <= 0.15 else "✗"
        console.print(
            f"extrapolation check: fitted on {x.fitted_on_ranks} ranks, predicted {x.predicted_ranks}: "
            f"median |error| {100 * x.median_abs_rel_error:.1f}%, max {100 * x.max_abs_rel_error:.1f}%, "
            f"{100 * x.p10_p90_coverage:.0f}% of {x.points} measurements inside P10–P90; {ok} "
            "(✓: median |error| at most 5% and max at most 15%)"
        )
    else:
        console.print(_unchecked_extrapolation(net.shapes))


def _fitted_links(net) -> str:
    """The NIC the fit's network factor is relative to, and the rate it found: bw_eff.net_<kind> times
    what such a NIC delivers in the model (its line rate x the kind's protocol efficiency, or its measured
    rate). Empty where the fit measured no network between nodes."""
    from clustersim.scenario import ClusterSpec
    from clustersim.topologies.node import nic_bandwidth

    spec = ClusterSpec.model_validate(net.cluster)
    factor = net.parameters.get(f"bw_eff.net_{spec.nic.kind}")
    if factor is None:
        return ""
    nic, modelled = spec.nic, nic_bandwidth(spec)
    return (
        f"network links: {nic.count} x {nic.kind} NIC at {format_link_rate(nic.line_rate_gbps)} line rate "
        f"per node; fitted rate per NIC {format_rate(factor * modelled, bits=True)} "
        f"(bw_eff.net_{nic.kind} {factor:.3g} x the modelled {format_rate(modelled, bits=True)})"
    )


def _unchecked_extrapolation(shapes) -> str:
    """Why a network fit has no extrapolation check (it needs three group sizes: fit on all but the
    largest, predict it), and what that leaves to a prediction at more nodes than were measured."""
    from clustersim.cost_models.network_params import NODE_EXTRAPOLATION_SIGMA

    groups = sorted({n * g for n, g in shapes})
    nodes = max((n for n, _ in shapes), default=0)
    measured = (
        f"one group size ({', '.join(f'{n}x{g}' for n, g in shapes)})"
        if len(groups) == 1
        else f"{len(groups)} group sizes ({groups} ranks; the check needs 3)"
    )
    text = (
        f"[yellow]extrapolation check: none: the fit measured {measured}, so its node-count "
        "extrapolation is unchecked"
    )
    if nodes >= 2:
        text += (
            f"; past {nodes} nodes its P10–P90 widens by a log-σ of {NODE_EXTRAPOLATION_SIGMA} per e-fold of "
            "the node count (measured on other sweeps, not this one)"
        )
    return text + "[/]"


def _is_cnn(model: str) -> bool:
    """Whether a measured model is a catalog CNN (its seq_len is an image side)."""
    from clustersim import catalog

    try:
        return catalog.model(model).family == "resnet"
    except InputError:  # the user's own label (--module, an imported trace): not a catalog model
        return False


def _measured_how(fp) -> str:
    """A measurement's code, optimizer, threads and machine, in one line ('not recorded' where a trace or
    an older profile does not say)."""
    unknown = "not recorded"
    return (
        f"code {fp.implementation or unknown}, optimizer {fp.optimizer or unknown}, torch "
        f"{fp.torch or unknown}, threads {fp.threads or unknown}, "
        f"machine {fp.cpu or fp.device}{' (' + fp.host + ')' if fp.host else ''}"
    )


def _print_provenance(p) -> None:
    prov = p.provenance.model_dump(
        exclude_none=True, exclude={"dropped", "defaults", "commands", "testbed", "collective_sweep"}
    )
    console.print(f"[bold]profile[/] format v{p.format_version}, device [bold]{p.device}[/]")
    for k, v in prov.items():
        console.print(f"  {k}: {v}")
    for line in _measured_on(p.provenance):
        console.print(f"  {line}")
    commands = p.provenance.commands
    if len(commands) > 1 or (commands and commands[0].source != p.provenance.source):
        console.print(
            f"  commands that wrote into it ({len(commands)}, oldest first), each with the machine it ran on:"
        )
        for i, c in enumerate(commands, 1):
            how = ", ".join(
                x
                for x in (
                    c.date,
                    c.cpu or c.device_name,
                    c.host,
                    f"torch {c.torch}" if c.torch else None,
                    _threads(c.threads).lstrip(", ") or None,
                    "quick" if c.quick else None,
                )
                if x
            )
            console.print(f"    {i}. {c.source}")
            console.print(f"       {how or 'machine not recorded'}; wrote {c.wrote or 'not recorded'}")
    if p.provenance.dropped:
        console.print(f"  measurements not fitted: {len(p.provenance.dropped)} (provenance.dropped)")
    for line in p.provenance.defaults:
        console.print(f"  left at defaults: {line}")


def _measured_on(prov) -> list[str]:
    """What the collectives were measured on, in lines: the emulated testbed (hosts, link rate, each
    host's CPU share, the machine) and what the sweep covered; 'not recorded' where the sweep did not say,
    nothing where the profile has no collective sweep."""
    lines = []
    tb = prov.testbed
    if tb is not None:
        unknown = "not recorded"
        machine = ", ".join(
            x
            for x in (
                tb.machine,
                f"{tb.machine_cpus} cores" if tb.machine_cpus else None,
                f"Linux {tb.kernel}" if tb.kernel else None,
            )
            if x
        )
        lines.append(
            f"testbed: emulated, not real NICs: {tb.hosts or unknown} hosts ({tb.emulated}); "
            f"machine {machine or unknown}"
        )
        rate = format_link_rate(tb.line_rate_gbps) if tb.line_rate_gbps else unknown
        how = f" shaped with tc {tb.shaper}" if tb.shaper else ""
        lines.append(f"  link per host: {rate} ({tb.kind or 'kind ' + unknown}){how}")
        lines.append(f"  CPU per host: {_cpu_share(tb)}")
    sweep = prov.collective_sweep
    if sweep is not None:
        groups = ", ".join(f"{n}x{g}" for n, g in sweep.groups)
        lines.append(
            f"collectives swept: {', '.join(sweep.ops)}; {sweep.sizes} sizes "
            f"{format_bytes(sweep.min_bytes)}–{format_bytes(sweep.max_bytes)}; "
            f"groups (nodes x ranks) {groups}; "
            + (f"{sweep.repeats} timed repeats per size" if sweep.repeats else "repeats not recorded")
        )
    return lines


def _cpu_share(tb) -> str:
    """An emulated host's CPU: its share in cores and how (CFS quota per period, slices, cores)."""
    if tb.cpus_per_host is None:
        return "not recorded"
    if tb.cpus_per_host == 0:
        return "no share (the hosts shared the machine's cores)"
    text = f"{tb.cpus_per_host:g} core"
    shares = tb.host_cpu_shares or []
    quotas = {(s.cpu_quota_us, s.cpu_period_us) for s in shares}
    if len(quotas) == 1:
        quota, period = quotas.pop()
        text += f" (CFS quota {quota:,} µs per {period:,} µs"
        if tb.cfs_bandwidth_slice_us:
            text += f", {tb.cfs_bandwidth_slice_us:,g} µs slices"
        text += ")"
    elif shares:
        text += (
            " (quota/period µs by host: "
            + ", ".join(f"h{i} {s.cpu_quota_us}/{s.cpu_period_us}" for i, s in enumerate(shares))
            + ")"
        )
    if any(s.cpus for s in shares):
        text += "; cores by host: " + ", ".join(
            f"h{i} {','.join(map(str, s.cpus))}" for i, s in enumerate(shares) if s.cpus
        )
    return text


def _print_coverage(p) -> None:
    """One line saying what of the network the profile measured: in yellow where no network between
    nodes was (a one-GPU profile prices every collective by the defaults)."""
    from clustersim.calibration.coverage import network_coverage

    cov = network_coverage(p)
    line = f"network: {cov['summary']}"
    console.print(line if cov["network_measured"] else f"[yellow]{line}[/]", soft_wrap=True)


def _gbs(gbs: float) -> str:
    """A rate the profile stores in GB/s (memory, kernels, host copies), as format_rate prints bytes."""
    return format_rate(gbs * 1e9, bits=False)


def _busbw(gbs: float) -> str:
    """A bus bandwidth the profile stores in GB/s, in bits per second as a link's rate is quoted."""
    return format_rate(gbs * 1e9, bits=True)


def _print_profile(p) -> None:
    _print_provenance(p)
    _print_coverage(p)
    if p.matmul_tflops:
        console.print(
            table(
                "GEMM (largest size measured)",
                ["precision", "TFLOP/s"],
                [[k, f"{v:,.2f}"] for k, v in p.matmul_tflops.items()],
            )
        )
    if p.memory_gbs:
        stream = p.copy_stream_gbs
        between = f" (streaming {_gbs(stream)} between the two largest copies)" if stream else ""
        console.print(f"memory copy: {_gbs(p.memory_gbs)}{between}")
    if p.kernels_gbs:
        console.print(
            table(
                "Kernels (bytes as the cost model counts them / measured time)",
                ["kernel", "rate"],
                [[k, _gbs(v)] for k, v in p.kernels_gbs.items()],
            )
        )
    if p.host.cpu_adam_params_per_s:
        console.print(
            table(
                "CPU Adam on host cores",
                ["threads", "Mparams/s"],
                [[k, f"{v / 1e6:,.1f}"] for k, v in sorted(p.host.cpu_adam_params_per_s.items())],
            )
        )
    if p.host.copy_gbs:
        console.print(
            table(
                "Host<->device copies",
                ["kind", "rate"],
                [[k, _gbs(v)] for k, v in p.host.copy_gbs.items()],
            )
        )
    if p.compute_phases:
        console.print(
            table(
                "Measured compute phases per micro-step",
                ["model", "mb", "seq", "fwd ms", "bwd ms", "other ms"],
                [
                    [c.model, c.micro_batch, c.seq_len, _ms(c.forward_s), _ms(c.backward_s), _ms(c.other_s)]
                    for c in p.compute_phases
                ],
            )
        )
    if p.model_compute or p.dispatch is not None:
        _print_compute(p)
    if p.collectives:
        from clustersim.calibration.fit import MIN_POINTS_PER_SEGMENT

        need = 2 * MIN_POINTS_PER_SEGMENT  # fit_collective holds out every other size of at least these
        rows = []
        for f in p.collectives:
            q = f.quality
            seg = "; ".join(
                f"≥{format_bytes(s[0]) if s[0] else '0 B'}: {_alpha(s[1])}, "
                + (format_rate(1 / s[2], bits=True) if s[2] > 1e-13 else "latency-bound")
                for s in f.segments
            )
            held = (
                "-"
                if q is None
                else f"none ({q.points} sizes)"
                if q.holdout_max_rel_error is None
                else f"{100 * q.holdout_max_rel_error:.1f}%"
            )
            ok = (
                ""
                if q is None or q.holdout_max_rel_error is None
                else (" ✓" if q.holdout_max_rel_error <= 0.10 else " ✗")
            )
            rows.append(
                [
                    f.op,
                    f"{f.nodes}x{f.gpus_per_node}",
                    seg,
                    "-" if q is None else f"{100 * q.residual_rms_rel:.1f}%",
                    held + ok,
                ]
            )
        console.print(
            table(
                "Collective fits (time = α + bytes/bandwidth per segment, bandwidth in message bits/s)",
                ["op", "nodes x ranks", "segments", "fit RMS", "held-out max"],
                rows,
            )
        )
        console.print(
            "[dim]held-out: fit to every other size, error on the sizes left out; target ≤ 10% (✓); "
            f"none: fewer than {need} sizes were measured (--quick measures fewer), too few to leave "
            "any out[/]"
        )
        if p.network is not None:
            _print_network(p.network)
        sizes = sorted({s for f in p.collectives for s, _ in f.busbw_by_size})
        if sizes:
            shown = sizes[:: -(-len(sizes) // 7)]  # at most 7 columns
            console.print(
                table(
                    "Measured bus bandwidth by size, bits per second (per-size efficiency table)",
                    ["op", "nodes x ranks", *[format_bytes(s).replace(".00", "") for s in shown]],
                    [
                        [
                            f.op,
                            f"{f.nodes}x{f.gpus_per_node}",
                            *[next((_busbw(b) for s, b in f.busbw_by_size if s == x), "-") for x in shown],
                        ]
                        for f in p.collectives
                    ],
                )
            )
        # the measuring tools write each record's p10/p90; a hand-made raw file may leave them out
        spread = [r for r in (p.raw or {}).get("collectives") or [] if "p10_s" in r and "p90_s" in r]
        if spread:
            import statistics

            rel = statistics.median(
                (r["p90_s"] - r["p10_s"]) / r["median_s"] for r in spread if r["median_s"] > 0
            )
            console.print(
                f"[dim]measurement spread (p10-p90 / median, median over sizes): {100 * rel:.0f}%[/]"
            )
