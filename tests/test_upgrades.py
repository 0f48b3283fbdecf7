"""`plan --have`: the owned cluster's options, their capital, time to train and payback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clustersim.cli import app
from clustersim.planner.upgrades import _payback, capital, load_have, options
from clustersim.report.costing import cost_model
from clustersim.scenario import load_scenario

TEAM = "examples/team-a100-40gb-25gbe.yaml"


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def test_options_and_their_capital_by_hand():
    have = load_scenario(TEAM)
    own, rent = cost_model("own"), cost_model("rent")
    opts = options(have, rent, own.network)
    kinds = [o["option"] for o in opts]
    assert kinds[0] == "keep" and "upgrade NICs" in kinds and "add nodes" in kinds and "rent" in kinds
    by_what = {o["what"]: o for o in opts}
    assert capital(own, have, by_what["to 100 Gb/s Ethernet per node"]) == pytest.approx(
        16 * (713 + 330 + 372)
    )
    assert capital(own, have, by_what["to 200 Gb/s InfiniBand per node"]) == pytest.approx(
        16 * (925 + 660 + 458)
    )
    # adding 16 nodes buys 16 DGX A100 (less adapters) and 16 more 25 GbE ports
    assert capital(own, have, by_what["16 more nodes"]) == pytest.approx(16 * (192_600 + 423 + 83 + 246))
    assert capital(own, have, opts[0]) == 0.0
    assert {o["instance"] for o in opts if o["option"] == "rent"} == {"p4d.24xlarge", "Standard_ND96asr_v4"}
    assert not any("25 Gb/s" in o["what"] for o in opts if o["option"] == "upgrade NICs")  # only faster
    # the A100's PCIe Gen4 x16 link (25 GB/s) caps what a NIC past ~200 Gb/s delivers: said
    # on the upgrades whose line rate is past it, and only on those
    capped = {o["what"] for o in opts if o.get("pcie_capped")}
    assert capped == {"to 400 Gb/s Ethernet per node", "to 400 Gb/s InfiniBand per node"}
    assert (
        "past 208 Gb/s line rate the NIC's PCIe Gen4 link"
        in by_what["to 400 Gb/s InfiniBand per node"]["pcie_capped"]
    )


class _Kept:
    """The kept cluster as _payback reads it: worth $100 an hour."""

    per_hour = 100.0


def test_payback_by_hand():
    """An upgrade of $24,000 saving 2 h of a 20 h run on a cluster worth $100/h: $200 saved per run, 120
    runs, each 18 h at the new speed: 90 days of training. Power the option adds comes off the saving."""
    rows = [
        {"option": "keep", "ttt_h": 20.0, "capital": 0.0, "power_per_h": 10.0},
        {"option": "upgrade NICs", "ttt_h": 18.0, "capital": 24_000.0, "power_per_h": 10.0},
        {"option": "add nodes", "ttt_h": 19.0, "capital": 1_000.0, "power_per_h": 30.0},
        {"option": "rent", "ttt_h": 10.0, "capital": 0.0, "power_per_h": 0.0},
    ]
    _payback(rows, _Kept())
    up, more, rented = rows[1], rows[2], rows[3]
    assert up["saved_h"] == 2.0 and up["payback_runs"] == pytest.approx(120.0)
    assert up["payback_days"] == pytest.approx(120 * 18 / 24)
    # 1 h x $100 saved, 19 h x $20 more power: it never pays back
    assert more["payback_days"] is None and more["never_pays_back"]
    assert rented["payback_days"] is None and rented["saved_h"] == 10.0


@pytest.mark.parametrize("speedup", [2.0, 1.6, 1.2])
def test_adding_nodes_pays_back_by_the_closed_form(speedup):
    """Doubling an owned cluster of capital C (amortised A = C / L per hour over L hours of life, power P
    per hour) that trains a run in T h in t = T / speedup: one run saves (T - t)(A + P) - t P, so the
    payback is C / that runs, and runs x t / 24 days. Perfect scaling (t = T/2) pays back in exactly the
    life, L / 24 days (the same hardware, valued at its own cost); worse scaling takes longer, so the
    payback is not the amortisation period whatever the speedup."""
    C, L, P, T = 3_093_632.0, 3 * 8766.0, 16 * 6.5 * 1.58 * 0.1194, 59.6
    A = C / L

    class Kept:
        per_hour = A + P

    t = T / speedup
    rows = [
        {"option": "keep", "ttt_h": T, "capital": 0.0, "power_per_h": P},
        {"option": "add nodes", "ttt_h": t, "capital": C, "power_per_h": 2 * P},
    ]
    _payback(rows, Kept())
    more = rows[1]
    saving = (T - t) * (A + P) - t * P
    if saving <= 0:
        assert more["never_pays_back"]
        return
    assert more["payback_runs"] == pytest.approx(C / saving)
    assert more["payback_days"] == pytest.approx(more["payback_runs"] * t / 24)
    if speedup == 2.0:
        assert more["payback_days"] == pytest.approx(L / 24)
    else:
        assert more["payback_days"] > L / 24 * 1.01


def test_plan_have_prints_every_option_with_its_capital_and_payback(runner):
    args = ["plan", "--model", "BERT-Large", "--steps", "20000", "--deadline", "30d", "--samples", "2"]
    r = runner.invoke(app, [*args, "--have", TEAM])
    assert r.exit_code == 0, r.output
    for word in ("keep", "upgrade NICs", "add nodes", "rent", "$22,640", "$32,688", "p4d.24xlarge"):
        assert word in r.stdout
    d = json.loads(runner.invoke(app, [*args, "--have", TEAM, "--json"]).stdout)
    rows = d["options"]
    keep = next(o for o in rows if o["option"] == "keep")
    for o in rows:
        assert o["ttt_h"] > 0 and o["run_cost"] > 0 and o["capital"] >= 0
        assert (
            o["ttt_p10_h"] <= o["ttt_h"] <= o["ttt_p90_h"]
            and o["run_cost_p10"] <= o["run_cost"] <= o["run_cost_p90"]
        )
        if o["option"] == "upgrade NICs":  # more bandwidth is never slower (each option's fastest optimizer)
            assert o["ttt_h"] <= keep["ttt_h"] * (1 + 1e-9)
            assert o["cost_basis"].startswith("owned: $")
        if o["option"] == "rent":
            assert o["cost_basis"].startswith("rented at $") and o["payback_days"] is None


@pytest.mark.parametrize(
    ("content", "key"),
    [
        ({"name": "x"}, "cluster"),
        (
            {"cluster": {"nodes": 4, "gpus_per_node": 8, "gpu": "A100-40GB", "nic": {"kind": "ib"}}},
            "cluster.nic.kind",
        ),
        ({"cluster": {"nodes": -1, "gpus_per_node": 8, "gpu": "A100-40GB"}}, "cluster.nodes"),
    ],
)
def test_a_malformed_have_file_is_one_line_naming_file_and_key(runner, tmp_path, content, key):
    path = tmp_path / "have.yaml"
    path.write_text(yaml.safe_dump(content))
    r = runner.invoke(
        app, ["plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d", "--have", str(path)]
    )
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert str(path) in r.output and key in r.output and len(r.output.strip().splitlines()) == 1


def test_load_have_keeps_the_plan_base_but_the_cluster_and_the_teams_code(tmp_path):
    base = load_scenario("preset:default").with_changes(**{"workload.model": "GPT-2-1.5B"})
    path = tmp_path / "have.yaml"
    path.write_text(yaml.safe_dump({"cluster": yaml.safe_load(Path(TEAM).read_text())["cluster"]}))
    have = load_have(path, base)
    assert have.cluster.gpu == "A100-40GB" and have.cluster.nodes == 16
    assert have.workload.model == base.workload.model and have.workload.precision == base.workload.precision
    team = load_have(Path(TEAM), base)  # its workload: the team's kernels and precision, --model's model
    assert team.workload.model == "GPT-2-1.5B" and team.workload.pointwise == "fused"
    assert team.workload.precision == "fp16" and team.workload.micro_batch == 16


def test_options_that_miss_the_deadline_are_marked(runner):
    args = ["plan", "--model", "GPT-2-1.5B", "--steps", "100000", "--global-batch", "4096", "--samples", "0"]
    r = runner.invoke(app, [*args, "--deadline", "40h", "--have", TEAM])
    assert r.exit_code == 0, r.output
    marked = [line for line in r.stdout.splitlines() if line.split()[:2] in (["keep", "*"], ["add", "nodes"])]
    assert any(line.startswith("keep *") for line in marked)  # 59.6 h: past 40 h
    assert any(line.startswith("add nodes ") and " * " not in line for line in marked)  # 32.5 h meets it
    assert "* misses the deadline" in r.stdout and "or the budget" not in r.stdout  # no --budget given


def test_plan_have_takes_tokens_as_plan_does(runner):
    """`plan --tokens 300e9 --have ...` stopped with '--have takes --steps': the owned cluster's options
    now train the steps that many tokens need, tokens / (global batch x seq_len), rounded up."""
    args = ["plan", "--model", "BERT-Large", "--deadline", "30d", "--samples", "0", "--global-batch", "4096"]
    r = runner.invoke(app, [*args, "--tokens", "1e9", "--have", TEAM])
    assert r.exit_code == 0, r.output
    steps = -(-(10**9) // (4096 * 128))  # BERT-Large's sequence of 128 tokens: 1,908 steps
    assert f"BERT-Large, {steps:,} steps of 4,096 samples" in r.stdout
    assert f"1,000,000,000 tokens = {steps:,} steps x 4,096 samples x 128 tokens per sample" in r.stdout
    by_steps = runner.invoke(app, [*args, "--steps", str(steps), "--have", TEAM, "--json"])
    by_tokens = runner.invoke(app, [*args, "--tokens", "1e9", "--have", TEAM, "--json"])
    a, b = json.loads(by_steps.stdout), json.loads(by_tokens.stdout)
    assert b["steps"] == steps and [o["ttt_h"] for o in a["options"]] == [o["ttt_h"] for o in b["options"]]
    both = runner.invoke(app, [*args, "--tokens", "1e9", "--steps", "100", "--have", TEAM])
    assert both.exit_code == 2 and "--tokens" in both.output and "Traceback" not in both.output


def test_have_refuses_a_cost_option_it_would_ignore():
    """`plan --have` prices each option by its own model: --cost, --price and --instance would change
    nothing, so each is refused in one line naming it, before any work."""
    from typer.testing import CliRunner

    from clustersim.cli import app

    args = ["plan", "--model", "GPT-2-1.5B", "--steps", "1000", "--deadline", "30d", "--samples", "0"]
    args += ["--have", "examples/team-a100-40gb-25gbe.yaml"]
    for extra in (["--cost", "rent"], ["--cost", "own"], ["--price", "2"], ["--instance", "p4d.24xlarge"]):
        r = CliRunner().invoke(app, [*args, *extra])
        assert r.exit_code == 2 and r.stdout == "", extra
        assert f"{extra[0]} does not apply" in r.stderr and "Traceback" not in r.output


def test_a_payback_longer_than_the_hardwares_life_is_marked():
    """An option whose payback takes more days of training than the amortisation life holds is written off
    before it pays for itself: marked, and the table says so."""
    from clustersim.commands.planning import _have_table

    rows = [
        {"option": "keep", "ttt_h": 20.0, "capital": 0.0, "power_per_h": 10.0},
        {"option": "upgrade NICs", "ttt_h": 18.0, "capital": 24_000.0, "power_per_h": 10.0},
    ]
    _payback(rows, _Kept(), life_days=100.0)
    assert rows[1]["payback_days"] == pytest.approx(90.0) and not rows[1]["payback_beyond_life"]
    _payback(rows, _Kept(), life_days=80.0)
    assert rows[1]["payback_beyond_life"]
    for r in rows:
        r.update(
            what="", optimizer="adam", layout="", run_cost=0.0, run_cost_p10=0.0, run_cost_p90=0.0, meets=True
        )
    cols, body = _have_table(rows)
    assert any("past its life" in str(cell) for line in body for cell in line)


def test_an_owned_options_budget_spend_counts_the_runs_power():
    """--budget is held against what an option asks to spend, as plan holds it: an owned option's
    capital and the run's power (keeping the cluster still pays for its power), a rental's rent."""
    from clustersim.planner.upgrades import spend

    keep = {"option": "keep", "capital": 0.0, "ttt_h": 10.0, "power_per_h": 100.0, "run_cost": 5_000.0}
    nics = {
        "option": "upgrade NICs",
        "capital": 20_000.0,
        "ttt_h": 8.0,
        "power_per_h": 100.0,
        "run_cost": 1.0,
    }
    rent = {"option": "rent", "capital": 0.0, "ttt_h": 5.0, "power_per_h": 0.0, "run_cost": 3_000.0}
    assert spend(keep) == 1_000.0 and spend(nics) == 20_800.0 and spend(rent) == 3_000.0


def test_have_times_each_optimizer_at_its_own_steps():
    """`plan --have --steps adam=100000,binsgdm=300000` timed every option at 300,000 steps (a rented Adam
    run three times as long as it is) and kept BinSGDM where Adam at its own count wins. Each option's
    hours are now its optimizer's own count x its mean step: what that optimizer alone gives on that
    option at that count, as `plan` and `compare` time it, and the option keeps the faster of the two."""
    from clustersim.planner.planning import candidate_sweep
    from clustersim.planner.upgrades import evaluate, plan_have

    own, rent = cost_model("own"), cost_model("rent")
    base = candidate_sweep(None).base.with_changes(
        **{"workload.model": "BERT-Large", "workload.seq_len": None}
    )
    alone = {
        name: {o["what"]: o for o in evaluate(Path(TEAM), base, [name], n, 4096, own, rent)["options"]}
        for name, n in (("adam", 100_000), ("binsgdm", 300_000))
    }
    both = evaluate(Path(TEAM), base, ["adam", "binsgdm"], "adam=100000,binsgdm=300000", 4096, own, rent)
    for o in both["options"]:
        mine = {name: alone[name][o["what"]]["ttt_h"] for name in alone}
        assert o["ttt_h"] == mine[o["optimizer"]] == min(mine.values()), o["what"]
        assert o["steps"] == {"adam": 100_000, "binsgdm": 300_000}[o["optimizer"]]
    assert {o["optimizer"] for o in both["options"]} == {"adam", "binsgdm"}  # each wins somewhere
    # the kept cluster as `compare` times it (the file as it is: BERT-Large on its 128 GPUs)
    from clustersim.api import compare

    cells = compare(TEAM, ["adam", "binsgdm"], [128], samples=0, global_batch=4096, break_even_at=0,
                    steps="adam=100000,binsgdm=300000")  # fmt: skip
    for name in alone:
        keep = next(o for o in alone[name].values() if o["option"] == "keep")
        assert keep["ttt_h"] == pytest.approx(cells.row(name, 128).time_to_train_s / 3600, rel=1e-9), name
    out = plan_have("BERT-Large", "adam=100000,binsgdm=300000", Path(TEAM), None, 4096, own, rent, 0)
    assert out["steps_per_optimizer"] == {"adam": 100_000, "binsgdm": 300_000} and out["baseline"] == "adam"
    p4d = next(o for o in out["options"] if o.get("instance") == "p4d.24xlarge")
    assert p4d["optimizer"] == "adam" and p4d["steps"] == 100_000


def test_an_options_capital_is_counted_once_in_what_it_spends_on_the_run():
    """The ranking added an option's whole capital to a run cost that already held that capital's
    amortised share. Closed form (life L = years x hours per year x utilisation, t the option's hours,
    P its power per hour): an upgrade spends C + t (kept servers / L + P), the old network's share being
    replaced by the new one, bought whole; added nodes spend C + t (kept servers and network / L + P)."""
    from clustersim.planner.planning import candidate_sweep
    from clustersim.planner.upgrades import evaluate, recommended, spent_on_run

    own, rent = cost_model("own"), cost_model("rent")
    base = candidate_sweep(None).base.with_changes(
        **{"workload.model": "BERT-Large", "workload.seq_len": None}
    )
    rows = evaluate(Path(TEAM), base, ["adam"], 100_000, 4096, own, rent)["options"]
    o = own.o
    life = o["amortisation_years"] * o["hours_per_year"] * o["utilisation"]
    servers, network = own.capital(load_scenario(TEAM).cluster.model_dump(mode="json"))
    for r in rows:
        kept = {"keep": servers + network, "upgrade NICs": servers, "add nodes": servers + network}
        if r["option"] in kept:
            want = r["capital"] + r["ttt_h"] * (kept[r["option"]] / life + r["power_per_h"])
            assert spent_on_run(r) == pytest.approx(want, rel=1e-12), r["what"]
        else:  # renting buys nothing: the instance-hours
            assert spent_on_run(r) == r["run_cost"] and r["capital"] == 0.0
    assert recommended(rows) is min(rows, key=spent_on_run)


def test_the_have_recommendation_carries_plans_warnings(runner):
    """`plan --have` recommended adding nodes and switching to BinSGDM with a P90 past the deadline and a
    payback past the hardware's life, and said none of it. It says what `plan` says under its choice
    (the gain over Adam on the same cluster, that convergence is not modelled, the risk), and plainly
    that the capital is written off before it pays back."""
    args = ["plan", "--model", "BERT-Large", "--steps", "100000", "--global-batch", "4096", "--samples", "0"]
    d = json.loads(runner.invoke(app, [*args, "--deadline", "3h", "--have", TEAM, "--json"]).stdout)
    chosen, notes = d["recommended"], d["recommendation_notes"]
    assert (
        chosen["option"] == "add nodes" and chosen["optimizer"] == "binsgdm" and chosen["payback_beyond_life"]
    )
    b = chosen["baseline"]
    assert b["optimizer"] == "adam" and chosen["speedup"] == pytest.approx(b["ttt_h"] / chosen["ttt_h"])
    assert notes[0].startswith(f"Over adam on the same cluster: {chosen['speedup']:.2f}x faster")
    assert notes[1].startswith("Convergence is not modelled: binsgdm is assumed to reach adam's loss")
    assert notes[-1].startswith(f"Its ${chosen['capital']:,.0f} pays back only after") and "past" in notes[-1]
    r = runner.invoke(app, [*args, "--deadline", "3h", "--have", TEAM])
    for line in notes:
        assert f"  • {line}" in r.stdout
    # the risk line: the choice's P90 past the deadline names the cheapest option whose P90 is within it
    from clustersim.planner.upgrades import recommendation_notes

    def option(name, h, p90, spent):
        return {"option": name, "what": name, "optimizer": "adam", "ttt_h": h, "ttt_p90_h": p90,
                "spent_on_run": spent, "baseline": None, "meets": True}  # fmt: skip

    risky, safe, dear = (
        option("keep", 2.5, 3.4, 100.0),
        option("rent", 2.0, 2.8, 500.0),
        option("x", 1, 2, 900),
    )
    (line,) = recommendation_notes(risky, [risky, safe, dear], 3.0)
    assert line.startswith(
        "Risk: its P90 (3.4 h) is past the 3.0 h deadline; rent, rent keeps its P90 within"
    )
    assert recommendation_notes(safe, [risky, safe, dear], 3.0) == []


def test_an_upgrade_that_saves_no_time_never_pays_back():
    """An upgrade shown as 0.0 h saved got a finite payback ("8,872.9 d"): a saving inside the model's
    resolution (breakeven.LEVEL, 0.5% of keeping's run) divided into the capital. It never pays back, and
    the table says why; 1% saved still has its payback."""
    from clustersim.commands.planning import _have_table

    rows = [
        {"option": "keep", "ttt_h": 100.0, "capital": 0.0, "power_per_h": 10.0},
        {"option": "upgrade NICs", "ttt_h": 99.99, "capital": 20_000.0, "power_per_h": 10.0},
        {"option": "upgrade NICs", "ttt_h": 99.0, "capital": 20_000.0, "power_per_h": 10.0},
    ]
    _payback(rows, _Kept())
    level, faster = rows[1], rows[2]
    assert level["never_pays_back"] and level["saves_no_time"] and level["payback_days"] is None
    assert not faster["saves_no_time"] and faster["payback_runs"] == pytest.approx(200.0)
    for r in rows:
        r.update(what="", optimizer="adam", ttt_p10_h=None, run_cost=0.0, run_cost_p10=0.0, run_cost_p90=0.0)
    _, body = _have_table(rows)
    assert body[1][-1] == "never (saves no time)" and body[2][-1].endswith("runs)")


@pytest.mark.parametrize("have", [[], ["--have", "examples/team-a100-40gb-25gbe.yaml"]])
def test_a_bad_budget_is_said_before_the_missing_steps(have):
    """`plan --budget -5` without --steps said only "--steps: give the training steps"; fixed, the next
    run said the budget: the option's value is checked first."""
    r = CliRunner().invoke(
        app, ["plan", "--model", "BERT-Large", "--deadline", "3d", "--budget", "-5", *have]
    )
    assert r.exit_code == 2, r.output
    assert "--budget" in r.output and "--steps" not in r.output
