"""`clustersim report`: one self-contained HTML file (plotly.js embedded once), optional PNGs."""

from __future__ import annotations

import html
import math
from pathlib import Path

import plotly
import plotly.io as pio
from plotly.offline import get_plotlyjs

from clustersim.errors import InputError
from clustersim.io import check_writable_file, write_text_atomically
from clustersim.layout_search import layout_label
from clustersim.report import analysis, figures
from clustersim.scenario import validate_scenario
from clustersim.sweeps.store import read_results
from clustersim.units import format_bytes


def build_report(
    results: Path,
    steps: int | None = None,
    price: float | None = None,
    deadline_h: float | None = None,
    budget: float | None = None,
):
    meta, rows = read_results(results)
    jsonl = f"{results}/scenarios.jsonl"
    for r in rows:  # a sweep over sharding or tensor/pipeline sizes: each row's layout, as plan's rows
        scenario = meta["scenarios"].get(r.get("row_id"))
        if scenario is not None and "layout" not in r:
            try:
                r["layout"] = layout_label(scenario)
            except (KeyError, TypeError, AttributeError, ZeroDivisionError):  # a damaged record
                raise InputError(f"row {r['row_id']}: not a clustersim scenario", source=jsonl) from None
    rows_ok = analysis.enrich(rows, steps or meta.get("steps"), price, meta.get("warmup"))
    rec = analysis.recommendation(rows_ok, deadline_h, budget)
    focus = rec["chosen"] or rec["fastest"]
    from clustersim.simulator import simulate

    if focus["row_id"] not in meta["scenarios"]:
        raise InputError(f"no scenario for row {focus['row_id']}, the row the report simulates", source=jsonl)
    scenario = validate_scenario(meta["scenarios"][focus["row_id"]], source=jsonl)
    focus_run = simulate(scenario)
    meta["hottest_links"] = hottest_links(scenario, focus_run)
    figs = {
        "speedup": figures.speedup_vs_gpus(rows_ok),
        "breakdown": figures.breakdown_bars(rows_ok, focus["network"], focus["gpu"]),
        "timeline": figures.timeline(focus_run),
        "bytes": figures.bytes_on_wire(rows_ok, focus["network"], focus["gpu"]),
        "cost": figures.cost_vs_time(rows_ok, rec["chosen"]),
    }
    failed = [r for r in rows if r.get("status") != "ok"]
    return meta, rows_ok, rec, figs, failed


def hottest_links(scenario, run) -> dict:
    """The recommended (or fastest) configuration's busiest links and their utilisation (bytes over
    capacity x iteration time), from the flow backend (issue #11): the run itself when it used it, else
    one more simulation of the same scenario with ``training.network: flow`` (no band)."""
    from clustersim.simulator import simulate

    if not run.extra.get("hottest_links"):
        run = simulate(scenario.with_changes(**{"training.network": "flow"}), uncertainty_samples=0)
    return {"iteration_time_s": run.iteration_time, "links": run.extra.get("hottest_links") or []}


def _links_html(hot: dict | None) -> str:
    if not hot or not hot["links"]:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(x['link'])}</td><td>{x['gbs']:.3g}</td><td>{format_bytes(x['bytes'])}</td>"
        f"<td>{100 * x['utilisation']:.1f}%</td></tr>"
        for x in hot["links"]
    )
    return (
        '<h2 id="links">Hottest links of the recommended configuration (flow backend)</h2>'
        f"<p>Bytes over capacity x the flow backend's iteration time ({hot['iteration_time_s'] * 1e3:,.1f} ms); "
        "collectives simulated flow by flow over the topology, links shared max-min fairly.</p>"
        f"<table><tr><th>link</th><th>GB/s</th><th>bytes per iteration</th><th>utilisation</th></tr>{rows}</table>"
    )


