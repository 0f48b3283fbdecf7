"""What plan, report and compare print: the option the user gave, one number format, no silent cuts."""

from __future__ import annotations

import json

import pytest

from clustersim.cli import app
from clustersim.planner.breakeven import BreakEven, gbps_text, span_text
from tests.test_planner_report import _candidates_file as _candidates


def test_tokens_override_note_names_tokens_not_steps(runner, tmp_path):
    """`plan --tokens 1e9 --candidates FILE` said "--steps overrides the candidates file's steps"."""
    cand = _candidates(tmp_path, ["adam"], global_batch=512, steps=3000)
    args = ["plan", "--model", "BERT-Large", "--deadline", "30d", "--candidates", str(cand)]
    args += ["--samples", "0", "--price", "3", "--json"]
    d = json.loads(runner.invoke(app, [*args, "--tokens", "1e9"]).stdout)
    assert "--tokens overrides the candidates file's steps (3,000)" in d["recipe_notes"]
    assert not any(n.startswith("--steps") for n in d["recipe_notes"])
    d = json.loads(runner.invoke(app, [*args, "--steps", "4000"]).stdout)
    assert "--steps overrides the candidates file's steps (3,000)" in d["recipe_notes"]


def test_a_global_batch_no_candidate_can_split_names_the_option(runner, tmp_path):
    """`plan --global-batch 3` failed with "global_batch: ...", the file key, not the option given."""
    cand = _candidates(tmp_path, ["adam"], global_batch=512, steps=3000)
    args = ["plan", "--model", "BERT-Large", "--deadline", "30d", "--candidates", str(cand)]
    args += ["--samples", "0", "--price", "3"]
    r = runner.invoke(app, [*args, "--global-batch", "3"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "--global-batch: none of the" in r.output and "global_batch:" not in r.output
    bad = tmp_path / "bad.yaml"  # the file's own key is still named as the key
    bad.write_text(cand.read_text().replace("global_batch: 512", "global_batch: 3"))
    r = runner.invoke(app, [*args[:6], str(bad), *args[7:]])
    assert r.exit_code == 2 and "global_batch: global batch 3" in r.output


def test_one_rank_is_singular(runner):
    r = runner.invoke(
        app,
        ["run", "preset:default", "--set", "cluster.nodes=1", "--set", "cluster.gpus_per_node=1"]
        + ["--set", "training.sharding.stage=3"],
    )
    assert r.exit_code == 0, r.output
    assert "over 1 rank," in r.output and "over 1 ranks" not in r.output


@pytest.mark.parametrize(
    ("gbps", "text"),
    [(66.04840977593088, "66.0"), (66.06, "66.1"), (80.0, "80.0"), (5.0, "5.00"), (213.4, "213")],
)
def test_break_even_rates_in_three_significant_figures(gbps, text):
    """compare printed "below 66 Gb/s" where report printed "66.1": one format, three figures."""
    assert gbps_text(gbps) == text
    found = BreakEven("onebit-adam", "adam", gbps, "crossing", gpus=64, steps=1000)
    assert f"below {text} Gb/s" in found.describe()  # compare and the API
    assert f"below {text} Gb/s" in span_text([found])  # report and plan


TEAM = {
    "name": "team",
    "cluster": {
        "nodes": 4,
        "gpus_per_node": 8,
        "gpu": "A100-40GB",
        "intra_node": {"fabric": "nvswitch"},
        "nic": {"kind": "ethernet_tcp", "count": 1, "line_rate_gbps": 25},
        "fabric": {"kind": "single_switch"},
    },
    "workload": {"model": "BERT-Large", "micro_batch": 16, "precision": "fp16", "pointwise": "fused"},
    "training": {"optimizer": "adam", "overlap": True},
}
OPTIMIZERS = ["adam", "onebit-adam", "zero-one-adam", "binsgdm"]


@pytest.fixture(scope="module")
def team_results(tmp_path_factory):
    """The team sweep of the planning guide, small: 16 and 32 GPUs, 25 and 100 GbE, the four
    optimizers; GPT-2 1.5B's 0/1 Adam replicas do not fit an A100-40GB."""
    from tests.conftest import swept_results

    spec = {
        "name": "team-small",
        "base": TEAM,
        "vary": {
            "model": ["BERT-Large", "GPT-2-1.5B"],
            "gpus": [16, 32],
            "nic_gbps": [25, 100],
            "optimizer": OPTIMIZERS,
        },
        "steps": 1000,
        "global_batch": 4096,
        "samples": 2,
    }
    return swept_results(tmp_path_factory, "team", spec)


@pytest.mark.parametrize("deadline_h", [None, 1.0])
def test_a_report_names_every_optimizer_the_sweep_ran(team_results, deadline_h):
    """The report cut its bullets at six: 0/1 Adam was never mentioned, and for GPT-2 neither 1-bit nor
    0/1 Adam (the latter ran out of memory on every row, which was not said either)."""
    from clustersim.report.build import build_report

    _, _, sections, _ = build_report(team_results, None, deadline_h=deadline_h)
    assert [s.model for s in sections] == ["BERT-Large", "GPT-2-1.5B"]
    for sec in sections:
        text = sec.rec["text"]
        for opt in OPTIMIZERS[1:]:
            said = [line for line in text if line.startswith((f"{opt} vs adam:", f"{opt}: none of its"))]
            assert len(said) == 1, (sec.model, opt, text)
    gpt2 = sections[1].rec["text"]
    assert any(line.startswith("zero-one-adam: none of its 4 rows ran") for line in gpt2), gpt2


def _owned(cluster: str, hours: float, cost: float, capital: float, layout: str = "DP", band=None):
    """A plan row priced by the owned model: its run's share of ``capital`` plus a little power."""
    row = {
        "optimizer": "adam",
        "cluster": cluster,
        "layout": layout,
        "ttt_h": hours,
        "cost": cost,
        "cost_model": "own",
        "capital": capital,
        "outlay": capital + 0.01 * cost,
        "speedup": None,
    }
    if band is not None:
        row["ttt_p10_h"], row["ttt_p90_h"] = band
    return row


def test_fastest_meets_the_budget_and_names_the_faster_one_over_it():
    """GPT-3 13B with $3M and 30 days printed "Fastest: adam on 1024 x B200 (36.0 h, $99,534)": its
    capital of $65M was 22 times the budget. The fastest is the fastest within the budget; the faster
    one over it is named in a clause with its capital."""
    from clustersim.report import analysis

    small = _owned("8 x B200", 650.0, 13_962.0, 505_400.0)
    mid = _owned("64 x H200", 186.6, 19_619.0, 2_427_864.0)
    huge = _owned("1024 x B200", 36.0, 99_534.0, 65_085_824.0)
    text = analysis.recommendation([small, mid, huge], deadline_h=720.0, budget=3_000_000.0)["text"]
    (line,) = [x for x in text if x.startswith("Fastest")]
    assert line.startswith(
        "Fastest within the budget: adam on 64 x H200 (186.6 h, $19,619, capital $2,427,864)"
    )
    assert "faster over budget: adam on 1024 x B200 (36.0 h, capital $65,085,824 plus $995 power" in line
    assert line.endswith("against the $3,000,000 budget).")
    # within the budget, the fastest of all is named as before, with its capital
    text = analysis.recommendation([small, mid, huge], deadline_h=720.0, budget=None)["text"]
    assert "Fastest: adam on 1024 x B200 (36.0 h, $99,534, capital $65,085,824)." in text


def test_sooner_for_about_the_same_cost_shows_an_owned_clusters_capital():
    """ "Sooner ... for 3.0% more" hid a cluster that costs twice as much to buy."""
    from clustersim.report import analysis

    slow = _owned("8 x B200", 650.5, 13_962.0, 505_400.0)
    sooner = _owned("16 x B200", 333.2, 14_380.0, 1_016_966.0)
    text = analysis.recommendation([slow, sooner], deadline_h=720.0)["text"]
    assert text[1].endswith("for 3.0% more ($14,380; capital $1,016,966 against the choice's $505,400).")


def test_the_risk_line_reads_the_bands_drawn_after_choosing():
    """plan chose, wrote "none of the 6 options given a band keeps its P90 within it", then drew the
    runners-up's bands: one of them (P90 441.8 h) was within the 720 h deadline. Told again with the
    final bands (retold), the risk line names it; an option over budget is never the way out."""
    from clustersim.report import analysis

    chosen = _owned("8 x B200", 650.5, 13_962.0, 505_400.0, band=(470.9, 881.9))
    sooner = _owned("16 x B200", 333.2, 14_380.0, 1_016_966.0)
    dear = _owned("1024 x B200", 36.0, 99_534.0, 65_085_824.0, band=(30.0, 40.0))
    rows = [chosen, sooner, dear]
    rec = analysis.recommendation(rows, deadline_h=720.0, budget=3_000_000.0)
    (risk,) = [x for x in rec["text"] if x.startswith("Risk:")]
    assert "no other has a band that keeps its P90 within it" in risk and "1024 x B200" not in risk
    sooner["ttt_p10_h"], sooner["ttt_p90_h"] = 251.1, 441.8  # the runner-up's band, drawn later
    again = analysis.retold(rec, rows, deadline_h=720.0, budget=3_000_000.0)
    assert again["chosen"] is chosen
    (risk,) = [x for x in again["text"] if x.startswith("Risk:")]
    assert "adam on 16 x B200 keeps its P90 within it (441.8 h, $14,380)" in risk


def test_runners_up_equivalent_under_the_simpler_rule_say_so():
    """GPT-3 175B: four runners-up each cheaper and faster than the choice, with no word why; each is
    within 3% and the bands, and interleaved, so the simpler choice is kept, as the table now says."""
    from clustersim.commands.planning import _versus
    from clustersim.report import analysis

    chosen = _owned("64 x B200", 737.8, 127_369.0, 4e6, "TP1·PP16·DP4", band=(540.2, 996.5))
    inter = _owned("64 x B200", 717.2, 123_821.0, 4e6, "TP1·PP16·DP4, interleaved v3", band=(521.7, 969.1))
    note = "equivalent (within 3%), more complex: interleaved"
    assert analysis.kept_simpler_note(chosen, inter) == note
    cells, notes = _versus([inter, dict(inter, cost=130_000.0)], chosen)
    assert cells == ["$3,548 (2.8%) less, 20.6 h faster *", "$2,631 (2.1%) more, 20.6 h faster"]
    assert notes == [f"* {note}; the simpler choice is kept"]
    dearer = dict(inter, cost=130_000.0)  # not cheaper: no rule to explain
    assert analysis.kept_simpler_note(chosen, dearer) is None
    simpler = dict(inter, layout="DP")  # not more complex
    assert analysis.kept_simpler_note(chosen, simpler) is None
    much = dict(inter, cost=110_000.0)  # saves more than 3%: better, not equivalent
    assert analysis.kept_simpler_note(chosen, much) is None
    zero = _owned("8 x B200", 631.8, 13_560.0, 5e5, "TP1·PP2·DP4")
    assert analysis.kept_simpler_note(_owned("8 x B200", 650.5, 13_962.0, 5e5, "ZeRO-1"), zero) == (
        "equivalent (within 3%), more complex: tensor/pipeline parallel"
    )


def test_plan_json_flags_the_runners_up_the_table_marks_equivalent():
    """`plan --json` gave the runners-up without the table's "*": a script saw four cheaper, faster
    options and no word that each is equivalent to the choice and more complex. Each runner-up now says
    so (kept_simpler, and the footnote's sentence as kept_simpler_reason) and the JSON still dumps."""
    from clustersim.commands.planning import _versus
    from clustersim.planner.planning import plan_as_json

    chosen = _owned("64 x B200", 737.8, 127_369.0, 4e6, "TP1·PP16·DP4", band=(540.2, 996.5))
    inter = _owned("64 x B200", 717.2, 123_821.0, 4e6, "TP1·PP16·DP4, interleaved v3", band=(521.7, 969.1))
    dearer = dict(inter, cost=130_000.0)
    result = {"chosen": chosen, "runners_up": [inter, dearer], "fastest": inter, "fastest_within": inter}
    d = json.loads(json.dumps(plan_as_json(result)))
    first, second = d["runners_up"]
    _, footnotes = _versus([inter, dearer], chosen)
    assert first["kept_simpler"] is True
    assert footnotes == [f"* {first['kept_simpler_reason']}"]  # the console's words, without the mark
    assert first["kept_simpler_reason"] == (
        "equivalent (within 3%), more complex: interleaved; the simpler choice is kept"
    )
    assert second["kept_simpler"] is False and second["kept_simpler_reason"] is None
    assert "kept_simpler" not in d["chosen"] and "kept_simpler" not in d["fastest"]
    nothing = plan_as_json({"chosen": None, "runners_up": [], "fastest": None, "fastest_within": None})
    assert nothing["runners_up"] == []
