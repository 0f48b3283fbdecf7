"""Which parallel layouts `plan` simulates for a model on one candidate cluster.

A layout is a set of scenario changes: nothing (data parallelism), a ZeRO stage, or Megatron's tensor x
pipeline split (with selective or full recomputation when activations would not fit otherwise).
Simulating every combination would cost tens of simulations per candidate cluster, so the search keeps,
per cluster, the layouts the practice of the field says can win, each decided by a memory check that
runs no simulation (the model states and activations per rank, simulator/memory.py):

* **Data parallelism fits: nothing else.** Sharding and model parallelism exist to save memory; at a
  fixed global batch they add communication (ZeRO-3's 1.5x volume, TP's per-layer all-reduces, the
  pipeline bubble) and save no time.
* **It does not fit** (optimizers that compose with them, Adam and SGDM; the compressed optimizers run
  data-parallel only, DeepSpeed refuses them under ZeRO):
  - the lowest ZeRO stage that fits (stages 1 and 2 move what DDP moves; stage 3 gathers parameters
    too), with activation checkpointing when nothing fits without it, and stage 3 as well where the
    lowest is below it: DeepSpeed overlaps stage 3's communication with compute by default and
    reduces stages 1 and 2 after backward, so stage 3 can be the faster one;
  - for each tensor-parallel size t of 1, 2, 4, 8 within a node (Narayanan et al., SC'21: keep TP inside
    a node, where NVLink carries its per-layer all-reduces), with Megatron's distributed optimizer
    (ZeRO-1 over the data-parallel replicas) and, for t > 1, sequence parallelism (_megatron):
    the fewest pipeline stages p that fit, first without recomputation, then with selective
    recomputation (the core attention again: a few percent more compute; only where the attention
    scores are kept, unfused), then with full (a third more) (fewer stages: a smaller bubble, fewer
    point-to-point hops); where that needs recomputation, also the fewest stages that fit with less of
    it, down to none (a larger bubble against less compute: only the simulation can say);
  - for each of those with p > 1, the interleaved schedule with v model chunks per stage, for the v
    the layers allow, where the bubble it removes could be worth more than the 3% the plan needs to
    prefer a more complex option (_interleaved).

The memory check is made at micro-batch 1, the most favourable; the simulation then fits the micro-batch
to the global batch as every plan row does (halving it while it does not fit), and the bubble estimate
uses the micro-batch the row will run at (the same halving, memory check only).
"""

from __future__ import annotations

from typing import Any

from clustersim.errors import InputError
from clustersim.report.analysis import EQUIVALENT_GAIN
from clustersim.scenario import Scenario

TENSOR_SIZES = (1, 2, 4, 8)  # within a node (8-GPU NVLink/NVSwitch nodes): Narayanan et al. SC'21, sec. 3.3
ZERO_STAGES = (1, 2, 3)
MODEL_PARALLEL_OPTIMIZERS = ("adam", "sgdm")  # scenario._MODEL_PARALLEL_OPTIMIZERS, sharding_rules
# Model chunks per stage tried for the interleaved schedule. Its bubble is 1/v of 1F1B's (Narayanan et
# al. SC'21, sec. 2.2.2) at v times the pipeline sends, so v = 2 already removes half of it and v = 4
# three quarters: a larger v can gain at most a quarter of the bubble more while its sends (and this
# simulation's work) keep growing in v. The paper's Fig. 4 illustrates the schedule with v = 2.
VIRTUAL_STAGES = (2, 3, 4)
# Megatron's recomputation choices, cheapest first: none; selective, the core attention's forward again
# before each block's backward (4bs^2h/t FLOPs, a few percent of a block's forward at GPT-3's s/h; no
# collective repeated), dropping the s^2 scores from the activations; full, each block's whole forward
# again (a third more compute, its tensor-parallel collectives too), keeping only the block's input
# (Korthikanti et al. 2022, sec. 5 and Table 2; simulator/model_parallel.py).
RECOMPUTES = ("none", "selective", "full")


