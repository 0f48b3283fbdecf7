"""Convolution networks across GPUs: a roofline per convolution, batch-norm bound by the SMs, ReLU and
residual adds by HBM, and NCHW layout transposes.

Checked against closed forms (the rate of an SM-bound kernel is SMs x clock x bytes per SM-cycle, a
transpose is a read and a write of its tensor at the streaming rate), the H200 trace in
../shared/gpu (per-class kernel totals), the GPU datasheets' own
arithmetic (fp32 peak = SMs x FP32 lanes x 2 x clock) and published measurements: channels_last
speeds ResNet-50 up by about 30% on V100 and A100, and BinSGDM's 64-GPU ResNet-50 speedup (2.47x).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from clustersim import catalog
from clustersim.catalog import GpuSpec
from clustersim.cost_models.compute import DeviceCosts
from clustersim.errors import InputError
from clustersim.scenario import validate_scenario
from clustersim.simulator import simulate
from clustersim.workloads.layers import Kernel
from clustersim.workloads.resnet import needs_layout_transposes, resnet_layers

BN = catalog.execution()["efficiency"]["batch_norm"]
BN_BYTES_PER_SM_CYCLE = BN["streaming_bytes_per_sm_cycle"]
BN_STATS_PER_SM_CYCLE = BN["statistics_elements_per_sm_cycle"]


def _one_gpu(gpu: str, precision: str, memory_format: str, micro_batch: int = 256):
    return validate_scenario(
        {
            "name": "resnet",
            "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": gpu},
            "workload": {
                "model": "ResNet-50",
                "micro_batch": micro_batch,
                "precision": precision,
                "memory_format": memory_format,
            },
            "training": {"optimizer": "sgdm"},
        }
    )


def test_every_sm_count_and_clock_agree_with_the_datasheet_fp32_peak():
    """fp32 peak = SMs x FP32 lanes per SM (64 on V100 and A100, 128 since) x 2 x boost clock: a typo
    in either figure breaks the identity."""
    checked = 0
    for name, gpu in catalog.gpus().items():
        if gpu.sm_cycles_per_s is None:
            continue
        lanes = gpu.peak_tflops["fp32"] * 1e12 / (2 * gpu.sm_cycles_per_s)
        assert min(abs(lanes - 64), abs(lanes - 128)) / lanes < 0.01, (name, lanes)
        checked += 1
    assert checked >= 10


def test_batch_norm_is_bound_by_the_sms_or_by_hbm_whichever_is_lower():
    """The streaming passes at SMs x clock x bytes per SM-cycle, the statistics pass at SMs x clock x
    elements per SM-cycle, each capped by HBM's streaming rate."""
    stream, stats = Kernel("batch_norm", 0.0, 1e10, 1), Kernel("batch_norm_stats", 0.0, 1e10, 1)
    times = {}
    for name in ("V100-SXM2", "H100-SXM", "H200"):
        costs = DeviceCosts(catalog.gpu(name))
        precision = "bf16" if name != "V100-SXM2" else "fp16"
        times[name] = (costs.kernel_time(stream, precision), costs.kernel_time(stats, precision))
        fixed = costs.kernel_overhead_s
        gpu = catalog.gpu(name)
        hbm = gpu.hbm_bytes_per_s * costs.memory_eff
        expected = min(hbm, gpu.sm_cycles_per_s * BN_BYTES_PER_SM_CYCLE)
        assert times[name][0] == pytest.approx(fixed + 1e10 / expected)
        # 2-byte elements: 5e9 of them in 1e10 bytes
        per_element = gpu.sm_cycles_per_s * BN_STATS_PER_SM_CYCLE
        assert times[name][1] == pytest.approx(fixed + max(1e10 / hbm, 5e9 / per_element))
    # same SMs and clock: the H100's lower HBM bandwidth does not slow a kernel its SMs bound
    assert times["H100-SXM"] == pytest.approx(times["H200"])
    v100 = catalog.gpu("V100-SXM2")  # 80 SMs at 1.53 GHz could move more than 0.8 x 900 GB/s
    assert v100.sm_cycles_per_s * BN_BYTES_PER_SM_CYCLE > v100.hbm_bytes_per_s * 0.8
    assert times["V100-SXM2"][0] == pytest.approx(3.2e-6 + 1e10 / (v100.hbm_bytes_per_s * 0.8))


