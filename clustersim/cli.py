"""The clustersim command line: a thin shell over functions that return plain result objects.

Every command that prints results takes --json; every input error is one line and exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from clustersim.commands.calibrate import calibrate_app
from clustersim.commands.catalog import hardware_app, models_app, presets_app, topology_app
from clustersim.commands.counts import count_option, counts_by_name, parse_count
from clustersim.commands.offload import _print_placement, offload_app
from clustersim.commands.planning import (
    PLAN_ANSWER,
    CompareOwnPricesOpt,
    InstancesOpt,
    NetworkPricesOpt,
    _network,
    plan_cmd,
    report,
    sweep,
)
from clustersim.commands.support import (
    CompareCostOpt,
    HelpfulGroup,
    InstanceOpt,
    JsonOpt,
    ProfileOpt,
    SamplesOpt,
    ScenarioArg,
    SetOpt,
    console,
    emit_json,
    finite_option,
    one_line_usage_errors,
    plain_help_when_piped,
    progress_bar,
    samples_option,
    spinner,
    table,
    user_errors,
    with_catalogs,
)
from clustersim.commands.support import load_scenario_ref as _load
from clustersim.commands.support import ms as _ms
from clustersim.commands.testbed import testbed_app
from clustersim.errors import InputError
from clustersim.identifiers import CollectiveAlgorithm
from clustersim.io import check_writable_file
from clustersim.optimizer_options import OPTIONS
from clustersim.units import count_of, format_bytes, format_seconds, on_off, parse_bytes

ALGO_NAMES = [str(a) for a in CollectiveAlgorithm]

app = typer.Typer(
    name="clustersim",
    cls=HelpfulGroup,
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    rich_markup_mode="rich",
    help="Simulate distributed deep-learning training on a cluster: iteration time, where it goes, "
    "and what compressed optimizers (1-bit Adam, 0/1 Adam, BinSGDM) or rarely-synchronising ones (DiLoCo, "
    "Streaming DiLoCo) would change.\n\n"
    "SCENARIO arguments take a YAML/JSON file or [bold]preset:NAME[/] (see `clustersim presets list`).",
)
one_line_usage_errors()  # a bad option value is one line, exit 2, like every other bad input
app.add_typer(hardware_app, name="hardware")
app.add_typer(models_app, name="models")
app.add_typer(topology_app, name="topology")
app.add_typer(presets_app, name="presets")
app.add_typer(calibrate_app, name="calibrate")
app.add_typer(offload_app, name="offload")
app.add_typer(testbed_app, name="testbed")


def _print_version(value: bool) -> None:
    if value:
        from clustersim import __version__

        console.print(f"clustersim {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _top(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """The options before a command (--version; typer adds --install-completion, --show-completion)."""


app.command()(user_errors(sweep))
app.command()(user_errors(report))
app.command("plan", epilog=PLAN_ANSWER)(user_errors(plan_cmd))


def _print_straggler(st: dict, idle: float) -> None:
    """The slowest rank and what it costs. Where no rank is slower than the typical one (a faster GPU
    listed in slow_gpus) there is no straggler to name (rank 0 was named, at x1). Under a pipeline
    the breakdown's idle is the typical replica's critical stage's, its 1F1B bubble included, not
    only the wait for the slowest replica."""
    if st["compute_factor"] <= st["typical_factor"]:
        console.print(
            f"Stragglers: no rank computes slower than the typical one (x{st['typical_factor']:.3g}); "
            "none delays a collective"
        )
        return
    worst = st["worst"][0] if st["worst"] else None
    where = f"stage {st['stage']} of replica {st['replica']}; " if "stage" in st else ""
    idles = (
        f"the typical replica's critical stage idles {format_seconds(idle)}, its pipeline bubble included"
        if "stage" in st
        else f"the typical rank idles {format_seconds(idle)}"
    )
    console.print(
        f"Slowest rank {st['rank']} ({where}compute x{st['compute_factor']:.3g}, typical rank x"
        f"{st['typical_factor']:.3g}) delays {st['collectives_delayed']} collective(s) by "
        f"{format_seconds(st['delay_s'])} in all"
        + (f", most {worst['op']} ({format_seconds(worst['delay_s'])})" if worst else "")
        + f"; {idles}"
    )


def _print_parallelism(par: dict) -> None:
    """The model-parallel placement: the groups and where they sit, and the critical stage."""
    console.print(
        f"Model parallelism: tensor {par['tensor']} x data {par['data']} x pipeline {par['pipeline']} "
        f"({par['schedule']}, {count_of(par['virtual_stages'], 'chunk')} per stage of "
        f"{count_of(par['layers_per_chunk'], 'layer')}, "
        f"{count_of(par['micro_batches'], 'micro-batch', 'micro-batches')}; "
        f"sequence parallel: {on_off(par['sequence_parallel'])}, recompute: {par['recompute']})"
    )
    console.print(f"  rank = {par['rank_order']}")
    for group in ("tensor", "data", "pipeline"):
        console.print(f"  {group} group: {par[group + '_group']}")
    crit = par["stages"][par["critical_stage"]]
    console.print(
        f"  critical stage {par['critical_stage']} (its end is the step; the breakdown above is its): "
        f"ends {format_seconds(crit['end_s'])}, computes {format_seconds(crit['compute_s'])}"
    )


def _link_rows(r, scenario=None) -> list[list[str]]:
    """The bytes table's rows: per node on the intra-node links and out of the NICs, and DiLoCo's outer
    exchange where the workers have their own links (``inter_worker_gbps``): those bytes never cross a
    NIC of the cluster, so the NIC row alone would read 0 B for the whole exchange."""
    bl = r.bytes_per_link_kind
    rows = [
        [f"intra-node ({bl['intra_node_link']})", format_bytes(bl["intra_node_per_node"])],
        ["inter-node (NIC egress)", format_bytes(bl["inter_node_per_node"])],
    ]
    diloco = r.extra.get("diloco")
    own = scenario is not None and scenario.training.optimizer_options.get("inter_worker_gbps")
    if diloco and own:
        rows.append(
            [
                f"inter-worker links ({own:g} Gb/s, outer exchange, per worker)",
                format_bytes(diloco["bytes_per_worker_per_inner_step"]),
            ]
        )
    return rows


def _print_flops(flops: dict | None) -> None:
    if not flops:
        return
    tokens = flops.get("tokens_per_s_per_gpu")
    console.print(
        f"  model FLOPs {flops['per_gpu_per_s'] / 1e12:,.1f} TFLOP/s per GPU, "
        f"{100 * flops['mfu']:.1f}% of the GPU's dense {flops['precision']} peak (MFU)"
        + (f"; {tokens:,.0f} tokens/s per GPU" if tokens else "")
    )


def _print_stage(optimizer: str, options: dict) -> None:
    """Which stage's step an optimizer with a warm-up stage (1-bit Adam) was simulated in: its two
    stages' steps differ (Adam's all-reduce, then compressed), and a run's mean step weighs both."""
    from clustersim.simulator.strategies import registry

    if registry.get(optimizer).warmup_options(options) is None:
        return
    if options.get("stage", "compression") == "warmup":
        said, other = "the warm-up stage's step (Adam's uncompressed all-reduce)", "compression"
    else:
        said, other = "the compression stage's step", "warmup"
    console.print(
        f"  {said}; --set training.optimizer_options.stage={other} simulates the other stage, and "
        "`compare --steps N` weighs the two over a run (warm-up: the first freeze_step steps)",
        markup=False,
        highlight=False,
    )


