"""Reports and plans: the HTML, the recommendation, a real headless Chromium, and `plan`."""

import html
import json
import os
import shutil

import pytest
import yaml

from clustersim.cli import app
from clustersim.report import analysis
from clustersim.report.build import parse_duration
from clustersim.sweeps.run import run_sweep
from clustersim.sweeps.spec import load_sweep
from tests.conftest import swept_results

SWEEP = {
    "name": "report-test",
    "base": "preset:default",
    "vary": {"gpus": [8, 32, 128], "nic_gbps": [10, 100], "optimizer": ["adam", "onebit-adam", "binsgdm"]},
    "steps": 20000,
    "global_batch": 1024,
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return swept_results(tmp_path_factory, "rep", SWEEP)


def test_report_is_self_contained(results, tmp_path, runner):
    out = tmp_path / "report.html"
    r = runner.invoke(app, ["report", str(results), "--out", str(out), "--price", "3"])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "<script src=" not in text  # opens offline: plotly.js is inline
    assert text.count("plotly.js v") <= 2  # embedded once (its banner)
    for fig in ("speedup", "breakdown", "timeline", "bytes", "cost"):
        assert f'id="fig-{fig}"' in text
    assert "Recommendation" in text and "Pareto frontier" in text


def test_png_without_kaleido_names_the_extra_to_install(results, tmp_path, runner, monkeypatch):
    """The hint is printed as text: `[report-png]` is not console markup to be swallowed."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "kaleido" else real(name, *a)
    )
    out = tmp_path / "report.html"
    r = runner.invoke(
        app, ["report", str(results), "--out", str(out), "--png", str(tmp_path / "png"), "--price", "3"]
    )
    assert r.exit_code == 0, r.output
    assert "pip install 'clustersim[report-png]'" in r.output


def test_report_shows_the_recommended_configurations_hottest_links(results):
    """Issue #11: per-link utilisation in the report, from the flow backend (the sweep ran analytical,
    so the report simulates the recommended configuration once more with flows): the links are the
    busiest of that run, each at most fully used, and the table is in the page."""
    from clustersim.report.build import build_report, render_html

    meta, rows_ok, sections, failed = build_report(results, price=3.0)
    hot = sections[0].hottest_links
    links = hot["links"]
    assert links or hot["quiet"]
    assert all(0.05 <= x["utilisation"] <= 1.0 + 1e-9 for x in links)  # under 5% is counted, not listed
    assert links == sorted(links, key=lambda x: -x["utilisation"])
    page = render_html(meta, rows_ok, sections, failed, 3.0)
    assert 'id="links"' in page and (not links or html.escape(links[0]["link"]) in page)


def test_flow_rows_of_a_sweep_name_their_busiest_link(tmp_path):
    from clustersim.sweeps.store import read_results

    sweep = {**SWEEP, "vary": {"gpus": [16], "training.network": ["analytical", "flow"]}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    run_sweep(load_sweep(tmp_path / "s.yaml"), tmp_path / "out")
    _, rows = read_results(tmp_path / "out")
    flow = [r for r in rows if r.get("training.network") == "flow"]
    plain = [r for r in rows if r.get("training.network") == "analytical"]
    assert flow and all(r["hottest_link"] and 0 < float(r["hottest_link_utilisation"]) <= 1 for r in flow)
    assert plain and all(not r.get("hottest_link") for r in plain)


def test_recommendation_is_drawn_from_the_numbers(results):
    from clustersim.sweeps.store import read_results

    meta, rows = read_results(results)
    enriched = analysis.enrich(rows, None, 3.0)
    rec = analysis.recommendation(enriched)
    chosen = rec["chosen"]
    cheapest = min(r["cost"] for r in enriched)
    assert chosen["cost"] == cheapest or (
        analysis.complexity(chosen) == (0, 0, 0)
        and chosen["cost"] <= cheapest * (1 + analysis.EQUIVALENT_GAIN)
    )
    front = analysis.pareto(enriched)
    for p in front:  # nothing dominates a Pareto point
        assert not any(r["ttt_h"] < p["ttt_h"] and r["cost"] < p["cost"] for r in enriched)
    for opt in ("onebit-adam", "binsgdm"):  # one line per compressed optimizer, against adam
        assert sum(line.startswith(f"{opt} vs adam: ") for line in rec["text"]) == 1, rec["text"]
    late = analysis.recommendation(enriched, deadline_h=1e-6)
    assert late["chosen"] is None and "No configuration meets" in late["text"][0]


def _chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def test_report_renders_in_headless_chromium(results, tmp_path):
    chromium = _chromium()
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed; `make test` installs it (apt-get install chromium)")
        pytest.skip("no Chromium on this machine")
    sync_api = pytest.importorskip("playwright.sync_api")
    out = tmp_path / "report.html"
    from clustersim.report.build import write_report

    write_report(results, out, price=3.0)
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        page = browser.new_page()
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(out.as_uri())
        page.wait_for_function(
            "document.querySelectorAll('.js-plotly-plot .main-svg').length >= 5", timeout=30000
        )
        plots = page.evaluate("document.querySelectorAll('.js-plotly-plot').length")
        drawn = page.evaluate(
            "Array.from(document.querySelectorAll('.js-plotly-plot')).map(d => d.querySelectorAll('.trace, .bars, .scatterlayer .points path').length)"
        )
        # a narrow window: the page never scrolls sideways (it did by 156 px at 800 px); a wide table
        # scrolls inside itself
        page.set_viewport_size({"width": 800, "height": 900})
        page.wait_for_timeout(300)  # plotly's responsive redraw
        widths = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
        browser.close()
    assert plots == 5
    assert all(n > 0 for n in drawn), drawn
    assert errors == []
    assert widths[0] <= widths[1], widths


def test_png_export_says_what_it_needs(results, tmp_path):
    from clustersim.report.build import export_png
    from clustersim.report.figures import speedup_vs_gpus
    from clustersim.sweeps.store import read_results

    _, rows = read_results(results)
    fig = speedup_vs_gpus(analysis.enrich(rows, None, 3.0))
    info = export_png({"speedup": fig}, tmp_path / "png")
    assert info["written"] or "Chromium" in info["message"] or "kaleido" in info["message"]


@pytest.mark.parametrize("text,hours", [("3d", 72), ("72h", 72), ("90m", 1.5), ("1w", 168), ("1.5d", 36)])
def test_durations(text, hours):
    assert parse_duration(text) == pytest.approx(hours)


def test_report_errors(tmp_path, runner):
    r = runner.invoke(app, ["report", str(tmp_path), "--out", str(tmp_path / "r.html")])
    assert r.exit_code == 2 and "no sweep.json" in r.output


def test_plan_finds_the_cheapest_in_time(runner, tmp_path):
    cand = tmp_path / "cand.yaml"
    cand.write_text(
        yaml.safe_dump(
            {"base": "preset:default", "vary": {"gpus": [8, 32, 128], "optimizer": ["adam", "binsgdm"]}}
        )
    )
    r = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "BERT-Large",
            "--steps",
            "20000",
            "--deadline",
            "3d",
            "--candidates",
            str(cand),
            "--global-batch",
            "1024",
            "--price",  # V100s: no server price is published for the owned model; rented at a flat rate
            "3.06",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["chosen"]["ttt_h"] <= 72 and d["candidates"] == 6
    assert all(x["cost"] >= d["chosen"]["cost"] for x in d["runners_up"])
    r = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "BERT-Large",
            "--steps",
            "20000",
            "--deadline",
            "1m",
            "--candidates",
            str(cand),
            "--global-batch",
            "1024",
            "--price",
            "3.06",
        ],
    )
    assert r.exit_code == 1 and "No configuration meets" in r.output


@pytest.mark.parametrize(
    "args,match",
    [
        (["--model", "BERT-Huge", "--steps", "10", "--deadline", "1d"], "unknown model"),
        (["--model", "BERT-Large", "--steps", "10", "--deadline", "soon"], "cannot read duration"),
        # a bare number is ambiguous (60 hours, or a 60-day deadline typed without its unit): refused
        (["--model", "BERT-Large", "--steps", "10", "--deadline", "60"], "--deadline: 60 has no unit"),
        (
            ["--model", "BERT-Large", "--steps", "10", "--deadline", "1d", "--budget", "-5"],
            "--budget: expected a finite positive number, got -5",  # as report's --budget says it
        ),
    ],
)
def test_plan_bad_input(runner, args, match):
    r = runner.invoke(app, ["plan", *args])
    assert r.exit_code == 2 and match in r.output


def _option(optimizer, cost, band=None, offload=None):
    row = {
        "optimizer": optimizer,
        "cost": cost,
        "ttt_h": cost / 100,
        "cluster": "8 x A100-80GB",
        "speedup": None,
    }
    if band is not None:
        row["ttt_p10_h"], row["ttt_p90_h"] = row["ttt_h"] * (1 - band), row["ttt_h"] * (1 + band)
    if offload:
        row["offload"] = offload
    return row


@pytest.mark.parametrize("band", [None, 0.05])
def test_plan_keeps_the_simpler_option_when_the_gain_is_within_one_percent(band):
    adam, onebit = _option("adam", 1000.0, band), _option("onebit-adam", 992.0, band)  # 0.8% cheaper
    rec = analysis.recommendation([onebit, adam], deadline_h=100)
    assert rec["chosen"] is adam
    assert any("equivalent" in line and "0.8% less" in line for line in rec["text"]), rec["text"]
    assert rec["text"][0].startswith("Recommended: adam ")


def test_plan_switches_when_the_gain_is_real():
    adam, onebit = _option("adam", 1000.0, 0.05), _option("onebit-adam", 900.0, 0.05)  # 10% cheaper
    assert analysis.recommendation([adam, onebit])["chosen"] is onebit
    # 1% cheaper, but the bands are narrow and do not overlap: the saving is outside the uncertainty
    adam, onebit = _option("adam", 1000.0, 0.001), _option("onebit-adam", 990.0, 0.001)
    assert analysis.recommendation([adam, onebit])["chosen"] is onebit


def test_plan_prefers_no_offload_when_equivalent():
    plain, offloaded = _option("adam", 1000.0), _option("adam", 985.0, offload="zero")
    assert analysis.recommendation([offloaded, plain])["chosen"] is plain
    assert analysis.complexity(offloaded) > analysis.complexity(plain) == (0, 0, 0)


def test_figures_colours_ticks_and_header(results):
    from clustersim.report.build import build_report, render_html

    meta, rows_ok, sections, failed = build_report(results, None, 3.0)
    figs = sections[0].figs
    speed = figs["speedup"]
    colour_of: dict[str, set] = {}
    dash_of: dict[str, set] = {}
    for t in (t for t in speed.data if not t.showlegend):  # lines; the legend names each optimizer once
        opt, net = t.name.split(" · ")[:2]
        colour_of.setdefault(opt, set()).add(t.line.color)
        dash_of.setdefault(net, set()).add(t.line.dash)
    assert set(colour_of) == {"onebit-adam", "binsgdm"}  # adam, the baseline, is the 1x line
    assert all(len(c) == 1 for c in colour_of.values())  # one colour per optimizer ...
    assert len({next(iter(c)) for c in colour_of.values()}) == 2  # ... none repeated
    assert all(len(d) == 1 for d in dash_of.values()) and len({next(iter(d)) for d in dash_of.values()}) == 2
    assert list(speed.layout.xaxis.tickvals) == [8, 32, 128]  # ticks at the swept GPU counts
    for fig in figs.values():  # the legend sits right of the plot, the title top left: no overlap
        assert fig.layout.legend.x >= 1 and fig.layout.title.x == 0
    by_opt = {t.name.split(" ")[0]: t.marker.color for t in figs["bytes"].data}
    assert all(by_opt[o] == next(iter(colour_of[o])) for o in colour_of)  # same optimizer, same colour
    assert figs["bytes"].layout.yaxis.title.text == "GiB per step"
    phase = {t.name: t.marker.color for t in figs["breakdown"].data}
    timeline = {t.name: t.marker.color for t in figs["timeline"].data}
    assert {"forward", "backward"} <= set(timeline)
    for name in ("forward", "backward", "optimizer"):
        assert phase[name] == timeline[name]  # one colour per phase in every figure
    assert phase["exposed communication"] == timeline["communication"]
    assert any(t.name.startswith("Pareto frontier") for t in figs["cost"].data)
    assert figs["cost"].layout.annotations[0].text == "1"  # numbered as in the Pareto table
    html = render_html(meta, rows_ok, sections, failed, 3.0)
    model = rows_ok[0]["model"]
    header = f"Model {model} · GPU {rows_ok[0]['gpu']} · global batch 1,024 samples · micro-batch "
    assert header in html and "· calibration: none" in html
    # the recipe is in the header: two sweeps of one model and cluster on other recipes read differently
    line = html[html.index(header) :].split("· calibration")[0]
    assert "precision " in line and "execution " in line


def test_report_labels_each_rows_layout(tmp_path):
    """A sweep over training.sharding.stage (or training.parallelism.*): the report's rows, and so its
    recommendation, name each row's layout, and a baseline is compared within its own layout (no
    'adam ... faster than adam' between a ZeRO-3 row and a DDP row of the same cluster)."""
    from clustersim.report.build import build_report

    sweep = {
        "name": "layouts",
        "base": "preset:default",
        "vary": {"gpus": [8, 32], "training.sharding.stage": [0, 3]},
        "steps": 1000,
        "global_batch": 256,
        "samples": 0,
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    run_sweep(load_sweep(tmp_path / "s.yaml"), tmp_path / "out")
    _meta, rows_ok, _sections, _failed = build_report(tmp_path / "out", None, 3.0)
    assert len(rows_ok) == 4
    for r in rows_ok:
        assert ("ZeRO-3" in r["cluster"]) == (r["training.sharding.stage"] == 3), r["cluster"]
        assert r["baseline"] is r or r["baseline"]["cluster"] == r["cluster"]
    assert len({r["cluster"] for r in rows_ok}) == 4


def test_short_times_to_train_read_in_minutes_not_zero_hours():
    assert analysis._hours(0.04) == "2.4 min" and analysis._hours(2.0) == "2.0 h"
    rows = [
        {"optimizer": "adam", "cluster": "8 x A100", "ttt_h": 0.02, "cost": 1.0},
        {"optimizer": "sgdm", "cluster": "8 x A100", "ttt_h": 0.03, "cost": 2.0},
    ]
    text = " ".join(analysis.recommendation(rows)["text"])
    assert "0.0 h" not in text and "1.2 min" in text


def test_rows_that_differ_only_in_network_backend_say_which():
    rows = [
        {"optimizer": "adam", "cluster": "8 x A100, InfiniBand 200 Gb/s", "training.network": n}
        for n in ("analytical", "flow")
    ]
    analysis._disambiguate(rows)
    assert rows[0]["cluster"] != rows[1]["cluster"] and "flow network backend" in rows[1]["cluster"]


def test_a_much_sooner_option_at_about_the_same_cost_is_named():
    """The cheapest option can take twice as long as one 1% dearer (twice the GPUs, the same GPU-hours):
    the recommendation names the sooner one beside it, and not one that saves little time or costs more
    than the model's uncertainty."""
    cheap = _option("adam", 1000.0) | {"ttt_h": 380.0, "cluster": "16 x H100"}
    sooner = _option("adam", 1009.0) | {"ttt_h": 190.0, "cluster": "32 x H100"}
    dear = _option("adam", 1100.0) | {"ttt_h": 30.0, "cluster": "256 x H100"}
    text = analysis.recommendation([cheap, sooner, dear], deadline_h=720)["text"]
    assert text[0].startswith("Recommended: adam on 16 x H100")
    assert text[1] == (
        "Sooner for about the same cost: adam on 32 x H100, 190.0 h (2.0x sooner) for 0.9% more ($1,009)."
    )
    slightly = _option("adam", 1009.0) | {"ttt_h": 300.0, "cluster": "20 x H100"}  # 21% sooner: not named
    text = analysis.recommendation([cheap, slightly, dear], deadline_h=720)["text"]
    assert not any(line.startswith("Sooner") for line in text)


