"""The results folder of a sweep: written as rows finish, safe to resume, refuses another sweep.

  results/sweep.json        what was swept (name, fingerprint, axes, base scenario, steps)
  results/results.csv       one line per finished row, appended and flushed as each row finishes
  results/scenarios.jsonl   the resolved scenario of every finished row

A crash loses at most the rows still in flight; a re-run reads results.csv and skips them.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

from clustersim.errors import InputError
from clustersim.io import write_json_atomically

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
]


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
            "base": self.sweep.base.model_dump(mode="json"),
        }
        if meta_path.exists():
            try:
                old = json.loads(meta_path.read_text())
            except json.JSONDecodeError:
                raise InputError("sweep.json is corrupt; use another --out", source=str(meta_path)) from None
            if old.get("fingerprint") != meta["fingerprint"]:
                raise InputError(
                    f"this results folder holds another sweep ({old.get('name')!r}, fingerprint "
                    f"{old.get('fingerprint')}); use another --out",
                    source=str(self.path),
                )
        elif self.path.exists() and any(self.path.iterdir()):
            raise InputError(
                "folder is not empty and is not a clustersim sweep's results; use another --out",
                source=str(self.path),
            )
        self.path.mkdir(parents=True, exist_ok=True)
        if not meta_path.exists():
            write_json_atomically(meta_path, meta)
        return {r["row_id"] for r in self.read_rows()}

    def read_rows(self) -> list[dict[str, str]]:
        if not self.csv_path.exists():
            return []
        with self.csv_path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        # a line cut short by a crash mid-write has missing trailing fields: drop it
        return [r for r in rows if r.get(self.columns[-1]) is not None]

    def append(self, records: list[dict[str, Any]]) -> None:
        new = not self.csv_path.exists()
        with self.csv_path.open("a", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=self.columns, extrasaction="ignore")
            if new:
                writer.writeheader()
            for rec in records:
                writer.writerow(rec)
            fh.flush()
            os.fsync(fh.fileno())
        with (self.path / "scenarios.jsonl").open("a") as fh:
            for rec in records:
                fh.write(json.dumps({"row_id": rec["row_id"], "scenario": rec.get("scenario")}) + "\n")
            fh.flush()


def read_results(path: Path) -> tuple[dict, list[dict[str, Any]]]:
    """Load a results folder for reports: metadata and typed rows."""
    path = Path(path)
    meta_path = path / "sweep.json"
    if not meta_path.exists():
        raise InputError("not a sweep results folder (no sweep.json)", source=str(path))
    meta = json.loads(meta_path.read_text())
    csv_path = path / "results.csv"
    if not csv_path.exists():
        raise InputError("no results.csv: the sweep has not finished any row", source=str(path))
    with csv_path.open(newline="") as fh:
        raw = list(csv.DictReader(fh))
    rows = []
    for r in raw:
        if r.get("status") is None:
            continue
        typed: dict[str, Any] = {}
        for k, v in r.items():
            if v in ("", None):
                typed[k] = None
                continue
            try:
                typed[k] = float(v) if k not in ("row_id", "status", "error") else v
                if (
                    isinstance(typed[k], float)
                    and typed[k].is_integer()
                    and k
                    in ("world_size", "nodes", "gpus_per_node", "steps", "global_batch", "micro_batch_used")
                ):
                    typed[k] = int(typed[k])
            except ValueError:
                typed[k] = v
        rows.append(typed)
    scenarios = {}
    jsonl = path / "scenarios.jsonl"
    if jsonl.exists():
        for line in jsonl.read_text().splitlines():
            try:
                item = json.loads(line)
                scenarios[item["row_id"]] = item["scenario"]
            except (json.JSONDecodeError, KeyError):
                continue
    meta["scenarios"] = scenarios
    return meta, rows
