"""Megatron-LM's tensor x data x pipeline layout: who talks to whom, what each rank holds and runs.

Rank order (Megatron-LM, megatron/core/parallel_state.py, ``initialize_model_parallel``: with 16
GPUs, tensor 2 and pipeline 4 it builds tensor groups [g0, g1], [g2, g3], ..., data groups [g0, g2],
[g1, g3], [g4, g6], ... and pipeline groups [g0, g4, g8, g12], ...): tensor-parallel ranks vary
fastest (adjacent GPUs of one node), then data-parallel, then pipeline, so global rank =
tp + t * dp + t * d * pp. This module turns that order into the communicator shapes the collective
model prices, splits the layers into stages and chunks, and gives each rank's share of the model and
its activation memory (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", Table 2 and sec. 4.2.3).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from clustersim.catalog import BYTES_PER_ELEMENT, TransformerArch, model, storage_precision
from clustersim.scenario import Scenario
from clustersim.topologies.cluster import GroupShape
from clustersim.workloads.fp8 import keeps_fp8_inputs, saved_bytes_saved
from clustersim.workloads.layers import Kernel, Layer, Workload
from clustersim.workloads.transformer import with_padded_vocab


@dataclass(frozen=True)
class Chunk:
    """One model chunk (virtual stage ``index`` of p * v): the layers it runs, in order."""

    index: int
    stage: int
    layers: tuple[Layer, ...]
    blocks: int  # transformer blocks among them
    first: bool  # holds the embedding
    last: bool  # holds the LM head


def _neighbours(crossing: int, boundaries: int) -> str:
    """Where neighbouring stages sit, for `run`'s placement line."""
    if crossing == boundaries:
        return "neighbours on different nodes"
    if crossing == 0:
        return "neighbours inside one node"
    return f"neighbours inside one node but at {crossing} of {boundaries} boundaries, which cross nodes"


