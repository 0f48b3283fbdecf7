"""`plan` searches parallel layouts (layout_search.py): data parallelism when it fits, else the lowest
ZeRO stage and, per tensor-parallel size, the fewest pipeline stages that fit (sequence parallel for
t > 1), with the cheapest recomputation that fits (none, selective, full) and deeper ones with less of it,
and interleaved where its bubble saving can pay."""

import json

import yaml

from clustersim import catalog
from clustersim.cli import app
from clustersim.errors import InputError
from clustersim.planner.layout_search import (
    RECOMPUTES,
    _fits_with,
    _megatron_changes,
    candidate_layouts,
    fits,
    layout_label,
)
from clustersim.scenario import validate_scenario
from clustersim.sweeps.spec import resolve_row

GB = 1024


def base_scenario(model: str, gpu: str = "A100-80GB"):
    """The papers' setting these layouts are checked against (Narayanan et al. 2021, Korthikanti et al.
    2022): attention scores written and kept for backward, the memory sequence parallelism splits."""
    return validate_scenario(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": gpu, "nic": {"count": 8}},
            "workload": {"model": model, "micro_batch": 8, "precision": "bf16", "attention": "unfused"},
            "training": {"optimizer": "adam"},
        }
    )


def cluster(model: str, gpus: int, optimizer: str = "adam", gpu: str = "A100-80GB"):
    return resolve_row(base_scenario(model, gpu), {"gpus": gpus, "optimizer": optimizer}, 10_000, GB)


def test_data_parallelism_alone_when_it_fits():
    assert candidate_layouts(cluster("BERT-Large", 64), GB) == [{}]


def test_a_lower_zero_stage_that_fits_is_tried_beside_stage_3():
    """LLaMA-7B on 16 H100s fits under ZeRO-1; stage 3 is tried too, since DeepSpeed overlaps its
    communication with compute (stages 1 and 2 reduce after backward), and here it is the faster one."""
    from clustersim.sweeps.run import simulate_row

    s = cluster("LLaMA-7B", 16, gpu="H100-SXM")
    zero = [x for x in candidate_layouts(s, GB) if "training.sharding.stage" in x]
    assert [x["training.sharding.stage"] for x in zero] == [1, 3]
    checkpointing = "workload.activation_checkpointing"
    assert zero[0].get(checkpointing) == zero[1].get(checkpointing)
    base = base_scenario("LLaMA-7B", "H100-SXM").model_dump(mode="json")
    one, three = (
        simulate_row(base, {"gpus": 16, "optimizer": "adam", **layout}, 10_000, None, GB) for layout in zero
    )
    assert one["status"] == three["status"] == "ok", (one["error"], three["error"])
    assert three["time_to_train_s"] < one["time_to_train_s"]


def test_gpt3_175b_gets_zero_and_megatron_layouts_each_the_smallest_that_fits():
    s = cluster("GPT-3-175B", 64)
    assert not fits(s, GB)
    layouts = candidate_layouts(s, GB)
    zero = [x for x in layouts if "training.sharding.stage" in x]
    megatron = [x for x in layouts if "training.parallelism.tensor" in x]
    assert len(zero) == 1 and megatron
    for layout in layouts:
        assert _fits_with(s, layout, GB)
    # minimal: one stage fewer (a divisor of the 96 layers below p that still divides the GPUs) does not
    # fit, or not without recomputation for a layout without it
    for layout in (x for x in megatron if "training.parallelism.schedule" not in x):
        t, p = layout["training.parallelism.tensor"], layout["training.parallelism.pipeline"]
        smaller = [d for d in range(1, p) if 96 % d == 0 and 64 % (t * d) == 0 and t * d > 1]
        # no fewer stages fit with this recomputation or a cheaper one (none < selective < full)
        recomputes = RECOMPUTES[: RECOMPUTES.index(layout["training.parallelism.recompute"]) + 1]
        for d in smaller:
            for recompute in recomputes:
                assert not _fits_with(s, _megatron_changes(t, d, recompute), GB), (t, d, recompute)
    stages = [x["training.sharding.stage"] for x in zero]
    for lower in range(1, stages[0]):
        assert not fits(s.with_changes(**{"training.sharding.stage": lower}), GB)


def test_compressed_optimizers_get_no_layout_when_data_parallelism_does_not_fit():
    """DeepSpeed refuses 1-bit Adam under ZeRO and none of them runs under Megatron here."""
    assert candidate_layouts(cluster("GPT-3-175B", 64, "onebit-adam"), GB) == []


