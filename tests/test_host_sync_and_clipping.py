"""A host synchronisation before the optimizer step, and gradient clipping by norm.

Checked against closed forms (after a sync the optimizer's host work adds to the step in full; clipping
adds its 12 bytes per parameter at the streaming rate and, per tensor, its 8 kernels), invariants (a
sync is never faster; no sync hides a host loop shorter than backward entirely), defaults (fp16's loss
scaler syncs, bf16 does not) and the published rows that use both (NVIDIA's SQuAD scripts).
"""

from __future__ import annotations

import pytest

from clustersim.cost_models.kernel_bytes import CLIP_BYTES, CLIP_KERNELS_PER_TENSOR
from clustersim.errors import InputError
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.validation.gpu_throughput import scenario_for
from clustersim.validation.throughput_data import load_gpu_throughput
from tests.conftest import make_scenario

# BERT-Base on one H200 at a micro-batch whose backward outlasts a for-loop update's host loop, so
# without a sync that loop is hidden under backward entirely.
ONE_GPU = {
    "cluster.nodes": 1,
    "cluster.gpus_per_node": 1,
    "cluster.gpu": "H200",
    "workload.model": "BERT-Base",
    "workload.seq_len": 128,
    "workload.micro_batch": 256,
    "workload.precision": "bf16",
    "training.optimizer_options": {"implementation": "for_loop"},
}


def _scenario(**overrides):
    return make_scenario(**{**ONE_GPU, **overrides})


def test_after_a_sync_the_optimizers_host_loop_adds_in_full():
    hidden = _scenario(**{"training.host_sync_before_update": False})
    synced = _scenario(**{"training.host_sync_before_update": True})
    ctx = build_context(synced)
    host = ctx.host_optimizer_time()
    assert host > 1e-3  # a for loop over BERT-Base's tensors: milliseconds of Python
    without, with_sync = simulate(hidden).iteration_time, simulate(synced).iteration_time
    assert with_sync - without == pytest.approx(host, rel=1e-6)


@pytest.mark.parametrize("impl", ["fused", "foreach", "for_loop"])
@pytest.mark.parametrize("micro_batch", [1, 8, 64])
def test_a_sync_is_never_faster(impl, micro_batch):
    common = {"training.optimizer_options": {"implementation": impl}, "workload.micro_batch": micro_batch}
    without = simulate(_scenario(**common, **{"training.host_sync_before_update": False}))
    synced = simulate(_scenario(**common, **{"training.host_sync_before_update": True}))
    assert synced.iteration_time >= without.iteration_time - 1e-12


@pytest.mark.parametrize(("precision", "syncs"), [("fp16", True), ("bf16", False), ("fp32", False)])
def test_fp16s_loss_scaler_syncs_by_default(precision, syncs):
    gpu = "A100-80GB"  # fp16, bf16 and fp32 all run on it
    ctx = build_context(_scenario(**{"workload.precision": precision, "cluster.gpu": gpu}))
    assert ctx.host_syncs_before_update is syncs
    given = build_context(
        _scenario(
            **{
                "workload.precision": precision,
                "cluster.gpu": gpu,
                "training.host_sync_before_update": not syncs,
            }
        )
    )
    assert given.host_syncs_before_update is (not syncs)


def test_global_clipping_adds_its_two_passes_over_the_gradients():
    fused = {"training.optimizer_options": {"implementation": "fused"}}
    none = simulate(_scenario(**fused)).iteration_time
    clipped = _scenario(**fused, **{"training.gradient_clipping": "global"})
    ctx = build_context(clipped)
    expected = ctx.device.stream_time(CLIP_BYTES * ctx.params, "optimizer")
    assert simulate(clipped).iteration_time - none == pytest.approx(expected, rel=1e-6)
    assert ctx.update_kernels_per_tensor == 0  # a handful of multi-tensor kernels, not per tensor


