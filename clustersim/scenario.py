"""The scenario schema: what a user writes in a YAML/JSON file, validated once at the edge.

Every model forbids unknown keys, so a typo is an error naming its key path instead of a silently
ignored setting. ``load_scenario`` is the only entry point that reads files; it converts pydantic's
errors into one-line :class:`~clustersim.errors.InputError` messages ``FILE: key.path: reason``.
"""

from __future__ import annotations

import math
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PrivateAttr,
    StrictBool,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from clustersim import catalog
from clustersim.catalog import Count, Number, Precision, _not_bool, _whole
from clustersim.errors import InputError
from clustersim.identifiers import CollectiveAlgorithm, IntraNodeFabric
from clustersim.io import first_error, load_yaml, read_structured_file
from clustersim.optimizer_options import parse_options
from clustersim.sharding_rules import check_partition, check_sharding

#: workload.attention: one kernel over Q, K, V; scores through fused softmax kernels; or plain ops
Attention = Literal["fused", "unfused", "eager"]
#: training.gradient_clipping: by the gradients' norm, over all of them or tensor by tensor
GradientClipping = Literal["none", "global", "per_tensor"]
BatchNorm = Literal["separate", "fused", "fused_into_conv"]
# Workload keys that describe one kind of network only: set for the other kind (in a scenario, or as a
# sweep's axis) they change nothing, which run and sweep say.
TRANSFORMER_ONLY_KEYS = (
    "attention",
    "attention_kernel",
    "attention_dropout",
    "pointwise",
    "pad_vocab_to_multiple_of",
    "seq_len",
    "fp8_recipe",
)
CONV_ONLY_KEYS = ("memory_format", "batch_norm")


def key_not_applying(key: str, models) -> str | None:
    """ "workload.KEY does not apply to MODELS (a transformer)" when ``key`` (a workload key) describes
    one kind of network and none of the catalog ``models`` is of that kind; None when one of them
    uses it. run (a scenario's key) and sweep (an axis) end the sentence their own way."""
    models = sorted(set(models))
    families = {catalog.model(m).family for m in models}
    if key in TRANSFORMER_ONLY_KEYS and families == {"resnet"}:
        kind = "a convolution network" if len(models) == 1 else "convolution networks"
    elif key in CONV_ONLY_KEYS and families and "resnet" not in families:
        kind = "a transformer" if len(models) == 1 else "transformers"
    else:
        return None
    return f"workload.{key} does not apply to {', '.join(models)} ({kind})"


PRESET_PREFIX = "preset:"


# The tags of the GPU union (a name or an inline entry): pydantic puts them in an error's location,
# where they are not keys the user wrote (first_error drops them).
_GPU_TAGS = ("gpu name", "inline gpu")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class IntraNodeSpec(_Strict):
    """How the GPUs of one node talk to each other."""

    fabric: IntraNodeFabric = IntraNodeFabric.NVSWITCH
    pcie_gen: Count | None = Field(None, ge=3, le=6, description="default: the GPU's PCIe generation")
    gpus_per_pcie_switch: Count = Field(2, gt=0)
    p2p: bool = Field(True, description="PCIe peer-to-peer; false stages GPU-GPU traffic through host memory")
    measured_allreduce_busbw_gbs: Number | None = Field(
        None,
        gt=0,
        description="measured intra-node all-reduce bus bandwidth (nccl-tests busbw), overrides the topology",
    )


class NicSpec(_Strict):
    """The node's network interfaces (all identical)."""

    kind: Literal["ethernet_tcp", "infiniband"] = Field(
        "infiniband",
        description="how NCCL moves bytes between nodes: ethernet_tcp, its socket transport (kernel TCP, "
        "staged through host memory unless gpudirect_rdma); infiniband, its IB verbs transport (RDMA, "
        "GPUDirect by default), which is also RoCE's: RoCE (RDMA over Converged Ethernet) is infiniband "
        "at the Ethernet rate (line_rate_gbps: 100 for 100 GbE); 25 or 50 GbE RoCE, rates no InfiniBand "
        "port has: ethernet_tcp with gpudirect_rdma: true (RDMA's latency; latency_us where measured) "
        "(docs/network.md)",
    )
    count: Count = Field(1, ge=0)
    line_rate_gbps: Number = Field(200.0, gt=0, description="line rate per NIC, Gb/s")
    effective_gbps: Number | None = Field(
        None, gt=0, description="measured throughput per NIC (iperf/perftest), Gb/s"
    )
    latency_us: Number | None = Field(None, gt=0, description="one-way message latency; default by kind")
    pacing_cv: Number | None = Field(
        None,
        ge=0,
        le=1,
        description="spread (coefficient of variation) of one node's per-chunk network rate: a ring, "
        "tree or halving-doubling step waits for the slowest node, so their network time grows by "
        "1 + cv x E[max of N normals] on N nodes; default by kind (hardware_defaults.yaml nic.pacing_cv)",
    )
    gpudirect_rdma: bool | None = Field(
        None, description="NIC reads GPU memory directly; default: true for InfiniBand"
    )


class FabricSpec(_Strict):
    """The switch fabric between nodes."""

    kind: Literal["single_switch", "leaf_spine"] = "single_switch"
    nodes_per_leaf: Count = Field(16, gt=0)
    oversubscription: Number = Field(1.0, ge=1.0, description="leaf downlink:uplink bandwidth ratio")
    ports_per_switch: Count | None = Field(
        None,
        gt=1,
        description="switch radix (leaf_spine); default: the largest real switch (hardware_defaults limits)",
    )
    leaves_per_pod: Count | None = Field(
        None, gt=0, description="a third tier: leaves per pod, pods joined by core switches"
    )
    core_oversubscription: Number = Field(
        1.0, ge=1.0, description="a pod's spine downlink:core uplink bandwidth ratio (three tiers)"
    )


class HostSpec(_Strict):
    """The host side of a node (CPU optimizer work, staging copies)."""

    sockets: Count = Field(2, gt=0)
    cores: Count = Field(48, gt=0, description="physical cores per node")
    dram_gbs: Number | None = Field(None, gt=0, description="host DRAM bandwidth per node, GB/s")
    memory_gib: Number = Field(512.0, gt=0)
    page_fault_us: Number | None = Field(
        None,
        gt=0,
        le=1000,
        description="cost of one demand-zero page fault (4 KiB page) when the driver first writes a freshly "
        "mapped pageable buffer, microseconds; it varies with the CPU, the kernel and its mitigations; "
        "default hardware_defaults.yaml host.first_touch_s_per_page",
    )
    transparent_hugepages: Literal["always", "madvise", "never"] | None = Field(
        None,
        description="the host kernel's transparent huge pages mode (/sys/kernel/mm/transparent_hugepage/"
        "enabled): with 'always' a freshly mapped pageable buffer faults in 2 MiB pages (hardware_defaults."
        "yaml host.huge_page_fault_gbs) but for its unaligned ends; 'madvise' and 'never' fault every "
        "4 KiB page (page_fault_us) for PyTorch's buffers; default hardware_defaults.yaml "
        "host.transparent_hugepages, the Linux kernel's own default",
    )


class SlowGpuSpec(_Strict):
    """One GPU that computes slower than the others (thermal throttling, an older part)."""

    rank: Count = Field(ge=0, description="global rank (node * gpus_per_node + local GPU)")
    compute_factor: Number = Field(gt=0, description="its compute time multiplier: 1.2 = 20% slower")


class DegradedNicSpec(_Strict):
    """A NIC (and its switch port) running below its rate: a flapping cable, a port renegotiated down."""

    node: Count = Field(ge=0)
    nic: Count = Field(0, ge=0)
    bandwidth_factor: Number = Field(gt=0, le=1, description="fraction of its bandwidth left")


class BackgroundJobSpec(_Strict):
    """Another job's traffic on the same fabric: greedy flows that take their max-min fair share of
    the links they cross (flow backend)."""

    links: Literal["nics", "leaf_uplinks"] = "nics"
    nodes: list[Count] | None = Field(
        None, description="nodes (for nics) or leaves (for leaf_uplinks) whose links it uses; default all"
    )
    flows_per_link: Count = Field(1, gt=0, description="its concurrent flows on each such link, each way")


class NodeGpuSpec(_Strict):
    """A node whose GPUs are another catalog type (mixed generations in one job)."""

    node: Count = Field(ge=0)
    gpu: str = Field(description="a catalog GPU name")


class JitterSpec(_Strict):
    """Per-rank compute-speed variation: each rank's compute time is multiplied by one draw."""

    distribution: Literal["lognormal", "normal"] = "lognormal"
    sigma: Number = Field(gt=0, le=1, description="log-sigma (lognormal) or relative sigma (normal)")
    seed: Count = Field(0, ge=0)


class HeterogeneitySpec(_Strict):
    """Stragglers and faults. Compute factors apply with either network backend; degraded NICs and
    background jobs need the flow backend (training.network: flow)."""

    slow_gpus: list[SlowGpuSpec] = Field(default_factory=list)
    degraded_nics: list[DegradedNicSpec] = Field(default_factory=list)
    background: list[BackgroundJobSpec] = Field(default_factory=list)
    jitter: JitterSpec | None = None
    node_gpus: list[NodeGpuSpec] = Field(default_factory=list)


class ClusterSpec(_Strict):
    nodes: Count = Field(gt=0)
    gpus_per_node: Count = Field(gt=0)
    gpu: Annotated[
        Annotated[str, Tag(_GPU_TAGS[0])] | Annotated[catalog.InlineGpuSpec, Tag(_GPU_TAGS[1])],
        Discriminator(
            lambda v: (
                _GPU_TAGS[1]
                if isinstance(v, dict | catalog.GpuSpec)
                else _GPU_TAGS[0]
                if isinstance(v, str)
                else None
            ),
            custom_error_type="gpu",
            custom_error_message="expected a GPU name or an inline GPU (a mapping)",
        ),
    ] = Field(description="a catalog GPU's name, or an inline GPU: gpus.yaml's schema plus a name")
    intra_node: IntraNodeSpec = IntraNodeSpec()
    nic: NicSpec = NicSpec()
    fabric: FabricSpec = FabricSpec()
    host: HostSpec = HostSpec()
    heterogeneity: HeterogeneitySpec | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def gpu_name(self) -> str:
        return self.gpu if isinstance(self.gpu, str) else self.gpu.name


