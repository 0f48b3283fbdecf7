"""Adam's and SGD's update as torch.optim runs it: fused, foreach (multi-tensor) or a for loop.

Checked against closed forms (the bytes each path moves, counted op by op in
cost_models/kernel_bytes.py; the for loop's kernels and host dispatch per tensor), invariants (the
fused pass is never slower; forward and backward do not change; the default is the fused update the
golden outputs were recorded with) and bad input (unknown value; code that fixes its update).
"""

from __future__ import annotations

import pytest

from clustersim import catalog
from clustersim.cost_models.kernel_bytes import FOREACH_ADAMW, FOREACH_SGDM, FUSED_ADAM, SGDM_UPDATE
from clustersim.errors import InputError
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from tests.conftest import make_scenario

ONE_H200 = {
    "cluster.nodes": 1,
    "cluster.gpus_per_node": 1,
    "cluster.gpu": "H200",
    "workload.precision": "bf16",
}


def _scenario(impl: str | None, optimizer: str = "adam", **overrides):
    options = {} if impl is None else {"implementation": impl}
    return make_scenario(
        **{**ONE_H200, "training.optimizer": optimizer, "training.optimizer_options": options, **overrides}
    )


def _update_s(result) -> float:
    return result.breakdown["optimizer"]


@pytest.mark.parametrize(
    ("optimizer", "fused", "multi", "kernels"),
    [("adam", FUSED_ADAM, FOREACH_ADAMW, 8), ("sgdm", SGDM_UPDATE, FOREACH_SGDM, 3)],
)
def test_each_path_moves_its_bytes_and_launches_its_kernels(optimizer, fused, multi, kernels):
    ctx = build_context(_scenario("for_loop", optimizer))
    P, n = ctx.params, ctx.param_tensors
    stream = ctx.device.stream_time(1.0)  # seconds per byte at the streaming rate
    assert build_context(_scenario("fused", optimizer)).update_device_time(fused, P) == pytest.approx(
        fused * P * stream
    )
    assert build_context(_scenario("foreach", optimizer)).update_device_time(multi, P) == pytest.approx(
        multi * P * stream
    )
    assert ctx.update_kernels_per_tensor == kernels
    assert ctx.update_device_time(multi, P) == pytest.approx(
        multi * P * stream + kernels * n * ctx.device.kernel_overhead_s
    )
    # the host issues each of those kernels from Python, at the eager forward rate
    fused_host = build_context(_scenario("fused", optimizer)).host_optimizer_time()
    assert ctx.host_optimizer_time() - fused_host == pytest.approx(
        n * kernels * ctx.dispatch.host_s_per_kernel_forward
    )


def test_fused_is_never_slower_and_only_the_update_changes():
    runs = {
        impl: simulate(_scenario(impl), uncertainty_samples=0) for impl in ("fused", "foreach", "for_loop")
    }
    assert _update_s(runs["fused"]) < _update_s(runs["foreach"]) < _update_s(runs["for_loop"])
    assert runs["fused"].iteration_time < runs["foreach"].iteration_time < runs["for_loop"].iteration_time
    for impl in ("foreach", "for_loop"):
        for key in ("forward", "backward"):
            assert runs[impl].breakdown[key] == pytest.approx(runs["fused"].breakdown[key])
    # foreach: the update's bytes, 3x the fused pass's
    assert _update_s(runs["foreach"]) / _update_s(runs["fused"]) == pytest.approx(FOREACH_ADAMW / FUSED_ADAM)


def test_default_is_the_fused_update():
    assert simulate(_scenario(None)).iteration_time == simulate(_scenario("fused")).iteration_time


def test_fused_adam_matches_the_h200_trace():
    """The H200 BERT-Large step ran AdamW(fused=True): 2.65 ms of update kernels over its 336M
    parameters (catalogs/execution.yaml), 28 bytes each at the streaming rate a copy reaches there."""
    ctx = build_context(_scenario("fused"))
    assert ctx.update_device_time(FUSED_ADAM, ctx.params) == pytest.approx(2.65e-3, rel=0.1)


def test_sharded_updates_loop_over_their_own_tensors():
    fsdp = {
        "training.sharding": {"framework": "fsdp", "fsdp_strategy": "full"},
        "cluster.gpus_per_node": 8,
        "cluster.gpu": "H100-SXM",
    }
    ds = {
        "training.sharding": {"stage": 3, "framework": "deepspeed"},
        "cluster.gpus_per_node": 8,
        "cluster.gpu": "H100-SXM",
    }
    loop_fsdp = simulate(_scenario("for_loop", **fsdp), uncertainty_samples=0)
    loop_ds = simulate(_scenario("for_loop", **ds), uncertainty_samples=0)
    fused_fsdp = simulate(_scenario("fused", **fsdp), uncertainty_samples=0)
    # FSDP's per-parameter shards each pay the loop's kernels; DeepSpeed's one flat partition does once
    assert _update_s(loop_fsdp) > _update_s(loop_ds) > _update_s(fused_fsdp)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"training.parallelism.tensor": 2, "cluster.gpus_per_node": 2}, "Megatron-LM"),
        ({"training.offload": {"mode": "zero"}}, "CPU offload"),
    ],
)
def test_code_that_fixes_its_update_refuses_another(overrides, says):
    with pytest.raises(InputError) as err:
        simulate(_scenario("foreach", **overrides))
    assert err.value.key == "training.optimizer_options.implementation"
    assert says in str(err.value)


