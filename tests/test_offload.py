"""CPU optimizer offload: contention, placement, memory accounting, bad input."""

import json

import pytest

from clustersim.errors import InputError
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.simulator.engine import Engine
from clustersim.simulator.host import DRAM, GPU_UP
from clustersim.simulator.program import Program
from tests.conftest import make_scenario


def llama(mode="interleaved", **kw):
    return load_scenario("preset:offload-llama7b-h100").with_changes(**{"training.offload.mode": mode, **kw})


def test_pcie_contention_slows_both_flows():
    """An offload copy and NCCL's traffic to a host-staged NIC share the GPU's PCIe link."""
    s = make_scenario(
        **{
            "cluster.nodes": 2,
            "cluster.nic.kind": "ethernet_tcp",
            "cluster.nic.line_rate_gbps": 400,
            "cluster.nic.count": 4,
        }
    )
    ctx = build_context(s)
    host = ctx.host
    t_copy, copy_demands = host.copy(4e9, to_host=True)
    t_comm = 0.2
    comm_demands = host.nic_traffic(inter_bytes_per_gpu=0.9 * host.pcie * t_comm, duration=t_comm)
    assert GPU_UP in copy_demands and GPU_UP in comm_demands and DRAM in comm_demands

    def run(*ops):
        prog = Program(ctx.link_capacities())
        ids = [prog.add(name, stream, t, cat, demands=d) for name, stream, t, cat, d in ops]
        return Engine(prog).run()[1], ids

    alone_copy, (c,) = run(("copy", "d2h", t_copy, "transfer", copy_demands))
    alone_comm, (n,) = run(("comm", "comm", t_comm, "communication", comm_demands))
    both, (c2, n2) = run(
        ("copy", "d2h", t_copy, "transfer", copy_demands),
        ("comm", "comm", t_comm, "communication", comm_demands),
    )
    assert both[c2] > alone_copy[c] * 1.01
    assert both[n2] > alone_comm[n] * 1.01


@pytest.mark.parametrize("dram", [49, 100, 400, 1600])
def test_interleaving_never_loses_to_all_cpu_or_all_gpu(dram):
    r = simulate(llama(**{"cluster.host.dram_gbs": dram}))
    # simulated candidates, and those ruled out by a lower bound on their time (not simulated)
    cands = r.extra["offload"]["candidates"] | r.extra["offload"]["ruled_out"]
    assert r.iteration_time <= min(cands["all on the CPU"], cands["all on the GPU (streamed)"]) + 1e-12
    zero = simulate(llama("zero", **{"cluster.host.dram_gbs": dram}))
    assert r.iteration_time <= zero.iteration_time + 1e-12
    # the performance model alone is close to the best plan it is checked against
    assert cands["performance model"] <= 1.05 * min(cands.values())


def test_published_reference_point_shape():
    """7B on one GPU: no offload does not fit; interleaving beats ZeRO-Offload (paper: 9.5 s -> 6.8 s)."""
    with pytest.raises(InputError, match="does not fit in GPU memory"):
        simulate(llama("none"))
    zero, inter = simulate(llama("zero")), simulate(llama("interleaved"))
    assert inter.iteration_time < zero.iteration_time
    assert inter.extra["offload"]["placement"]["gpu_resident"] > 0
    assert inter.memory["total"] <= inter.memory["capacity"]


def test_memory_accounting_matches_hand_computation():
    s = make_scenario(
        **{
            "cluster.nodes": 1,
            "cluster.gpus_per_node": 1,
            "workload.model": None,
            "workload.micro_batch": 2,
            "workload.precision": "bf16",
            "workload.layers": [
                {
                    "name": "l",
                    "params": 1_000_000,
                    "forward_flops": 1e9,
                    "activation_bytes": 5_000_000,
                    "repeat": 3,
                }
            ],
        }
    )
    r = simulate(s)
    P, acts = 3_000_000, 3 * 2 * 5_000_000
    m = r.memory
    assert m["parameters"] == 2 * P + 4 * P  # bf16 weights + fp32 master
    assert m["gradients"] == 2 * P and m["ddp_buckets"] == 0  # one GPU: no DDP, no bucket copy
    assert m["optimizer_state"] == 8 * P  # Adam m and v in fp32
    assert m["activations"] == acts
    assert m["total"] == 2 * P + 4 * P + 2 * P + 8 * P + acts
    off = simulate(s.with_changes(**{"training.offload.mode": "zero"}))
    assert off.memory["parameters"] == 2 * P and off.memory["optimizer_state"] == 0
    # ZeRO-Offload: no gradients but DeepSpeed's two whole reduce buckets (5e8 bf16 elements each) and
    # its GPU buffer of the largest parameter (1M elements)
    assert off.memory["gradients"] == 0
    assert off.memory["total"] == 2 * P + 2 * 5e8 * 2 + 2 * 1_000_000 + acts