class LayerSpec(_Strict):
    """One custom layer (per-sample costs), for models that are not in the catalog."""

    name: str
    params: Count = Field(ge=0)
    param_tensors: list[Count] | None = Field(
        None,
        min_length=1,
        description="the layer's parameter tensors (elements each) in the order the framework registers "
        "them, summing to params: PyTorch DDP fills its gradient buckets tensor by tensor, in reverse. "
        "Default: one tensor of params elements",
    )
    forward_flops: Number = Field(ge=0, description="FLOPs per sample")
    forward_bytes: Number = Field(0.0, ge=0, description="HBM bytes moved per sample by memory-bound kernels")
    activation_bytes: Number = Field(0.0, ge=0, description="activation bytes kept for backward, per sample")
    repeat: Count = Field(1, gt=0)

    @field_validator("param_tensors")
    @classmethod
    def _tensors_make_params(cls, tensors: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if tensors is None:
            return tensors
        if any(t < 0 for t in tensors):
            raise ValueError("param_tensors are element counts: each 0 or more")
        params = info.data.get("params")
        if params is not None and sum(tensors) != params:
            raise ValueError(
                f"param_tensors sum to {sum(tensors):,} elements, not the layer's params {params:,}"
            )
        return tensors


class InputSpec(_Strict):
    """The input pipeline over PCIe: each sample's features are gathered from host memory (as in GCN
    training on large graphs: the sampled nodes' feature rows). ``host_gather``: CPU threads gather
    the rows into a pinned buffer, then one H2D copy; ``zero_copy``: GPU threads read the rows from
    host memory directly over PCIe (Min et al., VLDB 2021, "Large Graph Convolutional Network Training
    with GPU-Oriented Data Communication Architecture")."""

    bytes_per_sample: Number = Field(gt=0, description="feature bytes gathered from host memory per sample")
    row_bytes: Number | None = Field(
        None, gt=0, description="bytes of one gathered row (feature vector); default: one block per sample"
    )
    mode: Literal["host_gather", "zero_copy"] = "host_gather"
    prefetch: bool = Field(True, description="load the next batch while this step runs (DataLoader prefetch)")
    aligned: bool = Field(True, description="zero_copy: rows start on 128-byte boundaries (PyTorch-Direct)")


class WorkloadSpec(_Strict):
    model: str | None = Field(
        None,
        description="a catalog model (`clustersim models list`, or a --catalog's), or NAME-<N>L: "
        "transformer NAME with only N layers, as `calibrate model --layers N` measures it",
    )
    layers: list[LayerSpec] | None = None
    micro_batch: Count = Field(gt=0)
    seq_len: Count | None = Field(None, gt=0)
    precision: Precision = Field(
        "fp16",
        description="mixed-precision training dtype; fp8 runs as NVIDIA Transformer Engine (and torchao's "
        "Float8Linear) do: only the transformer blocks' linear-layer GEMMs (QKV, output projection, MLP; "
        "forward and both backward GEMMs) at the FP8 rate, with cast kernels and their inputs saved as "
        "FP8 copies; attention, norms, element-wise work, embedding, LM head, weights, gradients and "
        "optimizer stay bf16 (a convolution network runs in bf16)",
    )
    fp8_recipe: Literal["delayed", "current", "torchao_tensorwise"] | None = Field(
        None,
        description="precision fp8 only (refused beside another precision): how each tensor's scale is "
        "found; default delayed. delayed: Transformer Engine's default "
        "DelayedScaling (NeMo, MLPerf), the scale from earlier steps' amax, one read per cast; current: "
        "TE's Float8CurrentScaling (Megatron-Bridge's tensorwise recipe), an amax pass over the tensor "
        "before each cast; torchao_tensorwise: torchao's Float8Linear with dynamic tensorwise scaling "
        "(TorchTitan), the same amax pass and the weights cast again in every forward and backward "
        "instead of kept as FP8 copies",
    )
    gradient_accumulation: Count = Field(1, gt=0)
    input: InputSpec | None = Field(None, description="input pipeline over PCIe (default: not modelled)")
    activation_checkpointing: bool = Field(
        False, description="full recomputation: keep each block's input, run its forward again in backward"
    )
    attention: Attention = Field(
        "fused",
        description="fused: one kernel that never stores the s x s scores (FlashAttention, PyTorch's "
        "scaled_dot_product_attention, the default since PyTorch 2.0); unfused: scores written and read "
        "back through a fused scale-mask-softmax kernel and dropout (pre-2022 Megatron-LM, apex); "
        "eager: the same as plain PyTorch ops, scale, mask, softmax and dropout each a kernel over the "
        "scores (Hugging Face's eager attention, BERT code before PyTorch 2.0)",
    )
    attention_kernel: Literal["auto", "flash2", "cudnn", "flash3"] = Field(
        "auto",
        description="transformers with fused attention: the library whose kernel runs it, whose "
        "published rate prices it on the chips the rates were measured on (H100, H200; "
        "catalogs/attention_kernels.yaml): "
        "flash2 (FlashAttention-2, PyTorch's scaled_dot_product_attention flash backend, the default of "
        "PyTorch 2.5.1-2.10 on Hopper), cudnn (cuDNN's fused attention: Transformer Engine, PyTorch 2.11's "
        "default on Hopper), flash3 (FlashAttention-3). auto: the code's default (cudnn on Hopper)",
    )
    attention_dropout: Number | None = Field(
        None,
        ge=0,
        lt=1,
        description="transformers with fused attention: the dropout probability on the attention scores, "
        "which the kernel draws one random number per score for (a slower kernel). Default: Hugging Face's "
        "configs' (0.1 for BERT and GPT-2, 0 for LLaMA); 0 for other code, an assumption (Megatron-LM "
        "defaults to 0.1, recipes differ): say it when the recipe is known",
    )
    memory_format: Literal["channels_last", "contiguous"] = Field(
        "channels_last",
        description="convolution networks: channels_last (NHWC, what NVIDIA's and MLPerf's ResNet code "
        "use) or contiguous (PyTorch's default NCHW, where cuDNN transposes every tensor-core "
        "convolution's input and output)",
    )
    batch_norm: BatchNorm = Field(
        "separate",
        description="convolution networks: separate (PyTorch's and cuDNN's batch-norm kernels: a "
        "statistics pass and a normalising pass per convolution, ReLU and residual add kernels of their "
        "own); fused (NVIDIA's MLPerf ResNet code: statistics from the convolution's epilogue, "
        "normalisation, ReLU and residual add in one pass at HBM's streaming rate); fused_into_conv "
        "(the same, with the next convolution applying the normalisation and ReLU as it loads its "
        "input: only the block's last add is a pass of its own)",
    )
    execution: Literal["eager", "compiled", "cuda_graphs"] = Field(
        "eager",
        description="how the step reaches the GPU: eager PyTorch (an op dispatched by the host per kernel), "
        "torch.compile (fused pointwise kernels), or a captured CUDA graph (no per-kernel host dispatch)",
    )
    pad_vocab_to_multiple_of: Count | None = Field(
        None,
        gt=0,
        description="transformers: the code pads the vocabulary to a multiple of this per tensor-parallel "
        "rank, as Megatron-LM's --make-vocab-size-divisible-by does (times training.parallelism.tensor; "
        "NVIDIA DeepLearningExamples' BERT pads to 8). A vocabulary whose rows (per rank) are not a "
        "multiple of 16 bytes (BERT's 30,522, GPT-2's 50,257 entries) runs the LM head's matmuls on "
        "slower, unaligned tensor-core kernels. Default: 128 under tensor or pipeline parallelism "
        "(Megatron-LM's default), else 1, the model's own size (as Hugging Face models keep it)",
    )
    implementation: str | None = Field(
        None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/+-]*$",
        description="the model's code, which decides the ops and kernels a step launches and which of a "
        "profile's measurements price it: hf (Hugging Face transformers), torchvision, megatron, "
        "deepspeed, plain (clustersim's plain-torch build, `calibrate model --implementation plain`), or "
        "the name a user's own code was measured under. Default: hf for the catalog's transformers, "
        "torchvision for ResNets, megatron under tensor or pipeline parallelism",
    )
    pointwise: Literal["unfused", "fused"] | None = Field(
        None,
        description="transformers: how the model code's pointwise work (normalisation, activation, "
        "dropout, residual adds, dtype casts) meets memory. unfused: plain PyTorch model code such as "
        "Hugging Face transformers under torch.autocast (one kernel per op, fp32 residual stream and "
        "LayerNorm, a cast before every matmul); fused: framework kernels on half-precision activations "
        "(Megatron-LM, DeepSpeed, apex/NVIDIA DeepLearningExamples, torch.compile). "
        "Default: fused under torch.compile or tensor/pipeline parallelism, else unfused",
    )

    def pointwise_code(self, model_parallel: bool = False) -> str:
        """``pointwise`` as given, else its default: fused where the code cannot be plain model code
        (torch.compile fuses it; tensor and pipeline parallelism, ``model_parallel``, are Megatron-style
        framework code), unfused otherwise."""
        if self.pointwise is not None:
            return self.pointwise
        return "fused" if self.execution == "compiled" or model_parallel else "unfused"

    def vocab_multiple(self, tensor: int = 1, model_parallel: bool = False) -> int:
        """What the vocabulary is padded to a multiple of: ``pad_vocab_to_multiple_of`` (else its default,
        128 for Megatron-style code, ``model_parallel``, 1 for plain model code) per tensor-parallel
        rank, times ``tensor``, as Megatron-LM pads it so that every rank's shard is a multiple."""
        per_rank = self.pad_vocab_to_multiple_of
        if per_rank is None:
            per_rank = 128 if model_parallel else 1
        return per_rank * tensor

    @model_validator(mode="after")
    def _one_model_source(self) -> "WorkloadSpec":
        if (self.model is None) == (self.layers is None):
            raise ValueError("give exactly one of 'model' (a catalog name) or 'layers' (a custom list)")
        if self.layers is not None and not self.layers:
            raise ValueError("'layers' is empty")
        return self


