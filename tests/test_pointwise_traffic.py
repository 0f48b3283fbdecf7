"""Pointwise traffic of plain PyTorch model code (workload.pointwise: unfused) against framework kernels.

Checked against closed forms (the fused formula d*(14Th + 2Tf) and the catalog's per-style counts),
invariants (plain code never moves fewer bytes; a step never gets faster by moving more), the
scenario defaults, and a real H200 trace of Hugging Face's GPT-2 XL at micro-batch 4
(tests/data/h200-gpt2-xl-s1024-mb4.trace.json.gz), whose step the pointwise kernels dominate.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from clustersim import catalog
from clustersim.cost_models.compute import DeviceCosts
from clustersim.simulator import simulate
from clustersim.workloads.transformer import transformer_layers
from tests.conftest import make_scenario

GPT2_TRACE = Path(__file__).parent / "data" / "h200-gpt2-xl-s1024-mb4.trace.json.gz"
POINTWISE = {"elementwise", "loss", "gather", "scatter_add"}


def _block(model: str, b: int, s: int, d: int, unfused: bool):
    return transformer_layers(catalog.model(model), b, s, d, "fused", unfused)[1]


def _elementwise(layer, phase: str) -> float:
    return next(k.bytes for k in getattr(layer, phase) if k.name == "elementwise")


@pytest.mark.parametrize("model", ["BERT-Large", "GPT-2-1.5B", "LLaMA-7B"])
def test_fused_framework_kernels_keep_the_closed_form(model):
    """Fused kernels on 16-bit activations: d*(14Th + 2Tf) forward (plus LLaMA's SiLU and gate), twice
    that backward."""
    arch = catalog.model(model)
    b, s, d = 2, 512, 2
    t = b * s
    block = _block(model, b, s, d, unfused=False)
    extra = 3 * t * arch.ffn if arch.style == "llama" else 0
    assert _elementwise(block, "forward") == d * (14 * t * arch.hidden + 2 * t * arch.ffn + extra)
    assert _elementwise(block, "backward") == 2 * _elementwise(block, "forward")


def test_unfused_gpt_block_is_the_catalog_count_plus_weight_casts():
    """GPT-2 under autocast: T(66h + 68f) forward and T(120h + 120f) backward, plus 6 bytes per weight
    each way (catalogs/execution.yaml); in fp32 the fp32 counts and no casts."""
    arch = catalog.model("GPT-2-1.5B")
    h, f, t = arch.hidden, arch.ffn, 4 * 1024
    block = _block("GPT-2-1.5B", 4, 1024, 2, unfused=True)
    casts = 6 * block.params
    assert _elementwise(block, "forward") == t * (66 * h + 68 * f) + casts
    assert _elementwise(block, "backward") == t * (120 * h + 120 * f) + casts
    fp32 = _block("GPT-2-1.5B", 4, 1024, 4, unfused=True)
    assert _elementwise(fp32, "forward") == t * (74 * h + 72 * f)


@pytest.mark.parametrize("model", ["BERT-Base", "BERT-Large", "GPT-2-1.5B", "GPT-3-1.3B", "LLaMA-7B"])
@pytest.mark.parametrize("d", [2, 4])
def test_plain_model_code_never_moves_fewer_bytes_than_fused_kernels(model, d):
    for b, s in ((1, 128), (8, 512)):
        plain, fused = _block(model, b, s, d, True), _block(model, b, s, d, False)
        for phase in ("forward", "backward"):
            assert _elementwise(plain, phase) > _elementwise(fused, phase)


def _one_gpu(**workload):
    """One H200 running GPT-2 XL at micro-batch 4 (seq 1024, bf16), with workload keys replaced."""
    wl = {"model": "GPT-2-1.5B", "micro_batch": 4, "seq_len": 1024, "precision": "bf16", **workload}
    changes = {"cluster.nodes": 1, "cluster.gpus_per_node": 1, "cluster.gpu": "H200"}
    return make_scenario(**changes, **{f"workload.{k}": v for k, v in wl.items()})


def test_defaults_follow_the_code_that_runs():
    """Plain model code unless the scenario says otherwise or the run cannot be plain model code
    (torch.compile fuses; tensor and pipeline parallelism are Megatron-style framework code)."""
    assert _one_gpu().pointwise_code == "unfused"
    assert _one_gpu(execution="compiled").pointwise_code == "fused"
    assert _one_gpu(pointwise="fused").pointwise_code == "fused"
    assert _one_gpu(execution="compiled", pointwise="unfused").pointwise_code == "unfused"
    megatron = _one_gpu(model="GPT-3-1.3B").with_changes(
        **{"cluster.gpus_per_node": 8, "training.parallelism.tensor": 8}
    )
    assert megatron.pointwise_code == "fused"


def test_plain_model_code_is_never_faster():
    plain = simulate(_one_gpu()).iteration_time
    fused = simulate(_one_gpu(pointwise="fused")).iteration_time
    assert plain > fused


def _trace_pointwise_device_s() -> float:
    """Busy time of the traced GPT-2 XL step's kernels other than matmuls, attention and the
    optimizer: LayerNorm, the tanh-GELU's ops, dropout, residual adds, casts, copies, reductions."""
    with gzip.open(GPT2_TRACE) as fh:
        events = json.loads(fh.read())["traceEvents"]
    updates = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step")),
        key=lambda e: e["ts"],
    )
    start, end = updates[0]["ts"] + updates[0]["dur"], updates[1]["ts"]  # the second step's fwd + bwd
    launch = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    skip = ("gemm", "nvjet", "cutlass", "sm90_xmma", "sdpa", "flash", "multi_tensor")
    total = 0.0
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memset"):
            continue
        launched = launch.get(e.get("args", {}).get("correlation"))
        if launched is None or not start <= launched < end:
            continue
        if any(word in e["name"].lower() for word in skip):
            continue
        total += e["dur"] * 1e-6
    return total


