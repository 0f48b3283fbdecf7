"""The two cost models against hand computation, their bands, and their input checks."""

from __future__ import annotations

import math

import pytest
import yaml

from clustersim.errors import InputError
from clustersim.report.costing import (
    Z90,
    cost_band,
    cost_model,
    load_instances,
    load_ownership,
    sigma_of,
)

A100_25G = {
    "nodes": 16,
    "gpus_per_node": 8,
    "gpu": "A100-40GB",
    "nic": {"kind": "ethernet_tcp", "count": 1, "line_rate_gbps": 25},
}


def test_owned_hour_by_hand():
    """16 DGX A100 on 25 GbE: servers $192,600 each and a $752 network port each (NIC $423 + cable $83
    + leaf port $246), over 3 x 8,766 h at 100%; power 6.5 kW x PUE 1.58 x $0.1194/kWh per node."""
    p = cost_model("own").price(A100_25G)
    life = 3 * 8766 * 1.0
    assert p.parts["servers"] == pytest.approx(16 * 192_600 / life)
    assert p.parts["network"] == pytest.approx(16 * (423 + 83 + 246) / life)
    assert p.parts["power"] == pytest.approx(16 * 6.5 * 1.58 * 0.1194)
    assert p.per_hour == pytest.approx(sum(p.parts.values()))
    assert p.capital == pytest.approx(16 * (192_600 + 752))
    text = p.describe(100.0)
    assert text.startswith("owned: $") and "amortised over 3 years at 100% utilisation" in text
    assert f"${100 * p.parts['power']:,.0f} power" in text


def test_upgrade_capital_is_the_network_price_per_port():
    """What the NICs cost for 16 nodes: 100 GbE $22,640 (713 + 330 + 372 per node), 200 Gb InfiniBand
    $32,688 (925 + 660 + 458)."""
    own = cost_model("own")
    for nic, expected in (
        ({"kind": "ethernet_tcp", "count": 1, "line_rate_gbps": 100}, 22_640),
        ({"kind": "infiniband", "count": 1, "line_rate_gbps": 200}, 32_688),
    ):
        assert own.capital({**A100_25G, "nic": nic})[1] == pytest.approx(expected)


def test_utilisation_and_amortisation_scale_the_capital(tmp_path):
    data = yaml.safe_load(_shipped("ownership.yaml"))
    data["utilisation"] = 0.5
    data["amortisation_years"] = 5
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(data))
    base = cost_model("own").price(A100_25G)
    mine = cost_model("own", own_prices=str(path)).price(A100_25G)
    assert mine.parts["servers"] == pytest.approx(base.parts["servers"] * 3 / (5 * 0.5))
    assert mine.parts["power"] == pytest.approx(base.parts["power"])


def _shipped(name: str) -> str:
    from importlib import resources

    return resources.files("clustersim.catalogs").joinpath(name).read_text()


def test_rented_hour_is_the_instances_price_and_nothing_else():
    """128 H100 on p5.48xlarge: 16 instances x $55.04, network included (no network part)."""
    p = cost_model("rent").price(
        {**A100_25G, "gpu": "H100-SXM", "nic": {"kind": "infiniband", "count": 32, "line_rate_gbps": 100}}
    )
    assert p.per_hour == pytest.approx(16 * 55.04)
    assert p.parts == {"rent": pytest.approx(16 * 55.04)}
    assert "p5.48xlarge" in p.basis and "included" in p.basis and p.warning is None
    # a network other than the instance's is named, not priced on top
    other = cost_model("rent").price({**A100_25G, "gpu": "H100-SXM"})
    assert other.per_hour == pytest.approx(p.per_hour) and "sold with 32 x 100 Gb/s EFA" in other.warning


def test_rent_picks_the_instance_with_the_simulated_network():
    ib = {"kind": "infiniband", "count": 8, "line_rate_gbps": 200}
    p = cost_model("rent").price({**A100_25G, "nic": ib})
    assert p.extra["instance"] == "Standard_ND96asr_v4" and p.warning is None
    cheapest = cost_model("rent").price(A100_25G)  # no instance sells 25 GbE: the cheapest per GPU
    assert cheapest.extra["instance"] == "p4d.24xlarge"
    assert cheapest.per_hour == pytest.approx(16 * 21.957642)


