"""Batch-norm fused with the convolutions (workload.batch_norm), as NVIDIA's MLPerf ResNet-50 runs it.

Checked against closed forms counted from the MLPerf symbol files (statistics from the convolution's
epilogue; one apply pass, or none where the next convolution applies it; the block's add in one pass),
the invariants (fusing never adds bytes, launches or time; the convolutions themselves are untouched)
and the two published MLPerf single-node throughputs that run this code.
"""

from __future__ import annotations

import pytest
import yaml

from clustersim import catalog
from clustersim.cli import app
from clustersim.cost_models.compute import DeviceCosts
from clustersim.errors import InputError
from clustersim.simulator import simulate
from clustersim.validation.gpu_throughput import scenario_for
from clustersim.validation.throughput_data import load_gpu_throughput
from clustersim.workloads.resnet import resnet_layers
from tests.conftest import make_scenario

MODES = ("separate", "fused", "fused_into_conv")


def _layers(mode: str, micro_batch: int = 8, d: int = 2):
    return resnet_layers(catalog.model("ResNet-50"), micro_batch, d, False, mode)


def _bytes(layer, group: str, phase: str) -> float:
    return sum(k.bytes for k in getattr(layer, phase) if k.name == group)


def _scenario(mode: str, gpu: str = "A100-80GB", micro_batch: int = 256, execution: str = "eager"):
    """One GPU training ResNet-50 in fp16 with batch-norm ``mode`` (conftest's small scenario, reshaped)."""
    workload = {"model": "ResNet-50", "micro_batch": micro_batch, "precision": "fp16"}
    workload.update(batch_norm=mode, execution=execution)
    one_gpu = {"cluster.nodes": 1, "cluster.gpus_per_node": 1, "cluster.gpu": gpu}
    return make_scenario(workload=workload, **one_gpu, **{"training.optimizer": "sgdm"})


def test_an_identity_block_moves_what_the_mlperf_symbols_count():
    """stage1.block1: 256 -> 64 (1x1) -> 64 (3x3) -> 256 (1x1) at 56 x 56, identity shortcut.
    Forward, fused: apply passes over the first two outputs (read + write) and the block's end (read
    the third output and the shortcut, write); fused_into_conv: the block's end only. Backward: the
    batch-norm gradient's five passes per output, the shortcut's gradient written, and the second
    gradient to reach the block's input added into the first's buffer (MXNet's add-to: one read)."""
    b, d, hw = 8, 2, 56
    o1 = o2 = 64 * hw * hw
    o3 = block_in = 256 * hw * hw
    fused = {layer.name: layer for layer in _layers("fused", b, d)}["stage1.block1"]
    into = {layer.name: layer for layer in _layers("fused_into_conv", b, d)}["stage1.block1"]
    assert _bytes(fused, "fused_norm", "forward") == pytest.approx(d * b * (2 * (o1 + o2) + 3 * o3))
    assert _bytes(into, "fused_norm", "forward") == pytest.approx(d * b * 3 * o3)
    backward = d * b * (5 * (o1 + o2 + o3) + o3 + block_in)
    assert _bytes(fused, "fused_norm", "backward") == pytest.approx(backward)
    assert _bytes(into, "fused_norm", "backward") == pytest.approx(backward)
    for layer in (fused, into):  # no batch-norm or ReLU kernels of their own
        assert not [k for k in layer.forward + layer.backward if k.name in ("batch_norm", "activation")]


def test_fusing_moves_fewer_bytes_and_launches_fewer_kernels_and_leaves_the_convolutions_alone():
    by_mode = {mode: _layers(mode) for mode in MODES}
    for phase in ("forward", "backward"):
        totals = {}
        for mode, layers in by_mode.items():
            norm = [k for layer in layers for k in getattr(layer, phase) if k.name != "conv"]
            totals[mode] = (sum(k.bytes for k in norm), sum(k.launches for k in norm))
            convs = [
                (k.flops, k.bytes) for layer in layers for k in getattr(layer, phase) if k.name == "conv"
            ]
            assert convs == [
                (k.flops, k.bytes)
                for layer in by_mode["separate"]
                for k in getattr(layer, phase)
                if k.name == "conv"
            ]
        assert totals["fused_into_conv"][0] <= totals["fused"][0] < totals["separate"][0]
        assert totals["fused_into_conv"][1] <= totals["fused"][1] < totals["separate"][1]


def test_fused_passes_stream_at_the_hbm_rate_not_the_sm_bound_batch_norm_rate():
    gpu = catalog.gpus()["A100-80GB"]
    device = DeviceCosts(gpu)
    kernel = next(k for k in _layers("fused", 256)[5].forward if k.name == "fused_norm")
    streaming = kernel.bytes / device.memory_rate + kernel.launches * device.kernel_overhead_s
    assert device.kernel_time(kernel, "fp16") == pytest.approx(streaming)


@pytest.mark.parametrize("gpu", ["V100-SXM2", "A100-80GB", "H100-SXM"])
@pytest.mark.parametrize("micro_batch", [32, 256])
def test_a_step_is_never_slower_fused_and_never_faster_than_its_convolutions(gpu, micro_batch):
    times = [simulate(_scenario(mode, gpu, micro_batch)).iteration_time for mode in MODES]
    assert times[0] > times[1] >= times[2]
    conv_only = sum(
        DeviceCosts(catalog.gpus()[gpu]).kernel_time(k, "fp16")
        for layer in _layers("fused_into_conv", micro_batch)
        for k in layer.forward + layer.backward
        if k.name == "conv"
    )
    assert times[2] > conv_only