def _print_result(r, scenario=None) -> None:
    """``scenario``: the scenario simulated, for what the result does not carry (DiLoCo's own links)."""
    from rich.markup import escape  # the scenario's name is text: 'my[test]run' printed as 'myrun'

    console.print(
        f"[bold]{escape(r.scenario)}[/]: {count_of(r.world_size, 'GPU')} ({r.nodes:,} x {r.gpus_per_node}), "
        f"optimizer {r.optimizer}"
    )
    console.print(
        f"iteration time [bold]{format_seconds(r.iteration_time)}[/], "
        f"[bold]{r.samples_per_s:,.1f}[/] samples/s "
        f"({count_of(r.samples_per_iteration, 'sample')} per iteration)"
    )
    _print_flops(r.extra.get("model_flops"))
    if scenario is not None:
        _print_stage(r.optimizer, dict(scenario.training.optimizer_options or {}))
    from clustersim.validation.published import compute_utilization

    console.print(
        f"  compute utilization {compute_utilization(r):.1%} of the step (forward, backward, update and "
        "compression; the rest waits on the network, the host or copies)"
    )
    if r.interval is not None:
        iv = r.interval
        console.print(
            f"  P10–P90 {format_seconds(iv.p10)} – {format_seconds(iv.p90)} "
            f"({r.samples_per_iteration / iv.p90:,.1f} – {r.samples_per_iteration / iv.p10:,.1f} samples/s; "
            f"{iv.samples} draws of the calibrated or default parameter uncertainty)"
        )
    rows = [
        [k.replace("_", " "), _ms(v), f"{100 * v / r.iteration_time:.1f}%"]
        for k, v in r.breakdown.items()
        if v > 0
    ]
    console.print(table("Where the iteration goes", ["part", "ms", "share"], rows))
    if r.breakdown.get("exposed_host", 0.0) > 0.05 * r.iteration_time:
        offloaded = scenario is not None and scenario.training.offload.mode != "none"
        console.print(
            "[dim]forward and backward are the GPU's busy time; exposed host is the time the GPU waits "
            + (
                "for the host: the CPU optimizer's update of the offloaded state, the host's copies and "
                "page faults, and its thread dispatching kernels[/]"
                if offloaded
                else "for the host thread to dispatch its kernels[/]"
            )
        )
    if scenario is not None and scenario.training.offload.mode != "none":
        _print_offload_phases(r)
    if r.extra.get("steps"):
        console.print(
            table(
                "Kinds of step (the iteration time above is their weighted average)",
                ["step kind", "share of steps", "ms", "inter-node bytes"],
                [
                    [
                        st["label"],
                        f"{100 * st['weight']:.1f}%",
                        _ms(st["iteration_time_s"]),
                        format_bytes(st["inter_node_bytes"]),
                    ]
                    for st in r.extra["steps"]
                ],
            )
        )
    if r.buckets:
        shown = r.buckets if len(r.buckets) <= 12 else r.buckets[:6] + r.buckets[-6:]
        console.print(
            table(
                f"Gradient {_reduction(r)} per bucket "
                f"({len(r.buckets)} buckets"
                f"{', first and last 6 shown' if len(r.buckets) > 12 else ''})",
                ["bucket", "size", "start ms", "end ms"],
                [[b["bucket"], format_bytes(b["bytes"]), _ms(b["start_s"]), _ms(b["end_s"])] for b in shown],
            )
        )
    console.print(
        table("Bytes moved per node per iteration", ["link kind", "bytes"], _link_rows(r, scenario))
    )
    mem = r.memory
    console.print(
        f"GPU memory per rank: {format_bytes(mem['total'])} of {format_bytes(mem['capacity'])} "
        f"(forward/backward peak {format_bytes(mem['peak_forward_backward'])}, "
        f"update peak {format_bytes(mem['peak_update'])})"
    )
    if "sharding" in r.extra:
        sh = r.extra["sharding"]
        # an offloaded optimizer's subgroups kept on the GPU (interleaved) are model states too
        states = sum(
            mem.get(k, 0.0)
            for k in ("parameters", "gradients", "optimizer_state", "optimizer_state_resident")
        )
        console.print(
            f"Sharding: {sh['layout']} over {sh['shard_ranks']} rank{'' if sh['shard_ranks'] == 1 else 's'}"
            + (f" x {sh['replicate_ranks']} replicas" if sh["replicate_ranks"] > 1 else "")
            + f", partitioned: {', '.join(sh['partitioned'])}"
            + (f"; ZeRO++: {', '.join(sh['zeropp'])}" if sh["zeropp"] else "")
            + f"; model states {format_bytes(states)} per rank"
        )
        if "bytes_per_node_by_span" in sh:
            span = sh["bytes_per_node_by_span"]
            console.print(
                f"Sharding collectives per node: inside GCD pairs {format_bytes(span['gcd_pair'])}, "
                f"inside the node {format_bytes(span['node'])}, out of the NICs "
                f"{format_bytes(span['inter_node'])}"
            )
    if "offload" in r.extra:
        _print_placement(r.extra["offload"])
    if "parallelism" in r.extra:
        _print_parallelism(r.extra["parallelism"])
    if r.extra.get("straggler"):
        _print_straggler(r.extra["straggler"], r.breakdown.get("idle", 0.0))
    if r.extra.get("hottest_links"):
        console.print(
            table(
                "Hottest links (flow backend): bytes / (capacity x iteration time)",
                ["link", "GB/s", "bytes", "utilisation"],
                [
                    [x["link"], f"{x['gbs']:.3g}", format_bytes(x["bytes"]), f"{100 * x['utilisation']:.1f}%"]
                    for x in r.extra["hottest_links"]
                ],
            )
        )
    for k, v in r.sources.items():
        console.print(f"[dim]source of {k}: {v}[/]")
    for n in r.notes:
        console.print(f"[dim]note: {n}[/]")


def _rate_text(bytes_per_s: float) -> str:
    """A collective's bandwidth: GB/s with two decimals from 1 GB/s up, else in MB/s or KB/s to three
    significant figures (a 1-byte all-reduce's algbw is 20.1 KB/s, not 0.00 GB/s)."""
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_s >= scale:
            x = bytes_per_s / scale
            return f"{x:.2f} {unit}" if unit == "GB/s" else f"{x:#.3g} {unit}"
    return f"{bytes_per_s:#.3g} B/s" if bytes_per_s > 0 else "0 B/s"


NetworkBackendOpt = typer.Option(
    None,
    "--network",
    help="analytical (closed-form, fast; the default) | flow (collectives simulated as flows over the "
    "topology; shows the hottest links). Overrides the scenario's training.network.",
)


def _with_network(s, network: str | None):
    """The scenario on the asked network backend (--network), checked."""
    if network is None:
        return s
    if network not in ("analytical", "flow"):
        raise InputError(f"unknown network backend {network!r} (analytical, flow)", key="--network")
    return s.with_changes(**{"training.network": network})


