"""DiLoCo / Streaming DiLoCo (simulator/strategies/diloco.py): the schedule's closed forms, invariants,
the bandwidth it reports, and refusals."""

import pytest
from conftest import make_scenario

from clustersim.cli import app
from clustersim.errors import InputError
from clustersim.simulator import simulate

SLOW = {"cluster.nic.line_rate_gbps": 10, "cluster.nodes": 4}


def diloco(**options):
    opts = {"workers": 2, "inner_steps": 100, "fragments": 4, "overlap_steps": 1, "bits": 4, **options}
    return make_scenario(**SLOW, **{"training.optimizer": "diloco", "training.optimizer_options": opts})


def steps_of(result):
    return {s["label"].split(" (")[0]: s for s in result.extra["steps"]}


def test_inner_step_is_adam_ddp_on_one_worker():
    """An inner step is an Adam step with DDP inside one worker: the same program as Adam on a cluster
    of one worker's nodes."""
    r = simulate(diloco(), uncertainty_samples=0)
    one_worker = make_scenario(**{**SLOW, "cluster.nodes": 2})
    adam = simulate(one_worker, uncertainty_samples=0)
    assert steps_of(r)["inner step"]["iteration_time_s"] == pytest.approx(adam.iteration_time, rel=1e-9)


@pytest.mark.parametrize(("tau", "fragments"), [(0, 4), (1, 4), (5, 4), (1, 8), (3, 24)])
def test_mean_step_is_the_weighted_period(tau, fragments):
    """Per inner step: ((K - n) * inner + window) / K with K = H/P and n = max(tau, 1) steps in the window;
    K need not be whole (8 fragments in H = 100: a sync every 12.5 steps on average)."""
    r = simulate(diloco(overlap_steps=tau, fragments=fragments), uncertainty_samples=0)
    s = steps_of(r)
    k, n = 100 / fragments, max(tau, 1)
    window = s["sync window"]["iteration_time_s"] * n  # the runner reports it per step
    expected = ((k - n) * s["inner step"]["iteration_time_s"] + window) / k
    assert r.iteration_time == pytest.approx(expected, rel=1e-9)


def test_blocking_exchange_is_fully_exposed_at_tau_zero():
    """tau = 0 over a slow inter-worker link: the window is the inner step plus the whole exchange
    (ring closed form: 2(M-1)/M of the fragment's bytes plus 2(M-1) latencies) plus the outer kernels."""
    gbps, lat_ms = 1.0, 30.0
    r = simulate(
        diloco(overlap_steps=0, inter_worker_gbps=gbps, inter_worker_latency_ms=lat_ms), uncertainty_samples=0
    )
    s = steps_of(r)
    fragment_bytes = r.extra["diloco"]["fragment_params"] * 4 / 8
    exchange = 2 * 1 / 2 * fragment_bytes / (gbps * 1e9 / 8) + 2 * 1 * lat_ms / 1e3
    extra = s["sync window"]["iteration_time_s"] - s["inner step"]["iteration_time_s"]
    assert extra >= exchange
    assert extra == pytest.approx(exchange, rel=0.02)  # the outer kernels are milliseconds against seconds


def test_overlap_hides_the_exchange_above_the_reported_bandwidth():
    """The reported hide bandwidth is where the exchange stops costing time: above it the mean step is the
    inner step plus the outer kernels only; well below it the exchange shows."""
    probe = simulate(diloco(overlap_steps=2, inter_worker_gbps=100.0), uncertainty_samples=0)
    hide = probe.extra["diloco"]["hide_bandwidth_gbps"]
    inner = steps_of(probe)["inner step"]["iteration_time_s"]
    fast = simulate(diloco(overlap_steps=2, inter_worker_gbps=hide * 1.05), uncertainty_samples=0)
    slow = simulate(diloco(overlap_steps=2, inter_worker_gbps=hide / 4), uncertainty_samples=0)
    assert fast.iteration_time == pytest.approx(inner, rel=0.01)
    assert slow.iteration_time > fast.iteration_time * 1.05


def test_more_bandwidth_and_more_overlap_are_never_slower():
    times = [
        simulate(diloco(inter_worker_gbps=g, overlap_steps=1), uncertainty_samples=0).iteration_time
        for g in (0.5, 1, 2, 5, 20, 100)
    ]
    assert all(a >= b - 1e-12 for a, b in zip(times, times[1:]))
    by_tau = [simulate(diloco(overlap_steps=t), uncertainty_samples=0).iteration_time for t in (0, 1, 2, 5)]
    assert all(a >= b - 1e-12 for a, b in zip(by_tau, by_tau[1:]))


