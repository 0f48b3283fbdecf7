"""Where the width of a calibrated collective's band comes from: the shipped testbed sweeps.

Two measurements, both on the raw sweeps under clustersim/validation/testbed (the 1-32 MiB 8-host
files and the 4 KiB-8 MiB sweeps stored in every `testbed validate` run):

1. **Session to session.** Nine sweeps of one machine (quarter-core hosts at 200 Mb/s) and three more
   (no CPU share): how far a collective's median moved between sessions (log-sd across the files)
   against one repetition's spread within a session (its P10-P90 as a lognormal's), by size. A
   prediction is one more session, so its band holds the within-session spread
   (network_fit.measured_spread) where the two agree. Also how the sessions' shifts correlate between
   ops and sizes (network_params.NetworkParams.op_z: one normal per op).

2. **Past the largest measured size.** Each sweep fitted on its small sizes only (up to 1/8 and 1/64 of
   its largest, on 2 hosts and on 2+4 hosts) predicts its larger measured sizes; the band without any
   growth (SIZE_EXTRAPOLATION_SIGMA = 0) is widened by g per e-fold of the ratio, and the g at which 80%
   of the measured medians fall inside the P10-P90 is reported (network_params.SIZE_EXTRAPOLATION_SIGMA).

    PYTHONPATH=. python benchmarks/network_band_evidence.py        # about a minute on 2 cores
"""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path

import numpy as np

from clustersim.calibration import network_fit as nf
from clustersim.cost_models import network_params

TESTBED = Path(__file__).resolve().parent.parent / "clustersim" / "validation" / "testbed"
SHARED = [
    "mlp-200mbit-1",
    "mlp-200mbit-2",
    "transformer-200mbit-1",
    "transformer-200mbit-2",
    "transformer-200mbit-3",
    "paired-mlp-200mbit-1",
    "paired-mlp-200mbit-2",
    "paired-transformer-200mbit-1",
    "paired-transformer-200mbit-2",
]
UNSHARED = ["mlp-zero3-200mbit-1", "mlp-zero3-200mbit-2", "mlp-zero3-200mbit-3"]
SWEEPS = ["gloo-8hosts-200mbit", "gloo-8hosts-400mbit", "mlp-1gbit", *SHARED, *UNSHARED]
SWEEPS.append("mlp-zero3-200mbit-shares")


def _raw(name: str) -> dict:
    data = json.loads((TESTBED / f"{name}.json").read_text())
    return data.get("sweep") or data


def sessions() -> None:
    print("1. session-to-session shift of a median vs one repetition's spread within a session")
    for label, names in (("quarter-core hosts", SHARED), ("no CPU share", UNSHARED)):
        medians, spread = collections.defaultdict(list), collections.defaultdict(list)
        for name in names:
            for r in _raw(name)["collectives"]:
                key = (r["op"], r["nodes"], r["bytes"])
                medians[key].append(math.log(r["median_s"]))
                spread[key].append(nf._sample_sigma(r) or 0.0)
        for lo, hi in ((0, 64 << 10), (64 << 10, 1 << 20), (1 << 20, 1 << 40)):
            keys = [k for k in medians if lo <= k[2] < hi]
            between = float(np.median([np.std(medians[k], ddof=1) for k in keys]))
            within = float(np.median([np.median(spread[k]) for k in keys]))
            sizes = f"{lo >> 10:>5d} KiB-{min(hi, 1 << 30) >> 10:>7d} KiB"
            print(
                f"  {label:18s} {sizes}: between sessions {between:.3f}, within {within:.3f} "
                f"(ratio {between / within:.2f}, {len(names)} sessions)"
            )
    # how the sessions' shifts correlate between ops and size ranges (the quarter-core sessions)
    logs = {}
    for name in SHARED:
        for r in _raw(name)["collectives"]:
            logs.setdefault((r["op"], r["nodes"], r["bytes"]), []).append(math.log(r["median_s"]))
    dev = {k: np.asarray(v) - np.mean(v) for k, v in logs.items()}
    groups = {
        "all_reduce >= 1 MiB": lambda k: k[0] == "all_reduce" and k[2] >= 1 << 20,
        "all_gather >= 1 MiB": lambda k: k[0] == "all_gather" and k[2] >= 1 << 20,
        "all_gather < 64 KiB": lambda k: k[0] == "all_gather" and k[2] < 64 << 10,
    }
    shift = {g: np.mean([dev[k] for k in dev if f(k)], axis=0) for g, f in groups.items()}
    names = list(shift)
    corr = np.corrcoef([shift[g] for g in names])
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            print(f"  correlation of session shifts, {names[i]} / {names[j]}: {corr[i, j]:+.2f}")


def extrapolation() -> None:
    print("2. fitted on small sizes, predicting the larger measured ones")
    saved = network_params.SIZE_EXTRAPOLATION_SIGMA
    network_params.SIZE_EXTRAPOLATION_SIGMA = 0.0  # the band without growth; g is added below
    rows = []
    try:
        for name in SWEEPS:
            raw = _raw(name)
            spec = nf.measured_cluster(raw)
            points = nf.points_from(raw["collectives"], spec, name)
            largest = max(p.nbytes for p in points)
            for nodes in ((2,), (2, 4)):
                for div in (8, 64):
                    pts = [p for p in points if p.shape.nodes in nodes and p.shape.gpus_per_node == 1]
                    train = [p for p in pts if p.nbytes <= largest / div]
                    test = [p for p in pts if p.nbytes > largest / div]
                    if len({p.nbytes for p in train}) < 3 or not test:
                        continue
                    top = max(p.nbytes for p in train)
                    for r in nf.check_holdout(train, test, "gloo", spec.nic.kind, samples=64):
                        rows.append(
                            {
                                "clean": name.startswith("gloo-8hosts"),
                                "div": div,
                                "error": math.log(r["predicted_s"] / r["measured_s"]),
                                "sigma": math.log(r["p90_s"] / r["p10_s"]) / (2 * nf.Z90),
                                "ratio": r["bytes"] / top,
                            }
                        )
    finally:
        network_params.SIZE_EXTRAPOLATION_SIGMA = saved

    def coverage(sel, g):
        return float(
            np.mean(
                [abs(r["error"]) <= nf.Z90 * math.hypot(r["sigma"], g * math.log(r["ratio"])) for r in sel]
            )
        )

    def needed(sel):
        return next((g for g in np.arange(0, 2, 0.005) if coverage(sel, g) >= 0.8), float("nan"))

    for label, sel in (
        ("all sweeps", rows),
        ("fitted up to 1/8 of the largest", [r for r in rows if r["div"] == 8]),
        ("fitted up to 1/64 of the largest", [r for r in rows if r["div"] == 64]),
        ("1-32 MiB files", [r for r in rows if r["clean"]]),
        ("4 KiB-8 MiB sweeps", [r for r in rows if not r["clean"]]),
    ):
        print(
            f"  {label}: {len(sel)} predictions, inside P10-P90 without growth {coverage(sel, 0):.0%}, "
            f"with {saved:g}/e-fold {coverage(sel, saved):.0%}; 80% needs {needed(sel):.3f}"
        )


if __name__ == "__main__":
    sessions()
    extrapolation()