@app.command()
@user_errors
@with_catalogs
def run(
    scenario: str = ScenarioArg,
    json_out: bool = JsonOpt,
    trace: Optional[Path] = typer.Option(
        None,
        "--trace",
        help="Write a Chrome/Perfetto trace: one process per rank class (the slowest rank's too, with "
        "stragglers) or pipeline stage, one track per stream; with several kinds of step (0/1 Adam, "
        "DiLoCo) the most frequent, named in the trace and the output.",
    ),
    profile: Optional[str] = ProfileOpt,
    samples: int = SamplesOpt,
    chakra: Optional[Path] = typer.Option(
        None,
        "--chakra",
        help="Write the iteration as Chakra execution traces into this existing folder: one .et per rank "
        "class or pipeline stage (NAME.0.et, NAME.1.et, ...).",
    ),
    network: Optional[str] = NetworkBackendOpt,
    settings: Optional[list[str]] = SetOpt,
):
    """Simulate one training iteration: time with its P10–P90 band, samples/s, breakdown, per-bucket
    all-reduce, bytes per link."""
    from clustersim.simulator import simulate

    if trace is not None:
        check_writable_file(trace, inputs=(scenario, profile))  # before the work; never an input
    s = _with_network(_load(scenario, settings), network)
    if chakra is not None and not chakra.is_dir():
        raise InputError(f"{chakra} is not an existing folder", key="--chakra")
    result = simulate(s, profile, uncertainty_samples=samples)
    if trace is not None:
        result.write_trace(trace)
    chakra_files = []
    if chakra is not None:
        from clustersim.simulator.chakra import write_chakra

        chakra_files = write_chakra(result, chakra)
    if json_out:
        emit_json(result.to_dict())
    else:
        _print_result(result, s)
        if trace is not None:
            console.print(f"trace written to {trace} (open in https://ui.perfetto.dev or chrome://tracing)")
            shows = result.traced_step()
            if shows is not None:
                console.print(f"  it shows {shows}")
        if chakra_files:
            console.print(f"Chakra execution traces: {', '.join(str(p) for p in chakra_files)}")


def _one_of(value: str, known: list[str], what: str, option: str) -> None:
    """Refuse ``value`` unless it is one of ``known``, naming ``option`` as typed and the nearest name."""
    if value in known:
        return
    import difflib

    near = difflib.get_close_matches(value, known, n=1, cutoff=0.6)
    hint = f"; did you mean {near[0]}?" if near else ""
    raise InputError(f"unknown {what} {value!r}{hint} (known: {', '.join(known)})", key=option)


@app.command()
@user_errors
@with_catalogs
def collective(
    scenario: str = ScenarioArg,
    op: str = typer.Option(
        "all_reduce", "--op", help="all_reduce | all_gather | reduce_scatter | all_to_all | broadcast"
    ),
    size: str = typer.Option("32MiB", "--bytes", help="Message size: 512, 64KiB, 32MiB, 1GB ..."),
    algo: str = typer.Option(
        "auto",
        "--algo",
        help="auto (NCCL-like or the calibrated backend's choice) | " + " | ".join(ALGO_NAMES[1:]),
    ),
    group: str = typer.Option("world", "--group", help="world | intra (one node) | inter (one GPU per node)"),
    json_out: bool = JsonOpt,
    profile: Optional[str] = ProfileOpt,
    network: Optional[str] = typer.Option(
        None,
        "--network",
        help="flow: also simulate the algorithm's flows over the topology (with the scenario's "
        "cluster.heterogeneity: degraded NICs, background jobs)",
    ),
):
    """Predicted time of one collective on the scenario's cluster, the algorithm chosen and its busbw."""
    from clustersim.simulator.context import build_context
    from clustersim.topologies import GroupShape

    s = _load(scenario)
    try:  # the size first: a bad one is refused before the cluster and its profile are built
        nbytes = parse_bytes(size)
    except InputError as exc:
        raise exc.located(key_prefix="--bytes") from None
    ctx = build_context(s, profile)
    c = s.cluster
    shapes = {
        "world": GroupShape(c.nodes, c.gpus_per_node),
        "intra": GroupShape(1, c.gpus_per_node),
        "inter": GroupShape(c.nodes, 1),
    }
    if group not in shapes:
        raise InputError(f"unknown group {group!r} (world, intra, inter)", key="--group")
    from clustersim.cost_models.collectives import OPS

    # the options' own names, as every other option's refusal says them (the cost model says "algo")
    _one_of(op, [str(o) for o in OPS], "collective", "--op")
    _one_of(algo, ALGO_NAMES, "algorithm", "--algo")
    if nbytes > ctx.gpu.memory_bytes:  # a collective's buffer lives in one GPU's memory
        raise InputError(
            f"{nbytes:,.4g} bytes is more than a {ctx.gpu.name}'s memory ({ctx.gpu.memory_gib:g} GiB) "
            "can hold as a collective's buffer",
            key="--bytes",
        )
    if s.cluster.nodes == 1 and group == "inter":
        raise InputError("--group inter needs more than one node (this cluster has 1)", key="--group")
    shape = shapes[group]
    if shape.nodes * shape.gpus_per_node == 1:  # no collective: its bandwidth would be infinite
        raise InputError(
            f"--group {group} is a single GPU on this cluster ({c.nodes} x {c.gpus_per_node}); "
            "a collective needs at least 2 ranks",
            key="--group",
        )
    try:
        cost = ctx.collectives.cost(op, nbytes, shapes[group], algo)
    except InputError as exc:  # an algorithm that does not apply here: the option as typed, not "algo"
        if exc.key != "algo":
            raise
        raise InputError(exc.message, source=exc.source, key="--algo") from None
    data = {
        "op": op,
        "bytes": nbytes,
        "ranks": cost.ranks,
        "group": group,
        "algorithm": cost.algorithm,
        "protocol": cost.protocol,
        "time_s": cost.time,
        "algbw_gbs": cost.algbw / 1e9,
        "busbw_gbs": cost.busbw / 1e9,
        "bottleneck": cost.bottleneck,
        "source": cost.source,
        "measured_by_calibration": _measured_by_calibration(ctx, op),
        "intra_node_bytes_per_node": cost.intra_node_bytes,
        "inter_node_bytes_per_node": cost.inter_node_bytes,
    }
    band = None
    if cost.ranks > 1 and cost.algorithm != "measured":
        from clustersim.simulator.uncertainty import collective_interval

        band = collective_interval(ctx, op, nbytes, shapes[group], algo)
        data["time_interval_s"] = band.as_dict()
    flow = None
    if network not in (None, "analytical"):
        if network != "flow":
            raise InputError(f"unknown network backend {network!r} (analytical, flow)", key="--network")
        from clustersim.simulator.network.flow import FlowBackend
        from clustersim.simulator.program import CollectiveSpec

        backend = FlowBackend(ctx)
        flow = backend.time(CollectiveSpec(op, nbytes, shape, cost.algorithm, cost.protocol))
        data["flow_time_s"] = flow
        if flow is not None:
            data["flow_hottest_links"] = backend.utilisation(flow, top=4)
    if json_out:
        emit_json(data)
        return
    _print_collective(ctx, op, nbytes, group, cost, band, network, flow, data)


