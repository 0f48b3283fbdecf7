"""Deep Optimizer States' DeepSpeed fork (training.offload.gpu_update_gap): which subgroups its
stage3.py updates on the GPU, what crosses PCIe for them, and that a gap of 1 is plain ZeRO-Offload."""

from types import SimpleNamespace

import pytest

from clustersim.errors import InputError
from clustersim.identifiers import PlacementKind
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.simulator.offload import (
    add_gap_update,
    deepspeed_subgroups,
    gap_kinds,
    gpu_fraction,
    plan,
)
from clustersim.simulator.program import Program
from clustersim.simulator.strategies.ddp import adam_spec


def _dos(**changes):
    return load_scenario("preset:offload-dos-7b-h100").with_changes(
        **{"training.offload.gradient_copy": "async", **changes}
    )


def test_gap_kinds_follow_the_forks_rule():
    """get_opt_update_device: GPU when (i + 1) % gap == 0 and i % gap != 0."""
    gpu = PlacementKind.GPU_STREAMED
    assert [k == gpu for k in gap_kinds(6, 2)] == [False, True, False, True, False, True]
    assert [i for i, k in enumerate(gap_kinds(9, 3)) if k == gpu] == [2, 5, 8]
    assert all(k == PlacementKind.CPU for k in gap_kinds(7, 1))


def test_subgroups_are_whole_tensors_closed_at_the_size():
    """_create_fp16_sub_groups: tensors in order, a subgroup closed once it holds sub_group_size or more."""
    layers = [SimpleNamespace(param_tensors=(4, 3, 10, 2)), SimpleNamespace(param_tensors=(0, 6, 1))]
    assert deepspeed_subgroups(layers, 26, 5) == [7, 10, 8, 1]
    # a rank's partition scales every tensor by 1/p, so a 4-way partition halves nothing but the sizes
    assert deepspeed_subgroups(layers, 13, 2.5) == [3.5, 5, 4, 0.5]


def test_dos7b_subgroups_cover_the_model_and_gap_2_sends_half_to_the_gpu():
    ctx = build_context(_dos(**{"training.offload.gpu_update_gap": 2}), None)
    sizes = deepspeed_subgroups(ctx.workload.layers, ctx.params, 1e7)
    assert sum(sizes) == pytest.approx(ctx.params)
    placement = plan(ctx, adam_spec(ctx, 16.0, 12.0), ctx.params, ctx.host)
    gpu = sum(s for s, k in zip(sizes, placement.kinds) if k != PlacementKind.CPU)
    assert gpu_fraction(placement) == pytest.approx(gpu / ctx.params)
    assert 0.45 < gpu_fraction(placement) < 0.55


class _CountingHost:
    """Records the bytes of every copy by direction; every op takes one second."""

    def __init__(self):
        self.bytes = {True: 0.0, False: 0.0}

    def copy(self, nbytes, to_host):
        self.bytes[to_host] += nbytes
        return 1.0, {}

    def cpu_update(self, params, dram):
        return 1.0, {}


def test_bytes_over_pcie_are_what_the_fork_copies():
    """Each GPU subgroup's fp32 parameters, exp_avg and exp_avg_sq (12 bytes per parameter) go in, and out
    again at the next CPU subgroup's opt_transfers (the last GPU subgroup has none after it); each CPU
    subgroup sends its 16-bit parameters back (2 bytes)."""
    ctx = build_context(_dos(**{"training.offload.gpu_update_gap": 2}), None)
    spec = adam_spec(ctx, 16.0, 12.0)
    placement = plan(ctx, spec, ctx.params, ctx.host)
    sizes, kinds = placement.subgroup_sizes(), placement.kinds
    gpu = [s for s, k in zip(sizes, kinds) if k != PlacementKind.CPU]
    cpu = [s for s, k in zip(sizes, kinds) if k == PlacementKind.CPU]
    last_gpu_is_last = kinds[-1] != PlacementKind.CPU
    host = _CountingHost()
    add_gap_update(Program(), ctx, (), spec, placement, host)
    assert host.bytes[False] == pytest.approx(12 * sum(gpu) + ctx.element_bytes * sum(cpu))
    assert host.bytes[True] == pytest.approx(12 * (sum(gpu) - (gpu[-1] if last_gpu_is_last else 0.0)))


def test_gap_of_one_is_plain_zero_offload():
    plain = simulate(_dos())
    assert simulate(_dos(**{"training.offload.gpu_update_gap": 1})).iteration_time == plain.iteration_time


def test_gpu_updates_overlap_the_cpu_so_the_step_is_shorter():
    """Half the updates leave the CPU while their copies overlap the other half's CPU updates."""
    plain = simulate(_dos()).iteration_time
    forked = simulate(_dos(**{"training.offload.gpu_update_gap": 2})).iteration_time
    assert forked < plain


def test_more_pcie_bandwidth_is_never_slower():
    slow = simulate(_dos(**{"training.offload.gpu_update_gap": 2, "cluster.intra_node.pcie_gen": 4}))
    fast = simulate(_dos(**{"training.offload.gpu_update_gap": 2}))
    assert fast.iteration_time <= slow.iteration_time


def test_gap_needs_deepspeed_zero3_offload():
    with pytest.raises(InputError, match="training.offload.gpu_update_gap"):
        _dos(**{"training.offload.gpu_update_gap": 2, "training.sharding.stage": 2})


