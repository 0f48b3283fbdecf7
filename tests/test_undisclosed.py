"""A published result that rests on a setting its source does not give: the row names the setting and
validate shows the prediction over its plausible values (validation/published.py Undisclosed)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from clustersim.cli import app
from clustersim.errors import InputError
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate
from clustersim.validation import published

DOS = "preset:offload-dos-7b-h100"


def _time(page_fault_us=None, thp=None) -> float:
    s = load_scenario(DOS)
    if page_fault_us is not None:
        s = s.with_changes(**{"cluster.host.page_fault_us": page_fault_us})
    if thp is not None:
        s = s.with_changes(**{"cluster.host.transparent_hugepages": thp})
    return simulate(s, uncertainty_samples=0).iteration_time


def test_page_fault_cost_defaults_to_the_catalogs_and_costs_time_per_fault():
    # hardware_defaults.yaml host.first_touch_s_per_page is 1.4 us: the same run
    assert _time(1.4) == pytest.approx(_time(), rel=1e-12)
    slow, fast = _time(1.9), _time(1.0)
    assert fast < _time() < slow
    # the blocking copy's faults are on the step's critical path: time grows linearly in the cost
    assert (slow - _time()) / 0.5 == pytest.approx((_time() - fast) / 0.4, rel=1e-6)


def test_page_fault_cost_leaves_pinned_copies_alone():
    s = load_scenario(DOS).with_changes(**{"training.offload.gradient_copy": "async"})
    a = simulate(s, uncertainty_samples=0).iteration_time
    b = simulate(s.with_changes(**{"cluster.host.page_fault_us": 5.0}), uncertainty_samples=0).iteration_time
    assert a == pytest.approx(b, rel=1e-12)


@pytest.mark.parametrize("bad", [0, -1.0, 1e6, "fast"])
def test_a_bad_page_fault_cost_names_its_key(bad):
    with pytest.raises(InputError) as exc:
        load_scenario(DOS).with_changes(**{"cluster.host.page_fault_us": bad})
    assert "page_fault_us" in str(exc.value)


def test_the_seeds_rows_show_their_prediction_over_the_undisclosed_setting():
    report = published.validate("seeds", None, 0)
    rows = {r.label: r for r in report.rows}
    dos = rows["Deep Optimizer States: DeepSpeed ZeRO-3 offload (blocking gradient copy)"]
    assert dos.undisclosed_key == "cluster.host.transparent_hugepages"
    (lo_v, lo), (hi_v, hi) = dos.undisclosed_range  # named choices keep the dataset's order
    assert (lo_v, hi_v) == ("always", "madvise")
    assert lo == pytest.approx(_time(thp="always"), rel=1e-9)
    assert hi == pytest.approx(_time(thp="madvise"), rel=1e-9)
    assert lo == pytest.approx(dos.predicted, rel=1e-9) and lo < hi  # the row keeps the preset's "always"
    assert dos.undisclosed_used == "always" and dos.undisclosed_unit == ""
    speedup = rows["Deep Optimizer States over DeepSpeed ZeRO-3 offload"]
    (_, huge), (_, small) = speedup.undisclosed_range
    # 4 KiB faults make a slower baseline
    assert huge == pytest.approx(speedup.predicted, rel=1e-9) and huge < small
    onebit = next(r for r in report.rows if r.undisclosed_key == "gpus")
    assert [v for v, _ in onebit.undisclosed_range] == [16, 32, 64]
    assert onebit.undisclosed_used == onebit.gpus == 32
    at_32 = dict(onebit.undisclosed_range)[32]
    assert at_32 == pytest.approx(onebit.predicted, rel=1e-9)  # the row's own size is one of them
    plain = [r for r in report.rows if r.undisclosed_key is None]
    assert plain and all(r.undisclosed_range is None for r in plain)


def test_validate_prints_the_undisclosed_range():
    out = CliRunner().invoke(app, ["validate", "--dataset", "seeds", "--samples", "0"])
    assert out.exit_code == 0, out.output
    assert 'undisclosed, row "Deep Optimizer States' in out.output
    assert "cluster.host.transparent_hugepages is not published" in out.output
    assert "that row uses always; predicted at always → 8.511 s (-9.9%), madvise → 11.481 s" in (out.output)
    assert "the GPU count is not published" in out.output


def test_an_undisclosed_setting_needs_two_values_and_a_reason():
    row = {"optimizer": "adam", "gpus": 1, "published": 1.0}
    with pytest.raises(ValueError):
        published.Row.model_validate({**row, "undisclosed": {"key": "gpus", "values": [8], "why": "x"}})
    with pytest.raises(ValueError):
        published.Row.model_validate({**row, "undisclosed": {"key": "gpus", "values": [8, 16]}})
