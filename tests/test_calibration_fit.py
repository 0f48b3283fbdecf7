"""Fits, profiles and the nccl-tests importer: deterministic tests (no timing of this machine)."""

import json

import numpy as np
import pytest

from clustersim.calibration.fit import build_profile, fit_collective, predict
from clustersim.calibration.nccl_tests import parse_file, to_raw
from clustersim.calibration.profile import FORMAT_VERSION, load_profile, parse_profile
from clustersim.catalog import gpu
from clustersim.cost_models.compute import DeviceCosts
from clustersim.errors import InputError
from clustersim.workloads.layers import Kernel


def protocol_switch_curve(sizes, rng, noise=0.02):
    """A NCCL-like curve: NCCL takes the cheaper of LL (5 us + 20 GB/s) and Simple (20 us + 150 GB/s)."""
    t = np.minimum(5e-6 + sizes / 20e9, 20e-6 + sizes / 150e9)
    return t * (1 + noise * rng.standard_normal(len(sizes)))


def test_segmented_fit_recovers_protocol_switch_and_holds_out_within_10_percent():
    rng = np.random.default_rng(0)
    sizes = 2.0 ** np.arange(10, 31)
    times = protocol_switch_curve(sizes, rng)
    fit = fit_collective("all_reduce", 1, 8, list(zip(sizes, times)), "synthetic")
    assert len(fit.segments) >= 2
    assert fit.quality.holdout_max_rel_error < 0.10
    big = fit.segments[-1]
    assert 1 / big[2] == pytest.approx(150e9, rel=0.05)
    assert all(a >= 0 and b >= 0 for _, a, b in fit.segments)  # intercepts never negative


def test_fit_is_robust_to_an_outlier():
    rng = np.random.default_rng(1)
    sizes = 2.0 ** np.arange(16, 30)
    times = (10e-6 + sizes / 100e9) * (1 + 0.01 * rng.standard_normal(len(sizes)))
    times[5] *= 8  # a preempted measurement
    fit = fit_collective("all_gather", 2, 8, list(zip(sizes, times)), "synthetic")
    assert predict(fit.segments, 2**28) == pytest.approx(10e-6 + 2**28 / 100e9, rel=0.05)


def test_confidence_intervals_shrink_with_less_noise():
    rng = np.random.default_rng(2)
    sizes = 2.0 ** np.arange(16, 30)
    quiet = fit_collective(
        "x", 1, 2, list(zip(sizes, (5e-6 + sizes / 50e9) * (1 + 0.001 * rng.standard_normal(14)))), ""
    )
    noisy = fit_collective(
        "x", 1, 2, list(zip(sizes, (5e-6 + sizes / 50e9) * (1 + 0.05 * rng.standard_normal(14)))), ""
    )
    assert quiet.quality.beta_ci95_s_per_byte[-1] < noisy.quality.beta_ci95_s_per_byte[-1]


NCCL_TEXT = """# nThread 1 nGpus 1 minBytes 1024 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  40001 on   node-a device  0 [0x18] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  40002 on   node-a device  1 [0x2a] NVIDIA H100 80GB HBM3
#  Rank  2 Group  0 Pid  40003 on   node-b device  0 [0x18] NVIDIA H100 80GB HBM3
#  Rank  3 Group  0 Pid  40004 on   node-b device  1 [0x2a] NVIDIA H100 80GB HBM3
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
{rows}# Out of bounds values : 0 OK
# Avg bus bandwidth    : 12.345
#
"""


def nccl_rows(rng):
    lines = []
    for k in range(10, 31):
        size = 2**k
        t = float(protocol_switch_curve(np.array([size], float), rng, 0.01)[0]) * 1e6
        alg = size / t / 1e3
        lines.append(
            f"{size:>12} {size // 4:>13}     float     sum      -1 {t:8.2f} {alg:7.2f} {alg * 1.5:7.2f}      0 "
            f"{t:8.2f} {alg:7.2f} {alg * 1.5:7.2f}      0\n"
        )
    return "".join(lines)


def test_import_nccl_tests_text(tmp_path):
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(NCCL_TEXT.format(rows=nccl_rows(np.random.default_rng(3))))
    parsed = parse_file(path)
    assert parsed["op"] == "all_reduce" and parsed["ranks"] == 4 and parsed["nodes"] == 2
    assert parsed["device"] == "H100-SXM" and len(parsed["rows"]) == 21
    profile = parse_profile(build_profile(to_raw([parsed], "test")), "x")
    fit = profile.collectives[0]
    assert (fit.nodes, fit.gpus_per_node) == (2, 2)
    assert fit.quality.holdout_max_rel_error < 0.10


