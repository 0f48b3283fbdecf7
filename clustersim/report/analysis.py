"""Numbers behind the report and `plan`: cost, time-to-train, speedups, Pareto frontier, advice.

All functions take the typed rows of a results folder (sweeps/store.py:read_results).
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Callable

from clustersim.errors import InputError
from clustersim.report import costing
from clustersim.report.prices import default_prices, price_of

__all__ = ["default_prices", "price_of"]  # kept importable from here

DEFAULT_STEPS = 100_000
EQUIVALENT_GAIN = 0.03
"""A cheaper option that is more complex (a compressed optimizer instead of Adam/SGD-momentum, offload
instead of none) must save more than this fraction of the cost, or fall outside the simpler option's
P10-P90 band, to be recommended; otherwise the two are called equivalent and the simpler one is kept.
3% is below the simulator's typical prediction error (README 'How sure'), so a smaller gain is noise."""
SOONER_FOR_THE_SAME = 0.25
"""An option within EQUIVALENT_GAIN of the recommended one's cost that trains in at least this fraction
less time is named beside it: the cheapest choice can be twice as slow as one that costs 1% more (more
GPUs finish sooner at about the same GPU-hours), and a planner would take the sooner one."""


@lru_cache(maxsize=16)
def _is_baseline(optimizer: str) -> bool:
    """A full-precision optimizer the others are measured against (its strategy names no baseline)."""
    from clustersim.simulator.strategies import registry

    return registry.get(optimizer).baseline is None


_KIND_NAMES = {"ethernet_tcp": "Ethernet", "infiniband": "InfiniBand"}


def network_label(row: dict[str, Any]) -> str:
    """The NICs of a node: kind and rate per NIC, and how many where more than one (8 x 400 Gb/s
    InfiniBand is not 1 x 400 Gb/s)."""
    rate = row.get("nic_effective_gbps") or row.get("nic_gbps")
    kind = _KIND_NAMES.get(row.get("nic_kind"), row.get("nic_kind"))
    count = row.get("nic_count") or 1
    if not rate:
        return str(kind)
    return f"{kind} {int(count)} x {rate:g} Gb/s" if count > 1 else f"{kind} {rate:g} Gb/s"


def cluster_label(row: dict[str, Any], network: str | None = None) -> str:
    """``network``: the network's own name where it has one (a rented instance's, as its provider sells
    it: AWS's EFA is simulated as an RDMA fabric, the InfiniBand kind, but sold as EFA)."""
    layout = row.get("layout")  # plan rows: the parallel layout, when it is not plain data parallelism
    return f"{row['world_size']} x {row['gpu']}, {network or network_label(row)}" + (
        f", {layout}" if layout and layout != "DP" else ""
    )


# Row fields that a sweep may vary beyond GPU count, GPU and network, as a cluster label shows them.
_DISTINGUISHING = (
    ("training.network", "{} network backend"),  # a sweep over the analytical and flow backends
    ("gpus_per_node", "{} GPUs/node"),
    ("micro_batch_used", "micro-batch {}"),
    ("model", "{}"),
)


def _disambiguate(rows: list[dict[str, Any]]) -> None:
    """Rows of one optimizer with the same label (e.g. a sweep over micro-batches) get what tells them
    apart appended, so a plan's runners-up and a report's points never read as duplicates."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["optimizer"], r["cluster"]), []).append(r)
    for same in groups.values():
        if len(same) < 2:
            continue
        fields = [(k, fmt) for k, fmt in _DISTINGUISHING if len({str(r.get(k)) for r in same}) > 1]
        for r in same:
            r["cluster"] += "".join(f", {fmt.format(r.get(k))}" for k, fmt in fields)


def rate_of(row: dict[str, Any]) -> float:
    """A row's per-NIC rate as its network label shows it (effective when measured, else line rate)."""
    return float(row.get("nic_effective_gbps") or row.get("nic_gbps") or 0.0)


def network_order(row: dict[str, Any]) -> tuple:
    """Networks in numeric order (25 before 100), not as strings ("100" before "25")."""
    return (str(row.get("nic_kind")), rate_of(row))


def pick_baseline(rows: list[dict[str, Any]], preferred: str | None) -> str | None:
    """The optimizer speedups are measured against: ``preferred`` (--baseline, or the sweep's base
    optimizer; for a compressed one, the optimizer it replaces) when it is in the rows, else the first
    uncompressed optimizer there."""
    from clustersim.planner.compare import choose_baseline

    present = {r["optimizer"] for r in rows}
    if preferred is not None:
        preferred = choose_baseline(preferred)  # a compressed base optimizer: the one it replaces
        if preferred in present:
            return preferred
    return next((o for o in sorted(present) if _is_baseline(o)), None)