def _print_collective(ctx, op, nbytes, group, cost, band, network, flow, data) -> None:
    """`collective`'s text output: the time with its band, the rates, where they came from, whether the
    calibration measured this op, and the flow backend's time where asked."""
    # the cost model files NCCL's all-to-all (grouped send/recv, every pair at once) under "ring"
    algorithm = "pairwise" if op == "all_to_all" and cost.algorithm == "ring" else cost.algorithm
    console.print(
        f"{op} of {format_bytes(nbytes)} over {cost.ranks} ranks ({group}): "
        f"[bold]{format_seconds(cost.time)}[/] with {algorithm}/{cost.protocol}"
        + (f"  (P10–P90 {format_seconds(band.p10)} – {format_seconds(band.p90)})" if band else "")
    )
    console.print(
        f"algbw {_rate_text(cost.algbw)}, busbw {_rate_text(cost.busbw)}; bottleneck: {cost.bottleneck}"
    )
    console.print(f"[dim]source: {cost.source}[/]")
    if _measured_by_calibration(ctx, op) is False:
        note = ctx.collectives.unmeasured_note(op)
        console.print(f"note: {note}", style="dim", markup=False, highlight=False)
    if network == "flow":
        if flow is None:
            console.print("flow backend: no flow model for this case; the analytical time stands")
        else:
            hot = ", ".join(f"{x['link']} {100 * x['utilisation']:.0f}%" for x in data["flow_hottest_links"])
            console.print(f"flow backend: [bold]{format_seconds(flow)}[/]; busiest links: {hot}")


def _measured_by_calibration(ctx, op: str) -> bool | None:
    """Whether the profile's network calibration measured ``op`` (None: no calibrated network)."""
    params = ctx.collectives.params
    return None if not params.calibrated else not params.unmeasured(op)


def _int_list(text: str, key: str) -> list[int]:
    """Comma-separated counts, each read as a file reads one (commands/counts.parse_count); their range
    is the caller's to check."""
    values = [parse_count(x, key, least=None) for x in text.split(",") if x.strip()]
    if not values:
        raise InputError("empty list", key=key)
    return values


DEFAULT_COMPARE_GPUS = (8, 16, 32, 64, 128, 256, 512, 1024)


def _default_counts(s) -> list[int]:
    """compare's GPU counts when none are given: the defaults the scenario can run at (a layout of
    tensor x pipeline GPUs, or nodes of a size, holds only some), else its own count doubled twice."""
    fits = []
    for g in DEFAULT_COMPARE_GPUS:
        try:
            s.with_world_size(g)
        except InputError:
            continue
        fits.append(g)
    own = s.cluster.world_size
    return fits or [own, 2 * own, 4 * own]


@app.command()
@user_errors
@with_catalogs
def compare(
    scenario: str = ScenarioArg,
    optimizers: str = typer.Option(
        "adam,onebit-adam,zero-one-adam,binsgdm",
        "--optimizers",
        help=f"Comma-separated: {', '.join(OPTIONS)} (diloco: DiLoCo / Streaming DiLoCo); default: adam, "
        "onebit-adam, zero-one-adam and binsgdm.",
        show_default=False,
    ),
    gpus: Optional[str] = typer.Option(
        None,
        "--gpus",
        help=(
            "Comma-separated total GPU counts (default: those of 8, 16, ..., 1,024 the scenario's layout "
            "can hold, e.g. multiples of tensor x pipeline; else the scenario's own count, x2, x4)."
        ),
    ),
    steps: Optional[str] = typer.Option(
        None,
        "--steps",
        parser=counts_by_name,
        help="Training steps for time-to-train: 100000, or per optimizer, e.g. adam=100000, binsgdm=110000 "
        "(convergence is not modelled: say how many steps each needs to the same loss).",
    ),
    baseline: Optional[str] = typer.Option(
        None,
        "--baseline",
        help="Uncompressed optimizer every speedup is measured against (default: the scenario's, e.g. adam).",
    ),
    global_batch: Optional[int] = typer.Option(
        None,
        "--global-batch",
        parser=count_option(),
        help="Samples per step, the same at every GPU count (strong scaling); default: the scenario's "
        "micro-batch per GPU, so the batch grows with the GPUs.",
    ),
    warmup: Optional[float] = typer.Option(
        None,
        "--warmup",
        help="1-bit Adam warmup fraction of the steps, in [0, 1) (default 0.15, or freeze_step/steps).",
    ),
    samples: int = samples_option(
        32,  # simulator.uncertainty.DEFAULT_SAMPLES, as every command
        (
            "Parameter draws per GPU count for the P10–P90 of each step and speedup (paired: every optimizer "
            "under the same draws); 0 turns the bands off."
        ),
    ),
    break_even_at: Optional[int] = typer.Option(
        None,
        "--break-even-at",
        parser=count_option(least=0),
        help=(
            "GPU count at which to find each compressed optimizer's break-even NIC bandwidth "
            "(default: the largest of --gpus; 0: skip)."
        ),
    ),
    json_out: bool = JsonOpt,
    profile: Optional[str] = ProfileOpt,
    settings: Optional[list[str]] = SetOpt,
    cost: Optional[str] = CompareCostOpt,
    instance: Optional[str] = InstanceOpt,
    network_prices: Optional[str] = NetworkPricesOpt,
    instances: Optional[str] = InstancesOpt,
    own_prices: Optional[str] = CompareOwnPricesOpt,
    network: Optional[str] = NetworkBackendOpt,
):
    """Optimizers side by side per GPU count: time split, samples/s, speedup over the baseline with its
    paired P10–P90, bytes on the wire, time-to-train, and the NIC bandwidth below which each compressed
    optimizer beats the baseline."""
    from clustersim.planner.breakeven import break_evens_or_reason
    from clustersim.planner.compare import check_request, comparison_as_json, notes_by_cells
    from clustersim.planner.compare import compare as run_compare
    from clustersim.validation.speedup_checks import notes as checked_notes

    finite_option(warmup, "--warmup", positive=False)
    s = _with_network(_load(scenario, settings), network)
    from clustersim.report.costing import compare_model, refuse_costs_without_steps

    asked = cost is not None or instance is not None
    catalogs = {"network": _network(network_prices), "instances": instances, "own_prices": own_prices}
    costs = compare_model(s.cluster.gpu, cost, instance, **catalogs)
    opts = [o.strip() for o in optimizers.split(",") if o.strip()]
    # each count once: a repeated one is the same cells again
    counts = list(dict.fromkeys(_int_list(gpus, "--gpus"))) if gpus is not None else _default_counts(s)
    # every argument checked before any work starts
    request = check_request(s, opts, counts, steps, baseline, warmup, global_batch, break_even_at)
    opts, plan, base, at = request.optimizers, request.plan, request.baseline, request.break_even_at
    given = {"instances": instances, "own_prices": own_prices, "network_prices": network_prices}
    refuse_costs_without_steps(plan, cost=cost, instance=instance, **given)
    if plan and asked:  # a GPU the asked model cannot price: said before any work
        costs.price(s.cluster.model_dump(mode="json"))
    run_args = (s, opts, counts, plan, warmup, profile)
    if json_out:
        rows = _some_simulated(
            run_compare(*run_args, samples=samples, baseline=base, global_batch=global_batch), s
        )
        evens, why_none = break_evens_or_reason(
            s, opts, at, profile, samples, base, global_batch, plan, warmup
        )
        from clustersim.report.costing import compare_costs

        priced, cost_error = compare_costs(s, rows, cost, instance, **catalogs) if plan else ([], None)
        checked = checked_notes(s, opts, counts)
        emit_json(
            comparison_as_json(rows, base, global_batch, evens, why_none, at, priced, cost_error, checked)
        )
        return
    done = [0]

    def one_more(update) -> None:
        done[0] += 1
        update(done[0])

    with progress_bar("compare", "simulations", len(opts) * len(counts)) as update:
        rows = run_compare(
            *run_args,
            progress=lambda: one_more(update),
            samples=samples,
            baseline=base,
            global_batch=global_batch,
        )
        _some_simulated(rows, s)  # inside: not one cell simulated is an error, not work done
    with spinner("compare") as say:
        if at:
            say(f"break-even bandwidth at {at:,} GPUs")
        evens, why_none = break_evens_or_reason(
            s, opts, at, profile, samples, base, global_batch, plan, warmup
        )
    console.print(compare_header(s, settings), markup=False, highlight=False)
    _print_compare(s.name, rows, base, plan, samples, global_batch)
    for r in rows:
        if r.error:
            console.print(f"[yellow]{count_of(r.gpus, 'GPU')}, {r.optimizer}: not simulated[/]: {r.error}")
    for b in evens:
        console.print(f"break-even at {at:,} GPUs: {b.describe()}", markup=False, highlight=False)
    _print_break_even_missing(rows, at, why_none)
    _print_checked(checked_notes(s, opts, counts), samples)
    if plan:
        _time_to_train_notes(s, rows, base, plan, warmup, global_batch)
        _print_costs(s, rows, costs, asked=asked)
    for note in notes_by_cells(rows):
        console.print(f"note: {note}", style="dim", markup=False, highlight=False)


