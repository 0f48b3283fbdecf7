"""The schema of a raw measurement file (``calibrate run --raw-out``, the torchrun sweep's ``--out``,
a testbed sweep, an nccl-tests import), checked before anything is fitted.

The fits divide by times and sizes and take logarithms, so a record with a zero, negative or missing
time or size used to end in a ZeroDivisionError, a KeyError or a profile of NaNs. Each record kind
names the keys the fits read; a record may carry more (the timing statistics of every measurement).
A collective's group needs two sizes at least, each measured once: one point fixes no slope, and a
size given twice is two answers to one question (the measuring tools write the median of repeats).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from clustersim.catalog import MAX_COUNT, Count, Number, hardware_defaults
from clustersim.errors import InputError
from clustersim.io import first_error, non_finite_at

# A measured time: at least 1 ns (below the resolution of any timer a benchmark uses: perf_counter and
# CUDA events resolve ~0.5 us) and at most 1e6 s (the simulator's limit on one iteration).
Seconds = Annotated[Number, Field(ge=1e-9, le=1e6)]
# Sizes and work: one at least (a byte, a FLOP, a parameter per second) and at most 2**53, the largest
# count exact in floating point (8 PiB, 9e15 FLOPs: beyond any one buffer or GEMM a benchmark times).
Amount = Annotated[Number, Field(ge=1, le=MAX_COUNT)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)


class GemmRecord(_Record):
    precision: str
    m: Count = Field(gt=0)
    n: Count | None = Field(None, gt=0)
    k: Count | None = Field(None, gt=0)
    flops: Amount
    median_s: Seconds


class MemoryRecord(_Record):
    bytes: Amount
    traffic_bytes: Amount
    median_s: Seconds


class KernelRecord(_Record):
    name: str
    elements: Count = Field(gt=0)
    bytes: Amount
    median_s: Seconds


class HostAdamRecord(_Record):
    threads: Count = Field(gt=0)
    params_per_s: Amount


class HostCopyRecord(_Record):
    direction: str
    pinned: StrictBool
    bytes: Amount
    median_s: Seconds


class CollectiveRecord(_Record):
    op: str
    nodes: Count = Field(gt=0)
    gpus_per_node: Count = Field(gt=0)
    # the group's size as the measuring tools write it (nodes x gpus_per_node): kept in the profile, so
    # checked as the count it is (check_raw: equal to that product)
    ranks: Count | None = Field(None, gt=0)
    bytes: Amount
    median_s: Seconds
    # finite, of either sign: files measured before timing.summarize kept its percentiles within the
    # samples can hold a negative P10; the fits read the spread only where it is positive
    p10_s: Number | None = None
    p90_s: Number | None = None


class RawNetwork(_Record):
    """The network a sweep was measured over (the emulated testbed records its NIC and shaped rate):
    the keys of a scenario's ``cluster.nic`` that the network fit reads."""

    kind: Literal["ethernet_tcp", "infiniband"]
    line_rate_gbps: Annotated[Number, Field(gt=0)]


class RawTopology(_Record):
    nodes: Count | None = Field(None, gt=0)
    gpus_per_node: Count | None = Field(None, gt=0)
    network: RawNetwork | None = None


class RawFile(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    backend: str | None = Field(None, pattern="^(nccl|gloo)", description="nccl, nccl-tests or gloo")
    provenance: dict[str, Any] | None = None
    topology: RawTopology | None = None
    gemm: list[GemmRecord] | None = None
    memory: list[MemoryRecord] | None = None
    kernels: list[KernelRecord] | None = None
    host_adam: list[HostAdamRecord] | None = None
    host_copies: list[HostCopyRecord] | None = None
    collectives: list[CollectiveRecord] | None = None
    launch_latency_s: Annotated[Number, Field(ge=0)] | None = None


def _check_topology(topo: RawTopology | None, source: str) -> None:
    """The measured cluster within the physical limits a scenario's is held to (hardware_defaults.yaml)."""
    if topo is None:
        return
    lim = hardware_defaults()["limits"]
    gpus = (topo.nodes or 1) * (topo.gpus_per_node or 1)
    if gpus > lim["cluster_gpus"]:
        raise InputError(
            f"{gpus:,} GPUs is more than any cluster holds ({lim['cluster_gpus']:,})",
            source=source,
            key="topology",
        )
    if topo.network is not None and topo.network.line_rate_gbps > lim["nic_line_rate_gbps"]:
        raise InputError(
            f"{topo.network.line_rate_gbps:,g} Gb/s is beyond any NIC ({lim['nic_line_rate_gbps']:,} Gb/s)",
            source=source,
            key="topology.network.line_rate_gbps",
        )


def _check_testbed(data: dict, source: str) -> None:
    """The emulated testbed the sweep recorded, as the profile will keep it (profile.TestbedRecord):
    refused here, naming the raw file and its key, rather than in the profile written from it."""
    from clustersim.calibration.profile import TestbedRecord
    from clustersim.calibration.provenance import testbed_record

    record = testbed_record(data)
    if record is None:
        return
    try:
        TestbedRecord.model_validate(record)
    except ValidationError as exc:
        key, msg = first_error(exc)
        prov = data.get("provenance")
        where = (
            "provenance.testbed"
            if isinstance(prov, dict) and isinstance(prov.get("testbed"), dict)
            else "topology.network"
        )
        raise InputError(
            msg, source=source, key=where if key == "(top level)" else f"{where}.{key}"
        ) from None


def check_raw(data: dict, source: str) -> None:
    """Refuse a raw file the fits cannot use, naming ``source`` and the record's key."""
    where = non_finite_at(data)  # in a key no schema reads too: the profile keeps the records whole
    if where is not None:
        raise InputError("not a finite number (NaN or Infinity)", source=source, key=where)
    try:
        raw = RawFile.model_validate(data)
    except ValidationError as exc:
        key, msg = first_error(exc)
        raise InputError(msg, source=source, key=key) from None
    for i, r in enumerate(raw.collectives or []):
        if r.ranks is not None and r.ranks != r.nodes * r.gpus_per_node:
            raise InputError(
                f"{r.ranks} ranks, but {r.nodes} nodes x {r.gpus_per_node} GPUs per node are "
                f"{r.nodes * r.gpus_per_node}",
                source=source,
                key=f"collectives.{i}.ranks",
            )
    _check_topology(raw.topology, source)
    _check_testbed(data, source)
    groups: dict[tuple, dict[float, int]] = {}
    for i, r in enumerate(raw.collectives or []):
        sizes = groups.setdefault((r.op, r.nodes, r.gpus_per_node), {})
        if r.bytes in sizes:
            raise InputError(
                f"{r.op} on {r.nodes} x {r.gpus_per_node} at {r.bytes:g} bytes is already measured at "
                f"collectives.{sizes[r.bytes]}: give each size once (the median of its repeats)",
                source=source,
                key=f"collectives.{i}.bytes",
            )
        sizes[r.bytes] = i
    for (op, nodes, per_node), sizes in groups.items():
        if len(sizes) < 2:
            raise InputError(
                f"{op} on {nodes} x {per_node} has one size; a fit needs two sizes at least",
                source=source,
                key=f"collectives.{next(iter(sizes.values()))}",
            )
