"""DiLoCo and Streaming DiLoCo: workers that synchronise rarely, a fragment of the model at a time.

The cluster's nodes form M workers (``workers``, groups of whole nodes). Each worker is a data-parallel
replica: every inner step is an Adam step with a DDP all-reduce inside the worker only. Every H inner
steps (``inner_steps``) each fragment of the model is synchronised across workers: its outer gradient
(the outer copy minus the worker's weights) is averaged over the M workers and applied by an outer
Nesterov-momentum step, from which the workers continue (Douillard et al. 2024, arXiv:2311.08105).
Streaming DiLoCo (Douillard et al. 2025, arXiv:2501.18512) splits the model into P fragments
(``fragments``) synchronised in turn, one every H/P inner steps, lets a fragment's exchange run during
the next tau inner steps (``overlap_steps``) before it is applied, and sends the outer gradients in 4
bits (``bits``). Convergence is outside the simulator: the user supplies the number of steps.

What is simulated. The schedule repeats every K = H/P inner steps (on average, where P does not divide
H), and every period is alike: one fragment (Psi/P parameters) is exchanged. So two programs: a plain
inner step, and a "sync window" holding the fragment's outer gradient, its exchange on its own stream
(``outer``, a separate communicator as DiLoCo implementations use), the tau inner steps it overlaps,
and the outer step, which waits for both (tau = 0: the inner step before a blocking exchange). The
window covers n = max(tau, 1) steps; weighted (K - n)/K and n/K per step, their mean is the time per
inner step. The exchange shares the NICs with the inner steps' all-reduces in the engine; with
``inter_worker_gbps`` the workers are instead joined by their own links (datacenters), priced as a ring
over M workers: 2(M-1)/M of the fragment's bytes through each worker's link plus 2(M-1) latencies.
Without it, the latency between workers (``inter_worker_latency_ms``, 0 by default: one cluster) is
added to the collective the cluster's NICs price, once per ring step.

How the exchange is carried out. Every GPU of a worker holds the whole model, so the worker's n GPUs
split the fragment and each all-reduces its 1/n with its peers in the other workers (M ranks, one per
worker; the g GPUs of a node do so at once and share its NICs). At 16 and 32 bits NCCL sums natively;
at 4 and 8 bits a sum of quantised values needs its own scales, so it is a reduce-scatter by
all-to-all, a dequantise-add-requantise pass, and an all-gather: the bytes of a ring all-reduce at that
width.

Memory: inner Adam state (8 B/parameter) plus the fp32 outer copy and outer momentum (8 B), kept on
the GPU as in the papers' setting (accelerators hold everything), and one fragment's staging buffers.
"""

from __future__ import annotations

from clustersim.cost_models.kernel_bytes import (
    DILOCO_OUTER_GRADIENT_BYTES,
    DILOCO_OUTER_STEP_BYTES,
    DILOCO_REDUCE_ACCUMULATOR_BYTES,
    FUSED_ADAM,
)
from clustersim.errors import InputError
from clustersim.optimizer_options import DiLoCoOptions
from clustersim.simulator.program import Program
from clustersim.simulator.strategies.base import StepProgram, Strategy
from clustersim.simulator.strategies.common import add_collective, add_ddp_gradient_sync, add_update_and_other
from clustersim.topologies.cluster import GroupShape
from clustersim.units import count_of

KEY = "training.optimizer_options"


