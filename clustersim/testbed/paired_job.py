"""Paired measurement: every optimizer's steps, the compute calibration and a reference kernel,
interleaved in one job on the same hosts, so every comparison is between neighbours in time.

Run once per emulated host (testbed/sweep.py run_on_hosts). The host's speed drifts (a VM's cores,
other jobs on the machine); a speedup is a ratio of two steps on the same cluster, and two steps
measured one right after the other see the same machine, as the two arms of any paired benchmark do.
So each round runs, per optimizer in turn, one burst of ``--burst`` steps (the order rotated every
round, so no optimizer always follows another), then the compute calibration (the same model trained
locally with Adam, no communication: forward, backward, optimizer) and, for the compressed optimizers,
the calibration microbenchmarks of their kernels at the job's size; a fixed reference kernel is timed
before every burst and at the end of the round. Every optimizer trains its own copy of the same
model (same initial weights) on the same data. ``--steps`` timed steps per optimizer make
``--steps // --burst`` rounds, after ``--warmup`` untimed steps of each.

Rank 0 writes, per round, each optimizer's burst (the slowest rank's time for the whole burst, from a
barrier to its end), the reference kernel's times (median over ranks, point by point), the slowest
rank's local phases and kernels, and per optimizer the slowest rank's per-step phases over all bursts.
"""

from __future__ import annotations

import time

from clustersim.testbed.compressed_job import make_optimizer
from clustersim.testbed.ddp_job import (
    build_model,
    finish,
    leave,
    model_input,
    slowest,
    slowest_ranks,
    slowest_steps,
    start,
)

#: the optimizers this job interleaves -> the compressed_job.py mode (None: Adam under DDP)
MODES = {"adam": None, "onebit-adam": "onebit", "binsgdm": "binsgdm", "zero-one-adam": "zero-one"}
STEP_KEYS = ("step", "forward", "backward", "state_update", "compressed_allreduce", "update", "collectives")
ADAM_KEYS = ("step", "forward", "backward", "optimizer")
LOCAL_KEYS = ("forward", "backward", "optimizer")
# The reference kernel: a fixed amount of CPU work (512 fp32 GEMMs of 128 x 128 x 128, 2.1 GFLOP, about
# 20 ms on one of this machine's cores: 80 ms on a quarter-core host, long beside its 1 ms CFS slices),
# timed on every host; its changes over the run are the machine's
# drift as each host sees it.
REFERENCE_GEMMS, REFERENCE_SIZE = 512, 128


def rotation(names: list[str], round_index: int) -> list[str]:
    """The round's order: the list rotated by the round's index, so each optimizer takes each place."""
    k = round_index % len(names)
    return names[k:] + names[:k]


class _Trainer:
    """One optimizer's copy of the model and a burst of its steps, each step's phases timed."""

    def __init__(self, torch, dist, args, name: str):
        torch.manual_seed(0)  # the same initial weights for every optimizer
        model = build_model(torch, args)
        self.name, self.mode = name, MODES[name]
        if self.mode is None:
            self.model = torch.nn.parallel.DistributedDataParallel(model)
            self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
            self.keys = ADAM_KEYS
        else:
            self.model = model
            self.opt = make_optimizer(torch, dist, self.mode, model.parameters(), args.interval)
            self.keys = STEP_KEYS
        self.times: dict[str, list[float]] = {k: [] for k in self.keys}

    def _update(self) -> tuple:
        if self.mode is None:
            self.opt.step()
            self.opt.zero_grad(set_to_none=False)
            return ()
        self.opt.collectives_s = 0.0
        parts = (*self.opt.step(), self.opt.collectives_s)
        self.opt.grad.zero_()
        return parts

    def steps(self, x, count: int, timed: bool) -> None:
        for _ in range(count):
            t0 = time.perf_counter()
            loss = self.model(x).square().mean()
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            parts = self._update()
            t3 = time.perf_counter()
            if timed:
                for key, value in zip(self.keys, (t3 - t0, t1 - t0, t2 - t1, *(parts or (t3 - t2,)))):
                    self.times[key].append(value)


def _local_step(torch, model, opt, x) -> tuple[float, float, float]:
    """One step of the model with Adam and no communication: forward, backward, optimizer seconds."""
    t0 = time.perf_counter()
    loss = model(x).square().mean()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    opt.step()
    opt.zero_grad(set_to_none=False)
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def _reference(torch, a) -> float:
    t0 = time.perf_counter()
    for _ in range(REFERENCE_GEMMS):
        torch.mm(a, a)
    return time.perf_counter() - t0


