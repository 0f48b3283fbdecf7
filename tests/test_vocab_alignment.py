"""An LM head over an unpadded vocabulary runs on unaligned tensor-core kernels.

Checked against closed forms (the head's FLOPs, the padded parameter count, the rate per byte of load
width in catalogs/execution.yaml), invariants (padding adds FLOPs and can only speed the head up
where it aligns it; fp32 on the SIMT cores is unaffected; the head launches the catalog's kernel
count either way), the defaults (plain code keeps the vocabulary, Megatron-style code pads to 128 per
tensor-parallel rank) and the real H200 traces the rates come from.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest

from clustersim import catalog
from clustersim.cost_models.compute import DeviceCosts
from clustersim.errors import InputError
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.workloads.builder import build_workload
from clustersim.workloads.layers import Kernel
from clustersim.workloads.transformer import row_alignment, transformer_layers
from tests.conftest import make_scenario

GPT2_TRACE = Path(__file__).parent / "data" / "h200-gpt2-xl-s1024-mb4.trace.json.gz"


def _vocab_gemm(layer, phase: str = "forward"):
    """The head's vocabulary projection: its largest GEMM group."""
    return max((k for k in getattr(layer, phase) if k.name == "gemm"), key=lambda k: k.flops)


@pytest.mark.parametrize(
    ("row_bytes", "alignment"),
    [(30522 * 2, 4), (50257 * 2, 2), (30528 * 2, 16), (51200 * 2, 16), (30522 * 4, 8)],
)
def test_row_alignment_is_the_widest_load_that_starts_every_row(row_bytes, alignment):
    assert row_alignment(row_bytes) == alignment


def test_head_vocab_gemm_carries_its_alignment_and_flops():
    arch = catalog.model("BERT-Large")
    b, s = 4, 128
    head = transformer_layers(arch, b, s, 2)[-1]
    vocab = _vocab_gemm(head)
    assert vocab.alignment_bytes == 4  # 30,522 bf16 entries: rows start on 4 bytes
    assert vocab.flops == 2 * b * s * arch.hidden * arch.vocab
    assert _vocab_gemm(head, "backward").flops == 2 * vocab.flops
    # the dense transform and pooler stay aligned GEMMs
    assert all(k.alignment_bytes == 16 for k in head.forward if k.name == "gemm" and k is not vocab)


@pytest.mark.parametrize("model", ["BERT-Large", "GPT-2-1.5B", "LLaMA-7B"])
def test_head_launches_the_catalog_kernel_count(model):
    """Splitting the head's GEMMs does not change how many kernels the head launches (plain model
    code's count, and fused framework code's)."""
    arch = catalog.model(model)
    for unfused in (True, False):
        head = transformer_layers(arch, 2, 128, 2, "fused", unfused)[-1]
        n_fwd, n_bwd = catalog.eager_kernels(arch.style, "head", framework_code=not unfused)
        assert sum(k.launches for k in head.forward) == n_fwd
        assert sum(k.launches for k in head.backward) == n_bwd


def _narrow_load_rate(gpu, elements: int) -> float:
    per_cycle = catalog.execution()["efficiency"]["gemm_unaligned"]["flops_per_sm_cycle_per_element"]
    return gpu.sm_cycles_per_s * per_cycle * elements


def test_unaligned_rate_goes_with_load_width_and_spares_fp32():
    gpu = catalog.gpu("H200")
    costs = DeviceCosts(gpu)
    head = transformer_layers(catalog.model("GPT-2-1.5B"), 4, 1024, 2)[-1]
    vocab = _vocab_gemm(head)
    assert vocab.alignment_bytes == 2
    t = costs.kernel_time(vocab, "bf16")
    fixed = vocab.launches * costs.kernel_overhead_s
    assert t == pytest.approx(fixed + vocab.flops / _narrow_load_rate(gpu, 1))
    four = costs.kernel_time(replace(vocab, alignment_bytes=4), "bf16")
    assert (t - fixed) == pytest.approx(2 * (four - fixed))  # twice the load width, twice the rate
    aligned = costs.kernel_time(replace(vocab, alignment_bytes=16), "bf16")
    assert t > 2 * aligned
    # fp32 GEMMs run on the SIMT cores: alignment does not change their price
    assert costs.kernel_time(vocab, "fp32") == costs.kernel_time(replace(vocab, alignment_bytes=16), "fp32")