def test_the_statistics_pass_costs_its_elements_not_its_bytes():
    """The Welford update's work is per element: on an SM-bound GPU an fp32 input (twice the bytes)
    takes as long as a bf16 one of the same elements, while a streaming pass takes twice as long."""
    costs = DeviceCosts(catalog.gpu("H200"))
    fixed = costs.kernel_overhead_s
    elements = 1e9
    bf16 = costs.kernel_time(Kernel("batch_norm_stats", 0.0, 2 * elements, 1), "bf16") - fixed
    fp32 = costs.kernel_time(Kernel("batch_norm_stats", 0.0, 4 * elements, 1), "fp32") - fixed
    assert fp32 == pytest.approx(bf16)
    stream16 = costs.kernel_time(Kernel("batch_norm", 0.0, 2 * elements, 1), "bf16") - fixed
    stream32 = costs.kernel_time(Kernel("batch_norm", 0.0, 4 * elements, 1), "fp32") - fixed
    assert stream32 == pytest.approx(2 * stream16)


def test_a_gpu_without_sm_figures_gets_the_h200s_batch_norm_rates_per_hbm_byte():
    gpu = catalog.gpu("B200")
    assert gpu.sm_cycles_per_s is None
    costs = DeviceCosts(gpu)
    cycles = gpu.hbm_bytes_per_s * BN["sm_cycles_per_hbm_byte"]
    t = costs.kernel_time(Kernel("batch_norm", 0.0, 1e10, 1), "bf16")
    assert t == pytest.approx(costs.kernel_overhead_s + 1e10 / (cycles * BN_BYTES_PER_SM_CYCLE))
    t = costs.kernel_time(Kernel("batch_norm_stats", 0.0, 1e10, 1), "bf16")
    assert t == pytest.approx(costs.kernel_overhead_s + 5e9 / (cycles * BN_STATS_PER_SM_CYCLE))
    # the fallback is the H200's own ratio: an H200 priced by it gets its SM-bound rates back
    h200 = catalog.gpu("H200")
    cycles = h200.hbm_bytes_per_s * BN["sm_cycles_per_hbm_byte"]
    assert cycles == pytest.approx(h200.sm_cycles_per_s, rel=0.01)


def test_transposes_only_for_nchw_tensors_on_tensor_cores():
    assert needs_layout_transposes("contiguous", "fp16")
    assert needs_layout_transposes("contiguous", "tf32")
    assert not needs_layout_transposes("contiguous", "fp32")  # native NCHW kernels on the SIMT cores
    assert not needs_layout_transposes("channels_last", "bf16")


def test_nchw_transposes_cost_a_read_and_write_of_every_conv_tensor_and_no_host_dispatch():
    arch = catalog.model("ResNet-50")
    costs = DeviceCosts(catalog.gpu("A100-80GB"))
    plain = resnet_layers(arch, 64, 2)
    nchw = resnet_layers(arch, 64, 2, nchw_transposes=True)
    stem_plain, stem_nchw = plain[0], nchw[0]
    # stem: 3 x 224 x 224 in, 64 x 112 x 112 out per sample, 2 bytes; forward: one read + write of each
    moved = 2 * 2 * 64 * (3 * 224**2 + 64 * 112**2)
    (fwd,) = [k for k in stem_nchw.forward if k.name == "layout_transpose"]
    (bwd,) = [k for k in stem_nchw.backward if k.name == "layout_transpose"]
    assert fwd.bytes == pytest.approx(moved) and bwd.bytes == pytest.approx(2 * moved)
    assert (fwd.launches, bwd.launches) == (2, 4)
    extra = costs.kernels_time(stem_nchw.forward, "fp16") - costs.kernels_time(stem_plain.forward, "fp16")
    # two kernels on the stream: each its fixed cost and the device's gap before the next
    assert extra == pytest.approx(
        2 * (costs.kernel_overhead_s + costs.kernel_gap_s) + moved / costs.memory_rate
    )
    for a, b in zip(plain, nchw):  # cuDNN launches them inside the convolution: no host op of their own
        assert costs.kernels_launched(a.forward) == costs.kernels_launched(b.forward)
        assert costs.kernels_launched(a.backward) == costs.kernels_launched(b.backward)