def fits(scenario: Scenario, global_batch: int | None = None) -> bool:
    """Whether one rank's memory fits at micro-batch 1 (no simulation); an invalid layout does not. With
    a global batch, the micro-batches per step follow from it as the plan's rows get them (a pipeline
    keeps up to p of them in flight)."""
    return _fits_with(scenario, {}, global_batch)


def _fits_with(scenario: Scenario, changes: dict[str, Any], global_batch: int | None) -> bool:
    s = _resolved(scenario, changes, global_batch, micro_batch=1)
    return s is not None and _memory_fits(s)


def _resolved(
    scenario: Scenario, changes: dict[str, Any], global_batch: int | None, micro_batch: int
) -> Scenario | None:
    """``scenario`` with a layout's changes at ``micro_batch``, the global batch split over its replicas
    as a plan row does (sweeps.spec.with_layout); None for a layout the frameworks refuse (heads not
    divisible by t, micro-batches not a multiple of p under interleaving: scenario._check_parallelism)."""
    from clustersim.sweeps.spec import with_layout

    try:
        s = scenario.with_changes(**{"workload.micro_batch": micro_batch})
        return with_layout(s, changes, global_batch)
    except InputError:
        return None


def _memory_fits(s: Scenario) -> bool:
    from clustersim.simulator.context import build_context
    from clustersim.simulator.memory import gpu_memory
    from clustersim.simulator.strategies import registry

    try:
        ctx = build_context(s)
        mem = gpu_memory(ctx, registry.create(ctx))
    except InputError:
        return False
    return mem["total"] <= mem["capacity"]


def _try(scenario: Scenario, changes: dict[str, Any]) -> Scenario | None:
    try:
        return scenario.with_changes(**changes)
    except InputError:  # a layout the frameworks refuse (heads not divisible by t, ...)
        return None


def _layers(scenario: Scenario) -> int:
    """Transformer blocks of the catalog model (what Megatron splits into stages); 1 for others."""
    from clustersim import catalog

    if scenario.workload.model is None:
        return 1
    return getattr(catalog.model(scenario.workload.model), "layers", 1) or 1


def candidate_layouts(scenario: Scenario, global_batch: int | None = None) -> list[dict[str, Any]]:
    """The layouts worth simulating for ``scenario`` (a candidate cluster, optimizer and model, at the
    micro-batch its rows start from), as dotted scenario changes; [{}] (data parallelism) when it fits,
    [] when nothing does."""
    if fits(scenario, global_batch):
        return [{}]
    if scenario.training.optimizer not in MODEL_PARALLEL_OPTIMIZERS:
        return []
    return _zero_stages(scenario, global_batch) + _megatron(scenario, global_batch)


def _zero_stages(scenario: Scenario, global_batch: int | None) -> list[dict[str, Any]]:
    """The lowest ZeRO stage that fits (without activation checkpointing if possible) and, where that is
    below 3, stage 3 too: DeepSpeed overlaps stage 3's reduce-scatters and all-gathers with compute by
    default (overlap_comm) but reduces stages 1 and 2 after backward, so the stage that shards most can
    also be the fastest (and, taking a larger micro-batch, cheapest)."""
    for checkpointing in (False, True):
        for stage in ZERO_STAGES:
            changes: dict[str, Any] = {"training.sharding.stage": stage}
            if checkpointing:
                changes["workload.activation_checkpointing"] = True
            s = _try(scenario, changes)
            if s is not None and fits(s, global_batch):
                if stage == ZERO_STAGES[-1]:
                    return [changes]
                return [changes, {**changes, "training.sharding.stage": ZERO_STAGES[-1]}]
    return []