def _reduction(r) -> str:
    """The collective a run's gradient buckets go through: ZeRO's (reduce-scatter, or qgZ's all-to-all),
    ZeRO-Offload's reduce-scatter (each rank's partition goes to its host), else DDP's all-reduce."""
    if "sharding" in r.extra:
        return r.extra["sharding"].get("reduction", "all-reduce")
    return "reduce-scatter" if "offload" in r.extra else "all-reduce"


def _print_checked(checked: list[dict], samples: int) -> None:
    """How far each compressed optimizer's speedups are checked against published ones: the paired band
    holds the hardware's uncertainty, which mostly cancels in a ratio, not the model's own error on it."""
    if not checked:
        return
    if samples:
        head = "The bands above hold the hardware's uncertainty, not the model's error on a speedup; "
        head += "published speedups measure that (clustersim validate):"
    else:
        head = "The model's error on a speedup, as published speedups measure it (clustersim validate):"
    console.print(f"[dim]{head}[/]", highlight=False)
    for c in checked:
        console.print(f"  {c['text']}", markup=False, highlight=False)


def _print_break_even_missing(rows, at: int, why_none: str | None) -> None:
    """Why the break-even is missing, each reason once: an optimizer not simulated at ``at`` GPUs had
    its reason printed on its row's line just above, so here it is only named."""
    if not why_none:
        return
    rest, named = why_none, []
    for r in rows:
        piece = f"{r.optimizer}: {r.error}"
        if r.gpus != at or not r.error or piece not in rest:
            continue
        named.append(r.optimizer)
        # break_evens_or_reason joins "name: reason" pieces with "; "
        rest = "" if rest == piece else rest.replace(f"{piece}; ", "", 1).replace(f"; {piece}", "", 1)
    if named:
        console.print(
            f"[yellow]break-even at {at:,} GPUs not computed[/] for {', '.join(named)}: not simulated there "
            "(above)"
        )
    if rest:
        console.print(f"[yellow]break-even at {at:,} GPUs not computed[/]: {rest}")


def compare_header(s, settings: list[str] | None) -> str:
    """What compare simulated, in one line: the node (GPUs, NICs), the model and precision, and the
    --set values, so a table read later says which cluster it was."""
    from clustersim.report.costing import nic_label

    c, w = s.cluster, s.workload
    line = (
        f"{s.name}: {c.gpus_per_node} x {c.gpu} per node, {nic_label(c.nic.model_dump())} per node; "
        f"{w.model or 'custom layers'}, {w.precision}, micro-batch {w.micro_batch}"
    )
    degraded = c.heterogeneity.degraded_nics if c.heterogeneity is not None else []
    if degraded:  # a header that names the NIC alone reads as if every node had it at full rate
        line += f"; {count_of(len(degraded), 'degraded NIC')} (cluster.heterogeneity)"
    return line + (f"; --set {', '.join(settings)}" if settings else "")


def _print_costs(s, rows, costs, asked: bool = True) -> None:
    """Each cell's time to train priced by one cost model, with the model and what it assumed named. A
    GPU the default model cannot price gets a note instead, unless --cost or --instance asked for it."""
    from clustersim.report.costing import price_compare_rows

    if costs is None:
        return
    try:
        priced = price_compare_rows(s, rows, costs)
    except InputError as exc:
        if asked:
            raise
        console.print(f"[dim]cost not shown: {exc.message}[/]", highlight=False)
        return
    if not priced:
        return
    # what grows with the cluster (an owned cluster's capital, the instances rented) is a column; the
    # rest of how it was priced is the same at every size and said once below the table
    owned = any(c["cost_model"] == "own" for c in priced)
    rented = any(c["instances"] for c in priced)
    cols = ["GPUs", "optimizer", "train", "cost"] + ["capital"] * owned + ["rented"] * rented
    body = [
        [c["gpus"], c["optimizer"], f"{c['hours']:,.1f} h",
         f"${c['cost_usd']:,.0f} ({c['cost_p10_usd']:,.0f}–{c['cost_p90_usd']:,.0f})"]
        + ([f"${c['capital_usd']:,.0f}"] if owned else [])
        + ([_instances(c)] if rented else [])
        for c in priced
    ]  # fmt: skip
    timed = priced[-1]["band"] == "price and time"
    what = "P10–P90" if timed else "P10–P90 of the prices alone: --samples 0 draws no time band"
    console.print(table(f"Cost to train ({what})", cols, body, left=2))
    for line in _said_once(priced, "common_basis") + _said_once(priced, "warning"):
        console.print(f"[dim]{line}[/]", highlight=False)


def _instances(cell: dict) -> str:
    """``2 x p4d.24xlarge``: the instances a compare cell is rented as (— where none: a flat rate)."""
    return f"{cell['instances']} x {cell['instance']}" if cell["instances"] else "—"


def _said_once(priced: list[dict], key: str) -> list[str]:
    """Each distinct ``key`` of compare's priced cells once: ``cost: ...`` where every GPU count shares
    it, else prefixed by the counts it holds for."""
    by_text: dict[str, list[int]] = {}
    for c in priced:
        if c[key]:
            counts = by_text.setdefault(c[key], [])
            if c["gpus"] not in counts:
                counts.append(c["gpus"])
    everyone = len({c["gpus"] for c in priced})
    head = "cost" if key == "common_basis" else "note"
    return [
        f"{head}: {text}"
        if len(counts) == everyone
        else f"{head} ({', '.join(map(str, counts))} GPUs): {text}"
        for text, counts in by_text.items()
    ]


def _some_simulated(rows, s):
    """compare's rows, unless not one cell could be simulated: then the input is wrong for every GPU
    count and optimizer, and that is one line and exit 2, as `run` gives for it."""
    if rows and all(r.error for r in rows):
        raise InputError(
            f"no optimizer at any GPU count could be simulated: {rows[0].error}", source=s.source
        )
    return rows


