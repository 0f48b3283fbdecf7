"""`plan --have FILE`: what the team's own cluster can do, and what changing it buys.

The options: keep it; upgrade its NICs (each faster NIC in the network price catalog, same count per
node); add as many nodes again (same NIC); or rent (each instance selling the same GPU, at the same GPU
count, network as sold). Each is simulated with every candidate optimizer in the layouts that fit (as
plan's candidates) and the fastest is kept. Capital is what the option buys: the new network's ports
(NIC, cable, switch ports per tier: report/prices.py) or the added servers and their network; renting
buys nothing and pays the instance-hours.

Payback (_payback, defined once): an hour the owned cluster no longer spends on this run is worth what
an hour of it costs (its servers and network amortised, and power: costing.Own); less the power the
option adds for every hour it runs, that is what one run saves. The capital divided by that saving is
the runs that pay the option back, and those runs at the option's speed, the days of training.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from clustersim.errors import InputError
from clustersim.io import read_structured_file
from clustersim.planner.breakeven import LEVEL, gbps_text, pcie_limited_line_rate
from clustersim.report.costing import Own, Rent, cost_band, nic_label
from clustersim.scenario import validate_scenario
from clustersim.sweeps.spec import row_id

HOURS_PER_DAY = 24.0
OPTION_KEYS = ("nic_kind", "nic_gbps", "nic_count", "nodes", "gpus_per_node")  # what an option changes


def load_have(path: Path, base) -> Any:
    """The owned cluster: a scenario-style file whose ``cluster`` section replaces the plan base's, and
    whose ``workload`` (all but the model, which --model names) and ``training`` sections, where given,
    are the team's code and recipe (fused kernels, precision, micro-batch); one line naming the file and
    key when it is not a valid cluster."""
    source = str(path)
    try:
        data = read_structured_file(Path(path))
    except InputError as exc:
        raise exc.located(key_prefix="--have") from None
    if not isinstance(data, dict) or not isinstance(data.get("cluster"), dict):
        raise InputError(
            "expected a scenario-style file with a `cluster:` mapping", source=source, key="cluster"
        )
    merged = base.model_dump(mode="json")
    merged["cluster"] = data["cluster"]
    if isinstance(data.get("workload"), dict) and data["workload"].get("model") is not None:
        from clustersim import catalog

        try:  # --model names the model trained; the file's must still be one (a typo is not ignored)
            catalog.model(str(data["workload"]["model"]))
        except InputError as exc:
            raise InputError(exc.message, source=source, key="workload.model") from None
    if isinstance(data.get("workload"), dict):
        merged["workload"] = {**data["workload"], "model": base.workload.model}
        if base.workload.model != data["workload"].get("model"):
            merged["workload"]["seq_len"] = base.workload.seq_len  # another model: its own length
    if isinstance(data.get("training"), dict):
        merged["training"] = data["training"]
    return validate_scenario(merged, source=source)


def options(have, rent: Rent, network: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The options for an owned cluster, each as sweep-row values on the have scenario, with its kind,
    label and capital (USD)."""
    c = have.cluster
    nodes, nic = c.nodes, c.nic
    rate = nic.count * nic.line_rate_gbps
    out = [{"option": "keep", "what": f"as owned ({nic_label(nic.model_dump())} per node)", "values": {}}]
    for kind in ("ethernet_tcp", "infiniband"):
        for r in sorted(float(x) for x in ((network or {}).get(kind) or {})):
            if nic.count * r > rate + 1e-9:
                new = {"kind": kind, "count": nic.count, "line_rate_gbps": r}
                option = {
                    "option": "upgrade NICs",
                    "what": f"to {nic_label(new)} per node",
                    "values": {"nic_kind": kind, "nic_gbps": r},
                }
                # past this line rate the GPUs' PCIe link, not the NIC, sets what each NIC delivers
                line, gen = pcie_limited_line_rate(
                    have.with_changes(**{"cluster.nic.kind": kind, "cluster.nic.line_rate_gbps": r})
                )
                if r > line:
                    option["pcie_capped"] = (
                        f"past {gbps_text(line)} Gb/s line rate the NIC's PCIe Gen{gen} link, not the NIC, "
                        "sets what it delivers"
                    )
                out.append(option)
    out.append({"option": "add nodes", "what": f"{nodes} more nodes", "values": {"nodes": 2 * nodes}})
    for inst in rent.sold_for(c.gpu, nodes):
        if (c.gpus_per_node * nodes) % inst["gpus"] == 0:
            out.append(
                {
                    "option": "rent",
                    "what": f"{c.gpus_per_node * nodes // inst['gpus']} x {inst['name']} "
                    f"at ${inst['price_per_hour']:,.2f}/h each",
                    "values": {
                        "gpus_per_node": inst["gpus"],
                        "nodes": c.gpus_per_node * nodes // inst["gpus"],
                        "nic_kind": inst["nic"]["kind"],
                        "nic_count": inst["nic"]["count"],
                        "nic_gbps": inst["nic"]["line_rate_gbps"],
                    },
                    "instance": inst["name"],
                }
            )
    return out