@pytest.mark.parametrize("optimizer", ["adam", "sgdm"])
@pytest.mark.parametrize("mode", ["zero", "interleaved"])
def test_offload_combines_with_every_optimizer_a_framework_offloads(optimizer, mode):
    s = make_scenario(**{"cluster.nodes": 2, "training.optimizer": optimizer, "training.offload.mode": mode})
    r = simulate(s)
    base = simulate(s.with_changes(**{"training.offload.mode": "none"}))
    assert r.iteration_time > 0 and "offload" in r.extra
    assert r.memory["total"] < base.memory["total"]  # offloading frees GPU memory
    assert r.memory["optimizer_state"] == 0  # the whole state lives on the host


def test_zero_offload_reduce_scatters_and_gathers():
    r = simulate(make_scenario(**{"cluster.nodes": 2, "training.offload.mode": "zero"}))
    ops = {o.meta.get("op") for o in r.ops if o.category == "communication"}
    assert ops == {"reduce_scatter", "all_gather"}
    assert any(o.name.startswith("D2H gradients") for o in r.ops)


@pytest.mark.parametrize(
    "override,match",
    [
        ({"training.offload.subgroup_size": 0}, "training.offload.subgroup_size"),
        ({"training.offload.subgroup_size": -5}, "training.offload.subgroup_size"),
        ({"cluster.host.cores": 0}, "cluster.host.cores"),
        ({"cluster.host.memory_gib": 0}, "cluster.host.memory_gib"),
    ],
)
def test_bad_offload_settings_are_input_errors(override, match):
    with pytest.raises(InputError, match=match):
        llama(**override)


def test_gpu_placement_that_overflows_memory_is_an_error():
    with pytest.raises(InputError, match="training.offload.placement"):
        simulate(llama("interleaved", **{"training.offload.placement": "gpu"}))


def test_host_memory_too_small_for_the_offloaded_state():
    with pytest.raises(InputError, match="cluster.host.memory_gib"):
        simulate(llama("zero", **{"cluster.host.memory_gib": 16}))


def test_offload_plan_cli(runner):
    from clustersim.cli import app

    r = runner.invoke(app, ["offload", "plan", "preset:offload-llama7b-h100"])
    assert r.exit_code == 0, r.output
    assert (
        "does not fit" in r.output and "ZeRO-Offload" in r.output and "faster than ZeRO-Offload" in r.output
    )
    r = runner.invoke(app, ["offload", "plan", "preset:offload-llama7b-h100", "--json"])
    import json

    d = json.loads(r.stdout)
    assert d["modes"]["none"]["fits"] is False and d["placement"]["subgroups"] == 674


def test_zero3_offload_with_every_subgroup_resident_runs_as_zero3_alone():
    """Interleaved offload on ZeRO-3 that keeps every subgroup's state on the GPU does what ZeRO-3
    does: the only extra work is each reduced partition's fp32 cast and its 16-bit round trip through
    the host gradient buffer (stage3.py partition_grads), which DeepSpeed runs on the reduction stream
    (0.13% of the step here). On the compute stream it made backward wait for every bucket's
    reduce-scatter: 18.20 s instead of 14.74 s on the preset (3.5 s of exposed communication instead
    of 0.05 s)."""
    base = load_scenario("preset:zero3-gpt3-175b-a100")
    alone = simulate(base, uncertainty_samples=0)
    offloaded = simulate(
        base.with_changes(**{"training.offload": {"mode": "interleaved"}}), uncertainty_samples=0
    )
    placement = offloaded.extra["offload"]["placement"]
    assert placement.get("gpu_resident", 0) == offloaded.extra["offload"]["subgroups"], placement
    assert alone.iteration_time <= offloaded.iteration_time
    assert offloaded.iteration_time == pytest.approx(alone.iteration_time, rel=3e-3)
    assert offloaded.breakdown["exposed_communication"] < 2 * alone.breakdown["exposed_communication"]


