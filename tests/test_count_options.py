"""Whole-number command options read a count as a file reads one (commands/counts.py): plan --steps 1e9
was refused while ``steps: 1e9`` in a file is a billion, and ``4_00`` was taken though a file refuses
it. Refused forms are one line naming the option, exit 2, before any work."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from clustersim.cli import app
from clustersim.commands.counts import parse_count
from clustersim.errors import InputError


@pytest.mark.parametrize(
    ("text", "count"),
    [("1e9", 10**9), ("1000000000", 10**9), ("1.0e+9", 10**9), ("8.0", 8), ("010", 10), (" 64 ", 64)],
)
def test_plain_decimal_counts_are_read_as_a_file_reads_them(text, count):
    assert parse_count(text, "--steps") == count and type(parse_count(text, "--steps")) is int


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("1.5e0", "not a whole number"),
        ("0x10", "not a plain decimal"),
        ("4_00", "not a plain decimal"),
        ("1:30", "not a plain decimal"),
        ("nan", "not a plain decimal"),
        ("inf", "not a plain decimal"),
        ("", "not a plain decimal"),
        ("-3", "less than 1"),
        ("0", "less than 1"),
        ("1e400", "more than 2**53"),
        ("9007199254740993", "more than 2**53"),
    ],
)
def test_other_forms_are_refused_naming_the_option(text, why):
    with pytest.raises(InputError, match=re.escape(why)) as exc:
        parse_count(text, "--tokens")
    assert exc.value.key == "--tokens"


def _one_candidate(tmp_path):
    """A candidates file of one 8-GPU cluster: a plan over it takes well under a second."""
    path = tmp_path / "cand.yaml"
    base = {
        "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "A100-80GB", "intra_node": {"fabric": "nvswitch"}},
        "workload": {"model": "BERT-Large", "micro_batch": 8, "precision": "bf16"},
        "training": {"optimizer": "adam"},
    }
    path.write_text(yaml.safe_dump({"name": "one", "base": base, "vary": {"gpus": [8]}}))
    return str(path)


def test_plan_takes_steps_and_global_batch_written_with_an_exponent(runner, tmp_path):
    args = ["plan", "--model", "BERT-Large", "--deadline", "3650d", "--samples", "0", "--json"]
    r = runner.invoke(app, [*args, "--candidates", _one_candidate(tmp_path), "--steps", "1e6"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["steps"] == 1_000_000
    per_optimizer = ["--steps", "adam=2e5", "--global-batch", "5.12e2"]
    per = runner.invoke(app, [*args, "--candidates", _one_candidate(tmp_path), *per_optimizer])
    assert per.exit_code == 0, per.output
    assert json.loads(per.stdout)["steps"] == 200_000


def test_compare_takes_counts_written_with_an_exponent(runner):
    args = ["compare", "preset:default", "--samples", "0", "--optimizers", "adam", "--json"]
    r = runner.invoke(app, [*args, "--steps", "1e5", "--gpus", "4,8.0", "--global-batch", "6.4e1"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["global_batch"] == 64 and {row["gpus"] for row in out["rows"]} == {4, 8}


PLAN = ["plan", "--model", "BERT-Large", "--deadline", "1d"]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        ([*PLAN, "--steps", "1.5e0"], "--steps"),
        ([*PLAN, "--steps", "adam=4_00"], "--steps"),
        ([*PLAN, "--steps", "0x10"], "--steps"),
        ([*PLAN, "--tokens", "1.5e0"], "--tokens"),
        ([*PLAN, "--tokens", "-1e9"], "--tokens"),
        ([*PLAN, "--steps", "9", "--global-batch", "1e3x"], "--global-batch"),
        (["compare", "preset:default", "--steps", "1.5e0"], "--steps"),
        (["compare", "preset:default", "--gpus", "4,0x8"], "--gpus"),
        (["compare", "preset:default", "--break-even-at", "-8"], "--break-even-at"),
    ],
)
def test_refused_count_forms_are_one_line_naming_the_option(runner, args, option):
    r = runner.invoke(app, args)
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert len(lines) == 1 and option in lines[0], r.output
