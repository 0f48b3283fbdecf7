"""Intervals and break-even bandwidth: every prediction carries its P10-P90, computed honestly."""

import json

import pytest

from clustersim.cli import app
from clustersim.planner.breakeven import Run, _at, break_even, effective_at
from clustersim.planner.compare import scenario_for_optimizer
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate
from clustersim.simulator.uncertainty import DEFAULT_COMPUTE_SIGMA, Interval


def test_run_json_has_an_interval_around_the_prediction(runner):
    res = runner.invoke(app, ["run", "preset:dgx-h100-gpt3-1.3b", "--json", "--samples", "24"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    iv = data["iteration_time_interval_s"]
    assert iv["samples"] == 24
    assert iv["p10"] < data["iteration_time_s"] < iv["p90"]
    sps = data["samples_per_s_interval"]
    assert sps["p10"] < data["samples_per_s"] < sps["p90"]


def test_band_width_follows_the_documented_default_compute_width():
    """A single GPU: only compute is uncertain, and everything in its step runs on the device (forward,
    backward, the optimizer's update), so the band is the whole step times the lognormal's P10-P90 of
    DEFAULT_COMPUTE_SIGMA (not wider, not narrower)."""
    s = load_scenario("preset:dgx-h100-gpt3-1.3b").with_world_size(1)
    r = simulate(s, None, uncertainty_samples=200)
    import math

    assert r.interval.p10 == pytest.approx(
        r.iteration_time * math.exp(-1.2816 * DEFAULT_COMPUTE_SIGMA), rel=0.01
    )
    assert r.interval.p90 == pytest.approx(
        r.iteration_time * math.exp(1.2816 * DEFAULT_COMPUTE_SIGMA), rel=0.01
    )


def test_the_default_draws_give_the_band_of_256_draws():
    """Stable bands: the P10 and P90 at the default draws move < 3% against 256 draws, for a step's band
    and for a paired speedup's (the same Sobol points and estimator at both counts)."""
    from clustersim.planner.compare import paired_band
    from clustersim.simulator.uncertainty import DEFAULT_SAMPLES

    s = load_scenario("preset:default")
    few = simulate(s, None, uncertainty_samples=DEFAULT_SAMPLES).interval
    many = simulate(s, None, uncertainty_samples=256).interval
    assert few.p10 == pytest.approx(many.p10, rel=0.03) and few.p90 == pytest.approx(many.p90, rel=0.03)
    e = load_scenario("preset:onebit-adam-ethernet").with_world_size(64)
    base, comp = scenario_for_optimizer(e, "adam", None), scenario_for_optimizer(e, "onebit-adam", None)
    few, many = (paired_band(base, comp, None, n)["speedup"] for n in (DEFAULT_SAMPLES, 256))
    assert few == pytest.approx(many, rel=0.03)


def test_every_command_defaults_to_the_same_draws():
    """The same inputs print the same band everywhere: one default draw count."""
    import inspect

    from clustersim import api
    from clustersim.planner import breakeven, planning
    from clustersim.simulator.uncertainty import DEFAULT_SAMPLES
    from clustersim.sweeps.spec import SweepFile
    from clustersim.validation import published

    defaults = {
        "api": api.DEFAULT_SAMPLES,
        "sweep file": SweepFile.model_fields["samples"].default,
        "break-even": inspect.signature(breakeven.break_even).parameters["samples"].default,
        "compare's": inspect.signature(breakeven.break_evens_or_reason).parameters["samples"].default,
        "plan": inspect.signature(planning.plan).parameters["samples"].default,
        "validate": inspect.signature(published.validate).parameters["samples"].default,
    }
    for name, cmd in [("run", "run"), ("compare", "compare"), ("plan", "plan"), ("validate", "validate")]:
        from typer.main import get_command

        from clustersim.cli import app

        params = {p.name: p for p in get_command(app).commands[cmd].params}
        defaults[name + " --samples"] = params["samples"].default
    assert set(defaults.values()) == {DEFAULT_SAMPLES}, defaults


def test_the_band_is_read_from_the_draws_log_moments():
    """Interval.of: a lognormal's P10-P90 from the draws' log-mean and log-spread."""
    import math

    import numpy as np

    from clustersim.simulator.uncertainty import quasi_normals

    z = quasi_normals(32, 3)
    assert z.shape == (32, 3) and np.array_equal(z, quasi_normals(32, 3))  # fixed seed: the same draws
    iv = Interval.of(np.exp(DEFAULT_COMPUTE_SIGMA * z[:, 0]))
    assert iv.p10 == pytest.approx(math.exp(-1.2816 * DEFAULT_COMPUTE_SIGMA), rel=0.02)
    assert iv.p90 == pytest.approx(math.exp(1.2816 * DEFAULT_COMPUTE_SIGMA), rel=0.02)


@pytest.mark.parametrize(
    "preset, optimizer",
    [("preset:onebit-adam-ethernet", "onebit-adam"), ("preset:binsgdm-bert-base", "binsgdm")],
)
def test_a_draws_compute_factor_scales_every_kernel_on_the_device(preset, optimizer):
    """A draw that finds the device slower runs all of its work slower: forward, backward, and the
    optimizer and compression kernels alike (one factor, simulator/uncertainty.py)."""
    from clustersim.simulator.context import Perturbation, network_params

    s = scenario_for_optimizer(load_scenario(preset), optimizer, None)
    net = network_params(None)
    one = simulate(s, None, perturbation=Perturbation(net, 1.0)).breakdown
    two = simulate(s, None, perturbation=Perturbation(net, 2.0)).breakdown
    for part in ("forward", "backward", "compression", "optimizer"):
        assert one[part] > 0, part
        assert two[part] == pytest.approx(2 * one[part], rel=0.01), part


def test_samples_zero_turns_the_band_off(runner):
    res = runner.invoke(app, ["run", "preset:default", "--json", "--samples", "0"])
    assert "iteration_time_interval_s" not in json.loads(res.stdout)


def test_collective_reports_interval_and_source(runner):
    res = runner.invoke(
        app, ["collective", "preset:default", "--op", "all_to_all", "--bytes", "8MiB", "--json"]
    )
    data = json.loads(res.stdout)
    assert data["time_interval_s"]["p10"] < data["time_s"] < data["time_interval_s"]["p90"]
    assert data["source"] == "topology model, default constants"


def test_group_inter_on_one_node_is_an_error(runner):
    res = runner.invoke(app, ["collective", "preset:offload-llama7b-h100", "--group", "inter"])
    assert res.exit_code == 2 and "--group" in res.output


def test_validate_reports_coverage(runner):
    res = runner.invoke(app, ["validate", "--json", "--samples", "8"])
    data = json.loads(res.stdout)
    assert 0.0 <= data["p10_p90_coverage"] <= 1.0
    assert all(r["p10"] <= r["predicted"] <= r["p90"] for r in data["rows"])


def _pair(preset, optimizer, baseline="adam"):
    s = load_scenario(preset)
    extra = {"stage": "compression"} if optimizer == "onebit-adam" else {}
    return scenario_for_optimizer(s, optimizer, None, **extra), scenario_for_optimizer(s, baseline, None)


def test_break_even_is_where_the_two_whole_runs_cross():
    """The line rate per NIC where the whole runs take equally long: 1-bit Adam's warm-up stage runs at
    its own speed for its fraction of the steps, so a faster NIC below it trains sooner, above it later."""
    comp, base = _pair("preset:onebit-adam-infiniband", "onebit-adam")
    be = break_even(comp, base, samples=4, steps=1000, warmup=0.2)
    assert be.verdict == "crossing" and be.warmup == 0.2 and be.steps == be.baseline_steps == 1000
    below, above = be.gbps / 1.1, be.gbps * 1.1
    runs = Run(comp, 1000, 0.2), Run(base, 1000)
    assert runs[0].time(below, None, None) < runs[1].time(below, None, None)
    assert runs[0].time(above, None, None) > runs[1].time(above, None, None)
    assert be.interval.p10 <= be.gbps <= be.interval.p90
    # what each NIC delivers at that line rate, the labelled extra: the kind's protocol efficiency
    assert be.effective_gbps < be.gbps and "line rate per NIC" in be.describe()
    assert be.describe().startswith("onebit-adam vs adam") and "effective" in be.describe()
    # the whole run, not the compression stage's step: a longer warm-up at Adam's speed lowers it
    assert break_even(comp, base, samples=0, steps=1000, warmup=0.5).gbps < be.gbps
    # more steps for the compressed optimizer (slower convergence) lower it too
    assert break_even(comp, base, samples=0, steps=1200, baseline_steps=1000, warmup=0.2).gbps < be.gbps


def test_break_even_keeps_a_measured_nic_efficiency():
    comp, base = _pair("preset:onebit-adam-infiniband", "onebit-adam")
    line = comp.cluster.nic.line_rate_gbps
    measured = [s.with_changes(**{"cluster.nic.effective_gbps": line / 2}) for s in (comp, base)]
    be = break_even(*measured, samples=0)
    assert be.effective_gbps == pytest.approx(be.gbps / 2)
    assert _at(measured[0], 10.0).cluster.nic.effective_gbps == pytest.approx(5.0)


def test_break_even_verdicts_without_a_crossing():
    comp, base = _pair("preset:default", "onebit-adam")  # PCIe V100 nodes: compression wins at any NIC speed
    be = break_even(comp, base, samples=0)
    assert be.verdict == "always faster"
    # why no line rate lets Adam catch up: past the line rate whose effective rate fills the NIC's PCIe
    # link (the V100's Gen3, 12 GB/s), the link, not the NIC, sets what it delivers; the text says so
    line, gen = be.host_link
    assert gen == 3 and effective_at(comp, line) == pytest.approx(12.0 * 8)
    assert f"PCIe Gen{gen}" in be.describe() and be.to_dict()["pcie_limit_line_rate_gbps"] == line
    for side in (Run(comp), Run(base)):
        at_twice, at_eight = (side.time(k * line, None, None) for k in (2, 8))
        assert at_eight == pytest.approx(at_twice, rel=1e-9), (
            "a NIC past its PCIe link's rate changes nothing"
        )
    assert Run(comp).time(line / 2, None, None) > Run(comp).time(line, None, None)
    comp1, base1 = comp.with_world_size(4), base.with_world_size(4)
    assert break_even(comp1, base1, samples=0).verdict == "single node"


def test_break_even_of_two_level_runs_says_level_not_faster():
    """The same run on both sides (or two within LEVEL of each other) is level: no break-even, and the
    text never calls one faster or slower; an end that is level is said as level."""
    from clustersim.planner.breakeven import BreakEven

    comp, base = _pair("preset:default", "adam")
    be = break_even(comp, base, samples=0)
    assert be.verdict == "level" and be.gbps is None and be.speedups == (1.0, 1.0)
    text = be.describe()
    assert "level" in text and "faster" not in text and "slower" not in text
    assert be.to_dict()["speedups_at_search_ends"] == [1.0, 1.0]
    top_level = BreakEven("diloco", "adam", None, "always faster", speedups=(1.2, 1.001))
    assert "never slower" in top_level.describe() and "1.20x at 0.1 Gb/s, level at 10,000 Gb/s" in (
        top_level.describe()
    )
    assert " faster " not in top_level.describe()


def test_interval_of_quantiles():
    """Positive draws: the lognormal's quantiles from the log moments; others: Hazen's empirical ones."""
    import math

    iv = Interval.of([1.0, math.e**2])
    expected = (math.exp(1 - 1.2816), math.e, math.exp(1 + 1.2816))
    assert (iv.p10, iv.p50, iv.p90) == pytest.approx(expected, 1e-4)
    iv = Interval.of(list(range(0, 101)))  # a zero: not a lognormal
    assert (iv.p10, iv.p50, iv.p90) == pytest.approx((9.6, 50.0, 90.4)) and iv.contains(50)
    assert not iv.contains(95)


def test_a_profile_for_another_chip_is_refused_and_a_form_factor_noted(runner):
    res = runner.invoke(app, ["run", "preset:default", "--profile", "builtin:cpu-2core-gloo"])
    assert res.exit_code == 2
    assert "builtin:cpu-2core-gloo" in res.output and "device" in res.output and "Traceback" not in res.output
    s = load_scenario("preset:default").with_changes(
        **{"cluster.gpu": "V100-SXM2", "cluster.intra_node.fabric": "nvlink_mesh"}
    )
    r = simulate(s, "builtin:v100-bert-large-published")
    assert any("same V100 chip" in n for n in r.notes)


def test_gloo_broadcast_tree_critical_path():
    from clustersim.cost_models.collective_algorithms import concurrent_binomial_depth

    # 2^d ranks: d(d+1)/2 transfers on the critical path (gloo/broadcast.cc posts all sends at once)
    assert [concurrent_binomial_depth(2**d) for d in range(1, 7)] == [d * (d + 1) // 2 for d in range(1, 7)]
    assert concurrent_binomial_depth(3) == 2 and concurrent_binomial_depth(5) == 4


def test_report_bands_indistinguishable_and_break_even_from_rows():
    from clustersim.report.analysis import break_evens, enrich, indistinguishable, recommendation

    def row(opt, gbps, t, lo, hi):
        return {
            "status": "ok",
            "optimizer": opt,
            "world_size": 64,
            "nodes": 8,
            "gpus_per_node": 8,
            "gpu": "A100-80GB",
            "nic_kind": "infiniband",
            "nic_gbps": gbps,
            "nic_effective_gbps": None,
            "iteration_time_s": t,
            "iteration_time_p10_s": lo,
            "iteration_time_p90_s": hi,
        }

    rows = [
        row("adam", 10.0, 2.0, 1.8, 2.2),
        row("onebit-adam", 10.0, 1.0, 0.9, 1.1),
        row("adam", 100.0, 1.0, 0.9, 1.1),
        row("onebit-adam", 100.0, 1.05, 0.95, 1.15),
    ]
    ok = enrich(rows, 1000, 1.0, warmup=0.0, network=None)
    by = {(r["optimizer"], r["nic_gbps"]): r for r in ok}
    assert "speedup_p10" not in by[("onebit-adam", 10.0)]  # no band from two unpaired rows (add_paired_bands)
    assert not indistinguishable(by[("onebit-adam", 10.0)], by[("adam", 10.0)])
    assert indistinguishable(by[("onebit-adam", 100.0)], by[("adam", 100.0)])
    by[("onebit-adam", 100.0)]["speedup_p10"], by[("onebit-adam", 100.0)]["speedup_p90"] = 1.02, 1.08
    assert not indistinguishable(by[("onebit-adam", 100.0)], by[("adam", 100.0)])  # the paired band decides
    line = break_evens(ok)["onebit-adam"]  # rows without scenarios: interpolated, said as "about"
    cross = float(line.split("below about ")[1].split(" Gb/s")[0])
    assert 10 < cross < 100 and "(at 64 GPUs)" in line and "line rate per NIC" in line
    text = " ".join(recommendation(ok)["text"])
    assert "P10–P90" in text


def test_sweep_with_a_profile_for_another_chip_says_why_rows_did_not_run(runner, tmp_path):
    out = tmp_path / "sw"
    res = runner.invoke(
        app,
        [
            "sweep",
            "examples/sweep-networks.yaml",
            "--profile",
            "builtin:cpu-2core-gloo",
            "--out",
            str(out),
            "--samples",
            "0",
        ],
    )
    # every row failed: said with its reason, and not a success (exit 1)
    assert res.exit_code == 1, res.output
    assert "could not be simulated" in res.output and "another chip" in res.output
    assert "error: none of the 48 rows could be simulated" in res.output


def test_a_draw_moves_a_measured_other_phase_with_forward_and_backward():
    """The paper's profile measured forward, backward and the rest of the step ("other": loss scaling,
    data, bookkeeping, 57-76 ms) in the same runs; a draw that finds the device slower finds all of
    them slower. On one GPU nothing else is in the step, so a draw's compute factor scales it whole."""
    from clustersim.simulator.context import Perturbation, network_params

    s = scenario_for_optimizer(load_scenario("preset:onebit-adam-ethernet"), "adam", None).with_world_size(1)
    net = network_params(None)
    one = simulate(s, None, perturbation=Perturbation(net, 1.0))
    slow = simulate(s, None, perturbation=Perturbation(net, 1.25))
    assert one.breakdown["other"] > 0.3 * one.iteration_time  # the measured phase is a large part
    assert slow.breakdown["other"] == pytest.approx(1.25 * one.breakdown["other"], rel=1e-9)
    assert slow.iteration_time == pytest.approx(1.25 * one.iteration_time, rel=1e-9)


def test_a_stated_step_keeps_its_other_phase_in_every_draw():
    """Stated phases (a paper's assumed step, not a measurement) are exact: no draw moves them; the
    same phases as a measurement move with the draw."""
    from clustersim.calibration.profile import load_profile
    from clustersim.simulator.context import Perturbation, build_context, network_params

    measured = load_profile("builtin:v100-bert-large-published")
    phases = measured.compute_phases[0]
    stated = measured.model_copy(update={"compute_phases": [phases.model_copy(update={"stated": True})]})
    s = scenario_for_optimizer(load_scenario("preset:onebit-adam-ethernet"), "adam", None).with_world_size(1)
    draw = Perturbation(network_params(None), 1.5)
    assert build_context(s, stated, draw).measured_other() == phases.other_s
    assert build_context(s, measured, draw).measured_other() == pytest.approx(1.5 * phases.other_s)


def test_a_pcie_limited_nic_is_not_said_to_keep_a_gap_the_runs_close():
    """Where the speedup at the search's top is level (the two runs meet), the PCIe clause ("a faster NIC
    does not close the gap") would contradict the margins printed beside it: it is left out."""
    from clustersim.planner.breakeven import LEVEL, SEARCH_GBPS, BreakEven

    common = dict(
        optimizer="binsgdm", baseline="adam", gbps=None, verdict="always faster", host_link=(213.0, 4)
    )
    open_gap = BreakEven(**common, speedups=(16.6, 1.3))
    closed = BreakEven(**common, speedups=(16.6, 1.0 + LEVEL / 2))
    assert "does not close the gap" in open_gap.describe()
    assert "does not close the gap" not in closed.describe()
    assert f"level at {SEARCH_GBPS[1]:,.0f} Gb/s" in closed.describe() and "never slower" in closed.describe()


def test_paired_draws_move_each_scenarios_network_by_its_own_spread():
    """paired_times gives every scenario the same normals through its own context: a scenario on another
    NIC kind (TCP Ethernet against InfiniBand) is banded by its links' spread, not by the first
    scenario's, and a scenario on the same cluster gets exactly the first scenario's draws."""
    from clustersim.simulator.runner import paired_times

    ib = load_scenario("preset:dgx-h100-gpt3-1.3b").with_changes(**{"cluster.nodes": 2})
    tcp = ib.with_changes(**{"cluster.nic": {"kind": "ethernet_tcp", "count": 1, "line_rate_gbps": 25}})
    paired = paired_times([ib, tcp, ib], None, 8)
    alone = paired_times([tcp], None, 8)
    assert list(paired[1]) == list(alone[0])
    assert list(paired[0]) == list(paired[2])


def test_a_break_even_band_puts_draws_that_never_cross_at_no_line_rate():
    """A draw whose compressed run is faster at every line rate (a NIC's PCIe link caps what any faster
    NIC delivers) has no break-even: it is not clamped to a made-up rate and fitted through, the band's
    quantiles that fall among such draws have none, and the text and JSON say in how many draws."""
    import math

    from clustersim.planner.breakeven import BreakEven, _censored_interval

    crossing = [10.0, 20.0, 30.0, 40.0]
    iv, uncrossed = _censored_interval(crossing)
    assert uncrossed == (0, 0) and iv.p10 < 20.0 and iv.p90 > 30.0  # the lognormal fit, as before
    # 10 draws, 3 faster at every rate: Hazen's P90 sits at 8.5 of 10 sorted, among them
    iv, uncrossed = _censored_interval([float(x) for x in range(1, 8)] + [math.inf] * 3)
    assert uncrossed == (0, 3) and iv.p10 == pytest.approx(1.5) and math.isinf(iv.p90)
    assert iv.p50 == pytest.approx(5.5)  # between the 5th and 6th draws, both crossing
    # 10 draws, 1 slower at every rate: the P10 (position 0.5) sits next to it
    iv, uncrossed = _censored_interval([0.0] + [float(x) for x in range(1, 10)])
    assert uncrossed == (1, 0) and iv.p10 == 0.0 and iv.p90 == pytest.approx(8.5)
    be = BreakEven("binsgdm", "adam", 190.0, "crossing", interval=iv, uncrossed_draws=(1, 0))
    assert "P10 none, P90 8.50: slower at every line rate in 1 of 10 draws" in be.describe()
    assert be.to_dict()["interval_gbps"]["p10"] is None and be.to_dict()["draws_slower_at_every_rate"] == 1
    json.dumps(be.to_dict())


def test_break_even_draws_past_the_pcie_cap_are_counted_not_clamped():
    """BinSGDM over Adam on A100 nodes with 2 x 100 Gb/s NICs crosses near the rate where the NICs' PCIe
    Gen4 link caps delivery: draws whose crossing would lie past it never cross. Each such draw is faster
    at every rate, checked at the search's top, and the band says so instead of quoting 16x the nominal."""
    import math

    from clustersim.planner.breakeven import SEARCH_GBPS, _draw
    from clustersim.scenario import validate_scenario

    s = validate_scenario(
        {
            "name": "a100-2x100",
            "cluster": {
                "nodes": 8,
                "gpus_per_node": 8,
                "gpu": "A100-80GB",
                "intra_node": {"fabric": "nvswitch"},
                "nic": {"kind": "infiniband", "count": 2, "line_rate_gbps": 100},
            },
            "workload": {"model": "BERT-Large", "micro_batch": 16, "gradient_accumulation": 4},
            "training": {"optimizer": "adam"},
        },
        "test",
    )
    comp, base = scenario_for_optimizer(s, "binsgdm", None), scenario_for_optimizer(s, "adam", None)
    be = break_even(comp, base, samples=8)
    assert be.verdict == "crossing"
    slower, faster = be.uncrossed_draws
    finite = [x for x in (be.interval.p10, be.interval.p50, be.interval.p90) if not math.isinf(x)]
    assert all(x < 16 * be.gbps for x in finite)
    assert faster > 0 and slower == 0  # the seeded draws: half of them past the cap
    assert math.isinf(be.interval.p90) and f"faster at every line rate in {faster} of 8" in be.describe()
    assert be.host_link is not None and "PCIe Gen4" in be.describe()
    said = be.to_dict()
    assert said["interval_gbps"]["p90"] is None and said["draws_faster_at_every_rate"] == faster
    # a draw of no perturbation is the nominal crossing; a rate past the search's top is never returned
    d = _draw(Run(comp), Run(base), None, None, be.gbps)
    assert d == pytest.approx(be.gbps, rel=1e-2) and d < SEARCH_GBPS[1]


def test_run_says_how_wide_the_network_band_is_and_why():
    """The band's network part by link class, at the documented default widths (network_params.
    DEFAULT_SIGMA: 0.20 for a network link, 0.10 inside a node, 0.5 for a hop's latency), and why a
    measured effective rate keeps the network's width; nothing for one GPU."""
    from clustersim.simulator.uncertainty import network_band_source

    result = simulate(load_scenario("preset:default"))
    said = result.sources["network band"]
    assert said.startswith("pcie rate -12%/+14%, net_ethernet_tcp rate -23%/+29%, per-hop latency -47%/+90%")
    assert "a measured effective_gbps keeps" in said
    one_node = simulate(load_scenario("preset:dgx-h100-gpt3-1.3b").with_changes(**{"cluster.nodes": 1}))
    assert "net_" not in one_node.sources["network band"]  # no NIC in one node's collectives
    one_gpu = simulate(load_scenario("preset:dgx-h100-gpt3-1.3b").with_world_size(1))
    assert "network band" not in one_gpu.sources
    from clustersim.simulator.context import build_context

    assert network_band_source(build_context(load_scenario("preset:default").with_world_size(1))) is None
