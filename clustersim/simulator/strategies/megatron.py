"""Megatron-LM 3D parallelism: the pipeline simulated stage by stage, tensor parallelism inside each
stage, data parallelism across pipelines (Shoeybi et al. 2019; Narayanan et al. SC'21).

One program holds every pipeline stage (``Op.rank`` = stage; all data-parallel replicas and all
tensor-parallel ranks of a stage run the same ops, so one rank stands for each stage). Each stage runs its
passes in Megatron's order (1F1B or interleaved, model_parallel.schedule). A pass is one compute op for its
chunk's layers (kernels split by t) followed by one op for the chunk's tensor-parallel collectives, on the
critical path: per block 2 all-reduces of b*s*h elements forward and 2 backward (sequence parallel: an
all-gather and a reduce-scatter each), plus one for the vocab-parallel embedding forward and one for the LM
head's input backward; full recomputation repeats the forward's in backward, for the blocks it recomputes
(all, or recompute_num_layers of each chunk; selective recomputation, of the core attention alone, none).
The activation (forward) or its gradient (backward) then goes to the next chunk's stage by a send/recv over
the topology; with t > 1 only 1/t of it (Narayanan et al. sec. 4.1, scatter/gather optimisation). The
receiving pass waits for it. After its last backward each stage all-reduces its gradients over the
data-parallel group (after backward, not overlapped: the 2021 Megatron-LM DDP the validation table
measured), the tied word embedding's gradient between the first and last stage, then runs the optimizer
update on its share of the parameters.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import cached_property
from typing import NamedTuple

from clustersim.simulator.context import SimulationContext
from clustersim.simulator.model_parallel import Chunk, schedule
from clustersim.simulator.program import Program, op_budget
from clustersim.simulator.strategies.common import (
    PricedCollective,
    add_collective,
    price_collective,
)
from clustersim.topologies import GroupShape
from clustersim.workloads.fp8 import FP8_BYTES


def _tp_ops(ctx: SimulationContext, chunk: Chunk, forward: bool) -> list[tuple[str, int]]:
    """The tensor-parallel collectives of one pass over ``chunk``: (op, how many)."""
    L = ctx.layout
    if L.tensor == 1:
        return []
    per_block = 2 * chunk.blocks
    if forward:
        n = per_block + (1 if chunk.first else 0)
    else:
        # a recomputed block's forward collectives run again before its backward
        n = per_block + 2 * L.recomputed_per_chunk + (1 if chunk.last else 0)
    if L.sequence_parallel:
        return [("all_gather", n), ("reduce_scatter", n)]
    return [("all_reduce", n)]


def _priced_tp_ops(ctx: SimulationContext, chunk: Chunk, forward: bool, activation: float) -> list:
    """``_tp_ops`` priced on messages of ``activation`` bytes: (name, priced collective). Under FP8
    with sequence parallelism the blocks' all-gathers move FP8 (Layout.gathers_in_fp8), the
    embedding's and the LM head's bf16."""
    L, out = ctx.layout, []
    for coll, count in _tp_ops(ctx, chunk, forward):
        parts = [(coll, count, activation)]
        if coll == "all_gather" and L.gathers_in_fp8:
            edge = (1 if forward and chunk.first else 0) + (1 if not forward and chunk.last else 0)
            fp8 = (coll + " fp8", count - edge, activation * FP8_BYTES / ctx.element_bytes)
            parts = [fp8] + ([(coll, edge, activation)] if edge else [])
        out += [
            (
                f"tp {name} x{n} chunk{chunk.index}",
                price_collective(ctx, coll, nbytes, ctx.tensor_parallel, count=n),
            )
            for name, n, nbytes in parts
            if n
        ]
    return out


def _pass_times(ctx: SimulationContext, chunk: Chunk) -> tuple[float, float]:
    """A chunk's forward and backward on one tensor-parallel rank: its kernels' device time, or the
    host's dispatch of them where that is longer. A pass runs a stack of like blocks, over which the
    host runs ahead of the device (common.add_pass), so max(host, device) is the pass's time; each
    rank launches every kernel of its layers (tensor parallelism splits their work, not their count).
    One op per pass keeps the pipeline's programs as small as before."""
    L = ctx.layout
    fwd = sum(ctx.rank_forward_time(layer) for layer in chunk.layers)
    bwd = sum(ctx.rank_backward_time(layer) for layer in chunk.layers)
    host_fwd = sum(ctx.host_forward_time(layer) for layer in chunk.layers)
    host_bwd = sum(ctx.host_backward_time(layer) for layer in chunk.layers)
    # what recomputation runs again before the blocks' backward, as Layout.recomputation says per layer
    again = [(layer, how) for layer in chunk.layers if (how := L.recomputation(layer)) != "none"]
    if again:
        bwd += sum(
            _again_time(ctx, layer, how, ctx.rank_forward_time, ctx.rank_kernels_time) for layer, how in again
        )
        host_bwd += sum(
            _again_time(ctx, layer, how, ctx.host_forward_time, ctx.host_kernels_time) for layer, how in again
        )
    return max(fwd, host_fwd), max(bwd, host_bwd)


