"""What-if under a profile: exact-shape collective fits replay a measured time, so they apply only on
the hardware they were measured on; on any other NIC, fabric or device the profile's fitted model
parameters price the scenario's own links, and the output says which and names the differing cluster.

The profile is the one a user gets from the shipped 8-host 200 Mb/s testbed sweep (README, "Calibrate
small, predict large"); before, a 2-host DDP step took the same time at 0.2, 1 and 10 Gb/s.
"""

import json
from pathlib import Path

import pytest
import yaml

from clustersim.calibration.fit import build_profile
from clustersim.calibration.profile import parse_profile
from clustersim.cost_models.measured_collectives import MeasuredCollectives, hardware_differences
from clustersim.scenario import ClusterSpec, validate_scenario
from clustersim.simulator.runner import simulate

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ROOT / "clustersim/validation/testbed/gloo-8hosts-200mbit.json"
EXAMPLE = ROOT / "examples/testbed-cpu-hosts.yaml"


@pytest.fixture(scope="module")
def profile():
    example = yaml.safe_load(EXAMPLE.read_text())
    cluster = ClusterSpec.model_validate(example["cluster"])
    data = build_profile(json.loads(SWEEP.read_text()), cluster=cluster)
    return parse_profile(data, "tb.json")


def _scenario(rate_gbps: float, nodes: int = 2, **cluster):
    data = yaml.safe_load(EXAMPLE.read_text())
    data["cluster"]["nodes"] = nodes
    data["cluster"]["nic"]["line_rate_gbps"] = rate_gbps
    data["cluster"].update(cluster)
    return validate_scenario(data, source="whatif.yaml")


def _without_fits(profile):
    return parse_profile({**profile.model_dump(mode="json"), "collectives": []}, "model-only.json")


def test_each_line_rate_gets_its_own_time(profile):
    results = {r: simulate(_scenario(r), profile) for r in (0.2, 1.0, 10.0)}
    times = [results[r].iteration_time for r in (0.2, 1.0, 10.0)]
    assert times[0] > 2 * times[1] > 4 * times[2], times
    # The measured rate replays the 2-host exact-shape fit ...
    measured = results[0.2]
    assert measured.sources.get("collectives (measured fits)") == "all_reduce"
    assert not any("another cluster" in n for n in measured.notes)
    # ... every other rate is the calibrated model on its own links, exactly as without any fit.
    for rate in (1.0, 10.0):
        r = results[rate]
        assert "collectives (measured fits)" not in r.sources
        assert any(k.startswith("collectives (topology model, calibrated") for k in r.sources)
        assert (
            f"NIC line rate {rate:g} Gb/s here, 0.2 Gb/s measured"
            in r.sources["collectives (measured fits not used)"]
        )
        (note,) = [n for n in r.notes if "another cluster" in n]
        assert profile.label in note and "\n" not in note
        model_only = simulate(_scenario(rate), _without_fits(profile))
        assert r.iteration_time == pytest.approx(model_only.iteration_time, rel=1e-12)


def test_the_fit_and_the_model_agree_where_the_fit_applies(profile):
    """At the measured rate the fit and the fitted model are two readings of the same sweep."""
    fit = simulate(_scenario(0.2), profile).iteration_time
    model = simulate(_scenario(0.2), _without_fits(profile)).iteration_time
    assert model == pytest.approx(fit, rel=0.15)


def test_only_the_parts_a_group_uses_are_compared(profile):
    measured = profile.network.cluster
    other = ClusterSpec.model_validate(
        {
            "nodes": 8,
            "gpus_per_node": 2,
            "gpu": "CPU-2vCPU",
            "intra_node": {"fabric": "nvswitch"},
            "nic": {"kind": "infiniband", "count": 2, "line_rate_gbps": 200},
            "fabric": {"kind": "leaf_spine", "nodes_per_leaf": 4},
        }
    )
    diff = hardware_differences(measured, other)
    assert set(diff) == {"intra", "nic", "fabric"}
    assert len(diff["nic"]) == 3  # kind, count, line rate
    fits = MeasuredCollectives.for_cluster(profile.collectives, other, measured)

    class Shape:
        def __init__(self, nodes, gpus_per_node):
            self.nodes, self.gpus_per_node, self.sharing = nodes, gpus_per_node, 1
            self.ranks = nodes * gpus_per_node

    assert fits.relevant_differences(Shape(2, 1)) == diff["nic"]  # inside one leaf of 4
    assert fits.relevant_differences(Shape(8, 1)) == diff["nic"] + diff["fabric"]
    assert fits.predict("all_reduce", 1 << 20, Shape(2, 1)) is None
    assert fits.skipped == set(diff["nic"])
    same = MeasuredCollectives.for_cluster(profile.collectives, _scenario(0.2).cluster, measured)
    hit = same.predict("all_reduce", 1 << 20, Shape(2, 1))
    assert hit is not None and hit.algorithm == "measured" and not same.skipped


def test_another_device_is_named(profile):
    measured = profile.network.cluster
    diff = hardware_differences(measured, _scenario(0.2, gpu="H100-SXM").cluster)
    assert diff == {"device": ["device H100-SXM here, CPU-2vCPU measured"]}


def test_a_profile_without_its_cluster_keeps_its_fits(profile):
    """Where the profile does not say what it was measured on, a matching shape uses its fit."""
    no_network = parse_profile({**profile.model_dump(mode="json"), "network": None}, "old.json")
    r = simulate(_scenario(10.0), no_network)
    assert r.sources.get("collectives (measured fits)") == "all_reduce"
    assert "collectives (measured fits not used)" not in r.sources