def _cluster_of(row: dict[str, Any], scenarios: dict[str, Any]) -> dict[str, Any]:
    """A row's cluster section: its scenario's when known, else what the results columns say; with the
    row's GPU and GPUs per node, which a cost model prices."""
    scenario = row.get("scenario") or scenarios.get(row.get("row_id")) or {}
    cluster = (
        dict(scenario["cluster"])
        if "cluster" in scenario
        else {
            "nodes": row["nodes"],
            "nic": {
                "kind": row.get("nic_kind"),
                "line_rate_gbps": row.get("nic_gbps"),
                "count": row.get("nic_count") or 1,
            },
        }
    )
    cluster.setdefault("gpu", row["gpu"])
    cluster.setdefault("gpus_per_node", max(1, row["world_size"] // max(1, row["nodes"])))
    return cluster


def enrich(
    rows: list[dict[str, Any]],
    steps: Any,
    price: float | None,
    warmup: float | None = None,
    baseline: str | None = None,
    network: Any = "default",
    scenarios: dict[str, Any] | None = None,
    costs: Any = None,
) -> list[dict[str, Any]]:
    """Keep simulated rows; add time-to-train (h), cost ($, by one cost model: report/costing.py) with its
    P10-P90 and what priced it, and speedup over the baseline optimizer on the same cluster.

    ``steps``: an int, a ``compare.StepsPlan`` (steps per optimizer) or None (the row's, else
    DEFAULT_STEPS). ``warmup`` is 1-bit Adam's warmup fraction (the sweep's, else the default).
    ``baseline``: see ``pick_baseline``. ``costs``: a cost model (costing.cost_model); by default
    costing.auto_model: the owned model with ``network`` ("default", the shipped network price catalog,
    a path to a copy, or None for servers and power only) where it prices every GPU, or rented at
    ``price`` per GPU-hour when given.
    Cost keys: ``cost`` (USD), ``cost_p10``/``cost_p90``, ``cost_model`` ("own" or "rent"), ``cost_basis``
    (what priced it), ``capital`` (own: servers and network bought), ``network_cost`` (own: the network's
    amortised share; rent: 0, it comes with the instance), ``gpu_cost`` (the rest), ``cost_warning``."""
    from clustersim.planner.compare import StepsPlan, mean_step_time

    ok = [dict(r) for r in rows if r.get("status") == "ok"]
    if not ok:
        raise InputError("no successfully simulated rows to report on")
    plan = StepsPlan.parse(steps)
    base_name = pick_baseline(ok, baseline)
    model = costs if costs is not None else costing.auto_model({r["gpu"] for r in ok}, price, network)
    scenarios = scenarios or {}
    for r in ok:
        n = (plan and plan.of(r["optimizer"], base_name)) or r.get("steps") or DEFAULT_STEPS
        per_step = mean_step_time(
            r["optimizer"], r["iteration_time_s"], r.get("warmup_iteration_time_s"), warmup
        )
        r["steps"] = n
        r["ttt_h"] = n * per_step / 3600
        priced = model.price(_cluster_of(r, scenarios))
        r["cost"] = r["ttt_h"] * priced.per_hour
        r["network_cost"] = r["ttt_h"] * priced.parts.get("network", 0.0)
        r["gpu_cost"] = r["cost"] - r["network_cost"]
        r["cost_model"], r["cost_basis"] = priced.model, priced.describe(r["ttt_h"])
        r["capital"], r["cost_warning"], r["cost_sigma"] = priced.capital, priced.warning, priced.sigma
        # what the run asks to spend: an owner buys the cluster and pays the run's power; a renter the hours
        r["outlay"] = (
            priced.capital + r["ttt_h"] * priced.parts["power"] if priced.model == "own" else r["cost"]
        )
        lo, hi = r.get("iteration_time_p10_s"), r.get("iteration_time_p90_s")
        if isinstance(lo, float) and isinstance(hi, float) and r["iteration_time_s"] > 0:
            # The band scales the run's mean step as it scales the iteration (sweeps/run.py).
            r["ttt_p10_h"] = r["ttt_h"] * lo / r["iteration_time_s"]
            r["ttt_p90_h"] = r["ttt_h"] * hi / r["iteration_time_s"]
        set_cost_band(r)
        sold = priced.extra.get("network")  # a rented instance's network, as its provider names it
        r["network"] = sold or network_label(r)
        r["cluster"] = cluster_label(r, r["network"])
        if priced.extra.get("instance"):  # a rented row names what it rents
            r["instance"] = priced.extra["instance"]
            r["cluster"] += f" on {r['instance']}"
    for model in {r.get("model") for r in ok}:  # a report section is one model: no "..., BERT-Large"
        _disambiguate([r for r in ok if r.get("model") == model])
    base = {_same_cluster(r): r for r in ok if r["optimizer"] == base_name}
    for r in ok:
        b = base.get(_same_cluster(r))
        r["speedup"] = b["ttt_h"] / r["ttt_h"] if b else None
        r["baseline"] = b
    return ok


def set_cost_band(r: dict[str, Any]) -> None:
    """A row's cost P10-P90: its price's uncertainty and its time-to-train band (costing.cost_band)."""
    if "cost" not in r:  # a row not priced (yet)
        return
    mid = r["ttt_h"]
    lo = r["ttt_p10_h"] / mid if mid and "ttt_p10_h" in r else None
    hi = r["ttt_p90_h"] / mid if mid and "ttt_p90_h" in r else None
    r["cost_p10"], r["cost_p90"] = costing.cost_band(r["cost"], r["cost_sigma"], lo, hi)


def _same_cluster(r: dict[str, Any]) -> tuple:
    return (
        r["world_size"],
        r["gpu"],
        r["network"],
        r.get("model"),
        r.get("micro_batch"),
        r.get("gpus_per_node"),
        r.get("layout"),  # plan rows: a baseline is compared within its own parallel layout
        r.get("training.network"),
    )


def add_paired_bands(
    rows: list[dict[str, Any]],
    scenarios: dict[str, Any],
    samples: int,
    steps: Any = None,
    warmup: float | None = None,
    only: list[dict[str, Any]] | None = None,
) -> None:
    """Each row's P10-P90 time-to-train speedup over its baseline, as ``compare`` computes it: both
    simulated under the same parameter draws (compare.paired_band), never the ratio of two separately
    drawn bands (which called a real 1.18x "indistinguishable"). ``only``: just these rows."""
    from clustersim.planner.compare import StepsPlan, paired_band
    from clustersim.scenario import validate_scenario

    if samples <= 0:
        return
    for r in only if only is not None else rows:
        b = r.get("baseline")
        if b is None or b is r:
            continue
        mine = r.get("scenario") or scenarios.get(r.get("row_id"))
        theirs = b.get("scenario") or scenarios.get(b.get("row_id"))
        if mine is None or theirs is None:
            continue
        plan = StepsPlan(per=((r["optimizer"], r["steps"]), (b["optimizer"], b["steps"])))
        band = paired_band(
            validate_scenario(theirs, source="baseline row"),
            validate_scenario(mine, source="row"),
            None,
            samples,
            plan,
            warmup,
        )
        r["speedup_p10"], r["speedup_p90"] = band["ttt_speedup"]


def indistinguishable(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two rows cannot be told apart: the paired speedup band of one over the other (its
    baseline) contains 1, or, without one, their time-to-train P10-P90 bands overlap (False with no bands)."""
    for x, y in ((a, b), (b, a)):
        if x.get("baseline") is y and x is not y and "speedup_p10" in x:
            return x["speedup_p10"] <= 1.0 <= x["speedup_p90"]
    if "ttt_p10_h" not in a or "ttt_p10_h" not in b:
        return False
    return a["ttt_p10_h"] <= b["ttt_p90_h"] and b["ttt_p10_h"] <= a["ttt_p90_h"]


def complexity(row: dict[str, Any]) -> tuple[int, int, int]:
    """How much a row asks of the user, to compare: (offloads, layout, compressed optimizer); (0, 0, 0) is
    plainest. Layout: data parallelism 0, ZeRO/FSDP sharding 1 (a config switch), tensor/pipeline
    parallelism 2 (a model written for it), its interleaved schedule 3 (v times the pipeline messages,
    more activations in flight, micro-batches tied to the stage count). Optimizer: any other than the
    baseline the team runs (SGD-momentum for an Adam team is a change too)."""
    offload = str(row.get("offload") or "none").lower() not in ("none", "off", "false")
    layout = str(row.get("layout") or "DP")
    level = 0 if layout == "DP" else 1 if not layout.startswith("TP") else 3 if "interleaved" in layout else 2
    b = row.get("baseline")
    changed = b["optimizer"] != row["optimizer"] if b is not None else not _is_baseline(row["optimizer"])
    return (int(offload), level, int(changed))


def equivalent(simpler: dict[str, Any], cheaper: dict[str, Any], gain: float = EQUIVALENT_GAIN) -> bool:
    """Whether ``cheaper`` saves less than ``gain`` of ``simpler``'s cost, is not also faster by more
    than ``gain`` (a cheaper option that trains sooner too is better, not equivalent, however small
    the saving) and, when both have P10-P90 bands, those bands overlap (with no bands the thresholds
    alone decide)."""
    if cheaper["cost"] < simpler["cost"] * (1 - gain):
        return False
    if cheaper["ttt_h"] < simpler["ttt_h"] * (1 - gain):
        return False
    if "ttt_p10_h" in simpler and "ttt_p10_h" in cheaper:
        return indistinguishable(simpler, cheaper)
    return True


_COMPLEXITY_NAMES = (
    ("offload", ("", "offload")),
    ("layout", ("", "ZeRO sharding", "tensor/pipeline parallel", "interleaved")),
)


def kept_simpler_note(chosen: dict[str, Any], other: dict[str, Any]) -> str | None:
    """Why an option cheaper than the choice is not the choice, as a runners-up table says it: it is
    equivalent under the EQUIVALENT_GAIN rule (equivalent) and more complex (complexity), so the simpler
    choice is kept: ``equivalent (within 3%), more complex: interleaved pipeline``. None otherwise."""
    if other["cost"] >= chosen["cost"] or not complexity(other) > complexity(chosen):
        return None
    if not equivalent(chosen, other):
        return None
    mine, theirs = complexity(chosen), complexity(other)
    what = [names[t] for (_, names), c, t in zip(_COMPLEXITY_NAMES, mine, theirs) if t > c]
    if theirs[2] > mine[2]:
        what.append(other["optimizer"])
    return f"equivalent (within {100 * EQUIVALENT_GAIN:.0f}%), more complex: {', '.join(what)}"


def kept_simpler_reason(chosen: dict[str, Any], other: dict[str, Any]) -> str | None:
    """kept_simpler_note as a sentence, as plan's runners-up footnote and its JSON both say it:
    ``equivalent (within 3%), more complex: interleaved; the simpler choice is kept``. None otherwise."""
    note = kept_simpler_note(chosen, other)
    return None if note is None else f"{note}; the simpler choice is kept"


def pareto(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows no other row beats on both time-to-train and cost, by increasing time."""
    front, best_cost = [], float("inf")
    for r in sorted(rows, key=lambda r: (r["ttt_h"], r["cost"])):
        if r["cost"] < best_cost:
            front.append(r)
            best_cost = r["cost"]
    return front


def _hours(h: float) -> str:
    """A time to train as people say it: hours, or minutes below a tenth of an hour (not "0.0 h")."""
    return f"{h:,.1f} h" if h >= 0.1 else f"{h * 60:,.1f} min"


def speedup_text(r: dict[str, Any]) -> str:
    """``1.18x (P10–P90 1.14–1.22)``: the speedup over the baseline with its paired band."""
    if r.get("speedup") is None:
        return "—"
    band = f" (P10–P90 {r['speedup_p10']:.2f}–{r['speedup_p90']:.2f})" if "speedup_p10" in r else ""
    return f"{r['speedup']:.2f}x{band}"


def convergence_caveat(rows: list[dict[str, Any]], chosen: dict[str, Any]) -> str | None:
    """The line any recommendation that changes the optimizer carries: which steps it assumed."""
    b = chosen.get("baseline")
    if b is None or b["optimizer"] == chosen["optimizer"]:
        return None
    same = chosen["steps"] == b["steps"]
    return (
        f"Convergence is not modelled: {chosen['optimizer']} is assumed to reach {b['optimizer']}'s loss "
        f"in {'the same' if same else 'the given'} {chosen['steps']:,} steps ({b['optimizer']}: "
        f"{b['steps']:,}); check that on your model, and give --steps {b['optimizer']}=N,"
        f"{chosen['optimizer']}=M if it needs more."
    )


def recommendation(
    rows: list[dict[str, Any]],
    deadline_h: float | None = None,
    budget: float | None = None,
    scenarios: dict[str, Any] | None = None,
    warmup: float | None = None,
) -> dict:
    """The cheapest row meeting the constraints, the fastest row, and where compression stops paying:
    the most important lines first (the choice, its speedup, the convergence caveat), then one line per
    compressed optimizer, every one the rows hold (none is cut to keep the list short). Rows that train
    different global batches are not ranked against each other (mixed_batches): the same steps are not
    the same training there. ``fastest`` is the fastest row of all; the text's "Fastest" line names the
    fastest that meets the constraints (and, in a clause, a faster one outside them)."""
    mixed = mixed_batches(rows)
    if mixed is not None:
        fastest = min(rows, key=lambda r: r["ttt_h"])
        lines = [mixed] + optimizer_lines(rows, scenarios=scenarios, warmup=warmup)
        return {"chosen": None, "fastest": fastest, "feasible": [], "text": lines, "mixed": True}
    feasible = [
        r
        for r in rows
        if (deadline_h is None or r["ttt_h"] <= deadline_h) and (budget is None or outlay(r) <= budget)
    ]
    rentable = rentable_as_simulated(feasible)
    set_aside = len(feasible) - len(rentable)
    feasible = rentable
    cheapest = min(feasible, key=lambda r: (r["cost"], r["ttt_h"])) if feasible else None
    chosen = cheapest
    if cheapest is not None:
        simpler = [r for r in feasible if complexity(r) < complexity(cheapest) and equivalent(r, cheapest)]
        if simpler:
            chosen = min(simpler, key=lambda r: (complexity(r), r["cost"], r["ttt_h"]))
    fastest = min(rows, key=lambda r: r["ttt_h"])
    rec = {"chosen": chosen, "cheapest": cheapest, "fastest": fastest, "feasible": feasible}
    rec = retold(rec, rows, deadline_h, budget, scenarios, warmup)
    if set_aside:
        rec["text"].insert(
            1,
            f"{set_aside} rented option(s) that meet the constraints were simulated on a network their "
            "instance is not sold with and are not recommended: no one can rent them as simulated",
        )
    return rec


def rentable_as_simulated(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of rented rows, those simulated on the network their instance is sold with, where any is: a row
    simulated on another network (a p4d's price beside a 25 GbE cluster, costing.Rent's
    ``cost_warning``) is a cluster nobody can rent, so it is not recommended while a rentable row meets
    the constraints. Owned rows, and a set whose every rented row is off its instance's network (a
    what-if of the network alone; each row's cost says so), are kept whole."""
    sold = [r for r in rows if not (r.get("cost_model") == "rent" and r.get("cost_warning"))]
    return sold if sold else rows


def retold(
    rec: dict[str, Any],
    rows: list[dict[str, Any]],
    deadline_h: float | None = None,
    budget: float | None = None,
    scenarios: dict[str, Any] | None = None,
    warmup: float | None = None,
) -> dict[str, Any]:
    """``rec`` (recommendation's) with its text written again from the rows as they are now, the same
    choice: a plan draws the runners-up's bands after choosing, and the risk line reads those bands."""
    chosen, fastest, feasible = rec["chosen"], rec["fastest"], rec["feasible"]
    lines: list[str] = []
    if chosen is None:
        lines.append(_nothing_meets(rows, fastest, deadline_h, budget))
    else:
        lines += _chosen_lines(rows, chosen, rec["cheapest"], deadline_h, feasible)
        lines += _fastest_line(chosen, fastest, feasible, budget)
    lines += optimizer_lines(rows, scenarios=scenarios, warmup=warmup)
    return {**rec, "text": lines}


def _option_text(r: dict[str, Any]) -> str:
    """``adam on 16 x B200, ... (333.2 h, $14,380)``, with an owned cluster's capital: a run's cost is
    its share of the cluster, and two options at the same cost can ask for very different purchases."""
    return f"{r['optimizer']} on {r['cluster']} ({_hours(r['ttt_h'])}, {_money_text(r)})"


def _money_text(r: dict[str, Any]) -> str:
    capital = f", capital ${r['capital']:,.0f}" if r.get("cost_model") == "own" and r.get("capital") else ""
    return f"${r['cost']:,.0f}{capital}"


def fastest_within(feasible: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest of the rows that meet the constraints (the cheaper of equals); None where none does."""
    return min(feasible, key=lambda r: (r["ttt_h"], r["cost"])) if feasible else None


def _fastest_line(chosen, fastest, feasible, budget) -> list[str]:
    """The fastest option that meets the constraints, where it trains sooner than the choice by more
    than EQUIVALENT_GAIN; and, in one clause, the fastest of all where it is faster still but outside
    them. That one can only be over the budget (the fastest of all meets any deadline some option
    meets), so the clause says what it asks to spend: an owned cluster's capital (and the run's power),
    a rented one's rent."""
    quickest = fastest_within(feasible)
    outside = ""
    if fastest is not quickest and fastest["ttt_h"] < quickest["ttt_h"] * (1 - EQUIVALENT_GAIN):
        if fastest.get("cost_model") == "own" and fastest.get("capital") is not None:
            power = outlay(fastest) - fastest["capital"]
            spend = f"capital ${fastest['capital']:,.0f} plus ${power:,.0f} power"
        elif fastest.get("cost_model") == "own":
            spend = f"${outlay(fastest):,.0f} capital and power"
        else:
            spend = f"${outlay(fastest):,.0f} rent"
        over = f" against the ${budget:,.0f} budget" if budget is not None else ""
        outside = (
            f"; faster over budget: {fastest['optimizer']} on {fastest['cluster']} "
            f"({_hours(fastest['ttt_h'])}, {spend}{over})"
        )
    within = "Fastest within the budget" if outside else "Fastest"
    if quickest is not chosen and quickest["ttt_h"] < chosen["ttt_h"] * (1 - EQUIVALENT_GAIN):
        return [f"{within}: {_option_text(quickest)}{outside}."]
    if outside:
        return [f"{within}: the choice{outside}."]
    return []


def mixed_batches(rows: list[dict[str, Any]]) -> str | None:
    """Why no recommendation is drawn when the rows train different global batches (a sweep without
    ``global_batch`` keeps each GPU's micro-batch, so 32 GPUs train twice the samples per step of 16):
    time to train is steps x step time, so equal steps are not equal training and the row with fewer
    samples per step looks cheaper and as fast. None when every row trains the same batch."""
    by_batch: dict[int, set[int]] = {}
    for r in rows:
        if r.get("global_batch") is not None:
            by_batch.setdefault(int(r["global_batch"]), set()).add(int(r["world_size"]))
    if len(by_batch) < 2:
        return None
    where = "; ".join(
        f"{b:,} at {', '.join(str(n) for n in sorted(gpus))} GPUs" for b, gpus in sorted(by_batch.items())
    )
    return (
        f"No recommendation across these rows: they train different global batches (samples per step: "
        f"{where}), so the same number of steps is not the same training and their times and costs do not "
        f"compare. Set `global_batch` in the sweep file (e.g. global_batch: {min(by_batch):,}) so that every "
        "row trains the same samples per step; the speedups below compare optimizers on the same GPUs and "
        "batch."
    )


def outlay(r: dict[str, Any]) -> float:
    """What a budget caps: an owned cluster's capital and the run's power (an owner buys the cluster),
    a rented one's instance-hours."""
    return r.get("outlay", r["cost"])


def _nothing_meets(rows, fastest, deadline_h, budget) -> str:
    """Why nothing qualifies: the constraint no configuration meets, or, where each is met by some
    configuration, that none meets both."""
    cheapest = min(rows, key=outlay)
    late = deadline_h is not None and fastest["ttt_h"] > deadline_h
    dear = budget is not None and outlay(cheapest) > budget
    why = []
    if (late or not dear) and deadline_h is not None:
        why.append(
            f"the fastest option needs {_hours(fastest['ttt_h'])} against a {deadline_h:,.1f} h deadline"
        )
    if (dear or not late) and budget is not None:
        spend = "capital and power" if cheapest.get("cost_model") == "own" else "rent"
        why.append(f"the cheapest needs ${outlay(cheapest):,.0f} ({spend}) against a ${budget:,.0f} budget")
    if not late and not dear:
        return "No configuration meets both constraints at once: " + "; ".join(why) + "."
    return "No configuration meets the constraints: " + "; ".join(why) + "."


def _sooner_line(chosen, feasible) -> list[str]:
    """The fastest option meeting the constraints within EQUIVALENT_GAIN of the choice's cost, where it
    saves at least SOONER_FOR_THE_SAME of the time; owned, with both capitals (the same run cost can be
    twice the cluster bought: the run pays a share of it)."""
    close = [
        r
        for r in feasible
        if r["cost"] <= chosen["cost"] * (1 + EQUIVALENT_GAIN)
        and r["ttt_h"] <= chosen["ttt_h"] * (1 - SOONER_FOR_THE_SAME)
    ]
    if not close:
        return []
    alt = min(close, key=lambda r: (r["ttt_h"], r["cost"]))
    more = alt["cost"] / chosen["cost"] - 1
    price = f"{100 * more:.1f}% more" if more > 0 else f"{100 * -more:.1f}% less"
    capital = ""
    if alt.get("cost_model") == "own" and chosen.get("cost_model") == "own":
        capital = f"; capital ${alt['capital']:,.0f} against the choice's ${chosen['capital']:,.0f}"
    return [
        f"Sooner for about the same cost: {alt['optimizer']} on {alt['cluster']}, {_hours(alt['ttt_h'])} "
        f"({chosen['ttt_h'] / alt['ttt_h']:.1f}x sooner) for {price} (${alt['cost']:,.0f}{capital})."
    ]


def tie_text(cell: dict[str, Any]) -> str:
    """A per-network cell's optimizer, with the cheaper one it ties with under the EQUIVALENT_GAIN rule:
    ``adam (tie: binsgdm 0.8% cheaper, within 3%)``."""
    best, tie = cell["best"], cell.get("tie_with")
    if tie is None:
        return best["optimizer"]
    what = tie["optimizer"] if tie["optimizer"] != best["optimizer"] else tie["cluster"]
    return (
        f"{best['optimizer']} (tie: {what} {100 * (1 - tie['cost'] / best['cost']):.1f}% cheaper, within "
        f"{100 * EQUIVALENT_GAIN:.0f}%)"
    )


def cost_text(r: dict[str, Any]) -> str:
    """``$1,234 (P10–P90 $1,100–$1,400; owned: ...)``: a row's cost, its band and what priced it."""
    band = f"P10–P90 ${r['cost_p10']:,.0f}–${r['cost_p90']:,.0f}; " if "cost_p10" in r else ""
    warn = f"; {r['cost_warning']}" if r.get("cost_warning") else ""
    return f"${r['cost']:,.0f} ({band}{r.get('cost_basis', '')}{warn})"


def over_baseline_line(chosen: dict[str, Any], cost: str = "cost") -> str | None:
    """``Over adam on the same cluster: 1.18x faster, $X (Y%) cheaper (...)``: what the choice gains
    over its baseline optimizer on its cluster (``chosen["baseline"]``, a row with ``optimizer``,
    ``ttt_h`` and the key ``cost``); None where the choice is its baseline or has none."""
    b = chosen.get("baseline")
    if b is None or b is chosen:
        return None
    same = (
        "; within the model's uncertainty the two are indistinguishable"
        if indistinguishable(chosen, b)
        else ""
    )
    return (
        f"Over {b['optimizer']} on the same cluster: {speedup_text(chosen)} faster, "
        f"${b[cost] - chosen[cost]:,.0f} ({100 * (1 - chosen[cost] / b[cost]):.0f}%) cheaper "
        f"({b['optimizer']}: {_hours(b['ttt_h'])}, ${b[cost]:,.0f}){same}."
    )


def risk_line(
    chosen: dict[str, Any],
    feasible: list[dict[str, Any]],
    deadline_h: float | None,
    named: Callable[[dict[str, Any]], str] = lambda r: f"{r['optimizer']} on {r['cluster']}",
    cost: str = "cost",
) -> str | None:
    """``Risk: its P90 (...) is past the ... deadline; ...``: said where the choice's P90 misses the
    deadline, naming the cheapest (by the key ``cost``) of the rows that meet the constraints whose P90
    is within it (``named``: how a row is named), or why none can be named."""
    if deadline_h is None or chosen.get("ttt_p90_h") is None or chosen["ttt_p90_h"] <= deadline_h:
        return None  # no band (none drawn) says no risk
    # among the options that meet the constraints (one over budget is no way out of the risk)
    safe = [r for r in feasible if r.get("ttt_p90_h") is not None and r["ttt_p90_h"] <= deadline_h]
    if safe:
        alt = min(safe, key=lambda r: (r[cost], r["ttt_h"]))
        avoid = f"{named(alt)} keeps its P90 within it ({_hours(alt['ttt_p90_h'])}, ${alt[cost]:,.0f})"
    else:  # only the rows given a band can say: the plan bands the cheapest few
        banded = sum(r.get("ttt_p90_h") is not None for r in feasible)
        given = f"none of the {banded} options given a band keeps"
        if banded < 2:
            given = "no other has a band that keeps"
        avoid = (
            f"{given} its P90 within it (a band is drawn for the cheapest few; the runners-up show theirs)"
            if banded < len(feasible)
            else "no configuration swept keeps its P90 within it"
        )
    return (
        f"Risk: its P90 ({_hours(chosen['ttt_p90_h'])}) is past the {deadline_h:,.1f} h deadline; "
        f"{avoid}; a calibration of this cluster may narrow the band."
    )


def _chosen_lines(rows, chosen, cheapest, deadline_h, feasible) -> list[str]:
    band = (
        f" (P10–P90 {_hours(chosen['ttt_p10_h'])}–{_hours(chosen['ttt_p90_h'])})"
        if "ttt_p10_h" in chosen
        else ""
    )
    lines = [
        f"Recommended: {chosen['optimizer']} on {chosen['cluster']}: {_hours(chosen['ttt_h'])} to train"
        f"{band}, {cost_text(chosen)}."
    ] + _sooner_line(chosen, feasible)
    over = over_baseline_line(chosen)
    if over:
        lines.append(over)
    caveat = convergence_caveat(rows, chosen)
    if caveat:
        lines.append(caveat)
    risk = risk_line(chosen, feasible, deadline_h)
    if risk:
        lines.append(risk)
    if chosen is not cheapest:
        saving = 1 - cheapest["cost"] / chosen["cost"]
        lines.append(
            f"{cheapest['optimizer']} on {cheapest['cluster']} would cost {100 * saving:.1f}% less "
            f"(${cheapest['cost']:,.0f}); within {100 * EQUIVALENT_GAIN:.0f}% and the model's uncertainty "
            "the two are equivalent, so the simpler one is kept."
        )
    return lines


def optimizer_lines(
    rows: list[dict[str, Any]],
    threshold: float = 1.10,
    scenarios: dict[str, Any] | None = None,
    warmup: float | None = None,
) -> list[str]:
    """One line per compressed optimizer: its speedup range over the baseline, where it drops below
    ``threshold``, and its break-even NIC rate (break_evens), de-duplicated across clusters."""
    out = []
    evens = break_evens(rows, scenarios, warmup)
    for opt in sorted(o for o in {r["optimizer"] for r in rows} if not _is_baseline(o)):
        mine = [r for r in rows if r["optimizer"] == opt and r.get("speedup") is not None]
        if not mine:
            continue
        base = mine[0]["baseline"]["optimizer"]
        lo, hi = min(r["speedup"] for r in mine), max(r["speedup"] for r in mine)
        lost = [r for r in mine if r["speedup"] < threshold]
        text = f"{opt} vs {base}: speedup {lo:.2f}–{hi:.2f}x across the sweep"
        if lost:  # per network, the GPU counts where it is (a cell, not networks x counts)
            by_net: dict[str, set[int]] = {}
            for r in sorted(lost, key=network_order):
                by_net.setdefault(r["network"], set()).add(r["world_size"])
            cells = ", ".join(
                f"{net} ({', '.join(str(n) for n in sorted(g))} GPUs)" for net, g in by_net.items()
            )
            text += f"; under {threshold:.2f}x on {cells}"
        if opt in evens:
            text += f"; {evens[opt]}"
        out.append(text + ".")
    return out


def break_evens(
    rows: list[dict[str, Any]], scenarios: dict[str, Any] | None = None, warmup: float | None = None
) -> dict[str, str]:
    """Where a sweep over NIC line rates crosses speedup 1 (time to train, the whole run), per compressed
    optimizer: the line rate per NIC below which it beats the baseline, given once per optimizer as the
    range over the clusters where it crosses (break_even_crossings)."""
    from clustersim.planner.breakeven import gbps_text, span_text

    out = {}
    for opt, found in break_even_crossings(rows, scenarios, warmup).items():
        exact = [b for b in found if not isinstance(b, tuple)]
        if exact:
            out[opt] = span_text(exact)
            continue
        rates = sorted(c for c, _ in found)
        sizes = sorted({n for _, n in found})
        span = gbps_text(rates[0]) if len(rates) == 1 else f"{gbps_text(rates[0])}–{gbps_text(rates[-1])}"
        where = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
        out[opt] = (
            f"it beats the baseline over the whole run only below about {span} Gb/s line rate per NIC "
            f"(at {where} GPUs)"
        )
    return out


def break_even_crossings(
    rows: list[dict[str, Any]], scenarios: dict[str, Any] | None = None, warmup: float | None = None
) -> dict[str, list]:
    """Per compressed optimizer, each cluster (model, GPU count, GPU, NIC kind) whose swept line rates
    cross speedup 1: the crossing ``compare`` finds (planner.breakeven.BreakEven, bisected with full
    simulations between the two swept rates around it) where the rows' scenarios are known; for rows
    without them (hand-made rows) a (line rate, GPUs) pair interpolated in log(line rate) between those
    two rates."""
    out: dict[str, list] = {}
    for opt, n, (r1, a), (r2, b) in _crossing_brackets(rows):
        found = _exact_break_even(a, (r1, r2), scenarios or {}, warmup)
        if found is None:
            f = math.log(a["speedup"]) / (math.log(a["speedup"]) - math.log(b["speedup"]))
            found = (math.exp(math.log(r1) + f * (math.log(r2) - math.log(r1))), n)
        if isinstance(found, tuple) or found.verdict == "crossing":
            out.setdefault(opt, []).append(found)
    return out


def _crossing_brackets(rows: list[dict[str, Any]]) -> list[tuple]:
    """(optimizer, GPUs, (rate, row), (rate, row)) for each cluster's first two swept line rates
    between which the speedup falls through 1 (break_even_crossings)."""
    from clustersim.planner.breakeven import LEVEL

    groups: dict[tuple, list] = {}
    for r in rows:
        rate = float(r.get("nic_gbps") or 0.0)
        if (
            r.get("speedup") is not None
            and rate
            and not _is_baseline(r["optimizer"])
            and r.get("nodes", 2) > 1
        ):
            key = (r["optimizer"], r.get("model"), r["world_size"], r["gpu"], r.get("nic_kind"))
            groups.setdefault(key, []).append((rate, r))
    out = []
    for (opt, _, n, _, _), pts in groups.items():
        pts.sort(key=lambda x: x[0])
        for (r1, a), (r2, b) in zip(pts, pts[1:]):
            # a crossing between two level speedups (both within LEVEL of 1) is no break-even: the two
            # runs take the same time there, as compare says "level" (planner.breakeven)
            level = abs(a["speedup"] - 1.0) < LEVEL and abs(b["speedup"] - 1.0) < LEVEL
            if r2 > r1 and a["speedup"] >= 1.0 > b["speedup"] and not level:
                out.append((opt, n, (r1, a), (r2, b)))
                break
    return out


def bisect_break_evens(rows: list[dict[str, Any]], starmap, warmup: float | None = None) -> None:
    """Every crossing break_even_crossings will ask for ``rows`` (scenarios in the rows), bisected ahead
    through ``starmap(fn, [args, ...])`` (a pool's: each bisection is its own simulations) into the
    cache it reads, so that choosing does not bisect them one after another."""
    todo = {}
    for _, _, (r1, a), (r2, _) in _crossing_brackets(rows):
        args = _break_even_args(a, (r1, r2), {}, warmup)
        if args is not None and args[0] not in _BREAK_EVENS:
            todo[args[0]] = args[1]
    for key, found in zip(todo, starmap(_bisect, list(todo.values()))):
        _BREAK_EVENS[key] = found


_BREAK_EVENS: dict[str, Any] = {}  # the same crossing asked twice (plan chooses twice) is bisected once


def _break_even_args(row: dict[str, Any], bracket: tuple[float, float], scenarios: dict, warmup):
    """(cache key, break_even's arguments) for a row and its baseline; None without both scenarios."""
    import json

    b = row.get("baseline")
    if b is None:
        return None
    mine = row.get("scenario") or scenarios.get(row.get("row_id"))
    theirs = b.get("scenario") or scenarios.get(b.get("row_id"))
    if mine is None or theirs is None:
        return None
    key = json.dumps([mine, theirs, row["steps"], b["steps"], warmup, bracket], sort_keys=True, default=str)
    return key, (mine, theirs, row["steps"], b["steps"], warmup, bracket)


def _bisect(mine: dict, theirs: dict, steps, baseline_steps, warmup, bracket):
    from clustersim.planner.breakeven import break_even
    from clustersim.scenario import validate_scenario

    return break_even(
        validate_scenario(mine, source="row"),
        validate_scenario(theirs, source="baseline row"),
        None,
        samples=0,
        steps=steps,
        baseline_steps=baseline_steps,
        warmup=warmup,
        bracket=bracket,
    )


def _exact_break_even(row: dict[str, Any], bracket: tuple[float, float], scenarios: dict, warmup):
    """planner.breakeven.break_even for a row and its baseline (their scenarios and steps), between two
    line rates that bracket the crossing; None without both scenarios."""
    args = _break_even_args(row, bracket, scenarios, warmup)
    if args is None:
        return None
    key, call = args
    if key not in _BREAK_EVENS:
        _BREAK_EVENS[key] = _bisect(*call)
    return _BREAK_EVENS[key]


def by_network(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The planner's table: per network and GPU count, the cheapest optimizer (the simpler one when the
    saving is within EQUIVALENT_GAIN and the bands, as ``recommendation``; then ``tie_with`` is the
    cheaper row it ties with), its speedup over the baseline with the paired band, time to train and
    cost (network included); networks in numeric order."""
    cells: dict[tuple, list] = {}
    for r in rows:
        cells.setdefault((network_order(r), r["network"], r["world_size"], r["gpu"]), []).append(r)
    out = []
    for (_, net, n, gpu), group in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][2], kv[0][3])):
        cheapest = best = min(group, key=lambda r: (r["cost"], r["ttt_h"]))
        simpler = [r for r in group if complexity(r) < complexity(best) and equivalent(r, best)]
        if simpler:  # as the recommendation: a saving within the noise does not change the optimizer
            best = min(simpler, key=lambda r: (complexity(r), r["cost"], r["ttt_h"]))
        # a tie kept for the simpler option is shown as a tie: "adam" alone read as the cheapest
        tie = cheapest if cheapest is not best else None
        out.append({"network": net, "world_size": n, "gpu": gpu, "best": best, "tie_with": tie})
    return out