def _time_to_train_notes(s, rows, base: str, plan, warmup, global_batch) -> None:
    """What compare's time to train assumed: the warmup, each optimizer's steps (convergence is not
    modelled), and, without --global-batch, that the batch grows with the GPU count."""
    from clustersim.planner.compare import warmup_fraction

    w = warmup_fraction(s, plan.of(s.training.optimizer, base), warmup)
    console.print(
        f"[dim]time to train: each optimizer's steps x its mean step; 1-bit Adam's warmup "
        f"fraction {w:.2f} runs at its warmup-stage speed[/]"
    )
    console.print(f"[dim]{plan.assumption([r.optimizer for r in rows], base)}[/]")
    batches = sorted({round(r.samples_per_s * r.iteration_time_s) for r in rows if not r.error})
    if not global_batch and len(batches) > 1:
        console.print(
            "[dim]without --global-batch each GPU keeps its micro-batch, so the batch grows with the "
            f"GPUs ({batches[0]:,} to {batches[-1]:,} samples per step): another recipe at each count[/]"
        )


def _band(x: float | None, lo: float | None, hi: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.2f}x" + (f" ({lo:.2f}–{hi:.2f})" if lo is not None else "")


def _print_compare(name: str, rows, base: str, plan, samples: int, global_batch: int | None) -> None:
    """compare's three tables, each narrow enough for an 80-column terminal without cutting a cell:
    where the time goes, what it buys (speedups with their paired bands), and bytes on the wire."""
    dash = "—"
    ok = [r for r in rows if not r.error]
    # idle is a pipeline's bubble: a column only where some row has one, so the table fits 80 columns
    with_idle = any(r.idle_s for r in ok)
    parts = ["compute", "comm", "host", "compress", "optim"] + (["idle"] if with_idle else [])

    def split(r) -> list[str]:
        times = [r.iteration_time_s, r.compute_s, r.exposed_communication_s, r.exposed_host_s]
        times += [r.compression_s, r.optimizer_s] + ([r.idle_s] if with_idle else [])
        return [f"{x * 1e3:,.0f}" for x in times]

    console.print(
        table(
            f"{name}: iteration time split, ms",
            ["GPUs", "optimizer", "iter", *parts],
            [
                [r.gpus, f"{r.optimizer} (not simulated, below)", dash, *[dash] * len(parts)]
                if r.error
                else [r.gpus, r.optimizer, *split(r)]
                for r in rows
            ],
            left=2,
        )
    )
    console.print(
        "[dim]compute = forward + backward; comm = exposed communication (network and host-device "
        "copies); host = the GPU waiting on its host's dispatch; compress = compression kernels; "
        "optim = optimizer step and other per-step work"
        + ("; idle = nothing running (a pipeline's bubble)" if with_idle else "")
        + "[/]"
    )
    batch = f", global batch {global_batch:,}" if global_batch else ""
    cols = ["GPUs", "optimizer", "step speedup"] + (["train", "train speedup"] if plan else [])
    console.print(
        table(
            f"Speedup over {base} on the same GPUs{batch}" + (" (P10–P90, paired draws)" if samples else ""),
            cols,
            [
                [r.gpus, r.optimizer, _band(r.speedup, r.speedup_p10, r.speedup_p90)]
                + (
                    [
                        f"{r.time_to_train_s / 3600:,.1f} h",
                        _band(
                            r.time_to_train_speedup, r.time_to_train_speedup_p10, r.time_to_train_speedup_p90
                        ),
                    ]
                    if plan
                    else []
                )
                for r in ok
            ],
            left=2,
        )
    )
    if samples:
        console.print(
            f"[dim]P10–P90: every optimizer simulated under the same {samples} draws of the uncertain "
            "hardware parameters; a band that contains 1.00x means the two are indistinguishable[/]"
        )
    console.print(
        table(
            "Throughput and bytes per node per step",
            ["GPUs", "optimizer", "samples/s", "MFU", "tok/s/GPU", "intra-node", "inter-node"],
            [
                [
                    r.gpus,
                    r.optimizer,
                    f"{r.samples_per_s:,.0f}",
                    dash if r.mfu is None else f"{100 * r.mfu:.0f}%",
                    dash if r.tokens_per_s_per_gpu is None else f"{r.tokens_per_s_per_gpu:,.0f}",
                    format_bytes(r.intra_node_bytes),
                    format_bytes(r.inter_node_bytes),
                ]
                for r in ok
            ],
            left=2,
        )
    )


def _times(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}x"


@app.command()
@user_errors
def validate(
    dataset: str = typer.Option("onebit_adam_ethernet", "--dataset", help="Shipped published measurements."),
    json_out: bool = JsonOpt,
    profile: Optional[str] = ProfileOpt,
    samples: int = SamplesOpt,
):
    """Compare predictions with published measurements shipped as data: per-row error, median error, and
    how often the published value falls inside the predicted P10–P90 band. Datasets: the 1-bit Adam
    paper's Ethernet table (default), Megatron-LM's weak scaling (megatron_weak_scaling), BinSGDM's
    64-GPU speedups over SGD and Adam (binsgdm_speedups, paired bands), the seed systems' own results
    (seeds: Deep Optimizer States, BinSGDM, 1-bit Adam end to end, Streaming DiLoCo's simulation),
    single-GPU and single-node training throughputs of BERT-Large and ResNet-50 (gpu_throughput),
    single-GPU eager steps of BERT, GPT-2 XL, GPT-3 XL and ResNet-50 measured on an H200 and an H100
    (gpu_steps), and measured multi-node steps at 4-11,616 GPUs: MLPerf Training GPT-3 175B and
    ResNet-50 logs, NeMo's, NVIDIA DGX Cloud Benchmarking's and TorchTitan's performance tables, the
    1-bit Adam paper's profile (multinode_scale). Where a dataset measures several optimizers on the
    same GPU counts, the speedup over the first at each count follows, with its median and worst error
    and whether it moves with scale as the measurement does."""
    from clustersim.validation.published import load_dataset
    from clustersim.validation.published import validate as run_validate
    from clustersim.validation.speedups import median_relative_error, scaling_by_series, speedups_by_scale
    from clustersim.validation.throughput_data import THROUGHPUT_DATASETS

    if dataset in THROUGHPUT_DATASETS:
        _validate_throughput(dataset, json_out, profile, samples)
        return
    with progress_bar("validate", "rows", len(load_dataset(dataset).rows), disabled=json_out) as update:
        report = run_validate(dataset, profile, samples, progress=update)
    scale = speedups_by_scale(report)
    series = scaling_by_series(report)
    d = report.dataset
    if json_out:
        emit_json(
            {
                "dataset": d.name,
                "source": d.source,
                "metric": d.metric,
                "rows": [r.as_dict(d.metric) for r in report.rows],
                "median_abs_error": report.median_abs_error,
                "max_abs_error": report.max_abs_error,
                "p10_p90_coverage": report.coverage,
                **({"speedups_by_scale": scale.as_dict()} if scale.trends else {}),
                **(
                    {
                        "scaling_by_series": [x.as_dict() for x in series],
                        "median_abs_relative_error": median_relative_error(series),
                    }
                    if series
                    else {}
                ),
            }
        )
        return
    console.print(f"[bold]{d.description}[/]\n[dim]{d.source}[/]")
    speedup = d.metric == "speedup"
    labelled = any(r.label for r in report.rows)
    mixed = any(r.metric and r.metric != d.metric for r in report.rows)
    header = ["experiment", "optimizer"] if speedup else ["row"] if labelled else ["optimizer"]
    header += ["metric"] if mixed else []
    rows = []
    for r in report.rows:
        fmt = _metric_format(r.metric or d.metric)
        band = (
            "-"
            if r.p10 is None
            else f"{fmt.format(r.p10)}–{fmt.format(r.p90)}" + (" ✓" if r.inside else " ✗")
        )
        if speedup:
            label = [r.scenario or d.scenario, f"{r.optimizer} over {r.baseline}"]
        else:
            over = f" over {r.baseline}" if r.baseline and r.baseline != r.optimizer else ""
            label = [r.label or f"{r.optimizer}{over}"] + (
                [_metric_label(r.metric or d.metric)] if mixed else []
            )
        err = _slowness(r.error, r.metric or d.metric)
        gpus = f"{r.gpus} ({r.workers} workers)" if r.workers else r.gpus
        shown = "0.0%" if err == 0 else f"{100 * err:+.1f}%"  # a prediction inside a published range
        rows.append([*label, gpus, _published(r, fmt), fmt.format(r.predicted), band, shown])
    header += ["GPUs", "published", "predicted", "P10–P90", "error"]
    title = "published vs predicted" if mixed else f"{_metric_label(d.metric)}: published vs predicted"
    console.print(table(title, header, rows, left=len(header) - 4))
    some_speedup = any((r.metric or d.metric) == "speedup" for r in report.rows)
    sign = (
        _ERROR_SIGN_SPEEDUP if speedup else _ERROR_SIGN + ("; speedups: + too high" if some_speedup else "")
    )
    console.print(sign, style="dim", markup=False, highlight=False)
    if any(r.p10 is not None for r in report.rows):
        console.print(_BAND_MARKS, style="dim", markup=False, highlight=False)
    if any(r.published_below is not None for r in report.rows):
        console.print(_THRESHOLD_ROWS, style="dim", markup=False, highlight=False)
    if any(r.p10 is not None and r.p10 == r.p90 for r in report.rows):
        console.print(_ZERO_WIDTH_BANDS, style="dim", markup=False, highlight=False)
    for r in report.rows:
        if r.band_note:
            console.print(f"note: {r.gpus} GPUs: {r.band_note}", style="dim", markup=False, highlight=False)
    _print_undisclosed(report.rows, d.metric)
    cov = report.coverage
    console.print(
        f"median absolute error [bold]{100 * report.median_abs_error:.1f}%[/], "
        f"largest {100 * report.max_abs_error:.1f}%"
        + (
            ""
            if cov is None
            else f"; published value inside the P10–P90 band ({samples} draws) in {100 * cov:.0f}% of rows"
        )
    )
    _print_few_draws(samples, cov)
    if scale.trends:
        _print_speedups_by_scale(scale)
    if series:
        from clustersim.validation.published import RATE_METRICS

        rate_series = {r.series for r in report.rows if (r.metric or d.metric) in RATE_METRICS}
        _print_scaling_by_series(series, median_relative_error(series), rate_series)