def test_fewer_bits_and_more_fragments_send_less_per_fragment():
    """Bytes per worker per inner step = 2(M-1)/M * Psi * bits/8 / H, whatever P (P spreads, not saves)."""
    for bits in (4, 8, 16, 32):
        for p in (1, 4):
            r = simulate(diloco(bits=bits, fragments=p, overlap_steps=1), uncertainty_samples=0)
            d = r.extra["diloco"]
            psi = d["fragment_params"] * p
            assert d["bytes_per_worker_per_inner_step"] == pytest.approx(2 * 1 / 2 * psi * bits / 8 / 100)


def test_exchange_on_the_cluster_network_uses_the_nics():
    """Without inter_worker_gbps the exchange runs over the cluster's NICs: its ops carry inter-node bytes
    and low-bit widths go by all-to-all + all-gather."""
    # one inner step per synchronisation: the window is the only (so the recorded) program
    window = simulate(diloco(bits=4, overlap_steps=0, fragments=1, inner_steps=1), uncertainty_samples=0)
    outer = [op for op in window.ops if op.stream == "outer"]
    assert [op.meta.get("op") for op in outer if op.category == "communication"] == [
        "all_to_all",
        "all_gather",
    ]
    assert all(op.inter_node_bytes > 0 for op in outer if op.category == "communication")


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"workers": 3}, "training.optimizer_options.workers"),
        ({"fragments": 8, "inner_steps": 4}, "training.optimizer_options.fragments"),
        ({"fragments": 24, "overlap_steps": 5}, "training.optimizer_options.overlap_steps"),
        ({"fragments": 4, "overlap_steps": 26}, "training.optimizer_options.overlap_steps"),
    ],
)
def test_impossible_schedules_name_their_key(options, key):
    with pytest.raises(InputError) as exc:
        simulate(diloco(**options), uncertainty_samples=0)
    assert exc.value.key == key


def test_cli_refusal_is_one_line(runner, tmp_path):
    f = tmp_path / "d.yaml"
    f.write_text(
        "cluster: {nodes: 4, gpus_per_node: 4, gpu: A100-80GB}\n"
        "workload: {model: BERT-Large, micro_batch: 8, seq_len: 128}\n"
        "training: {optimizer: diloco, optimizer_options: {workers: 3}}\n"
    )
    res = runner.invoke(app, ["run", str(f), "--samples", "0"])
    assert res.exit_code == 2
    assert (
        "workers" in res.output
        and "Traceback" not in res.output
        and len(res.output.strip().splitlines()) == 1
    )


def test_sharded_workers_are_refused_with_the_reason():
    with pytest.raises(InputError) as exc:  # refused where the scenario is read
        diloco().with_changes(**{"training.sharding.stage": 3})
    assert exc.value.key == "training.sharding.stage" and "diloco" in str(exc.value)


def test_the_example_and_its_plain_diloco_variant_both_fit():
    """examples/diloco-two-datacenters.yaml is docs/compressed-optimizers.md's table (micro-batch 3):
    Streaming DiLoCo as shipped, and plain DiLoCo as its comment says (fragments/overlap_steps/bits
    1/0/32), whose whole-model outer gradient must still fit beside the weights."""
    from pathlib import Path

    from clustersim.scenario import load_scenario

    path = Path(__file__).resolve().parents[1] / "examples" / "diloco-two-datacenters.yaml"
    streaming = load_scenario(str(path))
    assert streaming.workload.micro_batch == 3
    plain = {"fragments": 1, "overlap_steps": 0, "bits": 32}
    options = {**streaming.training.optimizer_options, **plain}
    for scenario in (streaming, streaming.with_changes(**{"training.optimizer_options": options})):
        r = simulate(scenario, uncertainty_samples=0)
        assert set(steps_of(r)) == {"inner step", "sync window"}


def _dgx_at_20(optimizer: str, **options):
    from clustersim.scenario import load_scenario

    s = load_scenario("preset:dgx-h100-gpt3-1.3b")
    changes = {"cluster.nodes": 4, "cluster.nic.line_rate_gbps": 20, "workload.micro_batch": 3}
    changes["training.optimizer"] = optimizer
    if options:
        changes["training.optimizer_options"] = options
    return s.with_changes(**changes)


