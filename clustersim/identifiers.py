"""The names the layers pass to each other, typed: a typo is an error where it is made, not a silent
mismatch three modules away. StrEnum values are the strings used in files, traces and JSON output,
so they print, compare and serialise as before."""

from __future__ import annotations

from enum import StrEnum


class Stream(StrEnum):
    """Where an op runs on the representative rank (CUDA-stream semantics: in order per stream)."""

    COMPUTE = "compute"
    COMM = "comm"
    HOST = "host"
    DISPATCH = "dispatch"  # the host thread that launches the rank's kernels (eager PyTorch's main thread)
    CPU = "cpu"
    COPY = "copy"
    D2H = "d2h"
    H2D = "h2d"
    D2H_STATE = "d2h_state"
    H2D_STATE = "h2d_state"
    OUTER = "outer"  # DiLoCo's outer synchronisation: its own communicator, beside the inner all-reduces
    GATHER = "gather"  # ZeRO-3/FSDP parameter all-gathers: their own stream beside the reductions


class Category(StrEnum):
    """What an op's time is attributed to in the iteration breakdown."""

    FORWARD = "forward"
    BACKWARD = "backward"
    COMPRESSION = "compression"
    OPTIMIZER = "optimizer"
    OTHER = "other"
    COMMUNICATION = "communication"
    HOST = "host"
    TRANSFER = "transfer"


COMPUTE_CATEGORIES = (
    Category.FORWARD,
    Category.BACKWARD,
    Category.COMPRESSION,
    Category.OPTIMIZER,
    Category.OTHER,
)


class CollectiveOp(StrEnum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"
    BROADCAST = "broadcast"
    SEND_RECV = "send_recv"  # point to point between two ranks (pipeline stages)


class Protocol(StrEnum):
    """NCCL's protocols (src/device/prims_*.h); gloo moves data one way, priced as Simple."""

    LL = "LL"
    LL128 = "LL128"
    SIMPLE = "Simple"


class PlacementKind(StrEnum):
    """Where an offloaded subgroup's optimizer update runs (simulator/offload.py)."""

    CPU = "cpu"
    GPU_STREAMED = "gpu_streamed"
    GPU_RESIDENT = "gpu_resident"


class CollectiveAlgorithm(StrEnum):
    """Names a scenario or --algo may ask for; cost_models/collective_algorithms.py registers one
    function per (op, name) and a test keeps the two in step."""

    AUTO = "auto"
    RING = "ring"
    TREE = "tree"
    HD = "hd"
    HIER = "hier"
    BINOMIAL_CONCURRENT = "binomial_concurrent"
    VIA_ALL_REDUCE = "via_all_reduce"


class IntraNodeFabric(StrEnum):
    """How a node's GPUs are joined; topologies/node.py registers one graph builder per fabric."""

    NVSWITCH = "nvswitch"
    NVLINK_MESH = "nvlink_mesh"
    PCIE = "pcie"
    INFINITY_FABRIC = "infinity_fabric"