def test_layout_labels():
    def scen(**training):
        return {"cluster": {"nodes": 8, "gpus_per_node": 8}, "workload": {}, "training": training}

    assert layout_label(scen()) == "DP"
    assert layout_label(scen(sharding={"stage": 3})) == "ZeRO-3"
    assert layout_label(scen(parallelism={"tensor": 8, "pipeline": 4, "recompute": "full"})) == (
        "TP8·PP4·DP2, recompute"
    )
    assert layout_label(scen(sharding={"framework": "fsdp", "fsdp_strategy": "hybrid"})) == "FSDP hybrid"
    sp = {"tensor": 2, "pipeline": 16, "sequence_parallel": True, "distributed_optimizer": True}
    assert layout_label(scen(parallelism={**sp, "schedule": "interleaved", "virtual_stages": 3})) == (
        "TP2·PP16·DP2, interleaved v3, SP, dist. optimizer"
    )
    # sequence parallelism means nothing without tensor parallelism: not shown
    assert layout_label(scen(parallelism={"pipeline": 8, "sequence_parallel": True})) == "TP1·PP8·DP8"


def test_a_row_with_a_layout_resolves_after_its_gpu_count():
    """tensor x pipeline is checked against the row's GPU count, not the base's one node."""
    s = cluster("GPT-3-175B", 64).with_changes(**{"cluster.nodes": 1})
    base = s.with_changes(**{"training.optimizer": "adam"})
    row = {"gpus": 64, "training.parallelism.tensor": 8, "training.parallelism.pipeline": 8}
    r = resolve_row(base, row, 10_000, GB)
    assert r.cluster.world_size == 64 and r.training.parallelism.pipeline == 8
    # the global batch is split over the one data-parallel replica: 1,024 micro-batches of 1
    assert r.workload.micro_batch * r.workload.gradient_accumulation == GB


