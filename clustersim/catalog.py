"""Hardware and model catalogs: small YAML data files inside the package, validated on load.

Adding a GPU or a model means adding an entry to ``catalogs/*.yaml``; no code branches on names.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from clustersim.errors import InputError
from clustersim.io import load_yaml

Precision = Literal["fp32", "tf32", "fp16", "bf16", "fp8"]
BYTES_PER_ELEMENT = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NvlinkSpec(_Strict):
    links: int = Field(ge=0)
    gbs_per_link: float = Field(ge=0)


class CudaName(_Strict):
    """How the CUDA runtime names this GPU: a regex on the upper-cased device name, optional memory bounds."""

    pattern: str
    min_memory_gib: float = 0.0
    max_memory_gib: float | None = None  # None: no upper bound


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
    peak_tflops: dict[str, float]
    hbm_gbs: float = Field(gt=0)
    memory_gib: float = Field(gt=0)
    nvlink: NvlinkSpec
    pcie_gen: int = Field(ge=3, le=6)

    def pcie_generation(self, override: int | None) -> int:
        """The host interface generation: the scenario's ``intra_node.pcie_gen`` if set, else the GPU's."""
        return override or self.pcie_gen

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s for a precision; fp32 training uses TF32 tensor cores where present."""
        if precision in self.peak_tflops:
            return self.peak_tflops[precision] * 1e12
        if precision == "bf16" and "fp16" in self.peak_tflops:
            raise InputError(
                f"{self.name} has no bf16 tensor cores (it supports {sorted(self.peak_tflops)})",
                key="workload.precision",
            )
        return self.peak_tflops["fp32"] * 1e12

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_gbs * 1e9

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30


class TransformerArch(_Strict):
    family: Literal["transformer"]
    description: str = ""
    layers: int = Field(gt=0)
    hidden: int = Field(gt=0)
    heads: int = Field(gt=0)
    ffn: int = Field(gt=0)
    vocab: int = Field(gt=0)
    max_positions: int = Field(ge=0)
    token_types: int = 0
    style: Literal["bert", "gpt", "llama"]
    default_seq_len: int = Field(gt=0)


class ResNetArch(_Strict):
    family: Literal["resnet"]
    description: str = ""
    blocks: list[int]
    width: int = Field(gt=0)
    image_size: int = Field(gt=0)
    num_classes: int = Field(gt=0)
    default_seq_len: int = 1


ModelArch = TransformerArch | ResNetArch


def _load_yaml(name: str) -> dict:
    text = resources.files("clustersim.catalogs").joinpath(name).read_text()
    return load_yaml(text)


@lru_cache(maxsize=None)
def gpus() -> dict[str, GpuSpec]:
    raw = _load_yaml("gpus.yaml")
    return {name: GpuSpec(name=name, **entry) for name, entry in raw.items()}


@lru_cache(maxsize=None)
def models() -> dict[str, ModelArch]:
    raw = _load_yaml("models.yaml")
    out: dict[str, ModelArch] = {}
    for name, entry in raw.items():
        cls = TransformerArch if entry.get("family") == "transformer" else ResNetArch
        out[name] = cls(**entry)
    return out


@lru_cache(maxsize=None)
def hardware_defaults() -> dict:
    return _load_yaml("hardware_defaults.yaml")


def _lookup(kind: str, name: str, table: dict):
    if name in table:
        return table[name]
    folded = {k.lower(): k for k in table}
    if name.lower() in folded:
        return table[folded[name.lower()]]
    raise InputError(f"unknown {kind} {name!r} (known: {', '.join(sorted(table))})")


def gpu(name: str) -> GpuSpec:
    return _lookup("GPU", name, gpus())


def model(name: str) -> ModelArch:
    return _lookup("model", name, models())
