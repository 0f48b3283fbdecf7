"""A P10-P90 of one draw is that draw: `--samples 1` gave "3.82x (3.37–3.37)", an iteration of 497.62 ms
beside a "P10–P90 536.95 – 536.95 ms", and flipped plan's choice. Every command, the API and a sweep
file refuse 1 draw in the same words (simulator.uncertainty.draws_refusal); 0 and 2 still work."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from clustersim import compare, plan, simulate, sweep
from clustersim.cli import app
from clustersim.errors import InputError

WORDS = "a P10–P90 needs at least 2 draws; 0 turns the band off"
SWEEP = "name: s\nbase: preset:default\nvary:\n  gpus: [8, 16]\nsamples: {n}\n"


def _sweep_file(tmp_path, n: int) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(SWEEP.format(n=n), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "command",
    [
        ["run", "preset:default"],
        ["compare", "preset:default"],
        ["plan", "--model", "BERT-Large", "--steps", "1000", "--deadline", "3d"],
        ["sweep", "SWEEP"],
        ["report", "RESULTS"],
        ["validate", "--dataset", "no-such-dataset"],
        ["testbed", "repredict", "no-such-file.json"],
    ],
)
def test_every_command_refuses_one_draw(tmp_path, command):
    args = [
        _sweep_file(tmp_path, 0) if a == "SWEEP" else str(tmp_path / "out") if a == "RESULTS" else a
        for a in command
    ]
    r = CliRunner().invoke(app, [*args, "--samples", "1"])
    assert r.exit_code == 2, r.output
    assert WORDS in r.output and "Traceback" not in r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "call",
    [
        lambda tmp: simulate("preset:default", samples=1),
        lambda tmp: compare("preset:default", ["adam"], [8], samples=1),
        lambda tmp: sweep(_sweep_file(tmp, 0), tmp / "out", workers=1, samples=1),
        lambda tmp: plan("BERT-Large", 1000, "3d", samples=1),
    ],
)
def test_every_function_refuses_one_draw(tmp_path, call):
    with pytest.raises(InputError) as err:
        call(tmp_path)
    assert err.value.key == "samples" and err.value.message == WORDS
    assert not (tmp_path / "out").exists()


def test_a_sweep_file_of_one_draw_is_refused_naming_file_and_key(tmp_path):
    path = _sweep_file(tmp_path, 1)
    r = CliRunner().invoke(app, ["sweep", path, "--out", str(tmp_path / "out")])
    assert r.exit_code == 2, r.output
    assert "s.yaml" in r.output and "samples" in r.output and "2 draws" in r.output
    assert not (tmp_path / "out").exists()


def test_two_draws_give_a_band():
    run = simulate("preset:default", samples=2)
    lo, hi = run.p10_p90_s
    assert lo < hi