class DiLoCo(Strategy):
    name = "diloco"
    summary = (
        "DiLoCo / Streaming DiLoCo: M workers, H inner Adam steps, outer sync of P fragments (tau, bits)"
    )
    Options = DiLoCoOptions
    baseline = "adam"
    update_bytes_per_param = FUSED_ADAM
    state_bytes_per_param = 16.0  # inner Adam m, v (8) + fp32 outer copy and outer momentum (8)

    def __init__(self, ctx, options: DiLoCoOptions):
        super().__init__(ctx, options)
        c = ctx.scenario.cluster
        if c.nodes % options.workers:
            raise InputError(
                f"{options.workers} workers need a multiple of {options.workers} nodes (a worker is a group "
                f"of whole nodes); the cluster has {c.nodes}",
                key=f"{KEY}.workers",
            )
        if options.fragments > options.inner_steps:
            raise InputError(
                f"fragments {options.fragments} exceed inner_steps {options.inner_steps} "
                "(each fragment is synchronised once every inner_steps steps, one at a time)",
                key=f"{KEY}.fragments",
            )
        period = options.inner_steps / options.fragments
        if options.overlap_steps > period:
            raise InputError(
                f"overlap_steps {options.overlap_steps} exceeds the {period:g} "
                "inner steps between two fragment synchronisations",
                key=f"{KEY}.overlap_steps",
            )
        if options.outer_release == "during_backward" and options.overlap_steps + 1 > period:
            raise InputError(
                f"outer_release during_backward: the fragment leaves during the backward of the step "
                f"before its {options.overlap_steps} overlapped steps, {options.overlap_steps + 1} steps in "
                f"all, more than the {period:g} inner steps between two fragment synchronisations",
                key=f"{KEY}.overlap_steps",
            )

    # ---- the shapes ------------------------------------------------------------------------------
    @property
    def worker(self) -> GroupShape:
        """One worker's GPUs: its inner all-reduce group."""
        c = self.ctx.scenario.cluster
        return GroupShape(c.nodes // self.options.workers, c.gpus_per_node)

    @property
    def fragment_params(self) -> float:
        return self.ctx.params / self.options.fragments

    @property
    def period(self) -> float:
        """K = H/P: inner steps between two fragment synchronisations, on average. Where P does not
        divide H (the paper's 1B model: 8 fragments of 3 layers, H = 100) the syncs fall every 12 or 13
        steps; the mean step only needs their rate, P per H steps."""
        return self.options.inner_steps / self.options.fragments

    def fragment_wire_bytes(self) -> float:
        return self.fragment_params * self.options.bits / 8

    # ---- programs ----------------------------------------------------------------------------------
    def _inner_step(self, prog: Program, on_backward=None) -> int:
        """One Adam step with DDP inside the worker (after what the compute stream holds already: streams
        run in order); ``on_backward(layer_index, op_id)`` after each layer's backward. Returns the id of
        its last op."""
        ctx = self.ctx
        comm, _ = add_ddp_gradient_sync(
            prog, ctx, ctx.grad_bytes, ctx.scenario.training.overlap, self.worker, on_backward
        )
        return add_update_and_other(prog, ctx, [*comm, prog.last_on("compute")], self.update_bytes_per_param)

    def _exchange(self, prog: Program, dep: int, params: float | None = None, latency: bool = True) -> int:
        """The outer gradient of ``params`` parameters (default: the fragment) averaged over the workers;
        with ``latency``, the workers' latency after it. Returns the id of its last op."""
        o = self.options
        params = self.fragment_params if params is None else params
        if o.inter_worker_gbps is not None:
            m = o.workers
            nbytes = params * o.bits / 8
            secs = 2 * (m - 1) / m * nbytes / (o.inter_worker_gbps * 1e9 / 8)
            dep = prog.add(
                f"outer all_reduce fragment ({o.bits}b, inter-worker links)",
                "outer",
                secs,
                "communication",
                (dep,),
                meta={"op": "all_reduce", "bytes": nbytes, "ranks": m, "source": "inter_worker_gbps"},
            )
        else:
            dep = self._exchange_on_nics(prog, dep, params)
        return self._latency(prog, dep) if latency else dep

    def _latency(self, prog: Program, dep: int) -> int:
        """The workers' own latency (``inter_worker_latency_ms``, datacenters apart) on the cluster's
        NICs: each of the ring's 2(M-1) steps crosses it once (the all-to-all and all-gather of the
        quantised path likewise M-1 each), on top of the collective the NICs price."""
        o = self.options
        if not o.inter_worker_latency_ms:
            return dep
        m = o.workers
        return prog.add(
            f"outer inter-worker latency ({2 * (m - 1)} x {o.inter_worker_latency_ms:g} ms)",
            "outer",
            2 * (m - 1) * o.inter_worker_latency_ms / 1e3,
            "communication",
            (dep,),
            meta={"source": "inter_worker_latency_ms"},
        )

    def _exchange_on_nics(self, prog: Program, dep: int, params: float) -> int:
        """The exchange over the cluster's own NICs: one rank per worker, the g GPUs of a node at once."""
        ctx, o = self.ctx, self.options
        wire = o.bits / 8
        c = ctx.scenario.cluster
        shape = GroupShape(o.workers, 1, sharing=c.gpus_per_node)
        per_gpu = params / self.worker.ranks  # elements this GPU exchanges
        if o.bits >= 16:
            return add_collective(
                prog,
                ctx,
                f"outer all_reduce fragment ({o.bits}b)",
                "all_reduce",
                per_gpu * wire,
                shape,
                deps=(dep,),
                stream="outer",
            )
        dep = add_collective(
            prog,
            ctx,
            f"outer reduce_scatter fragment ({o.bits}b, all_to_all)",
            "all_to_all",
            per_gpu * wire,
            shape,
            deps=(dep,),
            stream="outer",
        )
        shard = per_gpu / o.workers
        dep = prog.add(
            "outer dequantise + sum + requantise",
            "outer",
            ctx.device.stream_time(shard * (o.workers * wire + wire + DILOCO_REDUCE_ACCUMULATOR_BYTES)),
            "compression",
            (dep,),
        )
        return add_collective(
            prog,
            ctx,
            f"outer all_gather fragment ({o.bits}b)",
            "all_gather",
            per_gpu * wire,
            shape,
            deps=(dep,),
            stream="outer",
        )

    def sync_window(self) -> Program:
        """Outer gradient of one fragment, its exchange beside the tau inner steps it overlaps, the outer
        step after both (the next inner step starts from its result). With tau = 0 the exchange blocks:
        the window is the inner step after which it runs, then the exchange and the outer step. With
        ``outer_release: during_backward`` the window starts one step earlier: the fragment's outer
        gradient leaves layer by layer during that step's backward (``_released_in_backward``)."""
        ctx, o = self.ctx, self.options
        prog = Program()
        wire = o.bits / 8
        if o.outer_release == "during_backward":
            exchanged, last = self._released_in_backward(prog)
        else:
            last = self._inner_step(prog) if o.overlap_steps == 0 else None
            start = prog.add(
                "outer gradient + quantise (fragment)",
                "compute",
                ctx.device.stream_time(
                    self.fragment_params * (DILOCO_OUTER_GRADIENT_BYTES + wire), "diloco_outer"
                ),
                "compression",
                (last,),
            )
            exchanged = self._exchange(prog, start)
            last = start
        for _ in range(o.overlap_steps):
            last = self._inner_step(prog)
        prog.add(
            "outer Nesterov step + restart (fragment)",
            "compute",
            ctx.device.stream_time(
                self.fragment_params * (wire + DILOCO_OUTER_STEP_BYTES + ctx.grad_bytes), "diloco_outer"
            ),
            "optimizer",
            (exchanged, last),
        )
        return prog

    def _released_in_backward(self, prog: Program) -> tuple[int, int]:
        """The inner step at the end of a fragment's period, with the fragment's outer gradient leaving
        during its backward: after each layer's backward, that layer's share of the fragment (1/P of its
        parameters: the fragments are alike in the schedule, so each is taken as spread over the layers,
        as a strided fragment of every P-th layer nearly is) is formed, quantised and sent on the
        ``outer`` stream, in order behind the earlier shares (one link). The workers' latency is paid
        once, after the last share: the shares stream back to back. Returns the ids of the exchange's
        last op and of the step's last op."""
        ctx, o = self.ctx, self.options
        wire = o.bits / 8
        layers = ctx.workload.layers
        total = sum(layer.params for layer in layers)
        sent: list[int] = []

        def release(li: int, backward: int) -> None:
            share = self.fragment_params * layers[li].params / total
            if share <= 0:
                return
            grad = prog.add(
                f"outer gradient + quantise (layer {li}'s share of the fragment)",
                "compute",
                ctx.device.stream_time(share * (DILOCO_OUTER_GRADIENT_BYTES + wire), "diloco_outer"),
                "compression",
                (backward,),
            )
            sent.append(self._exchange(prog, grad, share, latency=False))

        last = self._inner_step(prog, release)
        return self._latency(prog, sent[-1] if sent else last), last

    @property
    def window_steps(self) -> int:
        """Inner steps the sync window holds: the tau overlapped steps (at least the one the exchange
        follows), and with ``during_backward`` the step whose backward releases the fragment too."""
        o = self.options
        if o.outer_release == "during_backward":
            return o.overlap_steps + 1
        return max(1, o.overlap_steps)

    def steps(self) -> list[StepProgram]:
        k, n = self.period, self.window_steps
        o = self.options
        label = f"sync window ({count_of(o.overlap_steps, 'overlapped inner step')}"
        label += ", released during backward)" if o.outer_release == "during_backward" else ")"
        steps = [StepProgram(label, n / k, self.sync_window(), covers=n)]
        # The plain inner step: the steps outside the window; where every step is in a window (H/P steps
        # each), still simulated with no weight, as the reference the exchange hides behind.
        inner = Program()
        self._inner_step(inner)
        steps.insert(0, StepProgram("inner step", max(0.0, (k - n) / k), inner))
        return steps

    def extra_gpu_memory(self) -> dict[str, float]:
        """The fragment's outer gradient (fp32) and, below 32 bits, its quantised wire copy."""
        bits = self.options.bits
        return {"outer_fragment_buffers": self.fragment_params * (4 + (bits / 8 if bits < 32 else 0))}

    def result_extra(self, per_step: list[dict]) -> tuple[dict, list[str]]:
        """Bandwidth between workers: bytes per inner step (average and within the overlap window) and the
        bandwidth at which the exchange hides behind the overlapped steps (the paper's reporting)."""
        o, k = self.options, self.period
        plain = next(s for s in per_step if s["label"] == "inner step")  # simulated even at no weight
        inner = plain["iteration_time_s"]
        ring = 2 * (o.workers - 1) / o.workers
        per_worker = ring * self.fragment_wire_bytes()  # through each worker's links per fragment
        # The time the overlapped steps leave for moving bytes (with during_backward also the releasing
        # step's backward and what follows it), after the ring's 2(M-1) latencies.
        released = 0.0
        if o.outer_release == "during_backward":
            released = inner - plain["breakdown_s"].get("forward", 0.0)
        window = o.overlap_steps * inner + released - 2 * (o.workers - 1) * o.inter_worker_latency_ms / 1e3
        summary = {
            "workers": o.workers,
            "inner_steps": o.inner_steps,
            "fragments": o.fragments,
            "overlap_steps": o.overlap_steps,
            "bits": o.bits,
            "fragment_params": self.fragment_params,
            "bytes_per_worker_per_inner_step": per_worker / k,
            "inner_step_s": inner,
            "hide_bandwidth_gbps": per_worker * 8 / window / 1e9 if window > 0 else None,
        }
        avg = per_worker * 8 / k / inner / 1e9
        window_steps = o.overlap_steps + (o.outer_release == "during_backward")
        behind = f"the {count_of(o.overlap_steps, 'overlapped step')}" + (
            " and the backward it leaves in" if o.outer_release == "during_backward" else ""
        )
        note = (
            f"diloco: {o.workers} workers of {count_of(self.worker.ranks, 'GPU')}; a fragment of "
            f"{self.fragment_params / 1e6:,.1f}M parameters ({o.bits}b) every {k:g} inner steps: "
            f"{per_worker / 1e9:.3g} GB through each worker's links per fragment"
            + f", {avg:.3g} Gb/s on average"
            + (
                f"; it hides behind {behind} at {summary['hide_bandwidth_gbps']:.3g} Gb/s or more per worker"
                if summary["hide_bandwidth_gbps"]
                else "; it cannot hide: "
                + ("overlap_steps is 0" if not window_steps else "the latencies alone outlast the overlap")
            )
        )
        return {"diloco": summary}, [note]