def _cluster(have, values: dict[str, Any]) -> dict[str, Any]:
    c = have.cluster.model_dump(mode="json")
    c["nodes"] = values.get("nodes", c["nodes"])
    c["gpus_per_node"] = values.get("gpus_per_node", c["gpus_per_node"])
    nic = dict(c["nic"])
    nic["kind"] = values.get("nic_kind", nic["kind"])
    nic["count"] = values.get("nic_count", nic["count"])
    nic["line_rate_gbps"] = values.get("nic_gbps", nic["line_rate_gbps"])
    c["nic"] = nic
    return c


def capital(own: Own, have, option: dict[str, Any]) -> float:
    """USD the option buys: an upgrade's whole new network (ports, cables, switch ports per tier), added
    nodes' servers and network; nothing to keep or rent."""
    kind = option["option"]
    if kind == "upgrade NICs":
        return own.capital(_cluster(have, option["values"]))[1]
    if kind == "add nodes":
        servers, network = own.capital(_cluster(have, option["values"]))
        kept = own.capital(have.cluster.model_dump(mode="json"))
        return servers - kept[0] + network - kept[1]  # the added servers and their ports
    return 0.0


def evaluate(
    have_path: Path,
    base,
    optimizers: list[str],
    steps,
    global_batch: int,
    own: Own,
    rent: Rent,
    samples: int = 0,
    progress: Callable[[int, int], None] | None = None,
    baseline: str | None = None,
) -> dict[str, Any]:
    """Every option with its fastest optimizer and layout: time to train (with its band), capital, what a
    run costs (owned options: the owned model; rented ones: the instance-hours), hours saved per run and
    payback in days of training saved. ``steps``: a count, or a ``compare.StepsPlan`` whose optimizers
    each train their own count (one not named: ``baseline``'s, as `plan` and `compare` count them)."""
    from clustersim.planner.compare import StepsPlan, mean_step_time
    from clustersim.planner.planning import _add_bands, say_stage, simulate_rows, with_layouts
    from clustersim.report.analysis import cluster_label

    have = load_have(have_path, base)
    own.server(have.cluster.gpu)  # a GPU the ownership catalog cannot price: said before any work
    base_json = have.model_dump(mode="json")
    opts = options(have, rent, own.network)
    plan = StepsPlan.parse(steps)
    steps = simulated_steps(plan, baseline)  # the rows run with one count; each is timed at its own

    def steps_of(optimizer: str) -> int:
        return plan.of(optimizer, baseline) or steps

    rows = [{**opt["values"], "optimizer": name} for opt in opts for name in optimizers]
    laid = with_layouts(have, rows, steps, global_batch)
    option_of = {row_id(r): _option_index(r, opts) for r in laid}
    records, _ = simulate_rows(base_json, laid, steps, global_batch, progress)
    ok = [r for r in records if r["status"] == "ok"]
    if not ok:
        raise InputError(
            f"the owned cluster cannot train {have.workload.model} in any option: "
            f"{records[0]['error'][:200]}",
            source=str(have_path),
        )
    if samples > 0:
        say_stage(progress, f"banding the fastest of each of {len(opts)} options ({samples} draws each)")
    o = own.o
    life_h = o["amortisation_years"] * o["hours_per_year"] * o["utilisation"]  # as Own.price amortises
    results = []
    for i, opt in enumerate(opts):
        mine = [r for r in ok if option_of.get(r["row_id"]) == i]
        if not mine:
            continue
        for r in mine:  # 1-bit Adam's warmup stage runs at its own speed (compare.mean_step_time)
            per_step = mean_step_time(
                r["optimizer"], r["iteration_time_s"], r.get("warmup_iteration_time_s"), None
            )
            r["steps"] = steps_of(r["optimizer"])
            r["ttt_h"] = r["steps"] * per_step / 3600
        best = min(mine, key=lambda r: r["ttt_h"])
        if samples > 0:
            _add_bands([best], base_json, laid, steps, global_batch, samples, workers=1)
        cluster = _cluster(have, opt["values"])
        cluster["gpu"] = have.cluster.gpu
        priced = (rent if opt["option"] == "rent" else own).price(cluster)
        spent = capital(own, have, opt)
        ratio = [best[k] / best["ttt_h"] if best.get(k) else None for k in ("ttt_p10_h", "ttt_p90_h")]
        band = cost_band(best["ttt_h"] * priced.per_hour, priced.sigma, *ratio)
        # the baseline optimizer on the same option, as `plan` sets each row's: its speedup and the lines
        # that say what changing the optimizer gains and assumes (report/analysis.over_baseline_line)
        theirs = [r for r in mine if r["optimizer"] == baseline and best["optimizer"] != baseline]
        b = min(theirs, key=lambda r: r["ttt_h"]) if theirs else None
        if b is not None:
            b = {
                "optimizer": b["optimizer"],
                "steps": b["steps"],
                "ttt_h": b["ttt_h"],
                "run_cost": b["ttt_h"] * priced.per_hour,
            }
        results.append(
            {
                **{k: v for k, v in opt.items() if k != "values"},
                "optimizer": best["optimizer"],
                "steps": best["steps"],
                "layout": best.get("layout"),
                "cluster": cluster_label({**best, "layout": best.get("layout")}),
                "ttt_h": best["ttt_h"],
                "ttt_p10_h": best.get("ttt_p10_h"),
                "ttt_p90_h": best.get("ttt_p90_h"),
                "capital": spent,
                "run_cost": best["ttt_h"] * priced.per_hour,
                # the run's cost holds the amortised share of what the option buys: spent_on_run counts
                # that capital once, whole
                "capital_share": best["ttt_h"] * spent / life_h,
                "run_cost_p10": band[0],
                "run_cost_p90": band[1],
                "power_per_h": priced.parts.get("power", 0.0),
                "baseline": b,
                "speedup": b["ttt_h"] / best["ttt_h"] if b else None,
                "cost_basis": priced.describe(best["ttt_h"]),
            }
        )
    life_days = life_h / HOURS_PER_DAY
    _payback(results, own.price({**have.cluster.model_dump(mode="json")}), life_days)
    return {"have": str(have_path), "cluster": cluster_label_of(have), "options": results}


