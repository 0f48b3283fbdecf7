"""The clustersim command line: a thin shell over functions that return plain result objects.

Every command that prints results takes --json; every input error is one line and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from clustersim import catalog
from clustersim.cli_support import console, emit_json, table, user_errors
from clustersim.errors import InputError
from clustersim.units import format_bytes, format_seconds, parse_bytes

app = typer.Typer(
    name="clustersim", no_args_is_help=True, add_completion=False, rich_markup_mode="rich",
    help="Simulate distributed deep-learning training on a cluster: iteration time, where it goes, "
         "and what compressed optimizers (1-bit Adam, 0/1 Adam, BinSGDM) would change.\n\n"
         "SCENARIO arguments take a YAML/JSON file or [bold]preset:NAME[/] (see `clustersim presets list`).",
)
hardware_app = typer.Typer(help="The GPU catalog.", no_args_is_help=True)
models_app = typer.Typer(help="The model catalog (parameters, FLOPs computed from the architecture).", no_args_is_help=True)
topology_app = typer.Typer(help="Inspect a scenario's cluster topology.", no_args_is_help=True)
presets_app = typer.Typer(help="Shipped scenarios for published clusters.", no_args_is_help=True)
offload_app = typer.Typer(help="CPU optimizer offload: ZeRO-Offload and interleaved (Deep Optimizer States).",
                          no_args_is_help=True)
calibrate_app = typer.Typer(help="Measure your own hardware (torch microbenchmarks, collectives, nccl-tests) "
                                 "and fit a versioned profile that --profile feeds to every simulating command.",
                            no_args_is_help=True)
app.add_typer(hardware_app, name="hardware")
app.add_typer(models_app, name="models")
app.add_typer(topology_app, name="topology")
app.add_typer(presets_app, name="presets")
app.add_typer(calibrate_app, name="calibrate")
app.add_typer(offload_app, name="offload")

ScenarioArg = typer.Argument(..., help="Scenario file (YAML/JSON) or preset:NAME.")
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")
ProfileOpt = typer.Option(None, "--profile", help="Calibration profile (file or builtin:NAME); measured costs win over defaults.")


def _load(ref: str):
    from clustersim.scenario import load_scenario

    return load_scenario(ref)


def _ms(t: float) -> str:
    return f"{t * 1e3:,.2f}"


def _print_result(r) -> None:
    console.print(f"[bold]{r.scenario}[/]: {r.world_size} GPUs ({r.nodes} x {r.gpus_per_node}), optimizer {r.optimizer}")
    console.print(f"iteration time [bold]{format_seconds(r.iteration_time)}[/], "
                  f"[bold]{r.samples_per_s:,.1f}[/] samples/s ({r.samples_per_iteration} samples per iteration)")
    rows = [[k.replace("_", " "), _ms(v), f"{100 * v / r.iteration_time:.1f}%"]
            for k, v in r.breakdown.items() if v > 0]
    console.print(table("Where the iteration goes", ["part", "ms", "share"], rows))
    if r.extra.get("steps"):
        console.print(table("Kinds of step (the iteration time above is their weighted average)",
                            ["step kind", "share of steps", "ms", "inter-node bytes"],
                            [[st["label"], f"{100 * st['weight']:.1f}%", _ms(st["iteration_time_s"]),
                              format_bytes(st["inter_node_bytes"])] for st in r.extra["steps"]]))
    if r.buckets:
        shown = r.buckets if len(r.buckets) <= 12 else r.buckets[:6] + r.buckets[-6:]
        console.print(table(f"Gradient all-reduce per bucket ({len(r.buckets)} buckets"
                            f"{', first and last 6 shown' if len(r.buckets) > 12 else ''})",
                            ["bucket", "size", "start ms", "end ms"],
                            [[b["bucket"], format_bytes(b["bytes"]), _ms(b["start_s"]), _ms(b["end_s"])] for b in shown]))
    bl = r.bytes_per_link_kind
    console.print(table("Bytes moved per node per iteration", ["link kind", "bytes"], [
        [f"intra-node ({bl['intra_node_link']})", format_bytes(bl["intra_node_per_node"])],
        ["inter-node (NIC egress)", format_bytes(bl["inter_node_per_node"])]]))
    mem = r.memory
    console.print(f"GPU memory per rank: {format_bytes(mem['total'])} of {format_bytes(mem['capacity'])} "
                  f"(forward/backward peak {format_bytes(mem['peak_forward_backward'])}, "
                  f"update peak {format_bytes(mem['peak_update'])})")
    if "offload" in r.extra:
        _print_placement(r.extra["offload"])
    for k, v in r.sources.items():
        console.print(f"[dim]source of {k}: {v}[/]")
    for n in r.notes:
        console.print(f"[dim]note: {n}[/]")


@app.command()
@user_errors
def run(scenario: str = ScenarioArg, json_out: bool = JsonOpt,
        trace: Optional[Path] = typer.Option(None, "--trace", help="Write a Chrome/Perfetto trace (one track per stream)."),
        profile: Optional[str] = ProfileOpt):
    """Simulate one training iteration: time, samples/s, breakdown, per-bucket all-reduce, bytes per link."""
    from clustersim.simulator import simulate

    result = simulate(_load(scenario), profile)
    if trace is not None:
        result.write_trace(trace)
    if json_out:
        emit_json(result.to_dict())
    else:
        _print_result(result)
        if trace is not None:
            console.print(f"trace written to {trace} (open in https://ui.perfetto.dev or chrome://tracing)")


@app.command()
@user_errors
def collective(scenario: str = ScenarioArg,
               op: str = typer.Option("all_reduce", "--op", help="all_reduce | all_gather | reduce_scatter | all_to_all | broadcast"),
               size: str = typer.Option("32MiB", "--bytes", help="Message size: 512, 64KiB, 32MiB, 1GB ..."),
               algo: str = typer.Option("auto", "--algo", help="auto (NCCL-like choice) | ring | tree | hd | hier"),
               group: str = typer.Option("world", "--group", help="world | intra (one node) | inter (one GPU per node)"),
               json_out: bool = JsonOpt, profile: Optional[str] = ProfileOpt):
    """Predicted time of one collective on the scenario's cluster, the algorithm chosen and its busbw."""
    from clustersim.simulator.context import build_context
    from clustersim.topologies import GroupShape

    s = _load(scenario)
    ctx = build_context(s, profile)
    c = s.cluster
    shapes = {"world": GroupShape(c.nodes, c.gpus_per_node), "intra": GroupShape(1, c.gpus_per_node),
              "inter": GroupShape(c.nodes, 1)}
    if group not in shapes:
        raise InputError(f"unknown group {group!r} (world, intra, inter)", key="--group")
    try:
        nbytes = parse_bytes(size)
    except InputError as exc:
        raise exc.located(key_prefix="--bytes") from None
    cost = ctx.collectives.cost(op, nbytes, shapes[group], algo)
    data = {"op": op, "bytes": nbytes, "ranks": cost.ranks, "group": group, "algorithm": cost.algorithm,
            "protocol": cost.protocol, "time_s": cost.time, "algbw_gbs": cost.algbw / 1e9,
            "busbw_gbs": cost.busbw / 1e9, "bottleneck": cost.bottleneck,
            "intra_node_bytes_per_node": cost.intra_node_bytes, "inter_node_bytes_per_node": cost.inter_node_bytes}
    if json_out:
        emit_json(data)
        return
    console.print(f"{op} of {format_bytes(nbytes)} over {cost.ranks} ranks ({group}): "
                  f"[bold]{format_seconds(cost.time)}[/] with {cost.algorithm}/{cost.protocol}")
    console.print(f"algbw {cost.algbw / 1e9:.2f} GB/s, busbw {cost.busbw / 1e9:.2f} GB/s; bottleneck: {cost.bottleneck}")