@pytest.mark.parametrize(
    "options",
    [
        {"workers": 2, "inner_steps": 100, "fragments": 1, "overlap_steps": 0, "bits": 32},
        {"workers": 2, "inner_steps": 100, "fragments": 4, "overlap_steps": 1, "bits": 4},
        {"workers": 4, "inner_steps": 100, "fragments": 4, "overlap_steps": 2, "bits": 16},
    ],
)
def test_both_backends_agree_on_diloco_as_on_adam(options):
    """DiLoCo's workers are 2-node groups, whose inner all-reduce NCCL runs as a double binary tree:
    on two nodes each node has one edge per tree and sends S, not 2S (the analytical tree once sent
    2S there: 54% apart). The two backends now agree on DiLoCo as closely as on plain Adam."""
    adam = _dgx_at_20("adam")
    ana, flow = (
        simulate(adam.with_changes(**{"training.network": n}), uncertainty_samples=0)
        for n in ("analytical", "flow")
    )
    assert flow.iteration_time == pytest.approx(ana.iteration_time, rel=0.003)
    s = _dgx_at_20("diloco", **options)
    ana, flow = (
        simulate(s.with_changes(**{"training.network": n}), uncertainty_samples=0)
        for n in ("analytical", "flow")
    )
    assert flow.iteration_time == pytest.approx(ana.iteration_time, rel=0.003)


def test_every_step_overlapping_an_exchange_still_reports_where_it_hides():
    """overlap_steps = H/P: every inner step is in a sync window, yet the exchange can hide behind them.
    The plain inner step is still simulated (with no weight) as the reference, so the note gives the hide
    bandwidth instead of saying it cannot hide, and above that bandwidth the mean step is the inner one."""
    probe = simulate(diloco(overlap_steps=25, inter_worker_gbps=100.0), uncertainty_samples=0)
    s = steps_of(probe)
    assert s["inner step"]["weight"] == 0 and s["sync window"]["weight"] == pytest.approx(1.0)
    hide = probe.extra["diloco"]["hide_bandwidth_gbps"]
    assert hide is not None and hide > 0
    note = next(n for n in probe.notes if n.startswith("diloco:"))
    assert "cannot hide" not in note and f"{hide:.3g} Gb/s" in note
    fast = simulate(diloco(overlap_steps=25, inter_worker_gbps=hide * 1.05), uncertainty_samples=0)
    slow = simulate(diloco(overlap_steps=25, inter_worker_gbps=hide / 2), uncertainty_samples=0)
    # 25 steps back to back in one program (each step's tail under the next one's start) are a little
    # shorter per step than one step alone; the exchange adds nothing to them above ``hide``
    assert fast.iteration_time <= s["inner step"]["iteration_time_s"] * 1.001
    assert fast.iteration_time == pytest.approx(probe.iteration_time, rel=0.01)
    assert slow.iteration_time > fast.iteration_time * 1.05


@pytest.mark.parametrize("tau", [0, 1, 3])
def test_release_during_backward_hides_above_its_reported_bandwidth(tau):
    """outer_release during_backward: the exchange may also use the backward it leaves in (and what
    follows it in that step), so it hides at a lower bandwidth than after_step reports, and above the
    reported bandwidth the mean step is the inner step plus the outer kernels."""
    opts = {"overlap_steps": tau, "inter_worker_gbps": 100.0}
    early = simulate(diloco(outer_release="during_backward", **opts), uncertainty_samples=0)
    hide = early.extra["diloco"]["hide_bandwidth_gbps"]
    if tau:
        late = simulate(diloco(**opts), uncertainty_samples=0).extra["diloco"]["hide_bandwidth_gbps"]
        assert hide < late
    inner = steps_of(early)["inner step"]["iteration_time_s"]
    fast = simulate(
        diloco(outer_release="during_backward", overlap_steps=tau, inter_worker_gbps=hide * 1.05),
        uncertainty_samples=0,
    )
    assert fast.iteration_time == pytest.approx(inner, rel=0.01)


def test_release_during_backward_needs_room_for_its_extra_step():
    with pytest.raises(InputError, match="during_backward"):
        simulate(diloco(outer_release="during_backward", overlap_steps=25), uncertainty_samples=0)


@pytest.mark.parametrize("bits", [4, 32])
def test_release_during_backward_sends_the_whole_fragment_over_the_nics(bits):
    """Over the cluster's own NICs the fragment leaves in per-layer shares (all-to-all, sum and all-gather
    below 16 bits; all-reduce at 16 and 32); their bytes add up to the fragment's, as one exchange after
    the step sends."""
    from clustersim.simulator.context import build_context
    from clustersim.simulator.strategies import registry

    def outer_ops(release):
        s = diloco(bits=bits, outer_release=release)
        cls = registry.get("diloco")
        strategy = cls(build_context(s, None), cls.Options(**s.training.optimizer_options))
        return [op for op in strategy.sync_window().ops if op.stream == "outer" and "bytes" in op.meta]

    late, early = outer_ops("after_step"), outer_ops("during_backward")
    assert len(early) > len(late) > 0  # one exchange per layer's share
    assert sum(op.meta["bytes"] for op in early) == pytest.approx(sum(op.meta["bytes"] for op in late))
