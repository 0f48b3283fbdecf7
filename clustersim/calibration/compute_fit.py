"""A GEMM model fitted once per device and used for every model on it.

Measured GEMMs of many shapes (square, skinny and flat, as transformer layers have them) are explained
by one roofline with a small-problem cost:

    t = launch + max(W / R_max, bytes / B)

W = 2·m·n·k FLOPs, ``R_max`` the large-problem FLOP rate, ``B`` the device's streaming bandwidth
(measured copies) for GEMMs too thin to be compute-bound, ``launch`` the fixed cost of one call. The
fixed cost is also the small-problem curve: efficiency W / (W + launch·R_max) reaches half at
W = launch·R_max. (A separate "half-efficiency work" term would be the same constant under another
name: it is not identifiable from timings, so it is not fitted.) Fitted by least squares on log time
(relative error), with the covariance of the log-parameters and a held-out check: fitted on the
square shapes, predicting the rectangular ones.
The result's ``log_sigma`` (scatter of log time about the model) is the compute width used for
intervals (simulator/uncertainty.py).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import least_squares

PRIOR_LOG_SIGMA = 3.0
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1}


def _bytes(r: dict) -> float:
    if r.get("bytes"):
        return float(r["bytes"])
    m, n, k = int(r["m"]), int(r.get("n") or r["m"]), int(r.get("k") or r["m"])
    return float(ELEMENT_BYTES.get(r["precision"], 4) * (m * k + k * n + m * n))


def gemm_time(flops, nbytes, r_max: float, launch: float, mem_bw: float):
    return launch + np.maximum(np.asarray(flops) / r_max, np.asarray(nbytes) / mem_bw)


def _fit(w: np.ndarray, b: np.ndarray, t: np.ndarray, mem_bw: float) -> tuple[np.ndarray, np.ndarray, float]:
    x0 = np.log([max(float(np.max(w / t)), 1.0), max(float(np.min(t)) * 0.1, 1e-7)])

    def resid(x):
        r_max, launch = np.exp(x)
        data = np.log(gemm_time(w, b, r_max, launch, mem_bw)) - np.log(t)
        # weak priors (a factor of ~20 either way) keep what few shapes cannot pin down near a start
        # taken from the data itself, with a wide interval rather than a runaway value
        return np.concatenate([data / 0.05, (x - x0) / PRIOR_LOG_SIGMA])

    res = least_squares(resid, x0, method="trf", loss="soft_l1", f_scale=3.0)
    n, k = len(t), 2
    data_r = res.fun[:n] * 0.05
    sigma = 1.4826 * float(np.median(np.abs(data_r))) * math.sqrt(n / max(n - k, 1)) if n > k else 0.1
    try:
        cov = np.linalg.inv(res.jac.T @ res.jac) * max(1.0, (max(sigma, 0.01) / 0.05) ** 2)
    except np.linalg.LinAlgError:
        cov = np.eye(2)
    return res.x, cov, sigma


def fit_gemm_model(records: list[dict], memory_gbs: float | None) -> dict:
    """Per precision: ``r_max_tflops``, ``launch_s``, ``log_sigma``, the held-out error."""
    out = {}
    for prec in sorted({r["precision"] for r in records}):
        rows = [r for r in records if r["precision"] == prec and r.get("median_s", 0) > 0]
        if len(rows) < 3:
            continue
        w = np.array([float(r["flops"]) for r in rows])
        b = np.array([_bytes(r) for r in rows])
        t = np.array([float(r["median_s"]) for r in rows])
        mem_bw = (memory_gbs or 1e3) * 1e9
        x, cov, sigma = _fit(w, b, t, mem_bw)
        square = np.array(
            [int(r["m"]) == int(r.get("n") or r["m"]) == int(r.get("k") or r["m"]) for r in rows]
        )
        holdout = None
        if square.sum() >= 3 and (~square).sum() >= 1:
            xs, _, _ = _fit(w[square], b[square], t[square], mem_bw)
            pred = gemm_time(w[~square], b[~square], *np.exp(xs), mem_bw)
            err = np.abs(pred / t[~square] - 1)
            holdout = {
                "fitted_on": "square shapes",
                "predicted": int((~square).sum()),
                "median_abs_rel_error": float(np.median(err)),
                "max_abs_rel_error": float(err.max()),
            }
        r_max, launch = np.exp(x)
        out[prec] = {
            "r_max_tflops": float(r_max / 1e12),
            "launch_s": float(launch),
            "memory_gbs": float(mem_bw / 1e9),
            "log_sigma": float(sigma),
            "log_covariance": [[float(v) for v in row] for row in cov],
            "points": len(rows),
            "holdout": holdout,
        }
    return out
