"""A Megatron pipeline's program built once and re-priced per draw of the uncertain parameters
(strategies.megatron.PipelineRepricer, runner.draw_times) is the program a rebuild gives for that draw,
op for op, so bands (run, plan) are unchanged by re-pricing."""

import pytest

from clustersim.scenario import validate_scenario
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.simulator.runner import draw_times
from clustersim.simulator.strategies.megatron import (
    KEPT_PIPELINES,
    PipelineRepricer,
    model_parallel_program,
    reusing_pipelines,
)
from clustersim.simulator.uncertainty import perturbations

FIELDS = (
    "id", "name", "stream", "duration", "category", "deps", "intra_node_bytes", "inter_node_bytes",
    "compute_slowdown", "demands", "meta", "rank", "collective",
)  # fmt: skip


def _scenario(t=2, p=4, m=8, v=1, nic="infiniband", **par):
    return validate_scenario(
        {
            "cluster": {
                "nodes": 4,
                "gpus_per_node": 8,
                "gpu": "A100-80GB",
                "nic": {"kind": nic, "count": 1, "line_rate_gbps": 100},
            },
            "workload": {
                "model": "GPT-3-1.3B",
                "micro_batch": 1,
                "seq_len": 2048,
                "gradient_accumulation": m,
                "pointwise": "fused",
            },
            "training": {
                "optimizer": "adam",
                "parallelism": {
                    "tensor": t,
                    "pipeline": p,
                    "virtual_stages": v,
                    "schedule": "interleaved" if v > 1 else "1f1b",
                    **par,
                },
            },
        },
        source="test",
    )