@pytest.mark.parametrize("gpu", ["V100-SXM2", "A100-80GB"])
def test_channels_last_speeds_resnet50_up_by_about_thirty_percent(gpu):
    """Published: channels_last "accelerates ResNet-50 on ImageNet by about 30% on NVIDIA V100 and
    A100" (NVIDIA's figure, quoted in MosaicML Composer's channels_last method card)."""
    nchw = simulate(_one_gpu(gpu, "fp16", "contiguous")).iteration_time
    nhwc = simulate(_one_gpu(gpu, "fp16", "channels_last")).iteration_time
    assert 1.15 <= nchw / nhwc <= 1.5


def test_layout_does_not_change_fp32_or_a_transformer():
    assert simulate(_one_gpu("V100-SXM2", "fp32", "contiguous", 64)).iteration_time == pytest.approx(
        simulate(_one_gpu("V100-SXM2", "fp32", "channels_last", 64)).iteration_time
    )


def test_an_unknown_memory_format_is_an_input_error():
    with pytest.raises(InputError) as err:
        _one_gpu("A100-80GB", "fp16", "nhwc")
    assert "memory_format" in str(err.value)


def test_binsgdm_resnet50_speedup_is_within_fifteen_percent_of_the_paper():
    """The paper's 2.47x at 64 GPUs, from what its framework implies (PyTorch DDP: fp32 gradients under
    AMP; torchvision: NCHW tensors), not from a fitted factor."""
    from clustersim.validation.published import validate

    report = validate("binsgdm_speedups", samples=0)
    (resnet,) = [r for r in report.rows if r.baseline == "sgdm"]
    assert abs(resnet.error) <= 0.15, resnet.predicted


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("multiprocessors", 0, "greater than 0"),
        ("multiprocessors", 100_000, "beyond any real GPU"),
        ("boost_clock_mhz", float("nan"), "finite"),
        ("boost_clock_mhz", 1.5e9, "beyond any real GPU"),
        ("boost_clock_mhz", True, "not true/false"),
    ],
)
def test_a_bad_sm_count_or_clock_is_one_line_naming_the_key(key, value, says):
    entry = {
        "name": "MYGPU", "chip": "X1", "description": "t", "peak_tflops": {"fp32": 20, "fp16": 300},
        "hbm_gbs": 2000, "memory_gib": 80, "nvlink": {"links": 0, "gbs_per_link": 0}, "pcie_gen": 4,
        key: value,
    }  # fmt: skip
    with pytest.raises(InputError) as err:
        validate_scenario(
            {
                "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": entry, "intra_node": {"fabric": "pcie"}},
                "workload": {"model": "ResNet-50", "micro_batch": 8},
            }
        )
    assert f"cluster.gpu.{key}" in str(err.value) and says in str(err.value)
    assert "\n" not in str(err.value)


# ---- a roofline per convolution; batch-norm, ReLU and adds as the H200 trace ran them ----------------

# per-op kernel time of the H200 ResNet-50 trace (../shared/gpu), with each op's shapes: see its
# "source" and "method"
_OPS = json.loads((Path(__file__).parent / "data" / "h200-resnet50-224-bs128.ops.json").read_text())
_CLASSES = {
    "aten::cudnn_convolution": "conv",
    "aten::convolution_backward": "conv",
    "aten::native_batch_norm": "batch_norm",
    "aten::native_batch_norm_backward": "batch_norm",
    "aten::add_": "activation",
    "aten::clamp_min_": "activation",
    "aten::threshold_backward": "activation",
}


def _model_classes(gpu: str, micro_batch: int) -> dict[str, float]:
    costs = DeviceCosts(catalog.gpu(gpu))
    totals: dict[str, float] = {}
    for layer in resnet_layers(catalog.model("ResNet-50"), micro_batch, 2):
        for kernel in layer.forward + layer.backward:
            totals[kernel.name] = totals.get(kernel.name, 0.0) + costs.kernel_time(kernel, "bf16")
    return totals


