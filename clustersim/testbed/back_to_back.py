"""Collectives timed alone and back to back on the emulated hosts: where ZeRO-3's 8-host miss comes from.

The calibration sweep times each repetition after a barrier (calibration/collectives.py), so every
collective starts with the links idle and all ranks together. ZeRO-3 (FSDP2 on CPU, ddp_job.py
``--mode fsdp``) issues its per-layer collectives one after another. This probe times the same
collective (``--bytes``, all_gather_single and all_reduce over gloo) both ways on the first 2, 4, ...
hosts, at each ``--rates`` link rate (a fast one shows the CPU's share alone):

    python -m clustersim.testbed.back_to_back --hosts 2,4,8 --rates 200mbit,10gbit --out probe.json

Needs root (testbed/hosts.py); brings the testbed up at each rate and takes it down. Rank 0's
``--mode job`` run writes the medians (ms) of the slowest rank per repetition.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from clustersim.testbed.hosts import down_on_sigterm

REPEAT = 15  # timed repetitions after a barrier each (the sweep's kind), after 2 warm-up calls
IN_A_ROW = 8  # collectives issued back to back, as ZeRO-3 issues a layer's after the previous one's
MODULE = "clustersim.testbed.back_to_back"  # what each host runs (``__name__`` is __main__ under -m)


def job(nbytes: int, out: str) -> int:
    """One host's part: each op alone (barrier first) and ``IN_A_ROW`` in a row, slowest rank's time."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    p = dist.get_world_size()
    n = max(p, nbytes // 4) // p * p
    x, full = torch.ones(n), torch.empty(n)
    ops = {
        "all_gather": lambda: dist.all_gather_single(full, x[: n // p]),
        "all_reduce": lambda: dist.all_reduce(x),
    }
    result = {}
    for name, op in ops.items():
        op()
        op()
        alone = []
        for _ in range(REPEAT):
            dist.barrier()
            t0 = time.perf_counter()
            op()
            alone.append(time.perf_counter() - t0)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(IN_A_ROW):
            op()
        in_a_row = (time.perf_counter() - t0) / IN_A_ROW
        mine = torch.tensor([*alone, in_a_row], dtype=torch.float64)
        gathered = [torch.zeros_like(mine) for _ in range(p)]
        dist.all_gather(gathered, mine)
        worst = torch.stack(gathered).max(dim=0).values.tolist()
        result[name] = {"alone_ms": 1e3 * statistics.median(worst[:-1]), "back_to_back_ms": 1e3 * worst[-1]}
    if dist.get_rank() == 0:
        with open(out, "w") as fh:
            json.dump({"hosts": p, "bytes": n * 4, **result}, fh)
    dist.barrier()
    dist.destroy_process_group()
    return 0


@down_on_sigterm
def probe(
    host_counts: list[int], rates: list[str], nbytes: int, progress=None, cpus_per_host: float | None = None
) -> dict:
    """Every rate, every host count: the testbed up at that rate, the job run, the testbed down."""
    from clustersim.testbed import hosts
    from clustersim.testbed.shaping import parse_rate
    from clustersim.testbed.sweep import host_cpus, run_on_hosts

    rows = []
    for rate in rates:
        tb, _ = hosts.up(max(host_counts), parse_rate(rate), cpus_per_host=cpus_per_host)
        try:
            for n in sorted(host_counts):
                args = ["--mode", "job", "--bytes", str(nbytes)]
                got = run_on_hosts(tb, MODULE, args, {}, progress, 600, "the probe", count=n)
                rows.append({"rate": rate, **got, **host_cpus(tb)})
        finally:
            hosts.down(tb)
    return {"rows": rows, "repeat": REPEAT, "in_a_row": IN_A_ROW}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("probe", "job"), default="probe")
    ap.add_argument("--hosts", default="2,4,8")
    ap.add_argument("--rates", default="200mbit,10gbit")
    ap.add_argument("--bytes", type=int, default=1 << 20, help="the collective's whole array (default 1 MiB)")
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--cpus-per-host",
        type=float,
        default=None,
        help="each host's CPU share in cores (default: the machine's cores divided among the hosts; 0: none)",
    )
    args = ap.parse_args(argv)
    if args.mode == "job":
        return job(args.bytes, args.out)
    import datetime
    import platform

    from clustersim.calibration.provenance import cpu_model
    from clustersim.errors import InputError
    from clustersim.testbed.shaping import parse_rate

    try:
        counts = [int(h) for h in args.hosts.split(",")]
        if min(counts) < 2:
            raise ValueError
        for rate in args.rates.split(","):
            parse_rate(rate)
        result = probe(counts, args.rates.split(","), args.bytes, cpus_per_host=args.cpus_per_host)
    except ValueError:
        print(f"error: --hosts: expected host counts of 2 or more, got {args.hosts!r}", file=sys.stderr)
        return 2
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result["provenance"] = {
        "command": f"python -m clustersim.testbed.back_to_back --hosts {args.hosts} --rates {args.rates} "
        f"--bytes {args.bytes} --cpus-per-host {result['rows'][0]['cpus_per_host'] or 0:g}",
        "cpu": cpu_model(),
        "kernel": platform.release(),
        "torch": __import__("torch").__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=1)
    for r in result["rows"]:
        print(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
