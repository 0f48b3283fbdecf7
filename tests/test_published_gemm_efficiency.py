"""A GPU's own GEMM efficiency in the catalog (gpus.yaml matmul_efficiency) is what its published
benchmark says: calibrate's GEMM model fitted on the benchmark's timings gives the catalog's fraction of
peak, and the simulator prices that GPU's GEMMs (and fp32 convolutions) at it, saying so."""

import json
from pathlib import Path

import pytest

from clustersim import catalog
from clustersim.calibration.compute_fit import fit_gemm_model
from clustersim.catalog import hardware_defaults
from clustersim.cost_models.compute import DeviceCosts
from clustersim.workloads.layers import Kernel

DEEPBENCH_V100 = Path(__file__).parent / "data" / "deepbench_v100_gemm.json"


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_v100_efficiency_is_deepbenchs(precision):
    records = json.loads(DEEPBENCH_V100.read_text())["gemm"]
    v100 = catalog.gpu("V100-SXM2")
    streaming = v100.hbm_gbs * hardware_defaults()["efficiency"]["memory"]
    fit = fit_gemm_model(records, streaming)[precision]
    measured = fit["r_max_tflops"] / v100.peak_tflops[precision]
    assert v100.matmul_efficiency[precision] == pytest.approx(measured, abs=0.005)
    # the PCIe card is the same chip: the same fraction of its own peak
    assert catalog.gpu("V100-PCIe").matmul_efficiency == v100.matmul_efficiency


def test_gemms_run_at_the_gpus_own_efficiency_and_others_at_the_default():
    big = Kernel("gemm", 1e12, 1e8)
    v100 = DeviceCosts(catalog.gpu("V100-SXM2"))
    assert v100.kernel_time(big, "fp32") == pytest.approx(
        v100.kernel_overhead_s + 1e12 / (15.7e12 * 0.85), rel=1e-9
    )
    assert v100.sources["matmul"].startswith("published GEMM benchmark")
    a100 = DeviceCosts(catalog.gpu("A100-80GB"))
    default = hardware_defaults()["efficiency"]["matmul"]
    assert a100.kernel_time(big, "tf32") == pytest.approx(a100.kernel_overhead_s + 1e12 / (156e12 * default))
    assert a100.sources["matmul"] == "default efficiency"


def test_a_calibration_of_the_gpu_wins_over_its_published_efficiency():
    """A profile measured on this GPU replaces the published fraction for what it measured, and only
    that: each precision says where its rate comes from."""
    from clustersim.calibration.profile import FORMAT, FORMAT_VERSION, parse_profile

    profile = parse_profile(
        {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "device": "V100-SXM2",
            "provenance": {"source": "test"},
            "matmul_tflops": {"fp32": 10.0},
        },
        "test profile",
    )
    v100 = DeviceCosts(catalog.gpu("V100-SXM2"), profile)
    assert v100.matmul_eff["fp32"] == pytest.approx(10.0 / 15.7)
    assert v100.matmul_eff["fp16"] == 0.80
    assert v100.matmul_source("fp32") == "measured"
    assert v100.matmul_source("fp16").startswith("published GEMM benchmark")
