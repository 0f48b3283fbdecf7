"""The results folder of a sweep: written as rows finish, safe to resume, refuses another sweep.

  results/sweep.json        what was swept (name, fingerprint, axes, base scenario, steps)
  results/results.csv       one line per finished row, appended and flushed as each row finishes
  results/scenarios.jsonl   the resolved scenario of every finished row

A crash loses at most the rows still in flight; a re-run reads results.csv and skips them. A write
that fails (a full disk, a file-size limit) is undone; whatever a crash or a failed undo leaves (a
line cut short, a header never completed, an empty file) is repaired when the sweep resumes: only
whole lines after a whole header are ever kept.
"""

from __future__ import annotations

import csv
import fcntl
import json
import math
import os
import re
import socket
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from clustersim.errors import InputError
from clustersim.io import read_input_text, read_jsonl, read_structured_file, write_json_atomically

METRICS = [
    "status",
    "error",
    "world_size",
    "nodes",
    "gpus_per_node",
    "gpu",
    "model",
    "optimizer",
    "nic_kind",
    "nic_gbps",
    "nic_effective_gbps",
    "iteration_time_s",
    "warmup_iteration_time_s",
    "samples_per_s",
    "forward_s",
    "backward_s",
    "compression_s",
    "optimizer_s",
    "other_s",
    "exposed_communication_s",
    "exposed_host_s",
    "idle_s",
    "intra_node_bytes",
    "inter_node_bytes",
    "gpu_memory_bytes",
    "micro_batch_used",
    "global_batch",
    "steps",
    "time_to_train_s",
    "iteration_time_p10_s",
    "iteration_time_p90_s",
    "time_to_train_p10_s",
    "time_to_train_p90_s",
    "gpu_hours",
    "hottest_link",  # flow backend rows (training.network: flow): the busiest link and its utilisation
    "hottest_link_utilisation",
    "nic_count",  # NICs per node (last: a results file written before it resumes without it)
    "mfu",  # model FLOPs utilisation and, for a transformer, tokens/s per GPU (run's model_flops)
    "tokens_per_s_per_gpu",
]
# Columns every results file has had since sweeps began; reports and resumes read them by name (a file
# without one was edited by hand: a renamed column is refused, not read as a KeyError).
REQUIRED_COLUMNS = ("row_id", "status", "world_size", "gpu", "optimizer", "iteration_time_s")


