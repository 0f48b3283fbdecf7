"""The scenario schema: what a user writes in a YAML/JSON file, validated once at the edge.

Every model forbids unknown keys, so a typo is an error naming its key path instead of a silently
ignored setting. ``load_scenario`` is the only entry point that reads files; it converts pydantic's
errors into one-line :class:`~clustersim.errors.InputError` messages ``FILE: key.path: reason``.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from clustersim import catalog
from clustersim.catalog import Precision
from clustersim.errors import InputError
from clustersim.identifiers import CollectiveAlgorithm, IntraNodeFabric
from clustersim.io import first_error, load_yaml, read_structured_file
from clustersim.optimizer_options import parse_options

PRESET_PREFIX = "preset:"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IntraNodeSpec(_Strict):
    """How the GPUs of one node talk to each other."""

    fabric: IntraNodeFabric = IntraNodeFabric.NVSWITCH
    pcie_gen: int | None = Field(None, ge=3, le=6, description="default: the GPU's PCIe generation")
    gpus_per_pcie_switch: int = Field(2, gt=0)
    p2p: bool = Field(True, description="PCIe peer-to-peer; false stages GPU-GPU traffic through host memory")
    measured_allreduce_busbw_gbs: float | None = Field(
        None,
        gt=0,
        description="measured intra-node all-reduce bus bandwidth (nccl-tests busbw), overrides the topology",
    )


class NicSpec(_Strict):
    """The node's network interfaces (all identical)."""

    kind: Literal["ethernet_tcp", "infiniband"] = "infiniband"
    count: int = Field(1, ge=0)
    line_rate_gbps: float = Field(200.0, gt=0, description="line rate per NIC, Gb/s")
    effective_gbps: float | None = Field(
        None, gt=0, description="measured throughput per NIC (iperf/perftest), Gb/s"
    )
    latency_us: float | None = Field(None, gt=0, description="one-way message latency; default by kind")
    gpudirect_rdma: bool | None = Field(
        None, description="NIC reads GPU memory directly; default: true for InfiniBand"
    )


class FabricSpec(_Strict):
    """The switch fabric between nodes."""

    kind: Literal["single_switch", "leaf_spine"] = "single_switch"
    nodes_per_leaf: int = Field(16, gt=0)
    oversubscription: float = Field(1.0, ge=1.0, description="leaf downlink:uplink bandwidth ratio")


class HostSpec(_Strict):
    """The host side of a node (CPU optimizer work, staging copies)."""

    sockets: int = Field(2, gt=0)
    cores: int = Field(48, gt=0, description="physical cores per node")
    dram_gbs: float | None = Field(None, gt=0, description="host DRAM bandwidth per node, GB/s")
    memory_gib: float = Field(512.0, gt=0)


class ClusterSpec(_Strict):
    nodes: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    gpu: str
    intra_node: IntraNodeSpec = IntraNodeSpec()
    nic: NicSpec = NicSpec()
    fabric: FabricSpec = FabricSpec()
    host: HostSpec = HostSpec()

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


class LayerSpec(_Strict):
    """One custom layer (per-sample costs), for models that are not in the catalog."""

    name: str
    params: int = Field(ge=0)
    forward_flops: float = Field(ge=0, description="FLOPs per sample")
    forward_bytes: float = Field(0.0, ge=0, description="HBM bytes moved per sample by memory-bound kernels")
    activation_bytes: float = Field(0.0, ge=0, description="activation bytes kept for backward, per sample")
    repeat: int = Field(1, gt=0)


class WorkloadSpec(_Strict):
    model: str | None = None
    layers: list[LayerSpec] | None = None
    micro_batch: int = Field(gt=0)
    seq_len: int | None = Field(None, gt=0)
    precision: Precision = "fp16"
    gradient_accumulation: int = Field(1, gt=0)

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
    subgroup_size: float = Field(1e7, gt=0, description="parameters per subgroup (DeepSpeed sub_group_size)")
    placement: Literal["auto", "cpu", "gpu"] = Field(
        "auto",
        description="interleaved only: auto = the performance model decides; cpu/gpu force every subgroup",
    )
    cpu_threads: int | None = Field(
        None, gt=0, description="host threads per GPU for the CPU optimizer; default cores / GPUs"
    )


class TrainingSpec(_Strict):
    optimizer: str = "adam"
    optimizer_options: dict[str, Any] = Field(default_factory=dict)
    gradient_dtype: Precision | None = Field(
        None, description="dtype of communicated gradients; default: workload precision"
    )
    ddp_bucket_cap_mb: float = Field(25.0, gt=0)
    first_bucket_cap_mb: float = Field(1.0, gt=0)
    overlap: bool = Field(True, description="overlap gradient all-reduce with backward (PyTorch DDP)")
    collective_algorithm: CollectiveAlgorithm = CollectiveAlgorithm.AUTO
    offload: OffloadSpec = OffloadSpec()


