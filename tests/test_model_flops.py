"""Model FLOPs utilisation: run reports the model's own FLOPs per GPU and second, their share of the
GPU's dense peak (MFU) and, for a transformer, tokens per second per GPU."""

import pytest

from clustersim import catalog
from clustersim.scenario import validate_scenario
from clustersim.simulator import simulate
from clustersim.workloads.builder import model_params


def _flops(model: str, seq_len: int, **workload) -> dict:
    scenario = {
        "name": "mfu",
        "cluster": {"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM", "nic": {"count": 1}},
        "workload": {"model": model, "micro_batch": 1, "seq_len": seq_len, "precision": "bf16", **workload},
        "training": {"optimizer": "adam", "sharding": {"stage": 3}},
    }
    result = simulate(validate_scenario(scenario, "mfu"))
    return result.extra["model_flops"] | {"iteration": result.iteration_time}


@pytest.mark.parametrize("model,seq_len", [("GPT-2-1.5B", 1024), ("LLaMA-7B", 2048), ("BERT-Large", 128)])
def test_model_flops_per_token_are_palms_closed_form(model, seq_len):
    """6 N + 12 l h s per token (Chowdhery et al. 2022, appendix B), within 2%: the closed form counts
    the embedding table as multiplied (it is looked up) and leaves out the pooler and MLM transform."""
    f = _flops(model, seq_len)
    arch = catalog.model(model)
    closed = 6 * model_params(model) + 12 * arch.layers * arch.hidden * seq_len
    assert f["per_gpu_per_s"] / f["tokens_per_s_per_gpu"] == pytest.approx(closed, rel=0.02)
    assert f["mfu"] == pytest.approx(f["per_gpu_per_s"] / catalog.gpu("H100-SXM").peak_flops("bf16"))


def test_recomputation_is_not_model_flops():
    """Activation checkpointing reruns the forward: more time, the same model FLOPs, a lower MFU."""
    plain = _flops("GPT-2-1.5B", 1024)
    recomputed = _flops("GPT-2-1.5B", 1024, activation_checkpointing=True)
    assert recomputed["per_iteration"] == plain["per_iteration"]
    assert recomputed["iteration"] > plain["iteration"] and recomputed["mfu"] < plain["mfu"]
