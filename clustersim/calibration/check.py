"""`calibrate check`: fit the collective model on some measurements, predict others, report the error.

This is how a user (and this project) knows whether a calibration transfers: measure 2, 4 and 8 nodes
once, fit on 2 and 4, and see how 8 is predicted, with the share of measurements inside the predicted
P10-P90 band. Raw files taken at different link rates can be mixed: the fitted parameters are
efficiencies of the modelled links, so a fit at one rate predicts another.

Where the fit has one group size only (the files measured one, or ``--train-ranks`` names one), no
node count can be held out; the check holds out message sizes instead: it fits the sizes up to 1/8 of
the largest measured at that group size and predicts the larger ones, as the evidence for
network_params.SIZE_EXTRAPOLATION_SIGMA did (benchmarks/network_band_evidence.py), and says that the
node-count extrapolation was not checked.

Nothing fitted is reported as held out: a group size both fitted and predicted, or a ``--predict`` file
repeating measurements the fit was given, is refused. The result names each file it fitted and
predicted with the link rate its testbed provenance records, and each row the file it came from.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clustersim.calibration.network_fit import check_holdout, measured_cluster, points_from, summarize_check
from clustersim.calibration.provenance import testbed_record
from clustersim.calibration.run import read_raw
from clustersim.errors import InputError
from clustersim.units import format_bytes, format_link_rate

# The size check fits the sizes up to this fraction of the largest measured and predicts the rest: the
# cut the evidence for SIZE_EXTRAPOLATION_SIGMA used (1/8; 87% of its held-out medians fell inside the
# band without growth, against 58% for 1/64, whose large sizes hit a bottleneck the small ones do not
# show), so the check reads the band where that constant was measured. A 1-32 MiB sweep fits 1-4 MiB.
SIZE_HOLDOUT_FRACTION = 1 / 8
# Sizes per op the size check fits at the least: two fix a line's latency and bandwidth.
MIN_FIT_SIZES = 2


# The shipped sweep the refusals point a user to when their files measured too few group sizes.
SHIPPED_SWEEP = Path(__file__).resolve().parent.parent / "validation" / "testbed" / "gloo-8hosts-200mbit.json"


def _ranks(text: str | None, key: str) -> set[int] | None:
    if text is None:
        return None
    if not text.strip():
        raise InputError("is empty: name one or more group sizes, e.g. 2,4", key=key)
    entries = [x.strip() for x in text.split(",")]
    if "" in entries:
        raise InputError(
            f"{text!r} has an empty entry: name group sizes between the commas, e.g. 2,4", key=key
        )
    try:
        values = {int(x) for x in entries}
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {text!r}", key=key) from None
    if min(values) < 2:
        raise InputError("group sizes must be 2 or more", key=key)
    return values


@dataclass
class _File:
    """One raw file of the check: its name as the output shows it, the link rate its provenance records
    (None where it does not), its usable points and what identifies each measurement."""

    path: Path
    label: str
    rate_gbps: float | None
    points: list


def _describe(files: list[_File]) -> str:
    """Files as the title and ``held_out`` name them: each file's name, with its link rate where known."""
    return ", ".join(f.label + (f" ({format_link_rate(f.rate_gbps)})" if f.rate_gbps else "") for f in files)


def _identity(p) -> tuple:
    """What makes two points the same measurement (a file given twice, or a copy of it)."""
    return (p.op, p.shape.nodes, p.shape.gpus_per_node, p.nbytes, p.time)


def _load(paths: list[Path], cluster) -> tuple[list[_File], str, str]:
    files, backends, nics = [], set(), set()
    names = [p.name for p in paths]
    for path in paths:
        raw = read_raw(path, embedded=True)
        spec = measured_cluster(raw, cluster, str(path))
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
        tb = testbed_record(raw) or {}
        label = path.name if names.count(path.name) == 1 else str(path)
        points = points_from(raw["collectives"], spec, str(path))
        files.append(_File(path, label, tb.get("line_rate_gbps"), points))
    if len(backends) > 1 or len(nics) > 1:
        raise InputError(f"the files mix backends {sorted(backends)} or NIC kinds {sorted(nics)}", key="raw")
    return files, backends.pop(), nics.pop()


