"""ZeRO-3's parameter all-gather and ZeRO++'s replacements for it and for the gradient reduction.

ZeRO++ (Wang et al. 2023, arXiv:2306.10209; DeepSpeed zero_quantized_weights,
zero_hpz_partition_size, zero_quantized_gradients):

* qwZ: every parameter all-gather carries int8 weights with one fp32 scale per block
  (partition_parameters.py: ``CUDAQuantizer``, blocks of at most ~8,000 weights; the coordinator passes
  ``quantize=zero_quantized_weights`` to forward and backward fetches alike). Each rank quantizes its
  shard before the all-gather (reads the 16-bit shard, writes int8 + scales) and dequantizes the
  gathered layer after it (reads int8 + scales, writes 16 bits).
* hpZ: the forward gather leaves a secondary copy of the weights partitioned over the node, so the
  backward all-gather runs inside the node (partition_parameters.py ``ds_secondary_tensor``).
* qgZ: a bucket's reduce-scatter becomes coalesced_collectives.py ``all_to_all_quant_reduce``:
  ``swizzle_quant`` to int4 (reads the 16-bit bucket, writes 0.5 B/element), an all-to-all inside the
  node, ``quantized_reduction`` (reads the g received int4 chunks, writes the reduced 1/g in int4), an
  all-to-all across nodes among the ranks with the same local index, then ``dequantize`` and the sum of
  the nodes' chunks (reads int4, writes and reads 16 bits). qgZ's scales (one fp32 per group of
  ``numel / max(rows, cols, world)`` elements) are below 0.1% of the bytes and left out.

Their kernels are memory-bound: ``ctx.device.stream_time`` over the bytes counted above.
"""

from __future__ import annotations

import math

from clustersim.simulator.sharding import (
    QGZ_BYTES,
    QWZ_BYTES,
    QWZ_GROUP,
    SCALE_BYTES,
    Layout,
    hpz_group,
    span_of,
)
from clustersim.simulator.strategies.common import add_collective
from clustersim.topologies.cluster import GroupShape


def qwz_wire_bytes(elements: float) -> float:
    """Bytes one qwZ all-gather moves for ``elements`` weights: int8 values and the block scales."""
    return elements * QWZ_BYTES + math.ceil(elements / QWZ_GROUP) * SCALE_BYTES


def gather_parameters(prog, ctx, lay: Layout, layer, start, forward: bool):
    """All-gather ``layer``'s parameters on the gather stream after ``start``; returns the op the
    layer's compute must wait for (``start`` itself for a layer without parameters)."""
    if layer.params == 0:
        return start
    d = ctx.element_bytes
    zpp = ctx.scenario.training.sharding.zeropp
    group = hpz_group(ctx) if zpp.hierarchical_partition and not forward else lay.group("parameters")
    phase = "fwd" if forward else "bwd"
    if not zpp.quantized_weights:
        return add_collective(
            prog,
            ctx,
            f"all_gather params {phase} {layer.name}",
            "all_gather",
            layer.params * d,
            group,
            deps=(start,),
            stream="gather",
            span=span_of(group),
        )
    scales = math.ceil(layer.params / QWZ_GROUP) * SCALE_BYTES
    shard = layer.params / group.ranks
    quant = prog.add(
        f"qwZ quantize {phase} {layer.name}",
        "gather",
        ctx.device.stream_time(shard * (d + QWZ_BYTES) + scales / group.ranks, "quantize"),
        "compression",
        (start,),
    )
    gathered = add_collective(
        prog,
        ctx,
        f"all_gather int8 params {phase} {layer.name}",
        "all_gather",
        qwz_wire_bytes(layer.params),
        group,
        deps=(quant,),
        stream="gather",
    )
    return prog.add(
        f"qwZ dequantize {phase} {layer.name}",
        "gather",
        ctx.device.stream_time(layer.params * (QWZ_BYTES + d) + scales, "dequantize"),
        "compression",
        (gathered,),
    )


def quantized_gradient_reduce(prog, ctx, bucket, dep, stream: str) -> int:
    """qgZ: one bucket's gradients reduced by int4 all-to-all inside the node, then across nodes."""
    n, gb = bucket.elements, ctx.grad_bytes
    dp = ctx.data_parallel
    g, nodes = dp.gpus_per_node, dp.nodes
    tag = f"{bucket.index}"
    op = prog.add(
        f"qgZ quantize int4 {tag}",
        stream,
        ctx.device.stream_time(n * (gb + QGZ_BYTES), "quantize"),
        "compression",
        (dep,),
    )
    if g > 1:
        op = add_collective(
            prog, ctx, f"all_to_all int4 grads intra {tag}", "all_to_all", n * QGZ_BYTES, GroupShape(1, g),
            deps=(op,), stream=stream, bucket=bucket.index,
        )  # fmt: skip
    op = prog.add(
        f"qgZ reduce + requantize {tag}",
        stream,
        ctx.device.stream_time(n * QGZ_BYTES * (1 + 1 / g), "quantize"),
        "compression",
        (op,),
    )
    if nodes > 1:
        op = add_collective(
            prog, ctx, f"all_to_all int4 grads inter {tag}", "all_to_all", n * QGZ_BYTES / g,
            GroupShape(nodes, 1, sharing=g), deps=(op,), stream=stream, bucket=bucket.index,
        )  # fmt: skip
    return prog.add(
        f"qgZ dequantize + sum {tag}",
        stream,
        ctx.device.stream_time(n / g * (QGZ_BYTES + 2 * gb) + n / (g * nodes) * gb, "dequantize"),
        "compression",
        (op,),
    )
