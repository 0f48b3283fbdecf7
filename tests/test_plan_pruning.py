"""Plans in seconds: candidates whose lower bounds (planner.bounds) cannot win are not simulated, and
that never changes the answer (the choice, the runners-up, the fastest)."""

import pytest

from clustersim.planner.bounds import step_time_lower_bound
from clustersim.planner.planning import plan
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate


def _answer(result):
    def one(r):
        return r and (r["optimizer"], r["cluster"], round(r["cost"], 2))

    return one(result["chosen"]), [one(r) for r in result["runners_up"]], one(result["fastest"])


@pytest.mark.parametrize(
    "model, steps, deadline_h, budget",
    [
        ("BERT-Large", 100_000, 72.0, None),
        ("GPT-3-1.3B", 50_000, 200.0, 60_000.0),
        ("GPT-3-13B", 20_000, 400.0, None),
    ],
)
def test_pruning_never_changes_the_plan(model, steps, deadline_h, budget):
    args = (model, steps, deadline_h, budget, None, None, None)
    pruned = plan(*args, samples=0, workers=1)
    full = plan(*args, samples=0, workers=1, prune=False)
    assert full["pruned"] == 0 and pruned["simulated"] + pruned["pruned"] >= full["simulated"]
    assert _answer(pruned) == _answer(full)


def test_pruning_on_two_workers_keeps_the_plan_and_prunes_the_same_rows_every_run():
    """Rows go to the workers through a window whose results are taken in the order sent, so what is
    pruned does not depend on which worker finishes first: two runs prune the same count, and the
    answer is the unpruned one."""
    args = ("GPT-3-1.3B", 50_000, 200.0, 60_000.0, None, None, None)
    first = plan(*args, samples=0, workers=2)
    again = plan(*args, samples=0, workers=2)
    full = plan(*args, samples=0, workers=1, prune=False)
    assert first["pruned"] == again["pruned"] > 0 and first["simulated"] == again["simulated"]
    assert _answer(first) == _answer(again) == _answer(full)


@pytest.mark.parametrize(
    "preset, changes",
    [
        ("preset:dgx-h100-gpt3-1.3b", {}),
        ("preset:dgx-h100-gpt3-1.3b", {"training.parallelism.tensor": 2, "training.parallelism.pipeline": 4}),
        ("preset:default", {}),
    ],
)
def test_the_compute_bound_is_below_the_simulated_step(preset, changes):
    s = load_scenario(preset).with_changes(**changes)
    bound = step_time_lower_bound(s)
    assert 0 < bound < simulate(s).iteration_time


