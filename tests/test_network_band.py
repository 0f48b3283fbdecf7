"""A network calibration never makes a collective more certain than its measurements were.

Synthetic sweeps whose medians lie exactly on a known model but whose repetitions scattered (a P10-P90
of 10% about each median) must give predictions whose P10-P90 is at least that wide: the fit's
parameter covariance alone shrinks with the number of points however much each run scattered. Sizes
past the largest measured widen the band (network_params.SIZE_EXTRAPOLATION_SIGMA) and `run` says so.
"""

import json
import math

import numpy as np
import pytest

from clustersim.api import load_scenario, simulate
from clustersim.calibration.fit import build_profile
from clustersim.calibration.network_fit import fit_network, measured_cluster
from clustersim.calibration.profile import parse_profile
from clustersim.cost_models.collectives import CollectiveModel
from clustersim.cost_models.network_params import SIZE_EXTRAPOLATION_SIGMA, NetworkParams
from clustersim.errors import InputError
from clustersim.io import write_json_atomically
from clustersim.simulator.context import network_params
from clustersim.simulator.uncertainty import Interval, quasi_normals
from clustersim.topologies.cluster import GroupShape, build_cluster

SPREAD = 0.10  # P10-P90 of the repetitions about each median, as a fraction of the median
TRUTH = NetworkParams(
    hop_s={"net_ethernet_tcp": 60e-6},
    bw_eff={"net_ethernet_tcp": 0.9},
    base_s=30e-6,
    op_bw_eff={"all_gather": 0.95},
    algorithms={"all_reduce": "ring", "all_gather": "ring"},
    protocols=("Simple",),
)
MiB = 2**20


def _raw(sizes, nodes=(2, 4), spread=SPREAD):
    """A gloo sweep of an emulated 200 Mb/s TCP testbed whose medians are exactly TRUTH's times."""
    raw = {
        "format": "clustersim-raw",
        "format_version": 1,
        "device": "cpu",
        "backend": "gloo",
        "provenance": {"source": "synthetic"},
        "collectives": [],
        "topology": {
            "nodes": max(nodes),
            "gpus_per_node": 1,
            "network": {"kind": "ethernet_tcp", "line_rate_gbps": 0.2, "shaper": "tbf"},
        },
    }
    spec = measured_cluster(raw)
    for n in nodes:
        cl = build_cluster(spec.model_copy(update={"nodes": n}))
        for op in ("all_reduce", "all_gather"):
            for size in sizes:
                t = CollectiveModel(cl, None, TRUTH).cost(op, float(size), GroupShape(n, 1)).time
                raw["collectives"].append(
                    {
                        "op": op,
                        "nodes": n,
                        "gpus_per_node": 1,
                        "ranks": n,
                        "bytes": float(size),
                        "median_s": t,
                        "p10_s": t * (1 - spread / 2),
                        "p90_s": t * (1 + spread / 2),
                        "repeats": 5,
                    }
                )
    return raw


def _band(params: NetworkParams, cl, op, nbytes, shape, draws=256) -> Interval:
    """The collective's P10-P90 under ``draws`` quasi-random draws, as the simulator's band takes them."""
    classes = CollectiveModel(cl).classes(shape)
    z = quasi_normals(draws, params.dimensions(classes))
    return Interval.of(
        [CollectiveModel(cl, None, p).cost(op, nbytes, shape).time for p in params.from_normals(z, classes)]
    )


@pytest.fixture(scope="module")
def tight():
    """Fitted on 4 KiB-4 MiB at 2 hosts: medians exactly on the model (latency and bandwidth both in
    view, so the parameters are well determined), repetitions 10% apart."""
    raw = _raw([2**k for k in range(12, 23)], nodes=(2,))
    spec = measured_cluster(raw)
    return raw, spec, fit_network(raw["collectives"], spec, "gloo", "synthetic")


def _params(cal: dict) -> NetworkParams:
    """The parameters a profile holding ``cal`` as its network section gives the simulator."""
    prof = parse_profile({**build_profile(_raw([MiB, 2 * MiB])), "network": cal}, "p.json")
    return network_params(prof, "p.json")


def test_tight_fit_band_holds_the_measured_run_to_run_spread(tight):
    raw, spec, cal = tight
    assert cal["residual_sigma"] < 0.01  # the medians are on the model: the misfit says nothing
    params = _params(cal)
    cl = build_cluster(spec.model_copy(update={"nodes": 2}))
    for op in ("all_reduce", "all_gather"):
        band = _band(params, cl, op, 2 * MiB, GroupShape(2, 1))
        assert (band.p90 - band.p10) / band.p50 >= SPREAD, (op, band)
        # the fit's covariance alone (a profile without its spread) gave a third of it
        bare = _band(_params({**cal, "spread": {}}), cl, op, 2 * MiB, GroupShape(2, 1))
        assert (bare.p90 - bare.p10) / bare.p50 < SPREAD / 2, bare