def _again_time(ctx: SimulationContext, layer, how: str, forward_time, kernels_time) -> float:
    """The time of what ``layer`` runs again before its backward (``how``: Layout.recomputation): a
    whole forward as the layer's own forward is priced (``forward_time``, whose launch counts the device
    caches per layer: Layout.recomputed_kernels would build the same kernels anew on every call), else
    the re-run kernels (Layout.recomputed_kernels) at ``kernels_time``."""
    if how == "full":
        return forward_time(layer)
    return kernels_time(ctx.layout.recomputed_kernels(layer))


class PipelinePrices(NamedTuple):
    """What a pipeline program's passes cost under one context: each chunk's (forward, backward) time,
    its passes' tensor-parallel collectives (name, priced) by (chunk, forward), and the priced send
    between neighbouring stages on one node and between stages on two nodes (each None where no
    boundary is of that kind). The program's shape follows from the layout alone."""

    times: dict
    tp: dict
    send: PricedCollective | None
    send_across: PricedCollective | None = None

    def send_between(self, across: bool) -> PricedCollective:
        return self.send_across if across else self.send

    def priced(self, key):
        """The price a repricer's key names: "send", "send_across", or (chunk, forward, i) of tp."""
        if key == "send":
            return self.send
        if key == "send_across":
            return self.send_across
        return self.tp[key[:2]][key[2]][1]

    def same_shape(self, other: "PipelinePrices") -> bool:
        """Whether a program laid out with ``other`` has the same ops as one with these prices."""
        names = {k: [name for name, _ in v] for k, v in self.tp.items()}
        return (
            names == {k: [name for name, _ in v] for k, v in other.tp.items()}
            and (self.send is None) == (other.send is None)
            and (self.send_across is None) == (other.send_across is None)
        )


