"""`clustersim sweep|report|plan`: what-if sweeps and capacity planning (registered in cli.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from clustersim.commands.counts import count_option, counts_by_name
from clustersim.commands.support import (
    CatalogOpt,
    CostOpt,
    InstanceOpt,
    JsonOpt,
    ProfileOpt,
    console,
    emit_json,
    finite_option,
    price_option,
    progress_bar,
    samples_option,
    table,
    with_catalogs,
)
from clustersim.errors import InputError, shortened


def sweep(
    sweep_file: Path = typer.Argument(..., help="Sweep file: base scenario + lists of values to vary."),
    out: Path = typer.Option(
        Path("results"),
        "--out",
        help="Results folder (created in a folder that exists; a re-run resumes it).",
    ),
    scheduler: Optional[str] = typer.Option(
        None, "--scheduler", help="tcp://HOST:8786 of an existing Dask cluster; default: this process."
    ),
    workers: Optional[int] = typer.Option(
        None,
        "--workers",
        min=1,
        help="Local worker processes (default: every core this process may use; 1: a plain loop in this "
        "process). Sweeps whose first batch says the rest takes under 6 s run in this process. "
        "Ignored with --scheduler.",
    ),
    profile: Optional[str] = ProfileOpt,
    samples: Optional[int] = samples_option(
        None,
        (
            "Draws of the uncertain parameters per row for the P10–P90 columns (default: the sweep file's "
            "`samples`, 32); 0 turns them off and runs about 33x faster."
        ),
    ),
    json_out: bool = JsonOpt,
    catalogs: Optional[list[Path]] = CatalogOpt,
):
    """Run a what-if sweep on this machine's cores (or a Dask cluster with --scheduler); rows are written
    to OUT/results.csv as they finish, each with its P10–P90."""
    from clustersim.sweeps.run import dask_client, default_workers, run_locked
    from clustersim.sweeps.spec import load_sweep
    from clustersim.sweeps.store import ResultsFolder

    workers = workers or default_workers()
    # every axis value checked; the file's `catalog:` and --catalog in use while rows are checked and run
    sw = load_sweep(sweep_file, profile=profile, samples=samples, catalogs=catalogs)
    with sw.catalogs_in_use():
        invalid = sw.invalid_rows()
    sw.refuse_without_a_valid_row(invalid)  # before the folder is made
    # connected once, before the folder is made: an address that does not answer is refused too
    with dask_client(scheduler, workers) as client:
        folder = ResultsFolder(out, sw)
        with sw.catalogs_in_use(), folder.locked():  # a second sweep into the same folder is refused
            folder.open()  # a folder of another sweep is refused before anything is printed
            total = len(sw.rows())
            notes = sw.unused_axes()
            if json_out:
                counts = run_locked(sw, folder, client, workers)
                emit_json({"out": str(out), **counts, "invalid": _invalid_reasons(out), "notes": notes})
                return
            console.print(f"sweep [bold]{sw.spec.name}[/]: {total} rows over {', '.join(sw.axes)} -> {out}/")
            for note in notes:
                console.print(f"note: {note}", markup=False, highlight=False)
            if invalid:
                console.print(
                    f"[yellow]{sum(invalid.values())} of {total} rows are not a valid cluster as given[/] "
                    "(recorded as invalid, the others run):"
                )
                invalid = dict(sorted(invalid.items(), key=lambda kv: -kv[1])[:5])  # those printed
                for reason, n in invalid.items():
                    console.print(f"  {n} x {shortened(reason, 200)}")
            try:
                with progress_bar("sweep", "rows", total) as update:
                    counts = run_locked(sw, folder, client, workers, progress=update)
            except KeyboardInterrupt:
                console.print(
                    f"interrupted: {len(folder.read_rows())} of {total} rows are saved in {out}/results.csv; "
                    "run the same command again to resume"
                )
                raise typer.Exit(130) from None
    failed = sum(_invalid_reasons(out).values())
    if counts["written"] == 0:  # a resumed sweep whose rows were all done: say so, not "0 rows simulated"
        none_invalid = "" if failed else " (none invalid)"
        console.print(
            f"nothing to simulate: all {counts['skipped']} rows were already done in {out}/{none_invalid}; "
            f"results in {out}/results.csv"
        )
        if failed:
            _say_invalid(out, invalid)
    else:
        ran = (
            f"{counts['written']} rows run ({counts['written'] - min(failed, counts['written'])} simulated)"
            if failed
            else f"{counts['written']} rows simulated"
        )
        console.print(f"{ran}, {counts['skipped']} already done; results in {out}/results.csv")
        _say_invalid(out, invalid)
    if failed and failed >= total:  # every row failed (e.g. none fits in memory): not a success
        console.print(
            f"[red]error: none of the {total} rows could be simulated[/] (the reasons above, and in the CSV)"
        )
        raise typer.Exit(1)


def _invalid_reasons(out: Path) -> dict[str, int]:
    """Rows recorded as invalid, by reason (a row written twice counts once)."""
    import csv
    from collections import Counter

    path = Path(out) / "results.csv"
    if not path.exists():
        return {}
    with path.open(newline="") as fh:
        unique = {r.get("row_id"): r for r in csv.DictReader(fh)}
    return dict(Counter(r.get("error", "") for r in unique.values() if r.get("status") == "invalid"))


def _say_invalid(out: Path, announced: dict[str, int] | None = None) -> None:
    """Rows that could not run are kept with their reason; say how many and the commonest reasons,
    each reason once: those ``announced`` before the run (the rows found invalid as given) are counted,
    not printed again."""
    reasons = _invalid_reasons(out)
    if not reasons:
        console.print("every row was simulated (none invalid)")
        return
    said = [r for r in reasons if any(a and a in r for a in announced or {})]
    new = {r: n for r, n in reasons.items() if r not in said}
    known = f", {sum(reasons[r] for r in said)} of them the invalid rows above" if said else ""
    console.print(
        f"[yellow]{sum(reasons.values())} row(s) could not be simulated[/]{known}"
        + (", e.g.:" if new else "")
    )
    for reason, n in sorted(new.items(), key=lambda kv: -kv[1])[:3]:
        console.print(f"  {n} x {shortened(reason, 200)}")


def _mfu(row: dict) -> str:
    return "—" if row.get("mfu") is None else f"{100 * row['mfu']:.0f}%"


def chosen_flops(row: dict | None) -> str | None:
    """MFU and tokens/s per GPU of a plan's choice, as run reports them (model FLOPs, no recomputation)."""
    if row is None or row.get("mfu") is None:
        return None
    tokens = row.get("tokens_per_s_per_gpu")
    return f"{100 * row['mfu']:.1f}% MFU" + (f", {tokens:,.0f} tokens/s per GPU" if tokens else "")


