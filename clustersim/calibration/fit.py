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
from clustersim.calibration.profile import FORMAT, FORMAT_VERSION, CollectiveFit, FitQuality
from clustersim.cost_models.closed_forms import busbw_factor
from clustersim.cost_models.measured_collectives import segmented_time

MAX_SEGMENTS = 3
MIN_POINTS_PER_SEGMENT = 4


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
    """Best segmentation by BIC. Returns segments (min_bytes, α, β) plus residuals and jacobians."""
    order = np.argsort(sizes)
    S, t = np.asarray(sizes, float)[order], np.asarray(times, float)[order]
    n = len(S)
    best = None
    for k in range(1, MAX_SEGMENTS + 1):
        if n < k * MIN_POINTS_PER_SEGMENT:
            break
        for cuts in itertools.combinations(
            range(MIN_POINTS_PER_SEGMENT, n - MIN_POINTS_PER_SEGMENT + 1), k - 1
        ):
            bounds = [0, *cuts, n]
            if any(b - a < MIN_POINTS_PER_SEGMENT for a, b in zip(bounds, bounds[1:])):
                continue
            segs, resids, jacs = [], [], []
            for a, b in zip(bounds, bounds[1:]):
                alpha, beta, r, j = _fit_segment(S[a:b], t[a:b])
                start = 0.0 if a == 0 else _boundary(S[a - 1], S[a], segs[-1], (alpha, beta))
                segs.append((start, alpha, beta))
                resids.append(r)
                jacs.append(j)
            rss = float(sum((r**2).sum() for r in resids))
            bic = n * math.log(max(rss / n, 1e-18)) + 2 * k * math.log(n)
            if best is None or bic < best[0]:
                best = (bic, segs, resids, jacs)
    if best is None:  # fewer points than one segment needs: a single least-squares line
        alpha, beta, r, j = _fit_segment(S, t)
        return [(0.0, alpha, beta)], [r], [j]
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


def build_profile(raw: dict, cluster=None) -> dict:
    """A profile (as a dict, validated by the caller) from a raw measurement file.

    ``cluster`` (a ClusterSpec) names the hardware the collectives ran on; with it, or when the raw
    file records its network, the collective model's parameters are fitted too (network_fit.py)."""
    prov = dict(raw.get("provenance") or {"source": "unknown"})
    device = prov.pop("catalog_device", None) or raw.get("device_name") or "cpu"
    profile: dict = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "device": device,
        "provenance": {
            k: v
            for k, v in prov.items()
            if k
            in {
                "source",
                "date",
                "device_name",
                "device_count",
                "driver",
                "cuda",
                "torch",
                "nccl",
                "gloo",
                "cpu",
                "host",
            }
        },
    }
    gemm = raw.get("gemm") or []
    if gemm:
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
        profile["compute_model"] = fit_gemm_model(gemm, memory_gbs)
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
    if raw.get("launch_latency_s") is not None:
        profile["launch_latency_s"] = raw["launch_latency_s"]
    profile["raw"] = {
        k: raw[k]
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
        if raw.get(k)
    }
    return profile