def test_per_tensor_clipping_launches_its_kernels_for_every_tensor():
    plain = build_context(_scenario())
    clipped = build_context(_scenario(**{"training.gradient_clipping": "per_tensor"}))
    per_tensor = CLIP_KERNELS_PER_TENSOR["per_tensor"]
    assert clipped.update_kernels_per_tensor == plain.update_kernels_per_tensor + per_tensor
    n = clipped.param_tensors
    assert clipped.host_optimizer_time() - plain.host_optimizer_time() == pytest.approx(
        n * per_tensor * clipped.dispatch.host_s_per_kernel_forward
    )
    P = clipped.params
    extra_device = clipped.update_device_time(0.0, P) - plain.update_device_time(0.0, P)
    assert extra_device == pytest.approx(
        clipped.device.stream_time(CLIP_BYTES * P, "optimizer")
        + n * per_tensor * clipped.device.kernel_overhead_s
    )


def test_run_names_the_sync_and_the_clipping():
    result = simulate(
        _scenario(**{"training.gradient_clipping": "global", "training.host_sync_before_update": True})
    )
    assert "12 bytes per parameter" in result.sources["gradient clipping"]
    assert "training.host_sync_before_update" in result.sources["host sync before update"]
    fp16 = simulate(_scenario(**{"workload.precision": "fp16", "cluster.gpu": "A100-80GB"}))
    assert "loss scaler" in fp16.sources["host sync before update"]
    assert "host sync before update" not in simulate(_scenario()).sources  # bf16, nothing said


def test_the_squad_rows_read_the_gradient_norm_on_the_host_every_step():
    rows = [r for r in load_gpu_throughput("gpu_throughput").rows if "SQuAD" in r.task]
    assert len(rows) == 12
    for row in rows:
        training = scenario_for(row).training
        assert training.host_sync_before_update is True
        expected = "per_tensor" if row.optimizer_implementation == "for_loop" else "global"
        assert training.gradient_clipping == expected


@pytest.mark.parametrize(("value", "shown"), [("maybe", "'maybe'"), (2, "2")])
def test_a_bad_flag_names_what_was_given(value, shown):
    with pytest.raises(InputError) as err:
        _scenario(**{"training.host_sync_before_update": value})
    assert "training.host_sync_before_update" in str(err.value)
    assert f"should be a boolean (true or false), not {shown}" in str(err.value)


@pytest.mark.parametrize(
    ("ref", "changes"),
    [
        ("preset:default", {"training.parallelism.tensor": 2}),  # Megatron-LM's update
        ("preset:onebit-adam-ethernet", {}),  # a compressed optimizer's own update kernel
        ("preset:default", {"training.optimizer": "binsgdm"}),
        ("preset:default", {"training.sharding.stage": 3}),  # ZeRO's partitioned update
    ],
)
def test_clipping_is_priced_on_every_gpu_update_path(ref, changes):
    scenario = load_scenario(ref)
    if changes:
        scenario = scenario.with_changes(**changes)
    clipped = scenario.with_changes(**{"training.gradient_clipping": "global"})
    assert simulate(clipped).iteration_time > simulate(scenario).iteration_time


def test_a_sync_the_program_cannot_hold_is_said_so():
    # Megatron-LM's program prices no host work of its own for the optimizer step
    megatron = load_scenario("preset:default").with_changes(
        **{"training.parallelism.tensor": 2, "training.host_sync_before_update": True}
    )
    assert simulate(megatron).sources["host sync before update"].startswith("not modelled here")
    # by default (fp16) nothing is said where nothing waits
    default_fp16 = load_scenario("preset:default").with_changes(**{"training.parallelism.tensor": 2})
    assert "host sync before update" not in simulate(default_fp16).sources


@pytest.mark.parametrize(("value", "shown"), [(0, "0"), (1, "1"), ("off", "'off'"), ("yes", "'yes'")])
def test_a_flag_is_never_read_from_a_number_or_a_word(value, shown):
    with pytest.raises(InputError) as err:
        _scenario(**{"training.host_sync_before_update": value})
    assert f"should be a boolean (true or false), not {shown}" in str(err.value)


def test_a_published_row_takes_only_true_or_false_too():
    from importlib import resources

    from clustersim.io import load_yaml
    from clustersim.validation.throughput_data import FILE, parse_gpu_throughput

    raw = load_yaml(resources.files("clustersim.validation").joinpath("data/gpu_throughput.yaml").read_text())
    squad = next(t for t in raw["tables"] if "SQuAD" in t["source"])
    squad["host_sync_before_update"] = 1
    with pytest.raises(InputError) as err:
        parse_gpu_throughput(raw, FILE)
    assert "host_sync_before_update" in str(err.value) and "not 1" in str(err.value)
