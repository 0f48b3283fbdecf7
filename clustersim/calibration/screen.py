"""Stalled measurements found by the physics of a size sweep, before anything is fitted to them.

A GEMM with more FLOPs and more bytes, or a copy or kernel over more bytes, never takes less time, and
its time grows with the work once that work is beyond a launch's microseconds. On a loaded host a
measurement can instead sit at a multiple of the scheduler's slice (every fp32 GEMM from 128³ to 512³
timed at 16.00 ms on a 2-core machine at load 2.4, every copy at 12.0 ms): those are stalls, and a fit
to them prices the device a hundred times too slow. Three rules, applied to each pair of a sweep where
one point has at least twice the work of the other in every measure (FLOPs and bytes):

* slower with less work: the smaller took longer than the bigger (beyond SLOWER_TOLERANCE);
* flat: at least FLAT_WORK_RATIO times the work took under FLAT_TIME_RATIO times the time, at a
  millisecond or more: not a launch cost, a stall of the smaller. The bigger is suspect too where
  both times are one value (within SAME_QUANTUM: 12.00 and 12.03 ms, scheduler slices), not where
  they merely come close: on this project's 2-core host at load 4-6, small kernels stalled to ~2 ms
  while their 4M-element size genuinely took 1.9 ms;
* superlinear: the bigger took SUPERLINEAR_FACTOR times longer than its share of the work (a working
  set falling out of cache costs a few times, not ten).

Only times of STALL_MIN_S or more are ever suspect: below that no scheduler slice fits, so GPU
microbenchmarks of microseconds are never touched. ``calibrate run`` measures a suspect again (a
stall only adds time, so the lower median is kept); the fit drops what is still suspect and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clustersim.calibration.timing import STALL_MIN_S

DOMINANCE_RATIO = 2.0  # "more work": at least this many times the FLOPs (or bytes), and no fewer bytes
# how much slower a smaller size may be timed than one with twice its work or more: the repeats of one
# undisturbed measurement spread by a median P90/P10 of 1.28 (the shipped CPU profile), and their
# median by less; twice the work takes far longer than that
SLOWER_TOLERANCE = 1.25
FLAT_WORK_RATIO = 4.0
FLAT_TIME_RATIO = 1.5
SAME_QUANTUM = 0.03  # two times this close at a millisecond or more are one scheduler quantum
SUPERLINEAR_FACTOR = 10.0


@dataclass
class FitNotes:
    """What a fit left out, for the profile's provenance and the command's warnings: ``dropped``
    measurements (stalls, outliers) and blocks ``defaults`` left to the simulator's defaults, each one
    line naming it and why; ``left`` and ``thinned`` name the blocks (``GEMM bf16``, ``memory copy``,
    ``kernel optimizer``) left at defaults and those that lost measurements."""

    dropped: list[str] = field(default_factory=list)
    defaults: list[str] = field(default_factory=list)
    left: set[str] = field(default_factory=set)
    thinned: set[str] = field(default_factory=set)

    def drop(self, block: str, label: str, why: str) -> None:
        self.dropped.append(f"{label}: {why}")
        self.thinned.add(block)

    def leave(self, block: str, why: str) -> None:
        self.defaults.append(f"{block}: {why}")
        self.left.add(block)


def stall_suspects(points: list[tuple[float, float, float]]) -> dict[int, str]:
    """``points``: (work, bytes, seconds) of one sweep. Returns index -> why it is suspect."""
    out: dict[int, str] = {}
    for i, (wi, bi, ti) in enumerate(points):
        for j, (wj, bj, tj) in enumerate(points):
            if not (wj >= DOMINANCE_RATIO * wi and bj >= bi):
                continue
            ratio = wj / wi
            if ti >= STALL_MIN_S and ti > SLOWER_TOLERANCE * tj:
                out.setdefault(
                    i, f"{_ms(ti)} ms, longer than {ratio:.0f}x the work took ({_ms(tj)} ms): a stall"
                )
            if ti >= STALL_MIN_S and ratio >= FLAT_WORK_RATIO and tj < FLAT_TIME_RATIO * ti:
                why = f"{_ms(ti)} and {_ms(tj)} ms for {ratio:.0f}x the work: time not growing with work"
                out.setdefault(i, why)
                if tj >= STALL_MIN_S and abs(tj / ti - 1) < SAME_QUANTUM:
                    out.setdefault(j, f"{why}, both at one quantum")
            if tj >= STALL_MIN_S and tj > SUPERLINEAR_FACTOR * max(ratio, bj / bi) * ti:
                why = f"{_ms(tj)} ms, {tj / ti:.0f}x the time of {ratio:.0f}x less work ({_ms(ti)} ms)"
                out.setdefault(j, why)
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g}"


def sweeps(raw: dict) -> list[tuple[str, list[dict], list[tuple[float, float, float]], list[str]]]:
    """The size sweeps of a raw file: (block, records, (work, bytes, seconds) per record, labels).
    GEMMs per precision (FLOPs and bytes), copies (bytes), each kernel over its sizes (bytes)."""
    from clustersim.calibration.compute_fit import _bytes, gemm_label

    out = []
    gemm = raw.get("gemm") or []
    for prec in sorted({r["precision"] for r in gemm}):
        rows = [r for r in gemm if r["precision"] == prec]
        points = [(float(r["flops"]), _bytes(r), float(r["median_s"])) for r in rows]
        out.append((f"compute_model.{prec}", rows, points, [gemm_label(r) for r in rows]))
    memory = raw.get("memory") or []
    if memory:
        points = [(float(r["traffic_bytes"]),) * 2 + (float(r["median_s"]),) for r in memory]
        out.append(("memory_gbs", memory, points, [f"copy of {r['bytes']:,.0f} B" for r in memory]))
    kernels = raw.get("kernels") or []
    for name in sorted({r["name"] for r in kernels}):
        rows = [r for r in kernels if r["name"] == name]
        points = [(float(r["bytes"]),) * 2 + (float(r["median_s"]),) for r in rows]
        out.append((f"kernels_gbs.{name}", rows, points, [f"{name} n={r['elements']:,}" for r in rows]))
    return out


def screen(raw: dict) -> tuple[dict, FitNotes]:
    """``raw`` without its stalled measurements (a copy; the input is not changed), and notes: one
    line per measurement dropped saying why, and one per block with no measurement left."""
    dropped: set[int] = set()
    notes = FitNotes()
    for block, records, points, labels in sweeps(raw):
        suspects = stall_suspects(points)
        for i, why in sorted(suspects.items()):
            dropped.add(id(records[i]))
            notes.drop(_block_label(block), labels[i], why)
        if len(suspects) == len(records):
            notes.leave(_block_label(block), "every size stalled")
    if not dropped:
        return raw, notes
    clean = dict(raw)
    for key in ("gemm", "memory", "kernels"):
        if raw.get(key):
            clean[key] = [r for r in raw[key] if id(r) not in dropped]
    return clean, notes


def _block_label(block: str) -> str:
    kind, _, name = block.partition(".")
    return {"compute_model": f"GEMM {name}", "memory_gbs": "memory copy", "kernels_gbs": f"kernel {name}"}[
        kind
    ]
