"""The GEMM shape model: fitted once per device, used for every model's kernels on it."""

import math

import numpy as np
import pytest

from clustersim.calibration.compute_fit import fit_gemm_model, gemm_time
from clustersim.calibration.microbench import gemm_shapes
from clustersim.calibration.profile import parse_profile
from clustersim.errors import InputError
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate

TRUE = {"r_max": 250e12, "launch": 12e-6, "mem": 1600e9}  # an A100-like device


def _records(rng, noise=0.02):
    out = []
    for m, n, k in gemm_shapes([512, 1024, 2048, 4096, 8192]):
        w, b = 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n)
        t = float(gemm_time(w, b, TRUE["r_max"], TRUE["launch"], TRUE["mem"])) * math.exp(
            rng.normal(0, noise)
        )
        out.append({"precision": "bf16", "m": m, "n": n, "k": k, "flops": w, "bytes": b, "median_s": t})
    return out


def test_recovers_the_device_and_predicts_shapes_it_was_not_fitted_on():
    fit = fit_gemm_model(_records(np.random.default_rng(0)), TRUE["mem"] / 1e9)["bf16"]
    assert fit["r_max_tflops"] == pytest.approx(250, rel=0.05)
    assert fit["launch_s"] == pytest.approx(12e-6, rel=0.3)
    assert fit["holdout"]["fitted_on"] == "square shapes"
    assert fit["holdout"]["median_abs_rel_error"] < 0.05 and fit["holdout"]["max_abs_rel_error"] < 0.15
    assert fit["log_sigma"] < 0.05


def _profile_with_model():
    fit = fit_gemm_model(_records(np.random.default_rng(1)), TRUE["mem"] / 1e9)
    return parse_profile(
        {
            "format": "clustersim-profile",
            "format_version": 3,
            "device": "A100-80GB",
            "provenance": {"source": "synthetic"},
            "compute_model": fit,
        },
        "synthetic.json",
    )


def test_one_profile_serves_every_model_on_its_gpu():
    prof = _profile_with_model()
    base = load_scenario("preset:dgx-h100-gpt3-1.3b").with_changes(
        **{"cluster.gpu": "A100-80GB", "cluster.nodes": 1, "cluster.gpus_per_node": 1}
    )
    forward = {}
    for model, seq in (("GPT-3-1.3B", 2048), ("BERT-Large", 128)):
        s = base.with_changes(**{"workload.model": model, "workload.seq_len": seq})
        calibrated, default = simulate(s, prof), simulate(s)
        assert calibrated.sources["matmul"] == "GEMM shape model, measured"
        forward[model] = calibrated.breakdown["forward"] / default.breakdown["forward"]
    # GEMMs run at the measured 250 of 312 TFLOP/s, above the catalog's 0.7 x 312 default, in both
    # models; BERT-Large's short sequences leave more of its forward to the kernels the GEMM model does
    # not price (pointwise, attention), so it gains less.
    assert forward["GPT-3-1.3B"] < forward["BERT-Large"] < 1.0


def test_a_queued_gemm_pays_the_devices_fixed_cost_not_the_timed_calls():
    """The fit's fixed cost is that of one call timed between two synchronisations (the host's launch
    and the round trip): on a GPU a GEMM queued in a step pays the device's fixed cost per kernel, as
    every other kernel does; on a CPU the calling thread runs the op, so the timed call's cost stays."""
    from clustersim import catalog
    from clustersim.cost_models.compute import DeviceCosts
    from clustersim.workloads.layers import Kernel

    prof = _profile_with_model()
    r_max, timed_call, mem = (
        (m := prof.compute_model["bf16"]).r_max_tflops * 1e12,
        m.launch_s,
        m.memory_gbs * 1e9,
    )
    assert timed_call == pytest.approx(12e-6, rel=0.3)
    gemm = Kernel("gemm", 4e9, 3e7, launches=6)
    gpu = DeviceCosts(catalog.gpu("A100-80GB"), prof)
    roofline = max(gemm.flops / r_max, gemm.bytes / mem)
    assert gpu.kernel_time(gemm, "bf16") == pytest.approx(6 * gpu.kernel_overhead_s + roofline)
    assert gpu.kernel_overhead_s < 0.5 * timed_call
    # a CPU runs each op on the calling thread: what the timed call cost, a call in a step costs
    on_cpu = {"device": "CPU-2vCPU", "compute_model": {"fp32": prof.compute_model["bf16"]}}
    cpu = DeviceCosts(catalog.gpu("CPU-2vCPU"), prof.model_copy(update=on_cpu))
    r_cpu, _, mem_cpu = cpu.gemm_model["fp32"]
    cpu_roofline = max(gemm.flops / r_cpu, gemm.bytes / mem_cpu)
    assert cpu.kernel_time(gemm, "fp32") == pytest.approx(6 * timed_call + cpu_roofline)
    # a fused attention kernel is no GEMM: the GEMM model (which timed none) does not price it
    attention = Kernel("attention", 4e9, 3e7, launches=2)
    assert gpu.kernel_time(attention, "bf16") == pytest.approx(
        DeviceCosts(catalog.gpu("A100-80GB")).kernel_time(attention, "bf16")
    )


def test_small_gemms_pay_their_launch_and_small_problem_cost():
    from clustersim import catalog
    from clustersim.cost_models.compute import DeviceCosts
    from clustersim.workloads.layers import Kernel

    dev = DeviceCosts(catalog.gpu("A100-80GB"), _profile_with_model())
    big, small = Kernel("gemm", 1e12, 1e8, launches=4), Kernel("gemm", 1e8, 1e5, launches=4)
    eff_big = big.flops / dev.kernel_time(big, "bf16")
    eff_small = small.flops / dev.kernel_time(small, "bf16")
    assert eff_small < 0.2 * eff_big < 250e12


def test_nonsense_compute_model_is_refused():
    bad = {
        "format": "clustersim-profile",
        "format_version": 3,
        "device": "A100-80GB",
        "provenance": {"source": "x"},
        "compute_model": {
            "bf16": {
                "r_max_tflops": float("nan"),
                "w_half_gflop": 1,
                "launch_s": 0,
                "memory_gbs": 100,
                "log_sigma": 0.1,
                "points": 3,
            }
        },
    }
    with pytest.raises(InputError, match="compute_model"):
        parse_profile(bad, "bad.json")
