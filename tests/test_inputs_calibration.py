"""The input battery, calibration: raw measurement files for ``calibrate fit``, profiles for
``--profile`` and nccl-tests logs for ``calibrate import-nccl-tests``. Each damaged record is refused
with the file and the record's key before anything is fitted (they used to end in ZeroDivisionError,
KeyError, a fit of NaNs, or an error naming the provenance command instead of the file)."""

from __future__ import annotations

import json

import pytest

from tests.inputs_support import DELETE, changed, invoke, refused, write_json

SIZES = [2**k for k in range(16, 26)]


def _raw() -> dict:
    """A raw file of every record kind, with plausible synthetic numbers (a 100 GB/s, 10 us link; a
    100 TFLOP/s GEMM; 1 TB/s memory)."""
    gemm = []
    for m, n, k in [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (4096, 1024, 4096)]:
        flops = 2.0 * m * n * k
        gemm.append(
            {"precision": "fp16", "m": m, "n": n, "k": k, "flops": flops, "median_s": flops / 1e14 + 5e-6}
        )
    return {
        "format": "clustersim-raw",
        "format_version": 1,
        "device_name": "cpu",
        "provenance": {"source": "synthetic"},
        "gemm": gemm,
        "memory": [{"bytes": 4e8, "traffic_bytes": 8e8, "median_s": 8e-4}],
        "kernels": [{"name": "adam", "elements": 1e8, "bytes": 1.6e9, "median_s": 2e-3}],
        "host_adam": [{"threads": 4, "params": 1e7, "params_per_s": 1e9}],
        "host_copies": [{"direction": "h2d", "pinned": True, "bytes": 4e8, "median_s": 0.016}],
        "collectives": [
            {"op": "all_reduce", "nodes": 1, "gpus_per_node": 2, "bytes": s, "median_s": 1e-5 + s / 1e11}
            for s in SIZES
        ],
    }


# (dotted key, bad value, key named, words)
BAD_RAW = [
    ("collectives.3.median_s", 0, "collectives.3.median_s", "greater than or equal to"),
    ("collectives.3.median_s", -1, "collectives.3.median_s", "greater than or equal to"),
    ("collectives.3.median_s", 1e-308, "collectives.3.median_s", "greater than or equal to"),
    ("collectives.3.median_s", 2.0**60, "collectives.3.median_s", "less than or equal to"),
    ("collectives.3.bytes", 1e308, "collectives.3.bytes", "less than or equal to"),
    ("memory.0.traffic_bytes", 1e-308, "memory.0.traffic_bytes", "greater than or equal to 1"),
    ("provenance", True, "provenance", "dictionary"),
    ("collectives.3.median_s", float("nan"), "collectives.3.median_s", "finite"),
    ("collectives.3.bytes", 0, "collectives.3.bytes", "greater than or equal to 1"),
    ("collectives.3.nodes", True, "collectives.3.nodes", "not a whole number: true"),
    ("collectives.3.median_s", DELETE, "collectives.3.median_s", "missing"),
    ("collectives", [1, 2], "collectives.0", ""),
    ("collectives", [_raw()["collectives"][0]], "collectives.0", "two sizes"),
    ("collectives.4.bytes", SIZES[3], "collectives.4.bytes", "already measured"),
    ("gemm.0.median_s", DELETE, "gemm.0.median_s", "missing"),
    ("gemm.1.flops", DELETE, "gemm.1.flops", "missing"),
    ("gemm.1.m", 0, "gemm.1.m", "greater than 0"),
    ("memory.0.traffic_bytes", DELETE, "memory.0.traffic_bytes", "missing"),
    ("memory.0.median_s", 0, "memory.0.median_s", "greater than or equal to"),
    ("kernels.0.bytes", DELETE, "kernels.0.bytes", "missing"),
    ("host_adam.0.params_per_s", DELETE, "host_adam.0.params_per_s", "missing"),
    ("host_adam.0.threads", -4, "host_adam.0.threads", "greater than 0"),
    ("host_copies.0.pinned", "yes", "host_copies.0.pinned", "boolean"),
    ("launch_latency_s", -1e-6, "launch_latency_s", "greater than or equal to 0"),
]