def test_gpt2_xl_pointwise_device_time_against_the_h200_trace():
    """The traced step's non-matmul kernels ran 108 ms of its 190 ms of forward and backward device
    time; the fused formula prices them at about 15 ms. Counted as plain model code, at the rate that
    trace gave its mixed-dtype kernels (0.85 of a copy's), they come within 5%."""
    traced = _trace_pointwise_device_s()
    assert 0.100 < traced < 0.115
    gpu = catalog.gpu("H200")

    def modelled(unfused: bool) -> float:
        device = DeviceCosts(gpu, unfused_pointwise=unfused)
        layers = transformer_layers(catalog.model("GPT-2-1.5B"), 4, 1024, 2, "fused", unfused)
        return sum(
            device.kernel_time(k, "bf16")
            for layer in layers
            for k in layer.forward + layer.backward
            if k.name in POINTWISE
        )

    assert modelled(True) == pytest.approx(traced, rel=0.05)
    assert modelled(False) < 0.25 * traced


def test_readme_gpu_table_is_what_the_defaults_predict():
    """The README's real-GPU table: each row's predicted step is what `validate --dataset gpu_steps`
    gives now (the scenario timed as the benchmark timed it), micro-batch over its predicted rate."""
    import re

    from clustersim.validation.gpu_throughput import validate_throughput

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Checked on a real GPU", 1)[1].split("\n## ", 1)[0]
    model = r"(BERT-Large|GPT-2 XL|GPT-3 XL|ResNet-50) [^,]+, (\d+)"
    pattern = rf"^\| (H200|H100 SXM) \| {model} \| [^|]+\| ([\d.]+) ms \|"
    rows = re.findall(pattern, section, re.M)
    assert len(rows) == 7
    gpus = {"H200": "H200", "H100 SXM": "H100-SXM"}
    names = {
        "BERT-Large": "BERT-Large",
        "GPT-2 XL": "GPT-2-1.5B",
        "GPT-3 XL": "GPT-3-1.3B",
        "ResNet-50": "ResNet-50",
    }
    report = validate_throughput(None, samples=0, dataset="gpu_steps")
    predicted = {(r.gpu, r.model, r.micro_batch): r.micro_batch / r.predicted for r in report.scored}
    for gpu, label, micro_batch, shown in rows:
        step = predicted[gpus[gpu], names.get(label, label), int(micro_batch)]
        assert f"{step * 1e3:.1f}" == shown, (gpu, label, micro_batch)


def test_only_autocast_pointwise_streams_below_a_copy():
    """Mixed bf16/fp32 operands take PyTorch's non-vectorised path; an fp32 run's are one dtype."""
    gpu = catalog.gpu("H200")
    kernel = _block("GPT-2-1.5B", 4, 1024, 2, True).forward[-1]
    assert kernel.name == "elementwise"
    plain, framework = DeviceCosts(gpu, unfused_pointwise=True), DeviceCosts(gpu)
    assert plain.kernel_time(kernel, "bf16") > framework.kernel_time(kernel, "bf16")
    assert plain.kernel_time(kernel, "fp32") == framework.kernel_time(kernel, "fp32")
