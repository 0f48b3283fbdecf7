"""The user's price catalogs (--network-prices, --own-prices, --instances): every value checked, each bad
one a single line naming the file and key, exit 2, in every command that reads them; and messages that
send the user only to options the command has."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from clustersim.cli import app
from clustersim.errors import InputError
from clustersim.report.costing import load_instances
from clustersim.report.prices import network_catalog


def _shipped(name: str) -> str:
    return resources.files("clustersim.catalogs").joinpath(name).read_text()


def _network_copy(tmp_path, edit) -> str:
    text = _shipped("network_prices.yaml")
    path = tmp_path / "net.yaml"
    path.write_text(edit(text))
    return str(path)


NETWORK_EDITS = [
    (lambda t: t.replace("25: {nic: 423", "25: {nic: .nan"), "ethernet_tcp.25.nic"),
    (lambda t: t.replace("25: {nic: 423", "25: {nic: .inf"), "ethernet_tcp.25.nic"),
    (lambda t: t.replace("  25: {nic: 423", "  twentyfive: {nic: 423"), "ethernet_tcp.twentyfive"),
    (lambda t: t.replace("amortisation_years: 3 ", "amortisation_years: .inf "), "amortisation_years"),
    (lambda t: t.replace("hours_per_year: 8766", "hours_per_year: 87660"), "hours_per_year"),
    (lambda t: t + "bogus: 1\n", "bogus"),
    (lambda t: t.replace("cable: 83}", "cable: 83, optics: 5}"), "ethernet_tcp.25.optics"),
    (lambda t: t.replace("25: {nic: 423", "25: {nic: 1e30"), "ethernet_tcp.25.nic"),
]


@pytest.mark.parametrize(("edit", "key"), NETWORK_EDITS)
def test_a_bad_network_price_names_the_file_and_key(tmp_path, edit, key):
    path = _network_copy(tmp_path, edit)
    with pytest.raises(InputError) as exc:
        network_catalog(path)
    assert exc.value.source == path and exc.value.key == key


def test_the_shipped_network_catalog_loads_with_numbers_only():
    net = network_catalog()
    for kind in ("ethernet_tcp", "infiniband"):
        for parts in net[kind].values():
            assert set(parts) == {"nic", "switch_port", "cable"}


def test_an_implausible_server_price_says_the_bound():
    """$1,000,000 per GPU: the dearest server in ownership.yaml is about $63,000 per GPU."""
    data = yaml.safe_load(_shipped("ownership.yaml"))
    assert max(e["price"] / e["gpus"] for e in data["servers"].values()) < 1_000_000 / 10


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda d: d["p5.48xlarge"].update(price_per_hour=1e30), "instances.p5.48xlarge.price_per_hour"),
        (
            lambda d: d["p5.48xlarge"].update(price_per_hour=float("nan")),
            "instances.p5.48xlarge.price_per_hour",
        ),
        (lambda d: d["p5.48xlarge"].update(colour="red"), "instances.p5.48xlarge.colour"),
        (lambda d: d["p5.48xlarge"].pop("provider"), "instances.p5.48xlarge.provider"),
        (lambda d: d["p5.48xlarge"]["nic"].update(speed=1), "instances.p5.48xlarge.nic.speed"),
    ],
)
def test_a_bad_instance_names_the_file_and_key(tmp_path, edit, key):
    data = yaml.safe_load(_shipped("instances.yaml"))
    edit(data["instances"])
    path = tmp_path / "inst.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError) as exc:
        load_instances(str(path))
    assert exc.value.source == str(path) and exc.value.key == key


def _one_line_error(result, *words):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "$nan" not in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert all(w in result.output for w in words), result.output


@pytest.mark.parametrize(("edit", "key"), NETWORK_EDITS[:4] + NETWORK_EDITS[5:6])
def test_plan_compare_and_have_refuse_a_bad_network_catalog_in_one_line(tmp_path, edit, key):
    path = _network_copy(tmp_path, edit)
    runner = CliRunner()
    plan = ["plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d", "--samples", "0"]
    for args in (
        [*plan, "--candidates", "examples/planner-bert-gpt-ethernet.yaml"],
        [*plan, "--have", "examples/team-a100-40gb-25gbe.yaml"],
        [*plan, "--have", "examples/team-a100-40gb-25gbe.yaml", "--json"],
        ["compare", "examples/team-a100-40gb-25gbe.yaml", "--gpus", "16", "--steps", "100", "--samples", "0"],
    ):
        _one_line_error(runner.invoke(app, [*args, "--network-prices", path]), path, key)


def test_report_refuses_a_bad_network_catalog_in_one_line(tmp_path, tmp_path_factory):
    from tests.conftest import swept_results
    from tests.test_planner_report import SWEEP

    vary = {"model": ["BERT-Large"], "gpus": [16], "nic_gbps": [25], "optimizer": ["adam"]}
    results = swept_results(tmp_path_factory, "pricefix", {**SWEEP, "vary": vary, "samples": 0})
    path = _network_copy(tmp_path, NETWORK_EDITS[0][0])
    args = ["report", str(results), "--out", str(tmp_path / "r.html"), "--samples", "0"]
    for extra in ([], ["--json"]):
        _one_line_error(CliRunner().invoke(app, [*args, *extra, "--network-prices", path]), path, "nic")
    assert not (tmp_path / "r.html").exists()


def test_compare_takes_the_users_ownership_and_instance_catalogs(tmp_path):
    """compare's pricing messages name --own-prices and --instances: compare has them."""
    own = yaml.safe_load(_shipped("ownership.yaml"))
    own["servers"]["A100-40GB"]["price"] = 2 * own["servers"]["A100-40GB"]["price"]
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(own))
    args = ["compare", "examples/team-a100-40gb-25gbe.yaml", "--gpus", "16", "--steps", "1000"]
    args += ["--samples", "0", "--optimizers", "adam", "--break-even-at", "0", "--json"]
    import json

    shipped = json.loads(CliRunner().invoke(app, args).stdout)["costs"][0]
    mine = json.loads(CliRunner().invoke(app, [*args, "--own-prices", str(path)]).stdout)["costs"][0]
    assert mine["capital_usd"] > 1.9 * shipped["capital_usd"] - 1


