"""A real data-parallel training job to check predictions against: an MLP or a small transformer
under PyTorch DDP or FSDP (ZeRO-3) over gloo.

Run once per emulated host (testbed/sweep.py run_on_hosts). ``--mode ddp`` trains with
DistributedDataParallel (its default 25 MiB buckets, 1 MiB first bucket, overlap with backward) and
Adam, and records the step time (the slowest rank's, per step). ``--mode fsdp`` trains the same model
with Adam under PyTorch FSDP2 (``torch.distributed.fsdp.fully_shard``), one unit per layer (every
Linear, or every encoder layer) and the root, default settings: see ``shard`` for what that does on
CPU over gloo, which is what validate.py's ZeRO-3 scenario describes. ``--mode local`` runs the same model on
every host at the same time without gradient communication, recording forward, backward and
optimizer times: that is how fast each emulated host computes while its neighbours compute too (the
hosts share this machine's cores), i.e. the compute calibration of the testbed's "device".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def add_model_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=512, help="MLP width, or the transformer's d_model")
    ap.add_argument("--batch", type=int, default=256, help="samples per host and step")
    ap.add_argument("--seq", type=int, default=64, help="transformer: tokens per sample")
    ap.add_argument("--heads", type=int, default=4, help="transformer: attention heads")


def build_model(torch, args):
    """``--layers`` × (Linear(width, width), ReLU), or ``--layers`` post-norm transformer encoder layers
    (d_model = width, 4·width feed-forward, no dropout) as torch.nn.TransformerEncoderLayer builds them."""
    if args.model == "transformer":
        layer = torch.nn.TransformerEncoderLayer(
            args.width, args.heads, 4 * args.width, dropout=0.0, batch_first=True
        )
        return torch.nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
    mods = []
    for _ in range(args.layers):
        mods += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods)


def model_input(torch, args):
    if args.model == "transformer":
        return torch.randn(args.batch, args.seq, args.width)
    return torch.randn(args.batch, args.width)


def quantiles(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=10) if len(xs) > 1 else [xs[0]] * 9
    return {"median_s": statistics.median(xs), "p10_s": q[0], "p90_s": q[-1], "samples": len(xs)}


def start(argv, doc: str, modes: tuple[str, ...], extra=None):
    """Parse a job's arguments (the model's, --steps, --warmup, --out, and ``extra(parser)``'s), then
    join the torch.distributed job over gloo with one thread per host and a fixed seed."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--mode", choices=modes, required=True)
    add_model_arguments(ap)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", required=True)
    if extra is not None:
        extra(ap)
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    return args, torch, dist


def slowest_ranks(torch, dist, values: list) -> list:
    """Element by element, the largest of every rank's ``values`` (numbers, or equal-length lists)."""
    mine = torch.tensor(values, dtype=torch.float64)
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    return torch.stack(gathered).max(dim=0).values.tolist()


def slowest(torch, dist, times: dict[str, list[float]], keys) -> dict:
    """Quantiles over steps of the slowest rank's times: per step, every key of the one rank whose
    ``keys[0]`` (the whole step) is the longest (a synchronous step waits for that rank). Its phases
    add up to its step; the largest of each phase over ranks would not, because a rank that finishes
    its kernels early waits inside the next collective for the others, so the longest collective time
    and the longest kernel time belong to different ranks and both overstate what the step spent."""
    chosen = slowest_steps(torch, dist, times, keys)
    return {k: quantiles(chosen[:, i].tolist()) for i, k in enumerate(keys)}


def slowest_steps(torch, dist, times: dict[str, list[float]], keys):
    """Steps x keys: per step, every key of the rank whose whole step (``keys[0]``) was the longest."""
    mine = torch.tensor([times[k] for k in keys], dtype=torch.float64)  # keys x steps
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    ranks = torch.stack(gathered)  # ranks x keys x steps
    worst = ranks[:, 0, :].argmax(dim=0)  # per step, the rank with the longest step
    return ranks[worst, :, torch.arange(ranks.shape[2])]  # steps x keys