def test_a_node_with_several_nics_says_how_many():
    """8 x 400 Gb/s per node is not 1 x 400 Gb/s: the label says so; one NIC (and rows of results
    written before the count was recorded) keep the short label."""
    row = {"nic_kind": "infiniband", "nic_gbps": 400.0, "nic_effective_gbps": None}
    assert analysis.network_label(row | {"nic_count": 8}) == "InfiniBand 8 x 400 Gb/s"
    assert analysis.network_label(row | {"nic_count": 1}) == "InfiniBand 400 Gb/s"
    assert analysis.network_label(row) == "InfiniBand 400 Gb/s"


def test_rows_of_different_global_batches_are_not_ranked_against_each_other(tmp_path):
    """A sweep without `global_batch` keeps each GPU's micro-batch, so 32 GPUs train twice the samples
    per step of 16: equal steps are not equal training, and the 16-GPU row looked cheaper and as fast.
    The report refuses to pick across them, says why and names the sweep key that fixes it; with the
    batch fixed it recommends as before."""
    from clustersim.report.build import _section_html, build_report

    sweep = {
        "name": "mixed",
        "base": "preset:default",
        "vary": {"gpus": [16, 32], "optimizer": ["adam", "binsgdm"]},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    run_sweep(load_sweep(tmp_path / "s.yaml"), tmp_path / "out")
    _, _, sections, _ = build_report(tmp_path / "out", price=3.0, samples=0)
    rec = sections[0].rec
    assert rec["chosen"] is None
    first = rec["text"][0]
    assert first.startswith("No recommendation across these rows: they train different global batches")
    assert "256 at 16 GPUs; 512 at 32 GPUs" in first and "`global_batch`" in first
    assert not any(line.startswith(("Recommended", "Fastest")) for line in rec["text"])
    assert any(line.startswith("binsgdm vs adam: speedup") for line in rec["text"])  # like with like
    page = _section_html(sections[0], 1, False)
    assert "These rows train different global batches" in page  # the Pareto table says so too

    fixed = {**sweep, "global_batch": 512}
    (tmp_path / "f.yaml").write_text(yaml.safe_dump(fixed))
    run_sweep(load_sweep(tmp_path / "f.yaml"), tmp_path / "fixed")
    _, _, sections, _ = build_report(tmp_path / "fixed", price=3.0, samples=0)
    assert sections[0].rec["chosen"] is not None
    assert sections[0].rec["text"][0].startswith("Recommended: ")
    assert "different global batches" not in _section_html(sections[0], 1, False)


def test_mixed_batches_ignores_rows_without_a_batch_and_lists_each_batch_once():
    rows = [
        _option("adam", 1.0) | {"world_size": n, "global_batch": b} for n, b in ((8, 64), (16, 128), (4, 64))
    ]
    text = analysis.mixed_batches(rows)
    assert "64 at 4, 8 GPUs; 128 at 16 GPUs" in text
    assert analysis.mixed_batches(rows[:1] + [_option("adam", 2.0)]) is None


def test_the_per_network_table_shows_a_tie_kept_for_the_simpler_optimizer_as_a_tie():
    """adam kept over a binsgdm 0.8% cheaper (the 3% rule) read as "cheapest optimizer: adam": the cell
    names the cheaper one it ties with and by how much, the header states the rule."""
    from clustersim.report.build import Section, _by_network_html

    where = {"network": "InfiniBand 200 Gb/s", "world_size": 16, "gpu": "A100-80GB", "nic_kind": "infiniband"}
    adam, binsgdm = _option("adam", 1000.0) | where, _option("binsgdm", 992.0) | where
    clear = _option("adam", 1000.0) | where | {"world_size": 32}
    cells = analysis.by_network([adam, binsgdm, clear])
    assert cells[0]["best"] is adam and cells[0]["tie_with"] is binsgdm
    assert cells[1]["tie_with"] is None
    assert analysis.tie_text(cells[0]) == "adam (tie: binsgdm 0.8% cheaper, within 3%)"
    assert analysis.tie_text(cells[1]) == "adam"
    page = _by_network_html(Section("BERT-Large", [adam, binsgdm, clear], {}, {}, table=cells))
    assert "cheapest optimizer (within 3%: the simpler)" in page
    assert "adam (tie: binsgdm 0.8% cheaper, within 3%)" in page


def test_the_terminal_table_marks_a_tie():
    from rich.console import Console

    from clustersim.commands.planning import _by_network_table

    cell = {"network": "InfiniBand 200 Gb/s", "gpus": 16, "optimizer": "adam", "tie_with": "binsgdm"}
    cell |= {"speedup": None, "speedup_p10": None, "ttt_h": 10.0, "cost": 1000.0}
    console = Console(width=100, record=True)
    console.print(_by_network_table("BERT-Large", [cell, cell | {"tie_with": None, "gpus": 32}]))
    text = console.export_text()
    assert "(a ~ b: a kept, b cheaper by under 3%)" in text and "adam ~ binsgdm" in text
    assert text.count("~ binsgdm") == 1
    console = Console(width=100, record=True)
    console.print(_by_network_table("BERT-Large", [cell | {"tie_with": None}]))
    assert "~" not in console.export_text()  # no tie, no rule to explain


def test_a_cheaper_option_that_also_trains_sooner_is_not_equivalent_to_the_simpler_one():
    """The 3% rule keeps the simpler of two options of about the same cost; one that costs a little
    less and trains twice as fast is better, not a tie (a plan kept 32 B200 at 146 h over 64 B200 at
    71 h for 1.9% less)."""
    from clustersim.report.analysis import equivalent

    simpler = {"cost": 12_619.0, "ttt_h": 146.2}
    assert not equivalent(simpler, {"cost": 12_382.0, "ttt_h": 71.7})  # cheaper and 2x sooner
    assert equivalent(simpler, {"cost": 12_382.0, "ttt_h": 143.0})  # cheaper by 1.9%, 2.2% sooner
    assert not equivalent(simpler, {"cost": 12_000.0, "ttt_h": 146.2})  # 4.9% cheaper