def _int_list(text: str, key: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {text!r}", key=key) from None
    if not values:
        raise InputError("empty list", key=key)
    return values


@app.command()
@user_errors
def compare(scenario: str = ScenarioArg,
            optimizers: str = typer.Option("adam,onebit-adam,zero-one-adam,binsgdm", "--optimizers",
                                           help="Comma-separated: adam, sgdm, onebit-adam, zero-one-adam, binsgdm."),
            gpus: str = typer.Option("8,16,32,64,128,256,512,1024", "--gpus", help="Comma-separated total GPU counts."),
            steps: Optional[int] = typer.Option(None, "--steps", help="Total training steps, for time-to-train."),
            warmup: Optional[float] = typer.Option(None, "--warmup", help="1-bit Adam warmup fraction of the steps, in [0, 1) (default 0.15, or freeze_step/steps)."),
            json_out: bool = JsonOpt, profile: Optional[str] = ProfileOpt):
    """Optimizers side by side per GPU count: time split, samples/s, speedup, bytes on the wire, time-to-train."""
    from rich.progress import Progress

    from clustersim.compare import compare as run_compare

    s = _load(scenario)
    opts = [o.strip() for o in optimizers.split(",") if o.strip()]
    counts = _int_list(gpus, "--gpus")
    if json_out:
        rows = run_compare(s, opts, counts, steps, warmup, profile)
        emit_json([r.as_dict() for r in rows])
        return
    with Progress(transient=True, console=console) as bar:
        task = bar.add_task("simulating", total=len(opts) * len(counts))
        rows = run_compare(s, opts, counts, steps, warmup, profile, progress=lambda: bar.advance(task))
    base = "adam" if "adam" in opts else opts[0]
    console.print(table(f"{s.name}: iteration time split, ms (speedup over {base})",
                        ["GPUs", "optimizer", "iter", "compute", "comm", "compress", "optim", "samples/s", "speedup"],
                        [[r.gpus, r.optimizer, f"{r.iteration_time_s * 1e3:,.0f}", f"{r.compute_s * 1e3:,.0f}",
                          f"{r.exposed_communication_s * 1e3:,.0f}", f"{r.compression_s * 1e3:,.0f}",
                          f"{r.optimizer_s * 1e3:,.0f}", f"{r.samples_per_s:,.0f}", f"{r.speedup:.2f}x"] for r in rows],
                        left=2))
    console.print("[dim]compute = forward + backward; comm = exposed communication; compress = compression kernels; "
                  "optim = optimizer step and other per-step work[/]")
    cols = ["GPUs", "optimizer", "intra-node/step", "inter-node/step"] + (["time to train", "speedup"] if steps else [])
    console.print(table("Bytes per node per step" + (f" and time to train ({steps:,} steps)" if steps else ""), cols,
                        [[r.gpus, r.optimizer, format_bytes(r.intra_node_bytes), format_bytes(r.inter_node_bytes)]
                         + ([f"{r.time_to_train_s / 3600:,.1f} h", f"{r.time_to_train_speedup:.2f}x"] if steps else [])
                         for r in rows], left=2))
    if steps:
        from clustersim.compare import warmup_fraction

        console.print(f"[dim]time to train over {steps:,} steps; 1-bit Adam warmup fraction "
                      f"{warmup_fraction(s, steps, warmup):.2f} at its warmup-stage speed[/]")


@app.command()
@user_errors
def validate(dataset: str = typer.Option("onebit_adam_ethernet", "--dataset", help="Shipped published measurements."),
             json_out: bool = JsonOpt, profile: Optional[str] = ProfileOpt):
    """Compare predictions with published measurements shipped as data; print per-row and median error."""
    from clustersim.validation.published import validate as run_validate

    report = run_validate(dataset, profile)
    d = report.dataset
    if json_out:
        emit_json({"dataset": d.name, "source": d.source, "metric": d.metric,
                   "rows": [r.as_dict() for r in report.rows],
                   "median_abs_error": report.median_abs_error, "max_abs_error": report.max_abs_error})
        return
    console.print(f"[bold]{d.description}[/]\n[dim]{d.source}[/]")
    console.print(table(f"{d.metric}: predicted vs published", ["optimizer", "GPUs", "published", "predicted", "error"],
                        [[r.optimizer, r.gpus, f"{r.published:,.1f}", f"{r.predicted:,.1f}", f"{100 * r.error:+.1f}%"]
                         for r in report.rows], left=2))
    console.print(f"median absolute error [bold]{100 * report.median_abs_error:.1f}%[/], "
                  f"largest {100 * report.max_abs_error:.1f}%")


@hardware_app.command("list")
@user_errors
def hardware_list(json_out: bool = JsonOpt):
    """List the GPUs in the catalog."""
    gpus = catalog.gpus()
    if json_out:
        emit_json({n: g.model_dump() for n, g in gpus.items()})
        return
    rows = [[n, g.peak_tflops.get("fp16", g.peak_tflops["fp32"]), g.peak_tflops.get("bf16", "-"), g.hbm_gbs,
             g.memory_gib, f"{g.nvlink.links} x {g.nvlink.gbs_per_link}", g.pcie_gen] for n, g in gpus.items()]
    console.print(table("GPUs", ["name", "fp16 TFLOP/s", "bf16 TFLOP/s", "HBM GB/s", "GiB", "NVLink (GB/s)", "PCIe gen"], rows))


@hardware_app.command("show")
@user_errors
def hardware_show(name: str = typer.Argument(..., help="GPU name, e.g. H100-SXM"), json_out: bool = JsonOpt):
    """Show one GPU's properties."""
    g = catalog.gpu(name)
    if json_out:
        emit_json(g.model_dump())
        return
    console.print(f"[bold]{g.name}[/]: {g.description}")
    for k, v in g.model_dump(exclude={"name", "description"}).items():
        console.print(f"  {k}: {v}")


@models_app.command("list")
@user_errors
def models_list(json_out: bool = JsonOpt):
    """List catalog models with parameter counts computed from their architectures."""
    from clustersim.scenario import WorkloadSpec
    from clustersim.workloads import build_workload

    rows = []
    for name, arch in catalog.models().items():
        w = build_workload(WorkloadSpec(model=name, micro_batch=1))
        rows.append({"name": name, "family": arch.family, "params": w.params,
                     "forward_gflops_per_sample": w.forward_flops / 1e9, "default_seq_len": w.seq_len})
    if json_out:
        emit_json(rows)
        return
    console.print(table("Models", ["name", "family", "parameters (M)", "fwd GFLOP/sample", "seq"],
                        [[r["name"], r["family"], f"{r['params'] / 1e6:,.1f}", f"{r['forward_gflops_per_sample']:,.1f}",
                          r["default_seq_len"]] for r in rows]))


@models_app.command("show")
@user_errors
def models_show(name: str = typer.Argument(..., help="Model name, e.g. BERT-Large"),
                micro_batch: int = typer.Option(1, "--micro-batch", min=1), seq_len: Optional[int] = typer.Option(None, "--seq-len", min=1),
                json_out: bool = JsonOpt):
    """Show a model's layers: parameters, forward FLOPs and saved activations per micro-batch."""
    from clustersim.scenario import WorkloadSpec
    from clustersim.workloads import build_workload

    arch = catalog.model(name)
    w = build_workload(WorkloadSpec(model=name, micro_batch=micro_batch, seq_len=seq_len))
    layers = [{"layer": l.name, "params": l.params, "forward_gflops": l.forward_flops / 1e9,
               "activation_bytes": l.activation_bytes} for l in w.layers]
    if json_out:
        emit_json({"name": name, "architecture": arch.model_dump(), "params": w.params, "layers": layers})
        return
    console.print(f"[bold]{name}[/]: {arch.description}; {w.params:,} parameters; micro-batch {micro_batch}, seq {w.seq_len}")
    console.print(table("Layers", ["layer", "params", "fwd GFLOP", "activations"],
                        [[l["layer"], f"{l['params']:,}", f"{l['forward_gflops']:,.2f}", format_bytes(l["activation_bytes"])]
                         for l in layers]))


@topology_app.command("show")
@user_errors
def topology_show(scenario: str = ScenarioArg, json_out: bool = JsonOpt):
    """Nodes, link kinds and bandwidths, and the bottleneck link of each collective group."""
    from clustersim.topologies import GroupShape, build_cluster

    s = _load(scenario)
    cl = build_cluster(s.cluster)
    c = s.cluster
    groups = {"intra-node (one node's GPUs)": GroupShape(1, c.gpus_per_node)}
    if c.nodes > 1:
        groups["inter-node rail (one GPU per node)"] = GroupShape(c.nodes, 1)
        groups["world (all GPUs)"] = GroupShape(c.nodes, c.gpus_per_node)
    info = cl.describe()
    info["groups"] = {name: {"ranks": g.ranks, "ring_busbw_gbs": cl.ring(g).bytes_per_s / 1e9,
                             "bottleneck": cl.ring(g).bottleneck} for name, g in groups.items()}
    if json_out:
        emit_json(info)
        return
    console.print(f"[bold]{s.name}[/]: {c.nodes} nodes x {c.gpus_per_node} {cl.gpu.name} = {c.world_size} GPUs, "
                  f"intra-node {c.intra_node.fabric}, {c.nic.count} x {c.nic.kind} NIC, fabric {c.fabric.kind}")
    console.print(table("Links inside one node", ["kind", "directed edges", "GB/s per direction"],
                        [[k, v["directed_edges_per_node"], ", ".join(map(str, v["gbs_per_direction"]))]
                         for k, v in info["link_kinds"].items()]))
    console.print(f"NIC: {info['nic']['gbs_each']:.3f} GB/s each ({'measured' if info['nic']['measured'] else 'line rate x efficiency'})")
    console.print(table("Collective groups", ["group", "ranks", "ring busbw GB/s", "bottleneck"],
                        [[n, g["ranks"], f"{g['ring_busbw_gbs']:.2f}", g["bottleneck"]] for n, g in info["groups"].items()]))


@presets_app.command("list")
@user_errors
def presets_list(json_out: bool = JsonOpt):
    """List shipped scenarios (use as preset:NAME)."""
    from clustersim.scenario import load_scenario, preset_names

    rows = [(n, load_scenario(f"preset:{n}").description) for n in preset_names()]
    if json_out:
        emit_json([{"name": n, "description": d} for n, d in rows])
        return
    console.print(table("Presets (use as preset:NAME)", ["name", "description"], [list(r) for r in rows], justify_numbers=False))


def _print_placement(off: dict) -> None:
    pl = off["placement"]
    console.print(f"offload ({off['mode']}): {off['subgroups']} subgroups of {off['subgroup_params'] / 1e6:,.1f}M parameters: "
                  f"{pl['cpu']} on the CPU, {pl['gpu_streamed']} streamed to the GPU, {pl['gpu_resident']} resident on the GPU "
                  f"(chosen by: {off['chosen_by']}); CPU optimizer {off['cpu_params_per_s'] / 1e9:,.2f} Gparams/s, "
                  f"PCIe {off['pcie_gbs']:.0f} GB/s, host DRAM {off['host_dram_gbs_per_gpu']:.0f} GB/s per GPU")


@app.command()
@user_errors
def sweep(sweep_file: Path = typer.Argument(..., help="Sweep file: base scenario + lists of values to vary."),
          out: Path = typer.Option(Path("results"), "--out", help="Results folder (created; a re-run resumes it)."),
          scheduler: Optional[str] = typer.Option(None, "--scheduler", help="tcp://HOST:8786 of an existing Dask cluster; default: an in-process one."),
          workers: int = typer.Option(1, "--workers", min=1, help="Threads of the in-process Dask cluster."),
          json_out: bool = JsonOpt):
    """Run a what-if sweep on Dask; rows are written to OUT/results.csv as they finish."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from clustersim.sweeps.run import run_sweep
    from clustersim.sweeps.spec import load_sweep

    sw = load_sweep(sweep_file)
    if json_out:
        counts = run_sweep(sw, out, scheduler, workers)
        emit_json({"out": str(out), **counts})
        return
    console.print(f"sweep [bold]{sw.spec.name}[/]: {len(sw.rows())} rows over {', '.join(sw.axes)} -> {out}/")
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task("simulating", total=len(sw.rows()))
        counts = run_sweep(sw, out, scheduler, workers, progress=lambda done, total: bar.update(task, completed=done))
    console.print(f"{counts['written']} rows simulated, {counts['skipped']} already done; results in {out}/results.csv")


@app.command()
@user_errors
def report(results: Path = typer.Argument(..., help="A sweep's results folder."),
           out: Path = typer.Option(Path("report.html"), "--out", help="The HTML file (self-contained, opens offline)."),
           price: Optional[float] = typer.Option(None, "--price", help="USD per GPU-hour for every GPU; default: catalog prices per GPU type."),
           steps: Optional[int] = typer.Option(None, "--steps", min=1, help="Training steps for time-to-train; default: the sweep's, else 100,000."),
           png: Optional[Path] = typer.Option(None, "--png", help="Also export each figure as PNG into this folder (kaleido + Chromium)."),
           json_out: bool = JsonOpt):
    """Capacity-planning report: speedups, breakdowns, a timeline, bytes, cost vs time with the Pareto
    frontier, and a written recommendation."""
    from clustersim.report.build import write_report

    info = write_report(results, out, steps, price, png)
    if json_out:
        emit_json(info)
        return
    console.print(f"report written to [bold]{out}[/] ({len(info['figures'])} figures)")
    for line in info["recommendation"]:
        console.print(f"  • {line}")
    if info["png"]:
        console.print(info["png"]["message"])


@app.command("plan")
@user_errors
def plan_cmd(model: str = typer.Option(..., "--model", help="Catalog model, e.g. GPT-3-1.3B."),
             steps: int = typer.Option(..., "--steps", help="Training steps."),
             deadline: str = typer.Option(..., "--deadline", help="Wall-clock limit: 3d, 72h, 90m."),
             budget: Optional[float] = typer.Option(None, "--budget", help="Maximum cost in USD."),
             candidates: Optional[Path] = typer.Option(None, "--candidates", help="Sweep file of candidate clusters (default: built-in grid)."),
             global_batch: int = typer.Option(1024, "--global-batch", min=1, help="Samples per step, the same on every candidate."),
             price: Optional[float] = typer.Option(None, "--price", help="USD per GPU-hour for every GPU; default: catalog prices."),
             json_out: bool = JsonOpt):
    """The cheapest cluster and optimizer that meets the deadline (and budget), with runners-up and why."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from clustersim.planning import plan, why_not
    from clustersim.report.build import parse_duration

    hours = parse_duration(deadline)
    if json_out:
        result = plan(model, steps, hours, budget, candidates, global_batch, price)
        keep = ("optimizer", "cluster", "world_size", "gpu", "network", "ttt_h", "cost", "samples_per_s", "speedup")
        emit_json({**{k: v for k, v in result.items() if k not in ("chosen", "runners_up", "fastest")},
                   "chosen": result["chosen"] and {k: result["chosen"].get(k) for k in keep},
                   "runners_up": [{k: r.get(k) for k in keep} for r in result["runners_up"]],
                   "fastest": {k: result["fastest"].get(k) for k in keep}})
        return
    with Progress(TextColumn("simulating candidates"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("plan", total=None)
        result = plan(model, steps, hours, budget, candidates, global_batch, price,
                      progress=lambda done, total: bar.update(task, completed=done, total=total))
    console.print(f"[bold]{model}[/], {steps:,} steps of {global_batch:,} samples, deadline {hours:,.1f} h"
                  + (f", budget ${budget:,.0f}" if budget else "") + f": {result['simulated']} candidates simulated"
                  + (f" ({result['invalid']} could not run it, e.g. out of GPU memory)" if result["invalid"] else ""))
    for line in result["text"]:
        console.print(f"  • {line}")
    chosen = result["chosen"]
    if chosen is not None and result["runners_up"]:
        console.print(table("Runners-up (also meet the constraints)", ["optimizer", "cluster", "hours", "cost", "vs the choice"],
                            [[r["optimizer"], r["cluster"], f"{r['ttt_h']:,.1f}", f"${r['cost']:,.0f}", why_not(r, chosen)]
                             for r in result["runners_up"]], left=2))
    if result["missed_deadline"]:
        console.print(f"[dim]{result['missed_deadline']} candidates were too slow for the deadline[/]")
    if chosen is None:
        raise typer.Exit(1)


@offload_app.command("plan")
@user_errors
def offload_plan(scenario: str = ScenarioArg, json_out: bool = JsonOpt, profile: Optional[str] = ProfileOpt):
    """Per-subgroup placement of the optimizer update and the iteration time with no offload,
    ZeRO-Offload and interleaved offload."""
    from clustersim.simulator import simulate

    s = _load(scenario)
    results: dict[str, dict] = {}
    interleaved = None
    for mode in ("none", "zero", "interleaved"):
        try:
            r = simulate(s.with_changes(**{"training.offload.mode": mode}), profile)
        except InputError as exc:
            if mode == "interleaved" or "does not fit" not in exc.message:
                raise
            results[mode] = {"fits": False, "why": exc.message}
            continue
        results[mode] = {"fits": True, "iteration_time_s": r.iteration_time, "samples_per_s": r.samples_per_s,
                         "breakdown_s": r.breakdown, "gpu_memory_bytes": r.memory["total"]}
        if mode == "interleaved":
            interleaved = r
    off = interleaved.extra["offload"]
    if json_out:
        emit_json({"scenario": s.name, "modes": results, "placement": off})
        return
    console.print(f"[bold]{s.name}[/]: {s.workload.model or 'custom'} on {s.cluster.world_size} x {s.cluster.gpu}, "
                  f"optimizer {s.training.optimizer}")
    _print_placement(off)
    console.print(table("Placement of the optimizer update by subgroup", ["subgroups", "count", "where"],
                        [[f"{a}-{b}" if a != b else str(a), b - a + 1, k.replace("_", " ")] for a, b, k in off["ranges"]]))
    if off.get("candidates"):
        console.print(table("Plans simulated (the fastest is kept)", ["plan", "iteration ms"],
                            [[k, _ms(v)] for k, v in off["candidates"].items()]))
    rows = []
    base = results.get("zero", {}).get("iteration_time_s")
    for mode, label in (("none", "no offload"), ("zero", "ZeRO-Offload (all updates on the CPU)"),
                        ("interleaved", "interleaved offload")):
        m = results[mode]
        if not m["fits"]:
            rows.append([label, "does not fit", "-", "-", m["why"].split(":")[0]])
            continue
        b = m["breakdown_s"]
        rows.append([label, _ms(m["iteration_time_s"]), _ms(b["backward"]),
                     _ms(b["exposed_host"] + b["exposed_transfer"] + b["optimizer"]), format_bytes(m["gpu_memory_bytes"])])
    console.print(table("Offload modes compared", ["mode", "iteration ms", "backward ms", "update (exposed) ms", "GPU memory"], rows))
    if base:
        console.print(f"interleaved is {base / results['interleaved']['iteration_time_s']:.2f}x faster than ZeRO-Offload")


@calibrate_app.command("run")
@user_errors
def calibrate_run(device: str = typer.Option("cuda", "--device", help="cuda | cpu"),
                  out: Path = typer.Option(Path("profile.json"), "--out", help="Profile to write (atomically)."),
                  quick: bool = typer.Option(False, "--quick", help="Fewer sizes and repetitions (a minute or less)."),
                  ranks: Optional[int] = typer.Option(None, "--ranks", min=1, help="Processes for the collective sweep (default: GPUs, or 2 on the CPU)."),
                  raw_out: Optional[Path] = typer.Option(None, "--raw-out", help="Also keep the raw medians."),
                  json_out: bool = JsonOpt):
    """Microbenchmark this machine with torch and write a fitted profile.

    GEMMs, HBM copies, 1-bit Adam and BinSGDM kernels, Adam on the device and on host cores,
    host<->device copies, and collectives through torch.distributed (NCCL on GPUs, gloo on CPUs)
    started with torchrun on 127.0.0.1.
    """
    import sys

    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from clustersim.calibration.run import calibrate

    command = "clustersim " + " ".join(sys.argv[1:])
    if json_out:
        profile = calibrate(device, out, quick, ranks, raw_out, command=command)
        emit_json(profile.model_dump(exclude={"raw"}))
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("starting", total=None)
        profile = calibrate(device, out, quick, ranks, raw_out,
                            progress=lambda msg: bar.update(task, description=msg), command=command)
    console.print(f"profile written to [bold]{out}[/] (device {profile.device})")
    _print_profile(profile)


@calibrate_app.command("fit")
@user_errors
def calibrate_fit(raw: Path = typer.Argument(..., help="Raw measurements (calibrate run --raw-out, or the torchrun sweep's --out)."),
                  out: Path = typer.Option(Path("profile.json"), "--out"), json_out: bool = JsonOpt):
    """Fit segmented α-β models (robust, non-negative) and efficiency tables from raw measurements."""
    from clustersim.calibration.run import fit_file

    profile = fit_file(raw, out)
    if json_out:
        emit_json(profile.model_dump(exclude={"raw"}))
        return
    console.print(f"profile written to [bold]{out}[/]")
    _print_profile(profile)


@calibrate_app.command("import-nccl-tests")
@user_errors
def calibrate_import(files: list[Path] = typer.Argument(..., help="nccl-tests outputs (text, or -J JSON)."),
                     out: Path = typer.Option(Path("profile.json"), "--out"),
                     op: Optional[str] = typer.Option(None, "--op", help="Collective, if the files do not say."),
                     ranks: Optional[int] = typer.Option(None, "--ranks", min=1, help="Ranks, if the files do not say."),
                     nodes: Optional[int] = typer.Option(None, "--nodes", min=1, help="Nodes, if the files do not say."),
                     json_out: bool = JsonOpt):
    """Fit a profile from nccl-tests results (all_reduce_perf, all_gather_perf, ...)."""
    import sys

    from clustersim.calibration.fit import build_profile
    from clustersim.calibration.nccl_tests import parse_file, to_raw
    from clustersim.calibration.profile import parse_profile, write_json_atomically

    parsed = [parse_file(f, op, ranks, nodes) for f in files]
    data = build_profile(to_raw(parsed, "clustersim " + " ".join(sys.argv[1:])))
    profile = parse_profile(data, str(out))
    write_json_atomically(out, data)
    if json_out:
        emit_json(profile.model_dump(exclude={"raw"}))
        return
    console.print(f"profile written to [bold]{out}[/] from {len(files)} file(s)")
    _print_profile(profile)


@calibrate_app.command("show")
@user_errors
def calibrate_show(profile: str = typer.Argument(..., help="Profile file or builtin:NAME."), json_out: bool = JsonOpt):
    """Show a profile: provenance, measured rates, collective fits and their held-out accuracy."""
    from clustersim.calibration.profile import load_profile

    p = load_profile(profile)
    if json_out:
        emit_json(p.model_dump(exclude={"raw"}))
        return
    _print_profile(p)


def _print_profile(p) -> None:
    prov = p.provenance.model_dump(exclude_none=True)
    console.print(f"[bold]profile[/] format v{p.format_version}, device [bold]{p.device}[/]")
    for k, v in prov.items():
        console.print(f"  {k}: {v}")
    if p.matmul_tflops:
        console.print(table("GEMM (largest size measured)", ["precision", "TFLOP/s"],
                            [[k, f"{v:,.2f}"] for k, v in p.matmul_tflops.items()]))
    if p.memory_gbs:
        console.print(f"memory copy: {p.memory_gbs:,.1f} GB/s")
    if p.kernels_gbs:
        console.print(table("Kernels (bytes as the cost model counts them / measured time)", ["kernel", "GB/s"],
                            [[k, f"{v:,.1f}"] for k, v in p.kernels_gbs.items()]))
    if p.host.cpu_adam_params_per_s:
        console.print(table("CPU Adam on host cores", ["threads", "Mparams/s"],
                            [[k, f"{v / 1e6:,.1f}"] for k, v in sorted(p.host.cpu_adam_params_per_s.items())]))
    if p.host.copy_gbs:
        console.print(table("Host<->device copies", ["kind", "GB/s"], [[k, f"{v:,.2f}"] for k, v in p.host.copy_gbs.items()]))
    if p.compute_phases:
        console.print(table("Measured compute phases per micro-step", ["model", "mb", "seq", "fwd ms", "bwd ms", "other ms"],
                            [[c.model, c.micro_batch, c.seq_len, _ms(c.forward_s), _ms(c.backward_s), _ms(c.other_s)]
                             for c in p.compute_phases]))
    if p.collectives:
        rows = []
        for f in p.collectives:
            q = f.quality
            seg = "; ".join(f"≥{format_bytes(s[0]) if s[0] else '0 B'}: α {s[1] * 1e6:,.1f} µs, "
                            + (f"{1 / s[2] / 1e9:,.2f} GB/s" if s[2] > 1e-13 else "latency-bound")
                            for s in f.segments)
            held = "-" if q is None or q.holdout_max_rel_error is None else f"{100 * q.holdout_max_rel_error:.1f}%"
            ok = "" if q is None or q.holdout_max_rel_error is None else (" ✓" if q.holdout_max_rel_error <= 0.10 else " ✗")
            rows.append([f.op, f"{f.nodes}x{f.gpus_per_node}", seg, "-" if q is None else f"{100 * q.residual_rms_rel:.1f}%", held + ok])
        console.print(table("Collective fits (time = α + bytes/bandwidth per segment)",
                            ["op", "nodes x ranks", "segments", "fit RMS", "held-out max"], rows))
        console.print("[dim]held-out: fit to every other size, error on the sizes left out; target ≤ 10% (✓)[/]")
        spread = p.raw.get("collectives") if p.raw else None
        if spread:
            import statistics

            rel = statistics.median((r["p90_s"] - r["p10_s"]) / r["median_s"] for r in spread if r["median_s"] > 0)
            console.print(f"[dim]measurement spread (p10-p90 / median, median over sizes): {100 * rel:.0f}%[/]")


def main() -> None:  # console-script entry point
    app()


if __name__ == "__main__":
    main()
