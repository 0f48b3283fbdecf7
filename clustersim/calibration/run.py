"""`clustersim calibrate run`: local microbenchmarks, the collective sweep under torchrun, the fit.

The collective sweep always runs in separate processes (torch.distributed needs one per rank); on
one machine they are started here with torchrun on 127.0.0.1. For several nodes, run
``torchrun --nnodes ... -m clustersim.calibration.collectives --out profile.json`` yourself: rank 0
writes the fitted profile (``--raw`` keeps the medians instead, for ``clustersim calibrate fit``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from clustersim.calibration.fit import build_profile
from clustersim.calibration.microbench import run_local
from clustersim.calibration.network_fit import refuse_contradicting_cluster
from clustersim.calibration.profile import Profile, parse_profile
from clustersim.calibration.provenance import provenance
from clustersim.calibration.raw_file import check_raw
from clustersim.calibration.torch_support import require_torch, resolve_device
from clustersim.errors import InputError
from clustersim.io import read_structured_file, write_json_atomically

RAW_FORMAT = "clustersim-raw"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (for torchrun's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_collective_sweep(ranks: int, device: str, quick: bool, progress=None, ops: str | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "collectives.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(ranks),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
            "-m",
            "clustersim.calibration.collectives",
            "--out",
            str(out),
            "--device",
            device,
            "--raw",
        ]
        if quick:
            cmd.append("--quick")
        if ops:
            cmd += ["--ops", ops]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        lines: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines = (lines + [line.rstrip()])[-400:]
            if progress:
                progress(f"collectives: {line.strip()[:70]}")
        if proc.wait() != 0 or not out.exists():
            raise InputError(
                f"the collective sweep failed (torchrun exit {proc.returncode}): {worker_error(lines)}",
                key="collectives",
            )
        return json.loads(out.read_text())


# "RuntimeError: ...", "torch.distributed.DistBackendError: ...", optionally behind torchrun's
# "[rank0]: " prefix; torchrun's own ChildFailedError only says that a child failed, not why.
_EXCEPTION_LINE = re.compile(
    r"^(?:\[rank\d+\]:\s*)?((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception)\b:?.*)$"
)


def worker_error(lines: list[str]) -> str:
    """The worker's own error from torchrun's output: the last exception line of a traceback that is
    not torchrun's summary, else the last non-empty lines (a C++ abort prints no Python traceback)."""
    found = [
        m.group(1).strip()
        for m in (_EXCEPTION_LINE.match(line.strip()) for line in lines)
        if m and "ChildFailedError" not in m.group(1)
    ]
    if found:
        return found[-1][:400]
    return " | ".join(t for t in lines[-8:] if t.strip())[-400:]


def calibrate(
    device: str,
    out: Path,
    quick: bool,
    ranks: int | None,
    raw_out: Path | None,
    progress=None,
    command: str = "clustersim calibrate run",
    cluster=None,
    threads: int | None = None,
) -> Profile:
    """Measure, fit and write ``out``. ``threads``: torch's intra-op threads for the local measurements
    (default: torch's own, from OMP_NUM_THREADS or the cores); recorded in the provenance, since a CPU's
    GEMM and copy rates depend on them and a model measured on other threads does not match them."""
    torch = require_torch()
    device = resolve_device(torch, device)
    if threads is not None:
        torch.set_num_threads(threads)
    raw: dict = {"format": RAW_FORMAT, "format_version": 1, "device": device}
    raw.update(run_local(torch, device, quick, progress))
    n = ranks if ranks is not None else (torch.cuda.device_count() if device == "cuda" else 2)
    if n >= 1 and (n > 1 or device == "cuda"):
        try:
            sweep = run_collective_sweep(n, device, quick, progress)
        except InputError as exc:
            # Nothing is written to ``out`` (a profile without its collectives would be priced as if
            # it were whole); the local measurements are kept as a raw file that `calibrate fit` reads.
            kept = raw_out if raw_out is not None else failed_raw_path(out)
            _stamp(raw, torch, device, command, n, quick)
            write_json_atomically(kept, raw)
            raise InputError(
                f"{exc.message}; no profile written, the local measurements are in {kept} "
                f"(clustersim calibrate fit {kept} --out {out} fits them without collectives)",
                key=exc.key,
            ) from None
        for key in ("collectives", "collectives_skipped", "topology", "launch_latency_s", "backend"):
            if key in sweep:
                raw[key] = sweep[key]
    # The one write, at the end: an interrupted run (Ctrl-C in the sweep) leaves ``out`` as it was.
    # The raw file first: a fit that refuses the measurements still leaves them for `calibrate fit`.
    _stamp(raw, torch, device, command, n, quick)
    if raw_out is not None:
        write_json_atomically(raw_out, raw)
    return save_profile(raw, out, cluster)


