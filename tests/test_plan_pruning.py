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

    return (
        one(result["chosen"]),
        [one(r) for r in result["runners_up"]],
        one(result["fastest"]),
        one(result.get("fastest_within")),
    )


# A small grid of the built-in one's kind (several GPUs, both NIC kinds and rates, sizes from one node
# to where the global batch runs out, compressed optimizers), small enough to evaluate exhaustively.
SMALL_GRID = """name: small
base:
  cluster: {nodes: 1, gpus_per_node: 8, gpu: A100-80GB, intra_node: {fabric: nvswitch},
            nic: {kind: infiniband, count: 1, line_rate_gbps: 200}}
  workload: {model: BERT-Large, micro_batch: 8, precision: bf16}
  training: {optimizer: adam}
global_batch: 1024
vary:
  gpu: [V100-SXM2, A100-40GB, H100-SXM, B200]
  gpus: [8, 32, 128, 512, 2048]
  nic_kind: [ethernet_tcp, infiniband]
  nic_gbps: [100, 400]
  optimizer: [adam, binsgdm]
per_gpu:
  V100-SXM2: {precision: fp16, fabric: nvlink_mesh}
"""


@pytest.mark.parametrize(
    "model, steps, deadline_h, budget",
    [
        ("BERT-Large", 100_000, 72.0, None),
        ("GPT-3-1.3B", 50_000, 200.0, 60_000.0),
        ("BERT-Large", 100_000, 72.0, 1_000_000.0),  # the fastest of all is over budget: the fastest within
        ("GPT-3-13B", 20_000, 400.0, None),
        ("GPT-3-13B", 20_000, 1.0, None),  # nothing meets it: the clusters left unsearched are searched
    ],
)
def test_pruning_never_changes_the_plan(model, steps, deadline_h, budget, tmp_path):
    """On a grid small enough to simulate every candidate, the pruned plan is the exhaustive one: the
    choice, the runners-up and the fastest, each with its cost."""
    grid = tmp_path / "small.yaml"
    grid.write_text(SMALL_GRID)
    args = (model, steps, deadline_h, budget, grid, None, None)
    pruned = plan(*args, samples=0, workers=1)
    full = plan(*args, samples=0, workers=1, prune=False)
    assert full["pruned"] == 0 and full["not_searched"] == 0
    if deadline_h == 400.0:  # V100 and A100 clusters of 8 cannot meet it even at peak rate
        assert pruned["not_searched"] > 0
    if deadline_h == 1.0:  # none meets it, so the fastest may be any: all are searched
        assert pruned["chosen"] is None and pruned["not_searched"] == 0
    if not pruned["not_searched"]:
        assert pruned["simulated"] + pruned["pruned"] >= full["simulated"]
    assert _answer(pruned) == _answer(full)


def test_the_built_in_grid_holds_every_catalog_gpu_and_priced_nic_up_to_16384_gpus():
    """The built-in grid (catalogs/plan_candidates.yaml) is read against the catalogs, so that it cannot
    silently fall behind them: every shipped GPU but the CI runner's CPU stand-in and Meta's own H100
    variant (TorchTitan's validation rows; neither is sold) (a GPU added to gpus.yaml and not to the
    grid fails here), both NIC kinds the schema knows at every line rate
    network_prices.yaml prices for both of them, every power of two from one 8-GPU node to 16,384
    GPUs, and 1,024 samples per step whatever the grid's size; each GPU's rows resolve to a valid
    cluster."""
    import typing

    from clustersim import catalog
    from clustersim.planner.planning import candidate_sweep
    from clustersim.report.prices import network_catalog
    from clustersim.scenario import NicSpec
    from clustersim.sweeps.spec import resolve_row

    sweep = candidate_sweep(None)
    vary = sweep.spec.vary
    assert set(vary["gpu"]) == set(catalog.gpus()) - {"CPU-2vCPU", "H100-SXM-HBM2e-500W"}
    kinds = set(typing.get_args(NicSpec.model_fields["kind"].annotation))
    assert set(vary["nic_kind"]) == kinds
    prices = network_catalog(None)
    both = set.intersection(*({int(r) for r in prices[kind]} for kind in kinds))
    assert set(vary["nic_gbps"]) == both and both
    assert vary["gpus"] == [2**k for k in range(3, 15)]
    assert max(vary["gpus"]) == 16384 and sweep.spec.global_batch == 1024
    seen = set()
    for row in sweep.rows():
        if row["gpu"] not in seen and row["gpus"] == 64:
            seen.add(row["gpu"])
            resolve_row(sweep.base, row, 100, sweep.spec.global_batch)  # raises for an invalid node
    assert seen == set(vary["gpu"])


