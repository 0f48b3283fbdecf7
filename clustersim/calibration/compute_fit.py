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

Noisy measurements (a loaded host) are handled in three steps: shapes whose log-time residual lies
beyond OUTLIER_MADS median absolute deviations are dropped and the model refitted (the modified
z-score rule of Iglewicz and Hoaglin, 1993, cut at 3.5); a precision whose fit is still no model of its
timings (a scatter beyond MAX_LOG_SIGMA, a parameter no tighter than the profile's bound, a fixed cost
per GEMM of a millisecond or more, fewer than three shapes) is not fitted, so the simulator keeps its
defaults for it, and the reason is reported (``notes``) instead of a profile that fails to load.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import least_squares

from clustersim.calibration.timing import STALL_MIN_S
from clustersim.catalog import limit

PRIOR_LOG_SIGMA = 3.0
#: the modified z-score beyond which a shape is an outlier (Iglewicz & Hoaglin, "How to Detect and
#: Handle Outliers", 1993: |0.6745 (x - median) / MAD| > 3.5)
OUTLIER_MADS = 3.5
#: ... and at least this far off the fit in log time (22%): closer is the timing noise of a shared host
#: (the shipped CPU profile's P90/P10 spread), never a stall, however tight the other shapes sit
OUTLIER_MIN_LOG = 0.2
#: a scatter of log time beyond which the roofline explains nothing: a factor e (2.7x) per sigma. Clean
#: runs scatter 0.02-0.08 (the shipped H200 profile, this project's CPU runs).
MAX_LOG_SIGMA = 1.0
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


def fit_gemm_model(records: list[dict], memory_gbs: float | None, notes=None) -> dict:
    """Per precision: ``r_max_tflops``, ``launch_s``, ``log_sigma``, the held-out error.

    ``notes`` (screen.FitNotes, optional) collects the shapes dropped as outliers and the precisions
    refused (their fit is no model of their timings), each with its reason; without it they are left
    out silently."""
    out = {}
    for prec in sorted({r["precision"] for r in records}):
        rows = [r for r in records if r["precision"] == prec and r.get("median_s", 0) > 0]
        mem_bw = (memory_gbs or 1e3) * 1e9
        fitted = _fit_robust(rows, mem_bw, prec, notes)
        if fitted is None:
            continue
        rows, x, cov, sigma = fitted
        w = np.array([float(r["flops"]) for r in rows])
        b = np.array([_bytes(r) for r in rows])
        t = np.array([float(r["median_s"]) for r in rows])
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


def gemm_label(r: dict) -> str:
    """A GEMM record's name in messages and provenance: ``GEMM bf16 4096x4096x4096``."""
    return f"GEMM {r['precision']} {r['m']}x{r.get('n') or r['m']}x{r.get('k') or r['m']}"


def _fit_robust(rows: list[dict], mem_bw: float, prec: str, notes):
    """The fit of one precision after dropping outlying shapes (OUTLIER_MADS), or None where no fit
    is a model of these timings (then ``notes`` says why)."""
    block = f"GEMM {prec}"
    thinned = notes is not None and block in notes.thinned  # stalls were dropped before the fit
    if len(rows) < 3 and not thinned:  # a few shapes, as measured: too few for a model, no fault
        return None
    for _ in range(3):  # a refit can expose the next outlier; three rounds at most
        if len(rows) < 3:
            if notes is not None:
                notes.leave(block, f"{len(rows)} shape(s) left to fit, 3 needed")
            return None
        w = np.array([float(r["flops"]) for r in rows])
        b = np.array([_bytes(r) for r in rows])
        t = np.array([float(r["median_s"]) for r in rows])
        x, cov, sigma = _fit(w, b, t, mem_bw)
        resid = np.log(t) - np.log(gemm_time(w, b, *np.exp(x), mem_bw))
        med = float(np.median(resid))
        mad = float(np.median(np.abs(resid - med)))
        z = 0.6745 * np.abs(resid - med) / max(mad, 1e-12)
        out = [i for i in range(len(rows)) if z[i] > OUTLIER_MADS and abs(resid[i] - med) > OUTLIER_MIN_LOG]
        if not out or len(rows) - len(out) < 3:
            break
        for i in out:
            if notes is not None:
                off = f"{100 * (math.exp(resid[i] - med) - 1):+.0f}% off the fit of the other shapes"
                notes.drop(block, gemm_label(rows[i]), off)
        rows = [r for i, r in enumerate(rows) if i not in out]
    why = _not_a_model(x, cov, sigma)
    if why:
        if notes is not None:
            notes.leave(block, why)
        return None
    return rows, x, cov, sigma


def _not_a_model(x, cov, sigma: float) -> str | None:
    """Why a fit is no model of the device (None when it is one)."""
    if sigma > MAX_LOG_SIGMA:
        spread = 100 * (math.exp(sigma) - 1)
        return f"scatter of {spread:.0f}% about the fit (log-sigma {sigma:.2f}, at most {MAX_LOG_SIGMA:g})"
    top = limit("profile_log_sigma_max")
    for i, name in enumerate(("peak rate", "fixed cost")):
        sd = math.sqrt(max(float(cov[i][i]), 0.0))
        if sd > top:
            return f"its {name} is undetermined (log-sigma {sd:.2f}, at most {top:g})"
    launch = float(np.exp(x[1]))
    if launch >= STALL_MIN_S:
        return f"a fixed cost of {launch * 1e3:.1f} ms per GEMM is no launch (microseconds) but a stall"
    return None
