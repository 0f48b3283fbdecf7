"""A planner's question answered honestly: compressed optimizers against the optimizer the team runs,
steps per optimizer, a fixed global batch, paired bands, and tables that fit a terminal."""

import json

import pytest
from rich.console import Console

from clustersim.cli import app
from clustersim.commands import support as cli_support
from clustersim.errors import InputError
from clustersim.planner.compare import StepsPlan, choose_baseline, compare
from clustersim.scenario import load_scenario


def _json(runner, *args):
    r = runner.invoke(app, ["compare", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_binsgdm_is_measured_against_the_scenarios_adam_not_sgdm(runner):
    """The default preset trains BERT-Large with Adam: BinSGDM's speedup and break-even are over Adam
    (before, its break-even was against SGD-momentum, an optimizer the team does not run)."""
    out = _json(runner, "preset:default", "--gpus", "64", "--optimizers", "binsgdm", "--samples", "0")
    assert out["baseline"] == "adam"
    rows = {r["optimizer"]: r for r in out["rows"]}
    assert set(rows) == {"adam", "binsgdm"}  # the baseline is simulated although not listed
    assert rows["binsgdm"]["speedup"] == pytest.approx(
        rows["adam"]["iteration_time_s"] / rows["binsgdm"]["iteration_time_s"]
    )
    assert [b["baseline"] for b in out["break_even"]] == ["adam"]
    other = _json(
        runner,
        "preset:default",
        "--gpus",
        "64",
        "--optimizers",
        "binsgdm",
        "--baseline",
        "sgdm",
        "--samples",
        "0",
    )
    assert other["baseline"] == "sgdm" and [b["baseline"] for b in other["break_even"]] == ["sgdm"]


def test_a_compressed_baseline_is_refused_in_one_line(runner):
    r = runner.invoke(app, ["compare", "preset:default", "--gpus", "64", "--baseline", "binsgdm"])
    assert r.exit_code == 2 and "--baseline" in r.output and "compressed" in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_choose_baseline_defaults_to_the_scenarios_optimizer():
    assert choose_baseline("adam") == "adam"
    assert choose_baseline("sgdm") == "sgdm"
    assert choose_baseline("onebit-adam") == "adam"  # a compressed scenario: what it replaces
    assert choose_baseline("adam", "sgdm") == "sgdm"


def test_steps_per_optimizer_and_the_convergence_caveat(runner):
    plan = StepsPlan.parse("adam=100000,binsgdm=110000")
    assert plan.of("binsgdm", "adam") == 110_000 and plan.of("onebit-adam", "adam") == 100_000
    assert StepsPlan.parse("100000,binsgdm=110000").of("zero-one-adam", "adam") == 100_000
    for bad in ("adam=x", "adam=-5", "nosuch=10"):
        with pytest.raises(InputError):
            StepsPlan.parse(bad)
    s = load_scenario("preset:default")
    rows = {r.optimizer: r for r in compare(s, ["binsgdm"], [64], steps="adam=100000,binsgdm=110000")}
    assert rows["binsgdm"].time_to_train_s == pytest.approx(110_000 * rows["binsgdm"].iteration_time_s)
    assert rows["adam"].time_to_train_s == pytest.approx(100_000 * rows["adam"].iteration_time_s)
    r = runner.invoke(
        app,
        [
            "compare",
            "preset:default",
            "--gpus",
            "64",
            "--optimizers",
            "binsgdm",
            "--steps",
            "adam=1000,binsgdm=1100",
        ],
    )
    assert r.exit_code == 0, r.output
    said = " ".join(r.stdout.split())
    assert "Convergence is not modelled" in said and "binsgdm 1,100" in said and "adam 1,000" in said


def test_a_fixed_global_batch_trains_faster_on_more_gpus():
    """Before, time to train grew the global batch with the GPU count: 64 and 512 GPUs took the same
    hours for the same steps. With --global-batch each GPU does an eighth of the work at 512."""
    s = load_scenario("preset:default").with_changes(
        **{"cluster.nic.line_rate_gbps": 100, "cluster.nic.effective_gbps": 100.0}
    )
    grow = {r.gpus: r for r in compare(s, ["adam"], [64, 512], steps=1000)}
    fixed = {r.gpus: r for r in compare(s, ["adam"], [64, 512], steps=1000, global_batch=4096)}
    assert fixed[64].samples_per_s * fixed[64].iteration_time_s == pytest.approx(4096)
    assert fixed[512].samples_per_s * fixed[512].iteration_time_s == pytest.approx(4096)
    # an eighth of the micro-batch per GPU: an eighth of the FLOPs and bytes, but each kernel's fixed cost
    # and its dispatch stay, so compute shrinks by a little less than 8x
    assert fixed[64].compute_s / 8 <= fixed[512].compute_s <= fixed[64].compute_s / 8 * 1.2
    assert fixed[512].time_to_train_s < 0.75 * fixed[64].time_to_train_s
    per_step = {g: r.samples_per_s * r.iteration_time_s for g, r in grow.items()}
    assert per_step[512] == pytest.approx(8 * per_step[64])  # without it the batch grows with the GPUs


def test_compare_says_when_the_batch_grows_with_the_gpus(runner):
    args = ["compare", "preset:default", "--gpus", "64,512", "--steps", "1000", "--samples", "0"]
    grows = runner.invoke(app, [*args, "--break-even-at", "0"])
    assert grows.exit_code == 0 and "the batch grows with the GPUs (1,024 to 8,192 samples" in grows.stdout
    fixed = runner.invoke(app, [*args, "--break-even-at", "0", "--global-batch", "4096"])
    assert fixed.exit_code == 0 and "grows" not in fixed.stdout and "global batch 4,096" in fixed.stdout
    odd = runner.invoke(app, [*args, "--global-batch", "1000"])
    assert odd.exit_code == 2 and "--global-batch" in odd.output and "does not split evenly" in odd.output


def test_compare_bands_are_paired_and_narrower_than_unpaired():
    s = load_scenario("preset:default")
    rows = {r.optimizer: r for r in compare(s, ["onebit-adam"], [64], steps=1000, samples=8)}
    one, base = rows["onebit-adam"], rows["adam"]
    assert base.speedup_p10 == pytest.approx(1.0) and base.speedup_p90 == pytest.approx(1.0)
    unpaired = (base.iteration_time_p90_s / one.iteration_time_p10_s) - (
        base.iteration_time_p10_s / one.iteration_time_p90_s
    )
    assert one.speedup_p90 - one.speedup_p10 < unpaired
    assert one.time_to_train_speedup_p10 <= one.time_to_train_speedup <= one.time_to_train_speedup_p90


def test_compare_tables_fit_80_columns_without_cutting(monkeypatch, capsys):
    """At COLUMNS=80 the table used to cut names and numbers ("onebi…")."""
    narrow = Console(width=80, force_terminal=True, color_system=None, record=True)
    monkeypatch.setattr(cli_support, "console", narrow)
    import clustersim.cli as cli

    monkeypatch.setattr(cli, "console", narrow)
    with pytest.raises(SystemExit) as done:
        app(
            ["compare", "preset:default", "--gpus", "64,512", "--samples", "4", "--steps", "100000"]
            + ["--global-batch", "4096"],
        )
    assert done.value.code == 0
    text = narrow.export_text()
    assert "…" not in text
    lines = [line for line in text.splitlines() if line[:1] in "┃│┏┡└"]  # the tables, not the progress
    assert lines and max(len(line) for line in lines) <= 80
    for name in ("onebit-adam", "zero-one-adam", "binsgdm"):
        table_rows = [line for line in lines if f"│ {name} " in line]
        assert len(table_rows) == 8, (name, text)  # 2 GPU counts x 4 tables (cost too), every name whole
        assert all(line.count("x (") <= 2 for line in table_rows)
    bands = [line for line in lines if "x (" in line and "binsgdm" in line]
    assert bands and all(line.count("–") == 2 for line in bands)  # both bands whole on the row


def test_compare_says_the_notes_run_says_once_not_once_per_cell():
    """A key the model does not use (batch-norm fusion on BERT) is a note of every cell: compare prints
    it once, as run does; a note of some cells names them; --json carries both."""
    import json

    from typer.testing import CliRunner

    from clustersim.cli import app
    from clustersim.planner.compare import CompareRow, notes_by_cells

    args = [
        "compare",
        "preset:default",
        "--set",
        "workload.batch_norm=fused",
        "--gpus",
        "8,16",
        "--samples",
        "0",
    ]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    note = "workload.batch_norm does not apply to BERT-Large (a transformer): it is not used"
    assert out.output.count(f"note: {note}") == 1
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    assert data["notes"] == [note] and all(r["notes"] == [note] for r in data["rows"])
    plain = json.loads(CliRunner().invoke(app, [*args[:2], *args[4:], "--json"]).output)
    assert plain["notes"] == []

    def row(gpus, opt, notes):
        return CompareRow(gpus, opt, *([1.0] * 9), notes=notes)

    rows = [row(8, "adam", ["a"]), row(16, "adam", ["a", "b"]), row(16, "binsgdm", ["a", "b"])]
    rows.append(CompareRow.failed(32, "adam", "out of memory"))
    assert notes_by_cells(rows) == ["a", "b (adam at 16 GPUs; binsgdm at 16 GPUs)"]


def test_every_runner_up_of_a_banded_plan_has_its_band():
    """Bands are drawn for the cheapest feasible candidates; a runner-up from further down (listed
    because a cheaper one read the same as another) gets its own band too, not a bare number."""
    from clustersim import api

    answer = api.plan("BERT-Large", 100_000, "3d", samples=4)  # the built-in grid
    assert answer.runners_up
    for r in [answer.chosen, *answer.runners_up]:
        assert r["ttt_p10_h"] <= r["ttt_h"] <= r["ttt_p90_h"], r["cluster"]