def test_owned_gpus_without_a_server_price_are_left_out_saying_so_once():
    """Owned, a candidate GPU with no server price cannot be priced: its rows are left out and the
    header says which, once, instead of the plan turning to rented prices."""
    from clustersim.planner.planning import candidate_sweep
    from clustersim.report import costing

    own = costing.cost_model("own")
    result = plan("GPT-3-13B", 10_000, 720.0, None, None, None, None, samples=0, costs=own)
    missing = sorted(g for g in candidate_sweep(None).spec.vary["gpu"] if g not in own.o["servers"])
    said = [n for n in result["recipe_notes"] if "no server price" in n]
    assert len(said) == 1 and all(g in said[0] for g in missing) and missing
    assert result["pricing"].startswith("owned")
    assert result["chosen"]["gpu"] in own.o["servers"]


def test_pruning_on_two_workers_keeps_the_plan_and_prunes_the_same_rows_every_run(tmp_path):
    """Rows go to the workers through a window whose results are taken in the order sent, so what is
    pruned does not depend on which worker finishes first: two runs prune the same count, and the
    answer is the unpruned one."""
    grid = tmp_path / "small.yaml"
    grid.write_text(SMALL_GRID)
    args = ("GPT-3-1.3B", 50_000, 200.0, 60_000.0, grid, None, None)
    first = plan(*args, samples=0, workers=2)
    again = plan(*args, samples=0, workers=2)
    full = plan(*args, samples=0, workers=1, prune=False)
    assert first["pruned"] == again["pruned"] > 0 and first["simulated"] == again["simulated"]
    assert _answer(first) == _answer(again) == _answer(full)


def test_rows_sent_ahead_of_their_turn_leave_the_same_rows_simulated_and_pruned(tmp_path, monkeypatch):
    """While the oldest row in flight is awaited, later rows that could win go to the idle workers ahead
    of their turn; each is still decided in its turn on the same results, so the rows simulated (and
    taken in the same order), pruned and skipped are those of the window alone, however far ahead rows
    are sent (a row sent ahead and then pruned is dropped)."""
    import clustersim.planner.planning as planning

    grid = tmp_path / "small.yaml"
    grid.write_text(SMALL_GRID)
    args = ("GPT-3-13B", 20_000, 400.0, None, grid, None, None)
    simulate_rows = planning.simulate_rows
    taken: list = []

    def recording(*a, **k):
        out = simulate_rows(*a, **k)
        taken.append([r["row_id"] for r in out[0]])
        return out

    monkeypatch.setattr(planning, "simulate_rows", recording)
    sent = []
    send = planning._send
    monkeypatch.setattr(planning, "_send", lambda *a: sent.append(a[3]) or send(*a))
    results = {}
    for early in (0, planning.EARLY_ROWS, 40):  # 0: none ahead of its turn
        monkeypatch.setattr(planning, "EARLY_ROWS", early)
        sent.clear()
        result = plan(*args, samples=0, workers=2)
        keys = ("simulated", "invalid", "pruned", "interleaved_not_simulated", "not_searched")
        results[early] = ([result[k] for k in keys], _answer(result), taken[-1], len(sent))
    none, default, far = results[0], results[planning.EARLY_ROWS], results[40]
    assert none[:3] == default[:3] == far[:3]
    assert far[3] > none[3]  # rows were sent ahead and dropped: the path is exercised


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


_SLOW_NIC = {
    "cluster.nic.kind": "ethernet_tcp",
    "cluster.nic.line_rate_gbps": 25,
    "cluster.nic.count": 1,
    "cluster.nic.effective_gbps": None,
}