def test_each_convolution_is_its_own_roofline_memory_bound_when_its_flops_per_byte_are_few():
    (block,) = [
        layer for layer in resnet_layers(catalog.model("ResNet-50"), 128, 2) if layer.name == "stage1.block1"
    ]
    convs = [k for k in block.forward if k.name == "conv"]
    assert len(convs) == 3  # 1x1 256->64, 3x3 64->64, 1x1 64->256 at 56 x 56
    costs = DeviceCosts(catalog.gpu("H200"))
    peak = catalog.gpu("H200").peak_flops("bf16") * costs.conv_eff
    first, middle, last = convs
    # the first 1x1: reads 256 channels, writes 64, 2*256*64 FLOPs per pixel: 51 FLOP per byte
    pixels = 128 * 56 * 56
    assert first.flops == pytest.approx(2 * 256 * 64 * pixels)
    assert first.bytes == pytest.approx(2 * (256 * pixels + 256 * 64 + 64 * pixels))
    assert costs.kernel_time(first, "bf16") == pytest.approx(
        costs.kernel_overhead_s + first.bytes / costs.memory_rate
    )
    assert costs.kernel_time(middle, "bf16") == pytest.approx(costs.kernel_overhead_s + middle.flops / peak)
    # priced as one group the memory-bound one would hide under the others' FLOPs
    apart = sum(costs.kernel_time(k, "bf16") for k in convs)
    together = costs.kernel_time(
        Kernel("conv", sum(k.flops for k in convs), sum(k.bytes for k in convs), 3), "bf16"
    )
    assert apart > together * 1.05


def test_the_stem_computes_no_gradient_for_the_image():
    stem = resnet_layers(catalog.model("ResNet-50"), 8, 2)[0]
    (fwd,) = [k for k in stem.forward if k.name == "conv"]
    (bwd,) = [k for k in stem.backward if k.name == "conv"]
    assert bwd.flops == pytest.approx(fwd.flops)  # weight gradient only
    block = resnet_layers(catalog.model("ResNet-50"), 8, 2)[2]
    assert sum(k.flops for k in block.backward if k.name == "conv") == pytest.approx(
        2 * sum(k.flops for k in block.forward if k.name == "conv")
    )


def test_kernel_classes_match_the_h200_trace_they_were_fitted_on():
    """Convolutions, batch-norm, and ReLU with residual adds, per step of the H200 trace (batch 128):
    the model's time of each class within 15% of the trace's kernels (the activation class also holds
    the max-pool, the weight casts and the fills the trace books elsewhere, so it may be above)."""
    measured: dict[str, float] = {}
    for op in _OPS["ops"]:
        cls = _CLASSES[op["op"]]
        measured[cls] = measured.get(cls, 0.0) + op["kernel_s"] / _OPS["steps"]
    model = _model_classes("H200", 128)
    assert model["conv"] == pytest.approx(measured["conv"], rel=0.05)
    bn = model["batch_norm"] + model["batch_norm_stats"]
    assert bn == pytest.approx(measured["batch_norm"], rel=0.05)
    assert measured["activation"] <= model["activation"] <= measured["activation"] * 1.6


# the H200 trace's batch-norm kernels by what they do (PyTorch's channels_last kernels)
_BN_KINDS = {
    "batch_norm_collect_statistics_channels_last_kernel": "statistics",
    "batch_norm_update_stats_and_invert": "statistics",  # the running statistics, one tiny kernel each
    "batch_norm_transform_input_channels_last_kernel": "normalise",
    "batch_norm_backward_reduce_channels_last_kernel": "backward",
    "batch_norm_backward_elemt_channels_last_kernel": "backward",
}


def _trace_batch_norm_kinds() -> dict[str, float]:
    """Seconds per step of the H200 trace's batch-norm kernels, by kind."""
    path = Path(__file__).parent / "data" / "h200-resnet50-224-bs128.trace.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    kinds: dict[str, float] = {}
    for event in events:
        if event.get("cat") != "kernel":
            continue
        for name, kind in _BN_KINDS.items():
            if name in event["name"]:
                kinds[kind] = kinds.get(kind, 0.0) + event["dur"] * 1e-6 / _OPS["steps"]
    return kinds


