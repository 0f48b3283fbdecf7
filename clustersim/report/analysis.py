"""Numbers behind the report and `plan`: cost, time-to-train, speedups, Pareto frontier, advice.

All functions take the typed rows of a results folder (sweeps/store.py:read_results).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

from clustersim.errors import InputError
from clustersim.io import load_yaml

DEFAULT_STEPS = 100_000
EQUIVALENT_GAIN = 0.03
"""A cheaper option that is more complex (a compressed optimizer instead of Adam/SGD-momentum, offload
instead of none) must save more than this fraction of the cost, or fall outside the simpler option's
P10-P90 band, to be recommended; otherwise the two are called equivalent and the simpler one is kept.
3% is below the simulator's typical prediction error (README 'How sure'), so a smaller gain is noise."""


@lru_cache(maxsize=1)
def _is_baseline(optimizer: str) -> bool:
    """A full-precision optimizer the others are measured against (its strategy names no baseline)."""
    from clustersim.simulator.strategies import registry

    return registry.get(optimizer).baseline is None


def default_prices() -> dict[str, float]:
    return load_yaml(resources.files("clustersim.catalogs").joinpath("prices.yaml").read_text())


def price_of(gpu: str, price: float | None) -> float:
    if price is not None:
        if price <= 0:
            raise InputError(f"price per GPU-hour must be positive, got {price}", key="--price")
        return price
    from clustersim import catalog

    try:
        own = catalog.gpu(gpu).price_per_gpu_hour  # a user catalog's entry may carry its price
    except InputError:
        own = None
    if own is not None:
        return own
    table = default_prices()
    if gpu not in table:
        raise InputError(
            f"no default price for {gpu}; pass --price, or give its catalog entry price_per_gpu_hour",
            key="--price",
        )
    return table[gpu]


_KIND_NAMES = {"ethernet_tcp": "Ethernet", "infiniband": "InfiniBand"}


def network_label(row: dict[str, Any]) -> str:
    rate = row.get("nic_effective_gbps") or row.get("nic_gbps")
    kind = _KIND_NAMES.get(row.get("nic_kind"), row.get("nic_kind"))
    return f"{kind} {rate:g} Gb/s" if rate else str(kind)


