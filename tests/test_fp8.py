"""FP8 training as Transformer Engine runs it (workloads/fp8.py): the linear layers' GEMMs in FP8,
everything else in bf16 on bf16 tensors.

Checked against closed forms (a GPT block's FP8 FLOPs are its linear layers' 2T(4h^2 + 2hf) forward
and twice that backward; its saved activations are Korthikanti et al.'s 34sbh less the 5sbh kept as
FP8 copies; the GEMM bytes of each operand at its width), and invariants (FP8 never slower than bf16,
never faster than pricing every kernel at the FP8 rate; convolution networks are bf16; parameters,
gradients and pipeline messages keep bf16's bytes)."""

from __future__ import annotations

import pytest

from clustersim import catalog
from clustersim.catalog import storage_precision
from clustersim.cost_models.compute import DeviceCosts
from clustersim.errors import InputError
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.simulator.model_parallel import Layout
from clustersim.workloads import fp8
from clustersim.workloads.builder import build_workload
from clustersim.workloads.layers import Kernel
from clustersim.workloads.transformer import transformer_layers
from tests.conftest import make_scenario

H100 = catalog.gpu("H100-SXM")


def _gpt(precision: str, model: str = "GPT-3-1.3B", micro_batch: int = 4, seq: int = 2048, **extra):
    return make_scenario(
        **{
            "cluster.gpu": "H100-SXM",
            "cluster.nodes": 1,
            "cluster.gpus_per_node": 1,
            "workload.model": model,
            "workload.seq_len": seq,
            "workload.micro_batch": micro_batch,
            "workload.precision": precision,
            **extra,
        }
    )


def _blocks(workload):
    return [x for x in workload.layers if x.name.startswith("block")]


@pytest.mark.parametrize("model", ["GPT-3-1.3B", "Llama-3-8B"])
def test_fp8_flops_are_the_linear_layers_flops(model):
    """Closed form: a block's FP8 FLOPs are its QKV, projection and MLP GEMMs, 2T(qkv + h^2 + mlp)
    forward (GPT with f = 4h: 24Th^2) and twice that backward (dgrad and wgrad both FP8); attention's
    4Ths stays bf16, as do the embedding and the LM head."""
    s = _gpt("fp8", model, micro_batch=2, seq=1024)
    w = build_workload(s.workload)
    arch = catalog.model(model)
    h, f, tokens = arch.hidden, arch.ffn, 2 * 1024
    kv = h * (arch.kv_heads or arch.heads) // arch.heads
    mlp = (3 if arch.style == "llama" else 2) * h * f
    linear = 2 * tokens * (h * h + 2 * h * kv + h * h + mlp)
    if arch.style == "gpt":
        assert linear == 2 * tokens * (4 * h * h + 2 * h * f)
    for block in _blocks(w):
        fwd8 = sum(k.flops for k in block.forward if k.precision == "fp8")
        bwd8 = sum(k.flops for k in block.backward if k.precision == "fp8")
        assert fwd8 == pytest.approx(linear) and bwd8 == pytest.approx(2 * linear)
        attention = [k for k in block.forward if k.name == "attention"]
        assert attention[0].precision == "bf16" and attention[0].flops == pytest.approx(4 * tokens * 1024 * h)
    for layer in w.layers:  # every kernel says its precision: fp8 only for the blocks' linear GEMMs
        for k in layer.forward + layer.backward:
            assert k.precision in ("fp8", "bf16")
            assert (k.precision == "fp8") == (layer.name.startswith("block") and k.name == "gemm")
    # the same FLOPs as bf16, kernel group for kernel group
    bf = build_workload(_gpt("bf16", model, micro_batch=2, seq=1024).workload)
    assert w.forward_flops == pytest.approx(bf.forward_flops)
    assert w.backward_flops == pytest.approx(bf.backward_flops)


def test_gemm_bytes_are_each_operand_at_its_width():
    """FP8 operands at 1 byte, outputs and the weight gradient bf16; the cast-transpose kernels move
    4 bytes per GEMM input element forward and per output-gradient element backward."""
    weights, inputs, outputs = 1000.0, 300.0, 500.0
    fwd, bwd = fp8.linear_gemms(7.0, weights, inputs, outputs, 4)
    gemm, cast = fwd
    assert (gemm.precision, gemm.flops, gemm.launches) == ("fp8", 7.0, 4)
    assert gemm.bytes == weights + inputs + 2 * outputs
    assert cast.bytes == 4 * inputs and cast.precision == "bf16" and cast.flops == 0
    gemm_b, cast_b = bwd
    assert gemm_b.flops == 14.0 and gemm_b.launches == 8
    assert gemm_b.bytes == (weights + outputs + 2 * inputs) + (inputs + outputs + 4 * weights)
    assert cast_b.bytes == 4 * outputs
    # fewer GEMM bytes than the 16-bit count of the same block (workloads/transformer.py)
    w8 = build_workload(_gpt("fp8").workload)
    w16 = build_workload(_gpt("bf16").workload)
    b8, b16 = _blocks(w8)[0], _blocks(w16)[0]
    for phase in ("forward", "backward"):
        g8 = next(k for k in getattr(b8, phase) if k.name == "gemm")
        g16 = next(k for k in getattr(b16, phase) if k.name == "gemm")
        assert g8.bytes < g16.bytes