def test_import_old_format_with_fewer_columns(tmp_path):
    text = (
        "#  Rank  0 Group  0 Pid  1 on h device  0 [0x01] Tesla V100-SXM2-32GB\n"
        "#  Rank  1 Group  0 Pid  2 on h device  1 [0x02] Tesla V100-SXM2-32GB\n"
        "#       size         count    type     time   algbw   busbw  error     time   algbw   busbw  error\n"
        "     1048576        262144   float    100.0   10.49   10.49  0e+00    100.0   10.49   10.49  0e+00\n"
        "     2097152        524288   float    180.0   11.65   11.65  0e+00    180.0   11.65   11.65  0e+00\n"
        "# Avg bus bandwidth    : 11.0\n"
    )
    path = tmp_path / "all_gather_perf.out"
    path.write_text(text)
    parsed = parse_file(path)
    assert parsed["op"] == "all_gather" and parsed["rows"][1] == pytest.approx((2097152.0, 180e-6))
    assert parsed["device"] == "V100-SXM2"


def test_import_json(tmp_path):
    data = {
        "nranks": 8,
        "results": [
            {
                "size": 2**k,
                "count": 2**k // 4,
                "type": "float",
                "redop": "sum",
                "root": -1,
                "out_of_place": {"time": 10 + 2**k / 1e5, "alg_bw": 1, "bus_bw": 1, "nwrong": 0},
                "in_place": {"time": 10 + 2**k / 1e5, "alg_bw": 1, "bus_bw": 1, "nwrong": 0},
            }
            for k in range(10, 28)
        ],
    }
    path = tmp_path / "ar.json"
    path.write_text(json.dumps(data))
    parsed = parse_file(path, op="all_reduce")
    assert parsed["ranks"] == 8 and len(parsed["rows"]) == 18


@pytest.mark.parametrize(
    "text,match",
    [
        ("hello world\n", "no header line"),
        (NCCL_TEXT.format(rows="").replace("# Avg bus bandwidth    : 12.345\n", ""), "no result rows"),
        (
            NCCL_TEXT.format(
                rows="        1024           256     float     sum      -1     5.0    0.2    0.3      0     5.0    0.2    0.3      0\n"
            ).replace("# Avg bus bandwidth    : 12.345\n", ""),
            "truncated",
        ),
        (NCCL_TEXT.format(rows="        1024           256     float     sum      -1   five\n"), "line"),
    ],
)
def test_bad_nccl_tests_files(tmp_path, text, match):
    path = tmp_path / "all_reduce_perf.txt"
    path.write_text(text)
    with pytest.raises(InputError, match=match):
        parse_file(path)


def test_profile_version_checks_and_migration(tmp_path):
    v1 = {
        "format": "clustersim-profile",
        "format_version": 1,
        "device": "A100-80GB",
        "provenance": {"source": "old"},
        "memory_gbs": 1700.0,
    }
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(v1))
    p = load_profile(str(path))
    assert p.format_version == FORMAT_VERSION and p.memory_gbs == 1700.0
    future = dict(v1, format_version=99)
    path.write_text(json.dumps(future))
    with pytest.raises(InputError, match="format_version 99 is not supported"):
        load_profile(str(path))
    path.write_text('{"format": "clustersim-profile", "format_vers')
    with pytest.raises(InputError, match="invalid JSON at line 1"):
        load_profile(str(path))
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(InputError, match="not a clustersim profile"):
        load_profile(str(path))
    path.write_text(json.dumps(dict(v1, memory_gbs=-3)))
    with pytest.raises(InputError, match="memory_gbs"):
        load_profile(str(path))


def test_profile_scales_across_gpus():
    """Memory-bound rates scale by HBM bandwidth, compute-bound by peak FLOP/s (docs/calibration.md)."""
    a100, h100 = gpu("A100-80GB"), gpu("H100-SXM")
    prof = parse_profile(
        {
            "format": "clustersim-profile",
            "format_version": 2,
            "device": "A100-80GB",
            "provenance": {"source": "t"},
            "matmul_tflops": {"bf16": 234.0},
            "memory_gbs": 1631.2,
            "kernels_gbs": {"onebit_pack": 800.0},
        },
        "t",
    )
    on_a100 = DeviceCosts(a100, prof)
    on_h100 = DeviceCosts(h100, prof)
    assert on_a100.flops_rate("bf16") == pytest.approx(234e12)
    assert on_h100.flops_rate("bf16") == pytest.approx(234 / 312 * 989.4e12)  # same efficiency (0.75)
    assert on_a100.memory_rate == pytest.approx(1631.2e9)
    assert on_h100.memory_rate == pytest.approx(1631.2 / 2039 * 3350e9)  # same fraction of HBM (0.8)
    k = Kernel("onebit_pack", 0.0, 1e9)
    assert on_h100.kernel_time(k, "fp32") == pytest.approx(1e9 / (800e9 * 3350 / 2039))
    assert on_h100.sources["matmul"] == "scaled from A100-80GB"