CASES = {
    "1f1b": _scenario(),
    "interleaved": _scenario(v=2),
    "sequence parallel, recompute, distributed optimizer, ethernet": _scenario(
        nic="ethernet_tcp", sequence_parallel=True, recompute="full", distributed_optimizer=True
    ),
    "no tensor parallelism": _scenario(t=1, p=2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_repriced_program_is_the_rebuilt_program_op_for_op(name):
    s = CASES[name]
    draws = perturbations(build_context(s), 4)
    first = build_context(s, None, draws[0])
    repricer = PipelineRepricer(first, 12.0, "adam update")
    for p in draws[1:] + draws[:1]:
        ctx = build_context(s, None, p)
        rebuilt = model_parallel_program(build_context(s, None, p), 12.0, "adam update")
        repriced = repricer.program_for(ctx)
        assert len(repriced.ops) == len(rebuilt.ops)
        for a, b in zip(repriced.ops, rebuilt.ops):
            assert [getattr(a, f) for f in FIELDS] == [getattr(b, f) for f in FIELDS], a.name
        # the draws do move the prices: the test compares programs that differ between draws
    assert len({op.duration for op in repricer.program.ops}) > 1


@pytest.mark.parametrize("name", list(CASES))
def test_draw_times_are_the_simulated_times_of_each_draw(name):
    s = CASES[name]
    draws = perturbations(build_context(s), 6)
    expected = [simulate(s, perturbation=p).iteration_time for p in draws]
    assert draw_times(s, None, draws) == expected
    assert len(set(expected)) == len(expected)  # every draw prices the step differently


def test_draw_times_of_a_data_parallel_scenario_are_its_simulated_times():
    s = validate_scenario(
        {
            "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "A100-80GB"},
            "workload": {"model": "BERT-Large", "micro_batch": 8, "seq_len": 128},
            "training": {"optimizer": "adam"},
        },
        source="test",
    )
    draws = perturbations(build_context(s), 4)
    assert draw_times(s, None, draws) == [simulate(s, perturbation=p).iteration_time for p in draws]


def test_a_pipelines_default_draws_give_the_band_of_256_draws():
    """A plan's choices are pipelines: their P10 and P90 at the default draws move < 3% against 256
    draws (measured: -0.4% and -1.0% for this layout), as a data-parallel step's do (test_uncertainty)."""
    from clustersim.scenario import load_scenario
    from clustersim.simulator.runner import iteration_interval
    from clustersim.simulator.uncertainty import DEFAULT_SAMPLES

    s = load_scenario("preset:dgx-h100-gpt3-175b-3d")
    ctx = build_context(s)
    few, many = (iteration_interval(s, None, ctx, n) for n in (DEFAULT_SAMPLES, 256))
    assert few.p10 == pytest.approx(many.p10, rel=0.03) and few.p90 == pytest.approx(many.p90, rel=0.03)
    assert many.p90 > 1.1 * many.p10  # a band, not a point


@pytest.mark.parametrize("name", list(CASES))
def test_draw_times_checked_reprices_the_first_draw_to_the_same_times(name):
    """With the nominal run's checks already made (checked=True), the first draw is re-priced instead
    of simulated: the times are still those of simulating every draw."""
    s = CASES[name]
    draws = perturbations(build_context(s), 4)
    expected = [simulate(s, perturbation=p).iteration_time for p in draws]
    assert draw_times(s, None, draws, checked=True) == expected


def test_draws_run_together_give_each_scenarios_draw_times_to_the_last_bit():
    """runner.draw_times_many runs the draws of pipelines of one shape (every case's draws, the same
    layout on other NICs) through engine_batched's one pass: each time is draw_times', exactly, and a
    data-parallel scenario among them is run as draw_times runs it."""
    from clustersim.simulator.runner import draw_times_many

    scenarios = [*CASES.values()]
    scenarios += [_scenario(v=2).with_changes(**{"cluster.nic.line_rate_gbps": 400})]
    scenarios += [_scenario(nic="ethernet_tcp").with_changes(**{"cluster.nic.line_rate_gbps": 25})]
    scenarios += [
        validate_scenario(
            {
                "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu": "A100-80GB"},
                "workload": {"model": "BERT-Large", "micro_batch": 8, "seq_len": 128},
                "training": {"optimizer": "adam"},
            },
            source="test",
        )
    ]
    jobs = [(s, perturbations(build_context(s), 6)) for s in scenarios]
    for (s, draws), (times, ops) in zip(jobs, draw_times_many(jobs)):
        assert times == draw_times(s, None, draws, checked=True)
        assert len(set(times)) == len(times) and ops > 0


def test_the_batched_pass_gives_up_on_a_column_as_the_one_pass_does():
    """A kernel that starts before the last compute op on its rank ended would have slowed it: the one
    pass gives up on such a program (the event engine runs it), and the batched pass marks just that
    column NaN, giving the others their times."""
    import numpy as np

    from clustersim.simulator.engine_batched import run_columns
    from clustersim.simulator.engine_inorder import run_in_order
    from clustersim.simulator.program import Program

    prog = Program()
    prog.add("a", "compute", 1.0, "forward")
    prog.add("kernel", "comm", 1.0, "communication", compute_slowdown=0.5)
    durations = np.array([[1.0, 0.0], [1.0, 1.0]])  # the compute op is zero-length in column 2
    slowdowns = np.array([[0.0, 0.0], [0.5, 0.5]])
    assert run_columns(prog.ops, durations, slowdowns, 1e6) is None  # branches differ between columns
    durations = np.array([[1.0, 2.0], [1.0, 1.0]])
    ends = run_columns(prog.ops, durations, slowdowns, 1e6)
    assert run_in_order(prog) is None and np.isnan(ends).all()  # the kernel starts under the compute op
    prog.ops[1].deps = (0,)
    ends = run_columns(prog.ops, durations, slowdowns, 1e6)
    assert ends.tolist() == [2.0, 3.0] and max(run_in_order(prog)[1].values()) == 2.0
    assert np.isnan(run_columns(prog.ops, durations, slowdowns, 2.5)).tolist() == [False, True]


def test_the_batched_pass_follows_compute_under_several_kernels_as_the_one_pass_does():
    """A compute op under two or more running kernels, or under one that starts after it (an
    interleaved pipeline's send forward and send back on one rank): the batched pass walks each
    column's kernel starts and ends as engine_inorder does, so every column's end is run_in_order's
    to the last bit, and a column where the one pass gives up is NaN."""
    import numpy as np

    from clustersim.simulator.engine_batched import run_columns
    from clustersim.simulator.engine_inorder import run_in_order
    from clustersim.simulator.program import Program

    def program():
        prog = Program()
        c0 = prog.add("c0", "compute", 1.0, "forward")
        delay = prog.add("delay", "compute", 1.0, "other", rank=1)  # when the second kernel starts
        late = prog.add("later", "compute", 1.0, "other", (delay,), rank=1)
        k1 = prog.add("k1", "comm", 1.0, "communication", (c0,), compute_slowdown=0.1)
        k2 = prog.add("k2", "host", 1.0, "communication", (c0, delay), compute_slowdown=0.1)
        prog.add("k3", "copy", 1.0, "communication", (c0, late), compute_slowdown=0.1)
        c1 = prog.add("c1", "compute", 1.0, "backward", (c0,))
        prog.add("k4", "comm", 1.0, "communication", (c1, k1), compute_slowdown=0.1)
        prog.add("c2", "compute", 1.0, "backward", (c1, k2))
        return prog

    rng = np.random.default_rng(7)
    prog = program()
    n, k = len(prog.ops), 400
    durations = rng.uniform(0.05, 3.0, (n, k))
    slowdowns = np.zeros((n, k))
    kernels = [op.id for op in prog.ops if op.compute_slowdown > 0]
    slowdowns[kernels] = rng.uniform(0.05, 0.9, (len(kernels), k))
    slowdowns[kernels[0], :20] = 1.0  # a kernel that stops compute altogether: the one pass gives up
    durations[kernels[1], 20:40] = durations[kernels[0], 20:40]  # kernels that end at the same instant
    ends = run_columns(prog.ops, durations, slowdowns, 1e6)
    expected = []
    for c in range(k):
        for op in prog.ops:
            op.duration, op.compute_slowdown = durations[op.id, c], slowdowns[op.id, c]
        run = run_in_order(prog)
        expected.append(float("nan") if run is None else max(run[1].values()))
    assert np.isnan(expected).sum() >= 20  # the cases where the one pass gives up are covered
    assert (~np.isnan(expected)).sum() > 300
    np.testing.assert_array_equal(ends, expected)  # NaN where NaN, else equal to the last bit


def test_an_interleaved_pipelines_draws_all_run_in_the_batched_pass(monkeypatch):
    """An interleaved pipeline without tensor parallelism, whose stages' sends overlap compute two at a
    time: every draw goes through the batched pass (none is simulated alone) and gives draw_times'
    time to the last bit."""
    import clustersim.simulator.runner as runner

    s = _scenario(t=1, p=4, m=8, v=3)
    draws = perturbations(build_context(s), 8)
    expected = draw_times(s, None, draws, checked=True)
    alone = []
    monkeypatch.setattr(runner, "draw_times", lambda *a, **k: alone.append(a) or expected)
    ((times, ops),) = runner.draw_times_many([(s, draws)])
    assert not alone and times == expected and ops > 0


def _on_nic(s, kind="ethernet_tcp", gbps=400):
    """``s`` on another NIC: what a plan's rows that differ only in their network differ in."""
    return s.with_changes(**{"cluster.nic.kind": kind, "cluster.nic.line_rate_gbps": gbps})


def _numbers(r):
    """What a simulation gives a sweep's or a plan's row (sweeps.run.simulate_row)."""
    return (r.iteration_time, r.breakdown, r.bytes_per_link_kind, r.memory, r.extra.get("model_flops"))


@pytest.mark.parametrize("name", list(CASES))
def test_a_kept_pipeline_on_another_nic_is_re_priced_to_the_rebuilt_program_op_for_op(name):
    """Within reusing_pipelines, a scenario that differs from a kept one only in its NIC gets the kept
    program re-priced (the same object, not a build), op for op the program a build gives it."""
    s = CASES[name]
    kept: dict = {}
    with reusing_pipelines(kept):
        first = model_parallel_program(build_context(s), 12.0, "adam update")
        first_ops = [[getattr(op, f) for f in FIELDS] for op in first.ops]
        twin = model_parallel_program(build_context(_on_nic(s)), 12.0, "adam update")
    assert twin is first and len(kept) == 1
    rebuilt = model_parallel_program(build_context(_on_nic(s)), 12.0, "adam update")
    assert [[getattr(op, f) for f in FIELDS] for op in twin.ops] == [
        [getattr(op, f) for f in FIELDS] for op in rebuilt.ops
    ]
    # the NIC moves the prices: the re-pricing changed the program it was given
    assert [[getattr(op, f) for f in FIELDS] for op in twin.ops] != first_ops


def test_every_scenario_simulated_with_kept_pipelines_gets_its_own_result():
    """A kept program is re-priced only for the scenario it was built for on another NIC: another GPU,
    layout, precision, schedule or optimizer is built (kept as another entry), and every result is the
    one simulating that scenario alone gives, to the last bit."""
    base = CASES["1f1b"]
    scenarios = [
        base,
        _on_nic(base),  # re-priced
        base.with_changes(**{"cluster.gpu": "H100-SXM"}),
        base.with_changes(**{"training.parallelism.tensor": 4, "training.parallelism.pipeline": 2}),
        base.with_changes(**{"workload.precision": "bf16"}),  # fp16 by default
        base.with_changes(**{"training.optimizer": "sgdm"}),
        CASES["interleaved"],
        _on_nic(base, "infiniband", 200),  # its program evicted by the four built since: built again
        _on_nic(CASES["interleaved"], "infiniband", 400),  # re-priced
    ]
    alone = [_numbers(simulate(s)) for s in scenarios]
    built = []
    real_init = PipelineRepricer.__init__

    def counting_init(self, ctx, *args):
        built.append(ctx.scenario)
        real_init(self, ctx, *args)

    kept: dict = {}
    with pytest.MonkeyPatch.context() as mp, reusing_pipelines(kept):
        mp.setattr(PipelineRepricer, "__init__", counting_init)
        together = [_numbers(simulate(s)) for s in scenarios]
        assert len(kept) <= KEPT_PIPELINES
    assert together == alone
    assert len({repr(t) for t in alone}) == len(alone)  # each differs: none could pass for another
    assert built == [scenarios[i] for i in (0, 2, 3, 4, 5, 6, 7)]


def test_kept_pipelines_hold_at_most_their_ops_and_none_outside_the_context(monkeypatch):
    """Past KEPT_PIPELINE_OPS the oldest program goes (the newest is kept whatever its size); without
    reusing_pipelines every call builds its own program."""
    import clustersim.simulator.strategies.megatron as megatron

    a, b = CASES["1f1b"], CASES["interleaved"]
    monkeypatch.setattr(megatron, "KEPT_PIPELINE_OPS", 1)
    kept: dict = {}
    with reusing_pipelines(kept):
        model_parallel_program(build_context(a), 12.0, "adam update")
        prog = model_parallel_program(build_context(b), 12.0, "adam update")
        assert [r.program for r in kept.values()] == [prog]
    assert model_parallel_program(build_context(b), 12.0, "adam update") is not prog
    assert len(kept) == 1


LIKE_CHUNKS = {
    **CASES,
    "block recomputation of 1 block per chunk": _scenario(
        p=2, m=4, recompute="full", recompute_num_layers=1, recompute_method="block"
    ),
    "selective recomputation, interleaved": _scenario(p=2, m=4, v=2, recompute="selective"),
}


@pytest.mark.parametrize("name", list(LIKE_CHUNKS))
def test_chunks_of_like_layers_priced_once_have_each_chunks_own_pass_times(name):
    """pipeline_prices prices each set of like chunks once: every chunk's times are still the ones
    _pass_times gives it, to the last bit, in the nominal run and in a draw."""
    from clustersim.simulator.strategies.megatron import _pass_times, pipeline_prices

    s = LIKE_CHUNKS[name]
    for ctx in (build_context(s), build_context(s, None, perturbations(build_context(s), 2)[1])):
        times = pipeline_prices(ctx).times
        assert times == {c.index: tuple(map(float, _pass_times(ctx, c))) for c in ctx.layout.chunks}
        assert len(set(times.values())) > 1  # the first and last chunks (embedding, head) differ