NetworkPricesOpt = typer.Option(
    None,
    "--network-prices",
    help="Network price catalog (a copy of network_prices.yaml in the catalogs, with your quotes), or 'none' "
    "for GPU-hours only; default: the shipped one. Owned clusters only: refused with a rented run (its "
    "network comes with the instance).",
)
InstancesOpt = typer.Option(
    None, "--instances", help="Instance catalog: a copy of catalogs/instances.yaml with your prices."
)


def _own_prices_option(rented_by: str) -> typer.models.OptionInfo:
    """--own-prices, its help naming the options that make a run rented in the command at hand
    (``rented_by``: compare has no --price), with which it is refused (costing.cost_model)."""
    return typer.Option(
        None,
        "--own-prices",
        help="Ownership catalog: a copy of catalogs/ownership.yaml with your figures, for owned clusters; "
        f"refused with {rented_by} (a rented run reads none of it).",
    )


OwnPricesOpt = _own_prices_option("--cost rent, --price or --instance")
CompareOwnPricesOpt = _own_prices_option("--cost rent or --instance")  # compare has no --price


def _costs(cost, price, network_prices, instance, instances, own_prices):
    """The cost model the options ask for (report/costing.model_from_options, which the API calls too)."""
    from clustersim.report.costing import model_from_options

    return model_from_options(cost, price, network_prices, instance, instances, own_prices)


# what a budget is compared with depends on the cost model: one declaration for plan and report
BudgetOpt = typer.Option(
    None,
    "--budget",
    help="Most USD to spend: owned (--cost own, the default), the cluster's capital plus the run's power; "
    "rented, the run's rental.",
)
BaselineOpt = typer.Option(
    None,
    "--baseline",
    help="Uncompressed optimizer speedups are measured against (default: the scenario's, e.g. adam).",
)


