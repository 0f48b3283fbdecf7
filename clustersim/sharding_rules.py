"""Which sharding combinations the real frameworks run; the others are refused with one line.

Each refusal names the key to change and where the framework itself refuses (or lacks) the
combination, so a plan that cannot run is never simulated as if it could:

* DeepSpeed's 1-bit Adam and 0/1 Adam refuse every ZeRO stage: ``assert not self.zero_optimization(),
  "1bit-Adam is not compatible with ZeRO"`` and ``"0/1 Adam is not compatible with ZeRO"``
  (deepspeed/runtime/engine.py, _configure_basic_optimizer; zero_optimization() is stage > 0).
* DeepSpeed offloads an optimizer to the CPU only through ZeRO (``zero_optimization.offload_optimizer``,
  "Valid for ZeRO stage 1, 2, 3", runtime/zero/config.py), so the same assert refuses 1-bit Adam and
  0/1 Adam with ``training.offload`` too: their compression runs on the GPU's momentum inside the
  optimizer step, which an offloaded update moves to the host.
* BinSGDM (Birder) exists only as a data-parallel optimizer: its hierarchical 1-bit exchange replaces the
  gradient all-reduce over full-size momentum buffers, and no sharded or offloaded variant is published.
* ZeRO++ (qwZ, hpZ, qgZ) is implemented in DeepSpeed's stage 3 only (runtime/zero/stage3.py and
  partition_parameters.py read zero_quantized_weights / zero_hpz_partition_size /
  zero_quantized_gradients; stage_1_and_2.py never does).
* Hierarchical partitioning (training.sharding.partition) partitions each state DeepSpeed's stage
  partitions (stage 1: optimizer states; 2: + gradients; 3: + parameters) over a GCD pair, a node or
  the world, in that order of size: parameters never over more ranks than gradients, gradients never
  over more than optimizer states (each rank updates a slice of its own gradient shard and the updated
  slices make up its parameter shard; as hpZ/MiCS nest their groups). FSDP's own hierarchy is HYBRID
  (fsdp_strategy), ZeRO++'s hpZ its secondary partition; neither composes with it, nor does offload
  (not modelled with it), nor stragglers (rank classes synchronise at every collective, which a
  group-level collective does not). gcd_pair needs GPUs whose packages hold two dies (MI250X).
* FSDP has no Deep Optimizer States (interleaved) and its CPUOffload moves parameters and gradients
  too (offload_params=True), which clustersim does not model; DeepSpeed's ZeRO-Offload does.
"""

from __future__ import annotations

from clustersim.errors import InputError

# Optimizers DeepSpeed refuses under any ZeRO stage (engine.py, see above), and BinSGDM (see above).
_NOT_WITH_ZERO = {
    "onebit-adam": 'DeepSpeed asserts "1bit-Adam is not compatible with ZeRO" (runtime/engine.py)',
    "zero-one-adam": 'DeepSpeed asserts "0/1 Adam is not compatible with ZeRO" (runtime/engine.py)',
    "binsgdm": "BinSGDM's 1-bit exchange works on full momentum buffers; no sharded variant is published",
    "diloco": "clustersim models DiLoCo's workers as data-parallel replicas (DDP inside each); sharded "
    "workers are not modelled",
}


# Why each of those cannot run with its update offloaded to the host (training.offload; see above).
_NOT_OFFLOADED = {
    "onebit-adam": "DeepSpeed offloads the optimizer only under ZeRO (zero_optimization.offload_optimizer, "
    'stages 1-3) and asserts "1bit-Adam is not compatible with ZeRO" (runtime/engine.py)',
    "zero-one-adam": "DeepSpeed offloads the optimizer only under ZeRO (zero_optimization.offload_optimizer, "
    'stages 1-3) and asserts "0/1 Adam is not compatible with ZeRO" (runtime/engine.py)',
    "binsgdm": "BinSGDM compresses its momentum on the GPU inside each step; no offloaded variant is "
    "published",
    "diloco": "clustersim models DiLoCo's workers as data-parallel replicas updating on their GPUs; an "
    "offloaded inner optimizer is not modelled",
}


def runs_sharded(optimizer: str) -> bool:
    """Whether any framework runs ``optimizer`` under ZeRO/FSDP (see _NOT_WITH_ZERO)."""
    return optimizer not in _NOT_WITH_ZERO


