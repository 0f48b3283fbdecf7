"""`calibrate check`: fit the collective model on some measurements, predict others, report the error.

This is how a user (and this project) knows whether a calibration transfers: measure 2, 4 and 8 nodes
once, fit on 2 and 4, and see how 8 is predicted, with the share of measurements inside the predicted
P10-P90 band. Raw files taken at different link rates can be mixed: the fitted parameters are
efficiencies of the modelled links, so a fit at one rate predicts another.
"""

from __future__ import annotations

from pathlib import Path

from clustersim.calibration.network_fit import check_holdout, measured_cluster, points_from, summarize_check
from clustersim.calibration.run import read_raw
from clustersim.errors import InputError


def _ranks(text: str | None, key: str) -> set[int] | None:
    if text is None:
        return None
    try:
        values = {int(x) for x in text.split(",") if x.strip()}
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {text!r}", key=key) from None
    if not values or min(values) < 2:
        raise InputError("group sizes must be 2 or more", key=key)
    return values


def _load(paths: list[Path], cluster) -> tuple[list, str, str]:
    points, backends, nics = [], set(), set()
    for path in paths:
        raw = read_raw(path)
        spec = measured_cluster(raw, cluster)
        if spec is None:
            raise InputError(
                "the file does not say what network it ran on (topology.network); pass --cluster "
                "with a scenario describing the hardware",
                source=str(path),
                key="topology.network",
            )
        if not raw.get("collectives"):
            raise InputError("no collective measurements", source=str(path), key="collectives")
        backends.add("nccl" if str(raw.get("backend", "nccl")).startswith("nccl") else str(raw["backend"]))
        nics.add(spec.nic.kind)
        points += points_from(raw["collectives"], spec, str(path))
    if len(backends) > 1 or len(nics) > 1:
        raise InputError(f"the files mix backends {sorted(backends)} or NIC kinds {sorted(nics)}", key="raw")
    return points, backends.pop(), nics.pop()


def run_check(
    train_files: list[Path],
    predict_files: list[Path],
    train_ranks: str | None,
    test_ranks: str | None,
    cluster=None,
) -> dict:
    train_pts, backend, nic = _load(train_files, cluster)
    test_pts = train_pts
    if predict_files:
        test_pts, backend2, nic2 = _load(predict_files, cluster)
        if (backend2, nic2) != (backend, nic):
            raise InputError(
                "--predict files use another backend or NIC kind than the fitted ones", key="--predict"
            )
    train_set = _ranks(train_ranks, "--train-ranks")
    test_set = _ranks(test_ranks, "--test-ranks")
    all_ranks = sorted({p.shape.ranks for p in test_pts})
    if not all_ranks:
        files = predict_files or train_files
        raise InputError(
            "no collective measured across 2 or more ranks, nothing to fit or predict (a single-GPU "
            "calibration measures compute only; `calibrate run --testbed 8` measures collectives)",
            source=", ".join(str(f) for f in files),
            key="collectives",
        )
    if test_set is None:
        test_set = {all_ranks[-1]}
    if train_set is None:
        train_set = {p.shape.ranks for p in train_pts} - (test_set if not predict_files else set())
    train = [p for p in train_pts if p.shape.ranks in train_set]
    test = [p for p in test_pts if p.shape.ranks in test_set]
    if len({p.shape.ranks for p in train}) < 2:
        measured = sorted({p.shape.ranks for p in train_pts})
        raise InputError(
            f"fitting needs measurements at two or more group sizes besides the predicted "
            f"{sorted(test_set)}; {'the files measured' if len(train_files) > 1 else 'the file measured'} "
            f"group sizes {measured} (measure more: "
            "`calibrate run --testbed 8` also measures its first 2 and 4 hosts; or try "
            "clustersim/validation/testbed/gloo-8hosts-200mbit.json)",
            key="--train-ranks",
        )
    if not test:
        raise InputError(f"no measurements at group sizes {sorted(test_set)} to predict", key="--test-ranks")
    rows = check_holdout(train, test, backend, nic)
    return {
        "train_ranks": sorted(train_set),
        "test_ranks": sorted(test_set),
        "backend": backend,
        "rows": rows,
        "summary": summarize_check(rows),
    }
