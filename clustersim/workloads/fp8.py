"""FP8 training as the frameworks run it: the linear layers' GEMMs in FP8, everything else in bf16.

``workload.precision: fp8`` follows NVIDIA Transformer Engine (TE), which Megatron-LM, NeMo and
NVIDIA's MLPerf GPT-3 submissions (FP8_HYBRID) train with. From TE's PyTorch modules
(github.com/NVIDIA/TransformerEngine, transformer_engine/pytorch/module/linear.py, layernorm_linear.py,
layernorm_mlp.py; the recipe defaults in transformer_engine/common/recipe/__init__.py):

- FP8 GEMMs: te.Linear, LayerNormLinear and LayerNormMLP, i.e. a block's QKV projection, attention
  output projection and MLP fc1/fc2 (gate and up in a gated MLP). Forward casts the input and the
  weight (E4M3); backward casts the output gradient (E5M2 under the default HYBRID format) and runs
  both backward GEMMs in FP8: dgrad (gradient x weight) and wgrad (input^T x gradient), since the
  recipe's ``backward_override`` defaults to None (no GEMM kept in high precision). Outputs are bf16.
- bf16: DotProductAttention (FlashAttention / cuDNN; the recipe's ``fp8_dpa`` defaults to False),
  LayerNorm, GeLU, softmax, dropout, residual adds, the embedding and the LM head (Megatron-LM's
  output layer is a tensor_parallel.ColumnParallelLinear, not a TE module), and the parameters,
  gradients and optimizer of mixed-precision training (catalog.storage_precision).
- Saved for backward: a linear layer keeps its input's FP8 copy for wgrad (linear.py's
  ``saved_inputmat`` is the quantized input; layernorm_mlp.py saves ``ln_out`` and ``act_out``
  quantized and ``fc1_out`` in bf16), so the QKV, fc1 and fc2 inputs are kept at one byte instead of
  two. The output projection's input is the attention output, which fused attention keeps in bf16 for
  its own backward anyway: its FP8 copy adds a byte (unfused attention keeps only the FP8 copy).
- Casts: an FP8 operand made from a bf16 tensor is a cast-transpose pass that reads 2 bytes and writes
  the row-wise and column-wise FP8 copies, 1 + 1 (Hopper's FP8 GEMMs take both operands K-major, so
  dgrad and wgrad need the transposed copies): the inputs of the linear GEMMs forward, their output
  gradients backward. Counted as a pass of its own also where TE fuses the cast into the LayerNorm or
  GeLU that produces the tensor (it then saves the bf16 write instead: the difference is 2 of 4
  bytes on part of the elements). Launches: one standalone cast forward (the output projection's
  input; the QKV and fc1 inputs come out of LayerNorm and the fc2 input out of GeLU already cast),
  three backward (the output gradients of QKV, the projection and fc2; fc1's is fused with dGeLU).

Weights: TE casts them once per step, not per micro-batch, and keeps the FP8 copies (row-wise and
column-wise, 2 bytes per weight: ``_fp8_workspaces``, refreshed when ``is_first_microbatch``, which
Megatron-LM's schedules set) in GPU memory (``weight_copy_bytes``); the cast itself, 4 bytes per
weight once per step, is not counted, nor the scaling factors' amax bookkeeping (a few small kernels
per forward and, under delayed scaling, a small all-reduce of the amaxes).

How each tensor's scale is found (``workload.fp8_recipe``) decides what a cast costs beyond the
cast-transpose pass above:

- ``delayed`` (TE's DelayedScaling, its default recipe and what NeMo and MLPerf's FP8_HYBRID run):
  the scale comes from the amax history of earlier steps and the cast kernel records this tensor's
  amax as it goes: one read per cast.
- ``current`` (TE's Float8CurrentScaling, Megatron-Bridge's ``tensorwise`` FP8 recipe): the amax of
  the tensor itself first, then the cast. TE's documentation (docs/features/low_precision_training/
  fp8_current_scaling/fp8_current_scaling.rst, "Performance analysis"): "Quantization is a
  memory-bound operation that requires reading the tensor twice": an amax pass reading the bf16
  tensor (2 bytes per element, a kernel of its own) before each cast. Weights are still cast once per
  step and kept.
- ``torchao_tensorwise`` (torchao's Float8Linear with dynamic tensorwise scaling, TorchTitan's
  Float8): the same amax pass before each activation and gradient cast, and the weights are not kept
  as FP8 copies: every forward reads the bf16 weight for its amax and casts it row-wise, every backward
  casts it again column-wise (torchao/testing/training/roofline_utils.py, tensorwise "weight": kernel 1
  amax reads 2 bytes per element, kernels 3 and 4 read 2 and write 1 each: 8 bytes per weight element
  per micro-batch, ``TORCHAO_WEIGHT_CAST_BYTES``). Unsharded under FSDP: each rank casts the whole
  all-gathered weight (FSDP2's float8 all-gather, which casts the shard instead, is off by default in
  TorchTitan, ``float8.enable_fsdp_float8_all_gather``). torchao's roofline also assumes torch.compile
  fuses an activation's amax into the op that produced it, "not always true in practice"
  (benchmarks/float8/float8_roofline.py); it is counted as a pass here, as TE's documentation counts it.
  torchao converts the linear layers only, all three GEMMs in FP8; the GEMM rates are the same. It
  saves the bf16 input for backward, not an FP8 copy (``keeps_fp8_inputs``): the activations are
  bf16's.
"""