class OffloadSpec(_Strict):
    """CPU optimizer offload: none, ZeRO-Offload (every update on the CPU) or interleaved
    (Deep Optimizer States: per subgroup, the update runs on the CPU or moves to the GPU)."""

    mode: Literal["none", "zero", "interleaved"] = "none"
    subgroup_size: Number = Field(
        1e7, ge=1, description="parameters per subgroup (DeepSpeed sub_group_size; one at least)"
    )
    placement: Literal["auto", "cpu", "gpu"] = Field(
        "auto",
        description="interleaved only: auto = the performance model decides; cpu/gpu force every subgroup",
    )
    cpu_threads: Count | None = Field(
        None, gt=0, description="host threads per GPU for the CPU optimizer; default cores / GPUs"
    )
    gradient_copy: Literal["async", "blocking"] = Field(
        "async",
        description=(
            "ZeRO-3 only, how each reduced gradient partition reaches the fp32 host buffer: async = cast "
            "on the GPU, copied on the reduction stream beside backward (DeepSpeed >= 0.16.3, Deep "
            "Optimizer States' part_grads_async); blocking = a blocking copy_ that PyTorch upcasts on "
            "the CPU through a pageable buffer while backward waits (DeepSpeed up to 0.15.3)"
        ),
    )
    gpu_update_gap: Count | None = Field(
        None,
        gt=0,
        description=(
            "mode zero under DeepSpeed ZeRO-3 only: Deep Optimizer States' DeepSpeed fork "
            "(prefetch_optimizer_gap): subgroup i (DeepSpeed's subgroups of whole parameter tensors) is "
            "updated on the GPU when (i + 1) % gap == 0, its fp32 parameters and moments copied in and "
            "out while the CPU updates the others; none (plain DeepSpeed) or 1 = every update on the CPU"
        ),
    )


class ZeroPPSpec(_Strict):
    """ZeRO++ (Wang et al. 2023, arXiv:2306.10209), DeepSpeed ZeRO stage 3 only. DeepSpeed's config
    keys: zero_quantized_weights, zero_hpz_partition_size (here: the node), zero_quantized_gradients
    (deepspeed/runtime/zero/config.py)."""

    quantized_weights: bool = Field(False, description="qwZ: forward weight all-gather in int8 blocks")
    hierarchical_partition: bool = Field(
        False, description="hpZ: secondary fp16 weight shard within the node; backward all-gather intra-node"
    )
    quantized_gradients: bool = Field(
        False, description="qgZ: int4 hierarchical all-to-all instead of the gradient reduce-scatter"
    )

    @property
    def enabled(self) -> bool:
        return self.quantized_weights or self.hierarchical_partition or self.quantized_gradients


PartitionLevel = Literal["gcd_pair", "node", "world"]


class PartitionSpec(_Strict):
    """Hierarchical partitioning (the Frontier design for ZeRO: three levels of bandwidth): the group
    each model state is partitioned over. gcd_pair: the two dies of a package (an MI250X's GCDs, joined
    by its fastest Infinity Fabric link); node: the node's GPUs; world: every data-parallel rank (ZeRO's
    own). Unset = world, DeepSpeed's behaviour. Only the states the ZeRO stage partitions may be set."""

    parameters: PartitionLevel | None = Field(None, description="stage 3: parameters' partition group")
    gradients: PartitionLevel | None = Field(None, description="stage 2-3: gradients' partition group")
    optimizer_states: PartitionLevel | None = Field(
        None, description="stage 1-3: optimizer states' (and fp32 master copy's) partition group"
    )

    @property
    def enabled(self) -> bool:
        return any(v is not None for v in (self.parameters, self.gradients, self.optimizer_states))


class ShardingSpec(_Strict):
    """Sharded data parallelism: DeepSpeed ZeRO stages or PyTorch FSDP. Stage 0 is plain DDP.

    Defaults are DeepSpeed's (deepspeed/runtime/zero/config.py): reduce_bucket_size and
    allgather_bucket_size 5e8 elements, stage3_prefetch_bucket_size 5e7, stage3_max_live_parameters
    1e9, overlap_comm true for stage 3 and false for stages 1-2 (validator overlap_comm_valid). FSDP's
    default sharding strategy is FULL_SHARD (torch.distributed.fsdp.ShardingStrategy).
    """

    # true/false are not stages (a lax Literal would read true as 1); 3.0 is 3.
    stage: Annotated[Literal[0, 1, 2, 3], BeforeValidator(_whole), BeforeValidator(_not_bool)] = Field(
        0, description="ZeRO stage (DeepSpeed); 0 = DDP"
    )
    framework: Literal["deepspeed", "fsdp"] = "deepspeed"
    fsdp_strategy: Literal["full", "grad_op", "hybrid"] | None = Field(
        None, description="FSDP only: FULL_SHARD, SHARD_GRAD_OP or HYBRID_SHARD; default full"
    )
    fsdp_implementation: Literal["fsdp2", "flat"] | None = Field(
        None,
        description="FSDP only: fsdp2 (PyTorch's fully_shard, per-parameter shards: each all-gather's "
        "output is copied out into the parameters on the compute stream, each unit's gradients copied "
        "into the reduce-scatter buffer in the reduce dtype) or flat (parameters and gradients are views "
        "of the communication buffers: PyTorch's FlatParameter FSDP, Megatron-FSDP); default fsdp2",
    )
    reduce_bucket_mb: Number | None = Field(
        None, gt=0, description="gradient reduce bucket, MiB; default DeepSpeed's 5e8 elements"
    )
    allgather_bucket_mb: Number | None = Field(
        None, gt=0, description="stage 1/2 parameter all-gather bucket, MiB; default 5e8 elements"
    )
    prefetch_bucket_mb: Number | None = Field(
        None, ge=0, description="stage 3 parameter prefetch, MiB; default 5e7 elements"
    )
    max_live_parameters: Number = Field(
        1e9,
        gt=0,
        description="stage 3: gathered elements at most (stage3_max_live_parameters); limits prefetch",
    )
    overlap_comm: bool | None = Field(
        None, description="reduce on a side stream (DeepSpeed); default true for stage 3 only"
    )
    zeropp: ZeroPPSpec = ZeroPPSpec()
    partition: PartitionSpec = PartitionSpec()

    @property
    def enabled(self) -> bool:
        """Whether parameters, gradients or optimizer state are partitioned at all."""
        return self.framework == "fsdp" or self.stage > 0


class ParallelismSpec(_Strict):
    """Megatron-LM model parallelism (Shoeybi et al. 2019; Narayanan et al. SC'21). The world is
    tensor x data x pipeline ranks; the data-parallel degree is what is left: world / (tensor *
    pipeline). ``workload.gradient_accumulation`` is the number of micro-batches m each pipeline runs
    per step (Megatron's num_microbatches = global batch / (micro_batch * data-parallel degree)), so
    the global batch is micro_batch * gradient_accumulation * data-parallel degree."""

    tensor: Count = Field(1, gt=0, description="tensor-parallel degree t (ranks splitting each layer)")
    pipeline: Count = Field(1, gt=0, description="pipeline stages p")
    sequence_parallel: bool = Field(
        False, description="Korthikanti et al. 2022: LayerNorm/dropout split by t"
    )
    schedule: Literal["1f1b", "interleaved"] = "1f1b"
    virtual_stages: Count = Field(1, gt=0, description="model chunks per stage (interleaved schedule)")
    distributed_optimizer: bool = Field(
        False,
        description="Megatron's --use-distributed-optimizer: fp32 master weights and optimizer state "
        "sharded over the data-parallel group (ZeRO-1); gradients reduce-scattered, weights all-gathered",
    )
    recompute: Literal["none", "selective", "full", "selective_op"] = Field(
        "none",
        description="activation recomputation (Megatron's --recompute-granularity): full re-runs each "
        "block's forward in its backward; selective re-runs only the core attention (QK^T, softmax, "
        "dropout, attention over V) and keeps no s^2 scores (Korthikanti et al. 2022); selective_op is "
        "TorchTitan's op-level selective checkpointing of Llama blocks (selective_ac_option 'op'): the "
        "outputs of the attention kernel and of every other matmul (wq, wv, w1, w2) are kept, the "
        "block's input besides, and the other matmuls (wk, wo, w3) and every pointwise op re-run",
    )
    recompute_num_layers: Count | None = Field(
        None,
        ge=0,
        description="with recompute: full, partial recomputation by layer count (Megatron's "
        "--recompute-num-layers, NeMo's activations_checkpoint_num_layers), counted per model chunk (a "
        "pipeline stage's, or a virtual stage's, blocks): with recompute_method block the first N blocks "
        "of each chunk are recomputed and the rest keep their activations; with uniform every block is "
        "recomputed, checkpointed in groups of N (only each group's input kept). Default: every block, "
        "one at a time",
    )
    recompute_method: Literal["uniform", "block"] = Field(
        "uniform",
        description="how recompute_num_layers applies (Megatron's --recompute-method): block (the first N "
        "blocks of each chunk) or uniform (groups of N blocks, each checkpointed at its input)",
    )

    @property
    def model_parallel(self) -> bool:
        """Whether Megatron's program runs: tensor or pipeline parallelism, recomputation or the
        distributed optimizer (which only that program models). Plain data parallelism otherwise keeps
        the DDP program."""
        return self.tensor > 1 or self.pipeline > 1 or self.recompute != "none" or self.distributed_optimizer