def _network(value: Optional[str]):
    from clustersim.report.costing import network_option

    return network_option(value)


def report(
    results: Path = typer.Argument(..., help="A sweep's results folder."),
    out: Path = typer.Option(
        Path("report.html"), "--out", help="The HTML file (self-contained, opens offline)."
    ),
    price: Optional[float] = typer.Option(
        None, "--price", help="USD per GPU-hour for every GPU; default: catalog prices per GPU type."
    ),
    steps: Optional[str] = typer.Option(
        None,
        "--steps",
        help="Training steps for time-to-train: 100000 or per optimizer (adam=100000, binsgdm=110000); "
        "default: the sweep's, else 100,000.",
    ),
    deadline: Optional[str] = typer.Option(
        None,
        "--deadline",
        help="Wall-clock limit the recommendation must meet, with its unit: 60d, 1440h, 90m, 2w.",
    ),
    budget: Optional[float] = BudgetOpt,
    baseline: Optional[str] = BaselineOpt,
    network_prices: Optional[str] = NetworkPricesOpt,
    cost: Optional[str] = CostOpt,
    instance: Optional[str] = InstanceOpt,
    instances: Optional[str] = InstancesOpt,
    own_prices: Optional[str] = OwnPricesOpt,
    samples: Optional[int] = samples_option(
        None,
        "Parameter draws for the paired speedup bands (default: the sweep's `samples`; 0: none).",
    ),
    png: Optional[Path] = typer.Option(
        None, "--png", help="Also export each figure as PNG into this folder (kaleido + Chromium)."
    ),
    json_out: bool = JsonOpt,
):
    """Capacity-planning report (self-contained HTML), one section per model: the recommendation, what to
    run at each NIC speed with its speedup over the baseline (paired P10–P90) and cost (owned: servers,
    network and power; or rented: instance-hours, network included), the Pareto frontier, and figures.

    Figures: speedup vs GPU count per optimizer and network; the iteration breakdown as stacked bars; a
    timeline of one iteration; bytes on the wire; cost against time-to-train with the Pareto frontier.
    """
    from clustersim.planner.compare import StepsPlan
    from clustersim.report.build import parse_duration, write_report

    price_option(price, "--price")
    finite_option(budget, "--budget")
    hours = parse_duration(deadline) if deadline is not None else None
    plan = StepsPlan.parse(steps)
    costs = _costs(cost, price, network_prices, instance, instances, own_prices)
    try:
        info = write_report(
            results, out, plan, price, png, hours, budget, baseline, _network(network_prices), samples, costs
        )
    except InputError as exc:  # a folder with no row that ran says which folder
        if exc.source is None and exc.key is None:
            raise exc.located(source=str(results)) from None
        raise
    if json_out:
        emit_json(info)
        return
    console.print(f"report written to [bold]{out}[/] ({len(info['figures'])} figures)")
    if info["unfinished"]:
        console.print(f"note: {info['unfinished']}", markup=False, highlight=False)
    console.print(f"[dim]cost: {info['pricing']}[/]", highlight=False)
    for model, part in info["models"].items():
        if len(info["models"]) > 1:
            console.print(f"[bold]{model}[/]")
        for line in part["recommendation"]:
            console.print(f"  • {line}")
        console.print(_by_network_table(model, part["by_network"]))
    if info["png"]:
        console.print(info["png"]["message"], markup=False, highlight=False)


def _by_network_table(model: str, cells: list[dict]):
    """The report's per-network answer in the terminal: at each NIC speed and GPU count, the cheapest
    optimizer, its speedup over the baseline (paired P10–P90), time and cost; fits 80 columns."""
    from clustersim.report.analysis import EQUIVALENT_GAIN

    # a simpler optimizer kept within the tie rule is shown as a tie ("adam ~ binsgdm"), said in the title
    tie = any(c.get("tie_with") for c in cells)
    return table(
        f"{model}: cheapest optimizer per network and GPU count"
        + (f" (a ~ b: a kept, b cheaper by under {100 * EQUIVALENT_GAIN:.0f}%)" if tie else ""),
        ["network", "GPUs", "optimizer", "speedup (P10–P90)", "train", "cost"],
        [
            [
                c["network"].replace("Ethernet ", "Eth ").replace("InfiniBand ", "IB "),
                c["gpus"],
                c["optimizer"] + (f" ~ {c['tie_with']}" if c.get("tie_with") else ""),
                "—"
                if c["speedup"] is None
                else f"{c['speedup']:.2f}x"
                + (
                    f" ({c['speedup_p10']:.2f}–{c['speedup_p90']:.2f})"
                    if c["speedup_p10"] is not None
                    else ""
                ),
                f"{c['ttt_h']:,.1f} h",
                f"${c['cost']:,.0f}",
            ]
            for c in cells
        ],
        left=3,
    )