def test_offload_plan_takes_set_and_samples_and_says_what_fits_without_offload(runner):
    """`offload plan` had no --set and no band, and its text said only "does not fit in GPU memory"
    while the largest micro-batch that fits was in --json alone: with --set the H200 at micro-batch 8
    does not fit without offload, and the text names the largest that does (checked by simulating it
    and the next one up); each mode carries its P10-P90 band."""
    import json

    from clustersim.cli import app

    args = ["offload", "plan", "preset:offload-llama7b-h100", "--set", "cluster.gpu=H200"]
    args += ["--set", "workload.micro_batch=8", "--samples", "4"]
    d = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    none = d["modes"]["none"]
    assert none["fits"] is False and none["largest_micro_batch"] == 4
    plain = llama("none", **{"cluster.gpu": "H200", "training.offload.gradient_copy": None})
    assert simulate(plain.with_changes(**{"workload.micro_batch": 4})).iteration_time > 0
    with pytest.raises(InputError, match="does not fit in GPU memory"):
        simulate(plain.with_changes(**{"workload.micro_batch": 5}))
    for mode in ("zero", "interleaved"):
        m = d["modes"][mode]
        assert m["iteration_time_p10_s"] < m["iteration_time_s"] < m["iteration_time_p90_s"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "without offload the largest micro-batch that fits is 4 (workload.micro_batch; at 8: " in r.stdout
    lo, hi = (d["modes"]["interleaved"][k] * 1e3 for k in ("iteration_time_p10_s", "iteration_time_p90_s"))
    assert f"{lo:,.2f}–{hi:,.2f}" in r.stdout and "P10–P90: 4 draws" in r.stdout
    bad = runner.invoke(app, ["offload", "plan", "preset:offload-llama7b-h100", "--set", "cluster.gpu=H9"])
    assert bad.exit_code == 2 and "--set" in bad.output and "cluster.gpu" in bad.output


def test_offload_plan_calls_a_ratio_that_rounds_to_one_the_same_speed():
    """'no offload is 1.00x faster than interleaved' said nothing: within 0.5% the two are the same speed."""
    from clustersim.commands.offload import _faster

    assert _faster("no offload", "interleaved", 1.004) == (
        "no offload runs at the same speed as interleaved (within 0.5%)"
    )
    assert _faster("no offload", "interleaved", 1.0) == _faster("no offload", "interleaved", 0.996)
    assert _faster("interleaved", "ZeRO-Offload", 1.17) == "interleaved is 1.17x faster than ZeRO-Offload"
    assert _faster("a", "b", 1.006) == "a is 1.01x faster than b"


def test_interleaved_resident_subgroups_leave_the_thin_headroom_free():
    """The resident optimizer state stops where THIN_HEADROOM of the GPU is left (CUDA context,
    workspaces, fragmentation); it used to fill 79.91 of 80 GiB and tell a micro-batch-1 run to shrink
    its micro-batch."""
    from clustersim.simulator.memory import THIN_HEADROOM

    for changes in ({}, {"cluster.gpu": "H200"}, {"cluster.gpu": "H200", "workload.micro_batch": 8}):
        r = simulate(llama(**changes))
        spare = r.memory["capacity"] - r.memory["total"]
        assert spare >= THIN_HEADROOM * r.memory["capacity"], changes
        assert not any("to spare" in n for n in r.notes), changes
    dos = simulate(load_scenario("preset:offload-dos-7b-h100"))
    assert dos.memory["capacity"] - dos.memory["total"] >= THIN_HEADROOM * dos.memory["capacity"]


def test_the_thin_headroom_remedy_names_a_key_that_frees_memory():
    """A micro-batch of 1 cannot shrink: the note names activation checkpointing instead; a pinned
    GPU placement is told of the interleaved one that leaves the headroom."""
    from clustersim.simulator.memory import thin_headroom_remedy

    assert "workload.micro_batch" in thin_headroom_remedy(build_context(llama(**{"workload.micro_batch": 4})))
    one = thin_headroom_remedy(build_context(llama()))
    assert "workload.activation_checkpointing" in one and "micro_batch leaves" not in one
    pinned = thin_headroom_remedy(build_context(llama(**{"training.offload.placement": "gpu"})))
    assert "training.offload.placement: auto" in pinned


def test_offload_plan_puts_the_blocking_copys_host_time_in_backward(runner):
    """The blocking gradient copy stalls backward on the host (pageable copies, page faults): `offload
    plan` put that under "update (exposed)" (8,066.57 ms, backward 273.87 ms) where DeepSpeed's timers
    and docs/offload.md's phase table have backward 3.62 s and step 3.95 s. Its columns are now the
    phases, which add up to the iteration with forward and the rest."""
    import json

    from clustersim.cli import app

    args = ["offload", "plan", "preset:offload-dos-7b-h100", "--samples", "0"]
    d = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    zero = d["modes"]["zero"]
    ph = zero["phases_s"]
    assert ph["backward"] > 3.0 > zero["breakdown_s"]["backward"] and ph["step"] < 4.5
    assert sum(ph.values()) == pytest.approx(zero["iteration_time_s"], rel=1e-9)
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "step ms" in r.output and "update (exposed)" not in r.output
    assert f"{ph['backward'] * 1e3:,.2f}" in r.output and f"{ph['step'] * 1e3:,.2f}" in r.output


def test_offload_plan_marks_the_plan_it_keeps_and_how_far_the_others_are():
    """The performance model's own plan can lose to the all-GPU placement (by 25% on DOS-7B's PCIe 4.0
    host); the table says which plan is kept and by how much the others are slower."""
    from typer.testing import CliRunner

    from clustersim.cli import app

    args = ["offload", "plan", "preset:offload-dos-7b-h100", "--samples", "0"]
    r = CliRunner().invoke(app, args)
    d = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    cands, kept = d["placement"]["candidates"], d["placement"]["chosen_by"]
    assert cands[kept] == min(cands.values())
    assert f"{kept} (kept)" in r.output
    for name, t in cands.items():
        if name != kept:
            assert f"{name} (+{100 * (t / cands[kept] - 1):.1f}%)" in r.output


def test_offload_plan_says_when_a_mode_fits_with_little_to_spare(monkeypatch):
    """`offload plan` printed 79.91 of 80 GiB without the note `run` gives such a fit; it now prints
    `run`'s note per mode (here with the threshold raised so that the interleaved fit, which keeps 5%
    free, counts as close)."""
    from typer.testing import CliRunner

    from clustersim.cli import app
    from clustersim.simulator import memory

    args = ["offload", "plan", "preset:offload-llama7b-h100", "--samples", "0"]
    assert "to spare" not in CliRunner().invoke(app, args).output
    monkeypatch.setattr(memory, "THIN_HEADROOM", 0.10)
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    note = next(x for x in r.output.splitlines() if x.startswith("note (interleaved): GPU memory:"))
    assert "to spare" in note and "workload.activation_checkpointing" in note


@pytest.mark.parametrize("optimizer", ["adam", "sgdm"])
def test_the_offload_summary_counts_the_parameters_every_step_kind_updates_on_the_cpu(optimizer):
    """The summary's subgroups on the CPU are the parameters each kind of step prices a CPU update for
    (0/1 Adam's variance steps once placed a ZeRO partition that its whole-replica local steps then
    priced at the full model: the line said 1/64 of the model, the step took the whole model's time)."""
    from clustersim.simulator.offload import PlacementKind
    from clustersim.simulator.strategies import registry

    overrides = {"cluster.nodes": 2, "training.optimizer": optimizer, "training.offload.mode": "zero"}
    s = make_scenario(**overrides)
    ctx = build_context(s)
    steps = registry.create(ctx).steps()
    placement = ctx.offload_placement
    on_cpu = sum(n for n, k in zip(placement.subgroup_sizes(), placement.kinds) if k == PlacementKind.CPU)
    for step in steps:
        priced = sum(o.meta["params"] for o in step.program.ops if o.name.startswith("CPU update"))
        assert priced == pytest.approx(on_cpu, rel=1e-9), step.label
    summary = simulate(s).extra["offload"]
    assert summary["placement"][PlacementKind.CPU] == summary["subgroups"]
    assert (summary["subgroups"] - 1) * summary["subgroup_params"] < on_cpu
    assert on_cpu <= summary["subgroups"] * summary["subgroup_params"] * (1 + 1e-12)


def _a100_llama7b(optimizer: str, **kw):
    """The trial's LLaMA-7B on 8 nodes of 8 x A100-80GB, 100 GbE, micro-batch 1 at 2048 tokens."""
    return make_scenario(
        **{
            "cluster.nodes": 8,
            "cluster.gpus_per_node": 8,
            "cluster.gpu": "A100-80GB",
            "cluster.nic.kind": "ethernet_tcp",
            "cluster.nic.line_rate_gbps": 100,
            "workload.model": "LLaMA-7B",
            "workload.micro_batch": 1,
            "workload.seq_len": 2048,
            "workload.precision": "bf16",
            "training.optimizer": optimizer,
            "training.offload.mode": "zero",
            **kw,
        }
    )


@pytest.mark.parametrize("optimizer", ["onebit-adam", "zero-one-adam", "binsgdm", "diloco"])
@pytest.mark.parametrize("mode", ["zero", "interleaved"])
def test_an_optimizer_no_framework_offloads_is_refused_with_offload(optimizer, mode):
    """DeepSpeed offloads an optimizer only under ZeRO (zero_optimization.offload_optimizer), and its
    engine asserts 1-bit Adam and 0/1 Adam are "not compatible with ZeRO"; BinSGDM compresses its
    momentum on the GPU and DiLoCo's workers are modelled as GPU replicas: each is one line naming
    training.offload.mode, never a simulated step no framework runs."""
    with pytest.raises(InputError) as err:
        make_scenario(**{"cluster.nodes": 2, "training.optimizer": optimizer, "training.offload.mode": mode})
    assert err.value.key == "training.offload.mode"
    assert f"{optimizer} cannot run with its optimizer offloaded" in err.value.message


def test_onebit_adam_with_offload_is_one_line_and_exit_2_from_the_cli(runner):
    """The refusal reaches the user as run's one line, exit code 2, no simulated step."""
    from clustersim.cli import app

    res = runner.invoke(
        app,
        ["run", "preset:offload-llama7b-h100", "--samples", "0", "--set", "training.optimizer=onebit-adam"],
    )
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1
    assert "onebit-adam cannot run with its optimizer offloaded" in res.output


def test_only_the_optimizers_the_rules_let_offload_define_an_offloaded_update():
    """The offload programs (ddp.zero_offload_program, zero.py's ZeRO-3 path) ask the strategy for its
    offload_spec; sharding_rules refuses every other optimizer with offload before a strategy is built.
    The rules are the scenario's layer and cannot read the strategies, so the two are held together
    here: an optimizer the rules let through has an offloaded update, one they refuse has none (no
    dead offload code), and the optimizers refused with offload are the ones refused under ZeRO
    (runs_sharded, which memory.check_fits' advice reads for both)."""
    from clustersim import sharding_rules
    from clustersim.simulator.strategies import registry

    for name in registry.names():
        cls = registry.get(name)
        assert hasattr(cls, "offload_spec") == (name not in sharding_rules._NOT_OFFLOADED), name
    assert set(sharding_rules._NOT_OFFLOADED) == set(sharding_rules._NOT_WITH_ZERO)


@pytest.mark.parametrize(
    "overrides,key,why",
    [
        # the 16-bit weights alone exceed 80 GB: the model
        ({"workload.model": "GPT-3-175B"}, "workload.model", "optimizer state alone need 326.38 GiB"),
        # the activations of 64 samples do not fit beside them: the micro-batch, with the largest that fits
        ({"workload.micro_batch": 64}, "workload.micro_batch", "a micro_batch of at most 7 fits"),
    ],
)
def test_an_offloaded_rank_that_does_not_fit_names_the_key_by_check_fits_rule(overrides, key, why):
    """The offload planner's refusal names its key by memory.check_fits' rule (it said cluster.gpu
    whenever a smaller micro-batch would not do, and never said why)."""
    with pytest.raises(InputError, match="even with the optimizer offloaded") as err:
        simulate(_a100_llama7b("adam", **overrides))
    assert err.value.key == key and why in err.value.message


def test_zero_offload_reduces_in_deepspeeds_buckets_not_ddps():
    """ZeRO-Offload is DeepSpeed's ZeRO-2 with the optimizer on the host (stage_1_and_2.py): backward
    fills reduce_bucket_size elements (5e8 by default, training.sharding.reduce_bucket_mb) before each
    reduce-scatter, with no 1 MiB first bucket; it reduced in DDP's 25 MiB buckets, 73 of them on GPT-2
    XL where DeepSpeed runs 3, as the same model's ZeRO-2 does here."""
    s = make_scenario(
        **{
            "cluster.nodes": 2,
            "workload.model": "GPT-2-1.5B",
            "workload.seq_len": 1024,
            "workload.micro_batch": 1,
            "training.offload.mode": "zero",
        }
    )
    offloaded = simulate(s, uncertainty_samples=0)
    stage2 = simulate(s.with_changes(**{"training.offload.mode": "none", "training.sharding.stage": 2}))
    sizes = [b["bytes"] for b in offloaded.buckets]
    assert sizes == [b["bytes"] for b in stage2.buckets]
    assert len(sizes) == 3 and max(sizes) >= 5e8 * 2  # 16-bit gradients
    smaller = simulate(s.with_changes(**{"training.sharding.reduce_bucket_mb": 100}), uncertainty_samples=0)
    assert len(smaller.buckets) > 20


def _zero_offload_memory(**kw):
    """LLaMA-7B on 2 nodes of one H100, ZeRO-Offload with every update on the CPU: the rank's memory."""
    s = llama("zero", **{"cluster.nodes": 2, **kw})
    return simulate(s, uncertainty_samples=0).memory, build_context(s)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_zero_offload_holds_deepspeeds_gradient_buffers_not_a_gradient_partition(stage):
    """DeepSpeed's stage_1_and_2.py with the optimizer offloaded: no GPU gradient partition
    (copy_grads_in_partition returns before allocating grads_in_partition; the rank's part goes to the
    host and param.grad = None), two ipg buffers of the whole reduce_bucket_size in 16 bits (the
    tutorial's overlap_comm: true; buf_1 only with it), and temp_grad_buffer_for_gpu_offload, the
    largest parameter's elements in 16 bits. It counted the gradient partition (a whole replica's at
    stages 0 and 1: 12.55 GiB) and at most one bucket."""
    mem, ctx = _zero_offload_memory(**{"training.sharding.stage": stage})
    largest = max(n for layer in ctx.workload.layers for n in layer.param_tensors)
    assert largest == 32000 * 4096  # LLaMA-7B's embedding (and untied head)
    assert mem["gradients"] == 0.0
    assert mem["reduce_bucket"] == pytest.approx(2 * 5e8 * 2)
    assert mem["offload_gradient_buffer"] == pytest.approx(largest * 2)
    # the buckets are freed at the end of backward; the temp buffer is kept
    assert mem["peak_forward_backward"] - mem["peak_update"] == pytest.approx(
        mem["activations"] + mem["reduce_bucket"]
    )


def test_zero_offload_without_overlap_comm_holds_one_bucket_and_stage_1_every_gradient():
    """overlap_comm: false allocates buf_0 only; stage 1 then has no backward hooks (created only with
    partition_gradients or overlap_comm), so every parameter's gradient stays on the GPU until the
    reduction after backward; stage 2 still moves each into the bucket as backward produces it."""
    mem2, ctx = _zero_offload_memory(**{"training.sharding": {"stage": 2, "overlap_comm": False}})
    assert mem2["reduce_bucket"] == pytest.approx(5e8 * 2) and mem2["gradients"] == 0.0
    mem1, _ = _zero_offload_memory(**{"training.sharding": {"stage": 1, "overlap_comm": False}})
    assert mem1["gradients"] == pytest.approx(ctx.params * 2)


def test_the_offload_planner_fills_the_memory_zero_offload_leaves():
    """The interleaved planner sees the same rank: what it may fill is the capacity less the same
    parameters, buffers and activations (offload.memory_budget and memory.gpu_memory agree)."""
    from clustersim.simulator.offload import memory_budget

    s = llama()
    mem = simulate(s, uncertainty_samples=0).memory
    ctx = build_context(s)
    budget = memory_budget(ctx, ctx.params)
    placed = mem["optimizer_state_resident"] + mem["offload_staging"]
    assert budget["peak_without_state"] == pytest.approx(
        mem["peak_forward_backward"] - mem["optimizer_state_resident"]
    )
    assert budget["update_without_state"] == pytest.approx(mem["peak_update"] - placed)
