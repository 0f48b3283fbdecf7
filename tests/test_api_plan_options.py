"""The API's `plan` takes what `clustersim plan` takes: a deadline with its unit (a bare number is
refused, as the command refuses one), the command's cost and catalog options by the same names, tokens
as the command reads them (300e9), and --have; its errors name the argument, not the option."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from clustersim import plan
from clustersim.api import HavePlan
from clustersim.cli import app
from clustersim.errors import InputError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TEAM = str(EXAMPLES / "team-a100-40gb-25gbe.yaml")


@pytest.fixture
def candidates(tmp_path) -> str:
    """Four candidates, so that each call is quick."""
    path = tmp_path / "candidates.yaml"
    path.write_text(
        f"name: few\nbase: {EXAMPLES / 'a100-8gpu-ethernet.yaml'}\n"
        "vary: {gpus: [8, 16], optimizer: [adam, binsgdm]}\nglobal_batch: 1024\n",
        encoding="utf-8",
    )
    return str(path)


def _cli_json(args: list[str]) -> dict:
    r = CliRunner().invoke(app, ["plan", *args, "--samples", "0", "--json"])
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def test_a_bare_number_is_no_deadline_but_a_timedelta_is(candidates):
    """30.0 was silently 30 hours where the CLI refuses a bare number as ambiguous (hours or days?)."""
    for bare in (30, 30.0):
        with pytest.raises(InputError) as err:
            plan("BERT-Large", 1000, bare, candidates=candidates, samples=0)
        assert err.value.key == "deadline" and "bare number" in err.value.message
    by_text = plan("BERT-Large", 1000, "30d", candidates=candidates, samples=0)
    by_delta = plan("BERT-Large", 1000, datetime.timedelta(days=30), candidates=candidates, samples=0)
    assert by_delta.to_dict() == by_text.to_dict()
    with pytest.raises(InputError, match="deadline: .*10 years"):
        plan("BERT-Large", 1000, datetime.timedelta(days=1e5), candidates=candidates, samples=0)


def test_tokens_as_a_float_with_no_fraction_is_the_count(candidates):
    """tokens=300e9 was refused ("--tokens: ... got 300000000000.0") though the CLI takes 300e9."""
    as_float = plan("BERT-Large", None, "30d", tokens=300e9, candidates=candidates, samples=0)
    as_int = plan("BERT-Large", None, "30d", tokens=300_000_000_000, candidates=candidates, samples=0)
    assert as_float.to_dict() == as_int.to_dict()
    assert as_float.to_dict() == _cli_json(
        ["--model", "BERT-Large", "--tokens", "300e9", "--deadline", "30d", "--candidates", candidates]
    )
    with pytest.raises(InputError) as err:
        plan("BERT-Large", None, "30d", tokens=1.5, candidates=candidates, samples=0)
    assert err.value.key == "tokens"


def test_the_commands_cost_options_by_the_same_names(candidates):
    """cost="rent" was a TypeError (unexpected keyword): the answer is the command's --cost rent one."""
    rented = plan("BERT-Large", 1000, "30d", cost="rent", candidates=candidates, samples=0)
    assert rented.chosen["cost_model"] == "rent"
    assert rented.to_dict() == _cli_json(
        ["--model", "BERT-Large", "--steps", "1000", "--deadline", "30d", "--cost", "rent"]
        + ["--candidates", candidates]
    )
    flat = plan("BERT-Large", 1000, "30d", price=2.0, baseline="adam", candidates=candidates, samples=0)
    assert flat.chosen["cost_model"] == "rent"


@pytest.mark.parametrize(
    ("arguments", "key"),
    [
        ({"cost": "lease"}, "cost"),
        ({"network_prices": "no-such-file.yaml"}, "network_prices"),
        ({"own_prices": "no-such-file.yaml"}, None),
        ({"cost": "rent", "instance": "no-such-instance"}, "instance"),
        ({"budget": -5}, "budget"),
        ({"price": float("nan")}, "price"),
        ({"have": TEAM, "cost": "rent"}, "cost"),
        ({"catalog": "no-such-catalog.yaml"}, None),
        ({"tokens": 300e9}, "tokens"),  # beside the steps given: one or the other
    ],
)
def test_a_bad_option_is_an_input_error_naming_the_argument(candidates, arguments, key):
    with pytest.raises(InputError) as err:
        plan("BERT-Large", 1000, "30d", candidates=candidates, samples=0, **arguments)
    if key is not None:
        assert err.value.key == key, str(err.value)
        assert not err.value.key.startswith("--"), str(err.value)
        if key == "tokens":  # its words are the API's as much as the command's
            assert "--" not in err.value.message, str(err.value)
    else:  # a file that is not there is named by its path, as the command names it
        assert "no-such-" in str(err.value)


@pytest.mark.parametrize("baseline", [None, "sgdm"])
def test_have_answers_as_plan_have_does(candidates, baseline):
    """The same answer as the command, --baseline included (the API's have= once dropped it)."""
    answer = plan("BERT-Large", 1000, "30d", have=TEAM, candidates=candidates, samples=0, baseline=baseline)
    assert isinstance(answer, HavePlan) and answer.options
    cli = _cli_json(
        ["--model", "BERT-Large", "--steps", "1000", "--deadline", "30d", "--have", TEAM]
        + ["--candidates", candidates]
        + (["--baseline", baseline] if baseline else [])
    )
    assert json.loads(json.dumps(answer.to_dict(), default=str)) == cli


def test_a_deadline_past_ten_years_is_refused_in_one_line():
    """--deadline 1e9d was accepted and printed as "24,000,000,000.0 h"."""
    r = CliRunner().invoke(app, ["plan", "--model", "BERT-Large", "--steps", "1000", "--deadline", "1e9d"])
    assert r.exit_code == 2, r.output
    assert "--deadline" in r.output and "10 years" in r.output and "Traceback" not in r.output


def test_a_deadline_of_astronomical_years_says_them_in_few_characters():
    """1e300d was refused with its 298-digit count of years: the line must stay readable."""
    r = CliRunner().invoke(app, ["plan", "--model", "BERT-Large", "--steps", "1000", "--deadline", "1e300d"])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert "2.7e+297 years" in r.output and len(r.output) < 200, r.output
