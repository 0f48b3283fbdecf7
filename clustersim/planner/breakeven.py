"""Break-even bandwidth: the NIC line rate below which a compressed optimizer trains faster than its baseline.

One definition, used by ``compare``, ``report``, ``plan`` and the API alike: the **line rate per NIC**
(``cluster.nic.line_rate_gbps``, what a NIC is sold as) at which the **whole run** of the compressed
optimizer (its steps, 1-bit Adam's warm-up stage at its own speed, 0/1 Adam's schedule fitted to its
steps) takes as long as the baseline's whole run (its steps). Below it compression wins, above it loses.
It is found by bisection on log(line rate) of ``T_compressed(b) / T_baseline(b) - 1``, each side a full
simulation. A scenario whose NIC has a measured ``effective_gbps`` keeps its measured efficiency
(effective / line rate) at every line rate tried; otherwise the kind's protocol efficiency applies
(catalogs hardware defaults). What each NIC then delivers (``effective_gbps``, what iperf or
ib_write_bw would measure) is given beside it as a labelled extra, never instead of it.

Its interval pairs the two simulations under the same parameter draw (simulator/uncertainty.py):
both optimizers run on the same hardware, so what is uncertain about the hardware moves both, and
only what differs between them (compression kernels vs bytes) widens b*.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clustersim.catalog import gpu as catalog_gpu
from clustersim.catalog import hardware_defaults, nic_line_rate_at_least
from clustersim.errors import InputError
from clustersim.planner.compare import (
    StepsPlan,
    choose_baseline,
    fit_micro_batch,
    is_uncompressed,
    mean_step_time,
    scenario_for_optimizer,
    split_global_batch,
    warmup_fraction,
)
from clustersim.scenario import Scenario
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.simulator.strategies import registry
from clustersim.simulator.uncertainty import DEFAULT_SAMPLES, Interval, perturbations

# 100 Mb/s .. 10 Tb/s line rate per NIC: beyond any NIC sold, and within the scenario's limits at any
# efficiency down to 10% (limits.link_gbps_min 0.01 Gb/s delivered, nic_line_rate_gbps 10,000)
SEARCH_GBPS = (0.1, 10_000.0)
# Bisection stops when the bracket is this narrow in log(bandwidth): 0.02%, so that two callers that
# start from different brackets (compare's whole range, report's swept rates) agree far inside 1%.
TOLERANCE = 2e-4
SAMPLE_TOLERANCE = 5e-3  # per parameter draw: 0.5%, far inside a band's width
# Two whole runs within 0.5% of each other are level: the speedup compare prints (two decimals) reads
# 1.00x, and the difference is far inside either's P10-P90 band, so "faster" would claim what is not there
LEVEL = 5e-3


@dataclass(frozen=True)
class BreakEven:
    """``gbps``: line rate per NIC (None: no crossing in SEARCH_GBPS, see ``verdict``);
    ``effective_gbps``: what each NIC delivers at that line rate. ``steps`` / ``baseline_steps`` and
    ``warmup``: the run it holds for (None steps: the same count for both)."""

    optimizer: str
    baseline: str
    gbps: float | None
    verdict: str  # "crossing" | "always faster" | "never faster" | "level" | "single node"
    interval: Interval | None = None
    effective_gbps: float | None = None
    steps: int | None = None
    baseline_steps: int | None = None
    warmup: float | None = None
    gpus: int | None = None
    # without a crossing: the speedup (baseline time / compressed time) at the search's lowest and highest
    # line rates (SEARCH_GBPS), so that a verdict says by how much, and "level" where it is within LEVEL
    speedups: tuple[float, float] | None = None
    # "always faster": (line rate per NIC, PCIe generation) past which the NIC's PCIe link, not its line
    # rate, limits what it delivers (topologies.cluster's injection is a max-flow through the PCIe tree):
    # past it a faster NIC changes nothing, which is why no line rate lets the baseline catch up
    host_link: tuple[float, int] | None = None
    # of the interval's draws, (those slower at every line rate, those faster at every line rate in
    # SEARCH_GBPS): no crossing to put in the band, so its quantiles there are 0 or infinity (_draw)
    uncrossed_draws: tuple[int, int] = (0, 0)

    def to_dict(self) -> dict:
        return {
            "optimizer": self.optimizer,
            "baseline": self.baseline,
            "gpus": self.gpus,
            "gbps": self.gbps,
            "rate": "line rate per NIC, whole run",
            "verdict": self.verdict,
            "interval_gbps": _finite(self.interval.as_dict()) if self.interval else None,
            "draws_slower_at_every_rate": self.uncrossed_draws[0],
            "draws_faster_at_every_rate": self.uncrossed_draws[1],
            "effective_gbps": self.effective_gbps,
            "steps": self.steps,
            "baseline_steps": self.baseline_steps,
            "warmup": self.warmup,
            "speedups_at_search_ends": list(self.speedups) if self.speedups else None,
            "pcie_limit_line_rate_gbps": self.host_link[0] if self.host_link else None,
            "text": self.describe(),
        }

    as_dict = to_dict  # the name the tables' rows use too

    def run_text(self) -> str:
        """The run the break-even holds for: steps and, where it has one, the warm-up stage."""
        if self.steps is None:
            steps = "the same steps"
        elif self.baseline_steps in (None, self.steps):
            steps = f"{self.steps:,} steps"
        else:
            steps = f"{self.steps:,} steps against {self.baseline_steps:,}"
        warm = f", warm-up {self.warmup:.0%}" if self.warmup is not None else ""
        return steps + warm

    def describe(self) -> str:
        who = f"{self.optimizer} vs {self.baseline}"
        if self.verdict == "single node":
            return f"{who}: no network in a single node"
        run = f"over the whole run ({self.run_text()})"
        lo, hi = SEARCH_GBPS
        if self.verdict == "level":
            return (
                f"{who}: level {run}, within {LEVEL:.1%} of each other at {lo} and {hi:,.0f} Gb/s line "
                f"rate per NIC: no break-even"
            )
        if self.verdict in ("always faster", "never faster"):
            ends = self.speedups or ()
            level_end = any(_level(x) for x in ends)
            if self.verdict == "always faster":
                said = "never slower" if level_end else "faster"
                capped = ""
                # the PCIe link keeps a gap open only where one is left at the search's top (a level
                # end: the two runs meet there, whatever limits the NIC)
                if self.host_link is not None and not level_end:
                    line, gen = self.host_link
                    capped = (
                        f"; past {gbps_text(line)} Gb/s line rate the NIC's PCIe Gen{gen} link, not the line "
                        "rate, limits what it delivers, so a faster NIC does not close the gap"
                    )
                return (
                    f"{who}: {said} {run} at any line rate per NIC up to {hi:,.0f} Gb/s{self._margins()}"
                    + capped
                )
            said = "never faster" if level_end else "slower"
            return f"{who}: {said} {run} at any line rate per NIC down to {lo} Gb/s{self._margins()}"
        band = ""
        if self.interval:
            band = f" ({self._band_text()})"
        eff = ""
        if self.effective_gbps:  # the labelled extra: what iperf would measure on such a NIC
            eff = f"; each NIC then delivers {gbps_text(self.effective_gbps)} Gb/s effective"
        return f"{who}: faster {run} below {gbps_text(self.gbps)} Gb/s line rate per NIC{band}{eff}"

    def _band_text(self) -> str:
        """ "P10–P90 75.2–213", or where some draws never cross, what the band can say: "P10 75.2, P90
        none: faster at every line rate in 9 of 32 draws"."""
        iv, (slower, faster) = self.interval, self.uncrossed_draws
        if not slower and not faster:
            return f"P10–P90 {gbps_text(iv.p10)}–{gbps_text(iv.p90)}"
        ends = []
        for name, x in (("P10", iv.p10), ("P90", iv.p90)):
            ends.append(f"{name} none" if x == 0.0 or math.isinf(x) else f"{name} {gbps_text(x)}")
        why = []
        if faster:
            capped = ""
            if self.host_link is not None:
                line, gen = self.host_link
                capped = (
                    f", its NICs' PCIe Gen{gen} link capping what any NIC past {gbps_text(line)} Gb/s "
                    "delivers"
                )
            why.append(f"faster at every line rate in {faster} of {iv.samples} draws{capped}")
        if slower:
            why.append(f"slower at every line rate in {slower} of {iv.samples} draws")
        return f"{', '.join(ends)}: {'; '.join(why)}"

    def _margins(self) -> str:
        """The speedups at the search's two ends, " (1.21x at 0.1 Gb/s, level at 10,000 Gb/s)"."""
        if self.speedups is None:
            return ""
        said = []
        for x, g in zip(self.speedups, SEARCH_GBPS):
            rate = f"{g:,.0f}" if g >= 1 else f"{g}"
            said.append(f"{'level' if _level(x) else f'{x:.2f}x'} at {rate} Gb/s")
        return f" ({', '.join(said)})"


