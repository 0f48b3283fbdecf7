"""ResNet (bottleneck, v1.5 as in torchvision) from its stage sizes.

One simulator layer per bottleneck block, plus the stem and the classifier. A k x k convolution
from Cin to Cout channels on an Hout x Wout output costs 2*Cin*Cout*k^2*Hout*Wout FLOPs per sample;
BatchNorm + ReLU are memory-bound passes over each conv output (read + write, twice in backward).
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


def _layer(name: str, convs: list[Conv], b: int, d: int, kind: str, nchw_transposes: bool) -> Layer:
    """``kind``: the layer's entry in catalogs/execution.yaml's eager kernel counts (one launch per
    convolution, the rest batch-norm, ReLU, casts and the residual add). ``nchw_transposes``: NCHW
    tensors on tensor cores, so every convolution transposes its input and output."""
    tensors: list[int] = []
    flops = 0.0
    out_elems = 0
    in_elems = 0
    for cin, cout, k, hw, stride in convs:
        w, f, o = _conv(cin, cout, k, hw)
        tensors += [w, cout, cout]  # conv weight, BN gamma, BN beta
        flops += f
        out_elems += o
        in_elems += cin * (hw * stride) ** 2
    weight_bytes = d * sum(tensors)
    act = d * b * out_elems
    n_fwd, n_bwd = eager_kernels("resnet", kind)
    n_conv = len(convs)
    forward = (
        Kernel("conv", b * flops, weight_bytes + 2 * act, n_conv),
        Kernel("bn_relu", 0.0, 4 * act, max(1, n_fwd - n_conv)),
    )
    backward = (
        Kernel("conv", 2 * b * flops, 3 * weight_bytes + 4 * act, 2 * n_conv),
        Kernel("bn_relu", 0.0, 8 * act, max(1, n_bwd - 2 * n_conv)),
    )
    if nchw_transposes:  # each transpose reads and writes one convolution's input or output
        fwd_t, bwd_t = layout_transposes()
        moved = 2 * d * b * (in_elems + out_elems)  # read + write of every input and every output once
        forward += (Kernel("layout_transpose", 0.0, moved * fwd_t / 2, fwd_t * n_conv, dispatched=False),)
        backward += (Kernel("layout_transpose", 0.0, moved * bwd_t / 2, bwd_t * n_conv, dispatched=False),)
    return Layer(name, tuple(tensors), forward, backward, activation_bytes=3 * act)


def resnet_layers(
    arch: ResNetArch, micro_batch: int, dtype_bytes: int, nchw_transposes: bool = False
) -> list[Layer]:
    """``nchw_transposes``: the tensors are NCHW and the convolutions run on tensor cores (see
    :func:`needs_layout_transposes`)."""
    b, d, t = micro_batch, dtype_bytes, nchw_transposes
    hw = arch.image_size // 2  # stem conv stride 2
    layers = [_layer("stem", [(3, arch.width, 7, hw, 2)], b, d, "stem", t)]
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
            layers.append(_layer(f"stage{stage + 1}.block{block}", convs, b, d, kind, t))
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