def test_a_kernels_own_precision_sets_its_rate():
    costs = DeviceCosts(H100)
    gemm = Kernel("gemm", 1e15, 1e6, 1)
    assert costs.kernel_time(Kernel("gemm", 1e15, 1e6, 1, precision="fp8"), "bf16") == pytest.approx(
        costs.kernel_time(gemm, "fp8")
    )
    assert costs.kernel_time(Kernel("gemm", 1e15, 1e6, 1, precision="bf16"), "fp8") == pytest.approx(
        costs.kernel_time(gemm, "bf16")
    )
    assert costs.kernel_time(gemm, "fp8") < costs.kernel_time(gemm, "bf16")


@pytest.mark.parametrize(
    ("model", "micro_batch", "seq"),
    [("GPT-3-1.3B", 1, 512), ("GPT-3-1.3B", 4, 2048), ("Llama-3-8B", 1, 8192)],
)
def test_fp8_between_all_fp8_and_bf16(model, micro_batch, seq):
    """A block's device time in FP8 is never above bf16's (its GEMMs are faster and move fewer bytes;
    the casts are small beside them at GEMM-bound sizes) and never below the time of pricing every
    kernel at the FP8 rate on one-byte tensors, which is what FP8 training does not do."""
    costs = DeviceCosts(H100)
    t = {}
    for p in ("fp8", "bf16"):
        block = _blocks(build_workload(_gpt(p, model, micro_batch, seq).workload))[0]
        t[p] = costs.kernels_time(block.forward + block.backward, p)
    all_fp8 = transformer_layers(catalog.model(model), micro_batch, seq, 1)[
        1
    ]  # every kernel at one byte, FP8 rate
    bound = costs.kernels_time(all_fp8.forward + all_fp8.backward, "fp8")
    assert bound < t["fp8"] < t["bf16"]


def test_step_fp8_faster_than_bf16_and_mfu_against_the_fp8_peak():
    r8, r16 = simulate(_gpt("fp8")), simulate(_gpt("bf16"))
    assert r8.iteration_time < r16.iteration_time
    # attention, norms and the head in bf16: well short of twice as fast
    assert r8.iteration_time > 0.5 * r16.iteration_time


def test_convolution_networks_run_in_bf16():
    s = {"workload.model": "ResNet-50", "workload.micro_batch": 32, "cluster.gpu": "H100-SXM"}
    w8 = build_workload(make_scenario(**s, **{"workload.precision": "fp8"}).workload)
    w16 = build_workload(make_scenario(**s, **{"workload.precision": "bf16"}).workload)
    costs = DeviceCosts(H100)
    for a, b in zip(w8.layers, w16.layers, strict=True):
        assert all(k.precision == "bf16" for k in a.forward + a.backward)
        assert costs.kernels_time(a.forward, "fp8") == pytest.approx(costs.kernels_time(b.forward, "bf16"))


def test_saved_activations_keep_the_linear_inputs_as_fp8():
    """Korthikanti et al. 2022: 34sbh bytes per block in 16 bits (fused attention). Under TE the QKV,
    fc1 and fc2 inputs are kept as FP8 copies (h + h + 4h elements at one byte less) and the output
    projection's FP8 copy (h) sits beside attention's bf16 output: 34 - 5 = 29sbh."""
    s, b = 2048, 4
    h = catalog.model("GPT-3-1.3B").hidden
    a8 = _blocks(build_workload(_gpt("fp8").workload))[0].activation_bytes
    a16 = _blocks(build_workload(_gpt("bf16").workload))[0].activation_bytes
    assert a16 == pytest.approx(34 * s * b * h)
    assert a8 == pytest.approx(29 * s * b * h)
    # unfused attention keeps only the FP8 copy of the projection's input: one more h saved
    unfused = build_workload(_gpt("fp8", **{"workload.attention": "unfused"}).workload)
    unfused16 = build_workload(_gpt("bf16", **{"workload.attention": "unfused"}).workload)
    diff = _blocks(unfused16)[0].activation_bytes - _blocks(unfused)[0].activation_bytes
    assert diff == pytest.approx(7 * s * b * h)