def _finite(band: dict) -> dict:
    """An interval's dict for JSON: a quantile with no line rate (0 or infinity, BreakEven.uncrossed_draws)
    as null."""
    return {k: (None if isinstance(v, float) and (v == 0.0 or math.isinf(v)) else v) for k, v in band.items()}


def _level(speedup: float) -> bool:
    """Two runs within LEVEL of each other: neither is faster."""
    return abs(speedup - 1.0) < LEVEL


def gbps_text(x: float) -> str:
    """A break-even line rate as every command prints it (compare, report, plan, the API's describe):
    three significant figures, trailing zeros kept (66.0, not 66, beside a 66.1 elsewhere); whole Gb/s
    from 100 up."""
    return f"{x:,.0f}" if x >= 100 else f"{x:#.3g}"


def _at(scenario: Scenario, gbps: float) -> Scenario:
    """The scenario with NICs of ``gbps`` line rate, delivering what such a NIC does: its measured
    efficiency (effective / line rate) where the scenario has one, else the kind's protocol efficiency.
    An InfiniBand port runs at one of its generations' rates (scenario._check_nic_product), so a rate
    between two is simulated as the next generation's port delivering that rate's share: the search
    stays continuous and on real products."""
    nic = scenario.cluster.nic
    line = nic_line_rate_at_least(nic.kind, gbps)
    changes: dict = {"cluster.nic.line_rate_gbps": line}
    if nic.effective_gbps is not None or line != gbps:
        changes["cluster.nic.effective_gbps"] = gbps * _efficiency(scenario)
    return scenario.with_changes(**changes)


