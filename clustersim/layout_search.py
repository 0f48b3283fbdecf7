"""Which parallel layouts `plan` simulates for a model on one candidate cluster.

A layout is a set of scenario changes: nothing (data parallelism), a ZeRO stage, or Megatron's tensor x
pipeline split (with full recomputation when activations would not fit otherwise). Simulating every
combination would cost tens of simulations per candidate cluster, so the search keeps, per cluster, the
layouts the practice of the field says can win, each decided by a memory check that runs no simulation
(the model states and activations per rank, simulator/memory.py):

* **Data parallelism fits: nothing else.** Sharding and model parallelism exist to save memory; at a
  fixed global batch they add communication (ZeRO-3's 1.5x volume, TP's per-layer all-reduces, the
  pipeline bubble) and save no time.
* **It does not fit** (optimizers that compose with them, Adam and SGDM; the compressed optimizers run
  data-parallel only, DeepSpeed refuses them under ZeRO):
  - the lowest ZeRO stage that fits (stages 1 and 2 move what DDP moves; stage 3 gathers parameters
    too), with activation checkpointing when nothing fits without it;
  - for each tensor-parallel size t of 1, 2, 4, 8 within a node (Narayanan et al., SC'21: keep TP inside
    a node, where NVLink carries its per-layer all-reduces), the fewest pipeline stages p that fit, first
    without recomputation, then with it (fewer stages: a smaller bubble, fewer point-to-point hops),
    with Megatron's distributed optimizer (ZeRO-1 over the data-parallel replicas).

The memory check is made at micro-batch 1, the most favourable; the simulation then fits the micro-batch
to the global batch as every plan row does (halving it while it does not fit).
"""

from __future__ import annotations

from typing import Any

from clustersim.errors import InputError
from clustersim.scenario import Scenario

TENSOR_SIZES = (1, 2, 4, 8)  # within a node (8-GPU NVLink/NVSwitch nodes): Narayanan et al. SC'21, sec. 3.3
ZERO_STAGES = (1, 2, 3)
MODEL_PARALLEL_OPTIMIZERS = ("adam", "sgdm")  # scenario._MODEL_PARALLEL_OPTIMIZERS, sharding_rules


def fits(scenario: Scenario, global_batch: int | None = None) -> bool:
    """Whether one rank's memory fits at micro-batch 1 (no simulation); an invalid layout does not. With
    a global batch, the micro-batches per step follow from it as the plan's rows get them (a pipeline
    keeps up to p of them in flight)."""
    from clustersim.simulator.context import build_context
    from clustersim.simulator.memory import gpu_memory
    from clustersim.simulator.strategies import registry
    from clustersim.sweeps.spec import split_global_batch

    try:
        s = scenario.with_changes(**{"workload.micro_batch": 1})
        if global_batch:
            s = split_global_batch(s, global_batch)
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
    """The layouts worth simulating for ``scenario`` (a candidate cluster, optimizer and model), as
    dotted scenario changes; [{}] (data parallelism) when it fits, [] when nothing does."""
    if fits(scenario, global_batch):
        return [{}]
    if scenario.training.optimizer not in MODEL_PARALLEL_OPTIMIZERS:
        return []
    zero = _lowest_zero_stage(scenario, global_batch)
    return ([zero] if zero else []) + _fewest_stages_per_tensor_size(scenario, global_batch)


def _lowest_zero_stage(scenario: Scenario, global_batch: int | None) -> dict[str, Any] | None:
    """The lowest ZeRO stage that fits, without activation checkpointing if possible."""
    for checkpointing in (False, True):
        for stage in ZERO_STAGES:
            changes: dict[str, Any] = {"training.sharding.stage": stage}
            if checkpointing:
                changes["workload.activation_checkpointing"] = True
            s = _try(scenario, changes)
            if s is not None and fits(s, global_batch):
                return changes
    return None


def _fewest_stages_per_tensor_size(scenario: Scenario, global_batch: int | None) -> list[dict[str, Any]]:
    """For each tensor-parallel size within a node, the fewest pipeline stages that fit (recomputation
    only where needed)."""
    c = scenario.cluster
    layers = _layers(scenario)
    out = []
    for t in TENSOR_SIZES:
        if t > c.gpus_per_node or c.world_size % t:
            continue
        for p in (d for d in range(1, layers + 1) if layers % d == 0 and c.world_size % (t * d) == 0):
            if t * p == 1:
                continue
            found = _fitting_recompute(scenario, t, p, global_batch)
            if found:
                out.append(found)
                break
    return out


def _fitting_recompute(scenario: Scenario, t: int, p: int, global_batch: int | None) -> dict[str, Any] | None:
    """Megatron's layout at (t, p) with its distributed optimizer (ZeRO-1 over the data-parallel replicas:
    the reduce-scatter and all-gather move what the all-reduce moved, and the fp32 states shrink by the
    data-parallel degree, as Megatron recommends for large models), recomputation only if needed."""
    for recompute in ("none", "full"):
        changes = {
            "training.parallelism.tensor": t,
            "training.parallelism.pipeline": p,
            "training.parallelism.recompute": recompute,
            "training.parallelism.distributed_optimizer": True,
        }
        s = _try(scenario, changes)
        if s is not None and fits(s, global_batch):
            return changes
    return None


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
    if par.get("distributed_optimizer"):
        parts.append("dist. optimizer")
    if sh.get("framework") == "fsdp":
        parts.append(f"FSDP {sh.get('fsdp_strategy') or 'full'}")
    elif sh.get("stage"):
        parts.append(f"ZeRO-{sh['stage']}")
    if par.get("recompute") == "full" or scenario.get("workload", {}).get("activation_checkpointing"):
        parts.append("recompute")
    return ", ".join(parts) or "DP"