def _measured_words(files: list[_File]) -> str:
    return "the files measured" if len(files) > 1 else "the file measured"


def run_check(
    train_files: list[Path],
    predict_files: list[Path],
    train_ranks: str | None,
    test_ranks: str | None,
    cluster=None,
) -> dict:
    train_set = _ranks(train_ranks, "--train-ranks")
    test_set = _ranks(test_ranks, "--test-ranks")
    fitted, backend, nic = _load(train_files, cluster)
    predicted = fitted
    if predict_files:
        predicted, backend2, nic2 = _load(predict_files, cluster)
        if (backend2, nic2) != (backend, nic):
            raise InputError(
                "--predict files use another backend or NIC kind than the fitted ones", key="--predict"
            )
    train_pts = [p for f in fitted for p in f.points]
    test_pts = [p for f in predicted for p in f.points]
    all_ranks = sorted({p.shape.ranks for p in test_pts})
    if not all_ranks:
        files = predict_files or train_files
        raise InputError(
            "no collective measured across 2 or more ranks, nothing to fit or predict (a single-GPU "
            "calibration measures compute only; `calibrate run --testbed 8` measures collectives)",
            source=", ".join(str(f) for f in files),
            key="collectives",
        )
    measured = sorted({p.shape.ranks for p in train_pts})
    if train_set is not None and not train_set <= set(measured):
        raise InputError(
            f"group size(s) {sorted(train_set - set(measured))} were not measured; "
            f"{_measured_words(fitted)} group sizes {measured}",
            source=", ".join(str(f) for f in train_files),
            key="--train-ranks",
        )
    if test_set is not None and not test_set <= set(all_ranks):
        which = predict_files or train_files
        raise InputError(
            f"group size(s) {sorted(test_set - set(all_ranks))} were not measured, nothing to predict "
            f"there; {_measured_words(predicted)} group sizes {all_ranks}",
            source=", ".join(str(f) for f in which),
            key="--test-ranks",
        )
    single = next(iter(train_set)) if train_set is not None and len(train_set) == 1 else None
    if train_set is None and len(measured) == 1:
        single = measured[0]
    if single is not None and (test_set is None or test_set == {single}):
        return _size_check(
            fitted, predicted if predict_files else [], single, train_set is not None, backend, nic
        )
    defaulted = test_set is None
    if test_set is None:
        test_set = {all_ranks[-1]}
    if train_set is None:
        train_set = set(measured) - (test_set if not predict_files else set())
    if not predict_files and train_set & test_set:
        default = " (by default the largest measured)" if defaulted else ""
        raise InputError(
            f"--train-ranks {sorted(train_set)} and --test-ranks {sorted(test_set)}{default} share "
            f"{sorted(train_set & test_set)}: a group size that is fitted is not held out; name group "
            "sizes apart (or --predict other files)",
            key="--test-ranks",
        )
    train = [p for p in train_pts if p.shape.ranks in train_set]
    test = [p for p in test_pts if p.shape.ranks in test_set]
    if len({p.shape.ranks for p in train}) < 2:
        shipped = any(_same(f, SHIPPED_SWEEP) for f in (*train_files, *predict_files))
        try_shipped = "" if shipped else "or try clustersim/validation/testbed/gloo-8hosts-200mbit.json; "
        raise InputError(
            f"fitting needs measurements at two or more group sizes besides the predicted "
            f"{sorted(test_set)}; {_measured_words(fitted)} group sizes {measured} (measure more: "
            f"`calibrate run --testbed 8` also measures its first 2 and 4 hosts; {try_shipped}or "
            "--train-ranks N alone, which checks message sizes held out at N ranks)",
            key="--train-ranks",
        )
    _refuse_in_sample(train, test, fitted, predicted)
    rows = _labelled(check_holdout(train, test, backend, nic), test, fitted + predicted)
    held = f"group sizes {sorted(test_set)}"
    return {
        "mode": "group_sizes",
        "held_out": f"{held} of {_describe(predicted)}" if predict_files else held,
        "train_ranks": sorted(train_set),
        "test_ranks": sorted(test_set),
        "backend": backend,
        **_sources(fitted, predicted),
        "rows": rows,
        "summary": summarize_check(rows),
    }