@pytest.mark.parametrize("gpu_name", ["H100-SXM", "H200", "A100-80GB"])
@pytest.mark.parametrize("model", ["GPT-2-124M", "GPT-3-125M", "GPT-2-355M"])
def test_an_unaligned_head_in_16_or_8_bits_is_never_slower_than_in_tf32(gpu_name, model):
    """A narrow-load kernel brings one element per load whatever its width, so a wider element (tf32)
    is not a faster head, nor a narrower one (fp8) a slower one: over an unpadded vocabulary a 16-bit
    step is never slower than a tf32 one, nor an fp8 step than a 16-bit one."""
    gpu = catalog.gpu(gpu_name)
    costs = DeviceCosts(gpu)
    for rows_bytes, precision in ((4, "tf32"), (2, "bf16"), (1, "fp8")):
        kernel = Kernel("gemm", 1e12, 0.0, 1, alignment_bytes=rows_bytes)
        if precision == "fp8" and "fp8" not in gpu.peak_tflops:
            continue
        assert costs.unaligned_gemm_rate(precision, rows_bytes) == pytest.approx(
            costs.unaligned_gemm_rate("bf16", 2)
        )
        assert costs.kernel_time(kernel, precision) > 0
    times = {}
    for precision in ("tf32", "bf16", "fp8"):
        if precision == "fp8" and "fp8" not in gpu.peak_tflops:
            continue
        s = _one_gpu(
            **{
                "cluster.gpu": gpu_name,
                "workload.model": model,
                "workload.micro_batch": 4,
                "workload.seq_len": 1024,
                "workload.precision": precision,
                "workload.execution": "cuda_graphs",
            }
        )
        times[precision] = simulate(s, uncertainty_samples=0).iteration_time
    assert times["bf16"] <= times["tf32"]
    if "fp8" in times:
        assert times["fp8"] <= times["bf16"]


def test_narrow_loads_never_beat_aligned_kernels():
    """However wide the load and however many SMs, an unaligned GEMM is never priced above the
    aligned GEMMs' rate; on a GPU without SM data the H200's fraction of peak stands in."""
    for name in ("V100-SXM2", "A100-80GB", "H100-SXM", "H200"):
        gpu = catalog.gpu(name)
        costs = DeviceCosts(gpu)
        kernel = Kernel("gemm", 1e12, 0.0, 1, alignment_bytes=8)
        aligned = costs.kernel_time(replace(kernel, alignment_bytes=16), "fp16")
        assert costs.kernel_time(kernel, "fp16") >= aligned
    no_sms = catalog.gpu("H200").model_copy(update={"multiprocessors": None})
    costs = DeviceCosts(no_sms)
    kernel = Kernel("gemm", 1e12, 0.0, 1, alignment_bytes=2)
    fraction = catalog.execution()["efficiency"]["gemm_unaligned"]["peak_fraction_per_element"]
    expected = 1e12 / (no_sms.peak_flops("fp16") * fraction * 1)
    assert costs.kernel_time(kernel, "bf16") == pytest.approx(costs.kernel_overhead_s + expected)


def _one_gpu(**overrides):
    return make_scenario(**{"cluster.nodes": 1, "cluster.gpus_per_node": 1, **overrides})


def _forward_backward(scenario) -> float:
    result = simulate(scenario)
    return result.breakdown["forward"] + result.breakdown["backward"]


def test_padding_aligns_the_head_and_speeds_the_step_despite_more_flops():
    """DeepLearningExamples pads BERT's 30,522 entries to 30,528: 6 more rows (more parameters and
    FLOPs), aligned kernels, a faster step. In fp32 the padding only adds work."""
    h200 = {"workload.precision": "bf16", "cluster.gpu": "H200"}
    plain, padded = _one_gpu(**h200), _one_gpu(**h200, **{"workload.pad_vocab_to_multiple_of": 8})
    w_plain = build_workload(plain.workload, vocab_multiple=plain.vocab_multiple)
    w_padded = build_workload(padded.workload, vocab_multiple=padded.vocab_multiple)
    h = catalog.model("BERT-Large").hidden
    assert w_padded.params - w_plain.params == 6 * h + 6  # embedding table and decoder bias rows
    assert w_padded.forward_flops > w_plain.forward_flops
    assert _forward_backward(padded) < _forward_backward(plain)
    fp32 = {"workload.precision": "fp32"}
    fp32_plain, fp32_padded = _one_gpu(**fp32), _one_gpu(**fp32, **{"workload.pad_vocab_to_multiple_of": 8})
    assert _forward_backward(fp32_padded) >= _forward_backward(fp32_plain)