def test_keeps_fewer_activations_when_the_next_convolution_applies_the_normalisation():
    kept = {mode: sum(layer.activation_bytes for layer in _layers(mode)) for mode in MODES}
    assert kept["fused_into_conv"] < kept["fused"] < kept["separate"]
    # a projection block keeps its four convolutions' outputs and three written activations (the
    # projection's normalised output is never written: the block's end reads its raw output)
    b, d = 8, 2
    block = {layer.name: layer for layer in _layers("fused", b, d)}["stage2.block0"]
    outputs = [128 * 56 * 56, 128 * 28 * 28, 512 * 28 * 28, 512 * 28 * 28]  # v1.5: stride on the 3x3
    assert block.activation_bytes == pytest.approx(d * b * (sum(outputs) + sum(outputs[:3])))


def test_the_stem_keeps_its_statistics_kernel_and_folds_its_relu():
    separate, fused = _layers("separate")[0], _layers("fused")[0]
    bn = [k for k in fused.forward if k.name == "batch_norm"]
    assert [k.bytes for k in bn] == [k.bytes for k in separate.forward if k.name == "batch_norm"]
    pool = sum(k.bytes for k in fused.forward if k.name == "activation")
    relu_and_pool = sum(k.bytes for k in separate.forward if k.name == "activation")
    out = 2 * 8 * 64 * 112 * 112
    assert pool == pytest.approx(1.25 * out) and relu_and_pool == pytest.approx(3.25 * out)


def _error(row) -> float:
    """The prediction's relative error against the row's published throughput."""
    predicted = row.samples_per_step / simulate(scenario_for(row)).iteration_time
    return predicted / row.throughput - 1


def test_the_mlperf_rows_run_the_fusion_their_symbol_files_name_and_land_within_ten_percent():
    rows = [r for r in load_gpu_throughput().rows if r.execution == "cuda_graphs"]
    assert len(rows) == 6  # v1.0, v1.1, v2.0 on a DGX A100; v2.1, v3.0, v3.1 on a DGX H100
    expected = {"A100-80GB": "fused", "H100-SXM": "fused_into_conv"}  # stats-fl / mainloop-fl
    assert all(r.batch_norm == expected[r.gpu] for r in rows)
    for row in rows:
        assert abs(_error(row)) < 0.10, row.gpu
        # separate kernels, as PyTorch runs them, put both rows more than 30% too slow
        assert _error(row.model_copy(update={"batch_norm": "separate"})) < -0.30, row.gpu


def test_run_names_the_fusion_and_a_transformer_ignores_it(runner, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_scenario("fused_into_conv", micro_batch=64).model_dump(mode="json")))
    out = runner.invoke(app, ["run", str(path), "--samples", "0"])
    assert out.exit_code == 0, out.output
    assert "batch-norm fused (fused_into_conv, workload.batch_norm)" in out.output
    assert "next convolution's prologue" in out.output
    bert = {
        "name": "bert",
        "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": "A100-80GB"},
        "workload": {"model": "BERT-Base", "micro_batch": 8, "seq_len": 128, "batch_norm": "fused"},
        "training": {"optimizer": "adam"},
    }
    path.write_text(yaml.safe_dump(bert))
    out = runner.invoke(app, ["run", str(path), "--samples", "0"])
    assert out.exit_code == 0, out.output
    assert "workload.batch_norm does not apply to BERT-Base (a transformer): it is not used" in out.output


def test_an_unknown_fusion_is_one_line_naming_the_key(runner, tmp_path):
    with pytest.raises(InputError, match="batch_norm"):
        _scenario("fuse")
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: x\ncluster: {nodes: 1, gpus_per_node: 1, gpu: A100-80GB}\n"
        "workload: {model: ResNet-50, micro_batch: 8, batch_norm: fuse}\ntraining: {optimizer: sgdm}\n"
    )
    out = runner.invoke(app, ["run", str(path), "--samples", "0"])
    assert out.exit_code == 2
    assert "workload.batch_norm" in out.output and "Traceback" not in out.output
    assert len(out.output.strip().splitlines()) == 1


def test_a_profile_that_measured_pytorch_resnet_says_it_measured_separate_kernels():
    """The H200 profile measured clustersim's plain ResNet-50 build (torchvision's bottlenecks) in bf16:
    for a scenario of that code its times are what the step takes."""
    bf16 = {"workload.precision": "bf16", "workload.implementation": "plain"}
    scenario = _scenario("fused", gpu="H200", micro_batch=128).with_changes(**bf16)
    result = simulate(scenario, "builtin:h200-pytorch-2.11", uncertainty_samples=0)
    assert any("compute of ResNet-50 from its own measurement" in n for n in result.notes)
    assert any("with separate batch-norm kernels" in n and "workload.batch_norm" in n for n in result.notes)
    plain = _scenario("separate", gpu="H200", micro_batch=128).with_changes(**bf16)
    assert not any("batch-norm kernels" in n for n in simulate(plain, "builtin:h200-pytorch-2.11").notes)


@pytest.mark.parametrize(("key", "value"), [("memory_format", "contiguous"), ("precision", "fp32")])
def test_fused_kernels_on_tensors_they_do_not_take_are_priced_as_given_and_said(key, value):
    scenario = _scenario("fused").with_changes(**{f"workload.{key}": value})
    notes = simulate(scenario, uncertainty_samples=0).notes
    assert any(f"workload.batch_norm fused with {key} {value}" in n for n in notes)
    assert not any(
        "workload.batch_norm" in n for n in simulate(_scenario("fused"), uncertainty_samples=0).notes
    )