def _have_takes_no_cost_option(**given) -> None:
    """--cost, --price and --instance refused with --have (report/costing, shared with the API)."""
    from clustersim.report.costing import refuse_cost_options_with_have

    refuse_cost_options_with_have(**given)


def _run_plan(args, extra, candidates, json_out):
    """`plan`'s search, with its progress (or its JSON printed: None); an error that no candidate of the
    user's file could run names the file."""
    from clustersim.planner.planning import plan, plan_as_json

    try:
        if json_out:
            answer = plan_as_json(plan(*args, **extra))
            emit_json(answer)
            if answer["chosen"] is None:  # nothing feasible: exit 1, as the text answer does
                raise typer.Exit(1)
            return None
        with progress_bar("plan", "candidates") as update:
            return plan(*args, progress=update, **extra)
    except InputError as exc:
        if candidates is not None and exc.source is None and exc.message.startswith("none of the"):
            raise exc.located(source=str(candidates)) from None
        raise


def _plan_have(model, steps, have, candidates, global_batch, extra, instances, own_prices, hours, budget):
    """`plan --have`: the owned cluster's options, each with capital, time to train and payback."""
    from clustersim.planner.upgrades import plan_have
    from clustersim.report.costing import owned_and_rented

    own, rent = owned_and_rented(extra["network"], instances, own_prices)
    args = (model, steps, have, candidates, global_batch, own, rent, extra["samples"])
    kw = {"deadline_h": hours, "budget": budget, "tokens": extra["tokens"], "baseline": extra["baseline"]}
    if extra.get("json_out"):
        answer = plan_have(*args, **kw)
        emit_json(answer)
        if answer["recommended"] is None:  # no option meets the deadline (and budget): exit 1, as plan
            raise typer.Exit(1)
        return
    with progress_bar("plan", "options") as update:
        result = plan_have(*args, progress=update, **kw)
    per = result["steps_per_optimizer"]
    steps_text = ", ".join(f"{o} {n:,}" for o, n in per.items()) if per else f"{result['steps']:,}"
    console.print(
        f"[bold]{model}[/], {steps_text} steps of {result['global_batch']:,} samples on "
        f"{result['cluster']} ({have}), deadline {hours:,.1f} h: the fastest of "
        f"{', '.join(result['optimizers'])} per option",
        highlight=False,
    )
    if result["tokens_note"]:
        console.print(f"[dim]{result['tokens_note']}[/]", highlight=False)
    for note in result["recipe_notes"]:
        console.print(f"note: {note}", markup=False, highlight=False)
    console.print(f"[dim]owned options: {result['cost_basis']}[/]", highlight=False)
    console.print(table("What to do with the cluster you have", *_have_table(result["options"]), left=2))
    console.print(
        "[dim]capital: what the option buys (the new NICs, cables and switch ports for every node; or the "
        "added servers and their ports). run: what one run costs (owned: amortised capital and power; "
        "rented: instance-hours). payback: the runs like this one whose savings pay the option's capital "
        "(each run's hours saved at what an owned cluster-hour costs, less the power the option adds), and "
        "those runs' days of training at the option's speed (past its life: more days than the hardware's "
        "amortisation life holds, so it is written off before it pays for itself)"
        + (
            "; with --samples 0 the run's P10–P90 is the prices' alone (no time band)"
            if not extra["samples"]
            else ""
        )
        + (
            "; * misses the deadline"
            + (
                " or the budget (owned: capital plus the run's power; rented: the rent)"
                if budget is not None
                else ""
            )
            if any(not r.get("meets", True) for r in result["options"])
            else ""
        )
        + "[/]",
        highlight=False,
    )
    capped: dict[str, list[str]] = {}
    for r in result["options"]:  # why a faster NIC saves nothing more
        if r.get("pcie_capped"):
            capped.setdefault(r["pcie_capped"], []).append(r["what"].removeprefix("to "))
    for why, whats in capped.items():
        console.print(f"[dim]note: {', '.join(whats)}: {why}[/]", highlight=False)
    console.print(f"  • {result['recommendation']}", markup=False, highlight=False)
    for line in result["recommendation_notes"]:
        console.print(f"  • {line}", markup=False, highlight=False)
    if result["recommended"] is None:  # no option meets the deadline (and budget): exit 1, as plan
        raise typer.Exit(1)