def _efficiency(scenario: Scenario) -> float:
    nic = scenario.cluster.nic
    if nic.effective_gbps is not None:
        return nic.effective_gbps / nic.line_rate_gbps
    return hardware_defaults()["nic"][nic.kind]


def pcie_limited_line_rate(scenario: Scenario) -> tuple[float, int]:
    """(line rate per NIC, PCIe generation): the line rate whose effective rate (effective_at) fills
    the NIC's PCIe link (hardware_defaults pcie_gbs of the GPUs' generation, the link every NIC hangs
    off in topologies.node); above it the PCIe link, not the NIC, sets what the NIC delivers."""
    gen = catalog_gpu(scenario.cluster.gpu).pcie_generation(scenario.cluster.intra_node.pcie_gen)
    pcie_gbps = hardware_defaults()["pcie_gbs"][gen] * 8
    return pcie_gbps / _efficiency(scenario), gen


def effective_at(scenario: Scenario, gbps: float) -> float:
    """What one NIC of ``gbps`` line rate delivers, in Gb/s (topologies.node.nic_bandwidth's rule)."""
    return gbps * _efficiency(scenario)


@dataclass(frozen=True)
class Run:
    """One side of the comparison: a scenario and the steps of its whole run (None: the same for both,
    so only the mean step counts) with its warm-up fraction (1-bit Adam's warm-up stage)."""

    scenario: Scenario
    steps: int | None = None
    warmup: float | None = None

    def time(self, gbps: float, profile, perturbation) -> float:
        s = _at(self.scenario, gbps)
        name = s.training.optimizer
        step = simulate(s, profile, perturbation=perturbation).iteration_time
        warm_opts = registry.get(name).warmup_options(s.training.optimizer_options)
        warm = None
        if warm_opts is not None:
            warm_s = s.with_changes(**{"training.optimizer_options": warm_opts})
            warm = simulate(warm_s, profile, perturbation=perturbation).iteration_time
        return (self.steps or 1) * mean_step_time(name, step, warm, self.warmup)