def test_band_widens_past_the_largest_measured_size(tight):
    _, spec, cal = tight
    params = _params(cal)
    cl = build_cluster(spec.model_copy(update={"nodes": 2}))
    shape = GroupShape(2, 1)
    widths = []
    for size in (4 * MiB, 16 * MiB, 32 * MiB):
        band = _band(params, cl, "all_reduce", size, shape)
        widths.append(math.log(band.p90 / band.p10))
    assert widths[0] < widths[1] < widths[2]
    run = math.log((1 + SPREAD / 2) / (1 - SPREAD / 2)) / (2 * 1.2815515655446004)
    assert params.spread_sigma("all_reduce", 32 * MiB) == pytest.approx(
        math.hypot(run, SIZE_EXTRAPOLATION_SIGMA * math.log(8))
    )
    assert params.spread_sigma("all_reduce", 3 * MiB) == pytest.approx(run)  # inside: the spread only


def test_ops_draw_their_spread_apart():
    """Session shifts of different ops were nearly uncorrelated on the testbed: each op gets its own
    normal, so a draw can find all-gather slow and all-reduce fast."""
    params = NetworkParams(
        names=("base_s",),
        log_mean=(math.log(1e-5),),
        log_cov=((0.01,),),
        calibrated=True,
        spread={"all_reduce": ((MiB, 0.05),), "all_gather": ((MiB, 0.05),)},
    )
    assert params.dimensions() == 1 + 1 + 2
    draws = params.from_normals(quasi_normals(64, params.dimensions()))
    ratios = [d.scatter("all_reduce", MiB) / d.scatter("all_gather", MiB) for d in draws]
    assert np.std(np.log(ratios)) > 0.03
    # a profile without a recorded spread draws as before: the residual only, shared by every op
    bare = NetworkParams(names=("base_s",), log_mean=(0.0,), log_cov=((0.01,),), calibrated=True)
    assert bare.dimensions() == 2


def _profile(tmp_path, sizes, name):
    data = build_profile(_raw(sizes, nodes=(2,)))
    path = tmp_path / name
    write_json_atomically(path, data)
    return str(path)


def test_run_notes_a_bucket_priced_past_the_measured_sizes(tmp_path):
    """The trial: a 2-host sweep at 1-4 MiB, a step whose DDP buckets are 15 and 30 MiB."""
    small = _profile(tmp_path, [MiB, 2 * MiB, 4 * MiB], "small.json")
    s = load_scenario("examples/testbed-cpu-hosts.yaml", {"cluster.nodes": 2})
    out = simulate(s, small, samples=32).result
    note = [n for n in out.notes if "priced from a fit measured at" in n]
    assert note == [
        "all_reduce of 15.26 MiB–30.52 MiB priced from a fit measured at 1.00 MiB–4.00 MiB: extrapolated; "
        f"its band widens by log-σ {SIZE_EXTRAPOLATION_SIGMA:g} per e-fold past the largest measured"
    ]
    width = (out.interval.p90 - out.interval.p10) / out.interval.p50
    # the buckets are 3.8x and 7.6x the largest size measured: wider than the 10% spread alone
    assert width > 2 * SPREAD, out.interval

    wide = _profile(tmp_path, [MiB * 2**k for k in range(6)], "wide.json")  # 1-32 MiB
    out = simulate(s, wide, samples=32).result
    # the 2-host buckets are priced by the exact-shape fit, which took no part in the draws before
    assert out.sources["collectives (measured fits)"] == "all_reduce"
    assert not [n for n in out.notes if "priced from a fit measured at" in n]
    width = (out.interval.p90 - out.interval.p10) / out.interval.p50
    # the measured spread, nothing extrapolated (32 quasi-random draws read a lognormal's width ~7% low:
    # their normals are stratified, the tails cut; the 256 draws above hold it exactly)
    assert 0.9 * SPREAD <= width < 2 * SPREAD, out.interval


def test_profile_rejects_a_malformed_spread():
    data = build_profile(_raw([MiB, 2 * MiB]))
    assert set(data["network"]["spread"]) == {"all_reduce", "all_gather"}
    for bad in ([[2 * MiB, 0.04], [MiB, 0.04]], [[MiB, -0.1]], [[0, 0.1]]):
        broken = json.loads(json.dumps(data))
        broken["network"]["spread"]["all_reduce"] = bad
        with pytest.raises(InputError, match="spread"):
            parse_profile(broken, "bad.json")