def test_defaults_plain_code_keeps_the_vocabulary_megatron_pads_per_rank():
    assert make_scenario().vocab_multiple == 1
    tp = make_scenario(**{"training.parallelism.tensor": 4})
    assert tp.vocab_multiple == 512
    pp = make_scenario(**{"training.parallelism.pipeline": 2})
    assert pp.vocab_multiple == 128
    # a given value is per tensor-parallel rank, as Megatron's --make-vocab-size-divisible-by
    given = make_scenario(**{"training.parallelism.tensor": 4, "workload.pad_vocab_to_multiple_of": 8})
    assert given.vocab_multiple == 32


@pytest.mark.parametrize(
    ("tensor", "per_rank", "alignment"), [(2, 1, 2), (4, 2, 4), (4, 8, 16), (2, 128, 16)]
)
def test_under_tensor_parallelism_a_shards_rows_set_the_alignment(tensor, per_rank, alignment):
    """GPT-3 1.3B's 50,257 entries padded to per_rank x t, split over t ranks: each rank's slice of
    the head has per_rank x k rows: 2 or 4 bytes apart for per_rank 1 or 2 (bf16), aligned from 8."""
    s = make_scenario(
        **{
            "workload.model": "GPT-3-1.3B",
            "workload.seq_len": 512,
            "workload.precision": "bf16",
            "cluster.gpu": "H100-SXM",
            "training.parallelism.tensor": tensor,
            "workload.pad_vocab_to_multiple_of": per_rank,
        }
    )
    ctx = build_context(s)
    padded = -(-50257 // (per_rank * tensor)) * per_rank * tensor
    assert ctx.layout.arch.vocab == padded
    head = ctx.workload.layers[-1]
    assert _vocab_gemm(head).alignment_bytes == alignment


def test_a_multiple_above_the_vocabulary_is_refused_as_the_padding_key():
    with pytest.raises(InputError) as err:
        make_scenario(**{"workload.pad_vocab_to_multiple_of": 1_000_000_000})
    assert err.value.key == "workload.pad_vocab_to_multiple_of"
    assert "more than the vocabulary itself" in str(err.value)


@pytest.mark.parametrize("value", [0, -8, 2.5, "eight"])
def test_bad_padding_is_refused_with_its_key(value):
    with pytest.raises(InputError) as err:
        make_scenario(**{"workload.pad_vocab_to_multiple_of": value})
    assert "workload.pad_vocab_to_multiple_of" in str(err.value)


def test_gpt2_trace_vocab_gemms_run_at_the_two_byte_rate():
    """The rate for 2-byte rows is what the GPT-2 XL trace's three vocabulary matmuls ran at."""
    events = json.loads(gzip.decompress(GPT2_TRACE.read_bytes()))["traceEvents"]
    arch = catalog.model("GPT-2-1.5B")
    flops = 2 * 4 * 1024 * arch.hidden * arch.vocab  # one of the three matmuls, micro-batch 4
    rates = [flops / (e["dur"] * 1e-6) for e in events if e.get("cat") == "kernel" and "align1" in e["name"]]
    assert len(rates) == 6  # three per step, two steps
    modelled = _narrow_load_rate(catalog.gpu("H200"), 1)  # align1: one bf16 element
    mean = sum(rates) / len(rates)
    assert mean == pytest.approx(modelled, rel=0.1)


def test_run_names_the_lm_head_vocabulary():
    """`run`'s sources say when the LM head runs unaligned (and at what rate) or was padded; a head
    whose unaligned rate is no slower than the aligned one (V100) is not reported as slowed."""
    h200 = simulate(_one_gpu(**{"workload.precision": "bf16", "cluster.gpu": "H200"}))
    assert "vocabulary of 30,522 unpadded (default)" in h200.sources["LM head"]
    assert "load 4 bytes" in h200.sources["LM head"]
    padded = simulate(_one_gpu(**{"workload.pad_vocab_to_multiple_of": 8}))
    assert (
        padded.sources["LM head"]
        == "vocabulary padded from 30,522 to 30,528 (workload.pad_vocab_to_multiple_of)"
    )
    v100 = simulate(_one_gpu(**{"cluster.gpu": "V100-PCIe", "cluster.intra_node.fabric": "pcie"}))
    assert "LM head" not in v100.sources
