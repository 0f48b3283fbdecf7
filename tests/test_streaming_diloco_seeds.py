"""Streaming DiLoCo's compute-utilization simulation (Douillard et al. 2025, arXiv:2501.18512, Table 4) as
the seeds dataset predicts it: preset:streaming-diloco-1b, the ``compute_utilization`` metric, and the
schedule's closed form where the fragments do not divide H (8 fragments in H = 100)."""

from __future__ import annotations

import pytest

from clustersim.api import load_scenario
from clustersim.simulator import simulate
from clustersim.validation.published import compute_utilization, load_dataset, validate

GBPS = "training.optimizer_options.inter_worker_gbps"


def _at(gbps: float):
    return load_scenario("preset:streaming-diloco-1b").with_changes(**{GBPS: gbps})


def _steps(result):
    return {s["label"].split(" (")[0]: s for s in result.extra["steps"]}


def test_the_papers_step_time_is_the_forward_and_backward():
    """The paper's 0.1 s of pure compute per step (Table 4), split 1:2 as Kaplan's 2N:4N FLOPs."""
    r = simulate(_at(1.0), uncertainty_samples=0)
    assert r.breakdown["forward"] + r.breakdown["backward"] == pytest.approx(0.1, rel=1e-4)
    assert r.breakdown["backward"] == pytest.approx(2 * r.breakdown["forward"], rel=1e-4)


def test_a_slow_link_exposes_the_fragments_exchange_less_what_it_overlaps():
    """Closed form at 0.4 Gbit/s: a fragment is 1e9/8 parameters in 4 bits (0.5 Gbit), 1.25 s over the
    2-worker ring (2(M-1)/M = 1 of its bytes per worker), far longer than the steps it overlaps. The
    paper's simulation releases the outer gradient during the backward (outer_release: during_backward):
    the first share leaves after the forward (1/3 of 0.1 s) and the last layer's backward (1/24 of the
    other 2/3), the link then stays busy to the end, and the outer step follows at once (the simulation's
    step is compute only: the outer kernels take no time). The window covers the releasing step and the
    tau = 1 overlapped one, and a sync comes every H/P = 12.5 inner steps, so the mean step is
    ((12.5 - 2) inner + window) / 12.5."""
    r = simulate(_at(0.4), uncertainty_samples=0)
    s = _steps(r)
    inner = s["inner step"]["iteration_time_s"]
    assert inner == pytest.approx(0.1, rel=1e-5)  # forward + backward, nothing else
    exchange = 1e9 / 8 * 4 / 0.4e9
    window = 2 * s["sync window"]["iteration_time_s"]  # per step over the two steps it covers
    first_release = 0.1 / 3 + 0.2 / 3 / 24
    assert window == pytest.approx(first_release + exchange, rel=1e-5)
    assert r.iteration_time == pytest.approx(((12.5 - 2) * inner + window) / 12.5, rel=1e-9)


# The DiLoCo bandwidth simulator on the first author's site (arthurdouillard.com/diloco, the page's
# simulateStreamingDiLoCo and simulateDP, run with N = 1e9, T_step = 0.1 s, M = 2, H = 100, P = 8,
# tau = 1, fp4 outer gradients, bf16 gradients for Data-Parallel; K = 128 buckets, alpha = 0): its
# compute utilization (%) at each of Table 4's bandwidths, and Data-Parallel's step at 1 Gbit/s over its
# step at +inf. Its buckets leave 1/128 of the backward apart, the preset's shares one layer (1/24) apart,
# so the first leaves 2.3 ms later here: within 0.3 points and 0.1%.
PUBLIC_SIMULATOR_CU = {0.4: 53.56, 0.9: 76.25, 1.7: 90.71, 2.0: 93.71, 3.0: 99.96}
PUBLIC_SIMULATOR_DP_SLOWDOWN = 160.339
PUBLIC_SIMULATOR_STREAMING_SLOWDOWN = 1.2671


@pytest.mark.parametrize("gbps", sorted(PUBLIC_SIMULATOR_CU))
def test_the_utilization_is_the_papers_simulators(gbps):
    """The first author's simulator counts a step as its compute (T_fwd + T_bwd) and a sync's stall as
    the time its fragment's last bucket arrives after the deadline (tau + 1 steps after the releasing
    step began); the preset with its compute_only profile reproduces it."""
    r = simulate(_at(gbps), uncertainty_samples=0)
    assert 100 * compute_utilization(r) == pytest.approx(PUBLIC_SIMULATOR_CU[gbps], abs=0.3)


def test_releasing_during_backward_never_loses_to_releasing_after_the_step():
    """The same exchange started earlier (during the backward rather than after the update) exposes no
    more time at any bandwidth, and less wherever the link is the bottleneck."""
    after = "training.optimizer_options.outer_release"
    for gbps in (0.4, 1.7, 3.0):
        early = simulate(_at(gbps), uncertainty_samples=0)
        late = simulate(_at(gbps).with_changes(**{after: "after_step"}), uncertainty_samples=0)
        assert early.iteration_time < late.iteration_time
        assert compute_utilization(early) > compute_utilization(late)


