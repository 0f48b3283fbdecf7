"""ResNet (bottleneck, v1.5 as in torchvision) from its stage sizes.

One simulator layer per bottleneck block, plus the stem and the classifier. A k x k convolution
from Cin to Cout channels on an Hout x Wout output costs 2*Cin*Cout*k^2*Hout*Wout FLOPs per sample,
and is its own kernel group (its own roofline). Batch-norm makes 3 passes over each convolution's
output forward and 5 backward: a statistics pass (one read, bound by its Welford update on the SMs)
and streaming passes (bound by the SMs' loads), cost_models/compute.py; ReLU, the
residual add and their backward are "activation" passes at HBM's streaming rate.
Code with fused batch-norm kernels (``workload.batch_norm``: NVIDIA's MLPerf ResNet-50) computes each
convolution's statistics in the convolution's epilogue and applies the normalisation, the ReLU and
the residual add in one streaming pass (``fused``), or in the next convolution's prologue
(``fused_into_conv``): "fused_norm" passes at HBM's streaming rate, no ReLU or add pass of their own.
With NCHW (PyTorch's default layout) tensor-core convolutions transpose their input and output to and
from NHWC (catalogs/execution.yaml, layout_transposes); channels_last tensors need none.
"""

from __future__ import annotations

from clustersim.catalog import ResNetArch, eager_kernels, layout_transposes
from clustersim.workloads.layers import Kernel, Layer

#: one convolution: (input channels, output channels, kernel size, output height and width, stride)
Conv = tuple[int, int, int, int, int]


def _conv(cin: int, cout: int, k: int, hw_out: int) -> tuple[int, float, int]:
    """(weight elements, FLOPs per sample, output elements per sample)."""
    return cin * cout * k * k, 2.0 * cin * cout * k * k * hw_out * hw_out, cout * hw_out * hw_out


def _conv_kernels(convs: list[Conv], b: int, d: int, stem: bool) -> tuple[list[Kernel], list[Kernel]]:
    """One kernel group per convolution, forward and backward, so the roofline applies per convolution:
    a 1x1 convolution over 64 or 256 channels at 56 x 56 does 32-85 FLOPs per byte and is bound by HBM
    on a GPU whose tensor cores need hundreds, while a 3x3 one at 7 x 7 is bound by its FLOPs. Summed
    into one group, the memory-bound ones would vanish under the compute-bound ones' FLOPs. ``stem``:
    the network's input (the image) needs no gradient."""
    forward: list[Kernel] = []
    backward: list[Kernel] = []
    for cin, cout, k, hw, stride in convs:
        w, f, o = _conv(cin, cout, k, hw)
        i = cin * (hw * stride) ** 2
        # a strided 1x1 convolution reads only the input pixels it lands on (NHWC: whole channel rows)
        read = cin * hw * hw if k == 1 else i
        forward.append(Kernel("conv", b * f, d * (b * read + w + b * o)))
        if stem:  # weight gradient only: reads the output gradient and the input, writes dW
            backward.append(Kernel("conv", b * f, d * (b * o + b * read + w), 2))
        else:  # data gradient (reads dY and W, writes dX) and weight gradient (reads dY and X, writes dW)
            backward.append(Kernel("conv", 2 * b * f, d * (2 * b * o + b * i + b * read + 2 * w), 2))
    return forward, backward


def _activation_elements(convs: list[Conv], stem: bool) -> tuple[float, float]:
    """Elements per sample that ReLU, the residual add and the max-pool move (forward, backward).

    ReLU (in place: read + write) follows every convolution but the block's last and its projection,
    and its backward reads the gradient and the output and writes the gradient; the block's residual
    add reads both branches and writes one, a ReLU follows it, and backward sums the two gradients that
    reach the block's input. The stem's ReLU feeds the 3x3 max-pool (reads its input, writes a quarter;
    backward the reverse)."""
    outputs = sum(cout * hw * hw for _, cout, _, hw, _ in convs)
    if stem:
        pooled = 1.25 * outputs
        return 2 * outputs + pooled, 3 * outputs + pooled
    cin, _, _, hw, stride = convs[0]
    block_in = cin * (hw * stride) ** 2
    block_out = convs[2][1] * convs[2][3] ** 2
    projection = convs[3][1] * convs[3][3] ** 2 if len(convs) > 3 else 0
    relu = outputs - projection
    return 2 * relu + 3 * block_out, 3 * relu + 3 * block_in


