"""What a new user's first runs read: each message says what was meant, once, in one line."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from clustersim.cli import app


@pytest.mark.parametrize(
    "command",
    [
        ["compare", "preset:default", "--set", "workload.model=GPT-2-15B", "--samples", "0"],
        ["plan", "--model", "GPT-2-15B", "--steps", "10", "--deadline", "3d", "--samples", "0"],
    ],
)
def test_a_model_with_its_point_dropped_gets_a_suggestion_in_every_command(command):
    """GPT-2-15B is GPT-2-1.5B without its point (the same digits); LLaMA-2-7B is still no 70B."""
    r = CliRunner().invoke(app, command)
    assert r.exit_code == 2, r.output
    assert "unknown model 'GPT-2-15B' (did you mean GPT-2-1.5B?" in r.output
    other = [a.replace("GPT-2-15B", "LLaMA-2-7B") for a in command]
    assert "did you mean" not in CliRunner().invoke(app, other).output


def test_runs_memory_note_is_printed_once():
    """A fit with under a GiB to spare was noted twice: the memory is checked before and after the
    program is built, and each check added the note."""
    r = CliRunner().invoke(
        app,
        ["run", "examples/team-a100-40gb-25gbe.yaml", "--set", "workload.model=GPT-2-1.5B"]
        + ["--set", "workload.micro_batch=5", "--samples", "0"],
    )
    assert r.exit_code == 0, r.output
    notes = [line for line in r.output.splitlines() if line.startswith("note: GPU memory:")]
    assert len(notes) == 1, r.output


def test_an_upgrade_that_saves_no_time_never_pays_back():
    """An upgrade shown as 0.0 h saved got a finite payback ("8,872.9 d"): a saving inside the model's
    resolution (breakeven.LEVEL, 0.5% of keeping's run) divided into the capital. It never pays back, and
    the table says why; 1% saved still has its payback."""
    from clustersim.commands.planning import _have_table
    from clustersim.planner.upgrades import _payback

    class Kept:
        per_hour = 100.0

    rows = [
        {"option": "keep", "ttt_h": 100.0, "capital": 0.0, "power_per_h": 10.0},
        {"option": "upgrade NICs", "ttt_h": 99.99, "capital": 20_000.0, "power_per_h": 10.0},
        {"option": "upgrade NICs", "ttt_h": 99.0, "capital": 20_000.0, "power_per_h": 10.0},
    ]
    _payback(rows, Kept())
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
