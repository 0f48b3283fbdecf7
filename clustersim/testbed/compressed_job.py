"""Training steps with a compressed optimizer over gloo, to check the 1-bit Adam and BinSGDM models.

Run once per emulated host (testbed/sweep.py run_on_hosts), like ddp_job.py and with its models.
Nothing here is DistributedDataParallel: as in DeepSpeed's 1-bit Adam compression stage and in
BinSGDM, backward is local and the optimizer step does the communication.

``--mode onebit``: 1-bit Adam's compression stage (deepspeed/runtime/fp16/onebit/adam.py) on the flat
fp32 momentum of all parameters (one parameter group): momentum update, then DeepSpeed's
``compressed_allreduce`` (runtime/comm/nccl.py) pass by pass with gloo's all_to_all_single and
all_gather in place of NCCL's, then ``m / (sqrt(v_frozen) + eps)`` applied.

``--mode binsgdm``: BinSGDM's step: m and b updates, stochastic 1-bit quantization of m/b, the 1-bit
all-reduce as strategies/binsgdm.py models it for one rank per host (a reduce-scatter by all-to-all of
packed bits and a majority vote, an all-gather of the packed results by all-to-all), unpack and apply.

``--mode zero-one``: 0/1 Adam after its variance freeze (deepspeed/runtime/fp16/onebit/zoadam.py, the
``freeze_key`` branch): every step a local momentum update and a local Adam step with the frozen
variance, accumulated (``lr · update``) in a momentum accumulator; every ``--interval`` steps the
accumulator is synchronised by the same ``compressed_allreduce`` and corrects momentum and weights.
The interval is fixed: DeepSpeed's once its doublings reached ``local_step_clipper``.

``--mode kernels``: every host runs the calibration microbenchmarks of these kernels at the job's
size at the same time (calibration/microbench.py): how fast an emulated host's kernels are while its
neighbours share this machine's cores. The slowest host's time per kernel is recorded.

The step time and the time of the compressed all-reduce (everything between the local optimizer
state update and the final parameter update) are recorded as the slowest rank's, per step.
"""

from __future__ import annotations

import math
import time

from clustersim.calibration.microbench import pack_bits as _pack
from clustersim.calibration.microbench import unpack_bits as _unpack
from clustersim.cost_models.kernel_bytes import padded_elements
from clustersim.testbed.ddp_job import (
    build_model,
    finish,
    leave,
    model_input,
    slowest,
    slowest_ranks,
    start,
    timed_steps,
)


def flatten(torch, params):
    """Parameters and gradients as views of two flat fp32 buffers, as DeepSpeed's FP16 optimizer
    keeps its fp32 master copy: the optimizer then runs whole-buffer passes, as the model counts them."""
    params = list(params)
    flat = torch.cat([q.detach().view(-1) for q in params])
    grad = torch.zeros_like(flat)
    offset = 0
    for q in params:
        k = q.numel()
        q.data = flat[offset : offset + k].view_as(q)
        q.grad = grad[offset : offset + k].view_as(q)
        offset += k
    return flat, grad


class _Timed:
    """The seconds an optimizer spends inside collectives, so the measured compressed all-reduce splits
    into its collectives and its kernels as the model's breakdown does."""

    collectives_s = 0.0

    def collective(self, fn, *args):
        t0 = time.perf_counter()
        fn(*args)
        self.collectives_s += time.perf_counter() - t0