def pipeline_prices(ctx: SimulationContext) -> PipelinePrices:
    L = ctx.layout
    activation = ctx.workload.micro_batch * ctx.workload.seq_len * L.arch.hidden * ctx.element_bytes
    # Chunks of like layers (every chunk between the embedding's and the head's, in a model of like
    # blocks) have the same pass times, to the last bit (the same terms summed in the same order): each
    # is priced once, by its layers' kernels and recomputation (all _pass_times reads of a layer).
    priced: dict[tuple, tuple[float, float]] = {}
    times = {}
    for c in L.chunks:
        like = tuple((layer.forward, layer.backward, L.recomputation(layer)) for layer in c.layers)
        if like not in priced:
            priced[like] = tuple(map(float, _pass_times(ctx, c)))
        times[c.index] = priced[like]
    # Every pass of a chunk in a direction runs the same collectives, and every send is alike: each
    # is priced once (a 1T-parameter step adds 130k of them).
    tp = {(c.index, f): _priced_tp_ops(ctx, c, f, activation) for c in L.chunks for f in (True, False)}
    # a single chunk sends nothing: no stage to price a link to (a one-node job may have no NIC at all);
    # a send inside a node and one between nodes are priced where a boundary of that kind exists
    kinds = {_crosses(L, j, j + 1) for j in range(len(L.chunks) - 1)}
    nbytes = activation / L.tensor
    inside = GroupShape(1, 2, max(1, L.gpus_per_node // 2))
    apart = GroupShape(2, 1, min(L.gpus_per_node, L.tensor * L.data))
    send = price_collective(ctx, "send_recv", nbytes, inside) if False in kinds else None
    across = price_collective(ctx, "send_recv", nbytes, apart) if True in kinds else None
    return PipelinePrices(times, tp, send, across)


def _crosses(L, j: int, k: int) -> bool:
    """Whether chunk j's stage and chunk k's stage (chunk j runs on stage j mod p) sit on different
    nodes (Layout.stages_pair)."""
    return L.stages_pair(j % L.pipeline, k % L.pipeline).nodes > 1


def model_parallel_program(ctx: SimulationContext, update_bytes_per_param: float, label: str) -> Program:
    L = ctx.layout
    if L.tensor > L.gpus_per_node:
        ctx.notes.append(
            f"tensor-parallel group of {L.tensor} spans nodes: its per-layer all-reduces cross the network "
            "(Megatron-LM allows it; Narayanan et al. SC'21 keep t within a node)"
        )
    if ctx.scenario.training.overlap:
        ctx.notes.append(
            "model parallel: gradients are all-reduced after the last backward (Megatron-LM's 2021 DDP); "
            "training.overlap does not apply"
        )
    kept = _kept.get()
    if kept is not None and repriceable(ctx):
        return _kept_program(kept, ctx, update_bytes_per_param, label)
    prog, tails = _passes(ctx, pipeline_prices(ctx))
    for s in range(L.pipeline):
        _finish_stage(prog, ctx, s, tails[s], update_bytes_per_param, label)
    return prog


def repriceable(ctx: SimulationContext) -> bool:
    """Whether ``simulate`` runs ``ctx`` as one Megatron program on the analytical network, unchanged
    between building and running (no straggler classes, no offload placement search): a program a
    PipelineRepricer may give."""
    s = ctx.scenario
    return (
        ctx.megatron_program
        and ctx.network is None
        and s.training.offload.mode == "none"
        and s.cluster.heterogeneity is None
        and ctx.offload_placement is None
    )


# The pipeline programs model_parallel_program keeps for re-pricing where a caller asks it to
# (reusing_pipelines); None: every program is built.
_kept: ContextVar[dict | None] = ContextVar("kept_pipelines", default=None)
# How many it keeps, the oldest going first, and the most ops they may hold together (a pass op is
# about 0.5 KB: 200,000 ops about 100 MB). A plan's rows that differ only in their NIC are simulated
# close together (the faster NIC's first, its slower twins among the last rows): on the GPT-3 175B plan
# four programs re-price as many twins as keeping every program would.
KEPT_PIPELINES = 4
KEPT_PIPELINE_OPS = 200_000


@contextmanager
def reusing_pipelines(kept: dict) -> Iterator[None]:
    """Within it, model_parallel_program keeps the pipeline programs it builds in ``kept`` (the last
    KEPT_PIPELINES) and gives a scenario that differs from a kept one only in its NIC (its links'
    prices) the kept program re-priced for it (PipelineRepricer.program_for: op for op the program a
    build gives), at a fraction of a build's cost. A program so given is the kept one, changed in place
    by the next re-pricing: only for callers that are done with a simulation's result (its lazily read
    ``ops``) before the next simulation starts, as a sweep's or a plan's rows are (sweeps.run.simulate_row
    keeps numbers, not results)."""
    token = _kept.set(kept)
    try:
        yield
    finally:
        _kept.reset(token)


def _kept_program(kept: dict, ctx: SimulationContext, update_bytes: float, label: str) -> Program:
    """model_parallel_program's program for ``ctx``, re-priced from the one kept for its scenario but
    the NIC where there is one (and of the same shape), else built and kept (reusing_pipelines). The
    key holds everything a program's ops and their order follow from: the scenario without its NIC,
    the profile, the update's bytes and label and the op budget the program was built under."""
    key = (
        ctx.scenario.model_dump_json(exclude={"cluster": {"nic"}}),
        repr(ctx.profile),
        update_bytes,
        label,
        op_budget.get(),
    )
    repricer = kept.pop(key, None)  # put back last: the newest
    prog = repricer.program_for(ctx) if repricer is not None else None
    if prog is None:
        repricer = PipelineRepricer(ctx, update_bytes, label)
        prog = repricer.finish(ctx)
    kept[key] = repricer
    while len(kept) > 1 and (
        len(kept) > KEPT_PIPELINES or sum(len(r.program.ops) for r in kept.values()) > KEPT_PIPELINE_OPS
    ):
        del kept[next(iter(kept))]
    return prog


def _passes(ctx: SimulationContext, prices: PipelinePrices) -> tuple[Program, list[int | None]]:
    """Every stage's passes (forward and backward of each micro-batch and chunk, their tensor-parallel
    collectives and sends) in the schedule's order, and each stage's last op, which its finish
    (_finish_stage) follows."""
    L = ctx.layout
    prog = Program()
    times, tp = prices.times, prices.tp
    n = len(L.chunks)
    orders = [schedule(L, s) for s in range(L.pipeline)]
    sent: dict[tuple[bool, int, int], int] = {}
    # each chunk's send forward and back, priced once per chunk (a 1T step has 130k sends)
    send_to = {
        (forward, j): prices.send_between(_crosses(L, j, j + 1 if forward else j - 1))
        for j in range(n)
        for forward in (True, False)
        if (j < n - 1 if forward else j > 0)
    }
    tail: list[int | None] = [None] * L.pipeline
    at = [0] * L.pipeline
    left = sum(len(o) for o in orders)
    add_op = prog.add_op
    # Add each stage's passes in its own order, a pass only once what it receives exists (list
    # scheduling over the stages): ids stay topological and each (stage, stream) keeps its order.
    # Collectives and sends are added as add_priced adds them (without meta), its call inlined: a
    # pipeline's passes are most of a plan's ops.
    while left:
        moved = False
        for s, order in enumerate(orders):
            while at[s] < len(order):
                forward, j, micro = order[at[s]]
                need = (True, j - 1, micro) if forward and j > 0 else None
                if not forward and j < n - 1:
                    need = (False, j + 1, micro)
                got = None
                if need is not None:
                    got = sent.get(need)
                    if got is None:
                        break
                last = tail[s]
                deps = (got, last) if last is not None else (got,)
                if got is None:
                    deps = (last,) if last is not None else ()
                op = add_op(
                    f"{'fwd' if forward else 'bwd'} chunk{j} mb{micro}", "compute",
                    times[j][0 if forward else 1], "forward" if forward else "backward", deps,
                    0.0, 0.0, 0.0, {}, {"micro": micro, "chunk": j}, s, None,
                )  # fmt: skip
                # Every pass of a kind shares its collectives' priced metadata (add_priced without
                # meta); the compute op each follows says the micro-batch, as a send's name does.
                for name, priced in tp[(j, forward)]:
                    op = add_op(
                        name, "comm", priced.duration, "communication", (op,), priced.intra_node_bytes,
                        priced.inter_node_bytes, priced.compute_slowdown, dict(priced.demands), priced.meta,
                        s, priced.collective,
                    )  # fmt: skip
                tail[s] = op
                if forward and j < n - 1 or not forward and j > 0:
                    priced = send_to[(forward, j)]
                    sent[(forward, j, micro)] = add_op(
                        f"send {'activation' if forward else 'gradient'} chunk{j} mb{micro}", "comm",
                        priced.duration, "communication", (op,), priced.intra_node_bytes,
                        priced.inter_node_bytes, priced.compute_slowdown, dict(priced.demands), priced.meta,
                        s, priced.collective,
                    )  # fmt: skip
                at[s] += 1
                left -= 1
                moved = True
        if not moved:  # pragma: no cover - Megatron's schedules never deadlock
            raise RuntimeError("pipeline schedule deadlocked while building the program")
    return prog, tail


class PipelineRepricer:
    """A pipeline program built once and re-priced for another context of the same scenario (another
    draw of the uncertain parameters, simulator/uncertainty.py): a draw changes what the passes, the
    collectives and the updates cost, never which ops there are or what each waits for. Each pass op
    takes its price from the new context's PipelinePrices and each stage's finish is added again, so
    the program is op for op the one model_parallel_program builds for that context, at a fraction of
    the cost (a pipeline's passes are most of its ops)."""

    def __init__(self, ctx: SimulationContext, update_bytes_per_param: float, label: str):
        self.prices = pipeline_prices(ctx)
        self.update_bytes, self.label = update_bytes_per_param, label
        self.program, self.tails = _passes(ctx, self.prices)
        self.passes = len(self.program.ops)

    @cached_property
    def groups(self) -> dict:
        """The passes' ops grouped by what prices them, so that a draw looks each price up once, not
        once per op (a 16-stage pipeline has thousands of passes and collectives per draw): ("pass",
        chunk, forward), (chunk, forward, i) of tp, "send" or "send_across" -> ops. Made on first use,
        before any re-pricing (which replaces the collectives' metadata it tells them apart by): a
        program built and run once, never re-priced, is not grouped at all."""
        where = {}
        for key, ops in self.prices.tp.items():
            for i, (_, priced) in enumerate(ops):
                where[id(priced.meta)] = (*key, i)
        if self.prices.send is not None:
            where[id(self.prices.send.meta)] = "send"
        if self.prices.send_across is not None:
            where[id(self.prices.send_across.meta)] = "send_across"
        groups: dict = {}
        for op in self.program.ops[: self.passes]:
            if op.collective is None and op.stream == "compute" and op.category in ("forward", "backward"):
                key = ("pass", op.meta["chunk"], op.category == "forward")
            else:
                key = where[id(op.meta)]
            groups.setdefault(key, []).append(op)
        return groups

    def program_for(self, ctx: SimulationContext) -> Program | None:
        """The program model_parallel_program would build for ``ctx``; None where its shape differs
        (then build it)."""
        prices = pipeline_prices(ctx)
        if not prices.same_shape(self.prices):
            return None
        prog = self.program
        del prog.ops[self.passes :]
        prog.links = {}
        for key, ops in self.groups.items():
            if key[0] == "pass":
                duration = prices.times[key[1]][0 if key[2] else 1]
                for op in ops:
                    op.duration = duration
                continue
            priced = prices.priced(key)
            for op in ops:
                op.duration = priced.duration
                op.intra_node_bytes = priced.intra_node_bytes
                op.inter_node_bytes = priced.inter_node_bytes
                op.compute_slowdown = priced.compute_slowdown
                op.demands = dict(priced.demands)
                op.meta = priced.meta
                op.collective = priced.collective
        return self.finish(ctx)

    def finish(self, ctx: SimulationContext) -> Program:
        """The program with each stage's finish (_finish_stage) for ``ctx`` after its passes."""
        for s in range(ctx.layout.pipeline):
            _finish_stage(self.program, ctx, s, self.tails[s], self.update_bytes, self.label)
        return self.program


def _finish_stage(prog: Program, ctx: SimulationContext, s: int, last, update_bytes: float, label: str):
    """Gradient all-reduce over the data-parallel group, the tied embedding's all-reduce between the
    first and last stage, the update of this stage's parameters, zero_grad and loss scaling."""
    L = ctx.layout
    params = L.stage_params(s)
    distributed = ctx.scenario.training.parallelism.distributed_optimizer and L.data > 1
    if distributed:  # Megatron's distributed optimizer (ZeRO-1): reduce-scatter, update a shard, all-gather
        ends = [
            add_collective(
                prog, ctx, "reduce_scatter gradients (distributed optimizer)", "reduce_scatter",
                params * ctx.grad_bytes, ctx.data_parallel, (last,), rank=s,
            )
        ]  # fmt: skip
    else:
        ends = [
            add_collective(
                prog, ctx, "all_reduce gradients (data parallel)", "all_reduce", params * ctx.grad_bytes,
                ctx.data_parallel, (last,), rank=s,
            )
        ]  # fmt: skip
    if L.pipeline > 1 and L.tied_head and s in (0, L.pipeline - 1):
        embedding = L.arch.vocab * L.arch.hidden / L.tensor * ctx.grad_bytes
        ends.append(
            add_collective(
                prog, ctx, "all_reduce tied embedding (first+last stage)", "all_reduce", embedding,
                L.stages_pair(0, L.pipeline - 1), (ends[0],), rank=s,
            )
        )  # fmt: skip
    update = prog.add(
        label,
        "compute",
        ctx.gpu_update_time(update_bytes, params / (L.data if distributed else 1)),
        "optimizer",
        ends,
        rank=s,
    )
    if distributed:  # every replica gets the updated 16-bit weights of the others' shards
        update = add_collective(
            prog, ctx, "all_gather parameters (distributed optimizer)", "all_gather",
            params * ctx.element_bytes, ctx.data_parallel, (update,), rank=s,
        )  # fmt: skip
    other = params * ctx.grad_bytes  # zero_grad: Megatron zeroes its contiguous gradient buffer
    if ctx.precision == "fp16":  # bf16 runs without a loss scaler (Megatron-LM: grad_scaler is None)
        other += 3 * params * ctx.grad_bytes  # loss-scale unscale (read+write) and overflow check (read)
    prog.add(
        "zero_grad + loss scaling",
        "compute",
        ctx.device.stream_time(other, "other"),
        "other",
        (update,),
        rank=s,
    )