def _ratio(compressed: Run, baseline: Run, gbps: float, profile, perturbation) -> float:
    return compressed.time(gbps, profile, perturbation) / baseline.time(gbps, profile, perturbation)


def _bisect(compressed, baseline, profile, perturbation, lo: float, hi: float, tol: float) -> float:
    """log-space bisection for ratio == 1, assuming ratio(lo) < 1 <= ratio(hi), to ``tol`` in log."""
    a, b = math.log(lo), math.log(hi)
    while b - a > tol:
        mid = 0.5 * (a + b)
        if _ratio(compressed, baseline, math.exp(mid), profile, perturbation) < 1.0:
            a = mid
        else:
            b = mid
    return math.exp(0.5 * (a + b))


def break_even(
    compressed: Scenario,
    baseline: Scenario,
    profile=None,
    samples: int = DEFAULT_SAMPLES,
    seed: int = 0,
    *,
    steps: int | None = None,
    baseline_steps: int | None = None,
    warmup: float | None = None,
    bracket: tuple[float, float] | None = None,
) -> BreakEven:
    """The line rate per NIC where ``compressed`` and ``baseline`` train equally long (module docstring).
    ``steps`` and ``baseline_steps``: each side's run (None: the same); ``warmup``: 1-bit Adam's warm-up
    fraction (compare.warmup_fraction; None: the default). ``bracket``: two line rates known to lie
    either side of the crossing (a sweep's rates), which only saves simulations: the answer is the same."""
    from clustersim.planner.compare import DEFAULT_WARMUP

    opt, base = compressed.training.optimizer, baseline.training.optimizer
    has_warmup = registry.get(opt).warmup_options(compressed.training.optimizer_options) is not None
    w = (DEFAULT_WARMUP if warmup is None else warmup) if has_warmup else None
    if steps is not None and baseline_steps is None:
        baseline_steps = steps
    if steps is None and baseline_steps is not None:
        steps = baseline_steps
    found = dict(optimizer=opt, baseline=base, steps=steps, baseline_steps=baseline_steps, warmup=w)
    found["gpus"] = compressed.cluster.world_size
    if compressed.cluster.nodes <= 1:
        return BreakEven(**found, gbps=None, verdict="single node")
    comp, ref = Run(compressed, steps, w), Run(baseline, baseline_steps)
    lo, hi = SEARCH_GBPS
    if bracket is not None and _ratio(comp, ref, bracket[0], profile, None) < 1.0 <= _ratio(
        comp, ref, bracket[1], profile, None
    ):
        nominal = _bisect(comp, ref, profile, None, *bracket, TOLERANCE)
    else:
        at_hi, at_lo = _ratio(comp, ref, hi, profile, None), _ratio(comp, ref, lo, profile, None)
        if at_hi < 1.0 or at_lo >= 1.0:
            speedups = (1.0 / at_lo, 1.0 / at_hi)
            if all(_level(x) for x in speedups):
                verdict = "level"
            else:
                verdict = "always faster" if at_hi < 1.0 else "never faster"
            host_link = _host_link(compressed) if verdict == "always faster" else None
            return BreakEven(**found, gbps=None, verdict=verdict, speedups=speedups, host_link=host_link)
        nominal = _bisect(comp, ref, profile, None, lo, hi, TOLERANCE)
    interval, uncrossed = None, (0, 0)
    if samples > 0:
        ctx = build_context(compressed, profile)
        draws = [_draw(comp, ref, profile, p, nominal) for p in perturbations(ctx, samples, seed)]
        interval, uncrossed = _censored_interval(draws)
    # some draws never cross: say what caps the faster NICs, where something does
    host_link = _host_link(compressed) if uncrossed[1] else None
    eff = effective_at(compressed, nominal)
    return BreakEven(
        **found,
        gbps=nominal,
        verdict="crossing",
        interval=interval,
        effective_gbps=eff,
        uncrossed_draws=uncrossed,
        host_link=host_link,
    )


