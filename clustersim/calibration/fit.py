"""Fits from raw measurements: segmented α-β collective models and per-size efficiency tables.

Segmented α-β (as peers fit NCCL, where the protocol changes with size): the sizes are split into
1-3 contiguous segments, each fitted ``t = α + S·β`` by robust least squares on relative residuals
(scipy ``least_squares``, soft-L1 loss) with α, β ≥ 0 so intercepts never go negative. The number of
segments is chosen by BIC. Quality is measured on sizes held out of the fit: fit to every other
size, predict the rest.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.optimize import least_squares

from clustersim.calibration.compute_fit import fit_gemm_model
from clustersim.calibration.network_fit import fit_network, measured_cluster
from clustersim.calibration.plausible import drop_precision, refuse_implausible
from clustersim.calibration.profile import FORMAT, FORMAT_VERSION, CollectiveFit, FitQuality
from clustersim.calibration.provenance import PROFILE_FIELDS, collective_sweep, command_record, testbed_record
from clustersim.calibration.screen import FitNotes, screen
from clustersim.cost_models.closed_forms import busbw_factor
from clustersim.cost_models.measured_collectives import segmented_time

MAX_SEGMENTS = 3
MIN_POINTS_PER_SEGMENT = 4
# Where a segment may end: every size while there are at most this many places, else this many spread
# evenly over the sizes, refined afterwards (fit_segments). The grid is at most 1 + 2*32 + 32*31/2 = 561
# distinct segments, each fitted once, however many sizes were measured: the search is linear in the
# points (every cut pair was tried before: 2,000 sizes took millions of fits). Sweeps of up to 39
# sizes (the shipped ones have 21-30) are searched exhaustively as before. Not a model constant.
MAX_CUT_CANDIDATES = 32


def cut_candidates(n: int) -> list[int]:
    """The indices at which a segment may start (the sizes sorted), for ``n`` points."""
    lo, hi = MIN_POINTS_PER_SEGMENT, n - MIN_POINTS_PER_SEGMENT
    if hi - lo + 1 <= MAX_CUT_CANDIDATES:
        return list(range(lo, hi + 1))
    step = (hi - lo) / (MAX_CUT_CANDIDATES - 1)
    return sorted({lo + round(i * step) for i in range(MAX_CUT_CANDIDATES)})


def _fit_segment(S: np.ndarray, t: np.ndarray) -> tuple[float, float, np.ndarray, np.ndarray]:
    slope = max((t[-1] - t[0]) / (S[-1] - S[0]), 0.0) if len(S) > 1 and S[-1] > S[0] else 0.0
    x0 = [max(t.min() - slope * S.min(), 1e-9), max(slope, 1e-15)]
    res = least_squares(
        lambda x: (x[0] + S * x[1] - t) / t,
        x0,
        bounds=([0.0, 0.0], [np.inf, np.inf]),
        loss="soft_l1",
        f_scale=0.05,
        x_scale=[max(x0[0], 1e-9), max(x0[1], 1e-15)],
    )
    return float(res.x[0]), float(res.x[1]), res.fun, res.jac


def _ci95(jac: np.ndarray, resid: np.ndarray) -> tuple[float, float]:
    dof = max(len(resid) - 2, 1)
    try:
        cov = np.linalg.inv(jac.T @ jac) * float(resid @ resid) / dof
        return tuple(float(1.96 * math.sqrt(max(v, 0.0))) for v in np.diag(cov))  # type: ignore[return-value]
    except np.linalg.LinAlgError:
        return (float("nan"), float("nan"))


def _boundary(last_left: float, first_right: float, left: tuple, right: tuple[float, float]) -> float:
    """Where one segment hands over to the next: where their lines cross if that lies between the
    two measured sizes (NCCL switches protocol where the next becomes cheaper), else their geometric mean."""
    (_, a1, b1), (a2, b2) = left, right
    if b1 != b2:
        cross = (a2 - a1) / (b1 - b2)
        if last_left < cross < first_right:
            return float(cross)
    return float(math.sqrt(last_left * first_right))


def fit_segments(sizes, times) -> tuple[list[tuple[float, float, float]], list[np.ndarray], list[np.ndarray]]:
    """Best segmentation by BIC. Returns segments (min_bytes, α, β) plus residuals and jacobians.

    Boundaries are first tried at cut_candidates; where those are spread out (more than 39 sizes) the
    best boundaries are then refined one at a time, each tried at 8 places either side of where it is,
    at a spacing that shrinks 8-fold per round down to one size: lg8(n) rounds of a bounded number of
    segments, so the whole search stays linear in the points (up to that logarithm)."""
    order = np.argsort(sizes)
    S, t = np.asarray(sizes, float)[order], np.asarray(times, float)[order]
    n = len(S)
    fits: dict[tuple[int, int], tuple] = {}  # a segment's fit is the same in every segmentation

    def evaluate(bounds: list[int]):
        if any(b - a < MIN_POINTS_PER_SEGMENT for a, b in zip(bounds, bounds[1:])):
            return None
        segs, resids, jacs = [], [], []
        for a, b in zip(bounds, bounds[1:]):
            if (a, b) not in fits:
                fits[a, b] = _fit_segment(S[a:b], t[a:b])
            alpha, beta, r, j = fits[a, b]
            start = 0.0 if a == 0 else _boundary(S[a - 1], S[a], segs[-1], (alpha, beta))
            segs.append((start, alpha, beta))
            resids.append(r)
            jacs.append(j)
        rss = float(sum((r**2).sum() for r in resids))
        k = len(bounds) - 1
        return n * math.log(max(rss / n, 1e-18)) + 2 * k * math.log(n), segs, resids, jacs, bounds

    best = None
    candidates = cut_candidates(n)
    for k in range(1, MAX_SEGMENTS + 1):
        if n < k * MIN_POINTS_PER_SEGMENT:
            break
        for cuts in itertools.combinations(candidates, k - 1):
            got = evaluate([0, *cuts, n])
            if got is not None and (best is None or got[0] < best[0]):
                best = got
    if best is None:  # fewer points than one segment needs: a single least-squares line
        alpha, beta, r, j = _fit_segment(S, t)
        return [(0.0, alpha, beta)], [r], [j]
    step = max(b - a for a, b in zip(candidates, candidates[1:])) if len(candidates) > 1 else 1
    while step > 1:
        step = max(1, step // 8)
        for c in range(1, len(best[4]) - 1):  # each inner boundary in turn, the others where they are
            for d in (i * step for i in range(-8, 9) if i):
                bounds = list(best[4])
                bounds[c] += d
                if bounds[c - 1] < bounds[c] < bounds[c + 1]:
                    got = evaluate(bounds)
                    if got is not None and got[0] < best[0]:
                        best = got
    return best[1], best[2], best[3]


def predict(segments, nbytes: float) -> float:
    return segmented_time(segments, nbytes)


def fit_collective(
    op: str, nodes: int, gpus_per_node: int, points: list[tuple[float, float]], source: str
) -> CollectiveFit:
    sizes = [p[0] for p in points]
    times = [p[1] for p in points]
    segments, resids, jacs = fit_segments(sizes, times)
    all_rel = np.concatenate(resids)
    holdout, held = None, 0
    order = np.argsort(sizes)
    if len(points) >= 2 * MIN_POINTS_PER_SEGMENT:
        train = [points[i] for i in order[::2]]
        test = [points[i] for i in order[1::2]]
        tseg, _, _ = fit_segments([p[0] for p in train], [p[1] for p in train])
        errs = [abs(predict(tseg, s) / t - 1) for s, t in test]
        holdout, held = max(errs), len(test)
    cis = [_ci95(j, r) for j, r in zip(jacs, resids)]
    quality = FitQuality(
        points=len(points),
        residual_rms_rel=float(np.sqrt((all_rel**2).mean())),
        holdout_max_rel_error=holdout,
        holdout_points=held,
        alpha_ci95_s=[c[0] for c in cis],
        beta_ci95_s_per_byte=[c[1] for c in cis],
    )
    p = nodes * gpus_per_node
    table = [
        (
            float(S),
            S / t * busbw_factor(op, p) / 1e9
            if op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
            else S / t / 1e9,
        )
        for S, t in sorted(points)
    ]
    return CollectiveFit(
        op=op,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        segments=segments,
        source=source,
        quality=quality,
        busbw_by_size=table,
    )


def fit_collectives(records: list[dict], source: str) -> list[CollectiveFit]:
    groups: dict[tuple, list[tuple[float, float]]] = {}
    for r in records:
        groups.setdefault((r["op"], r["nodes"], r["gpus_per_node"]), []).append(
            (float(r["bytes"]), float(r["median_s"]))
        )
    return [fit_collective(op, nodes, g, pts, source) for (op, nodes, g), pts in sorted(groups.items())]


def _largest(records: list[dict], key: str) -> dict:
    return max(records, key=lambda r: r[key])


def _fit_compute(profile: dict, raw: dict, notes: FitNotes) -> None:
    """The GEMM rates by size, the largest, and the GEMM shape model, per precision; a precision the
    shape model cannot fit (compute_fit.py) keeps none of them."""
    gemm = raw.get("gemm") or []
    if not gemm:
        return
    by_prec: dict[str, list] = {}
    for r in gemm:
        by_prec.setdefault(r["precision"], []).append((int(r["m"]), r["flops"] / r["median_s"] / 1e12))
    profile["gemm_tflops_by_size"] = {k: sorted(v) for k, v in by_prec.items()}
    profile["matmul_tflops"] = {k: max(v)[1] for k, v in profile["gemm_tflops_by_size"].items()}
    memory = raw.get("memory")
    memory_gbs = (
        _largest(memory, "bytes")["traffic_bytes"] / _largest(memory, "bytes")["median_s"] / 1e9
        if memory
        else None
    )
    profile["compute_model"] = fit_gemm_model(gemm, memory_gbs, notes)
    for prec in list(profile["matmul_tflops"]):
        if f"GEMM {prec}" in notes.left:  # refused: none of its rates either
            drop_precision(profile, prec)


def build_profile(raw: dict, cluster=None, name_unfitted_network: bool = False) -> dict:
    """A profile (as a dict, validated by the caller) from a raw measurement file.

    ``cluster`` (a ClusterSpec) names the hardware the collectives ran on; with it, or when the raw
    file records its network, the collective model's parameters are fitted too (network_fit.py).
    ``name_unfitted_network``: where neither says, list the collective model among the blocks left at
    defaults (`calibrate fit` of a file whose sweep says nothing of its network: ``calibrate check``
    asks for --cluster there, so fit says why it fitted no model rather than passing over it).

    Stalled measurements (screen.py) and outlying GEMM shapes (compute_fit.py) are not fitted; a block
    no fit explains, or whose rate no such device runs at (plausible.py), is left out so the simulator
    keeps its defaults for it. The profile's provenance lists both (``dropped``, ``defaults``); the
    profile's ``raw`` keeps every measurement as taken."""
    taken = raw
    raw, notes = screen(raw)
    prov = dict(raw.get("provenance") or {"source": "unknown"})
    device = prov.pop("catalog_device", None) or raw.get("device_name") or "cpu"
    profile: dict = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "device": device,
        "provenance": {k: v for k, v in prov.items() if k in PROFILE_FIELDS},
    }
    profile["provenance"].update(_measured_on(taken))
    _fit_compute(profile, raw, notes)
    if raw.get("memory"):
        big = _largest(raw["memory"], "bytes")
        profile["memory_gbs"] = big["traffic_bytes"] / big["median_s"] / 1e9
    kernels: dict[str, dict] = {}
    for r in raw.get("kernels") or []:
        if r["name"] not in kernels or r["elements"] > kernels[r["name"]]["elements"]:
            kernels[r["name"]] = r
    profile["kernels_gbs"] = {k: r["bytes"] / r["median_s"] / 1e9 for k, r in sorted(kernels.items())}
    host: dict = {}
    if raw.get("host_adam"):
        host["cpu_adam_params_per_s"] = {int(r["threads"]): r["params_per_s"] for r in raw["host_adam"]}
    if raw.get("host_copies"):
        copies: dict[str, dict] = {}
        for r in raw["host_copies"]:
            key = f"{r['direction']}_{'pinned' if r['pinned'] else 'pageable'}"
            if key not in copies or r["bytes"] > copies[key]["bytes"]:
                copies[key] = r
        host["copy_gbs"] = {k: r["bytes"] / r["median_s"] / 1e9 for k, r in copies.items()}
    profile["host"] = host
    refuse_implausible(profile, notes, copies_timed=bool(taken.get("memory")))
    profile["provenance"]["commands"] = [command_record(profile["provenance"], _what_run_wrote(profile, raw))]
    # A single rank moves no data between devices: its "collective" times are launch latency, not
    # bandwidth, so one-rank records are never fitted (launch_latency_s carries them).
    shared = [r for r in raw.get("collectives") or [] if int(r["nodes"]) * int(r["gpus_per_node"]) > 1]
    if shared:
        src = f"{raw.get('backend', 'torch.distributed')} sweep, {prov.get('source', '')}".strip(", ")
        profile["collectives"] = [f.model_dump() for f in fit_collectives(shared, src)]
        spec = measured_cluster(raw, cluster)
        if spec is not None:
            backend = "nccl" if str(raw.get("backend", "nccl")).startswith("nccl") else str(raw["backend"])
            network = fit_network(shared, spec, backend, src)
            if network is not None:
                profile["network"] = network
        elif name_unfitted_network:
            notes.leave(
                "collective model",
                "the file does not say what network it ran on (topology.network), so only the measured "
                "shapes are fitted; pass --cluster with a scenario describing the hardware to fit it",
            )
    if notes.dropped:
        profile["provenance"]["dropped"] = notes.dropped
    if notes.defaults:
        profile["provenance"]["defaults"] = notes.defaults
    if raw.get("launch_latency_s") is not None:
        profile["launch_latency_s"] = raw["launch_latency_s"]
    profile["raw"] = {
        k: taken[k]
        for k in (
            "gemm",
            "memory",
            "kernels",
            "host_adam",
            "host_copies",
            "collectives",
            "collectives_skipped",
            "topology",
        )
        if taken.get(k)
    }
    return profile


def _measured_on(raw: dict) -> dict:
    """The provenance's record of the emulated testbed the sweep ran on and of what it swept (each
    where there is one)."""
    found = {"testbed": testbed_record(raw), "collective_sweep": collective_sweep(raw.get("collectives"))}
    return {k: v for k, v in found.items() if v is not None}


def _what_run_wrote(profile: dict, raw: dict) -> str:
    """What a fitted raw file put in the profile, in words (its command record's ``wrote``)."""
    parts = []
    if profile.get("matmul_tflops") or profile.get("memory_gbs") or profile.get("kernels_gbs"):
        parts.append("hardware rates (GEMMs, copies, kernels)")
    if any(int(r["nodes"]) * int(r["gpus_per_node"]) > 1 for r in raw.get("collectives") or []):
        parts.append("collective fits")
    return " and ".join(parts) or "no measurements"