def test_plan_trains_gpt3_175b_with_a_layout_and_says_which(runner, tmp_path):
    cand = tmp_path / "cand.yaml"
    cand.write_text(
        yaml.safe_dump(
            {
                "base": {
                    "cluster": {
                        "nodes": 1,
                        "gpus_per_node": 8,
                        "gpu": "A100-80GB",
                        "nic": {"kind": "infiniband", "count": 8, "line_rate_gbps": 200},
                    },
                    "workload": {"model": "BERT-Large", "micro_batch": 8, "precision": "bf16"},
                },
                "vary": {"gpus": [64, 128], "optimizer": ["adam", "onebit-adam"]},
            }
        )
    )
    args = ["plan", "--model", "GPT-3-175B", "--steps", "1000", "--deadline", "60d", "--samples", "0"]
    r = runner.invoke(app, [*args, "--candidates", str(cand), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["chosen"]["optimizer"] == "adam" and d["chosen"]["layout"] != "DP"
    assert d["candidates"] > 4  # the two adam rows became several layouts each
    text = runner.invoke(app, [*args, "--candidates", str(cand)])
    assert text.exit_code == 0 and d["chosen"]["layout"] in text.output


def test_candidates_that_search_into_the_same_layout_are_simulated_once():
    """A candidates file that already varies tensor x pipeline: a row that does not fit is searched
    into layouts another row already names (TP4·PP16 with recomputation); each is simulated once, so
    the plan never lists the same option twice."""
    from clustersim.planner.planning import with_layouts
    from clustersim.scenario import load_scenario

    base = load_scenario("preset:dgx-h100-gpt3-175b-3d")
    rows = [
        {"gpus": 256, "training.parallelism.tensor": t, "training.parallelism.pipeline": p}
        for t in (4, 8)
        for p in (8, 16)
    ]
    out = with_layouts(base, rows, 1000, 256)
    resolved = [resolve_row(base, r, 1000, 256).model_dump_json() for r in out]
    assert len(resolved) == len(set(resolved))


def _simulate(model: str, gpus: int, layout: dict, gpu: str = "A100-80GB", gb: int = GB) -> dict:
    from clustersim.sweeps.run import simulate_row

    base = base_scenario(model, gpu).model_dump(mode="json")
    rec = simulate_row(base, {"gpus": gpus, **layout}, 10_000, None, gb)
    assert rec["status"] == "ok", rec["error"]
    return rec


def test_only_sequence_parallelism_lets_tp8_pp8_run_without_recomputation_and_it_is_faster():
    """Korthikanti et al. 2022: sequence parallelism splits the LayerNorm and dropout activations by t.
    GPT-3 175B on 64 GPUs at TP8·PP8 fits without recomputation only with it; the search proposes it,
    and the simulation finds it faster than the fewest stages at t = 8, which need recomputation."""
    s = cluster("GPT-3-175B", 64)
    with_sp = _megatron_changes(8, 8, "none")
    layouts = candidate_layouts(s, GB)
    assert with_sp in layouts and with_sp["training.parallelism.sequence_parallel"]
    assert not _fits_with(s, {**with_sp, "training.parallelism.sequence_parallel": False}, GB)
    fewest = next(x for x in layouts if x.get("training.parallelism.tensor") == 8)
    assert fewest["training.parallelism.pipeline"] < 8 and fewest["training.parallelism.recompute"] == "full"
    for layout in layouts:  # on for every t > 1, never for t = 1 (nothing to split)
        if "training.parallelism.tensor" in layout:
            t = layout["training.parallelism.tensor"]
            assert layout["training.parallelism.sequence_parallel"] == (t > 1)
    fast, slow = _simulate("GPT-3-175B", 64, with_sp), _simulate("GPT-3-175B", 64, fewest)
    assert fast["iteration_time_s"] < slow["iteration_time_s"]


def _memory(s, changes: dict) -> dict:
    """One rank's memory (simulator/memory.py) under a layout at micro-batch 1, as the search checks it."""
    from clustersim.planner.layout_search import _resolved
    from clustersim.simulator.context import build_context
    from clustersim.simulator.memory import gpu_memory
    from clustersim.simulator.strategies import registry

    ctx = build_context(_resolved(s, changes, GB, micro_batch=1))
    return gpu_memory(ctx, registry.create(ctx))


def test_selective_recomputation_is_chosen_where_it_fits_and_no_recomputation_does_not():
    """Llama 2 70B on 64 A100-80GB at TP8 and one stage: the attention scores (5as/(ht) of a block's
    activations, Korthikanti et al. 2022 Table 2) are what keeps it from fitting without recomputation;
    selective recomputation drops them and fits, so the search proposes it and not full recomputation,
    which re-runs every block's forward, at that t. The simulation finds selective the faster."""
    s = cluster("LLaMA-2-70B", 64)
    layouts = [x for x in candidate_layouts(s, GB) if x.get("training.parallelism.tensor") == 8]
    mem = {r: _memory(s, _megatron_changes(8, 1, r)) for r in RECOMPUTES}
    capacity = mem["none"]["capacity"]
    # the memory model's own numbers: each recomputation keeps less, and only none is over the GPU
    assert mem["full"]["total"] < mem["selective"]["total"] <= capacity < mem["none"]["total"]
    selective = _megatron_changes(8, 1, "selective")
    assert layouts[0] == selective
    assert not [x for x in layouts if x["training.parallelism.recompute"] == "full"]
    # deeper pipelines are tried only for less recomputation: the next is the fewest stages without it
    assert [
        x["training.parallelism.recompute"] for x in layouts if "training.parallelism.schedule" not in x
    ] == [
        "selective",
        "none",
    ]
    fast = _simulate("LLaMA-2-70B", 64, selective)
    slow = _simulate("LLaMA-2-70B", 64, _megatron_changes(8, 1, "full"))
    assert fast["iteration_time_s"] < slow["iteration_time_s"]


def test_no_recomputation_stays_chosen_where_it_fits():
    """GPT-3 175B on 64 A100-80GB at TP8: PP8 fits without recomputation, so neither selective nor full
    is proposed there, nor deeper; shallower pipelines recompute (full at PP2, selective at PP4)."""
    s = cluster("GPT-3-175B", 64)
    layouts = [
        x
        for x in candidate_layouts(s, GB)
        if x.get("training.parallelism.tensor") == 8 and "training.parallelism.schedule" not in x
    ]
    assert _fits_with(s, _megatron_changes(8, 8, "none"), GB)
    assert layouts[-1] == _megatron_changes(8, 8, "none")
    assert [x["training.parallelism.pipeline"] for x in layouts] == [2, 4, 8]
    assert [x["training.parallelism.recompute"] for x in layouts] == ["full", "selective", "none"]


def test_selective_recomputation_is_not_tried_under_fused_attention():
    """A fused attention kernel keeps no s x s scores, which is all selective recomputation drops: the
    memory model gives it the same memory as none, so it never fits where none does not, and the
    search does not propose it (plan's default attention is fused)."""
    s = cluster("LLaMA-2-70B", 64).with_changes(**{"workload.attention": "fused"})
    for t, p in ((8, 1), (4, 2), (2, 8)):
        none, selective = (_memory(s, _megatron_changes(t, p, r))["total"] for r in ("none", "selective"))
        assert selective == none
    layouts = candidate_layouts(s, GB)
    assert layouts and not [x for x in layouts if x.get("training.parallelism.recompute") == "selective"]


def test_interleaving_is_proposed_where_the_bubble_is_large_and_plan_picks_it(runner, tmp_path):
    """GPT-3 175B on 128 A100-40GB at a global batch of 128: at TP8 8 stages with selective
    recomputation and the distributed optimizer fit (Megatron's gradient buckets are views of its one
    gradient buffer), and with two replicas 1F1B leaves a bubble of 7 micro-batch slots in each
    pipeline's 64 samples; interleaving cuts it (Narayanan et al. SC'21), so the search proposes it, it
    simulates faster than 1F1B by more than the plan's 3%, and plan chooses an interleaved layout."""
    gb, gpu = 128, "A100-40GB"
    base = base_scenario("GPT-3-175B", gpu)
    layouts = candidate_layouts(resolve_row(base, {"gpus": 128}, 10_000), gb)
    one_f_one_b = _megatron_changes(8, 8, "selective")
    assert one_f_one_b in layouts
    interleaved = [
        x for x in layouts if x.get("training.parallelism.schedule") and x.items() > one_f_one_b.items()
    ]
    assert interleaved
    slow = _simulate("GPT-3-175B", 128, one_f_one_b, gpu, gb)
    fast = min(_simulate("GPT-3-175B", 128, x, gpu, gb)["iteration_time_s"] for x in interleaved)
    assert fast < slow["iteration_time_s"] * (1 - 0.03)
    cand = tmp_path / "cand.yaml"
    cand.write_text(
        yaml.safe_dump({"base": base.model_dump(mode="json", exclude_none=True), "vary": {"gpus": [128]}})
    )
    args = ["plan", "--model", "GPT-3-175B", "--steps", "1000", "--deadline", "60d", "--samples", "0"]
    r = runner.invoke(app, [*args, "--global-batch", str(gb), "--candidates", str(cand), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    chosen = out["chosen"]
    assert ", interleaved v" in chosen["layout"], chosen["layout"]
    # Megatron layouts are framework code: every candidate is compared on fused pointwise kernels
    assert any("framework code" in note for note in out["recipe_notes"])


def test_impossible_virtual_stages_are_never_proposed():
    """Every interleaved layout the search proposes is one Megatron-LM accepts on the row plan will run:
    layers split into p x v equal chunks and micro-batches a multiple of p (after the global batch is
    split and the micro-batch fitted); GPT-3's 32 stages of 3 layers can only be cut into v = 3."""
    from clustersim.planner.planning import with_layouts

    for model, gpu in (("GPT-3-175B", "A100-80GB"), ("LLaMA-2-70B", "H100-SXM")):
        base = base_scenario(model, gpu)
        layers = catalog.model(model).layers
        rows = with_layouts(base, [{"gpus": g} for g in (64, 128, 512)], 10_000, GB)
        interleaved = [r for r in rows if r.get("training.parallelism.schedule") == "interleaved"]
        assert interleaved
        for row in interleaved:
            p, v = row["training.parallelism.pipeline"], row["training.parallelism.virtual_stages"]
            assert p > 1 and v in (2, 3, 4) and layers % (p * v) == 0, row
            resolved = resolve_row(base, row, 10_000, GB)  # raises where Megatron would refuse it
            assert resolved.workload.gradient_accumulation % p == 0
            if model == "GPT-3-175B" and p == 32:
                assert v == 3


def test_no_interleaving_where_the_bubble_is_small():
    """TP8·PP8 without recomputation on 64 GPUs runs 1,024 micro-batches of 1: a bubble of 7/1024 of the
    step, which no v can turn into the 3% the plan asks of a more complex option."""
    layouts = candidate_layouts(cluster("GPT-3-175B", 64), GB)
    assert _megatron_changes(8, 8, "none") in layouts
    assert not [
        x
        for x in layouts
        if x.get("training.parallelism.tensor") == 8
        and "training.parallelism.schedule" in x
        and x["training.parallelism.pipeline"] == 8
    ]


def test_interleaved_rows_that_cannot_be_the_fastest_are_not_simulated():
    """planning.simulate_rows skips an interleaved row whose 1F1B twin computes (busy, no idle time)
    longer than the fastest layout on its cluster already takes; the fastest found is the one that
    simulating every row finds."""
    from clustersim.planner.planning import simulate_rows, with_layouts
    from clustersim.sweeps.run import simulate_row

    base, gb = base_scenario("LLaMA-2-70B", "A100-80GB"), 256
    base_json = base.model_dump(mode="json")
    rows = with_layouts(base, [{"gpus": 64}], 10_000, gb)
    records, skipped = simulate_rows(base_json, rows, 10_000, gb)
    assert skipped > 0 and len(records) + skipped == len(rows)
    every = [simulate_row(base_json, r, 10_000, None, gb) for r in rows]
    best = min(r["iteration_time_s"] for r in every if r["status"] == "ok")
    assert min(r["iteration_time_s"] for r in records if r["status"] == "ok") == best


def test_a_sweep_over_the_schedule_runs_interleaved_rows_and_the_report_names_them(tmp_path):
    """A sweep row that sets an interleaved schedule is checked against the micro-batches the global
    batch gives it (not the base's one micro-batch, which no pipeline of 4 divides); the HTML report
    names each row's schedule and sequence parallelism (layout_label)."""
    from clustersim.report.build import write_report
    from clustersim.sweeps.run import run_sweep
    from clustersim.sweeps.spec import load_sweep

    sweep = {
        "name": "schedules",
        "base": {
            "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM"},
            "workload": {"model": "Megatron-GPT-1.7B", "micro_batch": 1, "precision": "bf16"},
            "training": {"parallelism": {"tensor": 2, "pipeline": 4, "sequence_parallel": True}},
        },
        "vary": {
            "training.parallelism.schedule": ["1f1b", "interleaved"],
            "training.parallelism.virtual_stages": [1, 2],
        },
        "steps": 1000,
        "global_batch": 32,
        "samples": 0,
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(sweep))
    run_sweep(load_sweep(tmp_path / "s.yaml"), tmp_path / "out")
    ok = {
        (r["training.parallelism.schedule"], r["training.parallelism.virtual_stages"])
        for r in _ok_rows(tmp_path)
    }
    assert ok == {("1f1b", "1"), ("interleaved", "2")}  # the other two break Megatron's rules
    write_report(tmp_path / "out", tmp_path / "r.html")
    assert "TP2·PP4·DP1, interleaved v2, SP" in (tmp_path / "r.html").read_text()


def _ok_rows(tmp_path):
    import csv

    with open(tmp_path / "out" / "results.csv") as f:
        return [r for r in csv.DictReader(f) if r["status"] == "ok"]


def test_a_row_reshaping_an_interleaved_base_is_checked_as_the_row_it_becomes():
    """A base with 2 stages of 16 chunks and a row of 4 stages of 2 chunks (96 layers split into 8):
    the row's pipeline is not checked against the base's 16 chunks (64 would not divide 96), nor its
    schedule against the base's micro-batches; what the row becomes is (sweeps.spec.with_layout)."""
    base = validate_scenario(
        {
            "cluster": {"nodes": 4, "gpus_per_node": 8, "gpu": "H100-SXM"},
            "workload": {"model": "GPT-3-175B", "micro_batch": 1, "gradient_accumulation": 2},
            "training": {
                "parallelism": {"tensor": 8, "pipeline": 2, "schedule": "interleaved", "virtual_stages": 16}
            },
        }
    )
    row = {"training.parallelism.pipeline": 4, "training.parallelism.virtual_stages": 2}
    s = resolve_row(base, row, 100, 64)
    par = s.training.parallelism
    assert (par.pipeline, par.schedule, par.virtual_stages, s.workload.gradient_accumulation) == (
        4,
        "interleaved",
        2,
        64,
    )
    bad = {**row, "training.parallelism.virtual_stages": 5}  # 96 layers do not split into 4 x 5
    try:
        resolve_row(base, bad, 100, 64)
    except InputError as exc:
        assert exc.key == "training.parallelism.pipeline"
    else:
        raise AssertionError("4 x 5 chunks of 96 layers accepted")


def test_rows_that_differ_only_in_their_network_get_the_layouts_each_would_alone():
    """The search runs once per row's values without its NICs (memory does not depend on the network);
    every row still gets what searching it alone gives, in the rows' order, and a NIC the scenario
    refuses (InfiniBand at a rate it does not come in) is still recorded as it is."""
    from clustersim.planner.planning import with_layouts

    base = base_scenario("GPT-3-13B")
    rows = [
        {"gpus": g, "nic_kind": kind, "nic_gbps": rate, "optimizer": opt}
        for g in (16, 64)
        for kind in ("ethernet_tcp", "infiniband")
        for rate in (100, 150, 400)
        for opt in ("adam", "onebit-adam")
    ]
    together = with_layouts(base, rows, 1000, GB)
    alone = [r for row in rows for r in with_layouts(base, [row], 1000, GB)]
    assert together == alone
    assert len(together) > len(rows)  # adam's rows were searched into several layouts each
    assert {"gpus": 16, "nic_kind": "infiniband", "nic_gbps": 150, "optimizer": "adam"} in together