def _kernel_bench(torch, elements: int):
    from clustersim.calibration.microbench import Bench

    bench = Bench(torch, "cpu", quick=True)
    bench.sizes = {**bench.sizes, "elements": [elements]}
    bench.repeat = 3  # per round: the rounds are the repetitions
    return bench


def run(torch, dist, args) -> dict:
    names = args.optimizers.split(",")
    x = model_input(torch, args)
    trainers = [_Trainer(torch, dist, args, n) for n in names]
    torch.manual_seed(0)
    local_model = build_model(torch, args)
    local_opt = torch.optim.Adam(local_model.parameters(), lr=1e-4)
    compressed = any(MODES[n] is not None for n in names)
    bench = _kernel_bench(torch, args.elements) if compressed else None
    ref_matrix = torch.randn(REFERENCE_SIZE, REFERENCE_SIZE)
    for tr in trainers:  # warm-up, untimed
        dist.barrier()
        tr.steps(x, args.warmup, timed=False)
    _local_step(torch, local_model, local_opt, x)
    rounds = args.steps // args.burst
    bursts: dict[str, list[float]] = {n: [] for n in names}
    reference: list[list[float]] = []
    local: list[list[float]] = []
    kernels: list[list[float]] = []
    kernel_rows: list[dict] = []
    for r in range(rounds):
        points = []
        for tr in (trainers[names.index(n)] for n in rotation(names, r)):
            points.append(_reference(torch, ref_matrix))
            dist.barrier()
            t0 = time.perf_counter()
            tr.steps(x, args.burst, timed=True)
            bursts[tr.name].append(time.perf_counter() - t0)
        points.append(_reference(torch, ref_matrix))
        reference.append(points)
        dist.barrier()  # the calibration on every host at once, as the jobs run
        two = [_local_step(torch, local_model, local_opt, x) for _ in range(2)]
        local.append([(a + b) / 2 for a, b in zip(*two)])
        if bench is not None:
            dist.barrier()
            kernel_rows = bench.compression_kernels(p=dist.get_world_size())
            kernels.append([k["median_s"] for k in kernel_rows])
        print(f"round {r + 1} of {rounds}", flush=True)
    # every rank's results, gathered once the timing is over: nothing is exchanged between bursts
    # but the barriers
    burst_s = {n: slowest_ranks(torch, dist, bursts[n]) for n in names}
    ref_all = _gather(torch, dist, [v for pts in reference for v in pts])
    width = len(names) + 1
    ref_median = [sorted(col)[len(col) // 2] for col in zip(*ref_all)]
    ref_rounds = [ref_median[i * width : (i + 1) * width] for i in range(rounds)]
    local_s = [slowest_ranks(torch, dist, row) for row in local]
    kernel_s = [slowest_ranks(torch, dist, row) for row in kernels]
    steps = {tr.name: slowest(torch, dist, tr.times, tr.keys) for tr in trainers}
    means = {tr.name: _slowest_means(torch, dist, tr.times, tr.keys) for tr in trainers}
    return {
        "optimizers": names,
        "burst": args.burst,
        "rounds": rounds,
        "interval": args.interval,
        "orders": [rotation(names, r) for r in range(rounds)],
        "burst_s": burst_s,
        "reference_s": ref_rounds,
        "local_s": [dict(zip(LOCAL_KEYS, row)) for row in local_s],
        "kernels": [
            {**{k: v for k, v in row.items() if k not in ("median_s", "p10_s", "p90_s")}, "rounds_s": col}
            for row, col in zip(kernel_rows, zip(*kernel_s))
        ],
        "steps": steps,
        "step_means_s": means,
    }


def _gather(torch, dist, values: list[float]) -> list[list[float]]:
    mine = torch.tensor(values, dtype=torch.float64)
    out = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]


def _slowest_means(torch, dist, times, keys) -> dict:
    """Per key, the mean over steps of the slowest rank's phases (the rank picked step by step, as
    ``slowest`` does): the mean, not the median, as a burst of 0/1 Adam mixes local steps with a sync."""
    chosen = slowest_steps(torch, dist, times, keys)
    return {k: float(chosen[:, i].mean()) for i, k in enumerate(keys)}


def main(argv=None) -> int:
    def extra(ap):
        ap.add_argument("--optimizers", default="adam,onebit-adam,binsgdm,zero-one-adam")
        ap.add_argument("--burst", type=int, default=4, help="steps of one optimizer in a row")
        ap.add_argument("--interval", type=int, default=4, help="0/1 Adam: steps between two syncs")
        ap.add_argument("--elements", type=int, default=1 << 20, help="the kernel microbenchmarks' size")

    args, torch, dist = start(argv, __doc__, ("paired",), extra)
    return finish(args, torch, dist, run(torch, dist, args))


if __name__ == "__main__":
    leave(main())