def _have_table(rows: list[dict]) -> tuple[list[str], list[list]]:
    def hours(r):
        band = f" ({r['ttt_p10_h']:,.1f}–{r['ttt_p90_h']:,.1f})" if r.get("ttt_p10_h") is not None else ""
        return f"{r['ttt_h']:,.1f}{band}"

    def payback(r):
        if r.get("saves_no_time"):
            return "never (saves no time)"
        if r.get("never_pays_back"):
            return "never"
        if r["payback_days"] is None:
            return "—"
        late = ", past its life" if r.get("payback_beyond_life") else ""
        return f"{r['payback_days']:,.1f} d ({r['payback_runs']:,.1f} runs){late}"

    cols = [
        "option",
        "what",
        "optimizer",
        "layout",
        "hours (P10–P90)",
        "saved h",
        "capital",
        "run (P10–P90)",
        "payback",
    ]
    body = [
        [
            r["option"] + ("" if r.get("meets", True) else " *"),
            r["what"],
            r["optimizer"],
            r.get("layout") or "DP",
            hours(r),
            "—" if r["saved_h"] is None or r["option"] == "keep" else f"{r['saved_h']:,.1f}",
            f"${r['capital']:,.0f}",
            f"${r['run_cost']:,.0f} ({r['run_cost_p10']:,.0f}–{r['run_cost_p90']:,.0f})",
            payback(r),
        ]
        for r in rows
    ]
    return cols, body


def _versus(runners_up: list[dict], chosen: dict) -> tuple[list[str], list[str]]:
    """The runners-up's "vs the choice" cells, and the footnotes of those marked: a runner-up cheaper
    than the choice but equivalent to it and more complex (analysis.kept_simpler_note) is marked "*"
    (one mark per reason), so that a cheaper and faster runner-up does not read as a better choice
    missed."""
    from clustersim.planner.planning import why_not
    from clustersim.report.analysis import kept_simpler_reason

    marks: dict[str, str] = {}
    cells = []
    for r in runners_up:
        note = kept_simpler_reason(chosen, r)
        if note is not None:
            marks.setdefault(note, "*" * (len(marks) + 1))
        cells.append(why_not(r, chosen) + (f" {marks[note]}" if note else ""))
    notes = [f"{mark} {note}" for note, mark in marks.items()]
    return cells, notes


def _say_choice(result: dict) -> None:
    """The plan's answer under its header: the recommendation's lines, the optimizers no candidate
    could run, the choice's MFU, and a fit too close in GPU memory (as `run` warns of it)."""
    for line in result["text"]:
        console.print(f"  • {line}")
    for name, why in result["optimizers_not_run"].items():
        console.print(f"  • {name}: no candidate could run it, e.g. {why}", markup=False, highlight=False)
    if chosen_flops(result["chosen"]):
        console.print(f"[dim]the choice runs at {chosen_flops(result['chosen'])}[/]", highlight=False)
    for note in result.get("memory_notes", []):
        console.print(f"note: {note}", markup=False, highlight=False)


