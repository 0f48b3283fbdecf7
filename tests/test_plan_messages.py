"""What `plan` and `offload plan` say to the user: refusals of ambiguous or too-small inputs, warnings,
and the lines and fields a plan's output carries."""

from __future__ import annotations

import pytest

from clustersim.cli import app
from clustersim.planner.planning import optimizers_not_run, tokens_note


def test_tokens_less_than_one_step_is_refused(runner):
    """`--tokens 1.5e3` ran 1 step of 1,024 x 2,048 tokens (1,400 times the tokens asked for) without a
    word; refused before any candidate runs, naming --tokens, a step's tokens and the step count."""
    args = ["plan", "--model", "GPT-3-1.3B", "--tokens", "1.5e3", "--deadline", "1d", "--samples", "0"]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    line = r.output.strip()
    assert line.startswith("error: --tokens: 1,500 tokens is less than one step") and "\n" not in line
    assert "1,024 samples x 2,048 tokens = 2,097,152 tokens" in line and "1 step" in line


def test_tokens_rounded_up_a_lot_are_warned():
    """Whole steps that train noticeably more than --tokens say how many more; within 1%, no warning."""
    step = 1024 * 2048
    loose = tokens_note(3 * step // 2, 2, 1024, 2048)  # 1.5 steps' tokens run as 2 steps
    assert f"warning: 2 steps train {2 * step:,} tokens, 33% more" in loose
    assert "warning" not in tokens_note(1000 * step - 5, 1000, 1024, 2048)


def test_an_optimizer_no_candidate_runs_is_shown_on_the_gpu_closest_to_fitting():
    """GPT-3-175B's compressed optimizers fit no GPU; the example named H200 (its reason the shortest)
    while B200, with more memory, was in the grid: the example is the GPU with the most memory."""
    from clustersim import catalog

    assert catalog.gpu("B200").memory_bytes > catalog.gpu("H200").memory_bytes
    why = "workload.model: does not fit in GPU memory: 3,003.82 GiB per rank needed but {} has {}"
    records = [
        {"optimizer": "binsgdm", "gpu": "H200", "status": "invalid", "error": why.format("H200", "1 GiB")},
        {"optimizer": "binsgdm", "gpu": "B200", "status": "invalid", "error": why.format("B200", "180 GiB")},
        {"optimizer": "binsgdm", "gpu": "A100-80GB", "status": "invalid", "error": why.format("A1", "80")},
        {"optimizer": "adam", "gpu": "H200", "status": "ok", "error": ""},
    ]
    assert optimizers_not_run(records) == {"binsgdm": records[1]["error"]}
    # a row that does not name its GPU is on the candidates' base GPU
    del records[1]["gpu"]
    assert optimizers_not_run(records, "B200") == {"binsgdm": records[1]["error"]}


def test_api_steps_are_read_as_the_cli_reads_them(runner):
    """StepsPlan.parse took Python's ``int("4_00")`` (400), which the CLI's --steps refuses: both read a
    count with units.parse_count now, refusing the same text in the same words (and both take 1e5)."""
    import pytest

    from clustersim.errors import InputError
    from clustersim.planner.compare import StepsPlan

    for text in ("4_00", "adam=4_00"):
        with pytest.raises(InputError) as api:
            StepsPlan.parse(text)
        cli = runner.invoke(app, ["plan", "--model", "BERT-Large", "--steps", text, "--deadline", "1d"])
        assert cli.exit_code == 2 and "is not a plain decimal number" in api.value.message
        assert api.value.key == "--steps" and api.value.message in cli.output
    assert StepsPlan.parse("adam=1e5,binsgdm=1.1e5").per == (("adam", 100_000), ("binsgdm", 110_000))


def _memory_need(message: str) -> str:
    return message.split("does not fit in GPU memory: ")[1].split(" per rank needed")[0]


def test_offload_plan_quotes_what_a_micro_batch_of_1_needs(runner):
    """Llama-7B on an A100-80GB at micro-batch 4 fits no micro-batch without offload: the line said
    "not even a micro-batch of 1 fits (135.02 GiB per rank needed ...)", micro-batch 4's need; it now
    quotes micro-batch 1's (109 GiB), as simulating micro-batch 1 without offload refuses it."""
    import json

    import pytest

    from clustersim.errors import InputError
    from clustersim.scenario import load_scenario
    from clustersim.simulator import simulate

    sets = {"cluster.gpu": "A100-80GB", "workload.micro_batch": 4}
    args = ["offload", "plan", "preset:offload-llama7b-h100", "--samples", "0"]
    args += [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]
    plain = load_scenario("preset:offload-llama7b-h100").with_changes(
        **sets, **{"training.offload.mode": "none", "training.offload.gradient_copy": None}
    )
    needs = {}
    for mb in (1, 4):
        with pytest.raises(InputError) as exc:
            simulate(plain.with_changes(**{"workload.micro_batch": mb}), uncertainty_samples=0)
        needs[mb] = _memory_need(exc.value.message)
    assert needs[1] != needs[4]
    none = json.loads(runner.invoke(app, [*args, "--json"]).stdout)["modes"]["none"]
    assert none["largest_micro_batch"] == 0 and _memory_need(none["why_micro_batch_1"]) == needs[1]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    line = next(x for x in r.stdout.splitlines() if "not even a micro-batch of 1 fits" in x)
    assert f"({needs[1]} per rank needed but A100-80GB has" in line and needs[4] not in line


def test_time_left_waits_for_a_fifth_of_the_work():
    """`plan` said ~16 s left of an 8 s run: its first estimate extrapolated the first tenth (start-up
    and some of the slowest candidates). None now before 20% of the work. The figures are a BERT-Large
    plan's (1,728 candidates; 173 in 2.3 s, then 670 at 3.3 s; 5.8 s more to count them all)."""
    from clustersim.commands.support import time_left

    total = 1728
    assert time_left(173, total, 2.3) is None  # the first tenth: it said 2.3 / 173 x 1,555 = 21 s
    assert time_left(345, total, 2.9) is None
    assert time_left(670, total, 3.3) == 3.3 / 670 * (total - 670)  # 5.2 s: the phase's rate so far
    assert time_left(total, total, 9.0) == 0.0
    assert time_left(5, 0, 1.0) is None  # an unknown total


def test_the_terminal_bar_says_the_same_time_left():
    """The rich bar's ETA column is time_left too: blank before a fifth of the work."""
    import time
    from types import SimpleNamespace

    from clustersim.commands.support import _time_left_column

    column, start = _time_left_column(), time.monotonic() - 5.0
    early = SimpleNamespace(completed=5, total=100, fields={"phase_start": start})
    assert str(column.render(early)) == "-:--:--"
    later = SimpleNamespace(completed=50, total=100, fields={"phase_start": start})
    assert str(column.render(later)) == "0:00:05"


TEAM = "examples/team-a100-40gb-25gbe.yaml"


def test_plan_have_shows_each_options_layout_and_one_recommendation(runner):
    """`plan --have` printed neither the layout each option runs nor a recommendation, as `plan` does:
    a layout column, and one "Recommended:" line naming the option that spends least on this run."""
    import json

    args = ["plan", "--model", "BERT-Large", "--steps", "1000", "--deadline", "30d", "--samples", "0"]
    r = runner.invoke(app, [*args, "--have", TEAM])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    header = next(x for x in lines if x.startswith("option "))
    assert header.split()[:4] == ["option", "what", "optimizer", "layout"]
    said = [x for x in lines if "Recommended:" in x]
    assert len(said) == 1 and said[0].startswith("  • Recommended: keep, as owned")
    d = json.loads(runner.invoke(app, [*args, "--have", TEAM, "--json"]).stdout)
    assert all(o["layout"] for o in d["options"])
    keep = next(o for o in d["options"] if o["option"] == "keep")
    assert d["recommended"] == keep and d["recommendation"] == said[0].removeprefix("  • ")


def test_the_have_recommendation_is_the_least_spent_on_the_run_that_meets_the_constraints():
    from clustersim.planner.upgrades import recommendation_text, recommended

    def option(name, ttt_h, capital, run_cost, meets=True):
        return {"option": name, "what": name, "optimizer": "adam", "layout": "DP", "ttt_h": ttt_h,
                "capital": capital, "run_cost": run_cost, "meets": meets}  # fmt: skip

    keep, nic = option("keep", 40.0, 0, 500, meets=False), option("upgrade NICs", 30.0, 20_000, 400)
    rent = option("rent", 20.0, 0, 900)
    assert recommended([keep, nic, rent]) is rent  # $900 now against $20,400: the upgrade pays back later
    keep["meets"] = True
    assert recommended([keep, nic, rent]) is keep
    nobody = [dict(o, meets=False) for o in (keep, nic, rent)]
    assert recommended(nobody) is None
    text = recommendation_text(None, nobody)
    assert text.startswith("No option meets the deadline and budget; the fastest is rent, rent: adam, DP")


def test_plan_notes_a_choice_that_fits_its_gpu_this_closely(runner, tmp_path, monkeypatch):
    """`run` warns of a rank with under 5% of its GPU's memory to spare; `plan` said nothing of its choice
    or the fastest. It says the same note (memory.thin_headroom_note, the same threshold) of both."""
    import json

    import yaml

    from clustersim.planner.planning import memory_notes
    from clustersim.scenario import load_scenario
    from clustersim.simulator import memory

    gib = 2**30
    assert memory.THIN_HEADROOM == 0.05
    assert memory.thin_headroom_note(76 * gib, 80 * gib) is None  # exactly 5% to spare: not close
    close = memory.thin_headroom_note(77 * gib, 80 * gib)
    assert close.startswith("GPU memory: 77.00 GiB of 80.00 GiB, 3.00 GiB to spare; the CUDA context")
    scenario = load_scenario("preset:default").model_dump(mode="json")  # 8 x V100-SXM2, 32 GiB each
    row = {"cluster": "8 x V100-SXM2", "scenario": scenario, "gpu_memory_bytes": 31 * gib}
    roomy = dict(row, gpu_memory_bytes=20 * gib)
    assert memory_notes(row, row) == [
        f"the choice (8 x V100-SXM2): {memory.thin_headroom_note(31 * gib, 32 * gib)}"
    ]
    assert memory_notes(roomy, row)[0].startswith("the fastest (8 x V100-SXM2): GPU memory: 31.00 GiB")
    assert memory_notes(roomy, roomy) == [] and memory_notes(None, None) == []

    # the wiring: with every fit taken as close, the plan's text and JSON carry the note
    cand = tmp_path / "cand.yaml"
    cand.write_text(
        yaml.safe_dump({"base": "preset:default", "vary": {"gpus": [8, 16], "optimizer": ["adam"]}})
    )
    monkeypatch.setattr(memory, "THIN_HEADROOM", 1.0)
    args = ["plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "1d", "--samples", "0"]
    args += ["--candidates", str(cand), "--price", "2"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert any(x.startswith("note: the choice (") and "to spare" in x for x in r.stdout.splitlines())
    d = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert d["memory_notes"] and d["memory_notes"][0].startswith(f"the choice ({d['chosen']['cluster']}): ")


def test_plan_json_gives_the_fastest_its_time_band_as_the_choice_has(runner, tmp_path):
    """The fastest entry of `plan --json` had a cost band (the price's uncertainty alone) and no time
    band where it was not among the five cheapest: its draws now run with the first rows banded, and it
    carries ttt_p10_h/ttt_p90_h, and a cost band that holds them, as the chosen entry does."""
    import json

    import yaml

    cand = tmp_path / "cand.yaml"
    cand.write_text(yaml.safe_dump({"base": "preset:default", "vary": {"gpus": [8, 16, 32, 64, 128, 256]}}))
    args = ["plan", "--model", "BERT-Large", "--steps", "1000", "--deadline", "30d", "--samples", "4"]
    r = runner.invoke(app, [*args, "--candidates", str(cand), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    chosen, fastest = d["chosen"], d["fastest"]
    # the most expensive of the six: not among the five cheapest, whose bands are drawn to choose
    assert fastest["cluster"].startswith("256 x") and chosen["cluster"] != fastest["cluster"]
    for row in (chosen, fastest):
        assert row["ttt_p10_h"] < row["ttt_h"] < row["ttt_p90_h"], row
        assert row["cost_p10"] < row["cost"] < row["cost_p90"]
    # the cost band holds the time band: wider than the price's uncertainty alone
    assert fastest["cost_p90"] / fastest["cost_p10"] > 1.3


@pytest.mark.parametrize("json_out", [False, True])
def test_a_plan_that_nothing_meets_exits_1_in_text_and_json(runner, json_out):
    """Nothing feasible: exit 1 (docs/sweeps-reports-plans.md), whether the answer is text or --json, for
    plan and plan --have alike, so a script can tell an infeasible ask from an answer."""
    from clustersim.cli import app

    common = ["--model", "BERT-Large", "--steps", "1000", "--deadline", "1m", "--samples", "0"]
    for extra in (
        ["--candidates", "examples/planner-bert-gpt-ethernet.yaml"],
        ["--have", "examples/team-a100-40gb-25gbe.yaml"],
    ):
        r = runner.invoke(app, ["plan", *common, *extra, *(["--json"] if json_out else [])])
        assert r.exit_code == 1, (extra, r.output[-400:])
        if json_out:
            import json

            answer = json.loads(r.stdout)
            assert answer.get("chosen", answer.get("recommended")) is None


def test_a_plans_choice_rebuilds_from_its_json(runner, tmp_path):
    """`plan --json`'s choice had no scenario: its micro-batch, accumulation and layout could not be
    rebuilt from the answer. The choice and each runner-up carry the resolved scenario as it ran
    (Scenario.to_dict); `clustersim run` on the choice's gives the plan's step time exactly."""
    import json

    import yaml

    cand = tmp_path / "cand.yaml"
    vary = {"gpus": [8, 16], "optimizer": ["adam", "binsgdm"]}
    cand.write_text(yaml.safe_dump({"base": "preset:default", "vary": vary}))
    args = ["plan", "--model", "GPT-2-1.5B", "--steps", "1000", "--deadline", "30d", "--samples", "0"]
    args += ["--global-batch", "512", "--candidates", str(cand), "--price", "2", "--json"]
    d = json.loads(runner.invoke(app, args).stdout)
    chosen = d["chosen"]
    w = chosen["scenario"]["workload"]
    assert w["micro_batch"] * w["gradient_accumulation"] * chosen["world_size"] == 512
    assert all(r["scenario"]["workload"]["model"] == "GPT-2-1.5B" for r in d["runners_up"])
    path = tmp_path / "chosen.json"
    path.write_text(json.dumps(chosen["scenario"]))
    r = runner.invoke(app, ["run", str(path), "--samples", "0", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["iteration_time_s"] == chosen["iteration_time_s"]
    assert chosen["ttt_h"] == pytest.approx(chosen["steps"] * chosen["iteration_time_s"] / 3600, rel=1e-12)
