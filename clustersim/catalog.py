"""Hardware and model catalogs: small YAML data files inside the package, validated on load.

Adding a GPU or a model means adding an entry to ``catalogs/*.yaml``; no code branches on names.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

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
    dies_per_package: int = Field(
        1, ge=1, le=2, description="devices (ranks) per package: 2 for an MI250X (two GCDs), else 1"
    )
    price_per_gpu_hour: float | None = Field(
        None, gt=0, description="USD per GPU-hour for plan/report (user catalogs; shipped: prices.yaml)"
    )
    asynchronous_launch: bool = Field(
        True,
        description="kernels run while the host dispatches the next ones (GPUs); false for a CPU device, "
        "where the thread that dispatches an op also runs its kernels",
    )

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
    kv_heads: int | None = Field(
        None, gt=0, description="key/value heads (grouped-query attention); default: heads"
    )
    tied_head: bool | None = Field(
        None, description="LM head tied to the word embedding; default: the style's (gpt yes, llama no)"
    )


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
def _shipped_gpus() -> dict[str, GpuSpec]:
    raw = _load_yaml("gpus.yaml")
    return {name: GpuSpec(name=name, **entry) for name, entry in raw.items()}


def gpus() -> dict[str, GpuSpec]:
    """The shipped GPUs, plus (adding or overriding) those of the user catalogs in use."""
    return _overlay(_shipped_gpus(), _USER.get()[0])


def models() -> dict[str, ModelArch]:
    """The shipped models, plus (adding or overriding) those of the user catalogs in use."""
    return _overlay(_shipped_models(), _USER.get()[1])


@lru_cache(maxsize=None)
def _shipped_models() -> dict[str, ModelArch]:
    raw = _load_yaml("models.yaml")
    out: dict[str, ModelArch] = {}
    for name, entry in raw.items():
        cls = TransformerArch if entry.get("family") == "transformer" else ResNetArch
        out[name] = cls(**entry)
    return out


@lru_cache(maxsize=None)
def hardware_defaults() -> dict:
    return _load_yaml("hardware_defaults.yaml")


class ExecutionMode(_Strict):
    """How a step's ops reach the device (catalogs/execution.yaml): host time per launched kernel,
    the device's fixed cost per kernel, and how many of eager's pointwise kernels remain."""

    host_s_per_kernel_forward: float = Field(ge=0)
    host_s_per_kernel_backward: float = Field(ge=0)
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


def eager_kernels(style: str, part: str) -> tuple[int, int]:
    """Kernels an eager PyTorch step launches for one layer, (forward, backward)."""
    fwd, bwd = execution()["kernels"][style][part]
    return int(fwd), int(bwd)


def _lookup(kind: str, name: str, table: dict):
    if name in table:
        return table[name]
    folded = {k.lower(): k for k in table}
    if name.lower() in folded:
        return table[folded[name.lower()]]
    raise InputError(f"unknown {kind} {name!r} (known: {', '.join(sorted(table))})")


def gpu(name: "str | GpuSpec") -> GpuSpec:
    """A catalog GPU by name (case-insensitive), or a scenario's inline GPU spec as it is."""
    if isinstance(name, GpuSpec):
        return name
    return _lookup("GPU", name, gpus())


def model(name: str) -> ModelArch:
    return _lookup("model", name, models())


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
    return None if arch is None else arch.model_dump_json()


def _overlay(shipped: dict, user: dict) -> dict:
    if not user:
        return shipped
    folded = {k.lower(): k for k in user}
    out = {k: v for k, v in shipped.items() if k.lower() not in folded}
    out.update(user)
    return out


def _first_error(exc: ValidationError) -> tuple[str, str]:
    err = exc.errors()[0]
    return ".".join(str(x) for x in err["loc"]), err["msg"]


def read_user_catalog(path: str | Path) -> tuple[dict[str, GpuSpec], dict[str, ModelArch]]:
    """A user catalog file: a mapping of names to GPU entries (gpus.yaml's schema) and/or model entries
    (models.yaml's: an entry with ``family:`` is a model). A bad file or entry is an InputError naming
    the file and the key."""
    src = str(path)
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise InputError(f"cannot read the catalog ({exc.strerror or exc})", source=src) from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise InputError(f"not valid YAML{line}", source=src) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise InputError("expected a mapping of names to GPU or model entries", source=src)
    found_gpus: dict[str, GpuSpec] = {}
    found_models: dict[str, ModelArch] = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict):
            raise InputError("expected a mapping (a GPU or model entry)", source=src, key=str(name))
        try:
            if "family" in entry:
                cls = TransformerArch if entry.get("family") == "transformer" else ResNetArch
                found_models[str(name)] = cls(**entry)
            else:
                fields = {k: v for k, v in entry.items() if k != "name"}
                found_gpus[str(name)] = GpuSpec(name=str(name), **fields)
        except ValidationError as exc:
            loc, msg = _first_error(exc)
            raise InputError(msg, source=src, key=f"{name}.{loc}" if loc else str(name)) from None
        except TypeError as exc:  # a non-string key in the entry
            raise InputError(str(exc), source=src, key=str(name)) from None
    return found_gpus, found_models


@contextmanager
def user_catalogs(paths: Iterable[str | Path] | None) -> Iterator[None]:
    """Use these user catalogs (later files win, over any already in use) inside the block."""
    new_gpus: dict[str, GpuSpec] = {}
    new_models: dict[str, ModelArch] = {}
    for p in paths or ():
        g, m = read_user_catalog(p)
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
