"""Fused attention priced at its library's published rate (cost_models/attention.py).

Checked against the published curves it reads (FlashAttention-3 paper, Figures 5-6), their shape
(rates rise with the sequence, a causal mask and dropout cost rate), the kernels of two real H200 steps
(tests/data: Hugging Face BERT-Large at micro-batch 16 and GPT-2 XL at 4, PyTorch 2.11, whose
scaled_dot_product_attention runs cuDNN's kernels with dropout 0.1; each trace holds two steps), and the
scenario keys that choose the library.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from clustersim import catalog
from clustersim.cost_models import attention
from clustersim.cost_models.compute import DeviceCosts
from clustersim.errors import InputError
from clustersim.scenario import validate_scenario
from clustersim.simulator.context import build_context
from clustersim.validation.gpu_throughput import scenario_for
from clustersim.validation.throughput_data import load_gpu_throughput
from clustersim.workloads.layers import AttentionShape, Kernel

DATA = Path(__file__).parent / "data"
PEAK = 989.4  # the H100 SXM5's dense 16-bit TFLOP/s, the published curves' denominator


@pytest.mark.parametrize(
    "kernel, head_dim, seq, tflops",
    [
        ("flash2", 64, 512, 282),
        ("cudnn", 128, 2048, 617),
        ("flash3", 128, 16384, 648),
        ("cudnn", 64, 4096, 408),
    ],
)
def test_forward_rates_are_the_published_ones(kernel, head_dim, seq, tflops):
    shape = AttentionShape(seq, head_dim, causal=False, backward=False)
    assert attention.peak_fraction(kernel, shape, dropout=False) * PEAK == pytest.approx(tflops, rel=1e-9)


def test_backward_and_causal_rates_are_the_published_ones_at_head_dim_128():
    backward = attention.peak_fraction("cudnn", AttentionShape(1024, 128, False, True), False)
    causal = attention.peak_fraction("flash2", AttentionShape(4096, 128, True, False), False)
    assert backward * PEAK == pytest.approx(408, rel=1e-9)
    assert causal * PEAK == pytest.approx(319, rel=1e-9)


@pytest.mark.parametrize("kernel", ["flash2", "cudnn", "flash3"])
def test_rates_rise_with_the_sequence_and_fall_with_a_mask_or_dropout(kernel):
    lengths = [64, 128, 256, 511, 512, 700, 1024, 3000, 16384, 65536]
    rates = [attention.peak_fraction(kernel, AttentionShape(s, 64, False, False), False) for s in lengths]
    assert rates == sorted(rates)
    # the ramp below the grid meets the table at its first length
    assert rates[3] == pytest.approx(rates[4], rel=0.01)
    for s in (128, 1024, 8192):
        plain = attention.peak_fraction(kernel, AttentionShape(s, 128, False, False), False)
        assert attention.peak_fraction(kernel, AttentionShape(s, 128, True, False), False) < plain
        assert attention.peak_fraction(kernel, AttentionShape(s, 128, False, False), True) < plain
        assert attention.peak_fraction(kernel, AttentionShape(s, 128, False, True), False) < plain


def test_head_dims_between_the_tables_interpolate():
    r64, r96, r128 = (
        attention.peak_fraction("flash3", AttentionShape(4096, d, False, False), False) for d in (64, 96, 128)
    )
    assert r64 < r96 < r128
    r256 = attention.peak_fraction("flash3", AttentionShape(4096, 256, False, False), False)
    assert r256 == r128  # outside the tables: the nearer one


def _traced_attention_s(name: str) -> float:
    """cuDNN's attention kernels (forward, backward and its two helper kernels) per step."""
    with gzip.open(DATA / name) as f:
        events = json.load(f)["traceEvents"]
    kernels = [
        e
        for e in events
        if e.get("cat") == "kernel" and ("_sdpa_" in e["name"] or "cudnn::fusion" in e["name"])
    ]
    return sum(e["dur"] for e in kernels) * 1e-6 / 2