def simulated_steps(plan, baseline: str | None) -> int:
    """The one step count the rows are simulated with, as `plan` picks it: the baseline's, else the
    count for every optimizer, else the largest given (each row is then timed at its own count)."""
    own = plan.of(baseline, baseline) if baseline else None
    return own or plan.default or max(n for _, n in plan.per)


def cluster_label_of(have) -> str:
    c = have.cluster
    return f"{c.nodes} nodes x {c.gpus_per_node} {c.gpu}, {nic_label(c.nic.model_dump())} per node"


def _option_index(values: dict[str, Any], opts: list[dict[str, Any]]) -> int | None:
    """The option a row was made for: its values less the optimizer and what the layout search added."""
    own = {k: v for k, v in values.items() if k in OPTION_KEYS}
    return next((i for i, opt in enumerate(opts) if opt["values"] == own), None)


def spend(r: dict[str, Any]) -> float:
    """What an option asks to spend, as --budget is held against it everywhere (report/analysis.outlay):
    a rental its instance-hours; an owned option the capital it buys and the run's power."""
    if r["option"] == "rent":
        return r["run_cost"]
    return r["capital"] + r["ttt_h"] * r["power_per_h"]


def _payback(results: list[dict[str, Any]], kept, life_days: float = math.inf) -> None:
    """Hours saved per run against keeping the cluster, and for an option that buys something, its
    payback, defined once:

        saving per run = hours saved x kept.per_hour - the option's hours x the power it adds per hour
        payback runs   = capital / saving per run
        payback days   = payback runs x the option's hours per run / 24

    An hour the owned cluster no longer spends on the run is worth what an hour of it costs (its servers
    and network amortised, and power: kept.per_hour); the option's added running cost is the power it
    draws beyond the kept cluster's, for every hour it runs. The days are days of training at the new
    speed, so days and runs are one number in two units. An option that saves no money per run never
    pays back, nor does one whose run is level with keeping's (within breakeven.LEVEL, 0.5%: inside the
    model's resolution, where a "payback" of thousands of days would only divide by noise:
    ``saves_no_time``); one whose payback takes more days of training than the hardware's amortisation
    life holds (``life_days``: years x hours per year x utilisation) is marked ``payback_beyond_life``:
    the hardware is written off before it has paid for itself."""
    keep = next((r for r in results if r["option"] == "keep"), None)
    for r in results:
        r["saved_h"] = None if keep is None else keep["ttt_h"] - r["ttt_h"]
        r["payback_days"] = r["payback_runs"] = None
        r["never_pays_back"] = False
        r["payback_beyond_life"] = False
        r["saves_no_time"] = False
        if keep is None or r["option"] in ("keep", "rent") or r["capital"] <= 0:
            continue
        r["saves_no_time"] = r["saved_h"] <= LEVEL * keep["ttt_h"]
        if r["saves_no_time"]:  # a payback of a saving inside the model's resolution is no payback
            r["never_pays_back"] = True
            continue
        added_per_h = r["power_per_h"] - keep["power_per_h"]  # per hour of the option running
        saving_per_run = r["saved_h"] * kept.per_hour - r["ttt_h"] * added_per_h
        if saving_per_run <= 0:
            r["never_pays_back"] = True  # it saves no money per run (slower, or its power costs more)
            continue
        r["payback_runs"] = r["capital"] / saving_per_run
        r["payback_days"] = r["payback_runs"] * r["ttt_h"] / HOURS_PER_DAY
        r["payback_beyond_life"] = r["payback_days"] > life_days