def test_rent_at_a_flat_rate_and_a_single_machine_product():
    p = cost_model(price=3.0).price(A100_25G)
    assert p.model == "rent" and p.per_hour == pytest.approx(128 * 3.0) and "(--price)" in p.basis
    rent = cost_model("rent")
    assert [i["name"] for i in rent.sold_for("H100-SXM", 1)][0] == "lambda-8x-h100-sxm"
    assert "lambda-8x-h100-sxm" not in [i["name"] for i in rent.sold_for("H100-SXM", 2)]


def test_band_combines_price_and_time_in_quadrature():
    assert sigma_of(0.25) == pytest.approx(math.log(1.25) / Z90)
    lo, hi = cost_band(100.0, sigma_of(0.25), None, None)
    assert lo == pytest.approx(100 / 1.25) and hi == pytest.approx(125.0)
    lo, hi = cost_band(100.0, 0.0, 0.9, 1.2)
    assert lo == pytest.approx(90.0) and hi == pytest.approx(120.0)
    lo, hi = cost_band(100.0, sigma_of(0.2), 0.9, 1.2)
    assert hi == pytest.approx(100 * math.exp(math.hypot(math.log(1.2), math.log(1.2))))
    assert lo < 90.0 and hi > 120.0


def test_owned_band_weights_each_part_by_its_share():
    p = cost_model("own").price(A100_25G)
    w = {k: v / p.per_hour for k, v in p.parts.items()}
    power = math.sqrt(sigma_of(0.25) ** 2 + sigma_of(0.25) ** 2 + sigma_of(0.4) ** 2)
    expected = math.sqrt(
        (w["servers"] * sigma_of(0.3)) ** 2 + (w["network"] * sigma_of(0.5)) ** 2 + (w["power"] * power) ** 2
    )
    assert p.sigma == pytest.approx(expected)


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (
            lambda d: d["instances"]["p5.48xlarge"].update(price_per_hour=-1),
            "instances.p5.48xlarge.price_per_hour",
        ),
        (lambda d: d["instances"]["p5.48xlarge"].update(gpu="H900"), "instances.p5.48xlarge.gpu"),
        (lambda d: d["instances"]["p5.48xlarge"]["nic"].update(kind="efa"), "instances.p5.48xlarge.nic.kind"),
        (lambda d: d["instances"]["p5.48xlarge"].update(gpus=7.5), "instances.p5.48xlarge.gpus"),
    ],
)
def test_bad_instance_entries_name_file_and_key(tmp_path, edit, key):
    data = yaml.safe_load(_shipped("instances.yaml"))
    edit(data)
    path = tmp_path / "inst.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError) as exc:
        load_instances(str(path))
    assert exc.value.source == str(path) and exc.value.key == key


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda d: d["servers"]["H100-SXM"].update(price=-5), "servers.H100-SXM.price"),
        (lambda d: d.update(utilisation=1.5), "utilisation"),
        (lambda d: d["pue"].update(value=0.9), "pue.value"),
        (lambda d: d.update(amortisation_years=0), "amortisation_years"),
        (lambda d: d["servers"]["H100-SXM"].update(price=1e30), "servers.H100-SXM.price"),
        (lambda d: d["servers"]["H100-SXM"].update(price=float("nan")), "servers.H100-SXM.price"),
        (lambda d: d["servers"]["H100-SXM"].update(pricee=1), "servers.H100-SXM.pricee"),
        (lambda d: d.update(amortisation_years=float("inf")), "amortisation_years"),
        (lambda d: d["pue"].update(value=float("nan")), "pue.value"),
        (lambda d: d.update(bogus=1), "bogus"),
    ],
)
def test_bad_ownership_entries_name_file_and_key(tmp_path, edit, key):
    data = yaml.safe_load(_shipped("ownership.yaml"))
    edit(data)
    path = tmp_path / "own.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError) as exc:
        load_ownership(str(path))
    assert exc.value.source == str(path) and exc.value.key == key