def test_pricing_advice_names_only_options_that_exist_and_could_work():
    """An L4 (no server price, no instance, no per-GPU rate) in compare: not "--cost own" where owning
    cannot price it, nor "--cost rent" alone where renting cannot; --have (no --cost): --own-prices."""
    runner = CliRunner()
    args = ["compare", "examples/team-a100-40gb-25gbe.yaml", "--set", "cluster.gpu=L4"]
    args += ["--set", "cluster.intra_node.fabric=pcie", "--steps", "1000", "--samples", "0", "--gpus", "16"]
    args += ["--optimizers", "adam", "--break-even-at", "0"]
    default = runner.invoke(app, args)
    assert default.exit_code == 0 and "cost not shown" in default.stdout
    assert "(--cost own --own-prices FILE)" in default.stdout and "--price" not in default.stdout
    owned = runner.invoke(app, [*args, "--cost", "own"])
    _one_line_error(owned, "--own-prices FILE", "--instances FILE")
    assert "or price it as rented (--cost rent)\n" not in owned.output
    rented = runner.invoke(app, [*args, "--cost", "rent"])
    _one_line_error(rented, "--instances FILE", "--cost own --own-prices FILE")
    assert "--price" not in rented.output


def test_plan_have_with_an_unpriced_gpu_names_own_prices_only(tmp_path):
    have = tmp_path / "l4.yaml"
    text = Path("examples/team-a100-40gb-25gbe.yaml").read_text()
    have.write_text(text.replace("A100-40GB", "L4").replace("fabric: nvswitch", "fabric: pcie"))
    args = ["plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d", "--samples", "0"]
    r = CliRunner().invoke(app, [*args, "--have", str(have)])
    _one_line_error(r, "no server price for L4", "--own-prices FILE")
    assert "--cost" not in r.output


@pytest.mark.parametrize("option", ["--instances", "--own-prices", "--network-prices"])
def test_a_price_file_that_is_not_yaml_is_one_line_naming_it(runner, tmp_path, option):
    from clustersim.cli import app

    bad = tmp_path / "bad.yaml"
    bad.write_text("instances: [1,2\n")
    r = runner.invoke(
        app, ["compare", "preset:default", "--steps", "1000", option, str(bad), "--samples", "0"]
    )
    assert r.exit_code == 2, r.output
    assert f"{bad}: invalid YAML at line 2" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize(
    ("command", "rented", "words"),
    [
        (["plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d"], ["--cost", "rent"], []),
        (["plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d"], ["--price", "3"], []),
        (["compare", "preset:default", "--steps", "1000"], ["--cost", "rent"], []),
        (
            ["plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d"],
            ["--instance", "p4d.24xlarge"],
            ["--cost own without --instance"],
        ),
    ],
)
def test_own_prices_with_a_rented_run_is_refused_not_ignored(tmp_path, command, rented, words):
    """`--cost rent --own-prices FILE` (or a flat --price, or --instance) priced the run as rented and
    never read FILE, without a word: the user's ownership figures looked applied. Refused in one line
    naming --own-prices and what made the run rented, exit 2."""
    path = tmp_path / "own.yaml"
    path.write_text(_shipped("ownership.yaml"))
    r = CliRunner().invoke(app, [*command, *rented, "--own-prices", str(path), "--samples", "0"])
    what = " ".join(rented) if rented[0] == "--cost" else rented[0]
    _one_line_error(r, "--own-prices:", f"{what} prices the run as rented", "drop --own-prices", *words)


@pytest.mark.parametrize(
    ("command", "rented"),
    [
        (["plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d"], ["--cost", "rent"]),
        (["plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d"], ["--price", "3"]),
        (["compare", "preset:default", "--steps", "1000"], ["--cost", "rent"]),
    ],
)
def test_network_prices_with_a_rented_run_is_refused_not_ignored(tmp_path, command, rented):
    """A rented cluster's network is the instance's as sold (or inside a flat price): the network price
    catalog would go unread without a word, as --own-prices would. Refused in one line, exit 2."""
    path = tmp_path / "net.yaml"
    path.write_text(_shipped("network_prices.yaml"))
    r = CliRunner().invoke(app, [*command, *rented, "--network-prices", str(path), "--samples", "0"])
    _one_line_error(r, "--network-prices:", "comes with the instance", "drop --network-prices")