def failed_raw_path(out: Path) -> Path:
    """Where a run whose collective sweep failed keeps its local measurements when no --raw-out was
    given: beside ``out``, named after it (``profile.json`` -> ``profile.raw.json``)."""
    out = Path(out)
    return out.with_name(f"{out.stem}.raw.json")


def _stamp(raw: dict, torch, device: str, command: str, ranks: int, quick: bool) -> None:
    raw["provenance"] = provenance(torch, device, command, backend=raw.get("backend"), ranks=ranks)
    raw["provenance"]["quick"] = quick


def save_profile(raw: dict, out: Path, cluster=None, refit_by: str | None = None) -> Profile:
    """Fit ``raw``, validate the profile, then write it atomically (never an invalid or partial file).
    ``refit_by``: the command that fitted measurements another command took (`calibrate fit`), listed
    after it among the commands that wrote the profile; it also names a collective model left unfitted
    for want of a network (build_profile)."""
    data = build_profile(raw, cluster, name_unfitted_network=refit_by is not None)
    if refit_by is not None:
        from datetime import datetime, timezone

        when = datetime.now(timezone.utc).isoformat(timespec="seconds")
        data["provenance"]["commands"].append(
            {"source": refit_by, "date": when, "wrote": "the fits, from the measurements listed before it"}
        )
    profile = parse_profile(data, str(out))
    write_json_atomically(out, data)
    return profile


def read_raw(path: Path, embedded: bool = False) -> dict:
    """A checked raw measurement file. ``embedded``: a file that carries one under ``sweep`` (a
    `testbed validate` run keeps the sweep its prediction was fitted on there) gives that sweep; without
    it such a file is refused with a pointer to where its sweep is."""
    data = read_structured_file(Path(path), fmt="json")
    sweep = data.get("sweep") if isinstance(data, dict) else None
    inner = isinstance(sweep, dict) and sweep.get("format") == RAW_FORMAT
    if isinstance(data, dict) and data.get("format") != RAW_FORMAT and inner:
        if not embedded:
            raise InputError(
                f'not a clustersim raw measurement file (expected "format": "{RAW_FORMAT}"); it carries '
                "one under `sweep` (the sweep a `testbed validate` run fitted): `calibrate check` reads "
                "it there, or save that key's value as its own file to fit it",
                source=str(path),
                key="format",
            )
        try:
            return _checked(sweep, str(path))
        except InputError as exc:
            raise exc.located(key_prefix="sweep") from None
    return _checked(data, str(path))


def _checked(data: object, source: str) -> dict:
    if not isinstance(data, dict) or data.get("format") != RAW_FORMAT:
        raise InputError(
            f'not a clustersim raw measurement file (expected "format": "{RAW_FORMAT}")',
            source=source,
            key="format",
        )
    if data.get("format_version") != 1:
        raise InputError(
            f"raw format_version {data.get('format_version')!r} is not supported (reads 1)",
            source=source,
            key="format_version",
        )
    check_raw(data, source)
    return data


# What `calibrate fit` can fit from a raw file: the hardware rates, and the collectives across two or
# more ranks (one rank's are launch latency, kept as launch_latency_s).
FITTED_KEYS = ("gemm", "memory", "kernels", "host_adam", "host_copies", "launch_latency_s")


def fit_file(raw_path: Path, out: Path, cluster=None, command: str | None = None) -> Profile:
    """Fit a raw file into a profile at ``out``; a file with nothing to fit is refused, nothing written."""
    raw = read_raw(raw_path)
    shared = [r for r in raw.get("collectives") or [] if int(r["nodes"]) * int(r["gpus_per_node"]) > 1]
    if not shared and not any(raw.get(k) not in (None, [], {}) for k in FITTED_KEYS):
        raise InputError(
            "nothing to fit: no collective measured across 2 or more ranks and no hardware rates "
            f"({', '.join(FITTED_KEYS)}); `calibrate run` measures them",
            source=str(raw_path),
            key="collectives",
        )
    if cluster is not None:  # before the fit, naming the file: the fit itself knows no file name
        refuse_contradicting_cluster(raw, cluster, str(raw_path))
    return save_profile(raw, out, cluster, refit_by=command)
