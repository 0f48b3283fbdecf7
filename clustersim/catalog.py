"""Hardware and model catalogs: small YAML data files inside the package, validated on load.

Adding a GPU or a model means adding an entry to ``catalogs/*.yaml``; no code branches on names.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from clustersim.errors import InputError
from clustersim.io import first_error, load_yaml, read_structured_file, shown_key
from clustersim.units import MAX_COUNT  # the largest count (also every catalog count's bound)

Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
BYTES_PER_ELEMENT = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def storage_precision(precision: str) -> str:
    """The precision training at ``precision`` keeps its parameters, activations and gradients in, and
    runs every kernel but its FP8 GEMMs at. FP8 training (NVIDIA Transformer Engine under Megatron-LM
    and NeMo; torchao's Float8Linear under TorchTitan) casts only the linear layers' GEMM operands to
    FP8; weights, the tensors between layers, attention, normalisation and the optimizer stay bf16
    (workloads/fp8.py)."""
    return "bf16" if precision == "fp8" else precision


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("expected a number, not true/false")
    if isinstance(value, str):  # a quoted "25" is text; 25 and 1e9 reach here as numbers (io.load_yaml)
        raise ValueError(f"expected a number, not the text {value!r}")
    return value


def _whole(value: Any) -> Any:
    """YAML reads ``params: 1.0e+9`` as a float; a whole, finite float is that integer. true/false and
    fractions are refused by StrictInt after this."""
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return value


def _exact(value: int) -> int:
    if value > MAX_COUNT:
        raise ValueError(f"{value:.3g} is more than 2**53 ({MAX_COUNT:.3g}), beyond any count a job holds")
    return value


# Numbers in every input schema (catalog entries, scenarios): finite (allow_inf_nan=False in the
# models), never true/false; integers stay integers (``nodes: true`` is not one node, ``nodes: 2.5`` not
# two; ``nodes: 8.0`` is eight) and at most MAX_COUNT.
Number = Annotated[float, BeforeValidator(_not_bool)]
Count = Annotated[StrictInt, BeforeValidator(_whole), AfterValidator(_exact)]


LIMITS_SOURCE = "limits and their sources: clustersim/catalogs/hardware_defaults.yaml"


def limit(name: str):
    """One physical bound of ``limits`` in hardware_defaults.yaml (each with its source there): the one
    place every rate, size and time an input may carry is bounded."""
    return hardware_defaults()["limits"][name]


def beyond(value: float, name: str, what: str, thing: str = "any real machine") -> str | None:
    """The refusal of ``value`` above ``limits.<name>`` (None when within), one sentence naming the
    bound and where its source is."""
    top = limit(name)
    if value is None or value <= top:
        return None
    return f"{value:,g} is beyond {thing} (at most {top:,g} {what}; {LIMITS_SOURCE})"


def below(value: float, name: str, what: str, scale: float = 1.0) -> str | None:
    """The refusal of ``value`` below ``limits.<name>`` x ``scale`` (None when at or above it)."""
    low = limit(name) * scale
    if value is None or value >= low:
        return None
    return f"{value:,g} is below any real part (at least {low:,g} {what}; {LIMITS_SOURCE})"


def nic_line_rate_at_least(kind: str, gbps: float) -> float:
    """The slowest line rate a NIC of ``kind`` is sold at that carries ``gbps``: for InfiniBand the next
    generation's rate (limits.infiniband_gbps), else (Ethernet, or beyond the fastest generation)
    ``gbps`` itself. What-ifs that raise a NIC's rate (break-even searches) stay on real products."""
    if kind == "infiniband":
        return next((r for r in limit("infiniband_gbps") if r >= gbps), gbps)
    return gbps


def _within(name: str, what: str, minimum: str | None = None):
    """An after-validator refusing a value above ``limits.<name>`` (and below ``limits.<minimum>``)."""

    def check(value):
        why = beyond(value, name, what, "any real GPU") or (minimum and below(value, minimum, what))
        if why:
            raise ValueError(why)
        return value

    return AfterValidator(check)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class NvlinkSpec(_Strict):
    links: Annotated[Count, _within("gpu_nvlink_links", "NVLink links per GPU")] = Field(ge=0)
    gbs_per_link: Annotated[Number, _within("gpu_gbs_per_link", "GB/s per link")] = Field(ge=0)

    @field_validator("gbs_per_link")
    @classmethod
    def _links_carry_bandwidth(cls, value: float, info: ValidationInfo) -> float:
        if value == 0 and info.data.get("links"):
            raise ValueError(f"{info.data['links']} links of 0 GB/s: give their bandwidth, or links: 0")
        return value


class CudaName(_Strict):
    """How the CUDA runtime names this GPU: a regex on the upper-cased device name, optional memory bounds."""

    pattern: str
    min_memory_gib: Number = Field(0.0, ge=0)
    max_memory_gib: Number | None = Field(None, gt=0)  # None: no upper bound

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        import re

        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression ({exc.msg})") from None
        return value


def gpu_for_cuda_name(device_name: str, memory_gib: float) -> str | None:
    """The catalog GPU a CUDA device name denotes (the longest matching pattern), or None."""
    import re

    name = device_name.upper()
    hits = [
        (len(g.cuda_name.pattern), key)
        for key, g in gpus().items()
        if g.cuda_name is not None
        and re.search(g.cuda_name.pattern, name)
        and g.cuda_name.min_memory_gib <= memory_gib
        and (g.cuda_name.max_memory_gib is None or memory_gib < g.cuda_name.max_memory_gib)
    ]
    return max(hits)[1] if hits else None


class GpuSpec(_Strict):
    """One GPU type: the properties the cost models read."""

    name: str = ""
    description: str
    cuda_name: CudaName | None = None
    chip: str = Field(
        description="the silicon (V100, A100, H100, cpu): a profile transfers between form factors of a chip"
    )
    peak_tflops: dict[
        Precision,
        Annotated[
            Number,
            Field(gt=0),
            _within("gpu_peak_tflops", "dense TFLOP/s per GPU", minimum="gpu_peak_tflops_min"),
        ],
    ] = Field(description="dense peak TFLOP/s per precision; fp32 is required (the fallback)")
    hbm_gbs: Annotated[Number, _within("gpu_hbm_gbs", "GB/s of HBM per GPU", minimum="gpu_hbm_gbs_min")] = (
        Field(gt=0)
    )
    memory_gib: Annotated[Number, _within("gpu_memory_gib", "GiB per GPU")] = Field(gt=0)
    nvlink: NvlinkSpec
    pcie_gen: Count = Field(ge=3, le=6)
    dies_per_package: Count = Field(
        1, ge=1, le=2, description="devices (ranks) per package: 2 for an MI250X (two GCDs), else 1"
    )
    nvlink_domain_gpus: Count | None = Field(
        None,
        gt=0,
        description="the most GPUs of this type one NVLink/NVSwitch domain of a built system holds (a node "
        "of more on an NVSwitch is refused); none: only the general limit (hardware_defaults.yaml)",
    )
    price_per_gpu_hour: Annotated[Number | None, _within("price_per_gpu_hour", "USD per GPU-hour")] = Field(
        None, gt=0, description="USD per GPU-hour for plan/report (user catalogs; shipped: prices.yaml)"
    )
    multiprocessors: Annotated[Count | None, _within("gpu_multiprocessors", "multiprocessors per GPU")] = (
        Field(
            None, gt=0, description="streaming multiprocessors; with the clock, the rate of SM-bound kernels"
        )
    )
    boost_clock_mhz: Annotated[Number | None, _within("gpu_boost_clock_mhz", "MHz")] = Field(
        None, gt=0, description="boost clock in MHz (datasheet)"
    )
    # 0.01 at the least: GEMMs slower than 1% of peak are a typo, not a GPU
    matmul_efficiency: dict[Precision, Annotated[Number, Field(ge=0.01, le=1)]] = Field(
        default_factory=dict,
        description="fraction of dense peak (0.01-1) that large GEMMs reach, per precision, where a "
        "published GEMM benchmark measured it on this GPU (else hardware_defaults.yaml's efficiency.matmul)",
    )
    asynchronous_launch: bool = Field(
        True,
        description="kernels run while the host dispatches the next ones (GPUs); false for a CPU device, "
        "where the thread that dispatches an op also runs its kernels",
    )

    @field_validator("peak_tflops")
    @classmethod
    def _has_fp32(cls, value: dict) -> dict:
        if "fp32" not in value:
            raise ValueError("needs an fp32 rate (the rate of precisions the GPU has no tensor cores for)")
        return value

    @field_validator("matmul_efficiency")
    @classmethod
    def _efficiency_of_known_precisions(cls, value: dict, info: ValidationInfo) -> dict:
        peaks = info.data.get("peak_tflops")
        unknown = sorted(set(value) - set(peaks)) if peaks is not None else []
        if unknown:
            raise ValueError(f"given for {', '.join(unknown)}, which peak_tflops does not give")
        return value

    def pcie_generation(self, override: int | None) -> int:
        """The host interface generation: the scenario's ``intra_node.pcie_gen`` if set, else the GPU's."""
        return override or self.pcie_gen

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s for a precision; fp32 training uses TF32 tensor cores where present."""
        if precision in self.peak_tflops:
            return self.peak_tflops[precision] * 1e12
        if precision == "fp8" or (precision == "bf16" and "fp16" in self.peak_tflops):
            # 16- and 8-bit formats the GPU has no units for: no framework falls back to fp32 for them
            raise InputError(
                f"{self.name} has no {precision} tensor cores (it supports {sorted(self.peak_tflops)})",
                key="workload.precision",
            )
        if precision == "tf32" and "fp16" in self.peak_tflops:
            # a tensor-core GPU before Ampere (V100) or without TF32 (MI250X): PyTorch's allow_tf32 is
            # then plain fp32, which is what to simulate
            raise InputError(
                f"{self.name} has no tf32 tensor cores (it supports {sorted(self.peak_tflops)}); "
                "TF32 mode runs fp32 there: give fp32",
                key="workload.precision",
            )
        return self.peak_tflops["fp32"] * 1e12

    @property
    def sm_cycles_per_s(self) -> float | None:
        """SMs x boost clock: what a kernel limited by its multiprocessors (not by HBM) scales with;
        None where the catalog does not give them."""
        if self.multiprocessors is None or self.boost_clock_mhz is None:
            return None
        return self.multiprocessors * self.boost_clock_mhz * 1e6

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gbs * 1e9

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30


def _at_most_blocks(value: int) -> int:
    top = limit("transformer_blocks")
    if value > top:
        raise ValueError(
            f"{value:,} layers: the deepest transformer trained has 1,000 (DeepNet, Wang et al. 2022); "
            f"at most {top:,} are accepted ({LIMITS_SOURCE})"
        )
    return value


class TransformerArch(_Strict):
    """A transformer's shape. Attention splits ``hidden`` into ``heads`` equal heads and groups the heads
    over ``kv_heads`` key/value heads, so each divides the one above it; a default sequence longer than
    a learned position table has no embedding for its last tokens."""

    family: Literal["transformer"]
    description: str = ""
    # at most limits.transformer_blocks, checked before any block is built
    layers: Annotated[Count, AfterValidator(_at_most_blocks)] = Field(gt=0)
    hidden: Count = Field(gt=0)
    heads: Count = Field(gt=0)
    ffn: Count = Field(gt=0)
    vocab: Count = Field(gt=0)
    max_positions: Count = Field(ge=0, description="learned position table (0: none, RoPE)")
    token_types: Count = Field(0, ge=0)
    style: Literal["bert", "gpt", "llama"]
    default_seq_len: Count = Field(gt=0)
    kv_heads: Count | None = Field(
        None, gt=0, description="key/value heads (grouped-query attention); default: heads"
    )
    tied_head: StrictBool | None = Field(
        None, description="LM head tied to the word embedding; default: the style's (gpt yes, llama no)"
    )

    @field_validator("heads")
    @classmethod
    def _heads_divide_hidden(cls, value: int, info: ValidationInfo) -> int:
        hidden = info.data.get("hidden")
        if hidden and hidden % value:
            raise ValueError(f"{value} heads do not divide hidden {hidden} into equal heads")
        return value

    @field_validator("kv_heads")
    @classmethod
    def _kv_heads_divide_heads(cls, value: int | None, info: ValidationInfo) -> int | None:
        heads = info.data.get("heads")
        if value is not None and heads and heads % value:
            raise ValueError(f"{value} key/value heads do not divide the {heads} heads into equal groups")
        return value

    @field_validator("default_seq_len")
    @classmethod
    def _seq_within_positions(cls, value: int, info: ValidationInfo) -> int:
        positions = info.data.get("max_positions")
        if positions and value > positions:
            raise ValueError(f"{value} tokens are more than the {positions} of max_positions")
        return value


class ResNetArch(_Strict):
    """A bottleneck ResNet: blocks per stage; each stage after the first halves the feature map, after
    the stem's stride-2 convolution and max-pool (a quarter of image_size), so the image must keep at
    least one pixel through every stage."""

    family: Literal["resnet"]
    description: str = ""
    # Bounds far beyond any published ResNet, so that a typo is refused by name instead of building a
    # billion layers: the deepest, ResNet-1001 (He et al. 2016, "Identity Mappings"), has 111 blocks
    # per stage; wide ResNets reach a first-stage width of 640; ImageNet-21k has 21,841 classes.
    blocks: list[Annotated[Count, Field(gt=0, le=10_000)]] = Field(min_length=1, max_length=16)
    width: Count = Field(gt=0, le=65_536)
    image_size: Count = Field(gt=0, le=65_536)
    num_classes: Count = Field(gt=0, le=100_000_000)
    default_seq_len: Count = Field(1, gt=0)

    @field_validator("image_size")
    @classmethod
    def _image_survives_the_stages(cls, value: int, info: ValidationInfo) -> int:
        stages = len(info.data.get("blocks") or [])
        need = 4 * 2 ** max(stages - 1, 0)
        if stages and value < need:
            raise ValueError(f"{value} pixels vanish in {stages} stages (at least {need})")
        return value


ModelArch = TransformerArch | ResNetArch
MODEL_FAMILIES: dict[str, type[BaseModel]] = {"transformer": TransformerArch, "resnet": ResNetArch}


def parse_model_entry(entry: Any, source: str | None = None, key: str | None = None) -> ModelArch:
    """A models.yaml entry, validated: every way a model comes in (the shipped catalog, a user catalog,
    an imported config) goes through here. Errors name ``source`` and ``key.<field>``."""
    if not isinstance(entry, dict):
        raise InputError("expected a mapping (a model entry)", source=source, key=key)
    family = entry.get("family")
    if not isinstance(family, str) or family not in MODEL_FAMILIES:
        raise InputError(
            f"unknown model family {family if isinstance(family, str) else type(family).__name__!r} "
            f"(known: {', '.join(MODEL_FAMILIES)})",
            source=source,
            key=f"{key}.family" if key else "family",
        )
    return _validated(MODEL_FAMILIES[family], entry, source, key)


def parse_gpu_entry(name: str, entry: Any, source: str | None = None, key: str | None = None) -> "GpuSpec":
    """A gpus.yaml entry, validated (the shipped catalog, a user catalog; an inline GPU is the same type
    validated inside the scenario). Errors name ``source`` and ``key.<field>``."""
    if not isinstance(entry, dict):
        raise InputError("expected a mapping (a GPU entry)", source=source, key=key)
    fields = {k: v for k, v in entry.items() if k != "name"}
    return _validated(GpuSpec, {**fields, "name": name}, source, key)


def _validated(cls: type[BaseModel], data: dict, source: str | None, key: str | None):
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        loc, msg = first_error(exc)
        full = f"{key}.{loc}" if key and loc != "(top level)" else (key or loc)
        raise InputError(msg, source=source, key=full) from None


def _load_yaml(name: str) -> dict:
    text = resources.files("clustersim.catalogs").joinpath(name).read_text()
    return load_yaml(text)


@lru_cache(maxsize=None)
def _shipped_gpus() -> dict[str, GpuSpec]:
    raw = _load_yaml("gpus.yaml")
    return {name: parse_gpu_entry(name, entry, "catalogs/gpus.yaml", name) for name, entry in raw.items()}


def gpus() -> dict[str, GpuSpec]:
    """The shipped GPUs, plus (adding or overriding) those of the user catalogs in use."""
    return _overlay(_shipped_gpus(), _USER.get()[0])


def user_gpu_names() -> list[str]:
    """The GPUs the user catalogs in use add to the shipped ones (not those they override), in their
    order: `plan`'s built-in grid, every GPU of the catalog, takes them in too."""
    shipped = {k.lower() for k in _shipped_gpus()}
    return [name for name in _USER.get()[0] if name.lower() not in shipped]


def models() -> dict[str, ModelArch]:
    """The shipped models, plus (adding or overriding) those of the user catalogs in use."""
    return _overlay(_shipped_models(), _USER.get()[1])


@lru_cache(maxsize=None)
def _shipped_models() -> dict[str, ModelArch]:
    raw = _load_yaml("models.yaml")
    return {name: parse_model_entry(entry, "catalogs/models.yaml", name) for name, entry in raw.items()}


@lru_cache(maxsize=None)
def hardware_defaults() -> dict:
    return _load_yaml("hardware_defaults.yaml")


@lru_cache(maxsize=None)
def attention_kernels() -> dict:
    """catalogs/attention_kernels.yaml: published rates of fused attention kernels by library."""
    return _load_yaml("attention_kernels.yaml")


def default_attention_kernel(implementation: str | None) -> str:
    """The fused attention library a model's code runs unless the scenario says (attention_kernel)."""
    table = attention_kernels()["default_kernel"]
    return str(table.get((implementation or "").lower(), "cudnn"))


def default_attention_dropout(implementation: str | None, style: str) -> float:
    """The attention dropout a model's code applies unless the scenario says (attention_dropout)."""
    table = attention_kernels()["default_dropout"].get((implementation or "").lower(), {})
    return float(table.get(style, 0.0))


class ExecutionMode(_Strict):
    """How a step's ops reach the device (catalogs/execution.yaml): host time per launched kernel,
    the device's fixed cost per kernel, and how many of eager's pointwise kernels remain."""

    host_s_per_kernel_forward: float = Field(ge=0)
    host_s_per_kernel_backward: float = Field(ge=0)
    #: eager: the autograd engine's host time per op it runs (backward); None: per launch
    host_s_per_op_backward: float | None = Field(None, ge=0)
    host_s_per_param_tensor: float = Field(ge=0)
    device_s_per_kernel: float = Field(ge=0)
    elementwise_kernel_factor: float = Field(gt=0, le=1)


@lru_cache(maxsize=None)
def execution() -> dict:
    """catalogs/execution.yaml: modes, eager kernel counts per layer kind, kernel-class efficiencies."""
    raw = _load_yaml("execution.yaml")
    raw["modes"] = {name: ExecutionMode(**entry) for name, entry in raw["modes"].items()}
    return raw


def execution_mode(name: str) -> ExecutionMode:
    return execution()["modes"][name]


def layout_transposes() -> tuple[int, int]:
    """NCHW<->NHWC transposes per tensor-core convolution, (forward, backward)."""
    t = execution()["layout_transposes"]
    return int(t["forward_per_conv"]), int(t["backward_per_conv"])


def unfused_pointwise(style: str, autocast: bool) -> tuple[tuple[float, float], tuple[float, float]]:
    """Bytes per token of a block's pointwise work in plain PyTorch model code, as ([h, f] forward,
    [h, f] backward) multiples of the hidden and MLP widths (catalogs/execution.yaml)."""
    table = execution()["unfused_pointwise"]["autocast" if autocast else "fp32"][style]
    return tuple(table["forward"]), tuple(table["backward"])


def weight_cast_bytes_per_param() -> float:
    """Bytes an autocast step moves per fp32 weight to cast it (and its gradient back)."""
    return float(execution()["unfused_pointwise"]["weight_cast_bytes_per_param"])


def default_implementation(arch: "ModelArch", model_parallel: bool = False) -> str:
    """The code a catalog model runs unless the scenario says (workload.implementation): Hugging Face's
    transformers, torchvision's CNNs, Megatron-LM under tensor or pipeline parallelism
    (catalogs/execution.yaml implementations)."""
    table = execution()["implementations"]
    if model_parallel:
        return str(table["model_parallel"])
    kind = arch.style if isinstance(arch, TransformerArch) else "resnet"
    return str(table["default"][kind])


def device_s_between_kernels() -> float:
    """The device's idle time between two queued kernels of one stream (catalogs/execution.yaml)."""
    return float(execution()["device_s_between_kernels"])


def backward_ops_per_launch(arch: "ModelArch") -> float:
    """Autograd ops an eager backward of this architecture style runs per launch (catalogs/execution.yaml,
    from the frameworks' traces)."""
    kind = arch.style if isinstance(arch, TransformerArch) else "resnet"
    return float(execution()["backward_ops_per_launch"][kind])


def known_implementations() -> list[str]:
    return [str(x) for x in execution()["implementations"]["known"]]


def eager_kernels(style: str, part: str, framework_code: bool = False) -> tuple[int, int]:
    """Kernels an eager PyTorch step launches for one layer, (forward, backward). ``framework_code``:
    fused-kernel framework code (workload.pointwise: fused; Megatron-LM, DeepSpeed), whose counts are
    the catalog's framework_kernels where it has them."""
    table = execution()["kernels"][style]
    if framework_code:
        table = execution()["framework_kernels"].get(style, table)
    fwd, bwd = table[part]
    return int(fwd), int(bwd)


def _lookup(kind: str, name: str, table: dict):
    if name in table:
        return table[name]
    folded = {k.lower(): k for k in table}
    if name.lower() in folded:
        return table[folded[name.lower()]]

    # a near spelling with the same digits (H100-SMX: H100-SXM; GPT-2-15B, its point dropped: GPT-2-1.5B);
    # never another size (LLaMA-2-7B is not 70B)
    def digits(text: str) -> list[str]:
        return re.findall(r"\d+", text.replace(".", ""))

    close = [
        c
        for c in difflib.get_close_matches(name.lower(), list(folded), n=3, cutoff=0.8)
        if digits(c) == digits(name)
    ]
    hint = f"did you mean {folded[close[0]]}? " if close else ""
    raise InputError(f"unknown {kind} {name!r} ({hint}known: {', '.join(sorted(table))})")


def gpu(name: "str | GpuSpec") -> GpuSpec:
    """A catalog GPU by name (case-insensitive), or a scenario's inline GPU spec as it is."""
    if isinstance(name, GpuSpec):
        return name
    return _lookup("GPU", name, gpus())


def model(name: str) -> ModelArch:
    """A catalog model by name (case-insensitive); ``NAME-<N>L`` is transformer NAME with N layers, the
    name `calibrate model --layers N` stores its measurement under."""
    try:
        return _lookup("model", name, models())
    except InputError as exc:
        shortened = _fewer_layers(name)
        if shortened is None:
            raise InputError(exc.message + OWN_MODEL_HINT.format(name=name)) from None
        if isinstance(shortened, str):  # the cut form of a model that cannot be cut so
            raise InputError(shortened) from None
        return shortened


# How a model that is not in the catalog gets there (a name `calibrate model --hf-config --name` measured
# is only a profile entry until the catalog describes its shape).
OWN_MODEL_HINT = (
    "; a model of your own: clustersim models import config.json --name {name} --out models.yaml, "
    "then pass --catalog models.yaml"
)


# NAME-<N>L: transformer NAME with N layers (ASCII digits, no leading zero), the name under which
# `calibrate model --layers N` stores its measurement
FEWER_LAYERS = re.compile(r"(.+)-([1-9][0-9]*)[lL]")


def check_model_name(name: str, source: str | None = None, key: str | None = None) -> None:
    """Refuse a new model's name of the form NAME-<N>L: that names catalog model NAME cut to N layers."""
    if FEWER_LAYERS.fullmatch(name):
        raise InputError(
            "a model's name may not end in -<N>L: that names another model cut to N layers "
            "(as calibrate model --layers stores it); rename it",
            source=source,
            key=key,
        )


def model_name(name: str) -> str:
    """The catalog's own spelling of a model name given in any case (``bert-large-2l`` ->
    ``BERT-Large-2L``): measurements are stored and found under it."""
    model(name)  # an unknown name is refused here
    folded = {k.lower(): k for k in models()}
    if name.lower() in folded:
        return folded[name.lower()]
    m = FEWER_LAYERS.fullmatch(name)
    return f"{folded[m.group(1).lower()]}-{m.group(2)}L"


def _fewer_layers(name: str) -> "TransformerArch | str | None":
    """NAME-<N>L as NAME cut to N layers; a reason where NAME is a catalog model that cannot be cut so;
    None where the name is not of that form or NAME is unknown."""
    m = FEWER_LAYERS.fullmatch(name)
    if m is None:
        return None
    try:
        base = _lookup("model", m.group(1), models())
    except InputError:
        return None
    layers = int(m.group(2))
    if not isinstance(base, TransformerArch):
        return f"{name}: only a transformer can be cut to fewer layers, and {m.group(1)} is a CNN"
    if layers > base.layers:
        return f"{name}: {m.group(1)} has {base.layers} layers, not {layers}"
    return base.model_copy(update={"layers": layers})


# ---- User catalogs (issue #13): files in the shipped schema that add GPUs/models or override them.

# (gpus, models) of the user catalogs in use. A context variable, not a global: each thread (the sweep's
# in-process Dask workers) enters its own ``user_catalogs`` block.
_USER: ContextVar[tuple[dict, dict]] = ContextVar("clustersim_user_catalogs", default=({}, {}))


class InlineGpuSpec(GpuSpec):
    """A GPU given in the scenario itself (``cluster.gpu`` as a mapping): gpus.yaml's schema plus a name."""

    name: str = Field(min_length=1, description="the GPU's name in outputs")


def chip_of(device: str) -> str:
    """The chip a profile's device name stands for: a catalog device's chip, else the name itself
    (``calibrate run --device cpu`` names its profile by the chip, "cpu")."""
    known = gpus()
    return known[device].chip if device in known else device.lower()


def user_model_definition(name: str) -> str | None:
    """None for a shipped model; for a model a user catalog in use defines, its definition as JSON. A
    cache keyed on the name alone would hand one catalog's model to another (the same name, or an
    imported config's default name, can mean another model)."""
    user = _USER.get()[1]
    if not user:
        return None
    folded = {k.lower(): v for k, v in user.items()}
    arch = folded.get(name.lower())
    cut = FEWER_LAYERS.fullmatch(name) if arch is None else None
    if cut is not None:  # NAME-<N>L of a user model NAME: that model's definition, cut
        base = folded.get(cut.group(1).lower())
        return None if base is None else f"{base.model_dump_json()} cut to {cut.group(2)} layers"
    return None if arch is None else arch.model_dump_json()


def _overlay(shipped: dict, user: dict) -> dict:
    if not user:
        return shipped
    folded = {k.lower(): k for k in user}
    out = {k: v for k, v in shipped.items() if k.lower() not in folded}
    out.update(user)
    return out


def read_user_catalog(path: str | Path) -> tuple[dict[str, GpuSpec], dict[str, ModelArch]]:
    """A user catalog file: a mapping of names to GPU entries (gpus.yaml's schema) and/or model entries
    (models.yaml's: an entry with ``family:`` is a model). Read by the one structured-file reader and
    validated by the same parsers as the shipped catalogs; a bad file or entry is an InputError naming
    the file and the key."""
    src = str(path)
    raw = read_structured_file(Path(path))
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InputError("expected a mapping of names to GPU or model entries", source=src)
    found_gpus: dict[str, GpuSpec] = {}
    found_models: dict[str, ModelArch] = {}
    for name, entry in raw.items():
        if shown_key(name) != str(name):
            raise InputError(
                "an entry's name is not a name (letters, digits and _ . + - / ( ) or spaces, at most 64): "
                "is this a catalog file?",
                source=src,
            )
        if isinstance(entry, dict) and "family" in entry:
            check_model_name(str(name), src, str(name))
            found_models[str(name)] = parse_model_entry(entry, src, str(name))
        else:
            found_gpus[str(name)] = parse_gpu_entry(str(name), entry, src, str(name))
    return found_gpus, found_models


@contextmanager
def user_catalogs(paths: Iterable[str | Path] | None) -> Iterator[None]:
    """Use these user catalogs (later files win, over any already in use) inside the block."""
    new_gpus: dict[str, GpuSpec] = {}
    new_models: dict[str, ModelArch] = {}
    for p in paths or ():
        g, m = read_user_catalog(p)
        if not g and not m:  # given to add entries, it adds none: the wrong file, or one not yet written
            raise InputError(
                "has no GPU or model entries (empty, or only comments?): nothing to add to the catalog",
                source=str(p),
            )
        new_gpus.update(g)
        new_models.update(m)
    with user_entries(new_gpus, new_models):
        yield


@contextmanager
def user_entries(
    gpus: dict[str, GpuSpec] | None = None, models: dict[str, ModelArch] | None = None
) -> Iterator[None]:
    """Use these GPU and model entries (over any already in use) inside the block."""
    gpus_in_use, models_in_use = _USER.get()
    token = _USER.set(({**gpus_in_use, **(gpus or {})}, {**models_in_use, **(models or {})}))
    try:
        yield
    finally:
        _USER.reset(token)