@pytest.mark.parametrize("key,value,where,words", BAD_RAW, ids=[f"{k}={v!r}" for k, v, *_ in BAD_RAW])
def test_calibrate_fit_refuses_a_damaged_raw_file(tmp_path, key, value, where, words):
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(changed(_raw(), key, value)))  # NaN as JSON's NaN, as json.dumps writes it
    out = tmp_path / "p.json"
    refused(invoke("calibrate", "fit", path, "--out", out), str(path), where, words)
    assert not out.exists()


def test_calibrate_fit_on_the_undamaged_raw_file_works(tmp_path):
    path = write_json(tmp_path / "raw.json", _raw())
    r = invoke("calibrate", "fit", path, "--out", tmp_path / "p.json")
    assert r.exit_code == 0, r.output


@pytest.fixture(scope="module")
def profile() -> dict:
    """A profile of every section: the fit of the raw file above plus a fitted network model."""
    import numpy as np

    from clustersim.calibration.fit import build_profile
    from clustersim.topologies.cluster import GroupShape
    from tests.test_network_calibration import OPS, TCP, TRUE_TCP, _records
    from tests.test_network_calibration import _raw as network_raw

    recs = _records(TCP, TRUE_TCP, [GroupShape(2, 1), GroupShape(4, 1)], OPS[:1], np.random.default_rng(5))
    data = build_profile({**_raw(), **{k: v for k, v in network_raw(recs).items() if k != "collectives"}})
    data["network"] = build_profile(network_raw(recs))["network"]
    return data


def _not_psd(p):
    k = len(p["network"]["parameters"])
    return [[1.0 if i == j else 0.0 for j in range(k)] for i in range(k - 1)] + [[0.0] * (k - 1) + [-1.0]]


# (dotted key or a function of the profile, bad value, key named, words)
BAD_PROFILE = [
    (
        "collectives.0.segments",
        [[1e6, 1e-5, 1e-11], [0.0, 1e-5, 1e-11]],
        "collectives.0.segments",
        "ascending",
    ),
    ("host.cpu_adam_params_per_s", {"-4": 1e9}, "host.cpu_adam_params_per_s", "greater than 0"),
    ("host.cpu_adam_params_per_s", {"4": -1e9}, "host.cpu_adam_params_per_s.4", "greater than 0"),
    ("network.backend", "carrier_pigeon", "network.backend", "nccl"),
    ("network.protocols", ["LL", "carrier"], "network.protocols.1", "Simple"),
    ("network.algorithms", {"all_reduce": "magic"}, "network.algorithms.all_reduce", "ring"),
    ("network.algorithms", {"all_reduce_x": "ring"}, "network.algorithms.all_reduce_x", "all_reduce"),
    ("network.log_covariance", _not_psd, "network", "positive semi-definite"),
    ("compute_model.fp16.log_covariance", [[1.0, 2.0], [2.0, 1.0]], "compute_model.fp16", "semi-definite"),
    ("compute_model.fp16.log_covariance", [[1.0, 0.5], [0.0, 1.0]], "compute_model.fp16", "symmetric"),
    ("memory_gbs", -5, "memory_gbs", "greater than 0"),
    ("memory_gbs", True, "memory_gbs", "true"),
    ("collectives.0.nodes", True, "collectives.0.nodes", "true"),
    ("kernels_gbs.adam", False, "kernels_gbs.adam", "false"),
    # values that used to be accepted, or refused as the scenario's "cluster.intra_node: simulated
    # time exceeded": each is named in the profile, by its own key
    ("format_version", True, "format_version", "not supported"),
    ("network.cluster.nodes", "many", "network.cluster", "cluster.nodes"),
    ("network.parameters.base_s", 1e300, "network.parameters", "base_s"),
    ("network.parameters", lambda p: _factor(p, 1e300), "network.parameters", "beyond any fitted factor"),
    ("network.parameters", lambda p: _factor(p, 1e-300), "network.parameters", "below"),
    ("network.log_covariance", lambda p: _scaled_covariance(p, 1e300), "network", "log-sigma"),
    ("network.residual_sigma", 1e300, "network", "residual_sigma"),
    ("compute_model.fp16.log_sigma", 1e300, "compute_model.fp16", "log_sigma"),
    ("launch_latency_s", 1e300, "launch_latency_s", "a day"),
    ("memory_gbs", 1e300, "memory_gbs", "GB/s of device memory"),
    ("kernels_gbs.adam", 1e300, "kernels_gbs.adam", "GB/s of device memory"),
]