def test_unknown_implementation_is_one_line_naming_the_key():
    with pytest.raises(InputError) as err:
        simulate(_scenario("fast"))
    assert "training.optimizer_options.implementation" in str(err.value)


def test_catalog_host_rate_is_what_the_loop_pays():
    """The for loop's per-op host cost is the eager mode's Python-dispatched rate (catalogs)."""
    assert catalog.execution_mode("eager").host_s_per_kernel_forward == pytest.approx(24.5e-6)


def test_foreach_adam_holds_a_sqrt_v_scratch_during_the_update_only():
    fused = simulate(_scenario("fused"), uncertainty_samples=0).memory
    foreach = simulate(_scenario("foreach"), uncertainty_samples=0).memory
    P = build_context(_scenario("foreach")).params
    assert foreach["update_scratch"] == pytest.approx(4 * P)
    assert foreach["peak_update"] - fused["peak_update"] == pytest.approx(4 * P)
    assert foreach["peak_forward_backward"] == pytest.approx(fused["peak_forward_backward"])


@pytest.mark.parametrize(
    "sharding",
    [{"framework": "fsdp", "fsdp_strategy": "full"}, {"stage": 1}, {"stage": 3, "framework": "deepspeed"}],
)
def test_a_sharded_foreach_adam_holds_the_scratch_of_its_own_partition(sharding):
    """Under ZeRO and FSDP each rank updates its partition of the state, so torch's multi-tensor Adam
    allocates sqrt(v) for that partition: 4 bytes per parameter over the optimizer-state ranks, during
    the update only."""
    sharded = {
        "training.sharding": sharding,
        "cluster.nodes": 2,
        "cluster.gpus_per_node": 8,
        "cluster.gpu": "H100-SXM",
    }
    fused = simulate(_scenario("fused", **sharded), uncertainty_samples=0).memory
    foreach = simulate(_scenario("foreach", **sharded), uncertainty_samples=0).memory
    P = build_context(_scenario("foreach", **sharded)).params
    assert foreach["update_scratch"] == pytest.approx(4 * P / 16)
    assert foreach["peak_update"] - fused["peak_update"] == pytest.approx(4 * P / 16)
    assert foreach["peak_forward_backward"] == pytest.approx(fused["peak_forward_backward"])
    assert "update_scratch" not in fused


def test_the_implementation_carries_to_sgd_and_a_compressed_row_that_names_it_is_invalid():
    """compare and a sweep's optimizer axis keep the code's update implementation for the other
    optimizer that has one; a sweep row that names an option its optimizer lacks is refused with the
    key, not run without it."""
    from clustersim.planner.compare import scenario_for_optimizer
    from clustersim.sweeps.spec import resolve_row

    base = _scenario("foreach", **{"cluster.nodes": 2, "cluster.gpus_per_node": 8})
    assert scenario_for_optimizer(base, "sgdm", None).training.optimizer_options == {
        "implementation": "foreach"
    }
    assert scenario_for_optimizer(base, "binsgdm", None).training.optimizer_options == {}
    axis = {"optimizer": "sgdm", "training.optimizer_options": {"implementation": "for_loop"}}
    assert resolve_row(base, axis, None).training.optimizer_options == {"implementation": "for_loop"}
    with pytest.raises(InputError) as err:
        resolve_row(base, {**axis, "optimizer": "binsgdm"}, None)
    assert "training.optimizer_options.implementation" in str(err.value)


def test_deepspeed_zero3_steps_its_partition_one_sub_group_at_a_time():
    """DeepSpeed's ZeRO-3 runs the optimizer per sub-group (sub_group_size, 1e9 elements by default),
    so a foreach Adam's sqrt(v) scratch is at most one sub-group's; FSDP steps the whole partition."""
    big = {
        "workload.model": "GPT-3-175B",
        "workload.micro_batch": 1,
        "workload.seq_len": 2048,
        "workload.activation_checkpointing": True,
        "cluster.nodes": 16,
        "cluster.gpus_per_node": 8,
        "cluster.gpu": "H100-SXM",
    }
    ds = _scenario("foreach", **big, **{"training.sharding": {"stage": 3, "framework": "deepspeed"}})
    fsdp = _scenario(
        "foreach", **big, **{"training.sharding": {"framework": "fsdp", "fsdp_strategy": "full"}}
    )
    partition = build_context(ds).params / 128
    assert partition > 1e9
    assert simulate(ds, uncertainty_samples=0).memory["update_scratch"] == pytest.approx(4 * 1e9)
    assert simulate(fsdp, uncertainty_samples=0).memory["update_scratch"] == pytest.approx(4 * partition)
    # a sub_group_size the scenario gives (training.offload.subgroup_size) is the one DeepSpeed steps by
    smaller = ds.with_changes(**{"training.offload.subgroup_size": 2e8})
    assert simulate(smaller, uncertainty_samples=0).memory["update_scratch"] == pytest.approx(4 * 2e8)
