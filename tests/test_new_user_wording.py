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