def _fused_norm_elements(convs: list[Conv], into_conv: bool) -> tuple[float, float]:
    """Elements per sample that a bottleneck block's fused batch-norm code moves outside its
    convolutions (forward, backward), as NVIDIA's MLPerf ResNet-50 runs it (MXNet, NHWC; symbols
    resnet-v1b-stats-fl and resnet-v1b-mainloop-fl in mlcommons/training_results_v1.0 and v3.0):

    - each convolution writes its output's per-channel sum and sum of squares from its epilogue
      (NormConvolution's "Stats-Gen"), so no statistics pass reads the output back;
    - ``fused``: the normalisation and ReLU of the first two convolutions are one pass each
      (ScaleBiasAddRelu: read the output, write the activation); ``fused_into_conv``: the next
      convolution applies them as it loads its input ("Stats-Apply Relu Convolution"), no pass;
    - the block's end is one pass either way: read the third convolution's output and the shortcut (the
      block's input, or the projection's output with its own normalisation applied in the same
      kernel, the "dual" scale-bias), add, ReLU, write the block's output;
    - backward, each convolution's batch-norm gradient with the ReLU's mask folded in is a reduction
      (reads dY and X) and the input gradient (reads dY and X, writes dX), as unfused code; the block's
      end also writes the shortcut's gradient. The two gradients that reach the block's input are not
      summed by a kernel of their own: the image runs MXNet with MXNET_EXEC_ENABLE_ADDTO=1 (its
      Dockerfile), so the second writer adds into the first's buffer, one more read of it."""
    outputs = [cout * hw * hw for _, cout, _, hw, _ in convs]
    cin, _, _, hw, stride = convs[0]
    block_in = cin * (hw * stride) ** 2
    first_two, block_out = outputs[0] + outputs[1], outputs[2]
    forward = (0 if into_conv else 2 * first_two) + 3 * block_out
    backward = 5 * sum(outputs) + block_out + block_in
    return forward, backward


def _norm_kernels(
    convs: list[Conv], b: int, d: int, kind: str, stem: bool, batch_norm: str
) -> tuple[list[Kernel], list[Kernel], float]:
    """The layer's batch-norm, ReLU, residual-add (and max-pool) kernel groups, forward and backward,
    and the activation bytes it keeps for backward. ``kind``: the layer's entry in
    catalogs/execution.yaml's eager kernel counts (one launch per convolution, three batch-norm
    kernels forward and two backward per convolution, the rest casts, ReLU and the residual add)."""
    n_conv = len(convs)
    act = d * b * sum(cout * hw * hw for _, cout, _, hw, _ in convs)
    act_fwd, act_bwd = _activation_elements(convs, stem)
    # batch-norm in training: a statistics pass (read; with the running statistics' update, a kernel
    # of its own over the channels), then normalise (read + write); backward a reduction (reads dY and
    # X) and the input gradient (reads dY and X, writes dX). The statistics pass has its own rate
    # (catalogs/execution.yaml batch_norm).
    bn_forward = [
        Kernel("batch_norm_stats", 0.0, act, 2 * n_conv),
        Kernel("batch_norm", 0.0, 2 * act, n_conv),
    ]
    bn_backward = Kernel("batch_norm", 0.0, 5 * act, 2 * n_conv)
    if batch_norm == "separate":
        n_fwd, n_bwd = eager_kernels("resnet", kind)
        forward = [*bn_forward, Kernel("activation", 0.0, d * b * act_fwd, max(1, n_fwd - 4 * n_conv))]
        backward = [bn_backward, Kernel("activation", 0.0, d * b * act_bwd, max(1, n_bwd - 4 * n_conv))]
        return forward, backward, 3 * act  # convolution, batch-norm and ReLU outputs
    if stem:
        # the stem is a plain convolution and a batch-norm with its ReLU fused (BatchNorm act_type
        # relu in the symbol files): the statistics kernel stays, the ReLU's passes go; the max-pool
        # reads the activation and writes a quarter of it (backward the reverse)
        pooled = 1.25 * act
        forward = [*bn_forward, Kernel("activation", 0.0, pooled, 1)]
        backward = [bn_backward, Kernel("activation", 0.0, pooled, 1)]
        return forward, backward, 2 * act
    into_conv = batch_norm == "fused_into_conv"
    fwd_elems, bwd_elems = _fused_norm_elements(convs, into_conv)
    # launches: forward a statistics finalisation per convolution (per-channel, no bytes to speak of)
    # and the apply passes (3, or the block's end only when the convolutions apply the others);
    # backward two batch-norm kernels per convolution
    forward = [Kernel("fused_norm", 0.0, d * b * fwd_elems, n_conv + (1 if into_conv else 3))]
    backward = [Kernel("fused_norm", 0.0, d * b * bwd_elems, 2 * n_conv)]
    # kept for backward: the convolutions' outputs, and what the next convolution's weight gradient
    # reads: the normalised activations of the first two and the block's output (the projection's
    # normalised output is never written: the dual pass reads its raw output), or only the block's
    # output where the next convolution applies the normalisation as it loads (and again in backward)
    o1, o2, o3 = (cout * hw * hw for _, cout, _, hw, _ in convs[:3])
    kept = act + d * b * (o3 if into_conv else o1 + o2 + o3)
    return forward, backward, kept


