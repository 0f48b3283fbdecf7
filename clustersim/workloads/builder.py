"""Instantiate a workload from a scenario's ``workload`` section."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from clustersim import catalog
from clustersim.catalog import BYTES_PER_ELEMENT, ResNetArch, storage_precision
from clustersim.scenario import WorkloadSpec
from clustersim.workloads.fp8 import in_bf16
from clustersim.workloads.layers import Kernel, Layer, Workload
from clustersim.workloads.resnet import needs_layout_transposes, resnet_layers
from clustersim.workloads.transformer import transformer_layers, with_padded_vocab


def _tensors(entry) -> tuple[int, ...]:
    """A custom layer's parameter tensors: as given, else one tensor of all its parameters."""
    if entry.param_tensors is not None:
        return tuple(t for t in entry.param_tensors if t)
    return (entry.params,) if entry.params else ()


def _custom_layers(spec: WorkloadSpec, d: int) -> list[Layer]:
    layers: list[Layer] = []
    for entry in spec.layers or []:
        for i in range(entry.repeat):
            name = entry.name if entry.repeat == 1 else f"{entry.name}{i}"
            b = spec.micro_batch
            layers.append(
                Layer(
                    name=name,
                    param_tensors=_tensors(entry),
                    forward=(Kernel("compute", b * entry.forward_flops, b * entry.forward_bytes),),
                    backward=(Kernel("compute", 2 * b * entry.forward_flops, 2 * b * entry.forward_bytes),),
                    activation_bytes=b * entry.activation_bytes,
                )
            )
    return layers


def build_workload(
    spec: WorkloadSpec,
    unfused_pointwise: bool | None = None,
    vocab_multiple: int | None = None,
    vocab_shards: int = 1,
) -> Workload:
    """``unfused_pointwise``: the model is plain PyTorch code (Scenario.pointwise_code);
    ``vocab_multiple``: the code pads the vocabulary to a multiple of it (Scenario.vocab_multiple);
    ``vocab_shards``: tensor-parallel ranks the LM head's vocabulary is split over (its rows' alignment
    is a shard's). None: the workload's own defaults (WorkloadSpec's, without model parallelism)."""
    if unfused_pointwise is None:
        unfused_pointwise = spec.pointwise_code() == "unfused"
    if vocab_multiple is None:
        vocab_multiple = spec.vocab_multiple()
    if spec.model is None:
        d = BYTES_PER_ELEMENT[spec.precision]
        return Workload(
            "custom", tuple(_custom_layers(spec, d)), spec.micro_batch, spec.seq_len or 1, spec.precision
        )
    definition = catalog.user_model_definition(spec.model)
    # settings of the other kind of network stay at their defaults, so that they do not key the cache
    # apart (a sweep over batch_norm on BERT builds one workload, not one per value)
    convolutional = isinstance(catalog.model(spec.model), ResNetArch)
    workload = _catalog_workload(
        spec.model,
        spec.micro_batch,
        spec.seq_len,
        spec.precision,
        definition,
        "fused" if convolutional else spec.attention,
        convolutional and needs_layout_transposes(spec.memory_format, storage_precision(spec.precision)),
        spec.batch_norm if convolutional else "separate",
        unfused_pointwise,
        vocab_multiple,
        vocab_shards,
        (spec.fp8_recipe or "delayed") if spec.precision == "fp8" else "delayed",  # None: TE's default
    )
    return recomputed(workload) if spec.activation_checkpointing else workload


def recomputed(workload: Workload) -> Workload:
    """Full activation recomputation (Megatron --recompute-granularity full, DeepSpeed
    activation_checkpointing, torch.utils.checkpoint per block): a recomputed layer keeps only its
    input for backward and runs its forward again before its backward; while it does, its full
    activations are live (Korthikanti et al. 2022 sec. 4)."""
    layers, peak = [], 0.0
    for layer in workload.layers:
        if layer.checkpoint_bytes is None:
            layers.append(layer)
            continue
        peak = max(peak, layer.activation_bytes)
        layers.append(
            replace(layer, backward=layer.forward + layer.backward, activation_bytes=layer.checkpoint_bytes)
        )
    return replace(workload, layers=tuple(layers), recompute_peak_bytes=peak)


def model_params(model: str) -> int:
    """A catalog model's parameter count, as the simulator builds it (unpadded vocabulary)."""
    return _catalog_workload(model, 1, None, "fp32", catalog.user_model_definition(model)).params


@lru_cache(maxsize=256)
def _catalog_workload(
    model: str,
    micro_batch: int,
    seq_len: int | None,
    precision: str,
    definition: str | None = None,
    attention: str = "fused",
    nchw_transposes: bool = False,
    batch_norm: str = "separate",
    unfused_pointwise: bool = False,
    vocab_multiple: int = 1,
    vocab_shards: int = 1,
    fp8_recipe: str = "delayed",
) -> Workload:
    """A catalog model's layers, built once per shape: a Workload is immutable, and sweeps and the
    uncertainty draws build the same one again and again. ``definition`` keys a user catalog's
    model by what it is, not only by its name. ``vocab_multiple``: the code pads the vocabulary to
    a multiple of it (workload.pad_vocab_to_multiple_of), which adds embedding rows and can align
    the LM head's matmuls. ``precision`` fp8: the linear layers' GEMMs in FP8 and everything else in
    bf16, as FP8 training runs (workloads/fp8.py); a convolution network has no linear layers to speak
    of and runs in bf16; ``fp8_recipe`` how its scales are found (workload.fp8_recipe)."""
    d = BYTES_PER_ELEMENT[storage_precision(precision)]
    fp8 = precision == "fp8"
    arch = catalog.model(model)
    if isinstance(arch, ResNetArch):
        layers = resnet_layers(arch, micro_batch, d, nchw_transposes, batch_norm)
        layers = [in_bf16(layer) for layer in layers] if fp8 else layers
        seq = 1
    else:
        arch = with_padded_vocab(arch, vocab_multiple)
        seq = seq_len or arch.default_seq_len
        layers = transformer_layers(
            arch,
            micro_batch,
            seq,
            d,
            attention,
            unfused_pointwise,
            vocab_shards,
            fp8=fp8,
            fp8_recipe=fp8_recipe,
        )
    return Workload(model, tuple(layers), micro_batch, seq, precision, fp8_recipe=fp8_recipe)