def test_unknown_instance_and_unpriced_gpu_are_input_errors():
    with pytest.raises(InputError, match="unknown instance") as exc:
        cost_model("rent", instance="p9.huge")
    assert exc.value.key == "--instance"
    with pytest.raises(InputError, match="no server price for L4"):
        cost_model("own").price({**A100_25G, "gpu": "L4"})
    with pytest.raises(InputError, match="sells H100-SXM, not A100-40GB"):
        cost_model("rent", instance="p5.48xlarge").price(A100_25G)
    with pytest.raises(InputError, match="must be own or rent"):
        cost_model("lease")


def test_compare_names_the_cluster_and_set_values_and_prices_by_one_model():
    from typer.testing import CliRunner

    from clustersim.cli import app

    args = ["compare", "examples/team-a100-40gb-25gbe.yaml", "--gpus", "16", "--samples", "0"]
    args += ["--break-even-at", "0", "--set", "workload.micro_batch=8", "--optimizers", "adam,binsgdm"]
    r = CliRunner().invoke(app, [*args, "--steps", "1000"])
    assert r.exit_code == 0, r.output
    header = r.stdout.splitlines()[0]
    assert "8 x A100-40GB per node" in header and "25 Gb/s Ethernet per node" in header
    assert "--set workload.micro_batch=8" in header and "micro-batch 8" in header
    assert "Cost to train" in r.stdout and "cost: owned: each size's capital amortised" in r.stdout
    rented = CliRunner().invoke(app, [*args, "--steps", "1000", "--cost", "rent"])
    assert rented.exit_code == 0, rented.output
    assert "cost: rented as p4d.24xlarge at $21.96/h each" in rented.stdout
    assert "2 x p4d.24xlarge" in rented.stdout  # the instances, in the table's column
    assert "is sold with 4 x 100 Gb/s EFA" in rented.stdout  # the network simulated is not the instance's
    assert "Cost to train" not in CliRunner().invoke(app, args).stdout  # no steps, no cost


def test_compare_refuses_an_unpriced_owned_gpu_before_printing_anything():
    from typer.testing import CliRunner

    from clustersim.cli import app

    args = ["compare", "preset:default", "--gpus", "16", "--steps", "1000", "--samples", "0", "--cost", "own"]
    r = CliRunner().invoke(app, [*args, "--set", "cluster.gpu=V100-PCIe", "--optimizers", "adam,binsgdm"])
    assert r.exit_code == 2
    assert r.stdout == "" and "no server price for V100-PCIe" in r.stderr


def test_the_default_model_is_owned_where_every_gpu_has_a_server_price_else_rented():
    from clustersim.report.costing import Own, Rent, auto_model

    assert isinstance(auto_model({"A100-40GB", "H100-SXM"}), Own)
    rented = auto_model({"A100-40GB", "V100-PCIe"})  # one model for every row, never a mix
    assert isinstance(rented, Rent) and "no server price for V100-PCIe" in rented.describe()
    p = rented.price({**A100_25G, "gpu": "V100-PCIe", "nodes": 2})
    assert p.per_hour == pytest.approx(16 * 3.06) and "prices.yaml" in p.basis  # no instance sells it


def test_a_b200_node_is_owned_at_its_reported_list_price_less_its_adapters():
    from clustersim.report.costing import Own, auto_model, load_ownership

    entry = load_ownership(None)["servers"]["B200"]
    assert entry["price"] == 515_000 - 8 * 1_200 and "DGX B200" in entry["source"]
    owned = auto_model({"B200", "H100-SXM"})
    assert isinstance(owned, Own)
    p = owned.price({**A100_25G, "gpu": "B200", "nodes": 2})
    assert p.capital > 2 * entry["price"]  # servers and their network
    assert p.parts["power"] == pytest.approx(2 * 11.9 * 1.58 * 0.1194)


