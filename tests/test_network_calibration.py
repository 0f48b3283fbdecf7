"""Calibrate small, predict large: the fitted collective model on synthetic clusters with known physics.

Measurements are generated from a known parameter set (the same topology model with non-default
link efficiencies, latencies and per-op factors) plus log-normal noise at 1-4 nodes; the fit must
recover the parameters and predict 64 nodes inside its own P10-P90 band (most of the time: a band
that always contained the truth would be too wide to be useful, one that never did would be wrong).
"""

import json
import math

import numpy as np
import pytest

from clustersim.calibration.fit import build_profile
from clustersim.calibration.network_fit import fit_network
from clustersim.calibration.profile import FORMAT_VERSION, parse_profile
from clustersim.cost_models.collectives import CollectiveModel
from clustersim.cost_models.network_params import NetworkParams
from clustersim.errors import InputError
from clustersim.scenario import ClusterSpec
from clustersim.simulator.uncertainty import Interval
from clustersim.topologies.cluster import GroupShape, build_cluster

TCP = ClusterSpec(
    nodes=8,
    gpus_per_node=1,
    gpu="V100-PCIe",
    intra_node={"fabric": "pcie"},
    nic={"kind": "ethernet_tcp", "count": 1, "line_rate_gbps": 0.5, "gpudirect_rdma": False},
)
TRUE_TCP = NetworkParams(
    hop_s={"net_ethernet_tcp": 80e-6},
    bw_eff={"net_ethernet_tcp": 0.88},
    base_s=40e-6,
    op_bw_eff={"all_to_all": 0.72, "all_gather": 0.95, "broadcast": 0.9},
    op_latency_scale={"all_to_all": 1.6},
    algorithms={"all_reduce": "ring", "all_gather": "ring", "all_to_all": "ring", "broadcast": "tree"},
    protocols=("Simple",),
)
OPS = ("all_reduce", "all_gather", "all_to_all", "broadcast")
NOISE = 0.02


def _time(spec, params, op, nbytes, shape):
    cl = build_cluster(
        spec.model_copy(update={"nodes": max(shape.nodes, 1), "gpus_per_node": shape.gpus_per_node})
    )
    return CollectiveModel(cl, None, params).cost(op, nbytes, shape).time


def _records(spec, params, shapes, ops, rng, sizes=range(12, 26, 2)):
    out = []
    for shape in shapes:
        for op in ops:
            for k in sizes:
                t = _time(spec, params, op, float(1 << k), shape) * math.exp(rng.normal(0, NOISE))
                out.append(
                    {
                        "op": op,
                        "nodes": shape.nodes,
                        "gpus_per_node": shape.gpus_per_node,
                        "bytes": float(1 << k),
                        "median_s": t,
                        "p10_s": t * (1 - 1.28 * NOISE),
                        "p90_s": t * (1 + 1.28 * NOISE),
                        "repeats": 1,
                    }
                )
    return out


def _coverage(spec, truth, fitted: NetworkParams, shape, ops, sizes):
    rng = np.random.default_rng(3)
    cl = build_cluster(spec.model_copy(update={"nodes": shape.nodes, "gpus_per_node": shape.gpus_per_node}))
    samples = fitted.sample(rng, 300, CollectiveModel(cl).classes(shape))
    inside, errors = 0, []
    for op in ops:
        for k in sizes:
            S = float(1 << k)
            true_t = _time(spec, truth, op, S, shape)
            band = Interval.of([CollectiveModel(cl, None, p).cost(op, S, shape).time for p in samples])
            inside += band.contains(true_t)
            errors.append(abs(CollectiveModel(cl, None, fitted).cost(op, S, shape).time / true_t - 1))
    return inside / len(errors), float(np.median(errors)), float(max(errors))


def _fitted(cal: dict) -> NetworkParams:
    class Cal:  # the profile's pydantic section, as a plain object
        pass

    c = Cal()
    for k, v in cal.items():
        setattr(c, k, v)
    return NetworkParams.from_calibration(c, "test")


@pytest.fixture(scope="module")
def tcp_fit():
    rng = np.random.default_rng(1)
    recs = _records(TCP, TRUE_TCP, [GroupShape(n, 1) for n in (2, 3, 4)], OPS, rng)
    return fit_network(recs, TCP, "gloo", "synthetic")