def _same(path: Path, other: Path) -> bool:
    try:
        return path.resolve() == other.resolve() or path.samefile(other)
    except OSError:
        return False


def _sources(fitted: list[_File], predicted: list[_File]) -> dict:
    """The result's record of which files were fitted and predicted, and their link rates."""

    def listed(files: list[_File]) -> list[dict]:
        return [{"file": f.label, "link_rate_gbps": f.rate_gbps} for f in files]

    return {"fitted": listed(fitted), "predicted": listed(predicted)}


def _labelled(rows: list[dict], test: list, files: list[_File]) -> list[dict]:
    """Each row with the file its measurement came from (``file``) and that file's link rate."""
    owner = {id(p): f for f in files for p in f.points}
    return [
        {**row, "file": owner[id(p)].label, "link_rate_gbps": owner[id(p)].rate_gbps}
        for row, p in zip(rows, test)
    ]


def _refuse_in_sample(train: list, test: list, fitted: list[_File], predicted: list[_File]) -> None:
    """A --predict file that holds measurements the fit was given (the fitted file again, or a copy)
    would be predicted in sample: refused, naming it and the fitted file it repeats."""
    fit_ids, test_ids = {id(p) for p in train}, {id(p) for p in test}
    seen = {_identity(p): f for f in fitted for p in f.points if id(p) in fit_ids}
    for f in predicted:
        again = {seen[_identity(p)].label for p in f.points if id(p) in test_ids and _identity(p) in seen}
        if again:
            raise InputError(
                f"holds the same measurements as the fitted {', '.join(sorted(again))}: predicting them "
                "is no held-out check; leave --predict out to hold out the largest group size (or "
                "--test-ranks) of the fitted files",
                source=str(f.path),
                key="--predict",
            )


def _size_check(
    fitted: list[_File],
    predict: list[_File],
    ranks: int,
    chosen: bool,
    backend: str,
    nic: str,
) -> dict:
    """The check with one group size to fit (``ranks``, measured): fit its sizes up to
    SIZE_HOLDOUT_FRACTION of the largest it measured, predict the larger ones at the same group size
    (of the --predict files ``predict`` where there are any). ``chosen``: --train-ranks named it (else the
    files measured no other)."""
    named = ", ".join(str(f.path) for f in fitted)
    predicted = predict or fitted
    at = [p for f in predicted for p in f.points if p.shape.ranks == ranks]
    if not at:
        measured_there = sorted({p.shape.ranks for f in predicted for p in f.points})
        raise InputError(
            f"the --predict files measured no group of {ranks} ranks (they measured {measured_there}); the "
            "message-size check predicts the fitted group size",
            source=", ".join(str(f.path) for f in predict),
            key="--predict",
        )
    cut = max(p.nbytes for p in at) * SIZE_HOLDOUT_FRACTION
    train = [p for f in fitted for p in f.points if p.shape.ranks == ranks and p.nbytes <= cut]
    test = [p for p in at if p.nbytes > cut]
    for op in sorted({p.op for p in test}):
        sizes = sorted({p.nbytes for p in train if p.op == op})
        if len(sizes) < MIN_FIT_SIZES:
            raise InputError(
                f"{op} at {ranks} ranks has {len(sizes)} message size(s) up to 1/8 of the largest "
                f"({format_bytes(cut)}); the message-size check fits {MIN_FIT_SIZES} or more there and "
                "predicts the larger ones (measure smaller sizes, e.g. --min-bytes, or two or more group "
                "sizes for the node-count check)",
                source=named,
                key="collectives",
            )
    rows = _labelled(check_holdout(train, test, backend, nic), test, fitted + predict)
    why = "--train-ranks names one group size" if chosen else "one group size measured"
    held = f"message sizes above {format_bytes(cut)} at {ranks} ranks"
    return {
        "mode": "message_sizes",
        "held_out": f"{held} of {_describe(predict)}" if predict else held,
        "not_checked": f"node-count extrapolation not checked: {why}",
        "cut_bytes": cut,
        "train_ranks": [ranks],
        "test_ranks": [ranks],
        "backend": backend,
        **_sources(fitted, predicted),
        "rows": rows,
        "summary": summarize_check(rows),
    }