def test_gpu_subgroups_gradients_are_held_on_the_gpu():
    """prefetch_optimizer_gpu_fp32_grads: DeepSpeed's gradient accumulation dtype (bf16 here: 2 bytes)
    per GPU-updated parameter, plus one GPU subgroup's fp32 cast, beside the staging buffers."""
    plain = simulate(_dos()).memory["offload_staging"]
    forked = simulate(_dos(**{"training.offload.gpu_update_gap": 2}))
    ctx = build_context(_dos(**{"training.offload.gpu_update_gap": 2}), None)
    placement = plan(ctx, adam_spec(ctx, 16.0, 12.0), ctx.params, ctx.host)
    gpu = [s for s, k in zip(placement.sizes, placement.kinds) if k != PlacementKind.CPU]
    assert ctx.grad_bytes == 2
    expected = 2 * max(placement.sizes) * 12.0 + 2.0 * gpu_fraction(placement) * ctx.params + 4.0 * max(gpu)
    assert plain == 0.0
    assert forked.memory["offload_staging"] == pytest.approx(expected)


def test_cpu_update_after_a_gpu_subgroup_waits_for_the_earlier_16_bit_copies():
    """step(): at a CPU subgroup i % gap == 0 the thread runs opt_transfers, then
    prefetch_optimizer_copier_fetch_fp16.wait(), then its CPU update: that update depends on the last
    CPU subgroup's 16-bit parameter copy, the state copies queued before the wait do not."""
    ctx = build_context(_dos(**{"training.offload.gpu_update_gap": 2}), None)
    spec = adam_spec(ctx, 16.0, 12.0)
    placement = plan(ctx, spec, ctx.params, ctx.host)
    prog = Program()
    add_gap_update(prog, ctx, (), spec, placement, _CountingHost())
    ops = {op.name.split(" (")[0]: op for op in prog.ops}
    assert ops["H2D params subgroup 0"].id in ops["CPU update subgroup 2"].deps
    assert ops["H2D params subgroup 0"].id not in ops["H2D state subgroup 3"].deps
    assert ops["CPU update subgroup 0"].deps == ()


def test_the_gap_placement_says_its_subgroups_sizes_and_the_gap_in_english(runner):
    """It printed "162 subgroups of 206.0M parameters (chosen by: every 2th subgroup on the GPU)": 206M
    is the largest tensor (the staging buffers' size), not the subgroups' size."""
    from clustersim.cli import app

    r = runner.invoke(
        app, ["run", "preset:offload-dos-7b-h100", "--set", "training.offload.gpu_update_gap=2"]
    )
    assert r.exit_code == 0, r.output
    assert "162 subgroups of 16.8M to 206.0M parameters (DeepSpeed's whole tensors)" in r.output
    assert "every 2nd subgroup on the GPU" in r.output and "2th" not in r.output


def test_a_gap_larger_than_the_subgroup_count_is_refused_naming_the_key(runner):
    """A gap of 200 on 162 subgroups put none on the GPU while saying "every 200th subgroup on the GPU"."""
    from clustersim.cli import app

    with pytest.raises(InputError) as exc:
        simulate(_dos(**{"training.offload.gpu_update_gap": 200}))
    assert exc.value.key == "training.offload.gpu_update_gap" and "at most 162" in exc.value.message
    r = runner.invoke(
        app, ["run", "preset:offload-dos-7b-h100", "--set", "training.offload.gpu_update_gap=200"]
    )
    assert r.exit_code == 2 and "training.offload.gpu_update_gap" in r.output and "Traceback" not in r.output
    last = simulate(_dos(**{"training.offload.gpu_update_gap": 162}))  # the largest that puts one there
    assert last.extra["offload"]["placement"]["gpu_streamed"] == 1


def test_ordinals():
    from clustersim.units import ordinal

    got = [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111, 200)]
    assert got == [
        "1st",
        "2nd",
        "3rd",
        "4th",
        "11th",
        "12th",
        "13th",
        "21st",
        "22nd",
        "23rd",
        "101st",
        "111th",
        "200th",
    ]


def test_run_prints_the_offloaded_phases_the_docs_quote(runner):
    """The fork's gap-2 step (docs/offload.md and the preset's comment quote it) is a number the tool
    prints: `run`'s phases line, as DeepSpeed's timers split the iteration."""
    from clustersim.cli import app
    from clustersim.simulator.offload import step_phases

    changes = {"training.offload.gpu_update_gap": 2}
    sets = [x for k, v in changes.items() for x in ("--set", f"{k}={v}")]
    sets += ["--set", "training.offload.gradient_copy=async"]
    r = runner.invoke(app, ["run", "preset:offload-dos-7b-h100", *sets, "--samples", "0"])
    assert r.exit_code == 0, r.output
    res = simulate(_dos(**changes), uncertainty_samples=0)
    ph = step_phases(res.ops, res.iteration_time)
    assert sum(ph.values()) == pytest.approx(res.iteration_time, rel=1e-9)
    assert (
        f"step {ph['step'] * 1e3:,.2f} ms" in r.output
        and f"backward {ph['backward'] * 1e3:,.2f} ms" in r.output
    )
    assert 2.5 < ph["step"] < 3.5  # the docs' and the preset's "3.1 s"


def test_offload_plan_takes_the_gap_for_its_zero_offload_row(runner):
    """Deep Optimizer States' gap is a ZeRO-Offload schedule: offload plan keeps it on the ZeRO-Offload
    row (and says so) and drops it for the other modes, instead of refusing the scenario."""
    from clustersim.cli import app

    r = runner.invoke(
        app,
        [
            "offload",
            "plan",
            "preset:offload-dos-7b-h100",
            "--set",
            "training.offload.gpu_update_gap=2",
            "--samples",
            "0",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "ZeRO-Offload (every 2nd subgroup's update on the GPU)" in r.stdout