def _model_batch_norm_kinds(gpu: GpuSpec, micro_batch: int) -> dict[str, float]:
    costs = DeviceCosts(gpu)
    kinds = {"statistics": 0.0, "normalise": 0.0, "backward": 0.0}
    for layer in resnet_layers(catalog.model("ResNet-50"), micro_batch, 2):
        for kernel in layer.forward:
            if kernel.name in ("batch_norm_stats", "batch_norm"):
                kind = "statistics" if kernel.name == "batch_norm_stats" else "normalise"
                kinds[kind] += costs.kernel_time(kernel, "bf16")
        backward = [k for k in layer.backward if k.name == "batch_norm"]
        kinds["backward"] += sum(costs.kernel_time(k, "bf16") for k in backward)
    return kinds


def test_batch_norm_passes_match_the_h200_trace_by_kind():
    """Per step of the H200 trace (batch 128): the statistics pass 4.58 ms, the normalisation 2.30 ms,
    the backward's reduction and input gradient 5.67 ms. One rate per byte for every pass (the same
    total) gave 4.89 ms forward and 7.65 ms backward: the forward 29% short, the backward 35% long,
    which moved 2 ms of device time from the forward, where the host's dispatch nearly keeps pace
    with the GPU, to the backward, where it does not. Within 5%: the
    constants were fitted on these sums and rounded to three figures, the fixed cost per kernel
    (3.2 us) comes from the BERT trace, and the reduction (2.20 TB/s) and the input gradient (3.11
    TB/s) share one rate per byte."""
    trace = _trace_batch_norm_kinds()
    assert trace["statistics"] == pytest.approx(4.583e-3, rel=0.01)  # the trace is what it was
    model = _model_batch_norm_kinds(catalog.gpu("H200"), 128)
    for kind in ("statistics", "normalise", "backward"):
        assert model[kind] == pytest.approx(trace[kind], rel=0.05), kind
    # the statistics pass reads each element once and still takes twice the normalisation's time
    assert model["statistics"] > 1.8 * model["normalise"]


def test_batch_norm_is_never_slower_with_more_hbm_bandwidth_and_grows_with_the_batch():
    h200 = catalog.gpu("H200")
    totals = []
    for hbm_gbs in (500, 1000, 2000, 3350, 4800, 8000, 16000):
        gpu = h200.model_copy(update={"hbm_gbs": hbm_gbs})
        totals.append(sum(_model_batch_norm_kinds(gpu, 128).values()))
    assert all(later <= earlier for earlier, later in zip(totals, totals[1:]))
    assert totals[0] > 2 * totals[-1]  # bound by HBM at 0.5 TB/s, by the SMs at 16 TB/s
    assert totals[-1] == pytest.approx(totals[-2])
    by_batch = [sum(_model_batch_norm_kinds(h200, b).values()) for b in (8, 32, 128, 256)]
    assert all(later > earlier for earlier, later in zip(by_batch, by_batch[1:]))


def test_the_trace_memory_bound_convolutions_are_the_ones_the_model_prices_by_hbm():
    """Every forward convolution of the trace the model calls memory-bound ran at 0.6-1.0 of HBM's
    peak, and every one it calls compute-bound at least 0.35 of the tensor cores' (the stem aside)."""
    gpu = catalog.gpu("H200")
    costs = DeviceCosts(gpu)
    flop_rate = gpu.peak_flops("bf16") * costs.conv_eff
    checked = {"memory": 0, "compute": 0}
    for op in _OPS["ops"]:
        dims, seconds = op["input_dims"], op["kernel_s"]
        if op["op"] != "aten::cudnn_convolution" or dims[0][1] == 3:
            continue
        (n, c, h, w), (o, _, kh, kw) = dims[0], dims[1]
        pad, stride = op["padding"][0], op["stride"][0]
        ho, wo = (h + 2 * pad - kh) // stride + 1, (w + 2 * pad - kw) // stride + 1
        flops = 2 * n * o * c * kh * kw * ho * wo
        read = n * c * ho * wo if kh == 1 else n * c * h * w  # a strided 1x1 reads the pixels it lands on
        nbytes = 2 * (read + o * c * kh * kw + n * o * ho * wo)
        if nbytes / costs.memory_rate > flops / flop_rate:
            assert 0.6 <= nbytes / seconds / gpu.hbm_bytes_per_s <= 1.0, dims
            checked["memory"] += 1
        else:
            assert flops / seconds / gpu.peak_flops("bf16") >= 0.35, dims
            checked["compute"] += 1
    assert checked["memory"] >= 10 and checked["compute"] >= 10