def test_a_budget_caps_an_owners_capital_and_power_and_a_renters_hours():
    """An owned run's cost is its share of the servers' life; a team with $3M must buy the cluster, so
    --budget caps the capital plus the run's power."""
    from clustersim.report.analysis import recommendation

    owned = {"optimizer": "adam", "cluster": "c", "ttt_h": 10.0, "cost": 1_000.0, "outlay": 3_100_000.0}
    owned |= {"cost_model": "own", "baseline": None}
    rented = {"optimizer": "adam", "cluster": "r", "ttt_h": 12.0, "cost": 2_000_000.0, "outlay": 2_000_000.0}
    rented |= {"cost_model": "rent", "baseline": None}
    rec = recommendation([owned, rented], deadline_h=100, budget=3_000_000)
    assert rec["chosen"] is rented
    rec = recommendation([owned], deadline_h=100, budget=3_000_000)
    assert rec["chosen"] is None and "needs $3,100,000 (capital and power)" in rec["text"][0]


def test_plan_says_which_model_priced_it_and_rents_the_instances_as_sold():
    """GPUs were priced at cloud on-demand rates and the network at its purchase price amortised: now a
    plan is owned or rented, whole, and says so; rented, its candidates are instances as sold."""
    import json

    from typer.testing import CliRunner

    from clustersim.cli import app

    args = [
        "plan",
        "--model",
        "BERT-Large",
        "--steps",
        "1000",
        "--deadline",
        "30d",
        "--samples",
        "0",
        "--json",
    ]
    owned = json.loads(CliRunner().invoke(app, args).stdout)
    assert owned["pricing"].startswith("owned:") and owned["chosen"]["cost_model"] == "own"
    assert owned["chosen"]["cost_basis"].startswith("owned: $") and owned["chosen"]["capital"] > 0
    rented = json.loads(CliRunner().invoke(app, [*args, "--cost", "rent"]).stdout)
    assert rented["pricing"].startswith("rented:") and rented["chosen"]["cost_model"] == "rent"
    assert rented["chosen"]["network_cost"] == 0.0 and "included" in rented["chosen"]["cost_basis"]
    assert " on " in rented["chosen"]["cluster"]  # names the instance it rents
    assert rented["chosen"]["cost_warning"] is None  # simulated on the instance's own network


def test_bad_cost_files_and_options_are_one_line_from_the_cli(tmp_path):
    from typer.testing import CliRunner

    from clustersim.cli import app

    bad = tmp_path / "inst.yaml"
    data = yaml.safe_load(_shipped("instances.yaml"))
    data["instances"]["p5.48xlarge"]["price_per_hour"] = -55.04
    bad.write_text(yaml.safe_dump(data))
    args = ["plan", "--model", "BERT-Large", "--steps", "100", "--deadline", "3d", "--samples", "0"]
    for extra, words in (
        (["--cost", "rent", "--instances", str(bad)], [str(bad), "instances.p5.48xlarge.price_per_hour"]),
        (["--cost", "rent", "--instance", "p9.huge"], ["--instance", "unknown instance 'p9.huge'"]),
        (["--cost", "lease"], ["--cost", "must be own or rent"]),
        (["--own-prices", str(tmp_path / "none.yaml")], ["none.yaml", "file not found"]),
    ):
        r = CliRunner().invoke(app, [*args, *extra])
        assert r.exit_code == 2 and "Traceback" not in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1 and all(w in r.output for w in words), r.output


def test_hardware_show_says_what_each_cost_model_knows_of_a_gpu():
    from typer.testing import CliRunner

    from clustersim.cli import app

    r = CliRunner().invoke(app, ["hardware", "show", "H100-SXM"])
    assert r.exit_code == 0, r.output
    assert "owned: $300,400 per 8-GPU server, 8.5 kW" in r.stdout
    assert "rented: p5.48xlarge (AWS) $55.04/h for 8 GPUs, network 32 x 100 Gb/s EFA" in r.stdout
    v100 = CliRunner().invoke(app, ["hardware", "show", "V100-PCIe"]).stdout
    assert "owned: no server price" in v100 and "rented: no instance sells it" in v100