def _layer(
    name: str,
    convs: list[Conv],
    b: int,
    d: int,
    kind: str,
    nchw_transposes: bool,
    stem: bool = False,
    batch_norm: str = "separate",
) -> Layer:
    """``kind``: the layer's entry in catalogs/execution.yaml's eager kernel counts.
    ``nchw_transposes``: NCHW tensors on tensor cores, so every convolution transposes its input and
    output. ``stem``: the network's first layer (no gradient for the image; the max-pool after its
    ReLU). ``batch_norm``: separate kernels, or fused with the convolutions (workload.batch_norm)."""
    tensors = [t for cin, cout, k, _, _ in convs for t in (cin * cout * k * k, cout, cout)]  # weight, BN
    forward, backward = _conv_kernels(convs, b, d, stem)
    in_elems = sum(cin * (hw * stride) ** 2 for cin, _, _, hw, stride in convs)
    out_elems = sum(cout * hw * hw for _, cout, _, hw, _ in convs)
    n_conv = len(convs)
    norm_fwd, norm_bwd, kept = _norm_kernels(convs, b, d, kind, stem, batch_norm)
    forward += norm_fwd
    backward += norm_bwd
    if nchw_transposes:  # each transpose reads and writes one convolution's input or output
        fwd_t, bwd_t = layout_transposes()
        moved = 2 * d * b * (in_elems + out_elems)  # read + write of every input and every output once
        forward.append(Kernel("layout_transpose", 0.0, moved * fwd_t / 2, fwd_t * n_conv, dispatched=False))
        backward.append(Kernel("layout_transpose", 0.0, moved * bwd_t / 2, bwd_t * n_conv, dispatched=False))
    return Layer(name, tuple(tensors), tuple(forward), tuple(backward), activation_bytes=kept)


def resnet_layers(
    arch: ResNetArch,
    micro_batch: int,
    dtype_bytes: int,
    nchw_transposes: bool = False,
    batch_norm: str = "separate",
) -> list[Layer]:
    """``nchw_transposes``: the tensors are NCHW and the convolutions run on tensor cores (see
    :func:`needs_layout_transposes`). ``batch_norm``: workload.batch_norm."""
    b, d, t, bn = micro_batch, dtype_bytes, nchw_transposes, batch_norm
    hw = arch.image_size // 2  # stem conv stride 2
    layers = [_layer("stem", [(3, arch.width, 7, hw, 2)], b, d, "stem", t, stem=True, batch_norm=bn)]
    hw //= 2  # max-pool
    cin = arch.width
    for stage, count in enumerate(arch.blocks):
        mid = arch.width * 2**stage
        out = mid * 4
        for block in range(count):
            stride = 2 if (block == 0 and stage > 0) else 1
            hw_out = hw // stride
            # v1.5: the stride sits on the 3x3 convolution (and the projection shortcut)
            convs = [(cin, mid, 1, hw, 1), (mid, mid, 3, hw_out, stride), (mid, out, 1, hw_out, 1)]
            if block == 0:
                convs.append((cin, out, 1, hw_out, stride))  # projection shortcut
            kind = "projection_block" if block == 0 else "block"
            layers.append(_layer(f"stage{stage + 1}.block{block}", convs, b, d, kind, t, batch_norm=bn))
            cin, hw = out, hw_out
    fc_w, fc_b = cin * arch.num_classes, arch.num_classes
    fc_flops = 2.0 * b * cin * arch.num_classes
    # classifier: pooling, the GEMM, log-softmax and the loss (the pointwise kernels as "loss")
    n_fwd, n_bwd = eager_kernels("resnet", "classifier")
    logits = d * b * arch.num_classes
    layers.append(
        Layer(
            "fc",
            (fc_w, fc_b),
            forward=(
                Kernel("gemm", fc_flops, d * (fc_w + b * cin)),
                Kernel("loss", 0.0, 4 * logits, n_fwd - 1),
            ),
            backward=(
                Kernel("gemm", 2 * fc_flops, 2 * d * (fc_w + b * cin)),
                Kernel("loss", 0.0, 2 * logits, n_bwd - 1),
            ),
            activation_bytes=d * b * cin,
        )
    )
    return layers


def needs_layout_transposes(memory_format: str, precision: str) -> bool:
    """cuDNN transposes NCHW tensors for its tensor-core convolutions (every precision but fp32, which
    runs native NCHW kernels on the SIMT cores); channels_last tensors are already NHWC."""
    return memory_format == "contiguous" and precision != "fp32"