def _megatron(scenario: Scenario, global_batch: int | None) -> list[dict[str, Any]]:
    """Per tensor-parallel size within a node, the stage counts that fit (_stage_counts), each also
    interleaved where that can pay (_interleaved)."""
    c = scenario.cluster
    out = []
    for t in TENSOR_SIZES:
        if t > c.gpus_per_node or c.world_size % t:
            continue
        for layout in _stage_counts(scenario, t, global_batch):
            out += [layout, *_interleaved(scenario, layout, global_batch)]
    return out


def _stage_counts(scenario: Scenario, t: int, global_batch: int | None) -> list[dict[str, Any]]:
    """The fewest pipeline stages that fit at tensor size t, with the cheapest recomputation that lets
    them (RECOMPUTES, cheapest first) and, while that still recomputes, the fewest further stages that
    fit with less of it: full recomputation at p, then selective at a deeper p', then none at a deeper
    p'' still (each a larger bubble against less compute: only the simulation can say which wins)."""
    c = scenario.cluster
    layers = _layers(scenario)
    recomputes = _recomputes(scenario)
    out: list[dict[str, Any]] = []
    for p in (d for d in range(1, layers + 1) if layers % d == 0 and c.world_size % (t * d) == 0):
        if t * p == 1:
            continue
        for i, recompute in enumerate(recomputes):
            changes = _megatron_changes(t, p, recompute)
            if _fits_with(scenario, changes, global_batch):
                out.append(changes)
                recomputes = recomputes[:i]  # a deeper pipeline only for less recomputation
                break
        if not recomputes:
            break
    return out


def _recomputes(scenario: Scenario) -> tuple[str, ...]:
    """RECOMPUTES for this workload. Selective recomputation only drops the attention's s x s scores
    (5as/(ht) of a block's sbh(34/t + 5as/(ht)), Korthikanti et al. 2022 Table 2), which a fused
    attention kernel never keeps (simulator/model_parallel.py ``block_activation_bytes``): there it
    saves no memory and re-runs the attention, so it is not tried."""
    if scenario.workload.attention == "fused":
        return tuple(r for r in RECOMPUTES if r != "selective")
    return RECOMPUTES


def _megatron_changes(t: int, p: int, recompute: str) -> dict[str, Any]:
    """Megatron's layout at (t, p). Its distributed optimizer (ZeRO-1 over the data-parallel replicas:
    the reduce-scatter and all-gather move what the all-reduce moved, and the fp32 states shrink by the
    data-parallel degree, as Megatron recommends for large models). Sequence parallelism whenever t > 1,
    not searched on and off: it swaps each per-layer all-reduce for an all-gather and a reduce-scatter
    of the same bytes (a ring all-reduce is those two), splits the LayerNorm and dropout work and their
    activations by t (Korthikanti et al. 2022, sec. 4.2.2 and Table 2), so at a given micro-batch it
    costs no bytes or memory and often lets fewer stages or no recomputation fit; the paper trains its
    22B to 1T models with it."""
    return {
        "training.parallelism.tensor": t,
        "training.parallelism.pipeline": p,
        "training.parallelism.recompute": recompute,
        # the search recomputes every block or none (a scenario's partial count would not fit its layouts)
        "training.parallelism.recompute_num_layers": None,
        "training.parallelism.recompute_method": "uniform",
        "training.parallelism.distributed_optimizer": True,
        "training.parallelism.sequence_parallel": t > 1,
    }


def _interleaved(
    scenario: Scenario, layout: dict[str, Any], global_batch: int | None
) -> list[dict[str, Any]]:
    """The interleaved schedule on ``layout`` for each v of VIRTUAL_STAGES that the frameworks accept
    (layers a multiple of p x v, micro-batches a multiple of p: the scenario validator), that fits, and
    whose bubble saving over 1F1B or the last v kept could pass the plan's 3% rule (_may_pay). Same
    recomputation as the 1F1B layout: interleaving holds more activations (p(1 + (p-1)/(pv)) chunks'
    worth on the first stage)."""
    p = layout["training.parallelism.pipeline"]
    if p < 2:
        return []
    kept = [(1, _micro_batches(scenario, layout, global_batch))]  # (v, micro-batches) of each kept
    out: list[dict[str, Any]] = []
    for v in VIRTUAL_STAGES:
        changes = {
            **layout,
            "training.parallelism.schedule": "interleaved",
            "training.parallelism.virtual_stages": v,
        }
        m = _micro_batches(scenario, changes, global_batch)
        if kept[-1][1] and m and _may_pay(p, kept[-1], (v, m)):
            out.append(changes)
            kept.append((v, m))
    return out