def _factor(p, value):
    """The network model's parameters with its first fitted factor (a bw_eff) set to ``value``."""
    params = dict(p["network"]["parameters"])
    params[next(k for k in params if "bw_eff" in k)] = value
    return params


def _scaled_covariance(p, scale):
    """The profile's own covariance times ``scale``: symmetric and positive semi-definite still."""
    return [[v * scale for v in row] for row in p["network"]["log_covariance"]]


def _refused_phase(tmp_path, field, value, words):
    """The published V100 profile with its first phase's ``field`` set to ``value``: refused in one line
    naming the file and the field."""
    from clustersim.calibration.profile import _read

    data = json.loads(_read("builtin:v100-bert-large-published")[1])
    data["compute_phases"][0][field] = value
    path = write_json(tmp_path / "p.json", data)
    refused(
        invoke("run", "preset:default", "--samples", "0", "--profile", path),
        path,
        f"compute_phases.0.{field}",
        words,
    )


def test_a_measured_phase_of_a_femtosecond_is_refused(tmp_path):
    _refused_phase(tmp_path, "forward_s", 1e-300, "timer's resolution")


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_phase_stated_as_anything_but_true_or_false_is_refused(tmp_path, value):
    """``stated`` fixes the phases in the band; a string or a number is not read as true."""
    _refused_phase(tmp_path, "stated", value, "boolean")


@pytest.mark.parametrize(
    "key,value,where,words", BAD_PROFILE, ids=[f"{k}-{i}" for i, (k, *_) in enumerate(BAD_PROFILE)]
)
def test_a_damaged_profile_is_refused(tmp_path, profile, key, value, where, words):
    data = changed(profile, key, value(profile) if callable(value) else value)
    path = write_json(tmp_path / "profile.json", data)
    refused(invoke("run", "preset:default", "--samples", "0", "--profile", path), path, where, words)


def test_the_undamaged_profile_loads(tmp_path, profile):
    from clustersim.calibration.profile import load_profile

    assert load_profile(write_json(tmp_path / "profile.json", profile)).network is not None


def _network_raw() -> dict:
    import numpy as np

    from clustersim.topologies.cluster import GroupShape
    from tests.test_network_calibration import OPS, TCP, TRUE_TCP, _records
    from tests.test_network_calibration import _raw as network_raw

    return network_raw(
        _records(TCP, TRUE_TCP, [GroupShape(2, 1), GroupShape(4, 1)], OPS[:1], np.random.default_rng(5))
    )


# (key in a raw file's measured topology, bad value, key named, words)
BAD_TOPOLOGY = [
    ("topology.network.kind", "carrier_pigeon", "topology.network.kind", "ethernet_tcp"),
    ("topology.network.line_rate_gbps", "fast", "topology.network.line_rate_gbps", "number"),
    ("topology.network.line_rate_gbps", 1e12, "topology.network.line_rate_gbps", "beyond any NIC"),
    ("topology.nodes", 2**50, "topology", "more than any cluster"),
    ("topology.nodes", True, "topology.nodes", "true"),
]