def plan_have(
    model: str,
    steps,
    have_path: Path,
    candidates: Path | None,
    global_batch: int | None,
    own: Own,
    rent: Rent,
    samples: int = 32,  # uncertainty.DEFAULT_SAMPLES
    progress: Callable[[int, int], None] | None = None,
    deadline_h: float | None = None,
    budget: float | None = None,
    tokens: int | None = None,
    baseline: str | None = None,
) -> dict[str, Any]:
    """`plan --have`: the options for the owned cluster training ``model`` for ``steps`` (per optimizer
    where given so, each optimizer timed at its own count, as `plan` times it; one not named takes
    ``baseline``'s, by default the candidates' optimizer) at the candidates' global batch, with every
    candidate optimizer. ``tokens`` instead of ``steps``: the steps that train that many tokens, as
    `plan` counts them."""
    from clustersim import catalog
    from clustersim.planner.planning import _recipe, _steps_for_tokens, candidate_sweep
    from clustersim.planner.planning import tokens_note as note_for_tokens

    sweep = candidate_sweep(candidates)
    tokens_note = None
    if tokens is not None:
        steps, seq = _steps_for_tokens(sweep, model, tokens, steps, global_batch)
    recipe = _recipe(sweep, steps, global_batch)
    if tokens is not None:
        tokens_note = note_for_tokens(tokens, steps, recipe["global_batch"], seq)
    try:
        catalog.model(model)
    except InputError as exc:
        raise InputError(exc.message, key="--model") from None
    base = sweep.base.with_changes(**{"workload.model": model, "workload.seq_len": None})
    optimizers = list(dict.fromkeys(r["optimizer"] for r in sweep.rows() if r.get("optimizer")))
    optimizers = optimizers or [base.training.optimizer]
    unread = [a for a in sweep.axes if a != "optimizer"]
    if candidates is not None and unread:  # a candidates file's cluster grid: said, not silently unused
        recipe["notes"] = [
            *recipe["notes"],
            f"--candidates: with --have, its optimizers, steps, global batch and base recipe are read; its "
            f"{', '.join(unread)} axes are not (the options are the cluster you have: kept, upgraded or "
            "grown)",
        ]
    plan = recipe["steps"]
    if baseline is not None:
        from clustersim.planner.compare import choose_baseline

        choose_baseline(baseline, baseline)  # a clear error for an unknown one, as `plan` gives
    baseline = baseline or base.training.optimizer
    n = simulated_steps(plan, baseline)
    with sweep.catalogs_in_use():
        out = evaluate(
            have_path, base, optimizers, plan, recipe["global_batch"], own, rent, samples, progress, baseline
        )
    for r in out["options"]:
        r["meets"] = (deadline_h is None or r["ttt_h"] <= deadline_h) and (
            budget is None or spend(r) <= budget
        )
    for r in out["options"]:
        r["spent_on_run"] = spent_on_run(r)
    chosen = recommended(out["options"])
    return {
        **out,
        "recommended": chosen,
        "recommendation": recommendation_text(chosen, out["options"], budget is not None),
        "recommendation_notes": recommendation_notes(chosen, out["options"], deadline_h),
        "model": model,
        "steps": n,
        "steps_per_optimizer": dict(plan.per),
        "baseline": baseline,
        "global_batch": recipe["global_batch"],
        "optimizers": optimizers,
        "recipe_notes": recipe["notes"],
        "tokens_note": tokens_note,
        "cost_basis": own.describe(),
    }