@dataclass(frozen=True)
class Layout:
    tensor: int
    pipeline: int
    data: int
    virtual: int
    sequence_parallel: bool
    schedule: str
    recompute: bool
    micro_batches: int
    gpus_per_node: int
    arch: TransformerArch
    workload: Workload
    fused_attention: bool = True
    selective: bool = False  # selective recomputation (the core attention only); ``recompute`` is full
    # full recomputation by layer count (Megatron's --recompute-method / --recompute-num-layers, per
    # chunk): None recomputes every block, each checkpointed alone
    recompute_method: str = "uniform"
    recompute_num_layers: int | None = None
    op_selective: bool = False  # TorchTitan's op-level selective checkpointing (recompute: selective_op)

    @classmethod
    def of(cls, scenario: Scenario, workload: Workload) -> "Layout":
        par, c = scenario.training.parallelism, scenario.cluster
        arch = model(scenario.workload.model) if scenario.workload.model else None
        if isinstance(arch, TransformerArch):
            arch = with_padded_vocab(arch, scenario.vocab_multiple)  # as build_workload pads it
        return cls(
            par.tensor,
            par.pipeline,
            c.world_size // (par.tensor * par.pipeline),
            par.virtual_stages,
            par.sequence_parallel and par.tensor > 1,
            par.schedule,
            par.recompute == "full",
            scenario.workload.gradient_accumulation,
            c.gpus_per_node,
            arch,
            workload,
            scenario.workload.attention == "fused",
            selective=par.recompute == "selective",
            recompute_method=par.recompute_method,
            recompute_num_layers=par.recompute_num_layers,
            op_selective=par.recompute == "selective_op",
        )

    # ---- communicators -------------------------------------------------------------------------
    def tensor_group(self) -> GroupShape:
        """t adjacent ranks: inside one node when t <= GPUs per node (gpus_per_node / t such groups
        per node), else t / gpus_per_node whole nodes."""
        t, g = self.tensor, self.gpus_per_node
        if t <= g:
            return GroupShape(1, t, max(1, g // t))
        return GroupShape(-(-t // g), g)

    def data_group(self) -> GroupShape:
        """d ranks at stride t. With t >= GPUs per node each member is on its own node and the node's
        g ranks run g such groups at once (sharing its NICs); else g / t members per node and t groups
        per node. A group that spans part of a node's ranks unevenly is rounded up to whole nodes."""
        return self.data_group_shape(self.tensor, self.data, self.gpus_per_node)

    @staticmethod
    def data_group_shape(t: int, d: int, g: int) -> GroupShape:
        """data_group's shape for t-way tensor and d-way data parallelism on g GPUs per node (also what
        the planner's lower bounds read, before any layout is built)."""
        if t >= g:
            return GroupShape(d, 1, g)
        per_node = g // t
        if d <= per_node:
            return GroupShape(1, d, max(1, g // d))
        return GroupShape(-(-d // per_node), per_node, t)

    def pipeline_pair(self) -> GroupShape:
        """Two neighbouring stages, t * d ranks apart, inside one node (a node holds g / (t * d) whole
        stages when t * d < GPUs per node; stages_pair says which neighbours are apart)."""
        return self.stages_pair(0, 1)

    def stages_pair(self, a: int, b: int) -> GroupShape:
        """The ranks of stages ``a`` and ``b`` that exchange (the same tensor and data rank in each,
        t * d * |a - b| apart): on two nodes, every GPU of a node sending to its peer at once, when the
        two stages sit on different nodes: always when t * d >= GPUs per node, else when they fall in
        different blocks of g / (t * d) stages (Megatron's rank order puts whole stages on a node)."""
        span, g = self.tensor * self.data, self.gpus_per_node
        if span >= g or a // (g // span) != b // (g // span):
            return GroupShape(2, 1, min(g, span))
        return GroupShape(1, 2, max(1, g // 2))

    def crossing_boundaries(self) -> int:
        """How many of the p - 1 stage boundaries cross between nodes."""
        return sum(self.stages_pair(s, s + 1).nodes > 1 for s in range(self.pipeline - 1))

    def describe(self) -> dict:
        """The placement, for ``run``'s output: which global ranks form each group, and where."""
        t, d, p = self.tensor, self.data, self.pipeline

        def where(shape: GroupShape) -> str:
            return "inside one node" if shape.nodes == 1 else f"across {shape.nodes} nodes"

        def ranks(members: list[int]) -> str:
            shown = ", ".join(map(str, members[:4]))
            return f"[{shown}{', ...' if len(members) > 4 else ''}]"

        return {
            "tensor": t,
            "data": d,
            "pipeline": p,
            "virtual_stages": self.virtual,
            "schedule": self.schedule,
            "micro_batches": self.micro_batches,
            "sequence_parallel": self.sequence_parallel,
            "recompute": self.recompute_name,
            "rank_order": "tp + t*dp + t*d*pp (Megatron: tensor fastest, then data, then pipeline)",
            "tensor_group": f"ranks {ranks(list(range(t)))} {where(self.tensor_group())}",
            "data_group": f"ranks {ranks([i * t for i in range(d)])} {where(self.data_group())}",
            "pipeline_group": f"ranks {ranks([i * t * d for i in range(p)])}, "
            + (
                "one stage: no pipeline neighbours"  # p = 1 (ZeRO/FSDP or TP alone) has none to place
                if p == 1
                else _neighbours(self.crossing_boundaries(), p - 1)
            ),
            "layers_per_chunk": self.arch.layers // (p * self.virtual),
        }

    @property
    def recompute_name(self) -> str:
        if self.recompute and self.recompute_num_layers is not None:
            return f"full ({self.recompute_method}, {self.recompute_num_layers} layers)"
        if self.op_selective:
            return "selective_op"
        return "full" if self.recompute else "selective" if self.selective else "none"

    # ---- full recomputation by layer count ------------------------------------------------------
    @property
    def blocks_per_chunk(self) -> int:
        return self.arch.layers // (self.pipeline * self.virtual)

    @property
    def recomputed_per_chunk(self) -> int:
        """Blocks of each chunk whose forward runs again before their backward (Megatron-LM,
        megatron/core/transformer/transformer_block.py ``_checkpointed_forward``, per
        num_layers_per_pipeline_rank, i.e. per virtual chunk): none without full recomputation; with
        method block the first recompute_num_layers; with uniform all of them (the groups of N share
        one checkpoint, but every block inside a group runs again)."""
        if not self.recompute:
            return 0
        n = self.recompute_num_layers
        if n is None or self.recompute_method == "uniform":
            return self.blocks_per_chunk
        return min(n, self.blocks_per_chunk)

    def recomputation(self, layer: Layer) -> str:
        """How ``layer``'s forward runs again before its backward, the one place that decides it (the
        programs' passes, megatron.py ``_pass_times``, and the rank workload the data-parallel programs run,
        ``rank_workload``, both read it through ``recomputed_kernels``): "full" for a block full
        recomputation covers (every block; with recompute_num_layers, the first ``recomputed_per_chunk``
        of its chunk: all of them under method uniform, N under block), "selective" (its core attention)
        or "selective_op" (TorchTitan's op-level policy) for every block under those, "none" for the
        embedding, the head, and blocks left out."""
        if not layer.name.startswith("block"):
            return "none"
        if self.recompute:
            recomputed = int(layer.name[5:]) % self.blocks_per_chunk < self.recomputed_per_chunk
            return "full" if recomputed else "none"
        if self.selective:
            return "selective"
        return "selective_op" if self.op_selective else "none"

    def recomputes(self, layer: Layer) -> bool:
        """Whether full recomputation re-runs block ``layer`` (named block<i> in model order) whole."""
        return self.recomputation(layer) == "full"

    def recomputed_kernels(self, layer: Layer) -> tuple[Kernel, ...]:
        """The kernels of ``layer`` that run again before its backward, on one tensor-parallel rank, as
        ``recomputation`` says: its whole forward (full), the core attention (``recomputed_attention``),
        the op-level policy's ops (``recomputed_ops``), or none."""
        how = self.recomputation(layer)
        if how == "full":
            return self.kernels(layer.forward)
        if how == "selective":
            return self.recomputed_attention(layer)
        return self.recomputed_ops(layer) if how == "selective_op" else ()

    # ---- the model split -----------------------------------------------------------------------
    @cached_property
    def chunks(self) -> tuple[Chunk, ...]:
        """p * v chunks of equal transformer blocks; the embedding joins the first, the head the
        last (Megatron's default split); chunk j runs on stage j mod p (the interleaved order)."""
        layers = self.workload.layers
        embedding, blocks, head = layers[0], layers[1:-1], layers[-1]
        n = self.pipeline * self.virtual
        per = len(blocks) // n
        out = []
        for j in range(n):
            mine = list(blocks[j * per : (j + 1) * per])
            if j == 0:
                mine.insert(0, embedding)
            if j == n - 1:
                mine.append(head)
            out.append(Chunk(j, j % self.pipeline, tuple(mine), per, j == 0, j == n - 1))
        return tuple(out)

    def stage_params(self, stage: int) -> float:
        """Parameters one rank of ``stage`` holds: its chunks' over t. With a tied LM head, the last
        stage keeps its own copy of the word embedding (Megatron's embedding group)."""
        total = sum(layer.params for c in self.chunks if c.stage == stage for layer in c.layers)
        if stage == self.pipeline - 1 and self.pipeline > 1 and self.tied_head:
            total += self.arch.vocab * self.arch.hidden
        return total / self.tensor

    @property
    def tied_head(self) -> bool:
        return self.arch.style == "gpt" and self.arch.tied_head is not False

    @cached_property
    def rank_params(self) -> float:
        """The largest per-rank share (the stage that fills its GPU first)."""
        return max(self.stage_params(s) for s in range(self.pipeline))

    def kernels(self, kernels: tuple[Kernel, ...], backward: bool = False) -> tuple[Kernel, ...]:
        """One tensor-parallel rank's share of a layer's kernels: GEMMs, attention (heads), the
        MLP's activation, embedding and loss are split by t (Shoeybi et al. 2019); the LayerNorm,
        dropout and residual work on the b*s*h hidden states (14 T h elements read or written
        forward, twice that backward, workloads/transformer.py) is replicated on every rank unless
        sequence parallelism splits it too (Korthikanti et al. 2022)."""
        t = self.tensor
        if t == 1:
            return kernels
        w = self.workload
        replicated = 0.0
        if not self.sequence_parallel:
            tokens, d = w.micro_batch * w.seq_len, BYTES_PER_ELEMENT[storage_precision(w.precision)]
            replicated = d * 14 * tokens * self.arch.hidden * (2 if backward else 1)
        out = []
        for k in kernels:
            rep = min(replicated, k.bytes) if k.name == "elementwise" else 0.0
            out.append(replace(k, flops=k.flops / t, bytes=rep + (k.bytes - rep) / t))
        return tuple(out)

    def recomputed_attention(self, layer: Layer) -> tuple[Kernel, ...]:
        """What selective recomputation runs again before a block's backward, on one tensor-parallel
        rank: the core attention's forward (Megatron-LM: ``CoreAttention``/``DotProductAttention``
        under ``tensor_parallel.checkpoint``, megatron/core/transformer/attention.py
        ``_checkpointed_attention_forward``; Korthikanti et al. 2022 sec. 5). That is the QK^T and
        attention-over-V matmuls (4bs^2h FLOPs, the block's attention kernel) and, where the scores are
        written to memory (unfused attention), Megatron's scale-mask-softmax and dropout kernels: each
        reads and writes the b*a*s*s scores once, 4 passes (the unfused count's, transformer.py). A
        fused (flash) kernel is recomputed whole; its own backward recomputes the scores besides, as
        without selective recomputation. No tensor-parallel collective sits inside the core attention,
        so none is repeated. Heads are split by t, so all of it is."""
        hit = self._recomputed.get(layer.name)
        if hit is not None:
            return hit
        t, w = self.tensor, self.workload
        out = tuple(
            replace(k, flops=k.flops / t, bytes=k.bytes / t) for k in layer.forward if k.name == "attention"
        )
        if not self.fused_attention:
            d = BYTES_PER_ELEMENT[storage_precision(w.precision)]
            scores = w.micro_batch * self.arch.heads * w.seq_len**2 / t
            out += (Kernel("elementwise", 0.0, 4 * d * scores, 2),)
        self._recomputed[layer.name] = out  # one tuple per block: the device caches launches by it
        return out

    @cached_property
    def _recomputed(self) -> dict[str, tuple[Kernel, ...]]:
        return {}

    @property
    def op_recomputed_share(self) -> float:
        """The share of a Llama block's matmul FLOPs TorchTitan's op-level policy re-runs: it counts the
        block's aten.mm calls in order (wq, wk, wv in Attention.forward, wo, then w1, w3, w2 in
        FeedForward.forward: w2(silu(w1(x)) * w3(x))) and saves the output of the 1st, 3rd, 5th and 7th
        (torchtitan/parallelisms/parallelize_llama.py ``_save_list`` and ``_custom_policy``: "every second
        mm" is recomputed), so wk (h x kv), wo (h x h) and w3 (h x f) run again."""
        a = self.arch
        h, f = a.hidden, a.ffn
        kv = h * (a.kv_heads or a.heads) // a.heads
        return (h * kv + h * h + h * f) / (2 * h * h + 2 * h * kv + 3 * h * f)

    def recomputed_ops(self, layer: Layer) -> tuple[Kernel, ...]:
        """What op-level selective checkpointing runs again before a block's backward, on one rank: the
        re-run matmuls' share of the block's GEMM group (op_recomputed_share of its FLOPs, bytes and, under
        FP8, of its casts; 3 launches: wk, wo, w3) and every pointwise op of the forward (RMSNorm, rotary
        embedding, SiLU, gating multiply, residual adds: none is in ``_save_list``), which the block's
        elementwise group counts whole. The attention kernel's output is saved, so it is not re-run."""
        hit = self._recomputed.get(layer.name)
        if hit is not None:
            return hit
        share, out = self.op_recomputed_share, []
        for k in self.kernels(layer.forward):
            if k.name == "gemm":
                out.append(replace(k, flops=k.flops * share, bytes=k.bytes * share, launches=3))
            elif k.name == "fp8_cast":
                out.append(replace(k, bytes=k.bytes * share))
            elif k.name != "attention":
                out.append(k)
        self._recomputed[layer.name] = out = tuple(out)
        return out

    def op_kept_bytes(self) -> float:
        """What a block keeps under op-level selective checkpointing, per micro-batch: the checkpoint's
        input (h per token) and the saved outputs: wq's (h), wv's (kv), the attention kernel's (h, and its
        fp32 log-sum-exp, one per head and token), w1's (f) and w2's (h), at the activations' element size
        (a Float8 matmul's output is bf16). The abs/max outputs the policy also saves for Float8's scaling
        are not counted: torchtitan's table shows no memory for them (Table 1: 76.8 GiB with Float8, 77.0
        without)."""
        w, a = self.workload, self.arch
        tokens, h = w.seq_len * w.micro_batch, a.hidden
        kv = h * (a.kv_heads or a.heads) // a.heads
        d = BYTES_PER_ELEMENT[storage_precision(w.precision)]
        return tokens * (d * (4 * h + kv + a.ffn) + 4 * a.heads)

    @property
    def gathers_in_fp8(self) -> bool:
        """FP8 training with sequence parallelism all-gathers a block's activations in FP8: Transformer
        Engine quantizes a linear layer's input before gathering it forward, and its output gradient
        before gathering it backward (transformer_engine/pytorch/module/linear.py, layernorm_linear.py:
        gather_along_first_dim(..., quantizer=...)); torchao's Float8ColwiseParallel casts its input to
        float8 before the gather too. Reduce-scatters and all-reduces stay bf16."""
        return self.workload.precision == "fp8" and self.sequence_parallel

    def tensor_collectives(self, layer: Layer, forward: bool) -> list[tuple[str, int]]:
        """The tensor-parallel collectives of one pass over ``layer``: (op, how many). Megatron's
        per-chunk count (strategies/megatron.py ``_tp_ops``) layer by layer: 2 per block each way
        (attention and MLP outputs forward, their inputs' gradients backward; again in backward under
        full recomputation), 1 for the vocab-parallel embedding's output forward, 1 for the LM head's
        input gradient backward; sequence parallel: an all-gather and a reduce-scatter for each."""
        if self.tensor == 1:
            return []
        if layer.name.startswith("block"):
            n = 2 if forward else 2 * (2 if self.recomputes(layer) else 1)
        elif layer.name == "embedding":
            n = 1 if forward else 0
        else:  # the head
            n = 0 if forward else 1
        if n == 0:
            return []
        if self.sequence_parallel:
            return [("all_gather", n), ("reduce_scatter", n)]
        return [("all_reduce", n)]

    @cached_property
    def rank_workload(self) -> Workload:
        """One tensor-parallel rank's model, for the data-parallel programs that run over a tensor-
        parallel layout without a pipeline (ZeRO/FSDP or ZeRO-Offload beside Megatron's mpu, as
        Megatron-DeepSpeed and FSDP2 + DTensor do): every layer's parameters over t (as
        ``stage_params``), its kernels as ``kernels`` splits them, what recomputation runs again
        (``recomputed_kernels``, as megatron.py ``_pass_times`` prices it) before its backward, and the
        activations this module's memory model keeps (``activation_bytes``), so the sharding layer's ZeRO
        formulas, buckets and gathers apply to params/t unchanged."""
        if self.pipeline != 1:
            raise ValueError("a rank workload stands for the whole model only without a pipeline")
        t, layers = self.tensor, []
        for layer in self.workload.layers:
            fwd, bwd = self.kernels(layer.forward), self.kernels(layer.backward, backward=True)
            is_block = layer.name.startswith("block")
            again = self.recomputed_kernels(layer)
            if again:
                bwd = again + bwd
            activations = self.kept_by(layer) if is_block else layer.activation_bytes / t
            tensors = tuple(p / t for p in layer.param_tensors)
            layers.append(Layer(layer.name, tensors, fwd, bwd, activations))
        peak = self.recompute_group_bytes()
        return replace(self.workload, layers=tuple(layers), recompute_peak_bytes=peak)

    # ---- memory --------------------------------------------------------------------------------
    def block_activation_bytes(self) -> float:
        """Activations one block keeps for backward, per micro-batch, on one rank (Korthikanti et al. 2022,
        Table 2, 16-bit): sbh(10 + 24/t + 5as/(ht)); with sequence parallelism sbh(34/t + 5as/(ht)); with
        selective recomputation the 5as/(ht) term goes; with full recomputation only the block's input, 2sbh
        (2sbh/t sequence-parallel). Scaled by the element size for other precisions; under FP8 training the
        bf16 count less the linear layers' inputs kept as FP8 copies (workloads/fp8.py). The block that is
        recomputed when only some are (recompute_num_layers): ``kept_by`` says which each keeps."""
        return self.checkpoint_block_bytes() if self.recompute else self.kept_block_bytes()

    def checkpoint_block_bytes(self) -> float:
        """What a recomputed block (or a uniform group of them) keeps: its input, 2sbh bytes in 16 bits
        (2sbh/t sequence-parallel; Megatron's checkpoint saves the hidden states it was called with)."""
        w = self.workload
        scale = BYTES_PER_ELEMENT[storage_precision(w.precision)] / 2
        split = self.tensor if self.sequence_parallel else 1
        return 2 * w.seq_len * w.micro_batch * self.arch.hidden / split * scale

    def kept_by(self, layer: Layer) -> float:
        """What block ``layer`` keeps for backward per micro-batch: all its activations when it is not
        recomputed; its input when it is, except that a uniform group of N blocks keeps one input for
        all N (the group's first block holds it, the others nothing)."""
        if not self.recomputes(layer):
            return self.kept_block_bytes()
        n, position = self.recompute_num_layers, int(layer.name[5:]) % self.blocks_per_chunk
        if self.recompute_method == "uniform" and n is not None and position % n:
            return 0.0
        return self.checkpoint_block_bytes()

    def recompute_group_bytes(self) -> float:
        """The extra activations live while a uniform group of N blocks is recomputed before its
        backward: the N blocks' forward re-runs as one and all N blocks' activations are live at once,
        N - 1 blocks' more than the one block that recomputing a single block holds (which the model, as
        for full recomputation, leaves out). Once per rank, not per micro-batch in flight: one backward
        runs at a time."""
        n = self.recompute_num_layers
        if not self.recompute or self.recompute_method != "uniform" or n is None:
            return 0.0
        return (min(n, self.blocks_per_chunk) - 1) * self.kept_block_bytes()

    def kept_block_bytes(self) -> float:
        """A block's activations kept for backward without full recomputation (block_activation_bytes)."""
        return self._kept_block_bytes

    @cached_property
    def _kept_block_bytes(self) -> float:
        """kept_block_bytes, worked out once per layout: activation_bytes asks it of every block."""
        if self.op_selective:
            return self.op_kept_bytes()
        w, a = self.workload, self.arch
        s, b, h, t = w.seq_len, w.micro_batch, a.hidden, self.tensor
        scale = BYTES_PER_ELEMENT[storage_precision(w.precision)] / 2
        # fused attention (FlashAttention) keeps no s^2 scores, nor does selective recomputation
        # (Table 2: sbh(10 + 24/t), sbh*34/t with sequence parallelism)
        attention = 0.0 if self.fused_attention or self.selective else 5 * a.heads * s / (h * t)
        per = 34 / t + attention if self.sequence_parallel else 10 + 24 / t + attention
        kept = s * b * h * per * scale
        if w.precision == "fp8" and keeps_fp8_inputs(w.fp8_recipe):
            kept -= saved_bytes_saved(s * b, h, a.ffn, self.fused_attention, t, self.sequence_parallel)
        return kept

    def in_flight(self, stage: int) -> int:
        """Chunk-micro-batches whose activations ``stage`` holds at its peak: the warm-up forwards
        plus one (Korthikanti et al. 2022 sec. 4.2.3: the first stage of 1F1B holds p micro-batches;
        interleaved, p(1 + (p-1)/(pv)) chunks' worth)."""
        return min(warmup(self, stage) + 1, self.micro_batches * self.virtual)

    @cached_property
    def activation_bytes(self) -> float:
        """The peak over stages of the activations a rank holds."""
        best = 0.0
        for stage in range(self.pipeline):
            chunks = [c for c in self.chunks if c.stage == stage]
            per_chunk = max(
                sum(self.kept_by(x) for x in c.layers if x.name.startswith("block"))
                + sum(x.activation_bytes for x in c.layers if x.name in ("embedding", "head")) / self.tensor
                for c in chunks
            )
            best = max(best, per_chunk * self.in_flight(stage))
        return best + self.recompute_group_bytes()


def warmup(layout: Layout, stage: int) -> int:
    """Forwards a stage runs before its first backward (Megatron-LM schedules.py): p - s - 1 for
    1F1B; 2(p - s - 1) + (v - 1)p for the interleaved schedule (all of them when m == p)."""
    p, m, v = layout.pipeline, layout.micro_batches, layout.virtual
    if v == 1:
        return min(p - stage - 1, m)
    if m == p:
        return m * v
    return min(2 * (p - stage - 1) + (v - 1) * p, m * v)


def schedule(layout: Layout, stage: int) -> list[tuple[bool, int, int]]:
    """The order a stage runs its passes: (forward?, chunk index, micro-batch), as Megatron-LM's
    forward_backward_pipelining_without_interleaving (1F1B) and ..._with_interleaving do."""
    p, m, v = layout.pipeline, layout.micro_batches, layout.virtual
    total = m * v

    def task(k: int, forward: bool) -> tuple[bool, int, int]:
        in_group = k % (p * v)
        c = in_group // p
        if not forward:
            c = v - c - 1
        micro = (k // (p * v)) * p + in_group % p if v > 1 else k
        return forward, c * p + stage, micro

    w = warmup(layout, stage)
    order = [task(k, True) for k in range(w)]
    for k in range(total - w):
        order.append(task(w + k, True))
        order.append(task(k, False))
    order += [task(k, False) for k in range(total - w, total)]
    return order