def test_tokens_give_the_steps_and_the_choice_its_mfu(runner):
    import json

    from clustersim.cli import app

    res = runner.invoke(
        app,
        [
            "plan",
            "--model",
            "GPT-3-1.3B",
            "--tokens",
            "26e9",
            "--deadline",
            "10d",
            "--samples",
            "0",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["steps"] == -(-26_000_000_000 // (1024 * 2048))  # tokens / (global batch x seq len), up
    chosen = out["chosen"]
    assert 0 < chosen["mfu"] < 1 and chosen["tokens_per_s_per_gpu"] > 0
    both = runner.invoke(
        app, ["plan", "--model", "GPT-3-1.3B", "--tokens", "1e9", "--steps", "5", "--deadline", "1d"]
    )
    assert both.exit_code == 2 and "--tokens" in both.output


def test_compare_rows_carry_mfu_as_run_computes_it():
    from clustersim.api import compare
    from clustersim.api import simulate as api_simulate

    (row,) = compare("preset:dgx-h100-gpt3-1.3b", ["adam"], [16], samples=0, break_even_at=0).rows
    run = api_simulate(load_scenario("preset:dgx-h100-gpt3-1.3b").with_world_size(16))
    assert row.mfu == pytest.approx(run.result.extra["model_flops"]["mfu"])
    assert row.tokens_per_s_per_gpu == pytest.approx(run.result.extra["model_flops"]["tokens_per_s_per_gpu"])


def test_break_evens_bisected_ahead_on_two_workers_are_the_ones_choosing_bisects(monkeypatch):
    """plan bisects the compressed optimizers' break-even line rates ahead, on every core
    (analysis.bisect_break_evens); the answer and its lines are those of one process bisecting each
    crossing as choosing asks for it."""
    from clustersim.report import analysis

    args = ("BERT-Large", 100_000, 72.0, None, None, None, None)
    monkeypatch.setattr(analysis, "_BREAK_EVENS", {})
    ahead = plan(*args, samples=0, workers=2)
    ahead_found = dict(analysis._BREAK_EVENS)
    monkeypatch.setattr(analysis, "_BREAK_EVENS", {})
    monkeypatch.setattr(analysis, "bisect_break_evens", lambda rows, starmap, warmup=None: None)
    one = plan(*args, samples=0, workers=1)
    assert any("line rate per NIC" in line for line in one["text"])  # crossings were bisected
    assert ahead["text"] == one["text"] and _answer(ahead) == _answer(one)
    assert ahead_found == analysis._BREAK_EVENS


def test_plan_under_own_says_it_cannot_price_a_gpu_without_a_server_price(runner, tmp_path):
    """A GPU with no public server price (L4) is not priced with an invented figure under `own`: plan
    stops with a one-line error naming the GPU and the ownership catalog."""
    from clustersim.cli import app

    path = tmp_path / "l4.yaml"
    path.write_text(
        "name: l4\nbase:\n  cluster: {nodes: 1, gpus_per_node: 8, gpu: L4, intra_node: {fabric: pcie}}\n"
        "  workload: {model: BERT-Large, micro_batch: 8, precision: bf16}\n"
        "  training: {optimizer: adam}\nvary:\n  gpus: [8]\n"
    )
    args = ["plan", "--model", "BERT-Large", "--steps", "1000", "--deadline", "30d", "--samples", "0"]
    r = runner.invoke(app, [*args, "--candidates", str(path), "--cost", "own"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "no server price for L4" in r.output and "ownership.yaml" in r.output


def test_bands_shared_out_over_two_workers_are_those_of_one_to_the_last_bit():
    """plan splits only a band's large rows over the workers and sends the largest first; each row's
    draws are put back in their own order, so its band is the one a single process gives, exactly."""

    def bands(result):
        return [
            (r["cluster"], r["ttt_p10_h"], r["ttt_p90_h"]) for r in [result["chosen"], *result["runners_up"]]
        ]

    args = ("GPT-3-13B", 20_000, 400.0, None, None, None, None)
    assert bands(plan(*args, samples=8, workers=2)) == bands(plan(*args, samples=8, workers=1))


def test_an_unset_global_batch_gives_every_gpu_of_the_largest_candidate_a_sample(tmp_path):
    """Nobody set the batch: 1,024 samples, or more where the largest candidate has more GPUs (a multiple
    of 1,024 that splits over all of them), with a note; a batch the user or the file gives is kept."""
    from clustersim.planner.planning import _recipe, candidate_sweep, default_global_batch

    assert default_global_batch(candidate_sweep(None)) == 1024  # the built-in grid: up to 512 GPUs
    path = tmp_path / "big.yaml"
    path.write_text(
        "name: big\nbase:\n  cluster: {nodes: 1, gpus_per_node: 8, gpu: H100-SXM}\n"
        "  workload: {model: BERT-Large, micro_batch: 8, precision: bf16}\n"
        "  training: {optimizer: adam}\nvary:\n  gpus: [8, 2048, 16384]\n"
    )
    sweep = candidate_sweep(path)
    recipe = _recipe(sweep, 1000, None)
    assert recipe["global_batch"] == 16384 and any("largest candidate" in n for n in recipe["notes"])
    assert _recipe(sweep, 1000, 512)["global_batch"] == 512  # --global-batch wins
    path.write_text(path.read_text().replace("name: big\n", "name: big\nglobal_batch: 4096\n"))
    assert _recipe(candidate_sweep(path), 1000, None)["global_batch"] == 4096  # the file's