def cluster_label(row: dict[str, Any]) -> str:
    layout = row.get("layout")  # plan rows: the parallel layout, when it is not plain data parallelism
    return f"{row['world_size']} x {row['gpu']}, {network_label(row)}" + (
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


def enrich(
    rows: list[dict[str, Any]], steps: int | None, price: float | None, warmup: float | None = None
) -> list[dict[str, Any]]:
    """Keep simulated rows; add time-to-train (h), cost ($) and speedup over the baseline optimizer.
    ``warmup`` is 1-bit Adam's warmup fraction (the sweep's, else the default)."""
    from clustersim.compare import mean_step_time

    ok = [dict(r) for r in rows if r.get("status") == "ok"]
    if not ok:
        raise InputError("no successfully simulated rows to report on")
    for r in ok:
        n = steps or r.get("steps") or DEFAULT_STEPS
        per_step = mean_step_time(
            r["optimizer"], r["iteration_time_s"], r.get("warmup_iteration_time_s"), warmup
        )
        r["steps"] = n
        r["ttt_h"] = n * per_step / 3600
        r["cost"] = r["ttt_h"] * r["world_size"] * price_of(r["gpu"], price)
        lo, hi = r.get("iteration_time_p10_s"), r.get("iteration_time_p90_s")
        if isinstance(lo, float) and isinstance(hi, float) and r["iteration_time_s"] > 0:
            # The band scales the run's mean step as it scales the iteration (sweeps/run.py).
            r["ttt_p10_h"] = r["ttt_h"] * lo / r["iteration_time_s"]
            r["ttt_p90_h"] = r["ttt_h"] * hi / r["iteration_time_s"]
        r["network"] = network_label(r)
        r["cluster"] = cluster_label(r)
    _disambiguate(ok)

    def key(r):
        return (
            r["world_size"],
            r["gpu"],
            r["network"],
            r.get("model"),
            r.get("micro_batch"),
            r.get("gpus_per_node"),
            r.get("layout"),  # plan rows: a baseline is compared within its own parallel layout
        )

    base = {key(r): r for r in ok if _is_baseline(r["optimizer"])}
    for r in ok:
        b = base.get(key(r))
        r["speedup"] = b["ttt_h"] / r["ttt_h"] if b else None
        r["baseline"] = b
        if b and "ttt_p10_h" in r and "ttt_p10_h" in b:
            # Unpaired: the ratio of the two bands' ends, so wider than compare's paired band.
            r["speedup_p10"], r["speedup_p90"] = (
                b["ttt_p10_h"] / r["ttt_p90_h"],
                b["ttt_p90_h"] / r["ttt_p10_h"],
            )
    return ok


def indistinguishable(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two rows' time-to-train P10-P90 bands overlap (False when either has no band)."""
    if "ttt_p10_h" not in a or "ttt_p10_h" not in b:
        return False
    return a["ttt_p10_h"] <= b["ttt_p90_h"] and b["ttt_p10_h"] <= a["ttt_p90_h"]


def complexity(row: dict[str, Any]) -> tuple[int, int, int]:
    """How much a row asks of the user, to compare: (offloads, layout, compressed optimizer); (0, 0, 0) is
    plainest. Layout: data parallelism 0, ZeRO/FSDP sharding 1 (a config switch), tensor/pipeline
    parallelism 2 (a model written for it), its interleaved schedule 3 (v times the pipeline messages,
    more activations in flight, micro-batches tied to the stage count)."""
    offload = str(row.get("offload") or "none").lower() not in ("none", "off", "false")
    layout = str(row.get("layout") or "DP")
    level = 0 if layout == "DP" else 1 if not layout.startswith("TP") else 3 if "interleaved" in layout else 2
    return (int(offload), level, int(not _is_baseline(row["optimizer"])))


def equivalent(simpler: dict[str, Any], cheaper: dict[str, Any], gain: float = EQUIVALENT_GAIN) -> bool:
    """Whether ``cheaper`` saves less than ``gain`` of ``simpler``'s cost and, when both have P10-P90
    bands, those bands overlap (with no bands the threshold alone decides)."""
    if cheaper["cost"] < simpler["cost"] * (1 - gain):
        return False
    if "ttt_p10_h" in simpler and "ttt_p10_h" in cheaper:
        return indistinguishable(simpler, cheaper)
    return True


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


def recommendation(
    rows: list[dict[str, Any]], deadline_h: float | None = None, budget: float | None = None
) -> dict:
    """The cheapest row meeting the constraints, the fastest row, and where compression stops paying."""
    feasible = [
        r
        for r in rows
        if (deadline_h is None or r["ttt_h"] <= deadline_h) and (budget is None or r["cost"] <= budget)
    ]
    cheapest = min(feasible, key=lambda r: (r["cost"], r["ttt_h"])) if feasible else None
    chosen = cheapest
    if cheapest is not None:
        simpler = [r for r in feasible if complexity(r) < complexity(cheapest) and equivalent(r, cheapest)]
        if simpler:
            chosen = min(simpler, key=lambda r: (complexity(r), r["cost"], r["ttt_h"]))
    fastest = min(rows, key=lambda r: r["ttt_h"])
    lines: list[str] = []
    if chosen is None:
        why = []
        if deadline_h is not None:
            why.append(
                f"the fastest option needs {_hours(fastest['ttt_h'])} against a {deadline_h:,.1f} h deadline"
            )
        if budget is not None:
            cheapest = min(rows, key=lambda r: r["cost"])
            why.append(f"the cheapest costs ${cheapest['cost']:,.0f} against a ${budget:,.0f} budget")
        lines.append("No configuration meets the constraints: " + "; ".join(why) + ".")
    else:
        band = (
            f" (P10–P90 {_hours(chosen['ttt_p10_h'])}–{_hours(chosen['ttt_p90_h'])})"
            if "ttt_p10_h" in chosen
            else ""
        )
        lines.append(
            f"Recommended: {chosen['optimizer']} on {chosen['cluster']}: {_hours(chosen['ttt_h'])} to train"
            f"{band}, ${chosen['cost']:,.0f}."
        )
        if deadline_h is not None and chosen.get("ttt_p90_h", 0.0) > deadline_h:
            lines.append(
                f"Risk: its P90 ({_hours(chosen['ttt_p90_h'])}) is past the {deadline_h:,.1f} h deadline; "
                "a faster runner-up avoids that risk; a calibration of this cluster may narrow the band."
            )
        if chosen is not cheapest:
            saving = 1 - cheapest["cost"] / chosen["cost"]
            lines.append(
                f"{cheapest['optimizer']} on {cheapest['cluster']} would cost {100 * saving:.1f}% less "
                f"(${cheapest['cost']:,.0f}); below the {100 * EQUIVALENT_GAIN:.0f}% threshold and within "
                "the model's uncertainty the options are equivalent, so the simpler one is kept."
            )
        b = chosen.get("baseline")
        if b is not None and b is not chosen:
            lines.append(
                f"On the same cluster it is {b['ttt_h'] / chosen['ttt_h']:.2f}x faster and "
                f"${b['cost'] - chosen['cost']:,.0f} ({100 * (1 - chosen['cost'] / b['cost']):.0f}%) "
                "cheaper than "
                f"{b['optimizer']} ({_hours(b['ttt_h'])}, ${b['cost']:,.0f})"
                + (
                    "; within the model's uncertainty the two are indistinguishable (their P10–P90 bands "
                    "overlap)."
                    if indistinguishable(chosen, b)
                    else "."
                )
            )
    if fastest is not chosen:
        lines.append(
            f"Fastest overall: {fastest['optimizer']} on {fastest['cluster']} ({_hours(fastest['ttt_h'])}, "
            f"${fastest['cost']:,.0f})."
        )
    lines += advantage_limits(rows)
    lines += break_even_lines(rows)
    return {"chosen": chosen, "fastest": fastest, "feasible": feasible, "text": lines}


def break_even_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Where a sweep over NIC rates crosses speedup 1: the bandwidth below which each compressed optimizer
    beats its baseline on that cluster, interpolated in log(bandwidth) between the two swept rates
    around the crossing (`clustersim compare` bisects it with full simulations instead)."""
    import math

    groups: dict[tuple, list] = {}
    for r in rows:
        rate = r.get("nic_effective_gbps") or r.get("nic_gbps")
        if (
            r.get("speedup") is not None
            and rate
            and not _is_baseline(r["optimizer"])
            and r.get("nodes", 2) > 1
        ):
            groups.setdefault((r["optimizer"], r["world_size"], r["gpu"], r.get("nic_kind")), []).append(
                (rate, r)
            )
    lines = []
    for (opt, n, gpu, kind), pts in sorted(groups.items()):
        pts.sort(key=lambda x: x[0])
        for (r1, a), (r2, b) in zip(pts, pts[1:]):
            if a["speedup"] >= 1.0 > b["speedup"]:
                f = math.log(a["speedup"]) / (math.log(a["speedup"]) - math.log(b["speedup"]))
                cross = math.exp(math.log(r1) + f * (math.log(r2) - math.log(r1)))
                lines.append(
                    f"Break-even: {opt} beats its baseline on {n} x {gpu} over {_KIND_NAMES.get(kind, kind)} "
                    f"below about {cross:,.3g} Gb/s "
                    f"per NIC (between the swept {r1:g} and {r2:g} Gb/s)."
                )
                break
    return lines


def advantage_limits(rows: list[dict[str, Any]], threshold: float = 1.10) -> list[str]:
    """Where each compressed optimizer's speedup over the baseline falls below ``threshold``."""
    out = []
    for opt in sorted(o for o in {r["optimizer"] for r in rows} if not _is_baseline(o)):
        mine = [r for r in rows if r["optimizer"] == opt and r.get("speedup") is not None]
        if not mine:
            continue
        lost = [r for r in mine if r["speedup"] < threshold]
        best = max(mine, key=lambda r: r["speedup"])
        if not lost:
            out.append(
                f"{opt} is at least {threshold:.2f}x faster than the baseline everywhere in this sweep "
                f"(up to {best['speedup']:.1f}x on {best['cluster']})."
            )
            continue
        nets = sorted({r["network"] for r in lost})
        sizes = sorted({r["world_size"] for r in lost})
        out.append(
            f"{opt}'s advantage disappears (< {threshold:.2f}x) on {len(lost)} of {len(mine)} clusters: "
            f"networks {', '.join(nets)}; GPU counts {', '.join(map(str, sizes))} "
            f"(best: {best['speedup']:.1f}x on {best['cluster']})."
        )
    return out
