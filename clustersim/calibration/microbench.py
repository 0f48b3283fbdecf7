"""Local microbenchmarks with torch: GEMMs, HBM copies, compression kernels, Adam, host copies.

Each compression kernel is timed as torch code that mirrors the pass it stands for in the cost
model (strategies/compressed_allreduce.py, binsgdm.py) and is recorded with the *modelled* bytes of
that pass, so ``bytes / time`` is exactly the bandwidth the simulator must use to reproduce the
measured time. Packing uses torch bit operations, or cupy.packbits when cupy is installed (GPU).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from clustersim.calibration.screen import stall_suspects, sweeps
from clustersim.calibration.timing import measure, measure_interleaved
from clustersim.cost_models import kernel_bytes as bsg
from clustersim.cost_models.kernel_bytes import FINISH_PASSES, FUSED_ADAM, SERVER_PASSES, WORKER_PASSES


def _onebit_update(t, m, v, p, lr=1e-4, eps=1e-8, weight_decay=0.01):
    """1-bit Adam's update with the frozen variance, weight decay included (kernel_bytes.ADAM_DIRECTION
    and APPLY_UPDATE count these expressions; testbed/compressed_job.py runs the same)."""
    update = m / (v.sqrt() + eps)
    update += weight_decay * p
    p.add_(-lr * update)


_PASS_BYTES = {
    name: (per_n, per_chunk) for name, per_n, per_chunk in WORKER_PASSES + SERVER_PASSES + FINISH_PASSES
}
SERVER_P = 8  # the (p, n/p) shape used for the server-side kernels
# Rounds of measuring again what a sweep's physics says stalled (screen.py). The first comes after
# all the other measurements, seconds later, so a slow stretch of a loaded host has usually passed;
# each starts after REMEASURE_PAUSE_S asleep: a task that has just slept is owed CPU time by the
# scheduler (CFS's sleeper credit, EEVDF's lag), so its next milliseconds are the least likely to be
# preempted.
# Each takes REMEASURE_REPEATS times the usual repetitions, so one undisturbed stretch is enough.
REMEASURE_ROUNDS = 3
REMEASURE_PAUSE_S = 0.2
REMEASURE_REPEATS = 3


# The largest CPU buffer of a sweep: at least twice the last-level cache, so that every streaming kernel
# (two to five such buffers) runs from DRAM, as a model's buffers (hundreds of MB) do. On a 2-vCPU EPYC
# VM with a 32 MiB L3 the 1-bit Adam passes ran 5-21x faster at 256 KiB-1 MiB (from cache: "copies"
# at 268 GB/s) than at 64 MiB.
LLC_MULTIPLE = 2
CPU_ELEMENTS_MIN, CPU_ELEMENTS_MAX = 1 << 24, 1 << 26  # fp32: 64 MiB .. 256 MiB


def last_level_cache_bytes() -> int | None:
    """The largest CPU cache Linux reports for cpu0 (sysfs), or None where it reports none."""
    caches = Path("/sys/devices/system/cpu/cpu0/cache")
    sizes = []
    for index in caches.glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text[:-1] if text[-1:].isalpha() else text
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def _cpu_elements(quick: bool) -> list[int]:
    """fp32 element counts of a CPU sweep: the largest past LLC_MULTIPLE times the last-level cache
    (within CPU_ELEMENTS_MIN..MAX), then halves of it (two sizes in quick mode, three else), every
    one past the cache for the kernels' two or more buffers."""
    llc = last_level_cache_bytes() or 0
    largest = CPU_ELEMENTS_MIN
    while largest * 4 < LLC_MULTIPLE * llc and largest < CPU_ELEMENTS_MAX:
        largest *= 2
    count = 2 if quick else 3
    return [largest >> i for i in reversed(range(count))]


def _sizes(device: str, quick: bool) -> dict[str, list[int]]:
    if device == "cuda":
        return {
            "gemm": [1024, 2048, 4096, 8192] if not quick else [2048, 8192],
            "elements": [1 << 22, 1 << 24, 1 << 26] if not quick else [1 << 22, 1 << 25],
        }
    return {
        "gemm": [256, 512, 1024] if not quick else [128, 256, 512],
        "elements": _cpu_elements(quick),
    }


