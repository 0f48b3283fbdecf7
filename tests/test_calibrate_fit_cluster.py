"""`calibrate fit --cluster` (and `calibrate check --cluster`) describing other links than the raw file
records is refused: a 200 Mb/s testbed sweep fitted as 100 Gb/s InfiniBand was accepted, and the fit took
the 500x for the links' efficiency (bw_eff.net_infiniband 0.002), mispricing every cluster the profile
was applied to. One line names the option and both rates, exit 2, nothing written; within 1% is fitted."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
import yaml

from tests.inputs_support import invoke, refused

SHIPPED = resources.files("clustersim.validation").joinpath("testbed", "gloo-8hosts-200mbit.json")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "testbed-cpu-hosts.yaml"


@pytest.fixture(autouse=True)
def _no_heartbeat(monkeypatch):
    """The refusal is one line: a loaded machine's heartbeat ("working, 2.0 s elapsed") is not its part."""
    from clustersim.commands import support

    monkeypatch.setattr(support, "HEARTBEAT_AFTER_S", 1e9)


def _cluster(tmp_path, kind: str, gbps: float) -> str:
    data = yaml.safe_load(EXAMPLE.read_text())
    data["cluster"]["nic"].update(kind=kind, line_rate_gbps=gbps)
    path = tmp_path / f"{kind}-{gbps:g}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize(
    ("kind", "gbps", "theirs"),
    [
        ("infiniband", 100, "infiniband at 100 Gb/s"),
        ("ethernet_tcp", 100, "ethernet_tcp at 100 Gb/s"),
        ("ethernet_tcp", 0.203, "ethernet_tcp at 203 Mb/s"),  # 1.5%: beyond the tolerance
    ],
)
def test_fit_refuses_a_cluster_that_contradicts_the_recorded_link(tmp_path, kind, gbps, theirs):
    out = tmp_path / "p.json"
    out.write_text("{}")  # a previous file stays as it was
    r = invoke("calibrate", "fit", SHIPPED, "--cluster", _cluster(tmp_path, kind, gbps), "--out", out)
    refused(
        r,
        "--cluster",
        theirs,
        "ethernet_tcp at 200 Mb/s",
        "provenance.testbed.line_rate_gbps",
        "leave --cluster out",
        "line_rate_gbps 0.2",
    )
    assert out.read_text() == "{}"


def test_a_rate_within_the_tolerance_is_fitted(tmp_path):
    out = tmp_path / "p.json"
    r = invoke(
        "calibrate", "fit", SHIPPED, "--cluster", _cluster(tmp_path, "ethernet_tcp", 0.201), "--out", out
    )
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["network"]["cluster"]["nic"]["line_rate_gbps"] == 0.201


def test_the_sweeps_topology_alone_is_checked_and_so_is_calibrate_check(tmp_path):
    raw = json.loads(SHIPPED.read_text())
    del raw["provenance"]["testbed"]
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(raw))
    ib, out = _cluster(tmp_path, "infiniband", 100), tmp_path / "p.json"
    fit = invoke("calibrate", "fit", path, "--cluster", ib, "--out", out)
    refused(fit, "--cluster", "topology.network.line_rate_gbps")
    assert not out.exists()
    refused(invoke("calibrate", "check", SHIPPED, "--cluster", ib), "--cluster", "200 Mb/s", "100 Gb/s")


def test_fit_help_says_what_it_does_and_what_cluster_must_match():
    fit = " ".join(invoke("calibrate", "fit", "--help").output.split())
    assert "Fit a profile from a raw measurement file and write it to --out" in fit
    assert "contradicts it is refused" in fit