# `plan --help`'s epilog: the lines of the answer, in the order printed, and how to read them (one line
# each; rich markup, so no square brackets).
PLAN_ANSWER = "\n".join(
    [
        "[bold]The answer[/], in this order (--have prints its keep / upgrade / add / rent table instead):",
        "• Header: model, steps, samples per step, deadline (and budget); candidates simulated and those "
        "that could not run the model (e.g. out of GPU memory); notes on the recipe.",
        "• cost: the cost model that priced every number (owned: servers, network and power amortised; "
        "rented: instance-hours).",
        "• Recommended: the cheapest option that meets the deadline (and budget): optimizer, cluster, "
        "layout, hours to train and cost, each with its P10–P90 band.",
        "• Sooner for about the same cost: an option within 3% of its cost that trains at least 25% sooner.",
        "• Over adam (the baseline) on the same cluster: where a compressed optimizer is chosen, its "
        "speedup and saving, and the steps assumed for its convergence.",
        "• Risk: the choice's P90 is past the deadline; which option keeps its P90 within it.",
        "• '... would cost N% less ...; the two are equivalent, so the simpler one is kept': the cheapest "
        "option saves under 3%, is not over 3% faster and its band overlaps, but asks more (a compressed "
        "optimizer, offload, sharding or model parallelism, interleaving).",
        "• Fastest: the fastest option that meets the constraints, where it is over 3% sooner than the "
        "choice (and a faster one over budget, with what it would spend).",
        "• One line per compressed optimizer: its speedup over the baseline and where it stops paying "
        "(break-even NIC line rate), or why no candidate could run it.",
        "• the choice runs at N% MFU, M tokens/s per GPU.",
        "• Runners-up: other options that meet the constraints, with MFU, hours, cost and 'vs the "
        "choice'; '*' marks one cheaper but equivalent and more complex (its footnote says why).",
        "• Counts: candidates too slow for the deadline; not simulated, their lower bounds could win "
        "nothing; interleaved layouts not simulated; clusters not searched (too slow at peak FLOP rate).",
        "Exit 1 when nothing meets the deadline (and budget). --json gives the same as data: chosen, "
        "runners_up (each with kept_simpler), fastest, fastest_within, text and the counts.",
    ]
)