@pytest.mark.parametrize(
    "changes",
    [
        {},  # DDP: an all-reduce
        {"training.sharding.stage": 1},
        {"training.sharding.stage": 3},
        {"training.parallelism.tensor": 2, "training.parallelism.distributed_optimizer": True},  # Megatron
        {"training.parallelism.pipeline": 2},  # the first stage's exchange only
    ],
)
def test_the_exchange_bound_binds_on_a_slow_nic_and_stays_below_the_simulated_step(changes):
    """On one 25 GbE NIC per node the data-parallel exchange, what any algorithm must send the other
    nodes, bounds GPT-3 1.3B's step above its compute: the bound is that, and no more than the step."""
    from clustersim.planner import bounds

    s = load_scenario("preset:dgx-h100-gpt3-1.3b").with_changes(**_SLOW_NIC, **changes)
    forward, backward, params = bounds._micro_batch_compute(s, None)
    if s.training.megatron_program:
        exchange = bounds._megatron_gradient_sync(s, params)
    else:
        exchange = bounds._data_parallel_exchange(s, params)
    compute_only = load_scenario("preset:dgx-h100-gpt3-1.3b").with_changes(**changes)
    assert step_time_lower_bound(s) > step_time_lower_bound(compute_only) and exchange > 0
    assert step_time_lower_bound(s) < simulate(s).iteration_time