def _host_link(scenario: Scenario) -> tuple[float, int] | None:
    """(line rate, PCIe generation) past which the NICs' PCIe link caps what they deliver, where that lies
    inside the search (SEARCH_GBPS): why a compressed run can stay faster at every line rate."""
    line, gen = pcie_limited_line_rate(scenario)
    return (line, gen) if line < SEARCH_GBPS[1] else None


def _draw(comp: Run, ref: Run, profile, perturbation, nominal: float) -> float:
    """One parameter draw's break-even: bisected within 16x of the nominal one, searched out to the
    ends of SEARCH_GBPS when it lies beyond; 0.0 where the compressed run is slower at every line rate
    down to the lowest, ``math.inf`` where it is faster at every rate up to the highest (a NIC's PCIe
    link can cap what any faster NIC delivers, so a draw may never cross: pcie_limited_line_rate)."""
    lo, hi = SEARCH_GBPS
    a, b = max(lo, nominal / 16), min(hi, nominal * 16)
    if _ratio(comp, ref, a, profile, perturbation) >= 1.0:
        if a <= lo or _ratio(comp, ref, lo, profile, perturbation) >= 1.0:
            return 0.0
        return _bisect(comp, ref, profile, perturbation, lo, a, SAMPLE_TOLERANCE)
    if _ratio(comp, ref, b, profile, perturbation) < 1.0:
        if b >= hi or _ratio(comp, ref, hi, profile, perturbation) < 1.0:
            return math.inf
        return _bisect(comp, ref, profile, perturbation, b, hi, SAMPLE_TOLERANCE)
    return _bisect(comp, ref, profile, perturbation, a, b, SAMPLE_TOLERANCE)


def _censored_interval(draws: list[float]) -> tuple[Interval, tuple[int, int]]:
    """The draws' P10-P90 and (draws slower at every line rate, draws faster at every line rate). With
    every draw crossing, the lognormal fit of Interval.of; with some that never cross, no distribution
    is fitted through them: Hazen's empirical quantiles of all the draws, those that never cross at
    their end (0 or infinity), so a quantile that falls among them is 0.0 or ``math.inf`` (no line rate)."""
    slower = sum(1 for d in draws if d == 0.0)
    faster = sum(1 for d in draws if math.isinf(d))
    if not slower and not faster:
        return Interval.of(draws), (0, 0)
    ordered = sorted(draws)
    n = len(ordered)

    def quantile(q: float) -> float:
        # Hazen: the k-th of n sorted values sits at (k - 0.5) / n, interpolated between two; a quantile
        # next to a draw without a crossing has no line rate either (the nearer such draw's end)
        x = min(max(q * n - 0.5, 0.0), n - 1.0)
        i = math.floor(x)
        f = x - i
        below, above = ordered[i], ordered[min(i + 1, n - 1)]
        if f == 0.0:
            return below
        ends = [v for v in (below, above) if v == 0.0 or math.isinf(v)]
        if len(ends) == 2:
            return below if f < 0.5 else above
        if ends:
            return ends[0]
        return below + (above - below) * f

    return Interval(quantile(0.1), quantile(0.5), quantile(0.9), n), (slower, faster)