def test_tcp_fit_recovers_the_physical_parameters(tcp_fit):
    p = tcp_fit["parameters"]
    names = list(p)
    sd = {n: math.sqrt(tcp_fit["log_covariance"][i][i]) for i, n in enumerate(names)}
    truth = {
        "bw_eff.net_ethernet_tcp": 0.88,
        "hop_s.net_ethernet_tcp": 80e-6,
        "op_bw_eff.all_to_all": 0.72,
        "op_latency_scale.all_to_all": 1.6,
        "op_bw_eff.broadcast": 0.9,
    }
    for name, value in truth.items():
        z = abs(math.log(p[name] / value)) / sd[name]
        assert z < 3.5, (name, p[name], value, sd[name])
        assert p[name] == pytest.approx(value, rel=0.15), name
    assert tcp_fit["algorithms"]["broadcast"] == "tree"  # chosen by the data, not assumed
    assert tcp_fit["residual_sigma"] < 3 * NOISE


def test_tcp_fit_on_4_nodes_predicts_64_nodes_inside_its_band(tcp_fit):
    fitted = _fitted(tcp_fit)
    coverage, median_err, max_err = _coverage(
        TCP.model_copy(update={"nodes": 64}), TRUE_TCP, fitted, GroupShape(64, 1), OPS, range(14, 26, 3)
    )
    assert median_err < 0.05 and max_err < 0.15, (median_err, max_err)
    assert coverage >= 0.8, coverage


def test_extrapolation_check_is_recorded(tcp_fit):
    x = tcp_fit["extrapolation"]
    assert x["fitted_on_ranks"] == [2, 3] and x["predicted_ranks"] == 4
    assert x["median_abs_rel_error"] < 0.05


IB = ClusterSpec(
    nodes=4,
    gpus_per_node=8,
    gpu="H100-SXM",
    intra_node={"fabric": "nvswitch"},
    nic={"kind": "infiniband", "count": 8, "line_rate_gbps": 400},
)
TRUE_IB = NetworkParams(
    hop_s={"nvlink": 5e-6, "net_infiniband": 9e-6},
    bw_eff={"nvlink": 0.8, "net_infiniband": 0.9},
    base_s=15e-6,
    op_bw_eff={"all_gather": 0.93},
)


def test_nccl_cluster_intra_rail_and_nodes_predicts_64_nodes():
    """A 4-node H100 calibration (one node, one GPU per node, 2-4 whole nodes) predicts 64 nodes."""
    rng = np.random.default_rng(2)
    shapes = [GroupShape(1, 8), GroupShape(2, 1), GroupShape(4, 1), GroupShape(2, 8), GroupShape(4, 8)]
    recs = _records(IB, TRUE_IB, shapes, ("all_reduce", "all_gather"), rng, sizes=range(16, 31, 2))
    cal = fit_network(recs, IB, "nccl", "synthetic")
    p = cal["parameters"]
    assert p["bw_eff.nvlink"] == pytest.approx(0.8, rel=0.1)
    assert p["bw_eff.net_infiniband"] == pytest.approx(0.9, rel=0.1)
    coverage, median_err, max_err = _coverage(
        IB.model_copy(update={"nodes": 64}),
        TRUE_IB,
        _fitted(cal),
        GroupShape(64, 8),
        ("all_reduce", "all_gather"),
        range(20, 31, 2),
    )
    assert median_err < 0.05 and max_err < 0.15, (median_err, max_err)
    assert coverage >= 0.8, coverage


def test_more_bandwidth_is_never_slower_with_calibrated_parameters(tcp_fit):
    fitted = _fitted(tcp_fit)
    for op in OPS:
        times = []
        for rate in (0.1, 0.5, 1, 10, 100):
            spec = TCP.model_copy(update={"nic": TCP.nic.model_copy(update={"line_rate_gbps": rate})})
            times.append(_time(spec, fitted, op, 8 * 2**20, GroupShape(8, 1)))
        assert times == sorted(times, reverse=True), op


def _raw(recs):
    return {
        "format": "clustersim-raw",
        "format_version": 1,
        "device": "cpu",
        "backend": "gloo",
        "provenance": {"source": "synthetic"},
        "collectives": recs,
        "topology": {
            "nodes": 4,
            "gpus_per_node": 1,
            "network": {"kind": "ethernet_tcp", "line_rate_gbps": 0.5, "shaper": "tbf"},
        },
    }


def test_profile_carries_the_network_model_and_the_simulation_uses_it(tmp_path):
    from clustersim.simulator.context import network_params

    rng = np.random.default_rng(4)
    recs = _records(TCP, TRUE_TCP, [GroupShape(n, 1) for n in (2, 4)], OPS, rng)
    data = build_profile(_raw(recs))
    prof = parse_profile(data, "p.json")
    assert prof.format_version == FORMAT_VERSION and prof.network is not None
    params = network_params(prof, "p.json")
    cl = build_cluster(TCP.model_copy(update={"nodes": 32}))
    cost = CollectiveModel(cl, None, params).cost("all_reduce", 2**24, GroupShape(32, 1))
    assert "calibrated (p.json)" in cost.source
    true_t = _time(TCP.model_copy(update={"nodes": 32}), TRUE_TCP, "all_reduce", 2**24, GroupShape(32, 1))
    assert cost.time == pytest.approx(true_t, rel=0.05)


