"""Smaller defects: offload suggested only where it can fit; a command's phases share one clock."""

import pytest

from clustersim.errors import InputError
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate


def _error(model: str, optimizer: str) -> str:
    s = load_scenario("preset:default").with_changes(
        **{"workload.model": model, "training.optimizer": optimizer}
    )
    with pytest.raises(InputError) as exc:
        simulate(s)
    return exc.value.message


def test_offload_is_not_suggested_where_it_cannot_fit():
    text = _error("GPT-3-175B", "binsgdm")
    assert "try training.offload" not in text and "even with its optimizer state on the host" in text


def test_offload_is_suggested_where_the_optimizer_state_is_what_does_not_fit():
    assert "try training.offload (mode: zero)" in _error("GPT-2-1.5B", "onebit-adam")


def test_a_commands_phases_share_one_clock():
    """compare's simulations, then its break-even: the second phase's elapsed time goes on from the
    first's, not from zero; its estimate of what is left is its own."""
    import time

    from clustersim.commands import support

    support._command_start[0] = time.monotonic() - 100.0
    try:
        phase = support.PlainProgress("compare", "simulations", total=10, every_s=1e9)
        phase.done = 5
        line = phase.line()
        phase.close()
    finally:
        support._command_start[0] = None
    elapsed = float(line.split(", ")[1].split(" s elapsed")[0].replace(",", ""))
    assert elapsed >= 100.0 and line.endswith("~0 s left"), line