def test_builtin_profiles_load():
    p = load_profile("builtin:v100-bert-large-published")
    assert p.compute_phases and p.device == "V100-PCIe"
    with pytest.raises(InputError, match="unknown built-in profile"):
        load_profile("builtin:nope")


@pytest.mark.parametrize(
    ("time", "wrong", "match"),
    [
        ("nan", "0", "not a positive finite"),
        ("inf", "0", "not a positive finite"),
        ("5.0", "3", "3 wrong results"),
    ],
)
def test_nccl_tests_rows_with_nan_times_or_wrong_results_are_refused(tmp_path, runner, time, wrong, match):
    row = (
        f"        1024           256     float     sum      -1 {time:>8}    0.2    0.3 {wrong:>6}"
        "      5.0    0.2    0.3      0\n"
    )
    path = tmp_path / "bad.txt"
    path.write_text(NCCL_TEXT.format(rows=nccl_rows(np.random.default_rng(0)) + row))
    with pytest.raises(InputError, match=match) as exc:
        parse_file(path)
    assert "bad.txt" in str(exc.value) and "line" in str(exc.value)
    from clustersim.cli import app

    res = runner.invoke(app, ["calibrate", "import-nccl-tests", str(path), "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 2 and not (tmp_path / "p.json").exists()


def test_nccl_tests_json_with_wrong_results_is_refused(tmp_path):
    import json

    data = {
        "results": [{"size": 1024, "out_of_place": {"time": 5.0, "nwrong": 1}}],
        "collective": "all_reduce",
    }
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="wrong results"):
        parse_file(path)


@pytest.mark.parametrize("segment", [[0.0, -1e-3, 1e-9], [0.0, float("nan"), 1e-9], [0.0, 1e-5, -1e-9]])
def test_profile_fits_with_negative_or_nan_parameters_are_refused(segment):
    bad = {
        "format": "clustersim-profile",
        "format_version": 3,
        "device": "A100-80GB",
        "provenance": {"source": "x"},
        "collectives": [{"op": "all_reduce", "nodes": 1, "gpus_per_node": 8, "segments": [segment]}],
    }
    with pytest.raises(InputError) as exc:
        parse_profile(bad, "bad.json")
    assert "bad.json" in str(exc.value) and "collectives" in str(exc.value)


def _two_protocol_times(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    S = np.logspace(3, 10, n)
    t = np.where(S < 1e6, 5e-6 + S / 5e9, 2e-5 + S / 2e10) * (1 + 0.02 * rng.standard_normal(n))
    return S, t


def _exhaustive(S, t):
    """The segment search before it was bounded: every cut pair, every segment fitted where used."""
    import itertools
    import math

    from clustersim.calibration import fit

    n, m, best = len(S), fit.MIN_POINTS_PER_SEGMENT, None
    for k in range(1, fit.MAX_SEGMENTS + 1):
        if n < k * m:
            break
        for cuts in itertools.combinations(range(m, n - m + 1), k - 1):
            bounds = [0, *cuts, n]
            if any(b - a < m for a, b in zip(bounds, bounds[1:])):
                continue
            fits = [fit._fit_segment(S[a:b], t[a:b]) for a, b in zip(bounds, bounds[1:])]
            rss = float(sum((f[2] ** 2).sum() for f in fits))
            bic = n * math.log(max(rss / n, 1e-18)) + 2 * k * math.log(n)
            if best is None or bic < best[0]:
                best = (bic, bounds, [(f[0], f[1]) for f in fits])
    return best[2]


def test_segment_search_of_a_usual_sweep_is_the_exhaustive_one():
    from clustersim.calibration.fit import fit_segments

    S, t = _two_protocol_times(24)
    segments, _, _ = fit_segments(S, t)
    assert [(a, b) for _, a, b in segments] == _exhaustive(S, t)


@pytest.mark.parametrize("n", [60, 400])
def test_segment_search_fits_a_bounded_number_of_segments(n, monkeypatch):
    """Linear in the points: at most 561 distinct segments on the grid and 2 x 16 per boundary and
    refining round (lg8 n rounds) are fitted, and the fit still finds the protocol switch."""
    import math

    from clustersim.calibration import fit

    calls = []
    real = fit._fit_segment
    monkeypatch.setattr(fit, "_fit_segment", lambda S, t: calls.append(len(S)) or real(S, t))
    S, t = _two_protocol_times(n)
    segments, _, _ = fit.fit_segments(S, t)
    k = fit.MAX_CUT_CANDIDATES
    rounds = math.ceil(math.log(n) / math.log(8))
    assert len(calls) <= 1 + 2 * k + k * (k - 1) // 2 + rounds * (fit.MAX_SEGMENTS - 1) * 2 * 16
    assert len(segments) >= 2 and any(3e5 < start < 3e6 for start, _, _ in segments)
    assert max(abs(predict(segments, s) / x - 1) for s, x in zip(S, t)) < 0.1