@pytest.mark.parametrize("micro_batch", [4, 1])
def test_the_zero3_bound_counts_every_micro_steps_gathers_and_stays_below_the_simulated_step(micro_batch):
    """ZeRO-3 gathers every layer's parameters in each micro-step's forward and backward: the exchange
    bound grows with the micro-steps (here 4 times from micro-batch 4 to 1 at one global batch), and
    stays below the simulated step."""
    from clustersim.planner import bounds

    s = load_scenario("preset:dgx-h100-gpt3-1.3b").with_changes(**_SLOW_NIC, **{"training.sharding.stage": 3})
    micro = {"workload.micro_batch": micro_batch, "workload.gradient_accumulation": 4 // micro_batch}
    s = s.with_changes(**micro)
    params = bounds._micro_batch_compute(s, None)[2]
    grad, weights = bounds._bytes_per_element(s)
    one = bounds._data_parallel_exchange(s.with_changes(**{"workload.gradient_accumulation": 1}), params)
    assert bounds._data_parallel_exchange(s, params) == pytest.approx(s.workload.gradient_accumulation * one)
    assert one == pytest.approx(2 * weights / (grad + weights) * bounds._data_parallel_exchange(
        s.with_changes(**{"training.sharding.stage": 2}), params
    ))  # fmt: skip
    assert 0 < step_time_lower_bound(s) < simulate(s).iteration_time


def test_a_zero3_rows_bound_is_taken_at_the_micro_batch_it_will_run():
    """A ZeRO-3 row whose micro-batch does not fit runs at a halved one, with more micro-steps, each
    gathering the parameters again: the plan's bound for it is taken there (a memory check, no
    simulation), below the simulated step."""
    from clustersim.planner.planning import _bound_records, candidate_sweep
    from clustersim.sweeps.run import simulate_row
    from clustersim.sweeps.spec import resolve_row

    sweep = candidate_sweep(None)
    base = sweep.base.with_changes(**{"workload.model": "GPT-3-13B", "workload.seq_len": None})
    row = {"gpu": "A100-80GB", "gpus": 16, "nic_kind": "ethernet_tcp", "nic_gbps": 100, "optimizer": "adam"}
    row["training.sharding.stage"] = 3
    base_json = base.model_dump(mode="json")
    (bound,) = _bound_records(base_json, [row], 100, 1024)
    as_given = step_time_lower_bound(resolve_row(base, row, 100, 1024))
    simulated = simulate_row(base_json, row, 100, None, 1024)
    assert simulated["status"] == "ok" and simulated["scenario"]["workload"]["micro_batch"] < 8
    assert as_given < bound["iteration_time_s"] < simulated["iteration_time_s"]


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


def test_the_sampler_import_runs_beside_the_simulations_and_is_done_before_the_bands_fork(
    tmp_path, monkeypatch
):
    """While the workers simulate, the plan's own process imports the bands' sampler on a thread of its
    own (on the main thread it left both workers idle); the thread is joined before the search
    returns, so no thread is importing when the bands' workers are forked."""
    import threading

    import clustersim.planner.planning as planning

    grid = tmp_path / "small.yaml"
    grid.write_text(SMALL_GRID)
    ran, alive = [], []

    def load():
        ran.append(threading.current_thread() is not threading.main_thread())

    simulate_rows = planning.simulate_rows

    def checked(*a, **k):
        out = simulate_rows(*a, **k)
        alive.extend(t.name for t in threading.enumerate() if t.name == "plan-meanwhile")
        return out

    monkeypatch.setattr(planning, "_load_band_sampler", load)
    monkeypatch.setattr(planning, "simulate_rows", checked)
    plan("GPT-3-1.3B", 50_000, 200.0, 60_000.0, grid, None, None, samples=2, workers=2)
    assert ran == [True] and alive == []


def test_a_pipelines_look_alikes_split_over_two_workers_draw_the_times_of_one_pass():
    """A pipeline's look-alikes on other NICs (the choice's runners-up) run their draws in one batched
    pass; where that pass would keep one worker busy while the other idles, they are split into one
    group of consecutive rows per worker, and each row's draw times are those of the single pass."""
    from clustersim.planner.planning import _band_draws, _split_look_alikes

    def scenario(gbps):
        return {
            "cluster": {
                "nodes": 4, "gpus_per_node": 8, "gpu": "A100-80GB",
                "nic": {"kind": "infiniband", "count": 1, "line_rate_gbps": gbps},
            },
            "workload": {
                "model": "GPT-3-1.3B", "micro_batch": 1, "seq_len": 2048, "gradient_accumulation": 8,
            },
            "training": {
                "optimizer": "adam",
                "parallelism": {"tensor": 1, "pipeline": 4, "schedule": "interleaved", "virtual_stages": 3},
            },
        }  # fmt: skip

    rows = [scenario(g) for g in (400, 200, 100)]
    data_parallel = {**rows[0], "training": {"optimizer": "adam"}}
    assert _split_look_alikes([[0, 1, 2], [3]], [*rows, data_parallel], 2) == [[0], [1, 2], [3]]
    assert _split_look_alikes([[0, 1, 2]], rows, 1) == [[0, 1, 2]]  # one worker: one pass
    assert _split_look_alikes([[0], [3]], [*rows, data_parallel], 2) == [[0], [3]]
    whole = _band_draws(rows, 4, 0, 1)
    assert _band_draws(rows[:1], 4, 0, 1) + _band_draws(rows[1:], 4, 0, 1) == whole
    assert len({t for times, _ in whole for t in times}) == 12  # every NIC and draw a time of its own


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
    from clustersim.planner.planning import _recipe, candidate_sweep

    built_in = candidate_sweep(None)  # the built-in grid sets 1,024 itself, with no note: the default
    assert _recipe(built_in, 1000, None)["global_batch"] == 1024
    assert _recipe(built_in, 1000, None)["notes"] == []
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


def test_an_optimizer_that_runs_nowhere_is_blamed_on_memory_before_the_batch():
    """Where an optimizer fails on every row, its reason is the shortest of those that are not the
    global batch running out of samples for the largest candidates (say, out of memory): that reason
    says nothing about the optimizer."""
    from clustersim.planner.planning import optimizers_not_run

    batch, memory = "global_batch: 1024 does not split", "row: workload.model: does not fit in GPU memory"
    records = [{"optimizer": "binsgdm", "status": "invalid", "error": e} for e in (batch, memory)]
    assert optimizers_not_run(records) == {"binsgdm": "workload.model: does not fit in GPU memory"}
    assert optimizers_not_run(records[:1]) == {"binsgdm": records[0]["error"]}


@pytest.mark.parametrize(
    "per_gpu, key",
    [
        ("{H100-SXM: {fabric: pcie}}", "per_gpu.H100-SXM"),  # not a value of the gpu axis
        ("{L4: {gpus: 8}}", "per_gpu.L4.gpus"),  # an axis vary varies
        ("{L4: {colour: red}}", "per_gpu.L4.colour"),  # no such axis
        ("{L4: {cluster.nodes: 4}}", "per_gpu.L4.cluster.nodes"),  # what the GPU count sets
        ("{L4: {cluster.gpu: H100-SXM}}", "per_gpu.L4.cluster.gpu"),  # the gpu axis itself
        ("{L4: {fabric: pcie, nic_gbps: .nan}}", "per_gpu.L4.nic_gbps"),  # a value no row could take
        ("{L4: {micro_batch: -1}}", "per_gpu.L4.micro_batch"),
    ],
)
def test_per_gpu_values_that_cannot_apply_are_refused_naming_the_key(tmp_path, per_gpu, key):
    from clustersim.errors import InputError
    from clustersim.planner.planning import candidate_sweep

    path = tmp_path / "grid.yaml"
    path.write_text(
        "name: g\nbase:\n  cluster: {nodes: 1, gpus_per_node: 8, gpu: A100-80GB}\n"
        "  workload: {model: BERT-Large, micro_batch: 8, precision: bf16}\n"
        f"vary:\n  gpu: [A100-80GB, L4]\n  gpus: [8]\nper_gpu: {per_gpu}\n"
    )
    with pytest.raises(InputError) as err:
        candidate_sweep(path)
    assert key in str(err.value)


def test_per_gpu_cannot_set_a_varied_key_by_its_other_name(tmp_path):
    """nic_gbps and cluster.nic.line_rate_gbps are one key: per_gpu may not set what vary varies."""
    from clustersim.errors import InputError
    from clustersim.planner.planning import candidate_sweep

    path = tmp_path / "grid.yaml"
    path.write_text(
        "name: g\nbase:\n  cluster: {nodes: 1, gpus_per_node: 8, gpu: A100-80GB}\n"
        "  workload: {model: BERT-Large, micro_batch: 8, precision: bf16}\n"
        "vary:\n  gpu: [A100-80GB, L4]\n  nic_gbps: [100, 400]\n"
        "per_gpu: {L4: {cluster.nic.line_rate_gbps: 200}}\n"
    )
    with pytest.raises(InputError) as err:
        candidate_sweep(path)
    assert "per_gpu.L4.cluster.nic.line_rate_gbps" in str(err.value)


def test_per_gpu_values_go_to_their_gpus_rows_only(tmp_path):
    from clustersim.planner.planning import candidate_sweep

    path = tmp_path / "grid.yaml"
    path.write_text(
        "name: g\nbase:\n  cluster: {nodes: 1, gpus_per_node: 8, gpu: A100-80GB}\n"
        "  workload: {model: BERT-Large, micro_batch: 8, precision: bf16}\n"
        "vary:\n  gpu: [A100-80GB, L4]\n  gpus: [8, 16]\nper_gpu: {L4: {fabric: pcie}}\n"
    )
    sweep = candidate_sweep(path)
    assert sweep.axes == ["gpu", "gpus", "fabric"]
    assert [r.get("fabric") for r in sweep.rows()] == [None, None, "pcie", "pcie"]


@pytest.mark.parametrize("deadline_h", [400.0, 90.0])  # the second: the choice's P90 misses it (risk line)
def test_bands_for_the_rows_that_choose_give_the_plan_that_bands_the_five_cheapest(
    tmp_path, monkeypatch, deadline_h
):
    """plan bands the rows whose bands can change the choice, then the ones it shows; banding all five
    cheapest rows that meet the constraints (as it once did) prints the same plan, bands and lines."""
    from clustersim.planner import planning

    grid = tmp_path / "small.yaml"
    grid.write_text(SMALL_GRID)
    args = ("GPT-3-13B", 20_000, deadline_h, None, grid, None, None)

    def printed(result):
        rows = [result["chosen"], *result["runners_up"]]
        return result["text"], [
            (r["cluster"], r.get("ttt_p10_h"), r.get("ttt_p90_h"), r["cost"]) for r in rows
        ]

    few = plan(*args, samples=4, workers=1)
    monkeypatch.setattr(planning, "_bands_that_choose", lambda top, rec: [*top, rec["chosen"]])
    five = plan(*args, samples=4, workers=1)
    assert printed(few) == printed(five)
    if deadline_h < 100:
        assert any(line.startswith("Risk:") for line in few["text"])


def test_a_plan_that_searches_again_says_each_note_once(tmp_path):
    """Where no searched cluster meets the deadline, plan searches every candidate again: the notes the
    first search added (the model axis replaced, ...) are said once, not once per search."""
    grid = tmp_path / "grid.yaml"
    grid.write_text(
        "name: small\nbase:\n  cluster: {nodes: 1, gpus_per_node: 8, gpu: A100-80GB,\n"
        "            intra_node: {fabric: nvswitch},\n"
        "            nic: {kind: infiniband, count: 1, line_rate_gbps: 200}}\n"
        "  workload: {model: BERT-Large, micro_batch: 8, precision: bf16}\n  training: {optimizer: adam}\n"
        "global_batch: 1024\nvary:\n  model: [BERT-Large, GPT-3-13B]\n  gpu: [V100-SXM2, H100-SXM]\n"
        "  gpus: [8, 64]\nper_gpu:\n  V100-SXM2: {precision: fp16, fabric: nvlink_mesh}\n"
    )
    result = plan("GPT-3-13B", 20_000, 30.0, None, grid, None, None, samples=0, workers=1)
    notes = result["recipe_notes"]
    assert any("replaces the candidates file's model axis" in n for n in notes)
    assert len(notes) == len(set(notes)), notes


def test_plan_with_an_invalid_candidate_plans_the_others_and_with_none_valid_says_why(tmp_path, runner):
    """A candidate that is not a valid cluster (an L40S on the base's NVSwitch) is left out, not a
    traceback; when every candidate is invalid, the one line says why (run's message for the row)."""
    from clustersim.cli import app

    args = ["plan", "--model", "GPT-3-1.3B", "--steps", "100", "--deadline", "30d", "--samples", "0"]
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text("name: c\nbase: preset:dgx-h100-gpt3-1.3b\nvary: {gpu: [H100-SXM, L40S], gpus: [8]}\n")
    r = runner.invoke(app, [*args, "--price", "2", "--candidates", str(mixed)])
    assert r.exit_code == 0 and "Recommended: adam on 8 x H100-SXM" in r.stdout, r.output
    none = tmp_path / "none.yaml"
    none.write_text(
        "name: c\nbase: preset:dgx-h100-gpt3-1.3b\n"
        "vary: {gpus: [8], training.parallelism.recompute: [full],\n"
        "  training.parallelism.recompute_method: [block], training.parallelism.recompute_num_layers: [25]}\n"
    )
    r = runner.invoke(app, [*args, "--price", "2", "--candidates", str(none)])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "recompute_num_layers: 25 exceeds the 24 blocks" in r.stderr


def test_a_rows_nic_twin_is_its_scenario_with_the_twins_nic():
    """_bound_records resolves one row per cluster and layout and gives its NIC twins their NIC
    (_nic_changes): the same scenario as resolving each twin, on every kind of row of the grid."""
    from clustersim.planner.planning import _memory_key, _nic_changes, candidate_sweep
    from clustersim.sweeps.spec import resolve_row

    sweep = candidate_sweep(None)
    base = sweep.base.with_changes(**{"workload.model": "GPT-3-13B", "workload.seq_len": None})
    layouts = [{}, {"training.sharding.stage": 3}, {"training.parallelism.tensor": 2}]
    first: dict = {}
    checked = 0
    for row in sweep.rows():
        if row["gpus"] != 64 or row["gpu"] not in ("V100-SXM2", "H100-SXM") or row["optimizer"] != "adam":
            continue
        for layout in layouts:
            values = {**row, **layout}
            twin = first.setdefault(_memory_key(values), resolve_row(base, values, 100, 1024))
            assert twin.with_changes(**_nic_changes(values)) == resolve_row(base, values, 100, 1024)
            checked += 1
    assert checked == 2 * 6 * len(layouts)


def test_the_second_search_takes_the_rows_the_first_simulated_as_they_are(tmp_path, monkeypatch):
    """Where no candidate searched meets the deadline, every candidate is searched again (the fastest
    may be among those left out): the rows the first search simulated are not simulated again, and
    the plan is the unpruned one."""
    from collections import Counter

    from clustersim.planner import planning
    from clustersim.sweeps.spec import row_id

    grid = tmp_path / "small.yaml"
    grid.write_text(SMALL_GRID)
    runs: Counter = Counter()
    simulate_row = planning.simulate_row

    def counted(base_json, values, *args, **kwargs):
        runs[row_id(values)] += 1
        return simulate_row(base_json, values, *args, **kwargs)

    monkeypatch.setattr(planning, "simulate_row", counted)
    args = ("GPT-3-13B", 20_000, 1.0, None, grid, None, None)
    pruned = plan(*args, samples=0, workers=1)
    assert pruned["chosen"] is None and pruned["not_searched"] == 0
    assert runs and max(runs.values()) == 1
    assert _answer(pruned) == _answer(plan(*args, samples=0, workers=1, prune=False))


@pytest.mark.parametrize(
    "layout",
    [
        {"training.sharding.stage": 1},
        {"training.sharding.stage": 3},
        {"training.parallelism.tensor": 2, "training.parallelism.pipeline": 2},
        {
            "training.parallelism.pipeline": 4,
            "training.parallelism.schedule": "interleaved",
            "training.parallelism.virtual_stages": 2,
        },
    ],
)
def test_infiniband_is_never_slower_than_ethernet_at_one_line_rate(layout):
    """What lets a plan bound an Ethernet row by its InfiniBand twin at the same or a higher rate
    (_fastest_twins with kinds): InfiniBand's share of the line rate, latency and RDMA are at least
    Ethernet's, so its step is never longer, on every layout the search adds and at every rate of the
    built-in grid."""
    from clustersim.planner.planning import _kinds_rank, candidate_sweep

    base = candidate_sweep(None).base
    assert _kinds_rank(base)
    s = base.with_changes(
        **{"workload.model": "GPT-3-13B", "workload.seq_len": None, "workload.micro_batch": 1}
    ).with_world_size(32)
    s = s.with_changes(**{"workload.gradient_accumulation": 8, **layout})
    for gbps in (100, 200, 400):
        times = {
            kind: simulate(
                s.with_changes(
                    **{
                        "cluster.nic.kind": kind,
                        "cluster.nic.line_rate_gbps": gbps,
                        "cluster.nic.effective_gbps": None,
                    }
                )
            ).iteration_time
            for kind in ("infiniband", "ethernet_tcp")
        }
        assert times["infiniband"] <= times["ethernet_tcp"], gbps
    assert not _kinds_rank(base.with_changes(**{"cluster.nic.latency_us": 1.0}))
    assert not _kinds_rank(base.with_changes(profile="builtin:h100-pytorch-2.11"))


def test_pruning_holds_the_budget_against_what_the_run_asks_to_spend_not_its_run_cost():
    """The choice holds --budget against an owned cluster's capital plus the run's power (a rental's
    hours), report/analysis.outlay; pruning must hold it against the same, or a row that only looks
    within budget by its amortised run cost would set the bar and rule out the true choice."""
    from clustersim.planner.planning import Pruning

    prune = Pruning(cost_of=lambda rec: (0.0, 0.0, 0.0), deadline_h=100.0, budget=1_000_000.0)
    # 50 h, $20,000 amortised, $2,000,000 of servers: not within the budget, and not the fastest
    assert not prune.meets(50.0, 2_000_000.0)
    assert not prune.could_win((50.0, 20_000.0, 2_000_000.0), met=[30_000.0], fastest_h=10.0)
    # the same run on servers within the budget could win
    assert prune.could_win((50.0, 20_000.0, 900_000.0), met=[30_000.0], fastest_h=10.0)


def test_the_fastest_within_the_budget_is_the_fastest_row_that_meets_it(tmp_path):
    grid = tmp_path / "small.yaml"
    grid.write_text(SMALL_GRID)
    result = plan("BERT-Large", 100_000, 72.0, 1_000_000.0, grid, None, None, samples=0, workers=1)
    within, fastest = result["fastest_within"], result["fastest"]
    assert within is not None and within["outlay"] <= 1_000_000.0 and within["ttt_h"] <= 72.0
    assert fastest["outlay"] > 1_000_000.0 and fastest["ttt_h"] < within["ttt_h"]


def test_when_nothing_meets_the_budget_the_cheapest_quoted_is_the_exhaustive_plans(tmp_path):
    """Pruning drops rows that cannot meet the budget; while none meets it, the cheapest of all is still
    simulated, so "the cheapest needs $X" is the one an exhaustive plan quotes."""
    grid = tmp_path / "small.yaml"
    grid.write_text(SMALL_GRID)
    args = ("GPT-3-1.3B", 50_000, 200.0, 1.0, grid, None, None)
    pruned = plan(*args, samples=0, workers=1)
    full = plan(*args, samples=0, workers=1, prune=False)
    assert pruned["chosen"] is None and "the cheapest needs" in pruned["text"][0]
    assert pruned["text"][0] == full["text"][0]


def test_a_plans_kept_pipelines_change_nothing_and_are_let_go(tmp_path, monkeypatch):
    """The plan re-prices the pipeline program of a row for its rows on other NICs (planning._KEPT):
    every simulated row's record, and so the answer, is the one building every program gives; programs
    were re-priced, and none is kept once the plan is done."""
    from contextlib import nullcontext

    import clustersim.planner.planning as planning
    from clustersim.planner.planning import plan_as_json
    from clustersim.simulator.strategies.megatron import PipelineRepricer

    grid = tmp_path / "small.yaml"
    grid.write_text(SMALL_GRID)
    args = ("GPT-3-13B", 20_000, 400.0, None, grid, None, None)
    repriced, records = [], []
    real_program_for, real_simulate_row = PipelineRepricer.program_for, planning._simulate_row

    def counting(self, ctx):
        prog = real_program_for(self, ctx)
        repriced.append(prog is not None)
        return prog

    def recording(*a, **k):
        records.append(real_simulate_row(*a, **k))
        return records[-1]

    monkeypatch.setattr(PipelineRepricer, "program_for", counting)
    monkeypatch.setattr(planning, "_simulate_row", recording)
    kept = plan_as_json(plan(*args, samples=0, workers=1))
    kept_records = list(records)
    assert sum(repriced) >= 5 and not planning._KEPT
    monkeypatch.setattr(planning, "reusing_pipelines", lambda kept: nullcontext())
    repriced.clear()
    records.clear()
    built = plan_as_json(plan(*args, samples=0, workers=1))
    assert not repriced
    assert kept_records == records and len(records) > 20
    assert kept == built


def test_a_plan_collects_garbage_less_often_and_gives_the_callers_thresholds_back(monkeypatch):
    """While a plan runs the young generation is collected every PLAN_GC_THRESHOLD0 allocations (its
    millions of op records are no cycles); the caller's own thresholds come back afterwards, also when
    the plan fails."""
    import gc

    from clustersim.planner import planning

    seen = []
    monkeypatch.setattr(planning, "_plan", lambda *a, **k: seen.append(gc.get_threshold()) or {})
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        planning.plan("BERT-Large", 100, 72.0, None, None, None, None, samples=0)
        assert seen == [(planning.PLAN_GC_THRESHOLD0, 10, 10)]
        assert gc.get_threshold() == (700, 10, 10)

        def fails(*a, **k):
            raise RuntimeError("boom")

        monkeypatch.setattr(planning, "_plan", fails)
        with pytest.raises(RuntimeError):
            planning.plan("BERT-Large", 100, 72.0, None, None, None, None, samples=0)
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)
