"""Collective sweep through torch.distributed; run it under torchrun, rank 0 writes the result.

    torchrun --nnodes N --nproc_per_node G [--rdzv...] -m clustersim.calibration.collectives \
        --out profile.json

NCCL on GPUs, gloo on CPUs. Each size is timed as the slowest rank's duration per repetition
(barrier, op, device sync), median over repetitions after warm-up. Ops a backend lacks are recorded as
skipped (gloo had no reduce_scatter in older torch; torch 2.13's runs it as an all-reduce, see
cost_models/collective_algorithms.py via_all_reduce). With one GPU it measures NCCL's launch latency instead.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from dataclasses import dataclass

from clustersim.calibration.timing import summarize

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def parse_ops(text: str) -> list[str]:
    """``--ops``' comma-separated names, each stripped, empty items left out: the one reading both the
    command's early check and the sweep's workers use."""
    return [op.strip() for op in text.split(",") if op.strip()]


HOST_ENV = "CLUSTERSIM_HOST"  # a host name per rank where hostnames do not tell hosts apart (namespaces)
NETWORK_ENV = "CLUSTERSIM_NETWORK"  # JSON: the network the sweep runs on, recorded for the network fit


def sizes(quick: bool, device: str, min_bytes: int | None = None, max_bytes: int | None = None) -> list[int]:
    if min_bytes or max_bytes:
        lo, hi = int(min_bytes or 1 << 10), int(max_bytes or 1 << 24)
        out, k = [], lo
        while k <= hi:
            out.append(k)
            k *= 2
        return out
    top = 28 if device == "cuda" else 24
    lo, step = (12, 2) if quick else (10, 1)
    if quick:
        top = min(top, 22 if device == "cpu" else 26)
    return [1 << k for k in range(lo, top + 1, step)]


def _op_fn(dist, torch, op: str, nbytes: int, world: int, device: str, group=None):
    n = max(world, nbytes // 4)
    n -= n % world
    x = torch.ones(n, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x, group=group)
    if op == "broadcast":
        src = dist.get_global_rank(group, 0) if group is not None else 0
        return lambda: dist.broadcast(x, src=src, group=group)
    if op == "all_gather":
        shard = torch.ones(n // world, device=device)
        out = [torch.empty(n // world, device=device) for _ in range(world)]
        return lambda: dist.all_gather(out, shard, group=group)
    if op == "reduce_scatter":
        out = torch.empty(n // world, device=device)
        return lambda: dist.reduce_scatter_tensor(out, x, group=group)
    if op == "all_to_all":
        out = torch.empty(n, device=device)
        return lambda: dist.all_to_all_single(out, x, group=group)
    raise ValueError(op)


def subgroups(hosts: list[str], subgroups: bool) -> list[tuple[list[int], int, int]]:
    """(ranks, nodes, ranks per node) of every group to measure: the world; with ``subgroups``, also
    the first 2, 4, ... nodes, one node alone (intra) and one rank per node (inter rail), so that
    scaling in node count is observed in one run, not assumed."""
    order = list(dict.fromkeys(hosts))
    by_node = {h: [r for r, x in enumerate(hosts) if x == h] for h in order}
    per_node = min(len(v) for v in by_node.values())
    groups = [(list(range(len(hosts))), len(order), len(hosts) // len(order))]
    if not subgroups:  # a group of one rank has no collective to time (main() measures launch latency)
        return [g for g in groups if len(g[0]) > 1]
    k = 2
    while k < len(order):
        groups.append(([r for h in order[:k] for r in by_node[h]], k, per_node))
        k *= 2
    if per_node > 1:
        groups.append((by_node[order[0]], 1, per_node))
        if len(order) > 1:
            groups.append(([by_node[h][0] for h in order], len(order), 1))
    return [g for g in groups if len(g[0]) > 1]


def sweep(
    dist,
    torch,
    device: str,
    quick: bool,
    ops=OPS,
    progress=None,
    min_bytes: int | None = None,
    max_bytes: int | None = None,
    with_subgroups: bool = False,
    repeat: int | None = None,
    warmup: int | None = None,
) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    hosts: list = [None] * world
    dist.all_gather_object(hosts, os.environ.get(HOST_ENV) or socket.gethostname())
    groups = subgroups(hosts, with_subgroups)
    handles = [(dist.new_group(ranks) if len(ranks) < world else None, ranks, n, g) for ranks, n, g in groups]
    nodes = len(set(hosts))
    per_node = world // nodes
    records, skipped = [], {}
    for group, ranks, g_nodes, g_per_node in handles:
        if rank in ranks:
            cfg = SweepSettings(device, quick, tuple(ops), min_bytes, max_bytes, repeat, warmup)
            log = progress if rank == ranks[0] else None
            _sweep_group(dist, torch, cfg, group, (len(ranks), g_nodes, g_per_node), records, skipped, log)
        dist.barrier()
    gathered: list = [None] * world
    dist.all_gather_object(gathered, records)
    merged = [r for part in gathered for r in part if r.get("_leader")]
    for r in merged:
        r.pop("_leader")
    topology = {"ranks": world, "nodes": nodes, "gpus_per_node": per_node, "hosts": sorted(set(hosts))}
    if os.environ.get(NETWORK_ENV):
        topology["network"] = json.loads(os.environ[NETWORK_ENV])
    return {"collectives": merged, "collectives_skipped": skipped, "topology": topology}


@dataclass(frozen=True)
class SweepSettings:
    device: str
    quick: bool
    ops: tuple[str, ...]
    min_bytes: int | None
    max_bytes: int | None
    repeat: int | None
    warmup: int | None


def _sweep_group(
    dist, torch, cfg: SweepSettings, group, shape: tuple[int, int, int], records, skipped, progress
) -> None:
    """Time every op and size on one group (``shape``: ranks, nodes, ranks per node); its leader records."""
    size, nodes, per_node = shape
    device, quick, ops = cfg.device, cfg.quick, cfg.ops
    min_bytes, max_bytes, repeat, warmup = cfg.min_bytes, cfg.max_bytes, cfg.repeat, cfg.warmup
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    repeat = repeat or ((5, 2) if quick else (15, 5))[0]
    warmup = warmup if warmup is not None else ((5, 2) if quick else (15, 5))[1]
    batch_s = 0.004 if quick else 0.01
    leader = dist.get_rank() == (dist.get_global_rank(group, 0) if group is not None else 0)
    for op in ops:
        for nbytes in sizes(quick, device, min_bytes, max_bytes):
            try:
                fn = _op_fn(dist, torch, op, nbytes, size, device, group)
                for _ in range(warmup):
                    fn()
            except (RuntimeError, ValueError, NotImplementedError) as exc:
                skipped[op] = str(exc).splitlines()[0][:200]
                break
            sync()
            # Time a batch of k back-to-back ops per sample so the skew with which ranks leave the
            # barrier (tens to hundreds of microseconds on loaded hosts) is amortised; k is agreed
            # across ranks from the slowest rank's single-op time.
            # Every tensor a collective sees lives on the sweep's device: NCCL has no CPU backend.
            probe = torch.tensor([_timed(fn, sync)], dtype=torch.float64, device=device)
            dist.all_reduce(probe, op=dist.ReduceOp.MAX, group=group)
            k = max(1, min(200, int(batch_s / max(probe.item(), 1e-7))))
            durations = []
            for _ in range(repeat):
                dist.barrier(group=group)
                t0 = time.perf_counter()
                for _ in range(k):
                    fn()
                sync()
                durations.append((time.perf_counter() - t0) / k)
            t = torch.tensor(durations, dtype=torch.float64, device=device)
            slowest = [torch.zeros(len(durations), dtype=torch.float64, device=device) for _ in range(size)]
            dist.all_gather(slowest, t, group=group)
            per_rep = [max(col) for col in zip(*(s.tolist() for s in slowest))]
            timing = summarize(per_rep)
            n = max(size, nbytes // 4)
            n -= n % size
            records.append(
                {
                    "op": op,
                    "nodes": nodes,
                    "gpus_per_node": per_node,
                    "ranks": size,
                    "bytes": 4.0 * n,
                    **timing.as_dict(),
                    "_leader": leader,
                }
            )
            if progress:
                progress(f"{op} {nbytes} B on {nodes}x{per_node}: {timing.median_s * 1e6:.1f} us")


def launch_latency(torch, dist) -> float | None:
    """NCCL's launch latency at world size 1: a 4-byte all_reduce on one GPU."""
    x = torch.ones(1, device="cuda")
    timing = summarize([_timed(lambda: dist.all_reduce(x), torch.cuda.synchronize) for _ in range(50)])
    return timing.median_s