def render_html(meta: dict, rows_ok, rec: dict, figs: dict, failed: list, price: float | None) -> str:
    parts = []
    for name, fig in figs.items():
        parts.append(
            f'<section class="fig" id="fig-{name}">'
            + pio.to_html(fig, full_html=False, include_plotlyjs=False, div_id=f"plot-{name}")
            + "</section>"
        )
    rec_html = "".join(f"<li>{html.escape(line)}</li>" for line in rec["text"])
    front = analysis.pareto(rows_ok)

    def speedup(r) -> str:
        return "" if r.get("speedup") is None else f"{r['speedup']:.2f}x"

    table_rows = "".join(
        f"<tr><td>{html.escape(r['optimizer'])}</td><td>{html.escape(r['cluster'])}</td>"
        f"<td>{r['ttt_h']:,.1f}</td><td>${r['cost']:,.0f}</td><td>{r['samples_per_s']:,.0f}</td>"
        f"<td>{speedup(r)}</td></tr>"
        for r in front
    )
    price_note = (
        f"${price:g} per GPU-hour for every GPU"
        if price
        else "default on-demand prices per GPU type (catalogs/prices.yaml)"
    )
    header = html.escape(describe_runs(meta, rows_ok))
    skipped = (
        f"<p>{len(failed)} row(s) were not simulated (invalid combination or did not fit); see results.csv.</p>"
        if failed
        else ""
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>clustersim report: {html.escape(meta.get("name", "sweep"))}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }}
h1 {{ margin-bottom: 0.2rem; }} .meta {{ color: #666; margin-top: 0; }}
.recommendation {{ background: #f4f8ff; border-left: 4px solid #4C78A8; padding: 0.6rem 1.2rem; }}
table {{ border-collapse: collapse; margin: 1rem 0; }} td, th {{ border: 1px solid #ddd; padding: 0.3rem 0.6rem; }}
th {{ background: #f6f6f6; }} .fig {{ margin: 1.5rem 0; }}
</style>
<script type="text/javascript">{get_plotlyjs()}</script>
</head><body>
<h1>Capacity plan: {html.escape(meta.get("name", "sweep"))}</h1>
<p class="runs" id="runs">{header}</p>
<p class="meta">{len(rows_ok)} simulated configurations over {html.escape(", ".join(meta.get("axes", [])))};
steps per run {rows_ok[0]["steps"]:,}; cost at {html.escape(price_note)}. clustersim, plotly {plotly.__version__}.</p>
<div class="recommendation"><h2>Recommendation</h2><ul>{rec_html}</ul></div>
{skipped}
<h2>Pareto frontier (no other configuration is both faster and cheaper)</h2>
<table><tr><th>optimizer</th><th>cluster</th><th>time to train (h)</th><th>cost</th><th>samples/s</th><th>speedup</th></tr>
{table_rows}</table>
{_links_html(meta.get("hottest_links"))}
{"".join(parts)}
</body></html>
"""


def _names(rows, key: str) -> str:
    values = sorted({str(r[key]) for r in rows if r.get(key) is not None})
    return ", ".join(values) if values else "unknown"


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
        f"global batch {batch_text} samples · calibration: {calibration}"
    )


def write_report(
    results: Path,
    out: Path,
    steps: int | None = None,
    price: float | None = None,
    png_dir: Path | None = None,
) -> dict:
    check_writable_file(out)  # before the work
    meta, rows_ok, rec, figs, failed = build_report(results, steps, price)
    text = render_html(meta, rows_ok, rec, figs, failed, price)
    out = Path(out)
    write_text_atomically(out, text, mode=0o644)
    png = export_png(figs, png_dir) if png_dir is not None else None
    return {"out": str(out), "figures": list(figs), "recommendation": rec["text"], "png": png}


def export_png(figs: dict, folder: Path) -> dict:
    """Static PNGs through kaleido, which drives an installed Chrome/Chromium. Never fatal."""
    import importlib.util

    if importlib.util.find_spec("kaleido") is None:
        return {
            "written": [],
            "message": "PNG export skipped: kaleido is not installed (pip install kaleido; "
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


def parse_duration(text: str) -> float:
    """'3d', '72h', '90m', '1.5d' -> hours."""
    t = text.strip().lower()
    units = {"d": 24.0, "h": 1.0, "m": 1 / 60, "w": 168.0}
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise InputError(f"cannot read duration {text!r} (use e.g. 3d, 72h, 90m)", key="--deadline") from None
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"duration must be a finite positive time, got {text!r}", key="--deadline")
    return value