@pytest.mark.parametrize(
    "model, micro_batch, trace",
    [
        ("BERT-Large", 16, "h200-bert-large-s128-mb16.trace.json.gz"),
        ("GPT-2-1.5B", 4, "h200-gpt2-xl-s1024-mb4.trace.json.gz"),
    ],
)
def test_fused_attention_takes_what_the_traced_step_took(model, micro_batch, trace):
    row = next(
        r
        for r in load_gpu_throughput("gpu_steps").rows
        if r.model == model and r.gpu == "H200" and r.micro_batch == micro_batch
    )
    ctx = build_context(scenario_for(row))
    assert (ctx.scenario.attention_kernel, ctx.scenario.attention_dropout) == ("cudnn", 0.1)
    kernels = [k for layer in ctx.workload.layers for k in layer.forward + layer.backward]
    fused = [k for k in kernels if k.name == "attention"]
    assert fused and all(k.attention is not None for k in fused)
    priced = sum(ctx.device.kernel_time(k, ctx.precision) for k in fused)
    traced = _traced_attention_s(trace)
    # BERT-Large 1.24 ms against 1.01, GPT-2 XL 14.6 against 13.9; at the GEMM rate they were 0.78
    # (short kernels, mostly their fixed cost) and 7.5 ms
    assert priced == pytest.approx(traced, rel=0.25)
    as_gemm = DeviceCosts(ctx.gpu, execution="eager")
    as_gemm.attention_kernel = None
    at_gemm_rate = sum(as_gemm.kernel_time(k, ctx.precision) for k in fused)
    if model == "GPT-2-1.5B":
        assert at_gemm_rate < 0.6 * traced


def test_chips_without_published_curves_keep_the_gemm_rate():
    gpu = catalog.gpu("A100-80GB")
    device = DeviceCosts(gpu, attention_kernel="flash3")
    kernel = Kernel("attention", 1e12, 1e6, 2, attention=AttentionShape(2048, 128, True, False))
    plain = Kernel("attention", 1e12, 1e6, 2)
    assert device.kernel_time(kernel, "bf16") == device.kernel_time(plain, "bf16")


def test_a_faster_library_is_never_slower_on_a_step():
    base = {
        "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": "H100-SXM"},
        "workload": {"model": "Llama-3-8B", "micro_batch": 1, "seq_len": 4096, "precision": "bf16"},
        "training": {"optimizer": "adam"},
    }
    times = {}
    for kernel in ("flash2", "cudnn", "flash3"):
        s = validate_scenario({**base, "workload": {**base["workload"], "attention_kernel": kernel}})
        ctx = build_context(s)
        times[kernel] = sum(
            ctx.device.kernels_time(layer.forward + layer.backward, "bf16") for layer in ctx.workload.layers
        )
    assert times["flash3"] < times["cudnn"] < times["flash2"]


def test_defaults_follow_the_code():
    def scenario(**workload):
        return validate_scenario(
            {
                "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": "H100-SXM"},
                "workload": {"micro_batch": 1, "precision": "bf16", **workload},
                "training": {"optimizer": "adam"},
            }
        )

    bert = scenario(model="BERT-Large")
    assert (bert.attention_kernel, bert.attention_dropout) == ("cudnn", 0.1)
    llama = scenario(model="Llama-3-8B")
    assert llama.attention_dropout == 0.0
    megatron = scenario(model="GPT-2-1.5B", implementation="megatron")
    assert megatron.attention_dropout == 0.0
    chosen = scenario(model="GPT-2-1.5B", attention_kernel="flash2", attention_dropout=0.0)
    assert (chosen.attention_kernel, chosen.attention_dropout) == ("flash2", 0.0)
    with pytest.raises(InputError):
        scenario(model="GPT-2-1.5B", attention_kernel="flash9")
    with pytest.raises(InputError):
        scenario(model="GPT-2-1.5B", attention_dropout=1.5)