@pytest.mark.parametrize("sequence_parallel", [True, False])
def test_model_parallel_activations(sequence_parallel):
    """Per rank, t = 4: sequence-parallel 34/t sbh becomes 29/t; without it, 10 + 24/t becomes
    8 + 21/t (the QKV and fc1 inputs are replicated, the fc2 and projection inputs split)."""
    extra = {
        "cluster.gpus_per_node": 8,
        "training.parallelism.tensor": 4,
        "training.parallelism.pipeline": 2,
        "training.parallelism.sequence_parallel": sequence_parallel,
        "workload.gradient_accumulation": 8,
    }
    per = {}
    for p in ("fp8", "bf16"):
        sc = _gpt(p, **extra)
        per[p] = Layout.of(sc, build_workload(sc.workload)).block_activation_bytes()
    sbh = 4 * 2048 * catalog.model("GPT-3-1.3B").hidden
    t = 4
    if sequence_parallel:
        assert per["bf16"] == pytest.approx(34 / t * sbh) and per["fp8"] == pytest.approx(29 / t * sbh)
    else:
        assert per["bf16"] == pytest.approx((10 + 24 / t) * sbh)
        assert per["fp8"] == pytest.approx((8 + 21 / t) * sbh)


def test_parameters_gradients_and_messages_keep_bf16_bytes():
    """FP8 training keeps bf16 weights, fp32 master weights and bf16 gradients; TE adds the cached FP8
    weight copies (row- and column-wise, 2 B per parameter of the blocks)."""
    assert storage_precision("fp8") == "bf16" and storage_precision("fp32") == "fp32"
    extra = {"cluster.gpus_per_node": 2}
    c8, c16 = build_context(_gpt("fp8", **extra)), build_context(_gpt("bf16", **extra))
    assert c8.element_bytes == c16.element_bytes == 2
    assert c8.grad_bytes == c16.grad_bytes == 2
    m8, m16 = simulate(_gpt("fp8", **extra)).memory, simulate(_gpt("bf16", **extra)).memory
    assert m8["parameters"] == m16["parameters"] and m8["gradients"] == m16["gradients"]
    block_params = sum(x.params for x in _blocks(c8.workload))
    assert m8["fp8_weight_copies"] == pytest.approx(2 * block_params)
    assert "fp8_weight_copies" not in m16
    assert m8["activations"] < m16["activations"]


def test_sequence_parallel_all_gathers_move_fp8():
    """TE quantizes a linear layer's input (forward) and output gradient (backward) before the
    sequence-parallel all-gather: a block's all-gathers carry half of bf16's bytes; reduce-scatters,
    the embedding's and the head's collectives, and the all-reduces without sequence parallelism
    keep bf16's."""
    extra = {
        "cluster.gpus_per_node": 8,
        "training.parallelism.tensor": 4,
        "training.parallelism.pipeline": 2,
        "training.parallelism.sequence_parallel": True,
        "workload.gradient_accumulation": 4,
    }

    def tp_bytes(precision, **more):
        ops = [op for op in simulate(_gpt(precision, **{**extra, **more})).ops if op.name.startswith("tp ")]
        out = {}
        for op in ops:
            kind = op.name.split(" x")[0]
            out[kind] = out.get(kind, 0.0) + op.intra_node_bytes
        return out

    b8, b16 = tp_bytes("fp8"), tp_bytes("bf16")
    assert b8["tp reduce_scatter"] == pytest.approx(b16["tp reduce_scatter"])
    # blocks' all-gathers at one byte; the embedding's (forward) and the head's (backward) at two
    assert b8["tp all_gather fp8"] + b8["tp all_gather"] < b16["tp all_gather"]
    assert 2 * b8["tp all_gather fp8"] + b8["tp all_gather"] == pytest.approx(b16["tp all_gather"])
    no_sp = {"training.parallelism.sequence_parallel": False}
    assert tp_bytes("fp8", **no_sp) == pytest.approx(tp_bytes("bf16", **no_sp))


# ---- how the scales are found: workload.fp8_recipe ------------------------------------------------
def _casts(layer, phase: str) -> float:
    return sum(k.bytes for k in getattr(layer, phase) if k.name == "fp8_cast")


def _linear_weights(model: str) -> float:
    """Elements of a block's linear weights: QKV (grouped K and V), output projection, gated MLP."""
    a = catalog.model(model)
    h, f = a.hidden, a.ffn
    kv = h * (a.kv_heads or a.heads) // a.heads
    return h * h + 2 * h * kv + h * h + (3 if a.style == "llama" else 2) * h * f


