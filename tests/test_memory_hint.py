"""An out-of-memory error suggests offload only where offloading the optimizer state could make it fit."""

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