from __future__ import annotations

from dataclasses import replace

from clustersim.workloads.layers import Kernel, Layer

#: bytes of one element in the formats above
FP8_BYTES, BF16_BYTES = 1, 2
#: a cast-transpose pass per element: read bf16, write the row-wise and the column-wise FP8 copy
CAST_TRANSPOSE_BYTES = BF16_BYTES + 2 * FP8_BYTES
#: standalone cast kernels a block launches (forward, backward), as counted in the module docstring
CAST_LAUNCHES = (1, 3)
#: how a tensor's scale is found (workload.fp8_recipe; module docstring)
RECIPES = ("delayed", "current", "torchao_tensorwise")
#: the amax pass of current (dynamic) scaling before each cast: a read of the bf16 tensor
AMAX_BYTES = BF16_BYTES
#: torchao tensorwise: a weight's amax (2) and its row-wise (forward, 2 + 1) and column-wise (backward,
#: 2 + 1) casts, per weight element and micro-batch (roofline_utils.py, tensorwise "weight")
TORCHAO_WEIGHT_CAST_BYTES = (AMAX_BYTES + BF16_BYTES + FP8_BYTES, BF16_BYTES + FP8_BYTES)


def linear_gemms(
    flops: float, weights: float, inputs: float, outputs: float, launches: int, recipe: str = "delayed"
) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """A block's linear layers in FP8: (forward, backward) kernel groups. ``flops``: the forward GEMMs'
    FLOPs; ``weights``, ``inputs``, ``outputs``: elements of the weights, of the GEMMs' inputs and of
    their outputs (summed over the layers); ``launches``: forward GEMM kernels; ``recipe``: how the
    scales are found (module docstring): current scaling adds an amax pass (``AMAX_BYTES`` per element,
    a launch) before each cast, torchao's tensorwise recipe besides casts the weights in every pass
    (``TORCHAO_WEIGHT_CAST_BYTES``: an amax and a cast per GEMM launch forward, a cast backward).

    Bytes as the 16-bit count (workloads/transformer.py: every operand read once, every output
    written once, backward the same for dgrad and for wgrad plus the weight gradient's write) with
    the FP8 operands at one byte and the outputs and the weight gradient bf16:
      forward  GEMM  weights + inputs + 2 outputs
      backward dgrad weights + outputs (the gradient) + 2 inputs (the input gradient)
               wgrad inputs (the saved FP8 copy) + outputs + 2 x 2 weights (the weight gradient)
    """
    if recipe not in RECIPES:
        raise ValueError(f"unknown FP8 recipe {recipe!r}: one of {', '.join(RECIPES)}")
    fwd_bytes = FP8_BYTES * (weights + inputs) + BF16_BYTES * outputs
    dgrad = FP8_BYTES * (weights + outputs) + BF16_BYTES * inputs
    wgrad = FP8_BYTES * (inputs + outputs) + 2 * BF16_BYTES * weights
    amax, passes = (0, 1) if recipe == "delayed" else (AMAX_BYTES, 2)
    forward = (
        Kernel("gemm", flops, fwd_bytes, launches, precision="fp8"),
        Kernel(
            "fp8_cast",
            0.0,
            (CAST_TRANSPOSE_BYTES + amax) * inputs,
            passes * CAST_LAUNCHES[0],
            precision="bf16",
        ),
    )
    backward = (
        Kernel("gemm", 2 * flops, dgrad + wgrad, 2 * launches, precision="fp8"),
        Kernel(
            "fp8_cast",
            0.0,
            (CAST_TRANSPOSE_BYTES + amax) * outputs,
            passes * CAST_LAUNCHES[1],
            precision="bf16",
        ),
    )
    if recipe == "torchao_tensorwise":
        fwd_w, bwd_w = TORCHAO_WEIGHT_CAST_BYTES
        forward += (Kernel("fp8_cast", 0.0, fwd_w * weights, 2 * launches, precision="bf16"),)
        backward += (Kernel("fp8_cast", 0.0, bwd_w * weights, launches, precision="bf16"),)
    return forward, backward


