"""What `calibrate show` says about the network a profile measured.

* Rates are printed in a unit a user reads: a profile fitted from the shipped 200 Mb/s testbed sweep
  showed its collectives as "0.02 GB/s" (and a 35 Mb/s broadcast as "0.00 GB/s"); links and collectives
  are now in bits per second to three figures (200 Mb/s), memory in bytes per second (3.86 TB/s), while
  --json keeps the profile's numbers in the units its format names.
* A profile that measured no collective (the shipped one-GPU profiles) says so, and that the defaults
  price every collective.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import pytest

from clustersim.units import format_link_rate, format_rate
from tests.inputs_support import invoke

SHIPPED = resources.files("clustersim.validation").joinpath("testbed", "gloo-8hosts-200mbit.json")


def test_rates_read_in_three_figures_in_their_unit():
    assert format_link_rate(0.2) == "200 Mb/s"
    assert format_link_rate(100) == "100 Gb/s"
    assert format_link_rate(25.78125) == "25.8 Gb/s"
    assert format_link_rate(1) == "1.00 Gb/s"
    assert format_link_rate(0.9996) == "1.00 Gb/s"  # rounded before the unit is chosen
    assert format_rate(2.5e7, bits=True) == "200 Mb/s"  # bytes per second in, bits out
    assert format_rate(4.4e6, bits=True) == "35.2 Mb/s"
    assert format_rate(3.8645e12, bits=False) == "3.86 TB/s"
    assert format_rate(52e9, bits=False) == "52.0 GB/s"
    assert format_rate(69.9e6, bits=False) == "69.9 MB/s"


@pytest.fixture(scope="module")
def testbed_profile(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("tb") / "tb200.json"
    r = invoke("calibrate", "fit", SHIPPED, "--out", out)
    assert r.exit_code == 0, r.output
    return str(out)


def test_show_prints_a_200_mbit_profile_in_mb_per_s(testbed_profile, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    text = invoke("calibrate", "show", testbed_profile).output
    assert "link per host: 200 Mb/s (ethernet_tcp)" in text
    collectives = text[text.index("Collective fits") :]
    assert "GB/s" not in collectives, collectives  # was "0.02 GB/s", "0.00 GB/s"
    rates = re.findall(r"([0-9][0-9.,]*) (Mb/s|Gb/s)", collectives)
    assert len(rates) > 12 * 6, rates  # the 12 fits' segments and the 12 x 6 bus bandwidths
    for number, _ in rates:  # three significant figures, never "0.02"
        assert len(number.replace(".", "").replace(",", "").lstrip("0")) == 3, number
    # the fitted network's rate, next to the line rate it is relative to
    assert re.search(
        r"network links: 1 x ethernet_tcp NIC at 200 Mb/s line rate per node; fitted rate per NIC 1\d\d Mb/s",
        text,
    )


def test_show_json_keeps_the_documented_units(testbed_profile):
    shown = json.loads(invoke("calibrate", "show", testbed_profile, "--json").stdout)
    stored = json.loads(Path(testbed_profile).read_text())
    assert shown["provenance"]["testbed"]["line_rate_gbps"] == 0.2  # Gb/s
    assert shown["collectives"] == stored["collectives"]  # busbw in GB/s, β in s per byte
    busbw = [b for f in shown["collectives"] for _, b in f["busbw_by_size"]]
    assert min(busbw) > 0.003 and max(busbw) < 0.025  # GB/s of a 200 Mb/s (0.025 GB/s) link


def test_a_testbed_profile_says_its_network_was_measured(testbed_profile):
    coverage = json.loads(invoke("calibrate", "show", testbed_profile, "--json").stdout)["network_coverage"]
    assert coverage["collectives_measured"] and coverage["network_measured"] and coverage["model_fitted"]
    assert coverage["summary"].startswith("collective model fitted on groups 2x1, 4x1, 8x1")


@pytest.mark.parametrize("name", ["h200-pytorch-2.11", "h100-pytorch-2.11"])
def test_a_one_gpu_profile_says_it_measured_no_network(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    text = " ".join(invoke("calibrate", "show", f"builtin:{name}").output.split())
    assert "network: no collective or network was measured (one device" in text
    assert "every collective is priced by the topology model with the default constants" in text
    coverage = json.loads(invoke("calibrate", "show", f"builtin:{name}", "--json").stdout)["network_coverage"]
    assert not coverage["collectives_measured"] and not coverage["network_measured"]
    assert not coverage["model_fitted"] and "default constants" in coverage["summary"]


def test_a_profile_of_one_host_says_no_network_between_nodes_was_measured():
    coverage = json.loads(invoke("calibrate", "show", "builtin:cpu-2core-gloo", "--json").stdout)[
        "network_coverage"
    ]
    assert coverage["collectives_measured"] and not coverage["network_measured"]
    assert "no network between nodes was measured" in coverage["summary"]


def test_help_says_what_show_does():
    show = " ".join(invoke("calibrate", "show", "--help").output.split())
    assert "whether a collective and a network between nodes were measured" in show
