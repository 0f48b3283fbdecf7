"""`clustersim report`: one self-contained HTML file (plotly.js embedded once), optional PNGs."""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import plotly
import plotly.io as pio
from plotly.offline import get_plotlyjs

from clustersim.errors import InputError
from clustersim.io import check_writable_file, write_text_atomically
from clustersim.planner.layout_search import layout_label
from clustersim.report import analysis, figures
from clustersim.scenario import validate_scenario
from clustersim.sweeps.store import FILES, read_results
from clustersim.units import format_bytes

MIN_LINK_UTILISATION = 0.05  # links busier than this are worth a planner's look; the rest is noise
QUIET_LINKS_SHOWN = 3  # where every link is under MIN_LINK_UTILISATION, the busiest few still listed


@dataclass
class Section:
    """One model's part of the report: its rows, recommendation, figures and the focus run's links."""

    model: str
    rows: list
    rec: dict
    figs: dict
    hottest_links: dict | None = None
    table: list = field(default_factory=list)
    break_even: list = field(default_factory=list)  # planner.breakeven.BreakEven, where the sweep crosses
    # per compressed optimizer: how far its speedups are checked (validation.speedup_checks.sweep_lines)
    checked: list = field(default_factory=list)


def build_report(
    results: Path,
    steps=None,
    price: float | None = None,
    deadline_h: float | None = None,
    budget: float | None = None,
    baseline: str | None = None,
    network="default",
    samples: int | None = None,
    costs=None,
):
    """The report's content: one Section per model in the sweep (a recommendation never picks across
    models, a line never joins two of them). ``samples``: draws for the paired speedup bands (default:
    the sweep's, 0 for none)."""
    meta, rows = read_results(results)
    meta["unfinished"] = unfinished_note(meta, rows)
    jsonl = f"{results}/scenarios.jsonl"
    for r in rows:  # a sweep over sharding or tensor/pipeline sizes: each row's layout, as plan's rows
        scenario = meta["scenarios"].get(r.get("row_id"))
        if scenario is not None and "layout" not in r:
            try:
                r["layout"] = layout_label(scenario)
            except (KeyError, TypeError, AttributeError, ZeroDivisionError):  # a damaged record
                raise InputError(f"row {r['row_id']}: not a clustersim scenario", source=jsonl) from None
    preferred = baseline or ((meta.get("base") or {}).get("training") or {}).get("optimizer")
    if baseline is not None:
        from clustersim.planner.compare import choose_baseline

        choose_baseline(baseline, baseline)  # a compressed or unknown name: one clear line
        if baseline not in {r.get("optimizer") for r in rows}:
            raise InputError(f"{baseline} is not among the sweep's optimizers", key="--baseline")
    if costs is None:
        from clustersim.report.costing import auto_model

        costs = auto_model(
            {r["gpu"] for r in rows if r.get("status") == "ok" and r.get("gpu")}, price, network
        )
    meta["pricing"] = costs.describe()
    rows_ok = analysis.enrich(
        rows,
        steps or meta.get("steps"),
        price,
        meta.get("warmup"),
        preferred,
        network,
        meta["scenarios"],
        costs=costs,
    )
    n = meta.get("samples", 32) if samples is None else samples  # uncertainty.DEFAULT_SAMPLES
    analysis.add_paired_bands(rows_ok, meta["scenarios"], n, None, meta.get("warmup"))
    models = sorted({str(r.get("model")) for r in rows_ok})
    sections = []
    failed = [r for r in rows if r.get("status") != "ok"]
    for model in models:
        mine = [r for r in rows_ok if str(r.get("model")) == model]
        section = _section(model, mine, meta, results, deadline_h, budget, len(models) > 1)
        section.rec["text"] += not_run_lines([r for r in rows if str(r.get("model")) == model])
        sections.append(section)
    return meta, rows_ok, sections, failed