class OneBitAdam(_Timed):
    """1-bit Adam after its warmup: the variance is frozen, the momentum is compressed."""

    def __init__(self, torch, dist, params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        self.t, self.dist = torch, dist
        self.flat, self.grad = flatten(torch, params)
        self.lr, self.beta1, self.eps, self.weight_decay = lr, betas[0], eps, weight_decay
        self.p = dist.get_world_size()
        self.n = self.flat.numel()
        self.size = padded_elements(self.n, self.p)
        self.exp_avg = torch.zeros(self.size)
        self.exp_avg_sq = torch.rand(self.n) * 1e-4 + 1e-6  # frozen after warmup
        self.worker_error = torch.zeros(self.size)
        self.server_error = torch.zeros(self.size // self.p)

    def step(self) -> tuple[float, float, float]:
        """Returns the seconds of the local state update, the compressed all-reduce, and the update."""
        t_start = time.perf_counter()
        m = self.exp_avg[: self.n]
        m.mul_(self.beta1).add_(self.grad, alpha=1 - self.beta1)  # local momentum update
        t0 = time.perf_counter()
        self.compressed_allreduce(self.exp_avg)
        t1 = time.perf_counter()
        # DeepSpeed's update with the frozen variance, weight decay included (kernel_bytes.py counts it)
        update = m / (self.exp_avg_sq.sqrt() + self.eps)
        update += self.weight_decay * self.flat
        self.flat.add_(-self.lr * update)
        return t0 - t_start, t1 - t0, time.perf_counter() - t1

    def compressed_allreduce(self, buffer_m):
        """DeepSpeed's NcclBackend.compressed_allreduce, expression by expression (the passes of
        strategies/compressed_allreduce.py), on gloo."""
        t, dist, p = self.t, self.dist, self.p
        n = buffer_m.numel()
        # worker side: error compensation, scale, error update, sign bits packed
        buffer_m.add_(self.worker_error)
        worker_scale = t.norm(buffer_m) / math.sqrt(n)
        self.worker_error.set_(
            buffer_m - worker_scale * buffer_m.sign().add_(1).bool().float().add_(-0.5).mul_(2.0)
        )
        packed = _pack(t, buffer_m.sign_().add_(1).bool().to(t.uint8))
        # phase 1: every rank sends each rank its chunk of signs (n/8 bytes in all) and its scale
        recv = t.zeros_like(packed)
        self.collective(dist.all_to_all_single, recv, packed)
        scales = [t.zeros(1) for _ in range(p)]
        self.collective(dist.all_gather, scales, worker_scale.view(1))
        # server side: unpack p chunks, scale, average, compensate, compress this rank's chunk
        chunk = (
            _unpack(t, recv)
            .view(p, n // p)
            .float()
            .add_(-0.5)
            .mul_(2.0)
            .mul_(t.stack(scales).view(p, 1) / p)
            .sum(0)
        )
        chunk.add_(self.server_error)
        server_scale = t.norm(chunk) / math.sqrt(n // p)
        self.server_error.set_(
            chunk - server_scale * chunk.sign().add_(1).bool().float().add_(-0.5).mul_(2.0)
        )
        server_packed = _pack(t, chunk.sign_().add_(1).bool().to(t.uint8))
        # phase 2: all-gather of every rank's packed chunk and scale
        gathered = [t.zeros_like(server_packed) for _ in range(p)]
        self.collective(dist.all_gather, gathered, server_packed)
        server_scales = [t.zeros(1) for _ in range(p)]
        self.collective(dist.all_gather, server_scales, server_scale.view(1))
        # finish: unpack, scale, copy back into the momentum
        buffer_m.copy_(
            _unpack(t, t.cat(gathered))
            .view(p, -1)
            .float()
            .add_(-0.5)
            .mul_(2.0)
            .mul_(t.stack(server_scales).view(p, 1))
            .view(-1)
        )


class ZeroOneAdam(OneBitAdam):
    """0/1 Adam after the variance freeze with a fixed local-step interval (zoadam.py's ``freeze_key``
    branch; one parameter group, so its step counter is the optimizer's)."""

    def __init__(self, torch, dist, params, interval: int = 4, **kwargs):
        super().__init__(torch, dist, params, **kwargs)
        self.interval = interval
        self.accumulator = torch.zeros(self.size)  # u in the paper: DeepSpeed's momentum_accumulator
        self.lrs = 0.0  # learning rates summed since the last sync
        self.steps = 0

    def step(self) -> tuple[float, float, float]:
        """Returns the seconds of the local momentum update, the sync (zero on a local step) and the
        local update."""
        t_start = time.perf_counter()
        m, u = self.exp_avg[: self.n], self.accumulator[: self.n]
        m.mul_(self.beta1).add_(self.grad, alpha=1 - self.beta1)
        self.lrs += self.lr
        t0 = time.perf_counter()
        update = m / (self.exp_avg_sq.sqrt() + self.eps)
        update += self.weight_decay * self.flat
        self.flat.add_(-self.lr * update)
        u.add_(-self.lr * update)
        self.steps += 1
        t1 = time.perf_counter()
        if self.steps % self.interval == 0:  # the sync: undo the local steps, apply the averaged ones
            self.flat.add_(-1 * u)
            u.mul_(self.exp_avg_sq.sqrt() + self.eps)
            self.compressed_allreduce(self.accumulator)
            m.zero_().add_(u / self.lrs, alpha=-1)
            self.flat.add_(u / (self.exp_avg_sq.sqrt() + self.eps))
            self.accumulator.zero_()
            self.lrs = 0.0
        return t0 - t_start, time.perf_counter() - t1, t1 - t0


class BinSGDM(_Timed):
    """BinSGDM with one rank per host: the hierarchical scheme's intra-node phases are groups of one."""

    def __init__(self, torch, dist, params, lr=1e-4, beta=0.9):
        self.t, self.dist = torch, dist
        self.flat, self.grad = flatten(torch, params)
        self.lr, self.beta = lr, beta
        self.p = dist.get_world_size()
        self.n = self.flat.numel()
        self.size = -(-self.n // (8 * self.p)) * 8 * self.p  # whole bytes per rank's shard
        self.m = torch.zeros(self.size)
        self.b = torch.full((self.size,), 1e-3)

    def step(self) -> tuple[float, float, float]:
        """Returns the seconds of the m, b update, the quantize + 1-bit all-reduce, and the update."""
        t, dist, p = self.t, self.dist, self.p
        t_start = time.perf_counter()
        m, b = self.m[: self.n], self.b[: self.n]
        m.mul_(self.beta).add_(self.grad, alpha=1 - self.beta)
        b.mul_(self.beta).add_(self.grad.abs(), alpha=1 - self.beta)
        t0 = time.perf_counter()
        plus = t.rand_like(self.m) < (1 + self.m / self.b) / 2  # stochastic 1-bit quantization of m/b
        packed = _pack(t, plus.to(t.uint8))
        # reduce-scatter of the 1-bit votes by all-to-all; each rank counts the votes of its shard
        recv = t.empty_like(packed)
        self.collective(dist.all_to_all_single, recv, packed)
        votes = _unpack(t, recv).view(p, -1).sum(0, dtype=t.int32)
        shard = _pack(t, (votes * 2 > p).to(t.uint8))  # majority, re-binarized
        # all-gather of the 1-bit results by all-to-all: every rank sends its shard to every rank
        result = t.empty(p * shard.numel(), dtype=t.uint8)
        self.collective(dist.all_to_all_single, result, shard.repeat(p))
        t1 = time.perf_counter()
        # the model's "unpack + apply ±1 update" (microbench.py binsgdm_apply times the same expression)
        self.flat.add_(_unpack(t, result)[: self.n].float().mul_(2.0).add_(-1.0), alpha=-self.lr)
        return t0 - t_start, t1 - t0, time.perf_counter() - t1


def _kernels(torch, dist, elements: int) -> dict:
    from clustersim.calibration.microbench import Bench

    bench = Bench(torch, "cpu", quick=True)
    bench.sizes = {**bench.sizes, "elements": [elements]}
    dist.barrier()
    # the compressed optimizers' own kernels only: Adam's update is part of the local job's measured
    # optimizer phase, at the rate the job runs it (a separate Adam microbenchmark on hosts of a quarter
    # core ran 4x slower than the same update inside the job and overrode it)
    rows = bench.compression_kernels(p=dist.get_world_size())
    worst = slowest_ranks(torch, dist, [r["median_s"] for r in rows])
    return {"kernels": [{**r, "median_s": s} for r, s in zip(rows, worst)]}


def make_optimizer(torch, dist, mode: str, params, interval: int = 4):
    """The compressed optimizer of ``mode`` (onebit, zero-one, binsgdm) over ``params``."""
    if mode == "onebit":
        return OneBitAdam(torch, dist, params)
    if mode == "zero-one":
        return ZeroOneAdam(torch, dist, params, interval)
    return BinSGDM(torch, dist, params)


def _train(torch, dist, args) -> dict:
    model = build_model(torch, args)
    x = model_input(torch, args)
    opt = make_optimizer(torch, dist, args.mode, model.parameters(), args.interval)
    keys = ("step", "forward", "backward", "state_update", "compressed_allreduce", "update", "collectives")

    def update() -> tuple:
        opt.collectives_s = 0.0
        parts = (*opt.step(), opt.collectives_s)
        opt.grad.zero_()  # the flat gradient buffer that every parameter's .grad views (as zero_grad)
        return parts

    times = timed_steps(dist, args, model, x, keys, update)
    return {"params": sum(q.numel() for q in model.parameters()), **slowest(torch, dist, times, keys)}


def main(argv=None) -> int:
    def kernel_size(ap):
        ap.add_argument("--elements", type=int, default=1 << 20, help="kernel size for --mode kernels")
        ap.add_argument("--interval", type=int, default=4, help="0/1 Adam: steps between two syncs")

    args, torch, dist = start(argv, __doc__, ("onebit", "zero-one", "binsgdm", "kernels"), kernel_size)
    result = _kernels(torch, dist, args.elements) if args.mode == "kernels" else _train(torch, dist, args)
    return finish(args, torch, dist, result)


if __name__ == "__main__":
    leave(main())
