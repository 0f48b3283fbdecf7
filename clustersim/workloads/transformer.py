"""Transformer layers (BERT, GPT, LLaMA styles) from hyper-parameters.

FLOP counts follow the usual convention (Kaplan et al. 2020; Narayanan et al. 2021): a GEMM of
(m x k) by (k x n) costs 2mkn FLOPs, backward costs twice forward. With T = b*s tokens:
  GEMMs per block:   2T(4h^2 + 2hf)   (SwiGLU: 2T(4h^2 + 3hf); with grouped-query attention,
                     kv_heads of heads, K and V are h x h*kv_heads/heads, so 4h^2 becomes
                     2h^2 + 2h^2*kv_heads/heads)
  attention scores:  4Ths             (QK^T and PV; fused attention's backward recomputes them: 2.5x)
Saved activations per block follow Korthikanti et al. 2022, eq. 1 (no recomputation, 16-bit):
  s*b*h*(34 + 5*a*s/h) bytes with unfused attention, s*b*h*34 with fused (no s^2 scores kept),
  scaled by the element size for other precisions.
Memory-bound kernels (LayerNorm, residual adds, dropout, GeLU, softmax) are counted as bytes read
and written. Framework code with fused kernels on 16-bit activations (Megatron-LM, DeepSpeed, apex):
d*(14*T*h + 2*T*f + 4*b*a*s^2) forward (no s^2 term when fused), twice that backward. Plain PyTorch
model code (Hugging Face transformers under autocast: one kernel per op, fp32 residual stream, casts)
moves several times that, counted per style in catalogs/execution.yaml (unfused_pointwise).
"""

from __future__ import annotations

from clustersim import catalog
from clustersim.catalog import TransformerArch, eager_kernels
from clustersim.workloads import fp8 as fp8_rules
from clustersim.workloads.layers import AttentionShape, Kernel, Layer

# Eager attention over scores in memory, counted op by op against the unfused count (which takes 6
# passes over the b*a*s*s scores forward: QK^T writes them, a fused scale-mask-softmax reads and
# writes, dropout reads and writes, PV reads; and 12 backward). As plain PyTorch ops (torch.matmul,
# / sqrt(d), + mask, softmax, dropout, torch.matmul) the forward makes 10 passes and the backward 11
# (PV's two gradients 2, dropout's 2, softmax's 3, the scale's 2, QK^T's two gradients 2); dropout
# also writes and reads a one-byte mask. Extra passes (forward, backward) and kernel launches
# (forward: the scale and the mask add, a softmax and a dropout of its own where the fused count has
# one kernel; backward: the scale's, softmax's and dropout's gradients).
EAGER_SCORE_PASSES = (4, -1, (3, 3))

# Kernel launches: each kernel group carries how many kernels eager PyTorch launches for it
# (catalogs/execution.yaml, per architecture style); the pointwise group takes what the GEMMs and
# attention leave of a layer's count, so the layer's total is the catalog's.