def unfinished_note(meta: dict, rows: list) -> str | None:
    """What a report of a sweep that stopped part-way (Ctrl-C, a crash) leaves out, said, or None. A
    folder written before sweep.json kept its row count says nothing."""
    total = meta.get("rows")
    if not isinstance(total, int) or isinstance(total, bool) or len(rows) >= total:
        return None
    return (
        f"the sweep is unfinished: {len(rows)} of its {total} rows are in results.csv (run the sweep "
        "again to finish it); this report covers those only"
    )


def not_run_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per optimizer of the sweep none of whose rows (of one model) ran, with one row's reason
    (planning.optimizers_not_run: the GPU with the most memory, the shortest reason), so that a report
    names every optimizer the sweep asked for (1-bit Adam's replicas out of memory were left unsaid)."""
    from clustersim.errors import shortened
    from clustersim.planner.planning import optimizers_not_run

    return [
        f"{name}: none of its {sum(r.get('optimizer') == name for r in rows)} rows ran, e.g. "
        f"{shortened(why, 200)}"
        for name, why in optimizers_not_run(rows).items()
    ]


def _section(model, rows, meta, results, deadline_h, budget, several: bool) -> Section:
    from clustersim.simulator import simulate

    rec = analysis.recommendation(rows, deadline_h, budget, meta["scenarios"], meta.get("warmup"))
    focus = rec["chosen"] or rec["fastest"]
    jsonl = f"{results}/scenarios.jsonl"
    if focus["row_id"] not in meta["scenarios"]:
        raise InputError(f"no scenario for row {focus['row_id']}, the row the report simulates", source=jsonl)
    scenario = validate_scenario(meta["scenarios"][focus["row_id"]], source=jsonl)
    focus_run = simulate(scenario)
    suffix = f" — {model}" if several else ""
    figs = {
        "speedup": figures.speedup_vs_gpus(rows, suffix),
        "breakdown": figures.breakdown_bars(rows, focus["gpu"], suffix),
        # named by the row it shows: a sweep's rows all carry the base scenario's name
        "timeline": figures.timeline(
            focus_run,
            f"{focus['optimizer']} on {focus['cluster']}, {model}"
            + (
                ""
                if rec["chosen"]
                else " (the fastest per step; the rows train different global batches)"
                if rec.get("mixed")
                else " (the fastest; nothing meets the constraints)"
            ),
        ),
        "bytes": figures.bytes_on_wire(rows, focus["network"], focus["gpu"], suffix),
        "cost": figures.cost_vs_time(rows, rec["chosen"], suffix),
    }
    hot = hottest_links(scenario, focus_run) | {
        "role": "recommended" if rec["chosen"] else "fastest per step" if rec.get("mixed") else "fastest"
    }
    crossings = analysis.break_even_crossings(rows, meta["scenarios"], meta.get("warmup"))
    evens = [b for found in crossings.values() for b in found if not isinstance(b, tuple)]
    from clustersim.validation.speedup_checks import sweep_lines

    checked = sweep_lines(rows, meta["scenarios"])
    return Section(model, rows, rec, figs, hot, analysis.by_network(rows), evens, checked)


def hottest_links(scenario, run) -> dict:
    """The recommended (or fastest) configuration's busiest links and their utilisation (bytes over
    capacity x iteration time), from the flow backend: the run itself when it used it, else one more
    simulation of the same scenario with ``training.network: flow`` (no band). Links under
    MIN_LINK_UTILISATION are counted, not listed; where every link is, the busiest QUIET_LINKS_SHOWN
    are (``busiest``), so the section still says where the traffic goes."""
    from clustersim.simulator import simulate

    if not run.extra.get("hottest_links"):
        run = simulate(scenario.with_changes(**{"training.network": "flow"}), uncertainty_samples=0)
    links = run.extra.get("hottest_links") or []
    busy = [x for x in links if x["utilisation"] >= MIN_LINK_UTILISATION]
    out = {"iteration_time_s": run.iteration_time, "links": busy, "quiet": len(links) - len(busy)}
    if links and not busy:
        out["busiest"] = sorted(links, key=lambda x: -x["utilisation"])[:QUIET_LINKS_SHOWN]
    return out


def _links_html(hot: dict | None, anchor: str) -> str:
    if not hot or not (hot["links"] or hot.get("quiet")):
        return ""
    under = f"{100 * MIN_LINK_UTILISATION:.0f}%"
    shown = hot["links"] or hot.get("busiest", [])
    if not hot["links"] and shown:
        quiet = f" Every link is under {under} utilised; the busiest {len(shown)}:"
    elif hot.get("quiet"):
        quiet = f" {hot['quiet']} more link(s) under {under} utilisation are not listed."
    else:
        quiet = ""
    rows = "".join(
        f"<tr><td>{html.escape(x['link'])}</td><td>{x['gbs']:.3g}</td><td>{format_bytes(x['bytes'])}</td>"
        f"<td>{100 * x['utilisation']:.1f}%</td></tr>"
        for x in shown
    )
    table = (
        f"<table><tr><th>link</th><th>GB/s</th><th>bytes per iteration</th><th>utilisation</th></tr>{rows}</table>"
        if rows
        else ""
    )
    return (
        f'<h3 id="{anchor}">Hottest links of the {hot.get("role", "recommended")} configuration (flow backend)</h3>'
        f"<p>Bytes over capacity x the flow backend's iteration time ({hot['iteration_time_s'] * 1e3:,.1f} ms); "
        f"collectives simulated flow by flow over the topology, links shared max-min fairly.{quiet}</p>{table}"
    )


def _cost_cell(r: dict) -> str:
    band = f" ({r['cost_p10']:,.0f}–{r['cost_p90']:,.0f})" if "cost_p10" in r else ""
    return f"${r['cost']:,.0f}{band}"


def _network_cell(r: dict) -> str:
    """An owned row's network share; a rented one's network comes with the instance."""
    if r.get("cost_model") == "rent":
        return "in the instance price"
    return f"${r.get('network_cost', 0.0):,.0f}"


def _by_network_html(section: Section) -> str:
    """Per network and GPU count: what to run, how much faster than the baseline, time and cost."""
    rows = "".join(
        f"<tr><td>{html.escape(c['network'])}</td><td>{c['world_size']} x {html.escape(c['gpu'])}</td>"
        f"<td>{html.escape(analysis.tie_text(c))}</td><td>{html.escape(analysis.speedup_text(c['best']))}</td>"
        f"<td>{analysis._hours(c['best']['ttt_h'])}</td><td>{_cost_cell(c['best'])}</td>"
        f"<td>{_network_cell(c['best'])}</td></tr>"
        for c in section.table
    )
    base = next((r["baseline"]["optimizer"] for r in section.rows if r.get("baseline")), "the baseline")
    return (
        f'<table class="by-network"><tr><th>network</th><th>GPUs</th><th>cheapest optimizer (within {100 * analysis.EQUIVALENT_GAIN:.0f}%: the simpler)</th>'
        f"<th>speedup over {html.escape(base)} (P10–P90, paired)</th><th>time to train</th><th>cost (P10–P90)</th>"
        f"<th>of which network</th></tr>{rows}</table>"
    )


def _checked_html(lines: list[str]) -> str:
    """How far the compressed optimizers' speedups are checked against published ones: the paired
    bands hold the hardware's uncertainty, not the model's error on a speedup."""
    if not lines:
        return ""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return (
        "<h3>How far these speedups are checked</h3><p>The speedup bands hold the hardware's uncertainty, "
        "not the model's own error on a speedup; published speedups measure that "
        f'(<code>clustersim validate</code>):</p><ul class="checked">{items}</ul>'
    )


def _section_html(section: Section, index: int, several: bool) -> str:
    tag = f"-{index}" if several else ""
    parts = [
        f'<section class="fig" id="fig-{name}{tag}">'
        + pio.to_html(
            fig,
            full_html=False,
            include_plotlyjs=False,
            div_id=f"plot-{name}{tag}",
            default_width="100%",  # the container's width, redrawn when the window is resized
            config={"responsive": True},
        )
        + "</section>"
        for name, fig in section.figs.items()
    ]
    rec_html = "".join(f"<li>{html.escape(line)}</li>" for line in section.rec["text"])
    front = analysis.pareto(section.rows)
    table_rows = "".join(
        f"<tr><td>{i}</td><td>{html.escape(r['optimizer'])}</td><td>{html.escape(r['cluster'])}</td>"
        f"<td>{r['ttt_h']:,.1f}</td><td>${r['cost']:,.0f}</td><td>{r['samples_per_s']:,.0f}</td>"
        f"<td>{html.escape(analysis.speedup_text(r))}</td></tr>"
        for i, r in enumerate(front, 1)
    )
    title = f'<h2 class="model" id="model{tag}">{html.escape(section.model)}</h2>' if several else ""
    mixed = (
        '<p class="warning">These rows train different global batches: a faster or cheaper row may train '
        "fewer samples per step (see the recommendation).</p>"
        if section.rec.get("mixed")
        else ""
    )
    return f"""<div class="section" data-model="{html.escape(section.model)}">{title}
<div class="recommendation"><h2>Recommendation</h2><ul>{rec_html}</ul></div>
<h3>By network: what to run at each NIC speed and GPU count</h3>
{_by_network_html(section)}
{_checked_html(section.checked)}
<h3>Pareto frontier (no other configuration is both faster and cheaper; # as in the cost figure)</h3>{mixed}
<table class="pareto"><tr><th>#</th><th>optimizer</th><th>cluster</th><th>time to train (h)</th><th>cost</th>
<th>samples/s</th><th>speedup</th></tr>
{table_rows}</table>
{_links_html(section.hottest_links, "links" + tag)}
{"".join(parts)}
</div>"""


def render_html(
    meta: dict, rows_ok, sections: list, failed: list, price: float | None, network="default", costs=None
) -> str:
    from clustersim.report.costing import cost_model

    several = len(sections) > 1
    body = "".join(_section_html(sec, i, several) for i, sec in enumerate(sections, 1))
    priced = (
        meta.get("pricing") or (costs if costs is not None else cost_model(None, price, network)).describe()
    )
    steps = sorted({(r["optimizer"], r["steps"]) for r in rows_ok})
    steps_note = (
        ", ".join(f"{o} {n:,}" for o, n in steps) if len({n for _, n in steps}) > 1 else f"{steps[0][1]:,}"
    )
    header = html.escape(describe_runs(meta, rows_ok))
    skipped = (
        f"<p>{len(failed)} row(s) were not simulated (invalid combination or did not fit); see results.csv.</p>"
        if failed
        else ""
    )
    if meta.get("unfinished"):
        skipped = f"<p><strong>Note: {html.escape(meta['unfinished'])}.</strong></p>" + skipped
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>clustersim report: {html.escape(meta.get("name", "sweep"))}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; padding: 0 1rem; color: #222; }}
/* a narrow window scrolls a wide table inside itself, never the page sideways */
table {{ display: block; max-width: 100%; overflow-x: auto; }} .fig {{ max-width: 100%; overflow-x: auto; }}
h1 {{ margin-bottom: 0.2rem; }} .meta {{ color: #666; margin-top: 0; }}
.recommendation {{ background: #f4f8ff; border-left: 4px solid #4C78A8; padding: 0.6rem 1.2rem; }}
table {{ border-collapse: collapse; margin: 1rem 0; }} td, th {{ border: 1px solid #ddd; padding: 0.3rem 0.6rem; }}
th {{ background: #f6f6f6; }} td {{ white-space: nowrap; }} .fig {{ margin: 1.5rem 0; }} h2.model {{ border-top: 2px solid #4C78A8; padding-top: 1rem; }}
</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<h1>Capacity plan: {html.escape(meta.get("name", "sweep"))}</h1>
<p class="runs" id="runs">{header}</p>
<p class="meta">{len(rows_ok)} simulated configurations over {html.escape(", ".join(meta.get("axes", [])))};
steps per run {html.escape(steps_note)}; cost: {html.escape(priced)}.
clustersim, plotly {plotly.__version__}.</p>
{skipped}
{body}
</body></html>
"""


def _names(rows, key: str) -> str:
    values = {r[key] for r in rows if r.get(key) is not None}
    ordered = sorted(values, key=lambda v: (isinstance(v, str), v))  # numbers in numeric order
    return ", ".join(str(v) for v in ordered) if ordered else "unknown"


def describe_runs(meta: dict, rows_ok: list[dict]) -> str:
    """The header line: what was simulated (model, GPU, global batch) and which calibration it used."""
    base = meta.get("base") or {}
    batch = meta.get("global_batch") or _names(rows_ok, "global_batch")
    profiles = {(s or {}).get("profile") for s in meta.get("scenarios", {}).values()} | {base.get("profile")}
    profiles.discard(None)
    calibration = (
        ", ".join(sorted(profiles)) if profiles else "none (catalog hardware figures and documented defaults)"
    )
    batch_text = f"{batch:,}" if isinstance(batch, int) else str(batch)
    return (
        f"Model {_names(rows_ok, 'model')} · GPU {_names(rows_ok, 'gpu')} · "
        f"global batch {batch_text} samples · micro-batch {_names(rows_ok, 'micro_batch_used')} · "
        f"{_recipe(meta, rows_ok)} · calibration: {calibration}"
    )


def _recipe(meta: dict, rows_ok: list[dict]) -> str:
    """How the rows' code runs (precision, execution, attention: scenarios.jsonl holds each row's
    whole scenario, defaults included): two sweeps of one model and cluster on other recipes read
    differently, as their numbers do."""
    scenarios = meta.get("scenarios", {})
    workloads = [(scenarios.get(r.get("row_id")) or {}).get("workload") or {} for r in rows_ok]
    parts = []
    for key in ("precision", "execution", "attention"):
        values = sorted({str(w[key]) for w in workloads if w.get(key) is not None})
        if values:
            parts.append(f"{key} {', '.join(values)}")
    return " · ".join(parts) if parts else "recipe as the scenarios give it"


def write_report(
    results: Path,
    out: Path,
    steps=None,
    price: float | None = None,
    png_dir: Path | None = None,
    deadline_h: float | None = None,
    budget: float | None = None,
    baseline: str | None = None,
    network="default",
    samples: int | None = None,
    costs=None,
) -> dict:
    check_writable_file(out, inputs=[Path(results) / name for name in FILES])  # before the work
    meta, rows_ok, sections, failed = build_report(
        results, steps, price, deadline_h, budget, baseline, network, samples, costs
    )
    text = render_html(meta, rows_ok, sections, failed, price, network, costs)
    out = Path(out)
    write_text_atomically(out, text, mode=0o644)
    figs = {
        (name if len(sections) == 1 else f"{name}-{i}"): fig
        for i, sec in enumerate(sections, 1)
        for name, fig in sec.figs.items()
    }
    png = export_png(figs, png_dir) if png_dir is not None else None
    return {
        "out": str(out),
        "unfinished": meta.get("unfinished"),
        "figures": list(figs),
        "recommendation": [line for sec in sections for line in _labelled(sec, len(sections) > 1)],
        "models": {
            sec.model: {
                "recommendation": sec.rec["text"],
                "by_network": [
                    {
                        "network": c["network"],
                        "gpus": c["world_size"],
                        "gpu": c["gpu"],
                        "optimizer": c["best"]["optimizer"],
                        "tie_with": c["tie_with"]["optimizer"] if c["tie_with"] else None,
                        "tie_cost": c["tie_with"]["cost"] if c["tie_with"] else None,
                        "speedup": c["best"].get("speedup"),
                        "speedup_p10": c["best"].get("speedup_p10"),
                        "speedup_p90": c["best"].get("speedup_p90"),
                        "ttt_h": c["best"]["ttt_h"],
                        "cost": c["best"]["cost"],
                        "cost_p10": c["best"].get("cost_p10"),
                        "cost_p90": c["best"].get("cost_p90"),
                        "cost_model": c["best"].get("cost_model"),
                        "cost_basis": c["best"].get("cost_basis"),
                        "network_cost": c["best"].get("network_cost"),
                    }
                    for c in sec.table
                ],
                "break_even": [b.to_dict() for b in sec.break_even],
            }
            for sec in sections
        },
        "png": png,
        "pricing": meta["pricing"],
    }


def _labelled(section: Section, several: bool) -> list[str]:
    return [f"{section.model}: {line}" if several else line for line in section.rec["text"]]


def export_png(figs: dict, folder: Path) -> dict:
    """Static PNGs through kaleido, which drives an installed Chrome/Chromium. Never fatal."""
    import importlib.util

    if importlib.util.find_spec("kaleido") is None:
        return {
            "written": [],
            "message": "PNG export skipped: kaleido is not installed (pip install 'clustersim[report-png]'; "
            "it also needs Chrome or Chromium, e.g. apt-get install chromium)",
        }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for name, fig in figs.items():
            path = folder / f"{name}.png"
            fig.write_image(str(path), width=1100, height=450)
            written.append(str(path))
    except Exception as exc:  # kaleido raises many kinds when no browser can be started
        return {
            "written": written,
            "message": f"PNG export stopped: {str(exc).splitlines()[0][:160]} "
            "(kaleido needs Chrome or Chromium: apt-get install chromium)",
        }
    return {"written": written, "message": f"{len(written)} PNG file(s) written to {folder}"}


def parse_duration(text: str, key: str = "--deadline") -> float:
    """'3d', '72h', '90m', '1.5d', '1w' -> hours. A bare number is refused: '60' read as hours was a
    60-day deadline typed without its unit, silently 24 times shorter."""
    t = text.strip().lower()
    units = {"d": 24.0, "h": 1.0, "m": 1 / 60, "w": 168.0}
    forms = "e.g. 60d, 1440h, 90m or 2w"
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else None
        if value is None:
            float(t)  # a number without its unit: said as such below
    except ValueError:
        raise InputError(f"cannot read duration {text!r} (use {forms})", key=key) from None
    if value is None:
        raise InputError(f"{text.strip()} has no unit: give days, hours, minutes or weeks, {forms}", key=key)
    return check_duration_hours(value, repr(text), key)


# The longest deadline a plan takes: 10 years, past any training run's or its hardware's life (a 1e9d
# deadline is a typo, and "24,000,000,000.0 h" in the answer only hides it).
MAX_DEADLINE_H = 10 * 365 * 24.0


def check_duration_hours(value: float, shown: str, key: str = "--deadline") -> float:
    """``value`` hours as a deadline: finite, positive and at most MAX_DEADLINE_H, else an InputError
    naming ``key`` (``shown``: the value as the user gave it)."""
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"duration must be a finite positive time, got {shown}", key=key)
    if value > MAX_DEADLINE_H:
        raise InputError(
            f"duration {shown} is {_years(value)} years, more than the 10 years any training run or "
            "its hardware lasts; check its unit",
            key=key,
        )
    return value


def _years(hours: float) -> str:
    """Hours as years, readable however large (1e300d is a typo, not 300 digits to read)."""
    years = hours / (365 * 24)
    return f"{years:,.0f}" if years < 1e6 else f"{years:.1e}"
