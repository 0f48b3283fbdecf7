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
    r512 = attention.peak_fraction("flash3", AttentionShape(4096, 512, False, False), False)
    r256 = attention.peak_fraction("flash3", AttentionShape(4096, 256, False, False), False)
    assert r512 == r256  # outside the tables: the nearer one


def _traced_attention_s(name: str) -> tuple[float, float]:
    """cuDNN's attention kernels per step: the forward, and the backward with its two helper kernels."""
    with gzip.open(DATA / name) as f:
        events = json.load(f)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    forward = sum(e["dur"] for e in kernels if "_sdpa_" in e["name"] and "fprop" in e["name"])
    backward = sum(e["dur"] for e in kernels if "bprop" in e["name"] or "cudnn::fusion" in e["name"])
    return forward * 1e-6 / 2, backward * 1e-6 / 2


@pytest.mark.parametrize(
    "model, micro_batch, trace, forward_rel, backward_rel",
    [
        # BERT-Large: forward 0.32 ms against 0.31, backward 0.83 against 0.70 (at the GEMM rate: 0.78
        # for both, short kernels costing mostly their fixed cost)
        ("BERT-Large", 16, "h200-bert-large-s128-mb16.trace.json.gz", 0.10, 0.25),
        # GPT-2 XL: backward 8.71 ms against 8.85; forward 3.33 against 5.08, the causal head-dim-64
        # forward priced with head dim 128's causal ratio, the only causal curve published (at the
        # GEMM rate: 7.4 ms for both passes)
        ("GPT-2-1.5B", 4, "h200-gpt2-xl-s1024-mb4.trace.json.gz", 0.40, 0.10),
    ],
)
def test_fused_attention_takes_what_the_traced_step_took(
    model, micro_batch, trace, forward_rel, backward_rel
):
    row = next(
        r
        for r in load_gpu_throughput("gpu_steps").rows
        if r.model == model and r.gpu == "H200" and r.micro_batch == micro_batch
    )
    ctx = build_context(scenario_for(row))
    assert (ctx.scenario.attention_kernel, ctx.scenario.attention_dropout) == ("cudnn", 0.1)

    def priced(device, phase):
        fused = [k for layer in ctx.workload.layers for k in getattr(layer, phase) if k.name == "attention"]
        assert fused and all(k.attention is not None for k in fused)
        return sum(device.kernel_time(k, ctx.precision) for k in fused)

    traced_forward, traced_backward = _traced_attention_s(trace)
    assert priced(ctx.device, "forward") == pytest.approx(traced_forward, rel=forward_rel)
    assert priced(ctx.device, "backward") == pytest.approx(traced_backward, rel=backward_rel)
    if model == "GPT-2-1.5B":  # at the GEMM rate the step's attention took half what it did
        as_gemm = DeviceCosts(ctx.gpu, execution="eager")
        assert priced(as_gemm, "forward") + priced(as_gemm, "backward") < 0.6 * (
            traced_forward + traced_backward
        )


def test_libraries_keep_their_published_order_below_the_grid():
    """Below 512 tokens one ramp per head dimension: the libraries keep their order at 512."""
    for d in (64, 128):
        for s in (64, 128, 256):
            for backward in (False, True):
                flash2, cudnn, flash3 = (
                    attention.peak_fraction(k, AttentionShape(s, d, False, backward), False)
                    for k in ("flash2", "cudnn", "flash3")
                )
                assert flash2 < min(cudnn, flash3)


def test_head_dim_256_has_its_own_curve():
    at_256 = attention.peak_fraction("flash2", AttentionShape(16384, 256, False, False), False) * PEAK
    at_192 = attention.peak_fraction("flash2", AttentionShape(16384, 192, False, False), False) * PEAK
    assert at_256 == pytest.approx(326, rel=1e-9)
    assert 326 < at_192 < 370


def test_fp32_and_tf32_attention_keep_the_gemm_rate():
    gpu = catalog.gpu("H100-SXM")
    shape = AttentionShape(2048, 128, True, False)
    fused, plain = Kernel("attention", 1e12, 1e6, 2, attention=shape), Kernel("attention", 1e12, 1e6, 2)
    device = DeviceCosts(gpu, attention_kernel="cudnn")
    for precision in ("fp32", "tf32"):
        assert device.kernel_time(fused, precision) == device.kernel_time(plain, precision)
    assert device.kernel_time(fused, "bf16") != device.kernel_time(plain, "bf16")


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
    for bad in (1.5, -0.1, True, "0.1", float("nan")):
        with pytest.raises(InputError):
            scenario(model="GPT-2-1.5B", attention_dropout=bad)


def test_the_schema_names_the_catalogs_libraries():
    from typing import get_args

    from clustersim.scenario import WorkloadSpec

    allowed = set(get_args(WorkloadSpec.model_fields["attention_kernel"].annotation)) - {"auto"}
    assert allowed == set(catalog.attention_kernels()["kernels"])


def _gpt2_xl(gpu: str = "H100-SXM", micro_batch: int = 1, **workload):
    return validate_scenario(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": gpu},
            "workload": {"model": "GPT-2-1.5B", "micro_batch": micro_batch, "precision": "bf16", **workload},
            "training": {"optimizer": "adam"},
        }
    )


@pytest.mark.parametrize(
    "changes, says",
    [
        ({"attention": "eager", "attention_kernel": "flash3"}, "workload.attention is eager"),
        ({"attention_dropout": 0.2}, None),
    ],
)
def test_an_attention_key_that_prices_nothing_says_so(changes, says):
    notes = [n for n in build_context(_gpt2_xl(**changes)).notes if "not used" in n and "attention" in n]
    assert (says is None and not notes) or (says is not None and says in notes[0])


def test_an_attention_key_on_a_chip_without_curves_says_so():
    notes = build_context(_gpt2_xl("A100-80GB", attention_kernel="flash3")).notes
    assert any("no published rates of fused attention kernels exist for the A100" in n for n in notes)


def test_a_straggler_on_the_same_gpu_runs_at_the_same_speed():
    from clustersim.simulator.runner import _gpu_factor

    ctx = build_context(_gpt2_xl(micro_batch=4, attention_kernel="flash2"))
    assert _gpu_factor(ctx, "H100-SXM") == pytest.approx(1.0)
    assert _gpu_factor(ctx, "H200") < 1.0
