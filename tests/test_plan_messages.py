"""What `plan` and `offload plan` say to the user: refusals of ambiguous or too-small inputs, warnings,
and the lines and fields a plan's output carries."""

from __future__ import annotations

from clustersim.cli import app
from clustersim.planner.planning import tokens_note


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