def _print_offload_phases(r) -> None:
    """An offloaded run's phases as DeepSpeed's wall_clock_breakdown times them (offload.step_phases):
    the breakdown above counts the GPU's waits on the host during backward (a blocking gradient copy)
    as exposed host, beside the CPU optimizer's step; the phases say which phase they fall in, as
    `offload plan`'s backward and step columns do."""
    from clustersim.simulator.offload import step_phases

    ph = step_phases(r.ops, r.iteration_time)
    if ph is None:
        return
    console.print(
        f"phases (as DeepSpeed's wall_clock_breakdown times them): forward {_ms(ph['forward'])} ms, "
        f"backward {_ms(ph['backward'])} ms (with the GPU's waits on the host's gradient copies), "
        f"step {_ms(ph['step'])} ms, other {_ms(ph['other'])} ms",
        markup=False,
        highlight=False,
    )


def _setting(value, unit: str) -> str:
    """An undisclosed setting's value as printed: a number in its unit, or a named choice."""
    return f"{value}{unit}" if isinstance(value, str) else f"{value:g}{unit}"


def _print_undisclosed(rows, metric: str) -> None:
    """Each row that depends on a setting its source does not give: the setting, why it is open, the
    value that row used (each note names its row: they follow the table), and the prediction (and its
    error) at each plausible value."""
    for r in rows:
        if not r.undisclosed_range:
            continue
        own = r.metric or metric
        fmt = _metric_format(own) + _METRIC_UNIT.get(own, "")
        unit = f" {r.undisclosed_unit}" if r.undisclosed_unit else ""
        name = "the GPU count" if r.undisclosed_key == "gpus" else r.undisclosed_key
        used = "its default" if r.undisclosed_used is None else _setting(r.undisclosed_used, unit)
        points = ", ".join(
            f"{_setting(value, unit)} → {fmt.format(pred)} "
            f"({100 * _slowness(pred / r.published - 1, own):+.1f}%)"
            for value, pred in r.undisclosed_range
        )
        console.print(
            f'undisclosed, row "{r.label or r.optimizer}": {name} is not published ({r.undisclosed_why}); '
            f"that row uses {used}; predicted at {points}",
            style="dim",
            markup=False,
            highlight=False,
        )


_METRIC_UNIT = {"iteration_time": " s"}


_ERROR_SIGN = (
    "error: + predicted too slow (a step too long, a rate too low), - predicted too fast; "
    "|error| = |predicted - published| / published"
)
_ERROR_SIGN_SPEEDUP = "error: (predicted - published) / published speedup, + the predicted speedup too high"
_BAND_MARKS = "✓ / ✗: the published value inside / outside the predicted P10–P90"
_THRESHOLD_ROWS = (
    "a published range a–b: the source gives a threshold (the first point of its grid that reaches a), "
    "so its own value lies in a–b; ✓ when the band meets that range; the error is 0 when the prediction "
    "lies in a–b, else its distance to the nearer end (relative to that end), and counts so in the median"
)


_ZERO_WIDTH_BANDS = (
    "a band of zero width (P10 = P90): no uncertain input enters the row, whose every input the source "
    "states (e.g. a simulation's own link rate and compute-only step): it is the model's answer to the "
    "source's settings, and its error is the model's alone"
)


def _slowness(error: float, metric: str) -> float:
    """A row's error with the sign of 'predicted too slow' (validation.published.slowness, which --json
    gives as slowness_error)."""
    from clustersim.validation.published import slowness

    return slowness(error, metric)


def _metric_label(metric: str) -> str:
    """A metric's name with its unit where its values print without one (iteration_time, seconds)."""
    unit = _METRIC_UNIT.get(metric, "").strip()
    return f"{metric} ({unit})" if unit else metric


def _published(r, fmt: str) -> str:
    """The published value, or a threshold row's range (published to published_below)."""
    if r.published_below is None:
        return fmt.format(r.published)
    return f"{fmt.format(r.published)}–{fmt.format(r.published_below)}"


def _metric_format(metric: str) -> str:
    return {
        "speedup": "{:,.2f}x",
        "slowdown": "{:,.2f}x",
        "iteration_time": "{:,.3f}",
        "tokens_per_s_per_gpu": "{:,.0f}",
        "compute_utilization": "{:.1%}",
    }.get(metric, "{:,.1f}")


