"""`plan` searches parallel layouts (layout_search.py): data parallelism when it fits, else the lowest
ZeRO stage and, per tensor-parallel size, the fewest pipeline stages that fit."""

import json

import yaml

from clustersim.cli import app
from clustersim.layout_search import candidate_layouts, fits, layout_label
from clustersim.scenario import validate_scenario
from clustersim.sweeps.spec import resolve_row

GB = 1024


def cluster(model: str, gpus: int, optimizer: str = "adam"):
    base = validate_scenario(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "A100-80GB", "nic": {"count": 8}},
            "workload": {"model": model, "micro_batch": 8, "precision": "bf16"},
            "training": {"optimizer": "adam"},
        }
    )
    return resolve_row(base, {"gpus": gpus, "optimizer": optimizer}, 10_000, GB)


def test_data_parallelism_alone_when_it_fits():
    assert candidate_layouts(cluster("BERT-Large", 64), GB) == [{}]


def test_gpt3_175b_gets_zero_and_megatron_layouts_each_the_smallest_that_fits():
    s = cluster("GPT-3-175B", 64)
    assert not fits(s, GB)
    layouts = candidate_layouts(s, GB)
    zero = [x for x in layouts if "training.sharding.stage" in x]
    megatron = [x for x in layouts if "training.parallelism.tensor" in x]
    assert len(zero) == 1 and megatron
    for layout in layouts:
        assert fits(s.with_changes(**layout), GB)
    # minimal: one stage fewer (a divisor of the 96 layers below p that still divides the GPUs) does not fit
    for layout in megatron:
        t, p = layout["training.parallelism.tensor"], layout["training.parallelism.pipeline"]
        smaller = [d for d in range(1, p) if 96 % d == 0 and 64 % (t * d) == 0 and t * d > 1]
        for d in smaller:
            for recompute in ("none", "full"):
                changes = {
                    "training.parallelism.tensor": t,
                    "training.parallelism.pipeline": d,
                    "training.parallelism.recompute": recompute,
                }
                assert not fits(s.with_changes(**changes), GB), (t, d, recompute)
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
    from clustersim.planning import with_layouts
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