def test_current_scaling_reads_each_cast_tensor_once_more():
    """TE's documentation: current scaling 'requires reading the tensor twice', an amax pass (2 bytes
    per bf16 element, a kernel of its own) before each cast-transpose (4 bytes): every cast moves 6/4
    of delayed scaling's bytes in twice the launches; the GEMMs and everything else are unchanged."""
    delayed = _blocks(build_workload(_gpt("fp8", "Llama-3-8B", 1, 2048).workload))[0]
    current = _blocks(
        build_workload(_gpt("fp8", "Llama-3-8B", 1, 2048, **{"workload.fp8_recipe": "current"}).workload)
    )[0]
    for phase in ("forward", "backward"):
        assert _casts(current, phase) == pytest.approx(_casts(delayed, phase) * (4 + 2) / 4)
        launches = {k.name: k.launches for k in getattr(current, phase) if k.name == "fp8_cast"}
        assert launches["fp8_cast"] == 2 * next(
            k.launches for k in getattr(delayed, phase) if k.name == "fp8_cast"
        )
        rest = [k for k in getattr(current, phase) if k.name != "fp8_cast"]
        assert rest == [k for k in getattr(delayed, phase) if k.name != "fp8_cast"]
    assert current.activation_bytes == delayed.activation_bytes


def test_torchao_tensorwise_casts_the_weights_in_every_pass_and_keeps_no_copies():
    """torchao's tensorwise recipe (roofline_utils.py, 'weight'): an amax read (2) and a row-wise cast
    (2 + 1) forward, a column-wise cast (2 + 1) backward, per linear weight element and micro-batch, on
    top of current scaling's activation casts; no FP8 weight copies are kept between micro-batches."""
    for model in ("Llama-3-8B", "GPT-3-1.3B"):
        blocks = {
            r: _blocks(build_workload(_gpt("fp8", model, 1, 2048, **{"workload.fp8_recipe": r}).workload))[0]
            for r in ("current", "torchao_tensorwise")
        }
        weights = _linear_weights(model)
        extra = {
            p: _casts(blocks["torchao_tensorwise"], p) - _casts(blocks["current"], p)
            for p in ("forward", "backward")
        }
        assert extra["forward"] == pytest.approx(5 * weights)
        assert extra["backward"] == pytest.approx(3 * weights)
    # torchao saves the bf16 input (float8_linear.py, save_for_backward(input_hp, ...)): bf16's 34sbh
    ao = _blocks(build_workload(_gpt("fp8", **{"workload.fp8_recipe": "torchao_tensorwise"}).workload))[0]
    assert ao.activation_bytes == pytest.approx(
        _blocks(build_workload(_gpt("bf16").workload))[0].activation_bytes
    )
    tp = {
        "cluster.gpus_per_node": 8,
        "training.parallelism.tensor": 4,
        "training.parallelism.pipeline": 2,
        "training.parallelism.sequence_parallel": True,
        "workload.gradient_accumulation": 8,
    }
    kept = {}
    for name, sc in (
        ("bf16", _gpt("bf16", **tp)),
        ("torchao", _gpt("fp8", **tp, **{"workload.fp8_recipe": "torchao_tensorwise"})),
    ):
        kept[name] = Layout.of(sc, build_workload(sc.workload)).block_activation_bytes()
    assert kept["torchao"] == pytest.approx(kept["bf16"])
    two = {"cluster.gpus_per_node": 2}
    current = _gpt("fp8", **two, **{"workload.fp8_recipe": "current"})
    torchao = _gpt("fp8", **two, **{"workload.fp8_recipe": "torchao_tensorwise"})
    assert simulate(torchao).memory.get("fp8_weight_copies", 0.0) == 0.0
    assert simulate(current).memory["fp8_weight_copies"] > 0
    assert fp8.weight_copy_bytes(build_workload(current.workload).layers, "torchao_tensorwise") == 0


def test_recipes_cost_in_order_and_only_under_fp8():
    """More passes are never faster: delayed <= current <= torchao_tensorwise, each still faster than
    bf16 at a GEMM-bound size; a recipe on a bf16 workload changes nothing and says it is not used."""
    times = [simulate(_gpt("fp8", **{"workload.fp8_recipe": r})).iteration_time for r in fp8.RECIPES]
    assert times == sorted(times) and times[0] < times[-1]
    bf16 = simulate(_gpt("bf16"))
    assert times[-1] < bf16.iteration_time
    # a recipe on a bf16 workload is refused (scenario validation), never simulated as if it were FP8
    with pytest.raises(InputError, match="applies to precision fp8 only") as refused:
        _gpt("bf16", **{"workload.fp8_recipe": "current"})
    assert refused.value.key == "workload.fp8_recipe"
    # a scenario written out whole, defaults included (as sweeps and plans do), is read again as it was
    from clustersim.scenario import validate_scenario

    whole = _gpt("bf16").model_dump(mode="json")
    assert whole["workload"]["fp8_recipe"] is None and validate_scenario(whole).workload.precision == "bf16"
    with pytest.raises(ValueError, match="unknown FP8 recipe"):
        fp8.linear_gemms(1.0, 1.0, 1.0, 1.0, 1, "rowwise")