class Scenario(_Strict):
    name: str = "scenario"
    description: str = ""
    profile: str | None = Field(None, description="calibration profile: a path or 'builtin:NAME'")
    cluster: ClusterSpec
    workload: WorkloadSpec
    training: TrainingSpec = TrainingSpec()

    def with_changes(self, **dotted: Any) -> "Scenario":
        """A copy with dotted keys replaced, validated again (``{"cluster.nodes": 4}``)."""
        data = self.model_dump()
        for key, value in dotted.items():
            node = data
            parts = key.split(".")
            for part in parts[:-1]:
                node = node[part]
            node[parts[-1]] = value
        return validate_scenario(data, source=f"{self.name} (modified)")

    def with_world_size(self, gpus: int) -> "Scenario":
        """The same cluster shape scaled to ``gpus`` GPUs: fewer GPUs per node if below one node."""
        per_node = self.cluster.gpus_per_node
        if gpus < per_node:
            if per_node % gpus:
                raise InputError(f"{gpus} GPUs do not fit nodes of {per_node} GPUs", key="gpus")
            return self.with_changes(**{"cluster.nodes": 1, "cluster.gpus_per_node": gpus})
        if gpus % per_node:
            raise InputError(f"{gpus} GPUs is not a whole number of {per_node}-GPU nodes", key="gpus")
        return self.with_changes(**{"cluster.nodes": gpus // per_node})


def _check_semantics(s: Scenario) -> None:
    """Cross-field checks that the field types alone cannot express."""
    try:
        gpu = catalog.gpu(s.cluster.gpu)
    except InputError as exc:
        raise exc.located(key_prefix="cluster.gpu") from None
    if s.workload.model is not None:
        try:
            catalog.model(s.workload.model)
        except InputError as exc:
            raise exc.located(key_prefix="workload.model") from None
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
    if (
        intra.fabric == "pcie"
        and c.gpus_per_node > intra.gpus_per_pcie_switch
        and c.gpus_per_node % intra.gpus_per_pcie_switch
    ):
        raise InputError(
            f"{c.gpus_per_node} GPUs do not fill PCIe switches of {intra.gpus_per_pcie_switch}",
            key="cluster.gpus_per_node",
        )
    if c.nodes > 1 and c.nic.count == 0:
        raise InputError("a multi-node cluster needs at least one NIC per node", key="cluster.nic.count")
    if c.nic.effective_gbps is not None and c.nic.effective_gbps > c.nic.line_rate_gbps:
        raise InputError(
            f"effective rate {c.nic.effective_gbps} Gb/s exceeds the line rate {c.nic.line_rate_gbps} Gb/s",
            key="cluster.nic.effective_gbps",
        )
    # Each optimizer has its own options schema (optimizer_options.py, same layer as this one).
    parse_options(s.training.optimizer, s.training.optimizer_options)


def validate_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate already-parsed data; every failure is an InputError naming ``source`` and the key."""
    if not isinstance(data, dict):
        raise InputError("a scenario must be a mapping with keys cluster, workload, training", source=source)
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        key, msg = first_error(exc)
        raise InputError(msg, source=source, key=key) from None
    try:
        _check_semantics(scenario)
    except InputError as exc:
        raise exc.located(source=source) from None
    return scenario


def preset_names() -> list[str]:
    return list(_preset_names())


@lru_cache(maxsize=1)
def _preset_names() -> tuple[str, ...]:
    folder = resources.files("clustersim.catalogs").joinpath("presets")
    return tuple(sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml")))


@lru_cache(maxsize=None)
def _preset(name: str) -> Scenario:
    """Presets are package data: parsed and validated once per process (sweeps and benchmarks load the
    same preset thousands of times). A Scenario is frozen; ``with_changes`` returns a new one."""
    text = resources.files("clustersim.catalogs").joinpath("presets").joinpath(f"{name}.yaml").read_text()
    return validate_scenario(load_yaml(text), source=f"{PRESET_PREFIX}{name}")


def load_scenario(ref: str | Path) -> Scenario:
    """Load ``preset:NAME`` or a YAML/JSON file."""
    ref = str(ref)
    if ref.startswith(PRESET_PREFIX):
        name = ref[len(PRESET_PREFIX) :]
        if name not in _preset_names():
            raise InputError(f"unknown preset {name!r} (known: {', '.join(preset_names())})", source=ref)
        return _preset(name)
    path = Path(ref)
    return validate_scenario(read_structured_file(path), source=str(path))
