"""Attention over scores in memory as plain PyTorch ops (workload.attention: eager): Hugging Face's eager
attention and BERT code before PyTorch 2.0 scale, mask, soft-max and drop out the b*a*s*s scores each
in a kernel of its own, where framework code (unfused) runs one fused scale-mask-softmax kernel.

Checked against the op-by-op count (workloads/transformer.py, EAGER_SCORE_PASSES): forward 10 passes
over the scores instead of 6, backward 11 instead of 12, and a one-byte dropout mask each way."""

from __future__ import annotations

import pytest

from clustersim import catalog
from clustersim.errors import InputError
from clustersim.scenario import validate_scenario
from clustersim.simulator import simulate
from clustersim.workloads.transformer import EAGER_SCORE_PASSES, transformer_layers

ARCH = catalog.model("BERT-Large")


def _block(attention: str, d: int = 2, b: int = 8, s: int = 384):
    layers = transformer_layers(ARCH, b, s, d, attention == "fused", False, 1, attention == "eager")
    return layers[1]


def _group(kernels, name):
    (k,) = [k for k in kernels if k.name == name]
    return k


@pytest.mark.parametrize("d", [2, 4])
def test_eager_scores_cost_four_more_passes_forward_one_fewer_backward_and_the_mask(d):
    scores = 8 * ARCH.heads * 384 * 384
    unfused, eager = _block("unfused", d), _block("eager", d)
    fwd = _group(eager.forward, "elementwise").bytes - _group(unfused.forward, "elementwise").bytes
    bwd = _group(eager.backward, "elementwise").bytes - _group(unfused.backward, "elementwise").bytes
    assert fwd == pytest.approx((4 * d + 1) * scores)
    assert bwd == pytest.approx((1 - d) * scores)
    launches = EAGER_SCORE_PASSES[2]
    assert (
        _group(eager.forward, "elementwise").launches
        == _group(unfused.forward, "elementwise").launches + launches[0]
    )
    assert (
        _group(eager.backward, "elementwise").launches
        == _group(unfused.backward, "elementwise").launches + launches[1]
    )
    # the matmuls, attention's FLOPs and the kept activations are the unfused ones
    assert eager.forward_flops == unfused.forward_flops and eager.backward_flops == unfused.backward_flops
    assert eager.activation_bytes == unfused.activation_bytes


def _one_gpu(attention: str, seq_len: int = 384):
    return validate_scenario(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": "A100-80GB"},
            "workload": {
                "model": "BERT-Large",
                "micro_batch": 16,
                "seq_len": seq_len,
                "attention": attention,
            },
        }
    )


def test_eager_is_slower_than_unfused_which_is_slower_than_fused():
    t = {a: simulate(_one_gpu(a)).iteration_time for a in ("fused", "unfused", "eager")}
    assert t["fused"] < t["unfused"] < t["eager"]
    assert t["eager"] > 1.02 * t["unfused"]


def test_an_unknown_attention_is_one_line_naming_the_key():
    with pytest.raises(InputError) as err:
        _one_gpu("flash")
    assert "workload.attention" in str(err.value) and "eager" in str(err.value)
    assert "\n" not in str(err.value)