def with_padded_vocab(arch: TransformerArch, multiple: int) -> TransformerArch:
    """``arch`` with its vocabulary padded to a multiple of ``multiple`` (workload.pad_vocab_to_multiple_of):
    the padding rows are real embedding and LM-head rows, trained and communicated like the rest."""
    if arch.vocab % multiple == 0:
        return arch
    return arch.model_copy(update={"vocab": -(-arch.vocab // multiple) * multiple})


def row_alignment(row_bytes: int) -> int:
    """The widest load (1 to 16 bytes, a power of two) that starts every row of ``row_bytes``."""
    align = 16
    while row_bytes % align:
        align //= 2
    return align


def _embedding(arch: TransformerArch, b: int, s: int, d: int, framework_code: bool = False) -> Layer:
    h, tokens = arch.hidden, b * s
    tensors = [arch.vocab * h]
    if arch.max_positions:
        tensors.append(arch.max_positions * h)
    if arch.token_types:
        tensors.append(arch.token_types * h)
    if arch.style == "bert":
        tensors += [h, h]  # embedding LayerNorm weight and bias
    tables = len(tensors) if arch.style != "bert" else len(tensors) - 2
    fwd_bytes = d * tokens * h * (tables + 1 + (2 if arch.style == "bert" else 0))
    # Backward scatters token gradients into a dense table gradient that DDP reduces whole.
    bwd_bytes = d * (tokens * h * (tables + 2) + arch.vocab * h)
    n_fwd, n_bwd = eager_kernels(arch.style, "embedding", framework_code)
    return Layer(
        name="embedding",
        param_tensors=tuple(tensors),
        forward=(Kernel("gather", 0.0, fwd_bytes, n_fwd),),
        backward=(Kernel("scatter_add", 0.0, bwd_bytes, n_bwd),),
        activation_bytes=d * tokens * h,
    )


def _pointwise_bytes(
    arch: TransformerArch, tokens: int, d: int, params: int, scores: int, extra: int, unfused: bool
) -> tuple[float, float]:
    """A block's pointwise traffic (forward, backward bytes). Fused framework kernels on 16-bit
    activations read and write d*(14*T*h + 2*T*f) forward and twice that backward (module docstring).
    Plain PyTorch model code (``unfused``) moves what its ops move, counted per architecture style in
    catalogs/execution.yaml: under autocast an fp32 residual stream, a cast before each matmul, and
    each weight cast every step; several times the fused traffic."""
    h, f = arch.hidden, arch.ffn
    scores_bytes = 4 * d * scores
    if not unfused:
        forward = d * (14 * tokens * h + 2 * tokens * f + extra) + scores_bytes
        return forward, 2 * forward
    autocast = d < 4
    (fh, ff), (bh, bf) = catalog.unfused_pointwise(arch.style, autocast)
    casts = catalog.weight_cast_bytes_per_param() * params if autocast else 0.0
    forward = tokens * (fh * h + ff * f) + scores_bytes + casts
    backward = tokens * (bh * h + bf * f) + 2 * scores_bytes + casts
    return forward, backward


def _block(
    arch: TransformerArch,
    index: int,
    b: int,
    s: int,
    d: int,
    attention: str = "fused",
    unfused_pointwise: bool = False,
    fp8: bool = False,
    fp8_recipe: str = "delayed",
) -> Layer:
    """``fp8``: the linear layers' GEMMs run in FP8 as Transformer Engine runs them, on bf16 activations
    (``d`` is then 2; workloads/fp8.py), their scales found as ``fp8_recipe`` says. ``attention``
    (workload.attention). ``fused``: one kernel that never writes the b*a*s*s scores to memory
    (FlashAttention, PyTorch's scaled_dot_product_attention): it reads Q, K, V and writes the output, and
    its backward recomputes the scores (2.5x the forward's FLOPs, Dao et al. 2022); the block keeps no s^2
    activations. ``unfused`` (Megatron-LM's and apex's softmax kernels) writes the scores, reads them back
    through one fused scale-mask-softmax kernel and dropout, and keeps them for backward (Korthikanti et
    al. 2022's 5as/h term). ``eager`` (unfused, as plain PyTorch ops: Hugging Face's eager attention, BERT
    code before PyTorch 2.0) scales and masks the scores in two kernels of their own and keeps a one-byte
    dropout mask (EAGER_SCORE_PASSES)."""
    h, f, a, tokens = arch.hidden, arch.ffn, arch.heads, b * s
    fused, eager = attention == "fused", attention == "eager"
    kv = h * (arch.kv_heads or a) // a  # width of K and V (grouped-query attention: fewer heads)
    qkv = h * h + 2 * h * kv
    if arch.style == "llama":
        tensors = (h, qkv, h * h, h, h * f, h * f, f * h)
        mlp_gemm = 3 * h * f
        mlp_io = tokens * (h + 2 * f) + tokens * (f + h)
        extra_elementwise = 3 * tokens * f  # SiLU and gating multiply
    else:
        tensors = (qkv, h + 2 * kv, h * h, h, h, h, h * f, f, f * h, h, h, h)
        mlp_gemm = 2 * h * f
        mlp_io = tokens * (h + f) * 2
        extra_elementwise = 0
    gemm_flops = 2 * tokens * (qkv + h * h + mlp_gemm)
    attn_flops = 4 * tokens * s * h
    weight_bytes = d * sum(tensors)
    gemm_io = d * (tokens * (h + 3 * h) + tokens * 2 * h + mlp_io)
    # the same elements, GEMM inputs and outputs apart (QKV, projection, MLP), for FP8's byte widths
    gemm_in = tokens * (3 * h + f)
    gemm_out = tokens * (3 * h + h) + (mlp_io - tokens * (h + f))
    scores = 0 if fused else b * a * s * s
    attn_bytes = d * (2 * scores + (4 if fused else 3) * tokens * h)
    elementwise, elementwise_bwd = _pointwise_bytes(
        arch, tokens, d, sum(tensors), scores, extra_elementwise, unfused_pointwise
    )
    n_fwd, n_bwd = eager_kernels(arch.style, "block", not unfused_pointwise)
    if eager and scores:
        forward_passes, backward_passes, launches = EAGER_SCORE_PASSES
        elementwise += (forward_passes * d + 1) * scores  # + the dropout mask, one byte per score
        elementwise_bwd += (backward_passes * d + 1) * scores
        n_fwd, n_bwd = n_fwd + launches[0], n_bwd + launches[1]
    attn_bwd_flops = 2.5 * attn_flops if fused else 2 * attn_flops
    attn_bwd_bytes = d * 8 * tokens * h if fused else 2 * attn_bytes
    # GEMM launches: fused QKV, output projection and the MLP's 2 (GeLU) or 3 (gated) matrices forward;
    # backward computes the input and the weight gradient of each. Attention: QK^T and AV forward.
    n_gemm = 2 + (3 if arch.style == "llama" else 2)
    # a fused kernel's rate is its library's at this shape (cost_models/attention.py); BERT attends both
    # ways, GPT and LLaMA under a causal mask
    causal = arch.style != "bert"
    shape_fwd = AttentionShape(s, h // a, causal, backward=False) if fused else None
    shape_bwd = AttentionShape(s, h // a, causal, backward=True) if fused else None
    forward = (
        Kernel("gemm", gemm_flops, weight_bytes + gemm_io, n_gemm),
        Kernel("attention", attn_flops, attn_bytes, 2, attention=shape_fwd),
        Kernel("elementwise", 0.0, elementwise, max(1, n_fwd - n_gemm - 2)),
    )
    backward = (
        Kernel("gemm", 2 * gemm_flops, 2 * (weight_bytes + gemm_io) + weight_bytes, 2 * n_gemm),
        Kernel("attention", attn_bwd_flops, attn_bwd_bytes, 4, attention=shape_bwd),
        Kernel("elementwise", 0.0, elementwise_bwd, max(1, n_bwd - 2 * n_gemm - 4)),
    )
    activations = s * b * h * (34 + (0 if fused else 5 * a * s / h)) * d / 2
    if fp8:
        linear_fwd, linear_bwd = fp8_rules.linear_gemms(
            gemm_flops, qkv + h * h + mlp_gemm, gemm_in, gemm_out, n_gemm, fp8_recipe
        )
        forward, backward = linear_fwd + forward[1:], linear_bwd + backward[1:]
        if fp8_rules.keeps_fp8_inputs(fp8_recipe):
            activations -= fp8_rules.saved_bytes_saved(tokens, h, f, fused)
    return Layer(f"block{index}", tensors, forward, backward, activations, checkpoint_bytes=d * tokens * h)


def _head(
    arch: TransformerArch, b: int, s: int, d: int, shards: int = 1, framework_code: bool = False
) -> Layer:
    """The pooler or final norm and the LM head. The vocabulary projection is its own GEMM group:
    where a vocabulary row is not a multiple of 16 bytes (BERT's 30,522 or GPT-2's 50,257 entries
    unpadded) cuBLAS cannot use its aligned tensor-core kernels for any of its three matmuls; the
    kernels it runs instead load as many bytes at a time as every row allows (``alignment_bytes``,
    priced in cost_models/compute.py). Under tensor parallelism each of the ``shards`` ranks multiplies
    by its slice of the vocabulary, so the alignment is a slice's."""
    h, v, tokens = arch.hidden, arch.vocab, b * s
    dense_flops = 0.0
    if arch.style == "bert":
        # pooler (dense h*h + bias), MLM transform (dense + bias + LayerNorm), decoder bias
        # (decoder weight tied to the word embedding), NSP classifier (2*h + 2).
        tensors = (h * h, h, h * h, h, h, h, v, 2 * h, 2)
        dense_flops = 2 * tokens * h * h + 2 * b * h * h
    elif arch.style == "gpt":
        # final LayerNorm; LM head tied to the word embedding (unless the arch says untied)
        tensors = (h, h) if arch.tied_head is not False else (h, h, v * h)
    else:
        # final RMSNorm, untied LM head (unless the arch says tied)
        tensors = (h, v * h) if not arch.tied_head else (h,)
    vocab_flops = 2 * tokens * h * v
    align = row_alignment(-(-v // shards) * d)
    logits_bytes = d * tokens * v
    n_fwd, n_bwd = eager_kernels(arch.style, "head", framework_code)
    gemms_fwd = 2 if dense_flops else 1
    forward = (
        Kernel("gemm", vocab_flops, d * (h * v + tokens * h) + logits_bytes, alignment_bytes=align),
        Kernel("loss", 0.0, 4 * logits_bytes, max(1, n_fwd - gemms_fwd)),
    )
    backward = (
        Kernel(
            "gemm", 2 * vocab_flops, 2 * d * (h * v + tokens * h) + 2 * logits_bytes, 2, alignment_bytes=align
        ),
        Kernel("loss", 0.0, 2 * logits_bytes, max(1, n_bwd - 2 * gemms_fwd)),
    )
    if dense_flops:
        forward += (Kernel("gemm", dense_flops, d * (2 * h * h + 2 * tokens * h)),)
        backward += (Kernel("gemm", 2 * dense_flops, 2 * d * (2 * h * h + 2 * tokens * h), 2),)
    return Layer("head", tensors, forward, backward, logits_bytes + d * tokens * h)


def transformer_layers(
    arch: TransformerArch,
    micro_batch: int,
    seq_len: int,
    dtype_bytes: int,
    attention: str = "fused",
    unfused_pointwise: bool = False,
    vocab_shards: int = 1,
    fp8: bool = False,
    fp8_recipe: str = "delayed",
) -> list[Layer]:
    """``attention``: fused, unfused or eager (workload.attention, _block); ``unfused_pointwise``: the
    model is plain PyTorch code (workload.pointwise: unfused); ``vocab_shards``: tensor-parallel ranks
    the LM head's vocabulary is split over; ``fp8``: FP8 training (the blocks' linear GEMMs in FP8,
    every other kernel in bf16, on ``dtype_bytes`` = 2: workloads/fp8.py), scaled as ``fp8_recipe`` says."""
    b, s, d = micro_batch, seq_len, dtype_bytes
    layers = [_embedding(arch, b, s, d, not unfused_pointwise)]
    for i in range(arch.layers):
        layers.append(_block(arch, i, b, s, d, attention, unfused_pointwise, fp8, fp8_recipe))
    layers.append(_head(arch, b, s, d, vocab_shards, not unfused_pointwise))
    return [fp8_rules.in_bf16(layer) for layer in layers] if fp8 else layers
