"""The unit the simulator schedules: a layer with its parameter tensors and its kernels.

Costs are per micro-batch. A layer's work is a short list of :class:`Kernel` groups, each with FLOPs
and HBM bytes, because a roofline must be applied per kernel (a GEMM is compute-bound, the LayerNorm
after it memory-bound): summing ``max(flops/F, bytes/B)`` over kernels is right, one max over the
whole layer would hide the memory-bound part.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class AttentionShape:
    """What a fused attention kernel's rate depends on besides its FLOPs (cost_models/attention.py):
    the sequence it runs over, the head dimension, the causal mask and the pass."""

    seq_len: int
    head_dim: int
    causal: bool
    backward: bool


@dataclass(frozen=True)
class Kernel:
    name: str
    flops: float
    bytes: float
    # kernels in this group (a layer's GEMMs are one group): each pays the launch and small-problem cost
    launches: int = 1
    #: False for kernels a library launches inside another op (cuDNN's layout transposes): they cost
    #: the device but no dispatch of their own on the host thread
    dispatched: bool = True
    #: GEMMs: the widest load every row of its operands allows, in bytes (16: aligned for the tensor
    #: cores; an unpadded vocabulary of 30,522 bf16 entries allows 4, one of 50,257 allows 2)
    alignment_bytes: int = 16
    #: the precision the group runs at where it is not the workload's (None): under FP8 training the
    #: linear layers' GEMMs run in fp8 and every other kernel in bf16 (workloads/fp8.py)
    precision: str | None = None
    #: fused attention (FlashAttention-style kernels): the shape its library's published rate is read
    #: at; None for every other group, and for attention that writes its scores
    attention: AttentionShape | None = None


@dataclass(frozen=True)
class Layer:
    name: str
    param_tensors: tuple[int, ...]
    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]
    activation_bytes: float = 0.0
    #: kept for backward under full activation recomputation (the block's 16-bit input, Korthikanti
    #: et al. 2022 sec. 4: 2sbh per layer); None: the layer is not recomputed
    checkpoint_bytes: float | None = None

    @property
    def params(self) -> int:
        return sum(self.param_tensors)

    @property
    def forward_flops(self) -> float:
        return sum(k.flops for k in self.forward)

    @property
    def backward_flops(self) -> float:
        return sum(k.flops for k in self.backward)


@dataclass(frozen=True)
class Workload:
    """A model instantiated at one micro-batch, sequence length and precision."""

    name: str
    layers: tuple[Layer, ...]
    micro_batch: int
    seq_len: int
    precision: str
    #: full recomputation: the largest recomputed layer's activations, live during its backward
    recompute_peak_bytes: float = 0.0
    #: precision fp8: how the scales are found (workload.fp8_recipe, workloads/fp8.py)
    fp8_recipe: str = "delayed"

    # Cached (the layers never change): strategies and the memory model ask for these many times.
    @cached_property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @cached_property
    def forward_flops(self) -> float:
        return sum(layer.forward_flops for layer in self.layers)

    @cached_property
    def backward_flops(self) -> float:
        return sum(layer.backward_flops for layer in self.layers)

    @cached_property
    def activation_bytes(self) -> float:
        return sum(layer.activation_bytes for layer in self.layers) + self.recompute_peak_bytes