def _print_speedups_by_scale(scale) -> None:
    """The per-GPU-count speedup table of a dataset with several optimizers on the same GPUs."""
    arrow = {1: "rises", -1: "falls", 0: "is flat"}
    rows = [
        [f"{t.optimizer} over {t.baseline}", p.gpus]
        + [f"{p.published:.2f}x", f"{p.predicted:.2f}x", f"{100 * p.error:+.1f}%"]
        for t in scale.trends
        for p in t.points
    ]
    header = ["speedup", "GPUs", "published", "predicted", "error"]
    console.print(table("speedup per GPU count: published vs predicted", header, rows, left=1))
    worst_trend, worst = scale.worst
    console.print(
        f"speedup error: median [bold]{100 * scale.median_abs_error:.1f}%[/], worst "
        f"{100 * worst.error:+.1f}% ({worst_trend.optimizer}, {worst.gpus} GPUs)"
    )
    for t in scale.trends:
        a, b = t.trend_points[0].gpus, t.trend_points[-1].gpus
        console.print(
            f"{t.optimizer} over {t.baseline} from {a} to {b} GPUs: published {arrow[t.published_trend]}, "
            f"predicted {arrow[t.predicted_trend]} "
            + ("[green](same sign)[/]" if t.same_sign else "[red](wrong sign)[/]")
        )


def _print_scaling_by_series(series, median: float | None, rates: set | frozenset = frozenset()) -> None:
    """Each series' rows: their error, and relative to the series' smallest run (a level bias cancels);
    the series in ``rates`` measure a rate, whose errors are signed as 'predicted too slow' (_slowness)."""

    def pct(x: float, name: str) -> str:
        return f"{-100 * x if name in rates else 100 * x:+.1f}%"

    rows = [
        [x.name, p.gpus, pct(p.error, x.name), "-" if i == 0 else pct(p.relative, x.name)]
        for x in series
        for i, p in enumerate(x.points)
    ]
    header = ["series", "GPUs", "error", "relative to smallest"]
    console.print(table("error with scale, inside one system's runs", header, rows, left=1))
    console.print(
        "error and relative error: + predicted too slow (relative: the step grows more with scale than "
        "measured), - predicted too fast",
        style="dim",
        markup=False,
        highlight=False,
    )
    if median is not None:
        console.print(
            f"median absolute error relative to each series' smallest run [bold]{100 * median:.1f}%[/]"
        )


def _compute_label(r) -> str:
    """A row's compute source for the table: 'carried' names whose measurement it carried."""
    return f"carried ({r.carried_from})" if r.compute == "carried" and r.carried_from else r.compute


def _validate_throughput(dataset: str, json_out: bool, profile, samples: int) -> None:
    from clustersim.validation.gpu_throughput import validate_throughput
    from clustersim.validation.throughput_data import load_gpu_throughput

    rows = len(load_gpu_throughput(dataset).rows)
    with progress_bar("validate", "rows", rows, disabled=json_out) as update:
        report = validate_throughput(profile, samples, progress=update, dataset=dataset)
    if json_out:
        emit_json(
            {
                "dataset": report.name,
                "rows": [r.as_dict() for r in report.rows],
                "median_abs_error": report.median_abs_error,
                "max_abs_error": report.max_abs_error,
                "p10_p90_coverage": report.coverage,
                "scored_rows": len(report.scored),
            }
        )
        return
    console.print(f"[bold]{report.description}[/]")

    def rate(x: float) -> str:  # a band as precise as the values it brackets
        return f"{x:,.1f}" if x < 100 else f"{x:,.0f}"

    rows = []
    for r in report.rows:
        band = "-" if r.p10 is None else f"{rate(r.p10)}–{rate(r.p90)}" + (" ✓" if r.inside else " ✗")
        rows.append(
            [
                f"{r.model} {r.seq_len}", r.gpu, r.gpus, r.micro_batch, r.precision, r.execution,
                r.source_label, *([_compute_label(r)] if profile else []), f"{r.published:,.1f}",
                f"{r.predicted:,.1f}", band,
                f"{100 * _slowness(r.error, 'samples_per_s'):+.1f}%" + ("" if r.scored else " (not scored)"),
            ]
        )  # fmt: skip
    truth = "measured" if dataset == "gpu_steps" else "published"
    header = ["model", "GPU", "GPUs", "batch", "prec.", "execution", "source"]
    header += [*(["compute"] if profile else []), truth, "predicted", "P10–P90"]
    console.print(table(f"samples/s: predicted vs {truth}", [*header, "error"], rows, left=len(header) - 3))
    console.print(_ERROR_SIGN, style="dim", markup=False, highlight=False)
    if profile:
        console.print(
            "[dim]compute: measured = the profile's own measurement of that model; carried = another "
            "model's measurement carried over; defaults = the profile's rates where it has them, else "
            "the catalog's[/]"
        )
        from clustersim.calibration.profile import load_profile
        from clustersim.validation.gpu_throughput import unused_measurements

        for line in unused_measurements(report.rows, load_profile(profile)):
            console.print(f"[dim]{line}[/]", highlight=False)
    cov = report.coverage
    console.print(
        f"{len(report.scored)} scored rows"
        + (
            " (rows marked not scored bin sequences by length, so most are shorter than the length given)"
            if len(report.scored) < len(report.rows)
            else ""
        )
        + ": median absolute error "
        f"[bold]{100 * report.median_abs_error:.1f}%[/], largest {100 * report.max_abs_error:.1f}%"
        + (
            ""
            if cov is None
            else f"; {truth} value inside the P10–P90 band ({samples} draws) in {100 * cov:.0f}% of rows"
        )
    )
    _print_few_draws(samples, cov)


def _print_few_draws(samples: int, coverage: float | None) -> None:
    """A band's coverage read from fewer draws than the default is itself uncertain: a band from 8 draws
    moves by 10% or more (docs/uncertainty.md), enough to move rows in or out."""
    from clustersim.simulator.uncertainty import DEFAULT_SAMPLES

    if coverage is not None and 0 < samples < DEFAULT_SAMPLES:
        console.print(
            f"note: bands from {samples} draws move more between draw counts than the default "
            f"{DEFAULT_SAMPLES}'s (under 3%), so rows near a band's edge can move in or out: quote "
            f"coverage at {DEFAULT_SAMPLES} draws",
            style="dim",
            markup=False,
            highlight=False,
        )


@app.command()
def schema(
    markdown: bool = typer.Option(
        False, "--markdown", help="The scenario reference (docs/scenario-reference.md) instead of JSON."
    ),
):
    """Print the JSON Schema of a scenario file (from the model that validates it), e.g. for an editor's
    completion and checks: `clustersim schema > scenario.schema.json`."""
    import json

    from clustersim.scenario_reference import reference_markdown, scenario_schema

    if markdown:
        print(reference_markdown())
    else:
        print(json.dumps(scenario_schema(), indent=2))


def main() -> None:  # console-script entry point
    import atexit
    import gc
    import signal

    # At exit the interpreter collects every object a long command left (a plan's 2,490 candidates and
    # their records): frozen, they are skipped, about 0.1 s of a plan's exit (nothing is left to clean up
    # that the process's end does not free).
    atexit.register(gc.freeze)

    if hasattr(signal, "SIGPIPE"):
        # `clustersim run ... | head` : stop quietly when the reader goes away, as Unix tools do
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    plain_help_when_piped()
    app()


if __name__ == "__main__":
    main()