def _timed(fn, sync) -> float:
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", required=True, help="the fitted profile rank 0 writes (with --raw: the raw medians)"
    )
    ap.add_argument("--raw", action="store_true", help="write the raw medians instead of a fitted profile")
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument(
        "--min-bytes", type=int, default=None, help="smallest message (bytes); sizes double up to --max-bytes"
    )
    ap.add_argument("--max-bytes", type=int, default=None)
    ap.add_argument(
        "--subgroups",
        action="store_true",
        help="also measure the first 2, 4, ... nodes, one node, and one rank per node",
    )
    ap.add_argument("--repeat", type=int, default=None, help="timed repetitions per size")
    ap.add_argument("--warmup", type=int, default=None, help="untimed repetitions per size")
    args = ap.parse_args(argv)
    import torch
    import torch.distributed as dist

    from clustersim.calibration.provenance import provenance
    from clustersim.io import write_json_atomically

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        # One thread per rank: several ranks share the host's cores, and oversubscribed intra-op
        # thread pools turn gloo timings into scheduler noise.
        torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend=backend)
    try:
        ops = parse_ops(args.ops)
        unknown = set(ops) - set(OPS)
        if unknown:
            print(f"error: unknown ops {sorted(unknown)}", file=sys.stderr)
            return 2
        result = sweep(
            dist,
            torch,
            device,
            args.quick,
            ops,
            progress=lambda m: print(m, flush=True),
            min_bytes=args.min_bytes,
            max_bytes=args.max_bytes,
            with_subgroups=args.subgroups,
            repeat=args.repeat,
            warmup=args.warmup,
        )
        if dist.get_world_size() == 1 and device == "cuda":
            result["launch_latency_s"] = launch_latency(torch, dist)
        if dist.get_rank() == 0:
            result["backend"] = backend
            result["provenance"] = provenance(
                torch, device, " ".join(sys.argv), backend=backend, ranks=dist.get_world_size()
            )
            raw = {"format": "clustersim-raw", "format_version": 1, "device": device, **result}
            if args.raw:
                write_json_atomically(args.out, raw)
            else:
                from clustersim.calibration.run import save_profile

                save_profile(raw, args.out)
                print(f"profile written to {args.out}", flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
