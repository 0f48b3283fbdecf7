"""BinSGDM (published later as "Birder"): elementwise momentum, 1-bit stochastic updates, no warmup.

Update rule: m = β·m + (1−β)·g, b = β·b + (1−β)·|g|, x −= α·Q(m/b), where Q rounds each element of
m/b ∈ [−1, 1] to +1 with probability (1+v)/2, else −1. What crosses the network is the 1-bit update
Q(m/b) itself; averaging (or voting on) the ±1 updates of all ranks gives the applied update.

The "hierarchical 1-bit all-reduce" is modelled as an explicit list of phases, because the paper
does not spell out its primitives. Each phase names a logical primitive, the group it runs over
(``intra`` = the GPUs of one node, ``inter`` = one GPU per node on each of the node's g rails at
once, ``world``), the bits per element on the wire, and an optional re-quantization of its result.
A reduction of packed bits cannot be summed by NCCL, so a reduce-scatter or all-reduce below 8 bits
is carried out as an all-to-all plus a local sum (same bytes as the ring reduce-scatter).

Default ``hierarchical`` scheme (../shared/reference/algorithms.md sec. 4):
  1. intra-node reduce-scatter of int8 ±1 values (sums of g votes), re-binarized to the sign of the
     node's sum;
  2. inter-node reduce-scatter of the 1-bit shards (all-to-all + vote sum), re-binarized (majority);
  3. inter-node exchange of the 1-bit results (all-to-all, no all-gather primitive);
  4. intra-node all-gather of the 1-bit shards, then unpack and apply.
``flat``: a world-wide 1-bit all-to-all vote (re-binarized) and a world-wide 1-bit all-gather.
"""

from __future__ import annotations

from clustersim.cost_models.kernel_bytes import (
    APPLY_BYTES,
    QUANTIZE_BYTES,
    UPDATE_STATE_BYTES,
)
from clustersim.optimizer_options import BinSGDMOptions, Phase
from clustersim.simulator.program import Program
from clustersim.simulator.strategies.base import StepProgram, Strategy
from clustersim.simulator.strategies.common import add_collective, add_micro_steps, add_update_and_other
from clustersim.topologies.cluster import GroupShape

SCHEMES: dict[str, tuple[Phase, ...]] = {
    "hierarchical": (
        Phase(primitive="reduce_scatter", group="intra", bits=8, requantize_bits=1),
        Phase(primitive="reduce_scatter", group="inter", bits=1, via="all_to_all", requantize_bits=1),
        Phase(primitive="all_gather", group="inter", bits=1, via="all_to_all"),
        Phase(primitive="all_gather", group="intra", bits=1),
    ),
    "flat": (
        Phase(primitive="reduce_scatter", group="world", bits=1, via="all_to_all", requantize_bits=1),
        Phase(primitive="all_gather", group="world", bits=1),
    ),
}


class BinSGDM(Strategy):
    name = "binsgdm"
    summary = "BinSGDM: elementwise m/b, stochastic 1-bit updates, hierarchical 1-bit all-reduce, no warmup"
    Options = BinSGDMOptions
    baseline = "sgdm"
    state_bytes_per_param = 8.0

    @property
    def phases(self) -> tuple[Phase, ...]:
        s = self.options.scheme
        return SCHEMES[s] if isinstance(s, str) else tuple(s)

    def _shape(self, group: str) -> GroupShape:
        c = self.ctx.scenario.cluster
        return {
            "intra": GroupShape(1, c.gpus_per_node),
            "inter": GroupShape(c.nodes, 1, sharing=c.gpus_per_node),
            "world": GroupShape(c.nodes, c.gpus_per_node),
        }[group]

    def add_phases(self, prog: Program, dep) -> int:
        ctx = self.ctx
        elements = float(ctx.params)
        for i, ph in enumerate(self.phases):
            shape = self._shape(ph.group)
            k = shape.ranks
            if k <= 1:
                continue
            wire = ph.bits / 8.0
            label = f"phase{i + 1} {ph.primitive} {ph.group} {ph.bits}b"
            if ph.primitive == "all_gather":
                op, nbytes, after = "all_gather", elements * k * wire, elements * k
            elif ph.primitive == "reduce_scatter":
                op, nbytes, after = "reduce_scatter", elements * wire, elements / k
            elif ph.primitive == "all_reduce":
                op, nbytes, after = "all_reduce", elements * wire, elements
            else:
                op, nbytes, after = "all_to_all", elements * wire, elements
            if ph.via == "all_to_all" or (ph.bits < 8 and op in ("reduce_scatter", "all_reduce")):
                if op == "all_reduce":  # all-to-all vote, then an all-to-all exchange of the results
                    dep = add_collective(
                        prog, ctx, label + " (a2a)", "all_to_all", nbytes, shape, deps=(dep,), phase=i + 1
                    )
                    dep = prog.add(
                        f"phase{i + 1} vote sum",
                        "compute",
                        ctx.device.stream_time(elements * (wire + 1), "binsgdm_vote"),
                        "compression",
                        (dep,),
                    )
                    dep = add_collective(
                        prog,
                        ctx,
                        label + " (a2a back)",
                        "all_to_all",
                        nbytes,
                        shape,
                        deps=(dep,),
                        phase=i + 1,
                    )
                else:
                    a2a_bytes = (
                        nbytes if op != "all_gather" else nbytes / k
                    )  # each rank sends its shard to all
                    dep = add_collective(
                        prog,
                        ctx,
                        label + " via all_to_all",
                        "all_to_all",
                        a2a_bytes * (k if op == "all_gather" else 1),
                        shape,
                        deps=(dep,),
                        phase=i + 1,
                    )
                    if op == "reduce_scatter":
                        dep = prog.add(
                            f"phase{i + 1} vote sum",
                            "compute",
                            ctx.device.stream_time(elements * wire + after, "binsgdm_vote"),
                            "compression",
                            (dep,),
                        )
            else:
                dep = add_collective(prog, ctx, label, op, nbytes, shape, deps=(dep,), phase=i + 1)
            elements = after
            if ph.requantize_bits is not None:
                nbytes_rq = elements * (max(ph.bits, 8) / 8.0 + ph.requantize_bits / 8.0)
                dep = prog.add(
                    f"phase{i + 1} requantize to {ph.requantize_bits}b",
                    "compute",
                    ctx.device.stream_time(nbytes_rq, "binsgdm_requantize"),
                    "compression",
                    (dep,),
                )
        return dep

    def steps(self) -> list[StepProgram]:
        ctx, P = self.ctx, self.ctx.params
        prog = Program()
        last = add_micro_steps(prog, ctx)
        dep = prog.add(
            "m, b update",
            "compute",
            ctx.device.stream_time((UPDATE_STATE_BYTES + ctx.grad_bytes) * P, "binsgdm_update"),
            "optimizer",
            (last,),
        )
        dep = prog.add(
            "stochastic 1-bit quantize",
            "compute",
            ctx.device.stream_time(QUANTIZE_BYTES * P, "binsgdm_quantize"),
            "compression",
            (dep,),
        )
        if ctx.world_size > 1:
            dep = self.add_phases(prog, dep)
        add_update_and_other(
            prog,
            ctx,
            [dep],
            APPLY_BYTES,
            "unpack + apply ±1 update",
            kernel="binsgdm_apply",
        )
        return [StepProgram("step", 1.0, prog)]
