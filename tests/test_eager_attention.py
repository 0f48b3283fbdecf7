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
    layers = transformer_layers(ARCH, b, s, d, attention, False, 1)
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
    assert "not 'flash' (FlashAttention is 'fused')" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(InputError) as err:
        _one_gpu("sdpa")
    assert str(err.value).endswith("not 'sdpa' (PyTorch's scaled_dot_product_attention is 'fused')")


def _run_json(runner, tmp_path, workload: dict, *args: str) -> dict:
    import json

    import yaml

    from clustersim.cli import app

    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump({"cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": "H200"}, "workload": workload})
    )
    res = runner.invoke(app, ["run", str(path), "--json", "--samples", "0", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_run_says_how_attention_and_convolutions_were_priced(runner, tmp_path):
    bert = _run_json(runner, tmp_path, {"model": "BERT-Large", "micro_batch": 8, "attention": "eager"})
    assert bert["sources"]["attention"].startswith("eager:")
    assert bert["sources"]["attention"].endswith("(workload.attention)")
    assert "convolutions" not in bert["sources"]
    default = _run_json(runner, tmp_path, {"model": "BERT-Large", "micro_batch": 8})
    fused = default["sources"]["attention"]
    assert fused.startswith("fused:") and "(default);" in fused
    assert "cuDNN's fused attention (the code's default) at its published rate" in fused  # H200's chip
    resnet = _run_json(runner, tmp_path, {"model": "ResNet-50", "micro_batch": 64, "precision": "bf16"})
    assert "each convolution its own roofline" in resnet["sources"]["convolutions"]
    assert "attention" not in resnet["sources"]


def test_a_key_the_model_does_not_use_is_a_note_not_silence(runner, tmp_path):
    resnet = _run_json(runner, tmp_path, {"model": "ResNet-50", "micro_batch": 64, "attention": "eager"})
    assert (
        "workload.attention does not apply to ResNet-50 (a convolution network): it is not used"
        in resnet["notes"]
    )
    bert = _run_json(
        runner, tmp_path, {"model": "BERT-Large", "micro_batch": 8, "memory_format": "contiguous"}
    )
    assert any(n.startswith("workload.memory_format does not apply to BERT-Large") for n in bert["notes"])
    plain = _run_json(runner, tmp_path, {"model": "BERT-Large", "micro_batch": 8, "attention": "eager"})
    assert not any("does not apply" in n or "compiled" in n for n in plain["notes"])
    compiled = _run_json(
        runner,
        tmp_path,
        {"model": "BERT-Large", "micro_batch": 8, "attention": "eager", "execution": "compiled"},
    )
    assert any("torch.compile fuses the scale, mask" in n for n in compiled["notes"])


def test_a_profile_measured_with_other_attention_says_its_measurement_is_used_as_it_is(runner, tmp_path):
    """The shipped H200 profile measured clustersim's plain BERT-Large build with sdpa (fused
    attention): a scenario of that code (workload.implementation: plain) is priced by it."""
    workload = {
        "model": "BERT-Large",
        "micro_batch": 16,
        "seq_len": 128,
        "precision": "bf16",
        "implementation": "plain",
    }
    eager = _run_json(
        runner, tmp_path, {**workload, "attention": "eager"}, "--profile", "builtin:h200-pytorch-2.11"
    )
    assert any(
        "with sdpa attention (fused), the scenario asks for eager (workload.attention)" in n
        for n in eager["notes"]
    )
    fused = _run_json(runner, tmp_path, workload, "--profile", "builtin:h200-pytorch-2.11")
    assert not any(n.startswith("warning") and "attention" in n for n in fused["notes"])


def test_a_changed_copy_keeps_what_the_scenario_left_to_its_defaults_unset():
    """compare and sweeps resize a scenario with with_changes: keys the scenario never set stay unset,
    so the copy neither gains notes for keys its model does not use nor calls defaults given."""
    from clustersim.api import load_scenario

    resnet = load_scenario("preset:binsgdm-resnet50")
    resized = resnet.with_world_size(64)
    assert resized.workload.model_fields_set == resnet.workload.model_fields_set
    assert not any("does not apply" in n for n in simulate(resized).notes)
    bert = load_scenario("preset:default").with_changes(**{"cluster.nodes": 2})
    assert "attention" not in bert.workload.model_fields_set
    eager = bert.with_changes(**{"workload.attention": "eager"})
    assert "attention" in eager.workload.model_fields_set and eager.cluster.nodes == 2