def leave(code: int) -> None:
    """End a host's process once its result is written and the group destroyed, without the
    interpreter's finalization: there gloo's worker threads can still be torn down after Python's,
    which aborts the process (SIGABRT, "terminate called without an active exception"; PyTorch pull
    request 179291 describes the race) after the job itself succeeded: a few host processes in a
    hundred on this project's CI machine."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def finish(args, torch, dist, result: dict) -> int:
    """Rank 0 writes the result; everyone leaves the job together."""
    if dist.get_rank() == 0:
        with open(args.out, "w") as fh:
            json.dump(
                {"mode": args.mode, "hosts": dist.get_world_size(), "torch": torch.__version__, **result}, fh
            )
    dist.barrier()
    dist.destroy_process_group()
    return 0


def wire_bytes() -> tuple[int, int]:
    """Bytes sent and received so far on this host's testbed interface (``GLOO_SOCKET_IFNAME``, set by
    run_on_hosts), from /proc/self/net/dev, which shows the calling process's network namespace (the
    emulated host's), TCP/IP headers and the timing barriers included. (0, 0) outside the testbed."""
    iface = os.environ.get("GLOO_SOCKET_IFNAME")
    try:
        with open("/proc/self/net/dev") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return 0, 0
    for line in lines:
        name, _, counters = line.partition(":")
        if iface and name.strip() == iface:
            fields = counters.split()
            return int(fields[8]), int(fields[0])  # transmit bytes, receive bytes
    return 0, 0


def shard(torch, model):
    """FSDP2 (``fully_shard``) on every layer, then on the root; default settings: parameters sharded
    over all ranks, gathered before each layer's forward and again before its backward, freed after
    each (``reshard_after_forward``), gradients reduce-scattered per layer, Adam on the rank's shard.

    What that is on CPU over gloo (torch 2.13, fsdp/_fully_shard): the gather and reduce-scatter
    "streams" are the CPU's one stream and the unshards are not async (``unshard_async_op`` False), so
    every collective blocks the training thread: one all-gather (all_gather_single) per layer before its
    forward and one before its backward (FSDP2's backward prefetch of the next layer is also a blocking
    call, it only moves it earlier), one reduce-scatter (reduce_scatter_single) per layer right after
    its backward. Nothing overlaps compute; no bucket spans two layers."""
    from torch.distributed.fsdp import fully_shard

    layers = model.layers if hasattr(model, "layers") else [m for m in model if list(m.parameters())]
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def timed_steps(dist, args, model, x, keys, update) -> dict[str, list[float]]:
    """``args.warmup`` untimed then ``args.steps`` timed training steps, all ranks starting together
    (a barrier): per step its whole time, forward, backward, then ``update()``'s own parts (the
    optimizer step, which returns the durations it measured inside itself, or () to be timed as one
    part). ``keys`` names those columns in that order."""
    times: dict[str, list[float]] = {k: [] for k in keys}
    for i in range(args.warmup + args.steps):
        dist.barrier()
        if i == args.warmup:
            sent, received = wire_bytes()
        t0 = time.perf_counter()
        loss = model(x).square().mean()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        parts = update()
        t3 = time.perf_counter()
        if i >= args.warmup:
            for key, value in zip(keys, (t3 - t0, t1 - t0, t2 - t1, *(parts or (t3 - t2,)))):
                times[key].append(value)
    sent_after, received_after = wire_bytes()
    times["wire_sent_bytes"] = [(sent_after - sent) / args.steps]
    times["wire_received_bytes"] = [(received_after - received) / args.steps]
    return times


def main(argv=None) -> int:
    args, torch, dist = start(argv, __doc__, ("ddp", "fsdp", "local"))
    model = build_model(torch, args)
    if args.mode == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif args.mode == "fsdp":
        model = shard(torch, model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    x = model_input(torch, args)
    keys = ("step", "forward", "backward", "optimizer")

    def update() -> tuple:
        opt.step()
        opt.zero_grad(set_to_none=False)
        return ()  # timed as a whole: "optimizer"

    times = timed_steps(dist, args, model, x, keys, update)
    loss = model(x).square().mean().item()  # after the steps: equal to a single process's (a test)
    params = sum(p.numel() for p in model.parameters())  # FSDP2's DTensors count their global size
    job = {
        "model": args.model,
        "layers": args.layers,
        "width": args.width,
        "batch": args.batch,
        "params": params,
        "loss_after": loss,
        # per step, the most any rank sent (received), mean over the timed steps, barriers included
        "wire_sent_bytes_per_step": slowest_ranks(torch, dist, times["wire_sent_bytes"])[0],
        "wire_received_bytes_per_step": slowest_ranks(torch, dist, times["wire_received_bytes"])[0],
    }
    return finish(args, torch, dist, {**job, **slowest(torch, dist, times, keys)})


if __name__ == "__main__":
    leave(main())