def keeps_fp8_inputs(recipe: str) -> bool:
    """Whether the linear layers keep their inputs' FP8 copies for wgrad (TE's modules, any recipe), or
    the bf16 inputs themselves (torchao: ``matmul_with_hp_or_float8_args`` saves ``input_hp`` and
    casts it again in backward, torchao/float8/float8_linear.py)."""
    return recipe != "torchao_tensorwise"


def saved_bytes_saved(
    tokens: float,
    hidden: int,
    ffn: int,
    fused_attention: bool,
    tensor: int = 1,
    sequence_parallel: bool = False,
) -> float:
    """Bytes by which one block's activations kept for backward shrink under FP8, on one of ``tensor``
    ranks (the 16-bit count less these): the QKV and fc1 inputs (``hidden`` wide; replicated over the
    tensor-parallel ranks unless sequence parallelism splits them) and the fc2 input (``ffn`` wide,
    split) are kept at one byte; the output projection's input (split) saves a byte with unfused
    attention and costs one with fused attention, which keeps its bf16 output besides."""
    replicated = tensor if sequence_parallel else 1
    projection = -hidden if fused_attention else hidden
    per_token = 2 * hidden / replicated + (ffn + projection) / tensor
    return tokens * per_token * (BF16_BYTES - FP8_BYTES)


def weight_copy_bytes(layers: tuple[Layer, ...] | list[Layer], recipe: str = "delayed") -> float:
    """Bytes of the FP8 weight copies TE keeps between micro-batches: the row-wise and the column-wise
    copy of every parameter of a layer with FP8 GEMMs (a block's parameters are nearly all its linear
    weights; its LayerNorm and bias vectors are counted too). torchao's tensorwise recipe keeps none:
    it casts the weights in every pass (module docstring); TorchTitan's Table 1 shows no more memory
    with Float8 than without (76.8 GiB against 77.0)."""
    if recipe == "torchao_tensorwise":
        return 0.0
    fp8_layers = (x for x in layers if any(k.precision == "fp8" for k in x.forward))
    return 2 * FP8_BYTES * sum(x.params for x in fp8_layers)


def in_bf16(layer: Layer) -> Layer:
    """``layer`` with every kernel that names no precision of its own run in bf16 (under FP8 training
    all but the linear layers' GEMMs and casts)."""

    def mark(kernels: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
        return tuple(k if k.precision is not None else replace(k, precision="bf16") for k in kernels)

    return replace(layer, forward=mark(layer.forward), backward=mark(layer.backward))