def _fitted(scenario: Scenario, profile, global_batch: int | None) -> Scenario:
    """``scenario`` with the micro-batch compare's table cell of the same optimizer ran (compare.
    fit_micro_batch: with a fixed global batch, halved until it fits in GPU memory, accumulating more),
    so that the break-even is the crossing of the runs the table shows, and report's sweep rows (which
    fit the same way) agree with it. Memory does not depend on the line rate: one fit holds for every
    rate the bisection tries."""
    if not global_batch:  # the micro-batch as given, as the cells run it: nothing to fit, nothing simulated
        return scenario
    return fit_micro_batch(scenario, lambda s: simulate(s, profile), True)[1]


def break_evens_or_reason(
    scenario: Scenario,
    optimizers: list[str],
    gpus: int,
    profile=None,
    samples: int = 32,  # uncertainty.DEFAULT_SAMPLES
    baseline: str | None = None,
    global_batch: int | None = None,
    steps: "int | str | StepsPlan | None" = None,
    warmup: float | None = None,
) -> tuple[list, str | None]:
    """Break-even line rate per NIC (breakeven.py: the whole run at ``steps`` and ``warmup``, as the
    table's time to train) of each compressed optimizer against the baseline (``choose_baseline``: the
    scenario's uncompressed optimizer, e.g. Adam for BinSGDM on BERT), at ``gpus`` GPUs (0: none asked
    for); and why some are missing: a scenario that cannot be simulated at that count, or one optimizer
    that cannot run there, is the table's footnote, not the end of the comparison (the other optimizers
    keep theirs)."""
    if not gpus:
        return [], None
    base = choose_baseline(scenario.training.optimizer, baseline)
    plan = StepsPlan.parse(steps)
    try:
        w = warmup_fraction(scenario, plan and plan.of(scenario.training.optimizer, base), warmup)
        sized = scenario.with_world_size(gpus)
        if global_batch:
            sized = split_global_batch(sized, global_batch, key="--global-batch")
        base_steps = plan and plan.of(base, base)
        baseline_scenario = _fitted(scenario_for_optimizer(sized, base, base_steps), profile, global_batch)
    except InputError as exc:
        return [], exc.message
    out, missing = [], []
    for name in optimizers:
        if is_uncompressed(name):
            continue
        try:
            n = plan and plan.of(name, base)
            comp = _fitted(scenario_for_optimizer(sized, name, n), profile, global_batch)
            found = break_even(
                comp, baseline_scenario, profile, samples, steps=n, baseline_steps=base_steps, warmup=w
            )
            out.append(found)
        except InputError as exc:
            missing.append(f"{name}: {exc.message}")
    return out, "; ".join(missing) or None


def span_text(evens: list[BreakEven]) -> str | None:
    """Break-evens of one optimizer over several clusters (a report's sweep) as one phrase: the range of
    their line rates and the GPU counts where they cross; None when none crosses."""
    crossing = [b for b in evens if b.verdict == "crossing"]
    if not crossing:
        return None
    rates = sorted(b.gbps for b in crossing)
    sizes = sorted({b.gpus for b in crossing})
    span = gbps_text(rates[0]) if len(rates) == 1 else f"{gbps_text(rates[0])}–{gbps_text(rates[-1])}"
    where = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
    return (
        f"it trains faster than {crossing[0].baseline} over the whole run ({crossing[0].run_text()}) only "
        f"below {span} Gb/s line rate per NIC (at {where} GPUs)"
    )
