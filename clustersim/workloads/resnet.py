"""ResNet (bottleneck, v1.5 as in torchvision) from its stage sizes.

One simulator layer per bottleneck block, plus the stem and the classifier. A k x k convolution
from Cin to Cout channels on an Hout x Wout output costs 2*Cin*Cout*k^2*Hout*Wout FLOPs per sample;
BatchNorm + ReLU are memory-bound passes over each conv output (read + write, twice in backward).
"""

from __future__ import annotations

from clustersim.catalog import ResNetArch, eager_kernels
from clustersim.workloads.layers import Kernel, Layer


def _conv(cin: int, cout: int, k: int, hw_out: int) -> tuple[int, float, int]:
    """(weight elements, FLOPs per sample, output elements per sample)."""
    return cin * cout * k * k, 2.0 * cin * cout * k * k * hw_out * hw_out, cout * hw_out * hw_out


def _layer(
    name: str, convs: list[tuple[int, int, int, int]], b: int, d: int, kind: str, extra_tensors=()
) -> Layer:
    """``kind``: the layer's entry in catalogs/execution.yaml's eager kernel counts (one launch per
    convolution, the rest batch-norm, ReLU, casts and the residual add)."""
    tensors: list[int] = []
    flops = 0.0
    out_elems = 0
    for cin, cout, k, hw in convs:
        w, f, o = _conv(cin, cout, k, hw)
        tensors += [w, cout, cout]  # conv weight, BN gamma, BN beta
        flops += f
        out_elems += o
    tensors += list(extra_tensors)
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
    return Layer(name, tuple(tensors), forward, backward, activation_bytes=3 * act)


def resnet_layers(arch: ResNetArch, micro_batch: int, dtype_bytes: int) -> list[Layer]:
    b, d = micro_batch, dtype_bytes
    hw = arch.image_size // 2  # stem conv stride 2
    layers = [_layer("stem", [(3, arch.width, 7, hw)], b, d, "stem")]
    hw //= 2  # max-pool
    cin = arch.width
    for stage, count in enumerate(arch.blocks):
        mid = arch.width * 2**stage
        out = mid * 4
        for block in range(count):
            stride = 2 if (block == 0 and stage > 0) else 1
            hw_out = hw // stride
            convs = [(cin, mid, 1, hw), (mid, mid, 3, hw_out), (mid, out, 1, hw_out)]
            if block == 0:
                convs.append((cin, out, 1, hw_out))  # projection shortcut
            kind = "projection_block" if block == 0 else "block"
            layers.append(_layer(f"stage{stage + 1}.block{block}", convs, b, d, kind))
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