def test_compare_json_and_the_api_carry_the_costs_the_table_prints():
    """compare's table, its --json and clustersim.compare() price each cell by the same function: the same
    cost model, the same dollars and band, and json.dumps of the API's to_dict() works."""
    import json

    from typer.testing import CliRunner

    import clustersim
    from clustersim.cli import app

    scenario = "examples/team-a100-40gb-25gbe.yaml"
    args = ["compare", scenario, "--gpus", "16", "--samples", "0", "--break-even-at", "0"]
    args += ["--optimizers", "adam,binsgdm", "--steps", "1000"]
    table = CliRunner().invoke(app, args)
    assert table.exit_code == 0, table.output
    doc = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert doc["cost_error"] is None and [c["optimizer"] for c in doc["costs"]] == ["adam", "binsgdm"]
    for c in doc["costs"]:
        assert c["cost_model"] == "own" and c["capital_usd"] > 0 and c["band"] == "price only"
        assert c["cost_p10_usd"] < c["cost_usd"] < c["cost_p90_usd"]
        assert f"${c['cost_usd']:,.0f} ({c['cost_p10_usd']:,.0f}–{c['cost_p90_usd']:,.0f})" in table.stdout
    api = clustersim.compare(
        scenario, ["adam", "binsgdm"], [16], samples=0, break_even_at=0, steps=1000, cost="rent"
    )
    assert {c["cost_model"] for c in api.costs} == {"rent"}
    assert json.loads(json.dumps(api.to_dict()))["costs"] == api.costs
    owned = clustersim.compare(scenario, ["adam", "binsgdm"], [16], samples=0, break_even_at=0, steps=1000)
    assert [round(c["cost_usd"], 6) for c in owned.costs] == [round(c["cost_usd"], 6) for c in doc["costs"]]
    assert clustersim.compare(scenario, ["adam"], [16], samples=0, break_even_at=0).costs == []  # no steps
    with pytest.raises(InputError, match="own or rent"):
        clustersim.compare(scenario, ["adam"], [16], samples=0, break_even_at=0, steps=1000, cost="lease")


def test_a_rented_instance_names_its_network_as_its_provider_sells_it():
    """A plan row rented on an instance as sold says the instance's network in its provider's words (AWS's
    EFA, simulated as an RDMA fabric of the InfiniBand kind, is not labelled InfiniBand)."""
    from clustersim.planner.planning import plan
    from clustersim.report.costing import cost_model

    result = plan("GPT-3-1.3B", 1000, 720.0, None, None, None, None, samples=0, costs=cost_model("rent"))
    rows = [result["chosen"], *result["runners_up"], result["fastest"]]
    aws = [r for r in rows if str(r.get("instance", "")).startswith("p")]
    assert aws, [r.get("instance") for r in rows]
    for r in aws:
        assert "EFA" in r["cluster"] and "InfiniBand" not in r["cluster"], r["cluster"]
    single = [r for r in rows if r.get("instance") == "lambda-8x-h100-sxm"]
    assert all("single machine" in r["cluster"] and "Ethernet" not in r["cluster"] for r in single)


@pytest.mark.parametrize("cost", [[], ["--cost", "rent"], ["--cost", "rent", "--instance", "p4d.24xlarge"]])
def test_compare_says_its_cost_model_once_not_per_gpu_count(cost):
    """compare printed "16 GPUs: owned: $386,704 capital amortised over 3 years ..." and the same line
    again for every GPU count: the cost model is said once, what grows with the cluster (an owned
    cluster's capital, the instances rented) is the table's column, a warning said once."""
    from typer.testing import CliRunner

    from clustersim.cli import app

    args = ["compare", "examples/team-a100-40gb-25gbe.yaml", "--gpus", "16,32,64", "--samples", "0"]
    args += ["--break-even-at", "0", "--optimizers", "adam,binsgdm", "--steps", "1000", *cost]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    after = r.stdout.split("Cost to train")[1].splitlines()
    said = [line for line in after if line.startswith(("cost:", "note", "16 GPUs", "32 GPUs"))]
    assert [line.split(":")[0] for line in said] == ["cost"] + ["note"] * bool(cost), said
    rows = {line.split()[0]: line for line in after[2:8]}
    assert set(rows) == {"16", "32", "64"}
    if not cost:  # owned: each size's capital in its row
        assert "capital" in after[1] and "$386,704" in rows["16"] and "$773,408" in rows["32"]
    else:
        assert "2 x p4d.24xlarge" in rows["16"] and "8 x p4d.24xlarge" in rows["64"]