def check_results_path(path: Path) -> None:
    """``--out`` can be a results folder: a folder or nothing yet, created in a folder that exists (as
    ``--out`` of every command, no parent folder is created silently: ``mkdir -p results`` first)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError("is a file; --out names the results folder", source=str(path))
    parent = path.absolute().parent
    if not parent.is_dir():
        what = "is not a folder" if parent.exists() else "does not exist"
        raise InputError(f"cannot create the results folder: {path.parent} {what}", source=str(path))


LOCK_NAME = ".lock"
FILES = ("sweep.json", "results.csv", "scenarios.jsonl", LOCK_NAME)


def check_regular_files(folder: Path) -> None:
    """The folder's own files must be plain files: opening a named pipe (or a device) put in their place
    waits for a writer forever, so it is refused before anything opens it (stat does not block)."""
    for name in FILES:
        path = Path(folder) / name
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise InputError(f"cannot read ({exc.strerror})", source=str(path)) from None
        if not stat.S_ISREG(mode):
            raise InputError(
                "is not a regular file (a named pipe or a device?); use another --out", source=str(path)
            )


class ResultsFolder:
    def __init__(self, path: Path, sweep):
        self.path = Path(path)
        self.sweep = sweep
        self.axes = [a for a in sweep.axes if a not in METRICS]
        self.columns = ["row_id", *self.axes, *METRICS]

    @property
    def csv_path(self) -> Path:
        return self.path / "results.csv"

    def open(self) -> set[str]:
        """Create or reopen the folder; returns the ids of rows already finished."""
        meta_path = self.path / "sweep.json"
        check_results_path(self.path)
        if self.path.is_dir():
            check_regular_files(self.path)
        meta = {
            "format": "clustersim-sweep-results",
            "format_version": 1,
            "name": self.sweep.spec.name,
            "fingerprint": self.sweep.fingerprint(),
            "axes": self.sweep.axes,
            "source": self.sweep.source,
            "steps": self.sweep.spec.steps,
            "warmup": self.sweep.spec.warmup,
            "global_batch": self.sweep.spec.global_batch,
            "samples": self.sweep.spec.samples,
            "base": self.sweep.base.model_dump(mode="json"),
            "rows": len(self.sweep.rows()),  # a report of fewer says the sweep is unfinished
        }
        if meta_path.exists():
            old = _read_meta(meta_path)
            if old.get("fingerprint") != meta["fingerprint"]:
                raise InputError(_other_sweep(old, meta), source=str(self.path))
        elif self.path.exists() and any(p.name != LOCK_NAME for p in _listing(self.path)):
            raise InputError(
                "folder is not empty and is not a clustersim sweep's results; use another --out",
                source=str(self.path),
            )
        self.path.mkdir(exist_ok=True)
        if not meta_path.exists():
            write_json_atomically(meta_path, meta)
        return {r["row_id"] for r in self.read_rows()}

    @contextmanager
    def locked(self):
        """Hold the folder for one sweep: a second sweep into it (another shell, another machine on a
        shared file system that honours flock) is refused instead of writing every row twice. The lock
        goes with the process, so a crashed sweep never leaves the folder locked."""
        check_results_path(self.path)
        try:
            self.path.mkdir(exist_ok=True)
        except OSError as exc:  # a parent that is read-only (or not ours): one line, nothing written
            raise InputError(
                f"cannot create the results folder ({_why(exc)}); nothing written", source=str(self.path)
            ) from None
        check_regular_files(self.path)
        try:
            fh = (self.path / LOCK_NAME).open("a+")
        except OSError as exc:  # a folder that is read-only (or not ours)
            raise InputError(
                f"cannot write in this folder ({_why(exc)}: {LOCK_NAME}); nothing written",
                source=str(self.path),
            ) from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise InputError(
                f"another sweep ({holder}) is writing into this folder; "
                "wait for it to finish or use another --out",
                source=str(self.path),
            ) from None
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"pid {os.getpid()} on {socket.gethostname()}")
            fh.flush()
            yield self
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()

    def _header(self) -> list[str]:
        with self.csv_path.open(newline="") as fh:
            return next(csv.reader(fh), [])

    def read_rows(self) -> list[dict[str, str]]:
        """Finished rows, one per row id (two sweeps that once ran into one folder wrote some twice)."""
        if not self.csv_path.exists() or _whole_lines_end(self.csv_path) == 0:
            return []  # nothing whole yet: a header cut short by a full disk or a crash is rewritten
        return _unique(_csv_lines(self.csv_path, tolerate_cut=True)[1])

    def append(self, records: list[dict[str, Any]]) -> None:
        """Append rows; a failed write (disk full) is undone, so no half line is left behind."""
        jsonl = self.path / "scenarios.jsonl"
        _drop_cut_line(self.csv_path)
        _drop_cut_line(jsonl)
        new = not self.csv_path.exists() or self.csv_path.stat().st_size == 0
        size = 0 if new else self.csv_path.stat().st_size
        jsonl_size = jsonl.stat().st_size if jsonl.exists() else 0
        # A folder begun by an older clustersim keeps its own columns (newer metrics are left out of it)
        columns = self.columns if new else self._header() or self.columns
        try:
            with self.csv_path.open("a", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
                if new:
                    writer.writeheader()
                for rec in records:
                    writer.writerow(rec)
                fh.flush()
                os.fsync(fh.fileno())
            with jsonl.open("a") as fh:
                for rec in records:
                    fh.write(json.dumps({"row_id": rec["row_id"], "scenario": rec.get("scenario")}) + "\n")
                fh.flush()
        except OSError as exc:
            for path, keep in ((self.csv_path, size), (jsonl, jsonl_size)):
                if path.exists():  # shrinking a file needs no space; a failure here is repaired on resume
                    with path.open("r+") as fh:
                        fh.truncate(keep)
            raise InputError(
                f"cannot write ({exc.strerror or exc.__class__.__name__}); the rows finished so far are kept "
                "and a re-run resumes from them",
                source=str(self.csv_path),
            ) from None


def _why(exc: OSError) -> str:
    """What the system said about a failed file operation ("Permission denied", "Read-only file system")."""
    return exc.strerror or exc.__class__.__name__


def _listing(folder: Path) -> list[Path]:
    """The folder's entries; a folder this process may not read is one line naming it."""
    try:
        return list(folder.iterdir())
    except OSError as exc:
        raise InputError(
            f"cannot read this folder ({_why(exc)}); nothing written", source=str(folder)
        ) from None