class TrainingSpec(_Strict):
    optimizer: str = "adam"
    optimizer_options: dict[str, Any] = Field(default_factory=dict)
    gradient_dtype: Precision | None = Field(
        None, description="dtype of communicated gradients; default: workload precision (bf16 under fp8)"
    )
    ddp_bucket_cap_mb: Number = Field(25.0, gt=0)
    first_bucket_cap_mb: Number = Field(1.0, gt=0)
    overlap: StrictBool = Field(True, description="overlap gradient all-reduce with backward (PyTorch DDP)")
    gradient_clipping: GradientClipping = Field(
        "none",
        description="clipping by gradient norm before the update: global (one clip_grad_norm_ over all "
        "gradients) or per_tensor (one call per tensor inside a for-loop optimizer, as BERT's "
        "BertAdam): a norm pass and a scaling pass over the fp32 gradients, 12 bytes per parameter",
    )
    host_sync_before_update: StrictBool | None = Field(
        None,
        description="whether the host waits for the GPU between backward and the optimizer step: a "
        "loss scaler's inf check (fp16: torch.amp.GradScaler, apex amp, DeepSpeed) or a gradient norm "
        "read on the host (clip_grad_norm_(...).item()). The optimizer's host work then runs after "
        "backward's kernels instead of beside them. Default: true for fp16, false otherwise",
    )
    host_sync_after_forward: StrictBool = Field(
        False,
        description="whether the host waits for the GPU between forward and backward: the loss read on "
        "the host every micro-step (loss.item() for logging) or a timer that synchronises each phase "
        "(torch.cuda.synchronize(), as calibrate model and per-phase benchmarks do). Backward's dispatch "
        "then starts when forward's kernels are done, without a queue of work ahead of the device",
    )
    memory_breakdown: StrictBool = Field(
        False,
        description="DeepSpeed's memory_breakdown: the engine reports memory (gc.collect() and memory "
        "statistics on the training thread) before and after forward, backward and step, six times a step",
    )
    collective_algorithm: CollectiveAlgorithm = CollectiveAlgorithm.AUTO
    offload: OffloadSpec = OffloadSpec()
    sharding: ShardingSpec = ShardingSpec()
    parallelism: ParallelismSpec = ParallelismSpec()
    network: Literal["analytical", "flow"] = Field(
        "analytical",
        description="collective durations: analytical (closed-form α-β model, fast) or flow "
        "(the algorithm's flows simulated over the topology, links shared max-min fairly)",
    )

    @property
    def tensor_sharded(self) -> bool:
        """ZeRO/FSDP (sharding) or ZeRO-Offload over a tensor-parallel layout without a pipeline: the
        sharding layer's data-parallel program runs one tensor-parallel rank's share of the model with
        Megatron's per-layer collectives, instead of Megatron's own program (Megatron-DeepSpeed runs
        DeepSpeed's ZeRO engine over Megatron's mpu; FSDP2 shards DTensor-parallel modules alike)."""
        sharded = self.sharding.enabled or self.offload.mode != "none"
        return self.parallelism.model_parallel and sharded and self.parallelism.pipeline == 1

    @property
    def megatron_program(self) -> bool:
        """Whether Megatron-LM's own program runs the step: model parallelism not taken over by ZeRO."""
        return self.parallelism.model_parallel and not self.tensor_sharded


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    profile: str | None = Field(None, description="calibration profile: a path or 'builtin:NAME'")
    cluster: ClusterSpec
    workload: WorkloadSpec
    training: TrainingSpec = TrainingSpec()
    _source: str = PrivateAttr("")  # the file or preset it was read from, for messages

    @property
    def source(self) -> str | None:
        """The file or preset this scenario came from (None when built in code)."""
        return self._source or None

    @property
    def pointwise_code(self) -> str:
        """``workload.pointwise`` as given, else its default (WorkloadSpec.pointwise_code), with
        tensor or pipeline parallelism counting as framework code."""
        p = self.training.parallelism
        return self.workload.pointwise_code(p.tensor > 1 or p.pipeline > 1)

    @property
    def implementation(self) -> str | None:
        """``workload.implementation`` as given, else the catalog model's default code (Megatron-LM under
        tensor or pipeline parallelism); None for custom layers, which name no code."""
        if self.workload.implementation is not None:
            return self.workload.implementation
        if self.workload.model is None:
            return None
        p = self.training.parallelism
        model_parallel = p.tensor > 1 or p.pipeline > 1
        return catalog.default_implementation(catalog.model(self.workload.model), model_parallel)

    @property
    def attention_kernel(self) -> str:
        """``workload.attention_kernel`` as given, else the scenario's code's default library
        (catalogs/attention_kernels.yaml default_kernel)."""
        if self.workload.attention_kernel != "auto":
            return self.workload.attention_kernel
        return catalog.default_attention_kernel(self.implementation)

    @property
    def attention_dropout(self) -> float:
        """``workload.attention_dropout`` as given, else the code's default for the model's style
        (catalogs/attention_kernels.yaml default_dropout); 0 for custom layers."""
        if self.workload.attention_dropout is not None:
            return self.workload.attention_dropout
        arch = catalog.model(self.workload.model) if self.workload.model is not None else None
        style = getattr(arch, "style", None)
        return catalog.default_attention_dropout(self.implementation, style) if style else 0.0

    @property
    def vocab_multiple(self) -> int:
        """``workload.pad_vocab_to_multiple_of`` as given, else its default (WorkloadSpec.vocab_multiple)."""
        p = self.training.parallelism
        return self.workload.vocab_multiple(p.tensor, p.tensor > 1 or p.pipeline > 1)

    def to_dict(self) -> dict[str, Any]:
        """The resolved scenario in the file's schema, every key with its value (defaults included), as
        plain JSON data: what a sweep records for each row; ``load_scenario`` reads it back to an equal
        scenario."""
        return self.model_dump(mode="json")

    def with_changes(self, **dotted: Any) -> "Scenario":
        """A copy with dotted keys replaced, validated again (``{"cluster.nodes": 4}``); a value of None
        resets its key to the default. Only what the scenario set is carried over, so a key left to its
        default stays unset in the copy (``run`` says which settings the scenario made and which are
        defaults). A dotted key below a value (``workload.model.name``) or a list (``workload.layers``)
        is refused by its key."""
        data = self.model_dump(exclude_unset=True)
        full = self.model_dump()  # defaults too: what each part of a dotted key is
        for key, value in dotted.items():
            node, known = data, full
            parts = key.split(".")
            for depth, part in enumerate(parts[:-1], 1):
                known = known.get(part) if isinstance(known, dict) else None
                section = ".".join(parts[:depth])
                if isinstance(known, list):
                    raise InputError(
                        f"{section} is a list: a dotted key changes keys, not a list's items "
                        f"(give {section} whole, or edit the file)",
                        source=self.source,
                        key=key,
                    )
                if known is not None and not isinstance(known, dict):
                    raise InputError(
                        f"{section} is {_value_shown(known)}, a value, not a section with keys "
                        f"(give {section} whole, or edit the file)",
                        source=self.source,
                        key=key,
                    )
                if not isinstance(node.get(part), dict):
                    node[part] = {}
                node = node[part]
            if value is None:
                node.pop(parts[-1], None)
            else:
                node[parts[-1]] = value
        changed = validate_scenario(data, source=self.source or f"{self.name} (modified)")
        changed._source = self._source
        return changed

    def with_world_size(self, gpus: int) -> "Scenario":
        """The same cluster shape scaled to ``gpus`` GPUs: fewer GPUs per node if below one node."""
        per_node = self.cluster.gpus_per_node
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0:
            raise InputError(f"a GPU count must be a positive integer, not {gpus!r}", key="gpus")
        if gpus < per_node:
            if per_node % gpus:
                raise InputError(f"{gpus} GPUs do not fit nodes of {per_node} GPUs", key="gpus")
            return self.with_changes(**{"cluster.nodes": 1, "cluster.gpus_per_node": gpus})
        if gpus % per_node:
            raise InputError(f"{gpus} GPUs is not a whole number of {per_node}-GPU nodes", key="gpus")
        return self.with_changes(**{"cluster.nodes": gpus // per_node})


def _value_shown(value: Any, limit: int = 40) -> str:
    """A scenario value for a message: a list or mapping by its size, anything else quoted and cut."""
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _check_limits(c: ClusterSpec) -> None:
    """Physical limits (catalogs/hardware_defaults.yaml ``limits``, each with its source): no count,
    rate or latency past the largest or fastest part ever built (times a margin), none below the
    slowest."""
    lim = catalog.hardware_defaults()["limits"]
    per_node = {
        "nvswitch": lim["nvswitch_gpus_per_node"],
        "nvlink_mesh": lim["nvswitch_gpus_per_node"],
        "pcie": lim["pcie_gpus_per_node"],
        # the GCDs the catalog's Frontier node joins (frontier_infinity_fabric pairs)
        "infinity_fabric": 1
        + max(max(a, b) for a, b, _ in catalog.hardware_defaults()["frontier_infinity_fabric"]["pairs"]),
    }[str(c.intra_node.fabric)]
    checks = [
        ("cluster.gpus_per_node", c.gpus_per_node, per_node, f"GPUs in one {c.intra_node.fabric} node"),
        ("cluster.nodes", c.world_size, lim["cluster_gpus"], "GPUs in one cluster"),
        ("cluster.nic.count", c.nic.count, lim["nics_per_node"], "NICs per node"),
        ("cluster.nic.line_rate_gbps", c.nic.line_rate_gbps, lim["nic_line_rate_gbps"], "Gb/s per NIC port"),
        (
            "cluster.fabric.nodes_per_leaf",
            c.fabric.nodes_per_leaf,
            lim["switch_radix"],
            "ports of one switch",
        ),
        (
            "cluster.fabric.ports_per_switch",
            c.fabric.ports_per_switch or 0,
            lim["switch_radix"],
            "ports of one switch",
        ),
        ("cluster.host.dram_gbs", c.host.dram_gbs or 0.0, lim["host_dram_gbs"], "GB/s of host DRAM per node"),
        (
            "cluster.intra_node.measured_allreduce_busbw_gbs",
            c.intra_node.measured_allreduce_busbw_gbs or 0.0,
            lim["intra_node_busbw_gbs"],
            "GB/s of intra-node bus bandwidth",
        ),
        ("cluster.nic.latency_us", c.nic.latency_us or 0.0, lim["latency_s_max"] * 1e6, "us of latency"),
    ]
    for key, value, top, what in checks:
        if value > top:
            shown = f"{value:,}" if isinstance(value, int) else f"{value:,g}"
            if key == "cluster.nodes":  # the limit is on GPUs: say both numbers, each by its name
                shown = f"{c.nodes:,} nodes x {c.gpus_per_node} GPUs = {value:,} GPUs"
            raise InputError(
                f"{shown} is beyond any real machine (at most {top:,g} {what}; {catalog.LIMITS_SOURCE})",
                key=key,
            )
    slowest = lim["link_gbps_min"]
    floors = [
        ("cluster.nic.line_rate_gbps", c.nic.line_rate_gbps, slowest, "Gb/s per NIC port"),
        ("cluster.nic.effective_gbps", c.nic.effective_gbps, slowest, "Gb/s per NIC port"),
        (
            "cluster.intra_node.measured_allreduce_busbw_gbs",
            c.intra_node.measured_allreduce_busbw_gbs,
            slowest / 8,
            "GB/s of bus bandwidth, the slowest link's rate",
        ),
        ("cluster.host.dram_gbs", c.host.dram_gbs, lim["host_dram_gbs_min"], "GB/s of host DRAM per node"),
    ]
    h = c.heterogeneity
    for i, d in enumerate(h.degraded_nics if h is not None else []):
        floors.append(
            (
                f"cluster.heterogeneity.degraded_nics.{i}.bandwidth_factor",
                d.bandwidth_factor,
                slowest / c.nic.line_rate_gbps,
                f"of the {c.nic.line_rate_gbps:g} Gb/s line rate: {slowest:g} Gb/s, the slowest link's rate",
            )
        )
    for key, value, low, what in floors:
        if value is not None and value < low:
            raise InputError(
                f"{value:,g} is below any real part (at least {low:,g} {what}; {catalog.LIMITS_SOURCE})",
                key=key,
            )
    _check_nic_product(c.nic)


def _check_nic_product(nic: NicSpec) -> None:
    """An InfiniBand port runs at one of its generations' rates: a rate no product has (25 Gb/s: an
    Ethernet rate) is a NIC that does not exist, priced and simulated as if it did. Above the fastest
    generation a rate is a what-if about a future one."""
    rates = catalog.limit("infiniband_gbps")
    if nic.kind == "infiniband" and nic.line_rate_gbps <= max(rates) and nic.line_rate_gbps not in rates:
        raise InputError(
            f"no InfiniBand port runs at {nic.line_rate_gbps:g} Gb/s: a 4x port runs at "
            f"{', '.join(f'{r:g}' for r in rates)} Gb/s (SDR to XDR; HDR100 and NDR200 split ports at 100 "
            f"and 200); for Ethernet set cluster.nic.kind: ethernet_tcp, with gpudirect_rdma: true for RoCE "
            f"({catalog.LIMITS_SOURCE})",
            key="cluster.nic.line_rate_gbps",
        )


def _check_ports(down: int, oversubscription: float, ports: int, what: str, key: str) -> None:
    """A switch with ``down`` ports facing down sends ceil(down / oversubscription) up: both on its
    ``ports`` (a leaf switch: its nodes and spine uplinks; a spine switch of a pod: its leaves and core
    uplinks)."""
    up = math.ceil(down / oversubscription)
    if down + up > ports:
        raise InputError(
            f"{what} needs {down + up} ports per switch ({down} down, {up} up), more than {ports}",
            key=f"cluster.fabric.{key}",
        )


def _check_fabric(c: ClusterSpec) -> None:
    """A leaf-spine fabric must hold the nodes with switches of its radix. Each NIC rail has its own
    switches (rail-optimised, as DGX SuperPOD), so one switch of a leaf serves nodes_per_leaf NICs
    and sends ceil(that / oversubscription) uplinks; a spine switch has one port per leaf (two
    tiers), or per leaf of its pod plus its core uplinks (three tiers); a core switch one per pod."""
    f = c.fabric
    if f.kind != "leaf_spine":
        return
    ports = f.ports_per_switch or catalog.hardware_defaults()["limits"]["switch_radix"]
    _check_ports(
        f.nodes_per_leaf, f.oversubscription, ports, f"a leaf of {f.nodes_per_leaf} nodes", "nodes_per_leaf"
    )
    leaves = -(-c.nodes // f.nodes_per_leaf)
    if f.leaves_per_pod is None:
        if leaves > ports:
            raise InputError(
                f"{c.nodes:,} nodes need {leaves:,} leaves; a two-tier leaf-spine of {ports}-port switches "
                f"holds {ports} leaves ({ports * f.nodes_per_leaf:,} nodes): add a third tier with "
                "cluster.fabric.leaves_per_pod",
                key="cluster.nodes",
            )
        return
    _check_ports(
        f.leaves_per_pod,
        f.core_oversubscription,
        ports,
        f"a pod of {f.leaves_per_pod} leaves",
        "leaves_per_pod",
    )
    pods = -(-leaves // f.leaves_per_pod)
    if pods > ports:
        per_pod = f.leaves_per_pod * f.nodes_per_leaf
        raise InputError(
            f"{c.nodes:,} nodes need {pods:,} pods of {per_pod:,} nodes; a core of {ports}-port switches "
            f"holds {ports} pods ({ports * per_pod:,} nodes)",
            key="cluster.nodes",
        )


def _check_once(items, what, key: str) -> None:
    """Refuse a rank, node or NIC listed twice: the simulator would multiply its factors (1.2 and 1.5
    became 1.8, and a node of two GPU types both ratios), which no one writes on purpose; the list
    index names the second entry."""
    first: dict = {}
    for i, item in enumerate(items):
        thing = what(item)
        if thing in first:
            raise InputError(
                f"{thing} is already listed at {key}.{first[thing]}: give it once", key=f"{key}.{i}"
            )
        first[thing] = i


def _check_heterogeneity(c: ClusterSpec, precision: str) -> None:
    """Every straggler and fault names a rank, node or NIC that exists, once, and a node's other GPU
    runs the workload's precision (its error names the node's entry, not workload.precision)."""
    h = c.heterogeneity
    key = "cluster.heterogeneity"
    for i, g in enumerate(h.slow_gpus):
        if g.rank >= c.world_size:
            raise InputError(
                f"rank {g.rank} does not exist (ranks 0..{c.world_size - 1})", key=f"{key}.slow_gpus.{i}.rank"
            )
    _check_once(h.slow_gpus, lambda g: f"rank {g.rank}", f"{key}.slow_gpus")
    _check_once(h.degraded_nics, lambda d: f"node {d.node} NIC {d.nic}", f"{key}.degraded_nics")
    _check_once(h.node_gpus, lambda n: f"node {n.node}", f"{key}.node_gpus")
    for i, d in enumerate(h.degraded_nics):
        if d.node >= c.nodes:
            raise InputError(
                f"node {d.node} does not exist (nodes 0..{c.nodes - 1})", key=f"{key}.degraded_nics.{i}.node"
            )
        if d.nic >= c.nic.count:
            raise InputError(
                f"NIC {d.nic} does not exist ({c.nic.count} per node)", key=f"{key}.degraded_nics.{i}.nic"
            )
    for i, n in enumerate(h.node_gpus):
        if n.node >= c.nodes:
            raise InputError(
                f"node {n.node} does not exist (nodes 0..{c.nodes - 1})", key=f"{key}.node_gpus.{i}.node"
            )
        try:
            catalog.gpu(n.gpu)
        except InputError as exc:
            raise exc.located(key_prefix=f"{key}.node_gpus.{i}.gpu") from None
        try:
            catalog.gpu(n.gpu).peak_flops(precision)
        except InputError as exc:
            raise InputError(exc.message, key=f"{key}.node_gpus.{i}.gpu") from None
    leaves = -(-c.nodes // c.fabric.nodes_per_leaf) if c.fabric.kind != "single_switch" else 1
    for i, b in enumerate(h.background):
        limit = c.nodes if b.links == "nics" else leaves
        for n in b.nodes or []:
            if n >= limit:
                what = "node" if b.links == "nics" else "leaf"
                raise InputError(
                    f"{what} {n} does not exist ({limit} in this cluster)", key=f"{key}.background.{i}.nodes"
                )


def _check_inputs_and_tiers(s: Scenario) -> None:
    """Settings that would otherwise be silently meaningless."""
    inp = s.workload.input
    if inp is not None and inp.row_bytes is not None and inp.row_bytes > inp.bytes_per_sample:
        raise InputError(
            f"a row of {inp.row_bytes:g} bytes is larger than a sample's {inp.bytes_per_sample:g} bytes of "
            "features (a sample gathers whole rows)",
            key="workload.input.row_bytes",
        )
    one_byte = catalog.limit("size_bytes_min")
    sizes = [
        ("workload.input.bytes_per_sample", inp.bytes_per_sample if inp is not None else None),
        ("workload.input.row_bytes", inp.row_bytes if inp is not None else None),
        ("training.ddp_bucket_cap_mb", s.training.ddp_bucket_cap_mb * 2**20),
        ("training.first_bucket_cap_mb", s.training.first_bucket_cap_mb * 2**20),
    ]
    for key, value in sizes:
        if value is not None and value < one_byte:
            raise InputError(f"{value:,g} bytes is less than one byte ({catalog.LIMITS_SOURCE})", key=key)
    f = s.cluster.fabric
    if f.core_oversubscription != 1.0 and f.leaves_per_pod is None:
        raise InputError(
            "core_oversubscription applies to a third tier of core switches: set leaves_per_pod too",
            key="cluster.fabric.core_oversubscription",
        )
    if f.kind == "single_switch" and f.oversubscription != 1.0:
        raise InputError(
            "oversubscription applies to a leaf-spine fabric's leaf uplinks: a single switch has none "
            "(set cluster.fabric.kind: leaf_spine, or leave it out)",
            key="cluster.fabric.oversubscription",
        )
    # A leaf sends at least one uplink (one port as fast as a node's): nodes_per_leaf:1 is the most a
    # leaf can be oversubscribed; a pod's spine likewise leaves_per_pod:1.
    if f.kind == "leaf_spine" and f.oversubscription > f.nodes_per_leaf:
        raise InputError(
            f"{f.oversubscription:,g}:1 is more than a leaf of {f.nodes_per_leaf} nodes can be "
            f"oversubscribed (one uplink at the least: {f.nodes_per_leaf}:1)",
            key="cluster.fabric.oversubscription",
        )
    if f.leaves_per_pod is not None and f.core_oversubscription > f.leaves_per_pod:
        raise InputError(
            f"{f.core_oversubscription:,g}:1 is more than a pod of {f.leaves_per_pod} leaves can be "
            f"oversubscribed (one core uplink at the least: {f.leaves_per_pod}:1)",
            key="cluster.fabric.core_oversubscription",
        )


def _check_diloco(s: Scenario, options: Any) -> None:
    """DiLoCo's links between workers: a rate no slower than the slowest link and no faster than a
    worker's nodes' NICs at the fastest rate; a latency of at most a day (hardware_defaults limits)."""
    if s.training.optimizer != "diloco":
        return
    key = "training.optimizer_options"
    gbps, latency_ms = options.inter_worker_gbps, options.inter_worker_latency_ms
    nodes = max(1, s.cluster.nodes // options.workers)
    fastest = nodes * catalog.limit("nics_per_node") * catalog.limit("nic_line_rate_gbps")
    if gbps is not None and gbps < catalog.limit("link_gbps_min"):
        raise InputError(
            f"{gbps:,g} is below any real link (at least {catalog.limit('link_gbps_min'):g} Gb/s; "
            f"{catalog.LIMITS_SOURCE})",
            key=f"{key}.inter_worker_gbps",
        )
    if gbps is not None and gbps > fastest:
        raise InputError(
            f"{gbps:,g} is beyond any real machine (at most {fastest:,g} Gb/s: a worker of {nodes} "
            f"node(s), each with {catalog.limit('nics_per_node')} NICs of "
            f"{catalog.limit('nic_line_rate_gbps'):,} Gb/s; {catalog.LIMITS_SOURCE})",
            key=f"{key}.inter_worker_gbps",
        )
    if latency_ms > catalog.limit("latency_s_max") * 1e3:
        raise InputError(
            f"{latency_ms:,g} ms is beyond any real link (at most {catalog.limit('latency_s_max') * 1e3:,g} "
            f"ms, a day; {catalog.LIMITS_SOURCE})",
            key=f"{key}.inter_worker_latency_ms",
        )


def check_seq_len(model: str, seq: int | None, key: str) -> None:
    """A transformer's sequence fits its learned position table (BERT-Large: 512); ``key`` names where
    the sequence was given (a scenario key, a command's option)."""
    arch = catalog.model(model)
    if arch.family == "transformer" and arch.max_positions and seq is not None and seq > arch.max_positions:
        raise InputError(
            f"{seq} tokens are more than {model}'s {arch.max_positions} learned positions (max_positions)",
            key=key,
        )


def workload_for_command(model: str, options: dict[str, Any]) -> WorkloadSpec:
    """A catalog model's workload from a command's options (``{"--micro-batch": 8, "--seq-len":
    None}``), checked as a scenario's workload is: each error names the option."""
    fields = {opt.lstrip("-").replace("-", "_"): opt for opt in options}
    data = {"model": model, **{f: options[o] for f, o in fields.items() if options[o] is not None}}
    try:
        spec = WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        key, msg = first_error(exc, model=WorkloadSpec)
        raise InputError(msg, key=fields.get(key.split(".")[0], key)) from None
    check_seq_len(model, spec.seq_len, fields.get("seq_len", "seq_len"))
    return spec


def _check_model(s: Scenario) -> None:
    """The workload's catalog model exists and its sequence fits the model's learned positions."""
    if s.workload.model is None:
        return
    try:
        arch = catalog.model(s.workload.model)
    except InputError as exc:
        raise exc.located(key_prefix="workload.model") from None
    check_seq_len(s.workload.model, s.workload.seq_len, "workload.seq_len")
    multiple = s.vocab_multiple
    given = s.workload.pad_vocab_to_multiple_of is not None
    if given and arch.family == "transformer" and multiple > arch.vocab:
        # padding aligns rows: a multiple above the vocabulary itself more than doubles the table
        raise InputError(
            f"pads {s.workload.model}'s {arch.vocab:,}-entry vocabulary to a multiple of {multiple:,} "
            "(per tensor-parallel rank x training.parallelism.tensor), more than the vocabulary itself",
            key="workload.pad_vocab_to_multiple_of",
        )


def _blocks(s: Scenario) -> int:
    """The model's layers a fragment is made of: transformer blocks, ResNet bottleneck blocks, or the
    custom layers with their repeats."""
    if s.workload.layers is not None:
        return sum(layer.repeat for layer in s.workload.layers)
    arch = catalog.model(s.workload.model)
    return arch.layers if arch.family == "transformer" else sum(arch.blocks)


def _check_fragments(s: Scenario, fragments: int) -> None:
    """Streaming DiLoCo synchronises fragments of whole layers (Douillard et al. 2025, sec. 2.2): more
    fragments than layers would split layers the method keeps whole."""
    if fragments > 1 and fragments > _blocks(s):
        raise InputError(
            f"{fragments} fragments of a model of {_blocks(s)} layers: a fragment holds whole layers",
            key="training.optimizer_options.fragments",
        )


def _check_fp8_recipe(w: WorkloadSpec) -> None:
    """workload.fp8_recipe says how FP8 scales are found, so it means something under precision fp8
    only: set beside another precision it would change nothing, and the run would look like an FP8 one
    to its reader. Refused, as a key the model does not use is not (that is a note: the key is right,
    the model differs), because here the scenario contradicts itself. Unset is None (delayed under
    fp8), so that a scenario written out whole with its defaults and read again is not refused."""
    if w.fp8_recipe is not None and w.precision != "fp8":
        raise InputError(
            f"{w.fp8_recipe!r} is how FP8 scales are found and applies to precision fp8 only; this "
            f"workload's precision is {w.precision}: set workload.precision: fp8, or drop fp8_recipe",
            key="workload.fp8_recipe",
        )


def _check_semantics(s: Scenario) -> None:
    """Cross-field checks that the field types alone cannot express."""
    try:
        gpu = catalog.gpu(s.cluster.gpu)
    except InputError as exc:
        raise exc.located(key_prefix="cluster.gpu") from None
    _check_model(s)
    _check_fp8_recipe(s.workload)
    try:
        gpu.peak_flops(s.workload.precision)
    except InputError as exc:
        raise exc from None
    c = s.cluster
    intra = c.intra_node
    if intra.fabric in ("nvswitch", "nvlink_mesh") and gpu.nvlink.links == 0:
        raise InputError(f"{gpu.name} has no NVLink; use fabric: pcie", key="cluster.intra_node.fabric")
    if intra.fabric == "nvlink_mesh" and c.gpus_per_node not in (1, 2, 4, 8):
        raise InputError(
            f"the DGX-1 hybrid cube-mesh holds 1, 2, 4 or 8 GPUs, not {c.gpus_per_node}",
            key="cluster.gpus_per_node",
        )
    if intra.fabric == "nvswitch" and gpu.nvlink_domain_gpus and c.gpus_per_node > gpu.nvlink_domain_gpus:
        raise InputError(
            f"{c.gpus_per_node} {gpu.name} GPUs on one NVSwitch: the largest NVLink domain built of them "
            f"holds {gpu.nvlink_domain_gpus} (nvlink_domain_gpus of its catalog entry); more GPUs are more "
            "nodes (cluster.nodes)",
            key="cluster.gpus_per_node",
        )
    if intra.fabric == "infinity_fabric":
        if gpu.dies_per_package != 2:
            raise InputError(
                f"fabric infinity_fabric is the Frontier node of MI250X GCDs; {gpu.name} is not one",
                key="cluster.intra_node.fabric",
            )
        if c.gpus_per_node not in (2, 4, 6, 8) or intra.gpus_per_pcie_switch != 2:
            raise InputError(
                "a Frontier node holds 1-4 MI250X packages of 2 GCDs (gpus_per_node 2, 4, 6 or 8, "
                f"gpus_per_pcie_switch 2), not {c.gpus_per_node} GCDs by {intra.gpus_per_pcie_switch}",
                key="cluster.gpus_per_node",
            )
    if (
        intra.fabric == "pcie"
        and c.gpus_per_node > intra.gpus_per_pcie_switch
        and c.gpus_per_node % intra.gpus_per_pcie_switch
    ):
        raise InputError(
            f"{c.gpus_per_node} GPUs do not fill PCIe switches of {intra.gpus_per_pcie_switch}",
            key="cluster.gpus_per_node",
        )
    _check_limits(c)
    _check_fabric(c)
    if c.heterogeneity is not None:
        _check_heterogeneity(c, s.workload.precision)
    if c.nodes > 1 and c.nic.count == 0:
        raise InputError("a multi-node cluster needs at least one NIC per node", key="cluster.nic.count")
    if c.nic.effective_gbps is not None and c.nic.effective_gbps > c.nic.line_rate_gbps:
        raise InputError(
            f"effective rate {c.nic.effective_gbps} Gb/s exceeds the line rate {c.nic.line_rate_gbps} Gb/s",
            key="cluster.nic.effective_gbps",
        )
    _check_inputs_and_tiers(s)
    # Each optimizer has its own options schema (optimizer_options.py, same layer as this one).
    options = parse_options(s.training.optimizer, s.training.optimizer_options)
    _check_fragments(s, getattr(options, "fragments", 1))
    _check_diloco(s, options)
    _check_update_implementation(s, getattr(options, "implementation", "fused"))
    _check_gradient_copy(s.training)
    _check_gpu_update_gap(s.training)
    _check_cpu_threads(s)
    check_sharding(s.training)
    check_partition(s.training, c, gpu)
    par = s.training.parallelism
    _check_recompute_layers(s)
    if par.model_parallel or par.virtual_stages > 1 or par.sequence_parallel:
        _check_parallelism(s)
        _check_composition(s)


def _check_gradient_copy(t: TrainingSpec) -> None:
    """``offload.gradient_copy: blocking`` is a path of DeepSpeed ZeRO-3's offloaded gradients only."""
    off, sh = t.offload, t.sharding
    if off.gradient_copy == "blocking" and not (
        off.mode != "none" and sh.stage == 3 and sh.framework == "deepspeed"
    ):
        raise InputError(
            "gradient_copy blocking is DeepSpeed ZeRO-3's offloaded gradient path (stage3.py): it needs "
            "training.offload.mode zero or interleaved and training.sharding.stage 3 (framework deepspeed)",
            key="training.offload.gradient_copy",
        )


def _check_cpu_threads(s: Scenario) -> None:
    """Every GPU of a node runs its CPU optimizer on its own threads at once (DeepSpeed's CPU Adam, one
    OpenMP team per rank), so the node's ranks cannot use more threads than it has cores: beyond that
    the threads share cores and the rate does not grow (host.py scales the rate by threads)."""
    threads, c = s.training.offload.cpu_threads, s.cluster
    if threads is not None and threads > max(1, c.host.cores // c.gpus_per_node):
        raise InputError(
            f"{threads} CPU optimizer threads per GPU x {c.gpus_per_node} GPUs per node = "
            f"{threads * c.gpus_per_node} threads on {c.host.cores} cores (cluster.host.cores): at most "
            f"{max(1, c.host.cores // c.gpus_per_node)} per GPU",
            key="training.offload.cpu_threads",
        )


def _check_gpu_update_gap(t: TrainingSpec) -> None:
    """``offload.gpu_update_gap`` is the Deep Optimizer States fork's stage3.py schedule (ZeRO-3 only)."""
    off, sh = t.offload, t.sharding
    if off.gpu_update_gap is not None and not (
        off.mode == "zero" and sh.stage == 3 and sh.framework == "deepspeed"
    ):
        raise InputError(
            "gpu_update_gap is Deep Optimizer States' DeepSpeed ZeRO-3 schedule (stage3.py "
            "prefetch_optimizer_gap): it needs training.offload.mode zero and training.sharding.stage 3 "
            "(framework deepspeed)",
            key="training.offload.gpu_update_gap",
        )


def _check_update_implementation(s: Scenario, implementation: str) -> None:
    """Adam's or SGD's update implementation where the code fixes its own fused update: Megatron-LM's
    program (apex FusedAdam) and CPU offload (DeepSpeed's CPU Adam, its fused Adam on the GPU)."""
    if implementation == "fused":
        return
    t = s.training
    if t.megatron_program:
        where = "Megatron-LM (tensor or pipeline parallelism) updates with apex's FusedAdam"
    elif t.offload.mode != "none":
        where = "CPU offload updates with DeepSpeed's CPU Adam (and its fused Adam on the GPU)"
    else:
        return
    raise InputError(
        f"implementation {implementation} does not apply: {where}; use fused",
        key="training.optimizer_options.implementation",
    )


def _check_composition(s: Scenario) -> None:
    """Model parallelism (Megatron's program) beside the sharding layer and the other recompute key: what
    the two programs do not model together is refused, with the key to change."""
    par = s.training.parallelism
    if s.training.sharding.enabled or s.training.offload.mode != "none":
        _check_sharded_model_parallel(s)
    if s.workload.activation_checkpointing and par.recompute in ("selective", "selective_op"):
        raise InputError(
            "recomputation is set twice: workload.activation_checkpointing recomputes whole blocks and "
            f"training.parallelism.recompute: {par.recompute} only some of their ops; keep one",
            key="workload.activation_checkpointing",
        )
    if par.recompute == "selective_op":
        _check_op_checkpointing(s)
    if s.workload.activation_checkpointing and (par.tensor > 1 or par.pipeline > 1):
        raise InputError(
            "with tensor/pipeline parallelism recomputation is Megatron's: set "
            "training.parallelism.recompute: full instead",
            key="workload.activation_checkpointing",
        )


def _check_op_checkpointing(s: Scenario) -> None:
    """TorchTitan's op-level policy counts the matmuls of its Llama block (wq, wk, wv, wo, w1, w3, w2 in
    that order) and saves every other one; its blocks under tensor parallelism re-run their collectives,
    which is not modelled."""
    key = "training.parallelism.recompute"
    arch = catalog.model(s.workload.model)
    if getattr(arch, "style", None) != "llama":
        raise InputError(
            f"recompute: selective_op is TorchTitan's policy for Llama blocks; {s.workload.model} is not one",
            key=key,
        )
    if s.training.parallelism.tensor > 1:
        raise InputError(
            "recompute: selective_op with tensor parallelism is not modelled (its re-run ops include "
            "the blocks' collectives); use full or tensor: 1",
            key=key,
        )


def _check_recompute_layers(s: Scenario) -> None:
    """Partial recomputation by layer count applies to full recomputation only, and counts blocks of one
    model chunk (Megatron: num_layers_per_pipeline_rank, per virtual stage with interleaving)."""
    par, key = s.training.parallelism, "training.parallelism.recompute_num_layers"
    n = par.recompute_num_layers
    if n is None:
        if par.recompute_method != "uniform":
            raise InputError(
                "recompute_method: block needs recompute_num_layers (the blocks recomputed per chunk)",
                key="training.parallelism.recompute_method",
            )
        return
    if par.recompute != "full":
        raise InputError(
            f"recompute_num_layers applies to recompute: full (whole blocks), not {par.recompute}", key=key
        )
    if s.workload.activation_checkpointing:
        raise InputError(
            "recomputation is set twice: workload.activation_checkpointing recomputes every block; "
            "keep training.parallelism.recompute_num_layers",
            key="workload.activation_checkpointing",
        )
    if n == 0 and par.recompute_method == "uniform":
        raise InputError("recompute_method uniform needs groups of at least 1 block", key=key)
    arch = catalog.model(s.workload.model) if s.workload.model else None
    if arch is None or arch.family != "transformer":
        raise InputError("recompute_num_layers counts the blocks of a catalog transformer", key=key)
    chunks = par.pipeline * par.virtual_stages
    per_chunk = arch.layers // chunks
    if n > per_chunk:
        raise InputError(
            f"recompute_num_layers {n} exceeds the {per_chunk} blocks of one model chunk "
            f"({arch.layers} layers over pipeline x virtual_stages = {chunks})",
            key=key,
        )


# Optimizers whose programs compose with tensor/pipeline parallelism. The compressed optimizers'
# programs model a data-parallel compressed all-reduce only; DeepSpeed's own 1-bit Adam tutorial says
# its MPI-based implementation "is not compatible with pipeline parallelism"
# (https://deepspeed.ai/tutorials/onebit-adam), and none of them is offered by Megatron-LM.
_MODEL_PARALLEL_OPTIMIZERS = ("adam", "sgdm")


def _check_parallelism(s: Scenario) -> None:
    """Layouts Megatron-LM refuses (megatron/training/arguments.py and schedules.py asserts), and
    combinations this simulator does not model, each with the key to change."""
    par, c, key = s.training.parallelism, s.cluster, "training.parallelism"
    t, p, v = par.tensor, par.pipeline, par.virtual_stages
    if c.world_size % (t * p):
        raise InputError(
            f"tensor x pipeline = {t} x {p} = {t * p} does not divide the {c.world_size} GPUs",
            key=f"{key}.pipeline" if p > 1 else f"{key}.tensor",
        )
    g = c.gpus_per_node
    if (g % t if t <= g else t % g) and c.nodes > 1:
        raise InputError(
            f"a tensor-parallel group of {t} does not tile nodes of {g} GPUs (not modelled)",
            key=f"{key}.tensor",
        )
    if v > 1 and par.schedule != "interleaved":
        raise InputError("virtual_stages > 1 needs schedule: interleaved", key=f"{key}.schedule")
    if par.schedule == "interleaved":
        if p < 2 or v < 2:
            raise InputError(
                "the interleaved schedule needs pipeline >= 2 and virtual_stages >= 2", key=f"{key}.schedule"
            )
        m = s.workload.gradient_accumulation
        if m % p:
            # Megatron's interleaved schedule asserts num_microbatches % pipeline size == 0.
            raise InputError(
                f"the interleaved schedule needs the micro-batches ({m}, workload.gradient_accumulation) "
                f"to be a multiple of pipeline ({p})",
                key="workload.gradient_accumulation",
            )
    if s.workload.model is None:
        raise InputError(
            "tensor/pipeline parallelism needs a catalog transformer (custom layers have no heads to split)",
            key="workload.layers",
        )
    arch = catalog.model(s.workload.model)
    if arch.family != "transformer":
        raise InputError(f"{s.workload.model} is not a transformer: Megatron splits transformers", key=key)
    if arch.heads % t:
        raise InputError(f"{arch.heads} attention heads are not divisible by tensor={t}", key=f"{key}.tensor")
    if arch.kv_heads and arch.kv_heads % t:  # Megatron: num_query_groups % tensor size == 0
        raise InputError(
            f"{arch.kv_heads} key/value heads are not divisible by tensor={t}", key=f"{key}.tensor"
        )
    if arch.layers % (p * v):
        raise InputError(
            f"{arch.layers} layers do not split evenly into pipeline x virtual_stages = {p} x {v} chunks",
            key=f"{key}.pipeline",
        )
    if s.training.optimizer == "diloco":
        raise InputError(
            "diloco is modelled with data parallelism only: its workers are data-parallel replicas "
            "(DDP inside each); tensor/pipeline parallelism inside a worker is not modelled; use adam or "
            "sgdm with tensor/pipeline parallelism",
            key="training.optimizer",
        )
    if s.training.optimizer not in _MODEL_PARALLEL_OPTIMIZERS:
        backend = (s.training.optimizer_options or {}).get("backend", "nccl")
        _refuse_compressed_model_parallel(s.training.optimizer, par, str(backend))


def _refuse_compressed_model_parallel(optimizer: str, par: ParallelismSpec, backend: str = "nccl") -> None:
    """A compressed optimizer on a layout that runs Megatron-LM's program: the message names what the
    layout has that only that program models (tensor = 8 on a pipeline-free one; Megatron's
    recomputation, sequence parallelism or distributed optimizer on one of neither), how to undo each,
    and only the reasons that hold: the DeepSpeed tutorials' pipeline incompatibility is the MPI-based
    backend's, not the NCCL one's."""
    has, undo = [], []
    for name in ("tensor", "pipeline"):
        if getattr(par, name) > 1:
            has.append(f"{name} = {getattr(par, name)}")
            undo.append(f"training.parallelism.{name} to 1")
    if par.recompute != "none":
        has.append(f"recompute = {par.recompute} (Megatron's)")
        undo.append(
            "training.parallelism.recompute to none (workload.activation_checkpointing: true recomputes "
            "whole blocks under data parallelism)"
        )
    for name in ("sequence_parallel", "distributed_optimizer"):
        if getattr(par, name):
            has.append(name.replace("_", " "))
            undo.append(f"training.parallelism.{name} to false")
    why = []
    if par.pipeline > 1 and optimizer in _PIPELINE_WHY:
        why.append(_PIPELINE_WHY[optimizer][backend.startswith("mpi")])
    why.append(_COMPRESSED_WHY.get(optimizer, _COMPRESSED_WHY["other"]))
    raise InputError(
        f"{optimizer} is modelled with data parallelism only, and this layout has {' and '.join(has)}: "
        f"{'; '.join(why)}; set {', '.join(undo)}, or use adam or sgdm",
        key="training.optimizer",
    )


# Why each compressed optimizer stays data-parallel here: its program models a data-parallel
# compressed all-reduce, and the frameworks that ship it say what they support.
_COMPRESSED_WHY = {
    "onebit-adam": "Megatron-LM, whose tensor and pipeline parallelism is modelled, does not offer it",
    "zero-one-adam": "Megatron-LM, whose tensor and pipeline parallelism is modelled, does not offer it",
    "binsgdm": "BinSGDM's hierarchical 1-bit all-reduce is over data-parallel replicas, and Megatron-LM "
    "does not offer it",
    "other": "Megatron-LM offers none of the compressed optimizers",
}
# Said only where the layout has a pipeline: DeepSpeed's own tutorials.
# (NCCL backend, MPI backend): the tutorials say "Currently the MPI-based implementation is not
# compatible with pipeline parallelism", so the NCCL one runs under DeepSpeed's PipelineEngine, whose
# schedule (not Megatron-LM's) this simulator does not model.
_PIPELINE_WHY = {
    "onebit-adam": (
        "DeepSpeed's NCCL-based 1-bit Adam runs under its PipelineEngine, whose schedule is not modelled "
        "(only the MPI-based one is incompatible with pipelines, deepspeed.ai/tutorials/onebit-adam)",
        "DeepSpeed's MPI-based 1-bit Adam is not compatible with pipeline parallelism "
        "(deepspeed.ai/tutorials/onebit-adam)",
    ),
    "zero-one-adam": (
        "DeepSpeed's NCCL-based 0/1 Adam runs under its PipelineEngine, whose schedule is not modelled "
        "(only the MPI-based one is incompatible with pipelines, deepspeed.ai/tutorials/zero-one-adam)",
        "DeepSpeed's MPI-based 0/1 Adam is not compatible with pipeline parallelism "
        "(deepspeed.ai/tutorials/zero-one-adam)",
    ),
}


# DeepSpeed's PipelineEngine.__init__ (deepspeed/runtime/pipe/engine.py):
# ``assert self.zero_optimization_stage() < 2, "ZeRO-2 and ZeRO-3 are incompatible with pipeline
# parallelism"``.
_DEEPSPEED_PIPE = (
    'DeepSpeed\'s PipelineEngine asserts "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism" '
    "(deepspeed/runtime/pipe/engine.py)"
)


def _check_sharded_model_parallel(s: Scenario) -> None:
    """ZeRO/FSDP or ZeRO-Offload beside Megatron's parallelism. With tensor parallelism and no
    pipeline they compose (Megatron-DeepSpeed: DeepSpeed's ZeRO over Megatron's mpu; PyTorch FSDP2 over
    DTensor tensor parallelism; ZeRO-Offload, Ren et al. ATC'21, with Megatron's model parallelism);
    what the frameworks refuse, or this simulator does not model, is refused with the key to change."""
    par, sh = s.training.parallelism, s.training.sharding
    if par.distributed_optimizer:
        raise InputError(
            "distributed_optimizer is Megatron's own ZeRO-1; with training.sharding or training.offload "
            "the ZeRO engine partitions the optimizer state: leave it false",
            key="training.parallelism.distributed_optimizer",
        )
    if par.pipeline > 1:
        if sh.framework == "fsdp":
            raise InputError(
                "FSDP with pipeline parallelism is not modelled (the pipeline program is Megatron-LM's, "
                "which shards only through distributed_optimizer)",
                key="training.sharding.framework",
            )
        if sh.stage >= 2:
            raise InputError(
                f"ZeRO-{sh.stage} with pipeline parallelism: {_DEEPSPEED_PIPE}", key="training.sharding.stage"
            )
        if sh.stage == 1:
            raise InputError(
                "with pipeline parallelism ZeRO-1 is Megatron's distributed optimizer (the same gradient "
                "reduce-scatter, 1/d update and parameter all-gather over the data-parallel group): set "
                "training.parallelism.distributed_optimizer: true and training.sharding.stage: 0",
                key="training.sharding.stage",
            )
        raise InputError(
            "CPU offload with pipeline parallelism is not modelled (DeepSpeed's PipelineEngine allows "
            "only ZeRO stage < 2, whose offload path is not simulated with a pipeline)",
            key="training.offload.mode",
        )
    if s.cluster.heterogeneity is not None:
        raise InputError(
            "stragglers with ZeRO/FSDP or offload over tensor parallelism are not modelled (the rank "
            "classes of tensor parallelism are built for Megatron's program)",
            key="cluster.heterogeneity",
        )
    if sh.zeropp.enabled:
        raise InputError(
            "ZeRO++ with tensor parallelism is not modelled (hpZ's node partition and qgZ's intra-node "
            "all-to-all assume every GPU of a node is a data-parallel rank)",
            key="training.sharding.zeropp",
        )
    if sh.partition.enabled:
        raise InputError(
            "partition levels with tensor parallelism are not modelled (a level's group assumes every GPU "
            "of a node is a data-parallel rank)",
            key="training.sharding.partition",
        )
    if sh.fsdp_strategy == "hybrid" and par.tensor >= s.cluster.gpus_per_node and s.cluster.nodes > 1:
        raise InputError(
            f"FSDP HYBRID_SHARD shards over a node's data-parallel ranks; with tensor = {par.tensor} a "
            f"node of {s.cluster.gpus_per_node} GPUs holds at most one: use full or grad_op",
            key="training.sharding.fsdp_strategy",
        )


# The dotted keys whose value above 1 makes a run a Megatron layout (framework code).
MEGATRON_KEYS = ("training.parallelism.tensor", "training.parallelism.pipeline")


def with_one_pointwise_code(base: Scenario, degrees: Any) -> Scenario:
    """Rows compared side by side (sweep rows, plan candidates) share one model code: where any of
    ``degrees`` (the rows' values of MEGATRON_KEYS) is above 1, some rows are Megatron layouts, framework
    code with fused pointwise kernels (Scenario.pointwise_code). If the base leaves workload.pointwise
    open, it then says fused, so that the data-parallel rows are not priced as plain model code beside
    them. Returns ``base`` itself when nothing changes."""
    if base.workload.pointwise is not None:
        return base
    megatron = any(isinstance(v, int) and not isinstance(v, bool) and v > 1 for v in degrees)
    return base.with_changes(**{"workload.pointwise": "fused"}) if megatron else base


def validate_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate already-parsed data; every failure is an InputError naming ``source`` and the key."""
    if not isinstance(data, dict):
        fields = Scenario.model_fields  # the keys as the schema has them: required, then optional
        required = " and ".join(n for n, f in fields.items() if f.is_required())
        optional = ", ".join(n for n, f in fields.items() if not f.is_required())
        got = "the file is empty; " if data is None else ""
        raise InputError(
            f"{got}a scenario must be a mapping with the keys {required} (required) "
            f"and optionally {optional}",
            source=source,
        )
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        key, msg = first_error(exc, _GPU_TAGS, model=Scenario)
        raise InputError(msg, source=source, key=key) from None
    try:
        _check_semantics(scenario)
    except InputError as exc:
        raise exc.located(source=source) from None
    scenario._source = source
    return scenario


def preset_names() -> list[str]:
    return list(_preset_names())


@lru_cache(maxsize=1)
def _preset_names() -> tuple[str, ...]:
    folder = resources.files("clustersim.catalogs").joinpath("presets")
    return tuple(sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml")))


def preset_text(name: str) -> str:
    """A shipped preset's file as shipped, comments included (``name`` without ``preset:``)."""
    return resources.files("clustersim.catalogs").joinpath("presets").joinpath(f"{name}.yaml").read_text()


@lru_cache(maxsize=None)
def _preset(name: str) -> Scenario:
    """Presets are package data: parsed and validated once per process (sweeps and benchmarks load the
    same preset thousands of times). A Scenario is frozen; ``with_changes`` returns a new one."""
    return validate_scenario(load_yaml(preset_text(name)), source=f"{PRESET_PREFIX}{name}")


def load_scenario(ref: str | Path) -> Scenario:
    """Load ``preset:NAME`` or a YAML/JSON file."""
    ref = str(ref)
    if ref.startswith(PRESET_PREFIX):
        name = ref[len(PRESET_PREFIX) :]
        if name not in _preset_names():
            import difflib

            close = difflib.get_close_matches(name, preset_names(), n=1, cutoff=0.75)
            hint = f"did you mean preset:{close[0]}? " if close else ""
            known = ", ".join(preset_names())
            raise InputError(f"unknown preset {name!r} ({hint}known: {known})", source=ref)
        return _preset(name)
    path = Path(ref)
    return validate_scenario(read_structured_file(path), source=str(path))