def _micro_batches(scenario: Scenario, changes: dict[str, Any], global_batch: int | None) -> int | None:
    """Micro-batches per step the row will run: from its own micro-batch, halved while memory is short
    (sweeps.run does the same, simulating); None when the row would be refused or nothing fits."""
    s = _resolved(scenario, changes, global_batch, scenario.workload.micro_batch)
    s = None if s is None else running_micro_batch(s)
    return None if s is None else s.workload.gradient_accumulation


def running_micro_batch(s: Scenario) -> Scenario | None:
    """``s`` at the micro-batch its plan row will run at: its own, halved while memory is short (the
    memory check compare.fit_micro_batch's simulation makes first, without simulating); None where
    nothing fits or a halving is refused."""
    from clustersim.planner.compare import halve_micro_batch

    while not _memory_fits(s):
        if s.workload.micro_batch == 1:
            return None
        try:
            s = halve_micro_batch(s)
        except InputError:  # the interleaved schedule's micro-batches no longer a multiple of p
            return None
    return s


def _may_pay(p: int, fewer: tuple[int, int], more: tuple[int, int]) -> bool:
    """Whether ``more`` = (v, m) chunks per stage and micro-batches could save more than EQUIVALENT_GAIN
    of the step that ``fewer`` takes ((1, m): 1F1B), the margin the plan asks of the more complex option
    (report.analysis.complexity): with m micro-batches the bubble is (p-1)/m of the ideal step, 1/v of
    that interleaved (Narayanan et al. SC'21, sec. 2.2.1 and 2.2.2). An upper bound: the v-fold
    pipeline sends and the slower small micro-batches (where memory makes the row use more) only take
    from it. A v that could not beat the smaller one by that margin would be called equivalent to it,
    and is not simulated."""
    (v0, m0), (v, m) = fewer, more
    return 1 - (1 + (p - 1) / (v * m)) / (1 + (p - 1) / (v0 * m0)) > EQUIVALENT_GAIN


def layout_label(scenario: dict[str, Any]) -> str:
    """A row's layout in a few characters, from its scenario (as stored in sweep and plan rows)."""
    training = scenario.get("training", {})
    par = training.get("parallelism") or {}
    sh = training.get("sharding") or {}
    parts = []
    t, p = par.get("tensor", 1), par.get("pipeline", 1)
    if t > 1 or p > 1 or par.get("distributed_optimizer"):
        world = scenario["cluster"]["nodes"] * scenario["cluster"]["gpus_per_node"]
        parts.append(f"TP{t}·PP{p}·DP{world // (t * p)}")
    if par.get("schedule") == "interleaved":
        parts.append(f"interleaved v{par.get('virtual_stages', 1)}")
    if par.get("sequence_parallel") and t > 1:
        parts.append("SP")
    if par.get("distributed_optimizer"):
        parts.append("dist. optimizer")
    if sh.get("framework") == "fsdp":
        parts.append(f"FSDP {sh.get('fsdp_strategy') or 'full'}")
    elif sh.get("stage"):
        parts.append(f"ZeRO-{sh['stage']}")
    if par.get("recompute") == "full" or scenario.get("workload", {}).get("activation_checkpointing"):
        parts.append("recompute")
    elif par.get("recompute") in ("selective", "selective_op"):
        parts.append("selective recompute")
    return ", ".join(parts) or "DP"