def _whole_lines_end(path: Path) -> int:
    """The length of ``path`` up to and including its last newline: what a crash or a full disk left
    whole (a last line without its newline was cut short). A file this process may not read is one
    line naming it (PermissionError ended a report in a traceback)."""
    try:
        with path.open("rb") as fh:
            return _whole_lines_in(fh)
    except OSError as exc:
        raise InputError(f"cannot read ({_why(exc)})", source=str(path)) from None


def _whole_lines_in(fh) -> int:
    """_whole_lines_end of an open file."""
    fh.seek(0, os.SEEK_END)
    end = fh.tell()
    if end == 0:
        return 0
    fh.seek(end - 1)
    if fh.read(1) == b"\n":
        return end
    # the cut line is at most one batch of rows long: look back in blocks, not at the whole file
    block = 1 << 16
    pos = end
    while pos > 0:
        start = max(0, pos - block)
        fh.seek(start)
        nl = fh.read(pos - start).rfind(b"\n")
        if nl >= 0:
            return start + nl + 1
        pos = start
    return 0


def _drop_cut_line(path: Path) -> None:
    """A crash mid-write leaves a last line without its newline; its row is re-run, so remove it
    before appending (or the next row would be glued to it). A header cut short leaves an empty file,
    which the next append starts again with a header."""
    if not path.exists():
        return
    keep = _whole_lines_end(path)
    if keep != path.stat().st_size:
        with path.open("rb+") as fh:
            fh.truncate(keep)