def gemm_shapes(sizes: list[int]) -> list[tuple[int, int, int]]:
    """Square GEMMs of each size plus the skinny and flat shapes of transformer layers (tokens x hidden x
    4·hidden, and its transposes, at a quarter of the size): the shape model needs both to separate
    peak rate, small-problem overhead and memory-bound behaviour."""
    shapes = [(m, m, m) for m in sizes]
    for m in sizes:
        q = max(m // 4, 16)
        shapes += [(m, q, 4 * q), (m, 4 * q, q), (q, m, m)]
    return list(dict.fromkeys(shapes))


def pack_bits(torch, bits):
    """Eight 0/1 values per byte, most significant first (numpy/cupy packbits order), in torch ops:
    the packing the cost model's kernels and the testbed's compressed all-reduces both run."""
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=bits.device)
    return (bits.view(-1, 8) * weights).sum(dim=1).to(torch.uint8)


def unpack_bits(torch, packed):
    shifts = torch.arange(7, -1, -1, device=packed.device, dtype=torch.uint8)
    return ((packed.unsqueeze(-1) >> shifts) & 1).view(-1)


class Bench:
    def __init__(self, torch, device: str, quick: bool, progress: Callable[[str], None] | None = None):
        self.torch = torch
        self.device = device
        self.quick = quick
        self.progress = progress or (lambda _msg: None)
        self.repeat = 5 if quick else 15
        self.sizes = _sizes(device, quick)
        self._timed: list[tuple[dict, Callable]] = []  # (record, its timed function) for measuring again

    def sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def time(self, fn) -> dict:
        return measure(
            fn, self.sync, warmup=2 if self.quick else 5, repeat=self.repeat, min_time_s=0.02
        ).as_dict()

    def time_sweep(self, entries: list[tuple[dict, Callable]]) -> list[dict]:
        """Time the sizes of one sweep in turn (timing.measure_interleaved), so a slow stretch of the
        machine falls on every size alike; returns the records with their timings. On the CPU the
        functions are kept for measuring a stalled one again (``remeasure_stalls``); on a GPU they
        are not (their buffers would stay in device memory, and a GPU kernel's time is the device's)."""
        timings = measure_interleaved(
            [fn for _, fn in entries],
            self.sync,
            warmup=2 if self.quick else 5,
            repeat=self.repeat,
            min_time_s=0.02,
        )
        out = []
        for (record, fn), timing in zip(entries, timings):
            record = {**record, **timing.as_dict()}
            if self.device != "cuda":
                self._timed.append((record, fn))
            out.append(record)
        return out

    def remeasure_stalls(self, raw: dict, rounds: int = REMEASURE_ROUNDS) -> None:
        """Measure again, in place, every sweep in which screen.py's rules find a stall in ``raw``, up
        to ``rounds`` times; a stall only adds time, so each record keeps the lower median of the two.
        What is still suspect afterwards is dropped by the fit, which says so."""
        fns = {id(r): fn for r, fn in self._timed}
        for attempt in range(1, rounds + 1):
            # the whole sweep of a suspect, in turn: its other sizes are what says whether it stalled
            suspects = [
                r
                for _block, records, points, _labels in sweeps(raw)
                if stall_suspects(points)
                for r in records
                if id(r) in fns
            ]
            if not suspects:
                return
            self.progress(f"measuring {len(suspects)} sizes with a stall again, round {attempt}")
            time.sleep(REMEASURE_PAUSE_S)
            timings = measure_interleaved(
                [fns[id(r)] for r in suspects],
                self.sync,
                warmup=1,
                repeat=REMEASURE_REPEATS * self.repeat,
                min_time_s=0.02,
            )
            for record, timing in zip(suspects, timings):
                record["remeasured"] = record.get("remeasured", 0) + 1
                if timing.median_s < record["median_s"]:
                    record.update(timing.as_dict())

    # ---- compute ---------------------------------------------------------------------------------
    def gemms(self) -> list[dict]:
        t = self.torch
        precisions = ["fp32", "fp16", "bf16"] if self.device == "cuda" else ["fp32", "bf16"]
        dtypes = {"fp32": t.float32, "fp16": t.float16, "bf16": t.bfloat16}
        out = []
        elt = {"fp32": 4, "fp16": 2, "bf16": 2}
        for prec in precisions:
            entries = []
            for m, n, k in gemm_shapes(self.sizes["gemm"]):
                self.progress(f"GEMM {prec} {m}x{n}x{k}")
                a = t.randn(m, k, device=self.device, dtype=dtypes[prec])
                b = t.randn(k, n, device=self.device, dtype=dtypes[prec])
                record = {
                    "precision": prec,
                    "m": m,
                    "n": n,
                    "k": k,
                    "flops": 2.0 * m * n * k,
                    "bytes": float(elt[prec] * (m * k + k * n + m * n)),
                }
                entries.append((record, lambda a=a, b=b: a @ b))
            self.progress(f"GEMM {prec}: {len(entries)} shapes, timed in turn")
            out += self.time_sweep(entries)
        return out

    def copies(self) -> list[dict]:
        t = self.torch
        entries = []
        for n in self.sizes["elements"]:
            self.progress(f"memory copy {n * 4 >> 20} MiB")
            src = t.randn(n, device=self.device)
            dst = t.empty_like(src)
            entries.append(({"bytes": 4.0 * n, "traffic_bytes": 8.0 * n}, lambda d=dst, s=src: d.copy_(s)))
        return self.time_sweep(entries)

    # ---- compression kernels -------------------------------------------------------------------------
    def _pack(self, bits):
        if self.device == "cuda":
            try:
                import cupy  # noqa: F401 - only on GPUs with cupy installed

                return self.torch.as_tensor(cupy.packbits(cupy.asarray(bits)), device=self.device)
            except ImportError:
                pass
        return pack_bits(self.torch, bits)

    def _unpack(self, packed):
        return unpack_bits(self.torch, packed)

    def compression_kernels(self, p: int = SERVER_P) -> list[dict]:
        """Each kernel at every size; the server side and BinSGDM's vote at ``p`` ranks (the shape of a
        job of p ranks: the testbed calibrates at the host count it runs)."""
        out: list[dict] = []
        by_name: dict[str, list[tuple[dict, Callable]]] = {}
        for n in self.sizes["elements"]:
            for name, record, fn in self._compression_kernels_at(n, p):
                by_name.setdefault(name, []).append((record, fn))
        for name, entries in by_name.items():  # each kernel's sizes timed in turn
            self.progress(f"{name}, {len(entries)} sizes")
            out += self.time_sweep(entries)
        return out

    def _compression_kernels_at(self, n: int, p: int) -> list[tuple[str, dict, Callable]]:
        """(name, record, kernel) of every compression kernel on tensors of ``n`` elements, each kernel a
        closure over this call's own tensors: the sweep times them after every size is built, so closures
        over a shared loop's variables would all time the last (largest) size's tensors."""
        t, dev = self.torch, self.device
        buf = t.randn(n, device=dev)
        err = t.zeros(n, device=dev)
        scale = t.norm(buf) / n**0.5
        bits = buf.sign().add_(1).bool().to(t.uint8)
        packed = self._pack(bits)
        scales = t.rand(p, 1, device=dev)
        chunk = t.randn(n // p, device=dev)
        chunk_err = t.zeros(n // p, device=dev)
        m, b_state, grad = t.randn(n, device=dev), t.rand(n, device=dev) + 0.1, t.randn(n, device=dev)
        votes = t.randint(0, p + 1, (n // p,), device=dev, dtype=t.int32)
        kernels = {
            "onebit_error_compensate": lambda: buf.add_(err),
            "onebit_norm": lambda: t.norm(buf),
            "onebit_sign_error": lambda: err.copy_(
                buf - scale * buf.sign().add_(1).bool().float().add_(-0.5).mul_(2.0)
            ),
            "onebit_pack": lambda: self._pack(buf.sign().add_(1).bool().to(t.uint8)),
            "onebit_unpack_sum": lambda: (
                self._unpack(packed).view(p, -1).float().add_(-0.5).mul_(2.0).mul_(scales).sum(0)
            ),
            "onebit_server_compress": lambda: (
                chunk.add_(chunk_err),
                chunk_err.copy_(
                    chunk
                    - (t.norm(chunk) / (n // p) ** 0.5)
                    * chunk.sign().add_(1).bool().float().add_(-0.5).mul_(2.0)
                ),
                self._pack(chunk.sign().add_(1).bool().to(t.uint8)),
            ),
            "onebit_unpack_copy": lambda: buf.copy_(
                self._unpack(packed).view(p, -1).float().add_(-0.5).mul_(2.0).mul_(scales).view(-1)
            ),
            "binsgdm_update": lambda: (
                m.mul_(0.9).add_(grad, alpha=0.1),
                b_state.mul_(0.9).add_(grad.abs(), alpha=0.1),
            ),
            # stochastic 1-bit quantization of m/b to the packed bits the all-reduce sends, as the
            # testbed's BinSGDM runs it (a +1 with probability (1 + m/b) / 2); not t.where(.., 1, -1),
            # which materialises 8 bytes of int64 per element that no implementation writes
            "binsgdm_quantize": lambda: self._pack((t.rand_like(m) < (1 + m / b_state) / 2).to(t.uint8)),
            # the 1-bit reduce-scatter's local vote: unpack p shards of n/p bits, count the +1s
            "binsgdm_vote": lambda: self._unpack(packed).view(p, -1).sum(0, dtype=t.int32),
            # re-binarize the vote (majority) and pack it for the next phase
            "binsgdm_requantize": lambda: self._pack((votes * 2 > p).to(t.uint8)),
            # unpack the 1-bit result to ±1 and apply it to the fp32 weights
            "binsgdm_apply": lambda: buf.add_(self._unpack(packed).float().mul_(2.0).add_(-1.0), alpha=-1e-4),
            # 1-bit Adam's own update passes, torch expressions over flat fp32 buffers as DeepSpeed
            # writes them (onebit/adam.py): not fused Adam, whose rate 'optimizer' measures
            "onebit_momentum": lambda: m.mul_(0.9).add_(grad, alpha=0.1),
            "onebit_update": lambda: _onebit_update(t, m, b_state, buf),
        }
        modelled = {
            **{k: v[0] * n + v[1] * n / p for k, v in _PASS_BYTES.items()},
            "binsgdm_update": (bsg.UPDATE_STATE_BYTES + 4.0) * n,
            "binsgdm_quantize": bsg.QUANTIZE_BYTES * n,
            # as strategies/binsgdm.py counts them: read the 1-bit shards, write n/p sums; then
            # read n/p sums (int8 in the model) and write n/p bits
            "binsgdm_vote": n / 8 + n / p,
            "binsgdm_requantize": (n / p) * (1 + 1 / 8),
            "binsgdm_apply": bsg.APPLY_BYTES * n,
            "onebit_momentum": bsg.MOMENTUM_UPDATE * n,
            "onebit_update": (bsg.ADAM_DIRECTION + bsg.APPLY_UPDATE) * n,
        }
        return [
            (name, {"name": name, "elements": n, "bytes": modelled[name]}, fn) for name, fn in kernels.items()
        ]

    def adam(self) -> list[dict]:
        """Adam on the device (fused on CUDA, foreach on the CPU), recorded as the 'optimizer' kernel,
        at every size of the sweep (the profile takes the largest; the others check it for stalls)."""
        t = self.torch
        entries = []
        kwargs = {"fused": True} if self.device == "cuda" else {"foreach": True}
        for n in self.sizes["elements"]:
            self.progress(f"Adam step on {self.device}, {n:,} parameters")
            param = t.nn.Parameter(t.randn(n, device=self.device))
            param.grad = t.randn(n, device=self.device)
            opt = t.optim.Adam([param], lr=1e-3, **kwargs)
            entries.append(({"name": "optimizer", "elements": n, "bytes": FUSED_ADAM * n}, opt.step))
        return self.time_sweep(entries)

    def host_adam(self) -> list[dict]:
        """CPU Adam on host cores by thread count: parameters per second (for CPU offload)."""
        t = self.torch
        n = 1 << (20 if self.quick else 24)
        threads = sorted({1, max(1, (os.cpu_count() or 1) // 2), os.cpu_count() or 1})
        old = t.get_num_threads()
        out = []
        try:
            for k in threads:
                self.progress(f"CPU Adam, {k} thread(s)")
                t.set_num_threads(k)
                param = t.nn.Parameter(t.randn(n))
                param.grad = t.randn(n)
                opt = t.optim.Adam([param], lr=1e-3, foreach=True)
                timing = measure(opt.step, lambda: None, warmup=1, repeat=3 if self.quick else 7)
                out.append(
                    {"threads": k, "params": n, "params_per_s": n / timing.median_s, **timing.as_dict()}
                )
        finally:
            t.set_num_threads(old)
        return out

    def host_copies(self) -> list[dict]:
        if self.device != "cuda":
            return []
        t = self.torch
        out = []
        for n in self.sizes["elements"]:
            dev = t.empty(n, device="cuda")
            for pinned in (True, False):
                host = t.empty(n, pin_memory=pinned)
                for direction, fn in (
                    ("h2d", lambda: dev.copy_(host, non_blocking=pinned)),
                    ("d2h", lambda: host.copy_(dev, non_blocking=pinned)),
                ):
                    self.progress(f"{direction} {'pinned' if pinned else 'pageable'} {n * 4 >> 20} MiB")
                    out.append({"direction": direction, "pinned": pinned, "bytes": 4.0 * n, **self.time(fn)})
        return out


def run_local(torch, device: str, quick: bool, progress=None) -> dict:
    bench = Bench(torch, device, quick, progress)
    raw = {
        "gemm": bench.gemms(),
        "memory": bench.copies(),
        "kernels": bench.compression_kernels() + bench.adam(),
    }
    bench.remeasure_stalls(raw)
    raw["host_adam"] = bench.host_adam()
    raw["host_copies"] = bench.host_copies()
    return raw
