"""A profile fitted from a testbed sweep says what it was measured on: an emulated testbed (not real NICs),
its host count, each host's link rate and CPU share, the machine, and the ops, sizes and repeats swept
(provenance.testbed and provenance.collective_sweep, printed by `calibrate show` and in its --json).

The real testbed needs root and network namespaces, so these go through the shipped raw sweeps and the
functions that build the profile (calibrate_on_testbed with its testbed and sweep stood in for)."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path

import pytest

from clustersim.calibration.profile import load_profile, parse_profile
from clustersim.calibration.run import fit_file
from clustersim.errors import InputError
from tests.inputs_support import invoke, refused

TESTBED = resources.files("clustersim.validation").joinpath("testbed")


def _one_op(raw: dict, op: str = "all_reduce") -> dict:
    """The raw sweep with one op's records only: the provenance does not depend on the rest, the fit's
    time does."""
    return {**raw, "collectives": [r for r in raw["collectives"] if r["op"] == op]}


@pytest.fixture(scope="module")
def shares_raw() -> dict:
    """The sweep a `testbed validate` run took on quarter-core hosts at 200 Mb/s (a clustersim-raw file
    with the testbed's CPU shares recorded)."""
    return _one_op(json.loads(TESTBED.joinpath("mlp-zero3-200mbit-shares.json").read_text())["sweep"])


@pytest.fixture(scope="module")
def shares_profile(shares_raw, tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("shares")
    (folder / "raw.json").write_text(json.dumps(shares_raw))
    fit_file(folder / "raw.json", folder / "p.json", command="clustersim calibrate fit raw.json")
    return str(folder / "p.json")


def test_a_profile_from_a_testbed_sweep_shows_what_it_was_measured_on(shares_profile):
    r = invoke("calibrate", "show", shares_profile)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    for piece in (
        "testbed: emulated, not real NICs: 8 hosts (network namespaces + veth + bridge on one machine)",
        "machine vm, 2 cores, Linux 6.18.44-fc-v669",
        "link per host: 200 Mb/s (ethernet_tcp) shaped with tc tbf",
        "CPU per host: 0.25 core (CFS quota 1,000 µs per 4,000 µs, 1,000 µs slices)",
        "cores by host: h0 0, h1 1, h2 0, h3 1, h4 0, h5 1, h6 0, h7 1",
        "collectives swept: all_reduce; 12 sizes 4.00 KiB–8.00 MiB; groups (nodes x ranks) 2x1, 4x1, 8x1; "
        "5 timed repeats per size",
    ):
        assert piece in text, piece


def test_the_json_carries_the_testbed_as_the_sweep_recorded_it(shares_profile, shares_raw):
    r = invoke("calibrate", "show", shares_profile, "--json")
    assert r.exit_code == 0, r.output
    prov = json.loads(r.stdout)["provenance"]
    recorded = shares_raw["provenance"]["testbed"]
    testbed = prov["testbed"]
    for key in ("emulated", "hosts", "line_rate_gbps", "shaper", "cpus_per_host", "machine_cpus", "kernel"):
        assert testbed[key] == recorded[key], key
    assert testbed["host_cpu_shares"] == recorded["host_cpu_shares"]
    assert prov["collective_sweep"] == {
        "ops": ["all_reduce"],
        "groups": [[2, 1], [4, 1], [8, 1]],
        "sizes": 12,
        "min_bytes": 4096.0,
        "max_bytes": 8 * 2**20,
        "repeats": 5,
    }


def test_a_sweep_from_before_cpu_shares_says_not_recorded(tmp_path):
    raw = _one_op(json.loads(TESTBED.joinpath("gloo-8hosts-200mbit.json").read_text()))
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    profile = fit_file(tmp_path / "raw.json", tmp_path / "p.json")
    tb = profile.provenance.testbed
    assert tb is not None and tb.hosts == 8 and tb.line_rate_gbps == 0.2 and tb.cpus_per_host is None
    text = " ".join(invoke("calibrate", "show", tmp_path / "p.json").output.split())
    assert "CPU per host: not recorded" in text and "Linux 6.18.44-fc-v657" in text


def test_hosts_without_a_cpu_share_say_they_shared_the_machine(tmp_path, shares_raw):
    raw = copy.deepcopy(shares_raw)
    for where in (raw["provenance"]["testbed"], raw["topology"]["network"]):
        where.update(cpus_per_host=None, host_cpu_shares=None, cfs_bandwidth_slice_us=None)
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    assert fit_file(tmp_path / "raw.json", tmp_path / "p.json").provenance.testbed.cpus_per_host == 0
    text = " ".join(invoke("calibrate", "show", tmp_path / "p.json").output.split())
    assert "CPU per host: no share (the hosts shared the machine's cores)" in text


def test_an_old_profile_without_the_records_loads_and_reads_them_off_its_raw_medians(shares_profile):
    data = json.loads(Path(shares_profile).read_text())
    for key in ("testbed", "collective_sweep"):
        del data["provenance"][key]
    migrated = parse_profile(copy.deepcopy(data), "old.json").provenance
    # the topology's network kept in the profile says emulated; the machine was not kept
    assert migrated.testbed.hosts == 8 and migrated.testbed.cpus_per_host == 0.25
    assert migrated.testbed.kernel is None and migrated.testbed.machine is None
    assert migrated.collective_sweep.sizes == 12
    data["raw"] = {}
    bare = parse_profile(data, "old.json").provenance
    assert bare.testbed is None and bare.collective_sweep is None


def test_an_old_profile_without_raw_medians_shows_nothing_it_cannot_know(tmp_path, shares_profile):
    data = json.loads(Path(shares_profile).read_text())
    for key in ("testbed", "collective_sweep"):
        del data["provenance"][key]
    data["raw"] = {}
    (tmp_path / "old.json").write_text(json.dumps(data))
    r = invoke("calibrate", "show", tmp_path / "old.json")
    assert r.exit_code == 0, r.output
    assert "testbed:" not in r.output and "emulated" not in r.output and "collectives swept" not in r.output


@pytest.mark.parametrize("name", ["builtin:v100-bert-large-published"])
def test_a_profile_not_measured_on_the_testbed_says_no_testbed(name):
    assert load_profile(name).provenance.testbed is None
    assert "testbed:" not in invoke("calibrate", "show", name).output


@pytest.mark.parametrize(
    "change, key, says",
    [
        ({"line_rate_gbps": -1}, "provenance.testbed.line_rate_gbps", "greater than 0"),
        ({"line_rate_gbps": 1e6}, "provenance.testbed.line_rate_gbps", "beyond any NIC"),
        ({"hosts": 1}, "provenance.testbed.hosts", "greater than or equal to 2"),
        ({"hosts": 4}, "provenance.testbed", "one share per host"),
        ({"cpus_per_host": "a quarter"}, "provenance.testbed.cpus_per_host", ""),
    ],
)
def test_a_raw_files_bad_testbed_record_is_refused_by_its_key(tmp_path, shares_raw, change, key, says):
    raw = copy.deepcopy(shares_raw)
    raw["provenance"]["testbed"].update(change)
    (tmp_path / "raw.json").write_text(json.dumps(raw))
    refused(
        invoke("calibrate", "fit", tmp_path / "raw.json", "--out", tmp_path / "p.json"), "raw.json", key, says
    )
    assert not (tmp_path / "p.json").exists()


def test_a_profiles_bad_testbed_record_is_refused_by_its_key(shares_profile):
    data = json.loads(Path(shares_profile).read_text())
    data["provenance"]["testbed"]["hosts"] = 0
    with pytest.raises(InputError) as exc:
        parse_profile(data, "bad.json")
    assert exc.value.key == "provenance.testbed.hosts" and exc.value.source == "bad.json"


def test_calibrate_run_testbed_writes_the_testbed_into_the_profile(tmp_path, monkeypatch, shares_raw):
    """calibrate_on_testbed fits the raw file its sweep wrote: the profile keeps the testbed the sweep
    recorded (the testbed and the sweep stood in for: they need root)."""
    from clustersim.testbed import calibrate, hosts, sweep

    class Up:
        cpus_per_host = 0.25

    monkeypatch.setattr(hosts, "up", lambda n, bits, cpus_per_host=None: (Up(), False))
    monkeypatch.setattr(sweep, "run", lambda *a, **k: copy.deepcopy(shares_raw))
    profile = calibrate.calibrate_on_testbed(
        8, "200mbit", tmp_path / "p.json", None, "4KiB", "8MiB", "all_reduce", 5, cpus_per_host=0.25
    )
    tb = load_profile(str(tmp_path / "p.json")).provenance.testbed
    assert tb == profile.provenance.testbed and tb.hosts == 8 and tb.cpus_per_host == 0.25
    assert tb.line_rate_gbps == 0.2 and tb.machine == "vm"