@with_catalogs
def plan_cmd(
    model: str = typer.Option(..., "--model", help="Catalog model, e.g. GPT-3-1.3B."),
    steps: Optional[str] = typer.Option(
        None,
        "--steps",
        parser=counts_by_name,
        help="Training steps: 100000 or per optimizer (adam=100000, binsgdm=110000); default: the "
        "candidates file's `steps`.",
    ),
    tokens: Optional[int] = typer.Option(
        None,
        "--tokens",
        parser=count_option(),
        help="Training tokens instead of --steps (300e9 or 300000000000): steps = tokens / (global batch "
        "x the model's sequence length), rounded up.",
    ),
    deadline: str = typer.Option(
        ...,
        "--deadline",
        help="Wall-clock limit with its unit: 60d, 1440h, 90m, 2w (a bare number is refused).",
    ),
    budget: Optional[float] = BudgetOpt,
    candidates: Optional[Path] = typer.Option(
        None,
        "--candidates",
        help="Sweep file of candidate clusters; default: the built-in grid (plan_candidates.yaml in the "
        "catalogs, a copy of which is a candidates file to edit): every GPU of the catalog but the "
        "CPU-2vCPU and H100-SXM-HBM2e-500W stand-ins (a CI runner and Meta's own H100 variant, neither "
        "sold; owned: those with a server price), 8 to 16,384 GPUs in 8-GPU nodes, one NIC "
        "per node, Ethernet or InfiniBand at 100, 200 or 400 Gb/s, adam, onebit-adam, zero-one-adam and "
        "binsgdm, each in the layouts that fit, 1,024 samples per step.",
    ),
    global_batch: Optional[int] = typer.Option(
        None,
        "--global-batch",
        parser=count_option(),
        help="Samples per step, the same on every candidate; default: the candidates file's "
        "`global_batch`, else 1,024, or a multiple of 1,024 giving each GPU of the largest candidate a "
        "sample where it has more GPUs.",
    ),
    price: Optional[float] = typer.Option(
        None, "--price", help="USD per GPU-hour for every GPU; default: catalog prices."
    ),
    baseline: Optional[str] = BaselineOpt,
    network_prices: Optional[str] = NetworkPricesOpt,
    cost: Optional[str] = CostOpt,
    instance: Optional[str] = InstanceOpt,
    instances: Optional[str] = InstancesOpt,
    own_prices: Optional[str] = OwnPricesOpt,
    have: Optional[Path] = typer.Option(
        None,
        "--have",
        help="The cluster you own (a scenario-style file with a `cluster:` section): the options become "
        "keep / upgrade NICs / add nodes / rent, each with its capital, time to train and payback.",
    ),
    profile: Optional[str] = ProfileOpt,
    samples: int = samples_option(
        32,  # simulator.uncertainty.DEFAULT_SAMPLES, as every command
        ("Draws of the uncertain parameters for the P10–P90 time-to-train of the choice and runners-up."),
    ),
    json_out: bool = JsonOpt,
):
    """The cheapest cluster, optimizer and parallel layout that meets the deadline (and budget), with
    runners-up and why. Where data parallelism does not fit, each candidate is tried with the lowest ZeRO
    stage and, per tensor-parallel size in a node, the fewest pipeline stages that fit (sequence parallel;
    no recomputation, else selective (unfused attention only), else full; deeper pipelines with less
    recomputation too; interleaved where that can pay)."""
    from clustersim.report.build import parse_duration

    # every option's value before what is missing (--steps from the candidates file): one run, one fix
    hours = parse_duration(deadline)
    finite_option(budget, "--budget")
    price_option(price, "--price")
    if have is not None:
        _have_takes_no_cost_option(cost=cost, price=price, instance=instance)
    args = (model, steps, hours, budget, candidates, global_batch, price)
    extra = {
        "tokens": tokens,
        "profile": profile,
        "samples": samples,
        "baseline": baseline,
        "network": _network(network_prices),
        "costs": _costs(cost, price, network_prices, instance, instances, own_prices),
    }
    if have is not None:
        extra["json_out"] = json_out
    if have is not None:
        _plan_have(model, steps, have, candidates, global_batch, extra, instances, own_prices, hours, budget)
        return
    result = _run_plan(args, extra, candidates, json_out)
    if result is None:  # --json: printed
        return
    per = result["steps_per_optimizer"]
    steps_text = ", ".join(f"{o} {n:,}" for o, n in per.items()) if per else f"{result['steps']:,}"
    # the refused candidates are not among the simulated ones ("(84 could not ...)" read as 84 of them)
    refused = f", {n:,} more could not run it (e.g. out of GPU memory)" if (n := result["invalid"]) else ""
    console.print(
        f"[bold]{model}[/], {steps_text} steps of {result['global_batch']:,} samples, deadline {hours:,.1f} h"
        + (f", budget ${budget:,.0f}" if budget else "")
        + f": {result['simulated']:,} candidates simulated"
        + refused
    )
    for note in result["recipe_notes"]:
        console.print(f"[dim]{note}[/]")
    console.print(f"[dim]cost: {result['pricing']}[/]", highlight=False)
    _say_choice(result)
    chosen = result["chosen"]
    if chosen is not None and result["runners_up"]:
        versus, footnotes = _versus(result["runners_up"], chosen)
        console.print(
            table(
                "Runners-up (also meet the constraints)",
                ["optimizer", "cluster", "MFU", "hours", "cost", "vs the choice"],
                [
                    [
                        r["optimizer"],
                        r["cluster"],
                        _mfu(r),
                        f"{r['ttt_h']:,.1f}"
                        + (
                            f" ({r['ttt_p10_h']:,.1f}–{r['ttt_p90_h']:,.1f})"
                            if r.get("ttt_p10_h") is not None
                            else ""
                        ),
                        f"${r['cost']:,.0f}",
                        vs,
                    ]
                    for r, vs in zip(result["runners_up"], versus)
                ],
                left=2,
            )
        )
        for line in footnotes:
            console.print(line, markup=False, highlight=False)
    if result["missed_deadline"]:
        n = result["missed_deadline"]
        console.print(f"[dim]{n:,} candidate{'s were' if n != 1 else ' was'} too slow for the deadline[/]")
    if result.get("pruned"):
        console.print(
            f"[dim]{result['pruned']:,} candidates not simulated: their lower bounds (compute, data-parallel "
            "exchange, a faster NIC's run) could be neither among the cheapest that meet the constraints nor "
            "the fastest[/]"
        )
    if result["interleaved_not_simulated"]:
        console.print(
            f"[dim]{result['interleaved_not_simulated']} interleaved layouts not simulated: their 1F1B twin "
            "computes longer than the fastest layout on its cluster takes[/]"
        )
    if result.get("not_searched"):
        console.print(
            f"[dim]{result['not_searched']:,} candidate clusters not searched for layouts: even at their "
            "GPUs' peak FLOP rate they would miss the deadline[/]"
        )
    if chosen is None:
        raise typer.Exit(1)