def test_an_h100_runs_resnet50_slower_than_an_h200_by_its_hbm_bound_kernels():
    """Same SMs, clock and tensor-core peak; 3.35 against 4.8 TB/s. Measured (gpu_steps, which the fit
    did not use): the H100 took 1.10x the H200's step at batch 128 and 1.17x at 256. The model's device
    time: batch-norm alike, ReLU, adds and the memory-bound convolutions 1.43x as long."""
    h100, h200 = _model_classes("H100-SXM", 256), _model_classes("H200", 256)
    assert h100["batch_norm"] == pytest.approx(h200["batch_norm"])
    assert h100["batch_norm_stats"] == pytest.approx(h200["batch_norm_stats"])
    assert h100["activation"] > 1.3 * h200["activation"]
    assert 1.08 <= sum(h100.values()) / sum(h200.values()) <= 1.2


def test_run_says_batch_norm_falls_back_where_the_gpu_entry_gives_no_multiprocessors(runner, tmp_path):
    import yaml

    from clustersim.cli import app

    gpu = {
        "name": "X100", "chip": "X1", "description": "t", "peak_tflops": {"fp32": 20, "bf16": 300},
        "hbm_gbs": 2000, "memory_gib": 80, "nvlink": {"links": 0, "gbs_per_link": 0}, "pcie_gen": 4,
    }  # fmt: skip
    sources = {}
    for name, entry in (("custom", gpu), ("catalog", "H100-SXM")):
        path = tmp_path / f"{name}.yaml"
        cluster = {"nodes": 1, "gpus_per_node": 1, "gpu": entry, "intra_node": {"fabric": "pcie"}}
        path.write_text(
            yaml.safe_dump({"cluster": cluster, "workload": {"model": "ResNet-50", "micro_batch": 8}})
        )
        res = runner.invoke(app, ["run", str(path), "--json", "--samples", "0"])
        assert res.exit_code == 0, res.output
        sources[name] = json.loads(res.stdout)["sources"]["convolutions"]
    assert "the GPU entry gives no multiprocessors or boost_clock_mhz" in sources["custom"]
    assert "batch-norm bound by the multiprocessors" in sources["catalog"]


@pytest.mark.parametrize(
    ("key", "value"),
    [("blocks", [1_000_000_000, 1, 1, 1]), ("width", 10**9), ("image_size", 10**9), ("num_classes", 10**9)],
)
def test_a_user_resnet_beyond_any_published_one_is_refused_by_its_key(runner, tmp_path, key, value):
    """A billion blocks used to build a billion layers (no answer in minutes); a billion-wide one
    blamed the scenario's micro-batch. The catalog entry's own key is named, at once."""
    import yaml

    from clustersim.cli import app

    entry = {"family": "resnet", "blocks": [3, 4, 6, 3], "width": 64, "image_size": 224, "num_classes": 1000}
    cat = tmp_path / "cat.yaml"
    cat.write_text(yaml.safe_dump({"MyNet": {**entry, key: value}}))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": "H100-SXM"},
                "workload": {"model": "MyNet", "micro_batch": 8},
            }
        )
    )
    res = runner.invoke(app, ["run", str(scenario), "--catalog", str(cat), "--samples", "0"])
    assert (
        res.exit_code == 2 and f"cat.yaml: MyNet.{key}" in res.output and "less than or equal" in res.output
    )


def test_a_runaway_accumulation_names_the_accumulation():
    from clustersim.errors import InputError

    scenario = validate_scenario(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": "H100-SXM"},
            "workload": {"model": "BERT-Large", "micro_batch": 64, "gradient_accumulation": 10**9},
        }
    )
    with pytest.raises(InputError) as err:
        simulate(scenario)
    assert err.value.key == "workload.gradient_accumulation"