def spent_on_run(r: dict[str, Any]) -> float:
    """What an option spends on this run: its capital (what it buys now) plus the run (owned: amortised
    capital and power; rented: the instance-hours) less the run's amortised share of that same capital
    (``capital_share``), which the capital already counts whole."""
    return r["capital"] + r["run_cost"] - r.get("capital_share", 0.0)


def recommended(options: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The option for this run: of those that meet the deadline and budget, the one that spends least
    on it (spent_on_run); on a tie the earlier, keeping before buying before renting. What an upgrade
    saves over many runs is its payback, beside it in the table."""
    meets = [r for r in options if r.get("meets", True)]
    return min(meets, key=spent_on_run) if meets else None


def recommendation_notes(
    chosen: dict[str, Any] | None, options: list[dict[str, Any]], deadline_h: float | None
) -> list[str]:
    """The lines `plan` says under its choice, said of the recommended option (report/analysis's
    builders, the same words): what its optimizer gains over the baseline on the same cluster, that
    convergence is not modelled where it changes the optimizer, the risk where its P90 misses the
    deadline; and, plainly, where what it buys never pays back or pays back past its life."""
    from clustersim.report.analysis import convergence_caveat, over_baseline_line, risk_line

    if chosen is None:
        return []
    meets = [r for r in options if r.get("meets", True)]
    lines = [
        over_baseline_line(chosen, cost="run_cost"),
        convergence_caveat(options, chosen),
        risk_line(
            chosen, meets, deadline_h, named=lambda r: f"{r['option']}, {r['what']}", cost="spent_on_run"
        ),
    ]
    if chosen.get("never_pays_back"):
        lines.append(
            f"Its ${chosen['capital']:,.0f} never pays back: it saves no money per run (what an owned "
            "cluster-hour costs, less the power it adds); it buys this run's speed, not savings."
        )
    elif chosen.get("payback_beyond_life"):
        lines.append(
            f"Its ${chosen['capital']:,.0f} pays back only after {chosen['payback_days']:,.1f} days of "
            f"training ({chosen['payback_runs']:,.1f} runs like this one), past the hardware's amortisation "
            "life: it is written off before it pays for itself; it buys this run's speed, not savings."
        )
    return [line for line in lines if line]


def recommendation_text(
    chosen: dict[str, Any] | None, options: list[dict[str, Any]], budget_given: bool = True
) -> str:
    """The one line under `plan --have`'s table, as `plan` says its choice: ``Recommended: ...``, or,
    where no option meets the deadline (and the budget, where one was given), the fastest."""
    limits = "the deadline and budget" if budget_given else "the deadline"

    def said(r: dict[str, Any]) -> str:
        band = f" (P10–P90 {r['ttt_p10_h']:,.1f}–{r['ttt_p90_h']:,.1f} h)" if r.get("ttt_p10_h") else ""
        return (
            f"{r['option']}, {r['what']}: {r['optimizer']}, {r.get('layout') or 'DP'}, "
            f"{r['ttt_h']:,.1f} h to train{band}"
        )

    if chosen is None:
        if not options:
            return "No option could train the model."
        fastest = min(options, key=lambda r: r["ttt_h"])
        return f"No option meets {limits}; the fastest is {said(fastest)}."
    run = chosen["run_cost"] - chosen.get("capital_share", 0.0)
    beyond = " beyond that capital's amortised share" if chosen.get("capital_share") else ""
    return (
        f"Recommended: {said(chosen)}, capital ${chosen['capital']:,.0f} + run ${run:,.0f}{beyond}: "
        f"the least spent on this run of the options that meet {limits}."
    )