def test_profile_network_section_rejects_nonsense():
    rng = np.random.default_rng(5)
    data = build_profile(_raw(_records(TCP, TRUE_TCP, [GroupShape(2, 1), GroupShape(4, 1)], OPS[:1], rng)))
    bad = dict(
        data, network={**data["network"], "parameters": {**data["network"]["parameters"], "base_s": -1.0}}
    )
    with pytest.raises(InputError) as exc:
        parse_profile(bad, "bad.json")
    assert "bad.json" in str(exc.value) and "network" in str(exc.value)
    nan = dict(data, network={**data["network"], "residual_sigma": float("nan")})
    with pytest.raises(InputError):
        parse_profile(nan, "nan.json")
    short = dict(data, network={**data["network"], "log_covariance": [[1.0]]})
    with pytest.raises(InputError, match="log_covariance"):
        parse_profile(short, "short.json")


def test_v2_profile_still_loads_and_migrates():
    from clustersim.calibration.profile import load_profile

    prof = load_profile("builtin:v100-bert-large-published")
    assert prof.format_version == FORMAT_VERSION and prof.network is None


def test_calibrate_check_fits_small_groups_and_predicts_the_largest(tmp_path, runner):
    from clustersim.cli import app
    from clustersim.io import write_json_atomically

    rng = np.random.default_rng(6)
    recs = _records(TCP, TRUE_TCP, [GroupShape(n, 1) for n in (2, 4, 8)], OPS, rng, sizes=range(20, 26))
    raw = _raw(recs)
    raw["topology"]["nodes"] = 8
    write_json_atomically(tmp_path / "raw.json", raw)
    res = runner.invoke(app, ["calibrate", "check", str(tmp_path / "raw.json"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["train_ranks"] == [2, 4] and data["test_ranks"] == [8]
    assert len(data["rows"]) == len(OPS) * 6
    assert data["summary"]["median_abs_rel_error"] < 0.05 and data["summary"]["max_abs_rel_error"] < 0.15
    assert data["summary"]["p10_p90_coverage"] >= 0.7
    # one group size to fit and another to predict: the node-count check needs two
    bad = runner.invoke(
        app, ["calibrate", "check", str(tmp_path / "raw.json"), "--train-ranks", "2", "--test-ranks", "8"]
    )
    assert bad.exit_code == 2 and "two or more group sizes" in bad.output
    assert "the file measured group sizes [2, 4, 8]" in " ".join(bad.output.split())
    (tmp_path / "again.json").write_text((tmp_path / "raw.json").read_text())
    two = [str(tmp_path / "raw.json"), str(tmp_path / "again.json")]  # it said "the file" of two files
    bad = runner.invoke(app, ["calibrate", "check", *two, "--train-ranks", "2", "--test-ranks", "8"])
    assert bad.exit_code == 2 and "the files measured group sizes" in " ".join(bad.output.split())


def test_calibrate_check_carries_pacing_from_2_and_4_hosts_to_8(tmp_path, runner):
    """The transfer check on a TCP cluster whose rings wait for the slowest host (per-chunk rate spread
    0.15, tests/test_pacing.py): fitted on 2 and 4 hosts, the 8-host all-reduces and all-gathers come
    out within 5%, where a model without pacing (the same bandwidth, cv 0) is 6-9% fast on them."""
    from dataclasses import replace

    from clustersim.cli import app
    from clustersim.io import write_json_atomically

    truth = replace(TRUE_TCP, pacing_cv={"net_ethernet_tcp": 0.15})
    rng = np.random.default_rng(7)
    recs = _records(TCP, truth, [GroupShape(n, 1) for n in (2, 4, 8)], OPS, rng, sizes=range(20, 26))
    raw = _raw(recs)
    raw["topology"]["nodes"] = 8
    write_json_atomically(tmp_path / "raw.json", raw)
    res = runner.invoke(app, ["calibrate", "check", str(tmp_path / "raw.json"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["summary"]["median_abs_rel_error"] < 0.05, data["summary"]
    for op in ("all_reduce", "all_gather"):
        assert data["summary"]["by_op"][op]["median_abs_rel_error"] < 0.05, op
    unpaced = replace(truth, pacing_cv={"net_ethernet_tcp": 0.0})
    slower = [
        _time(TCP, truth, op, float(1 << 24), GroupShape(8, 1))
        / _time(TCP, unpaced, op, float(1 << 24), GroupShape(8, 1))
        for op in ("all_reduce", "all_gather")
    ]
    assert all(s > 1.06 for s in slower), slower