def _unique(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seen: set = set()
    out = []
    for r in rows:
        if r["row_id"] not in seen:
            seen.add(r["row_id"])
            out.append(r)
    return out


def _csv_lines(path: Path, tolerate_cut: bool) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of results.csv. A line with the wrong number of fields is refused with its line
    number; a last line cut short by a crash is dropped when ``tolerate_cut`` (a re-run redoes it)."""
    text = read_input_text(path)
    lines = list(csv.reader(text.splitlines()))
    if not lines or "row_id" not in lines[0] or "status" not in lines[0]:
        raise InputError("line 1: not a clustersim results header", source=str(path))
    header = lines[0]
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise InputError(
            f"line 1: not a clustersim results header (no {', '.join(missing)} column)", source=str(path)
        )
    rows = []
    cut = not text.endswith("\n")
    for i, fields in enumerate(lines[1:], start=2):
        if len(fields) != len(header):
            if cut and i == len(lines):
                if tolerate_cut:
                    continue
                raise InputError(
                    f"line {i} is cut short (an interrupted sweep?); run the sweep again to complete it",
                    source=str(path),
                )
            raise InputError(
                f"line {i}: {len(fields)} fields where the header has {len(header)}; not a results row",
                source=str(path),
            )
        rows.append(dict(zip(header, fields)) | {"_line": i})
    return header, rows


_TEXT = {"row_id", "status", "error", "gpu", "model", "optimizer", "nic_kind", "hottest_link"}
_INTS = ("world_size", "nodes", "gpus_per_node", "steps", "global_batch", "micro_batch_used", "nic_count")
# A cell the writer wrote from a Python int ("16"; a float is written "16.0"): a count, read back as one
_INT_TEXT = re.compile(r"[+-]?[0-9]+")


def _read_meta(meta_path: Path) -> dict:
    try:
        meta = read_structured_file(meta_path, fmt="json")
    except InputError as exc:
        raise InputError(
            f"corrupt ({exc.message}); run the sweep again into a new --out", source=str(meta_path)
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != "clustersim-sweep-results":
        raise InputError(
            'not a clustersim sweep description (no "format": "clustersim-sweep-results")',
            source=str(meta_path),
        )
    return meta


def _typed_row(r: dict[str, str], axes: set, csv_path: Path) -> dict[str, Any]:
    line = r.pop("_line")
    if r["status"] not in ("ok", "invalid"):
        raise InputError(
            f"line {line}: status {r['status']!r} is neither ok nor invalid", source=str(csv_path)
        )
    typed: dict[str, Any] = {}
    for k, v in r.items():
        if v == "" or k in _TEXT:
            typed[k] = v if v != "" else None
            continue
        try:
            x = float(v)
        except ValueError:
            # an axis of names (gpu, fabric, ...) holds text; a metric column never does, even where it
            # is also an axis (nic_gbps, nic_count: a report formats them as numbers)
            if k not in axes or k in METRICS:
                raise InputError(f"line {line}: {k} {v!r} is not a number", source=str(csv_path)) from None
            typed[k] = v  # an axis of names (gpu, fabric, ...)
            continue
        if not math.isfinite(x):
            raise InputError(f"line {line}: {k} is {v}, not a finite number", source=str(csv_path))
        if x < 0 and k in METRICS:  # times, rates, bytes and counts: a sweep never writes a negative
            raise InputError(f"line {line}: {k} is {v}, a negative number", source=str(csv_path))
        if _INT_TEXT.fullmatch(v):  # gpus, nic_count, a micro_batch axis: 16, not 16.0
            typed[k] = int(v)
        else:
            typed[k] = int(x) if k in _INTS and x.is_integer() else x
    if typed["status"] == "ok":
        _check_ran(typed, line, csv_path)
    return typed


# What simulate_row writes in every row that ran (status ok), which reports divide by and format: a
# row of a hand-edited file without one, or with a count that is not a positive whole number or a time
# or rate of zero, is refused with its line (it ended in ZeroDivisionError or a TypeError).
_RAN_COUNTS = ("world_size", "nodes", "gpus_per_node")
_RAN_TEXT = ("gpu", "optimizer")
_RAN_POSITIVE = ("iteration_time_s", "samples_per_s")


def _check_ran(row: dict[str, Any], line: int, csv_path: Path) -> None:
    for k in (*_RAN_COUNTS, *_RAN_TEXT, *_RAN_POSITIVE):
        if k not in row:  # a column this file has not got (an older file): REQUIRED_COLUMNS says which must
            continue
        v = row[k]
        if v is None:
            why = "is empty in a row that ran (status ok)"
        elif k in _RAN_COUNTS and (not isinstance(v, int) or v < 1):
            why = f"is {v}, not a positive whole number"
        elif k in _RAN_POSITIVE and v <= 0:
            why = f"is {v}, not a positive number"
        else:
            continue
        raise InputError(f"line {line}: {k} {why}", source=str(csv_path))


def read_results(path: Path) -> tuple[dict, list[dict[str, Any]]]:
    """Load a results folder for reports: metadata and typed rows. Anything that is not what a sweep
    writes (a corrupt sweep.json, a garbage line, a NaN cell) is refused with its file and line."""
    path = Path(path)
    meta_path = path / "sweep.json"
    if not meta_path.exists():
        raise InputError("not a sweep results folder (no sweep.json)", source=str(path))
    check_regular_files(path)
    meta = _read_meta(meta_path)
    csv_path = path / "results.csv"
    if not csv_path.exists() or _whole_lines_end(csv_path) == 0:
        raise InputError(
            "no results.csv with a whole header: the sweep has not finished any row (a full disk?); "
            "run it again",
            source=str(path),
        )
    _, raw = _csv_lines(csv_path, tolerate_cut=False)
    axes = set(meta.get("axes") or [])
    rows = [_typed_row(r, axes, csv_path) for r in _unique(raw)]
    scenarios = {}
    jsonl = path / "scenarios.jsonl"
    if jsonl.exists():
        for n, item in read_jsonl(jsonl):
            if not isinstance(item, dict) or not isinstance(item.get("row_id"), str):
                raise InputError(f"line {n}: not a scenario record (no row_id)", source=str(jsonl))
            if item.get("scenario") is None:  # a row that could not be built (status invalid)
                continue
            if not isinstance(item["scenario"], dict):
                raise InputError(f"line {n}: the scenario is not a mapping", source=str(jsonl))
            scenarios[item["row_id"]] = item["scenario"]
    meta["scenarios"] = scenarios
    return meta, rows


def _other_sweep(old: dict, new: dict) -> str:
    """Why a results folder cannot take this sweep: what differs, when the folder says."""
    if old.get("name") == new["name"]:
        changed = [
            f"{k} {old.get(k)!r} there, {new[k]!r} now"
            for k in ("axes", "steps", "warmup", "global_batch", "samples")
            if k in old and old.get(k) != new[k]
        ]
        if old.get("base") != new["base"]:
            changed.append("another base scenario (or profile)")
        what = "; ".join(changed) or "other values, options or catalogs"
        return (
            f"this results folder holds sweep {new['name']!r} run with other settings ({what}); "
            "resume with the same settings or use another --out"
        )
    return (
        f"this results folder holds another sweep ({old.get('name')!r}, fingerprint "
        f"{old.get('fingerprint')}); use another --out"
    )