@pytest.mark.parametrize(
    "key,value,where,words", BAD_TOPOLOGY, ids=[f"{k}={v!r}" for k, v, *_ in BAD_TOPOLOGY]
)
def test_a_raw_file_with_a_bad_measured_topology_is_refused(tmp_path, key, value, where, words):
    path = write_json(tmp_path / "raw.json", changed(_network_raw(), key, value))
    refused(invoke("calibrate", "fit", path, "--out", tmp_path / "p.json"), path, where, words)


def test_a_raw_file_of_an_unknown_backend_is_refused(tmp_path):
    path = write_json(tmp_path / "raw.json", {**_raw(), "backend": "carrier_pigeon"})
    refused(invoke("calibrate", "fit", path, "--out", tmp_path / "p.json"), path, "backend")


def _nccl_json(sizes, **extra) -> dict:
    return {
        "nranks": 4,
        "nnodes": 2,
        "collective": "all_reduce",
        "results": [{"size": s, "out_of_place": {"time": 5.0 + s / 1e4, "nwrong": 0}} for s in sizes],
        **extra,
    }


# (file content, extra options, key or words named)
BAD_NCCL = [
    (_nccl_json(SIZES), ("--op", "magic"), "--op: unknown collective 'magic'"),
    (_nccl_json(SIZES, nranks="four"), (), "nranks: expected a positive whole number"),
    (_nccl_json(SIZES, nnodes=-2), (), "nnodes: expected a positive whole number"),
    (_nccl_json([*SIZES, SIZES[2]]), (), "appears twice"),
    (_nccl_json(SIZES[:1]), (), "two sizes"),
    (_nccl_json(SIZES, nranks=float("nan")), (), "nranks: expected a positive whole number"),
    (_nccl_json(SIZES, nranks=2**40), (), "nranks: 1.09951e+12 is more than any cluster holds"),
    (changed(_nccl_json(SIZES), "results.2.size", 1e308), (), "results.2: size 1e+308 bytes is outside"),
    (
        changed(_nccl_json(SIZES), "results.2.out_of_place.time", 1e-308),
        (),
        "results.2: time 1e-308 us is outside",
    ),
]


@pytest.mark.parametrize("content,options,words", BAD_NCCL, ids=[w for *_, w in BAD_NCCL])
def test_import_nccl_tests_refuses_bad_input(tmp_path, content, options, words):
    path = write_json(tmp_path / "all_reduce.json", content)
    out = tmp_path / "p.json"
    refused(invoke("calibrate", "import-nccl-tests", path, "--out", out, *options), words)
    assert not out.exists()


def test_import_nccl_tests_accepts_the_spellings_of_a_collective(tmp_path):
    path = write_json(tmp_path / "x.json", _nccl_json(SIZES))
    r = invoke("calibrate", "import-nccl-tests", path, "--out", tmp_path / "p.json", "--op", "AllReduce")
    assert r.exit_code == 0, r.output


def test_measured_percentiles_stay_within_the_samples():
    """Five noisy timings (as a quick collective sweep takes) gave a negative P10 with the exclusive
    quantile method; a raw file then carried a time below zero."""
    from clustersim.calibration.timing import summarize

    samples = [0.0009, 0.002, 0.004, 0.0041, 0.0127]
    t = summarize(samples)
    assert min(samples) <= t.p10_s <= t.median_s <= t.p90_s <= max(samples)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_a_phase_compute_only_as_anything_but_true_or_false_is_refused(tmp_path, value):
    """``compute_only`` prices the update at zero; a string or a number is not read as true."""
    _refused_phase(tmp_path, "compute_only", value, "boolean")


def test_a_measured_phase_cannot_be_compute_only(tmp_path):
    """A measured step's update and kernels take time: only a stated (simulated) step may say it is all
    the work there is."""
    _refused_phase(tmp_path, "compute_only", True, "stated: true")
