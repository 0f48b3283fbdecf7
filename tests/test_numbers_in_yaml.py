"""Numbers in input files: 1e9 written without a dot is the number YAML 1.2 and JSON read (PyYAML's
YAML 1.1 resolver read it as text, which the schemas then coerced), and a quoted "25" is text, refused
by every Number field as counts already were."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from clustersim.cli import app
from clustersim.errors import InputError
from clustersim.io import load_yaml
from clustersim.scenario import load_scenario


@pytest.mark.parametrize(
    ("text", "value"), [("1e9", 1e9), ("5e-7", 5e-7), ("-2E+3", -2000.0), ("2.5e3", 2500.0), ("1.0e+9", 1e9)]
)
def test_exponent_notation_is_a_number(text, value):
    assert load_yaml(f"x: {text}")["x"] == value


@pytest.mark.parametrize("text", ["v1e9", "1e", "e9", "'1e9'", "1e9x"])
def test_text_that_only_looks_like_it_stays_text(text):
    assert isinstance(load_yaml(f"x: {text}")["x"], str)


def _scenario_with_rate(tmp_path, rate: str):
    """A small scenario file whose NIC line rate is written as ``rate`` (YAML text)."""
    f = tmp_path / "s.yaml"
    f.write_text(
        "name: x\ncluster: {nodes: 2, gpus_per_node: 8, gpu: A100-80GB,"
        f" nic: {{kind: ethernet_tcp, line_rate_gbps: {rate}}}}}\n"
        "workload: {model: BERT-Large, micro_batch: 8}\ntraining: {optimizer: adam}\n"
    )
    return f


def test_a_quoted_number_is_refused_with_its_file_and_key(tmp_path):
    f = _scenario_with_rate(tmp_path, '"25"')
    with pytest.raises(InputError) as exc:
        load_scenario(f)
    assert "cluster.nic.line_rate_gbps" in str(exc.value) and "not the text '25'" in str(exc.value)
    r = CliRunner().invoke(app, ["run", str(f), "--samples", "0"])
    assert r.exit_code == 2 and "Traceback" not in r.output


def test_exponent_notation_in_a_scenario_and_through_set(tmp_path):
    f = _scenario_with_rate(tmp_path, "1e2")
    assert load_scenario(f).cluster.nic.line_rate_gbps == 100.0
    r = CliRunner().invoke(app, ["run", str(f), "--samples", "0", "--set", "cluster.nic.line_rate_gbps=4e2"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("text", ["0x190", "6:40", "4_00", "0b101", "1:30:00"])
def test_yaml_11_number_forms_nobody_writes_are_text(text):
    """Hex, base 60 and underscores are text here (YAML 1.1 read 0x190 as 400 and 6:40 as 400), so a
    number field refuses them by name, as --set does."""
    assert load_yaml(f"x: {text}")["x"] == text


def test_a_leading_zero_is_decimal_in_a_file_as_through_set():
    assert load_yaml("x: 010")["x"] == 10 and load_yaml("x: -0620")["x"] == -620
    assert str(load_yaml("x: .nan")["x"]) == "nan" and load_yaml("x: -.inf")["x"] == float("-inf")


def test_a_hex_rate_in_a_scenario_file_is_refused_by_name(tmp_path):
    f = _scenario_with_rate(tmp_path, "0x190")
    with pytest.raises(InputError) as exc:
        load_scenario(f)
    assert "cluster.nic.line_rate_gbps" in str(exc.value) and "'0x190'" in str(exc.value)


def _sweep_file(tmp_path, vary: str):
    """A sweep file over the small preset whose ``vary`` is ``vary`` (YAML flow text)."""
    f = tmp_path / "sweep.yaml"
    f.write_text(f"base: preset:default\nsamples: 0\nvary: {vary}\n")
    return f


def test_a_whole_float_is_a_count_in_a_sweep_axis_as_in_a_scenario(tmp_path):
    """One rule for integer fields: 8.0 is eight (cluster.nodes: 8.0 in a scenario, --set
    cluster.nodes=8.0), the gpus axis included, and the rows list and identify it as 8."""
    from clustersim.sweeps.spec import load_sweep, row_id

    sweep = load_sweep(_sweep_file(tmp_path, "{gpus: [8.0], micro_batch: [16.0], nic_gbps: [40.0]}"))
    (row,) = sweep.rows()
    assert row == {"gpus": 8, "micro_batch": 16, "nic_gbps": 40.0}
    assert type(row["gpus"]) is int and type(row["micro_batch"]) is int and type(row["nic_gbps"]) is float
    assert row_id(row) == row_id({"gpus": 8, "micro_batch": 16, "nic_gbps": 40.0})


@pytest.mark.parametrize(
    ("vary", "key", "value"),
    [("{gpus: [8.5]}", "vary.gpus", "8.5"), ("{micro_batch: [16.5]}", "vary.micro_batch", "16.5")],
)
def test_a_fraction_is_refused_in_an_integer_sweep_axis_by_name(tmp_path, vary, key, value):
    f = _sweep_file(tmp_path, vary)
    r = CliRunner().invoke(app, ["sweep", str(f), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"{f}: {key}: {value}:" in r.output and not (tmp_path / "out").exists()