def test_utilization_is_the_busy_share_and_bandwidth_never_lowers_it():
    values = []
    for gbps in (0.2, 0.4, 0.9, 1.7, 3.0, 10.0, 1000.0):
        r = simulate(_at(gbps), uncertainty_samples=0)
        busy = sum(r.breakdown[k] for k in ("forward", "backward", "compression", "optimizer", "other"))
        assert compute_utilization(r) == pytest.approx(busy / r.iteration_time, rel=1e-12)
        values.append(compute_utilization(r))
    assert values == sorted(values)
    assert 0 < values[0] < values[-1] <= 1
    assert values[-1] == pytest.approx(1.0, abs=1e-3)  # the exchange hides behind its step


def test_seeds_streaming_rows_are_the_presets_utilization_at_their_bandwidth():
    data = load_dataset("seeds")
    rows = [
        r
        for r in data.rows
        if r.scenario == "preset:streaming-diloco-1b" and r.metric == "compute_utilization"
    ]
    assert [r.published for r in rows] == [0.5, 0.8, 0.9, 0.95, 0.99]
    got = {r.label: r for r in validate("seeds", samples=0).rows}
    for row in rows:
        gbps = row.changes["training.optimizer_options"]["inter_worker_gbps"]
        expected = compute_utilization(simulate(_at(gbps), uncertainty_samples=0))
        assert got[row.label].predicted == pytest.approx(expected, rel=1e-12)


def test_the_utilization_band_is_the_point():
    """The simulation is deterministic: its step is stated (exact) and compute only, and the workers' own
    link (inter_worker_gbps) is an ideal pipe, so no draw moves the utilization."""
    from clustersim.validation.published import _utilization_band

    s = _at(0.9)
    lo, hi = _utilization_band(s, None, 16)
    point = compute_utilization(simulate(s, uncertainty_samples=0))
    assert lo == pytest.approx(point, rel=1e-9) and hi == pytest.approx(point, rel=1e-9)


def test_table_1_rows_are_the_slowdown_of_a_1_gbit_link_against_an_unlimited_one():
    """Table 1's hours at 1 Gbit/s over hours at +inf: the ratio of the step at 1 Gbit/s to the step with
    nothing to wait for (the paper's 0.1 s of compute), for Streaming DiLoCo (the workers' own link) and
    Data-Parallel (each worker's NIC, at its full line rate as the simulator's ideal link)."""
    got = {r.label: r for r in validate("seeds", samples=0).rows}
    streaming = next(v for k, v in got.items() if k.startswith("Streaming DiLoCo (FP4, tau 1), 1B: hours"))
    slow = simulate(_at(1.0), uncertainty_samples=0).iteration_time
    fast = simulate(_at(10000.0), uncertainty_samples=0).iteration_time
    assert fast == pytest.approx(0.1, rel=1e-5)
    assert streaming.predicted == pytest.approx(slow / fast, rel=1e-9)
    assert streaming.predicted == pytest.approx(PUBLIC_SIMULATOR_STREAMING_SLOWDOWN, rel=0.003)
    dp = next(v for k, v in got.items() if k.startswith("Data-Parallel, 1B"))
    # bf16 gradients of 1e9 parameters, 2 (M-1)/M of them through a 1 Gb/s link: 16 s, the first layer's
    # bucket leaving after the forward and one layer's backward, against 0.1 s steps
    closed_form = (0.1 / 3 + 0.2 / 3 / 24 + 1e9 * 2 * 8 / 1e9) / 0.1
    assert dp.predicted == pytest.approx(closed_form, rel=1e-3)
    assert dp.predicted == pytest.approx(PUBLIC_SIMULATOR_DP_SLOWDOWN, rel=1e-3)


def test_the_papers_stated_step_time_is_not_drawn():
    """The profile marks the paper's 0.1 s step as stated (a simulation's assumption, not a measurement)
    and compute only (the simulation prices nothing else): every draw keeps forward and backward at it
    and the update, outer and compression kernels at zero."""
    from clustersim.simulator.context import build_context
    from clustersim.simulator.uncertainty import compute_band_source, perturbations

    s = _at(0.9)
    ctx = build_context(s, None)
    assert ctx.phases is not None and ctx.phases.stated and ctx.phases.compute_only
    assert "compute_only" in compute_band_source(ctx)
    for p in perturbations(ctx, 8):
        r = simulate(s, perturbation=p)
        assert r.breakdown["forward"] + r.breakdown["backward"] == pytest.approx(0.1, rel=1e-4)
        assert r.breakdown.get("optimizer", 0.0) == 0.0
        assert r.breakdown.get("compression", 0.0) == 0.0


def test_without_compute_only_the_device_prices_the_update():
    """The same stated step without compute_only: the H100 stand-in's fused Adam over 1e9 parameters
    (28 bytes each) is priced, so the flag is what removes it."""
    from clustersim.calibration.profile import load_profile

    prof = load_profile("builtin:streaming-diloco-simulation")
    phases = prof.compute_phases[0].model_copy(update={"compute_only": False})
    plain = prof.model_copy(update={"compute_phases": [phases]})
    r = simulate(_at(10000.0), plain, uncertainty_samples=0)
    assert r.breakdown["optimizer"] > 0.005
    assert r.iteration_time > 0.1 + r.breakdown["optimizer"] * 0.99
