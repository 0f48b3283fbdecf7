"""Which sharding combinations the real frameworks run; the others are refused with one line.

Each refusal names the key to change and where the framework itself refuses (or lacks) the
combination, so a plan that cannot run is never simulated as if it could:

* DeepSpeed's 1-bit Adam and 0/1 Adam refuse every ZeRO stage: ``assert not self.zero_optimization(),
  "1bit-Adam is not compatible with ZeRO"`` and ``"0/1 Adam is not compatible with ZeRO"``
  (deepspeed/runtime/engine.py, _configure_basic_optimizer; zero_optimization() is stage > 0).
* BinSGDM (Birder) exists only as a data-parallel optimizer: its hierarchical 1-bit exchange replaces the
  gradient all-reduce over full-size momentum buffers, and no sharded variant is published.
* ZeRO++ (qwZ, hpZ, qgZ) is implemented in DeepSpeed's stage 3 only (runtime/zero/stage3.py and
  partition_parameters.py read zero_quantized_weights / zero_hpz_partition_size /
  zero_quantized_gradients; stage_1_and_2.py never does).
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
    if sh.enabled and training.optimizer in _NOT_WITH_ZERO:
        raise InputError(
            f"{training.optimizer} cannot run sharded: {_NOT_WITH_ZERO[training.optimizer]}",
            key="training.sharding.stage",
        )
    if sh.zeropp.enabled and not (sh.framework == "deepspeed" and sh.stage == 3):
        raise InputError(
            "ZeRO++ (qwZ/hpZ/qgZ) exists only in DeepSpeed ZeRO stage 3 (runtime/zero/stage3.py)",
            key="training.sharding.zeropp",
        )