def check_sharding(training) -> None:
    """Refuse a ``training`` section (TrainingSpec) whose sharding no framework runs."""
    sh = training.sharding
    if sh.framework == "fsdp":
        if sh.stage != 0:
            raise InputError(
                "FSDP sets its sharding by fsdp_strategy (full ~ stage 3, grad_op ~ stage 2); leave stage 0",
                key="training.sharding.stage",
            )
        if training.offload.mode != "none":
            raise InputError(
                f"FSDP has no {training.offload.mode!r} optimizer offload (its CPUOffload moves parameters "
                "too, not modelled); use framework: deepspeed",
                key="training.offload.mode",
            )
    elif sh.fsdp_strategy is not None:
        raise InputError("fsdp_strategy needs framework: fsdp", key="training.sharding.fsdp_strategy")
    elif sh.fsdp_implementation is not None:
        raise InputError(
            "fsdp_implementation needs framework: fsdp", key="training.sharding.fsdp_implementation"
        )
    if sh.enabled and training.optimizer in _NOT_WITH_ZERO:
        raise InputError(
            f"{training.optimizer} cannot run sharded: {_NOT_WITH_ZERO[training.optimizer]}",
            key="training.sharding.stage",
        )
    if training.offload.mode != "none" and training.optimizer in _NOT_OFFLOADED:
        raise InputError(
            f"{training.optimizer} cannot run with its optimizer offloaded "
            f"(offload.mode {training.offload.mode}): {_NOT_OFFLOADED[training.optimizer]}; set "
            "training.offload.mode: none",
            key="training.offload.mode",
        )
    if sh.zeropp.enabled and not (sh.framework == "deepspeed" and sh.stage == 3):
        raise InputError(
            "ZeRO++ (qwZ/hpZ/qgZ) exists only in DeepSpeed ZeRO stage 3 (runtime/zero/stage3.py)",
            key="training.sharding.zeropp",
        )


LEVELS = ("gcd_pair", "node", "world")
# The states each ZeRO stage partitions (ZeRO paper sec. 5; DeepSpeed stage_1_and_2.py, stage3.py).
_STAGE_STATES = {
    1: ("optimizer_states",),
    2: ("gradients", "optimizer_states"),
    3: ("parameters", "gradients", "optimizer_states"),
}


def partition_levels(sharding) -> dict[str, str]:
    """Each partitioned state's level (unset: world); states the stage replicates are absent."""
    part = sharding.partition
    return {k: getattr(part, k) or "world" for k in _STAGE_STATES.get(sharding.stage, ())}


def check_partition(training, cluster, gpu) -> None:
    """Refuse a ``training.sharding.partition`` no framework runs (see the module's notes)."""
    sh = training.sharding
    part = sh.partition
    if not part.enabled:
        return
    key = "training.sharding.partition"
    if sh.framework != "deepspeed":
        raise InputError("partition levels are DeepSpeed ZeRO's; FSDP's is fsdp_strategy: hybrid", key=key)
    if sh.zeropp.enabled:
        raise InputError("partition levels do not compose with ZeRO++ (hpZ is its own partition)", key=key)
    if training.offload.mode != "none":
        raise InputError("partition levels with optimizer offload are not modelled", key=key)
    if cluster.heterogeneity is not None:
        raise InputError(
            "stragglers with partition levels are not modelled (rank classes synchronise at every "
            "collective; a GCD pair's or a node's do not wait for other groups)",
            key="cluster.heterogeneity",
        )
    allowed = _STAGE_STATES.get(sh.stage, ())
    for state in ("parameters", "gradients", "optimizer_states"):
        level = getattr(part, state)
        if level is not None and state not in allowed:
            raise InputError(
                f"ZeRO stage {sh.stage} does not partition {state.replace('_', ' ')}", key=f"{key}.{state}"
            )
        if level == "gcd_pair" and (gpu.dies_per_package != 2 or cluster.gpus_per_node % 2):
            raise InputError(
                f"gcd_pair needs GPUs with two dies per package (MI250X GCDs), whole packages per node; "
                f"{gpu.name} has {gpu.dies_per_package}",
                key=f"{key}.{state}",
            )
    levels = partition_levels(sh)
    order = [s for s in ("parameters", "gradients", "optimizer_states") if s in levels]
    for inner, outer in zip(order, order[1:]):
        if LEVELS.index(levels[inner]) > LEVELS.index(levels[outer]):
            raise InputError(
                f"{inner.replace('_', ' ')} partitioned over {levels[inner]} but {outer.replace('_', ' ')} "
                f"over {levels[outer]}: a state may not span more ranks than the ones derived from it",
                key=f"{key}.{inner}",
            )
