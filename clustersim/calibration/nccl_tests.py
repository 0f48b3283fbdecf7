"""Parse nccl-tests output (text, keyed on the header line; or the ``-J`` JSON) into measurements.

Text: ``#`` preamble lines, a header ``size count type redop root time algbw busbw #wrong`` (then the
in-place columns), numeric rows, and a ``# Avg bus bandwidth`` footer. Old versions have fewer
columns, so the header is read for the positions of ``size`` and the first (out-of-place) ``time``.
Times are microseconds. The ranks and nodes come from the ``#  Rank N ... on HOST device`` lines.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from clustersim import io
from clustersim.calibration.torch_support import catalog_name_from_string
from clustersim.catalog import MAX_COUNT, hardware_defaults
from clustersim.errors import InputError
from clustersim.io import read_input_text

_OPS = {
    "all_reduce": "all_reduce",
    "allreduce": "all_reduce",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_all": "all_to_all",
    "broadcast": "broadcast",
    "bcast": "broadcast",
}
_RANK_RE = re.compile(
    r"^#\s+Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(.*)$"
)


def _op_from(text_hint: str) -> str | None:
    low = text_hint.lower()
    for key in sorted(_OPS, key=len, reverse=True):
        if key in low:
            return _OPS[key]
    return None


def parse_text(text: str, source: str, op: str | None = None) -> dict:  # noqa: C901 - one pass over every nccl-tests line format
    lines = text.splitlines()
    header_idx = None
    for i, line in enumerate(lines):
        if line.startswith("#"):
            cols = line.lstrip("#").split()
            if "size" in cols and "time" in cols and ("busbw" in cols or "algbw" in cols):
                header_idx = i
                break
    if header_idx is None:
        raise InputError(
            "not nccl-tests output: no header line with 'size ... time algbw busbw'", source=source
        )
    cols = lines[header_idx].lstrip("#").split()
    i_size, i_time = cols.index("size"), cols.index("time")
    # the header's "#wrong" is split off with the '#': it is the column after out-of-place busbw
    i_wrong = cols.index("busbw") + 1 if "busbw" in cols and "wrong" in lines[header_idx] else None
    ranks: dict[int, str] = {}
    device_name = ""
    for line in lines[:header_idx]:
        m = _RANK_RE.match(line)
        if m:
            ranks[int(m.group(1))] = m.group(2)
            device_name = device_name or m.group(3).strip()
        if op is None and "collective test starting" in line.lower():
            op = _op_from(line)
    rows = []
    footer = False
    for n, line in enumerate(lines[header_idx + 1 :], start=header_idx + 2):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if "avg bus bandwidth" in stripped.lower():
                footer = True
            continue
        parts = stripped.split()
        try:
            size = float(parts[i_size])
            t_us = float(parts[i_time])
        except (IndexError, ValueError):
            raise InputError(
                f"line {n}: cannot read size/time from {stripped[:60]!r}", source=source
            ) from None
        _check_row(
            size,
            t_us,
            parts[i_wrong] if i_wrong is not None and i_wrong < len(parts) else None,
            source,
            f"line {n}",
        )
        if size <= 0:
            continue
        rows.append((size, t_us * 1e-6))
    if not rows:
        raise InputError("no result rows after the header (truncated file?)", source=source)
    if not footer:
        raise InputError(
            "no '# Avg bus bandwidth' footer: the run was cut short (truncated file?)", source=source
        )
    nodes = len(set(ranks.values())) or 1
    world = len(ranks) or 1
    return {
        "op": op,
        "ranks": world,
        "nodes": nodes,
        "rows": rows,
        "device": catalog_name_from_string(device_name),
    }


def _check_row(size: float, t_us: float, wrong, source: str, where: str) -> None:
    """A row with a non-finite or non-positive time, or nccl-tests' own '#wrong' count above zero
    (the collective returned wrong data), is refused: nothing is fitted from a broken run."""
    if not (math.isfinite(size) and math.isfinite(t_us)) or t_us <= 0:
        raise InputError(f"{where}: time {t_us!r} us is not a positive finite number", source=source)
    # the same bounds as a raw file's records (raw_file.py): 1 ns to 1e6 s, 1 byte to 2**53
    if not 1e-3 <= t_us <= 1e12:
        raise InputError(f"{where}: time {t_us:g} us is outside 1 ns .. 1e6 s", source=source)
    if not 1 <= size <= MAX_COUNT:
        raise InputError(f"{where}: size {size:g} bytes is outside 1 .. 2**53", source=source)
    if wrong not in (None, "N/A", "n/a", "-"):
        try:
            count = float(wrong)
        except (TypeError, ValueError):
            raise InputError(f"{where}: cannot read the #wrong column ({wrong!r})", source=source) from None
        if count != 0:
            raise InputError(
                f"{where}: nccl-tests reports {count:g} wrong results: the run is not valid", source=source
            )


def parse_json(data: dict, source: str, op: str | None = None) -> dict:
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list) or not results:
        raise InputError("not nccl-tests JSON: no non-empty 'results' list", source=source, key="results")
    rows = []
    for i, r in enumerate(results):
        try:
            size, t_us = float(r["size"]), float(r["out_of_place"]["time"])
        except (KeyError, TypeError, ValueError):
            raise InputError("needs size and out_of_place.time", source=source, key=f"results.{i}") from None
        _check_row(size, t_us, r["out_of_place"].get("nwrong"), source, f"results.{i}")
        rows.append((size, t_us * 1e-6))
    op = op or _op_from(str(data.get("collective") or data.get("name") or ""))
    ranks_key = "nRanks" if "nRanks" in data else "nranks"
    ranks = _positive_int(data.get(ranks_key), source, ranks_key)
    return {
        "op": op,
        "ranks": ranks,
        "nodes": _positive_int(data.get("nnodes"), source, "nnodes") or 1,
        "rows": rows,
        "device": catalog_name_from_string(str(data.get("device") or "")),
    }


def _positive_int(value, source: str, key: str) -> int | None:
    """A count from nccl-tests JSON (absent: None); anything but a positive whole number is refused."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
        or value != int(value)
    ):
        raise InputError("expected a positive whole number", source=source, key=key)
    limit = hardware_defaults()["limits"]["cluster_gpus"]
    if value > limit:
        raise InputError(f"{value:g} is more than any cluster holds ({limit:,} GPUs)", source=source, key=key)
    return int(value)


def _collective(op: str) -> str:
    """``--op`` as the collective it names (all_reduce, allreduce, ...): another name is refused, never
    written into a profile the simulator would not look up."""
    name = _OPS.get(op.lower())
    if name is None:
        known = ", ".join(sorted(set(_OPS.values())))
        raise InputError(f"unknown collective {op!r} (known: {known})", key="--op")
    return name


def _check_sizes(rows: list[tuple[float, float]], source: str) -> None:
    """Two sizes at least, each once: the fit needs a slope, and one size twice is two answers."""
    seen: set[float] = set()
    for size, _ in rows:
        if size in seen:
            raise InputError(f"size {size:g} bytes appears twice; give each size once", source=source)
        seen.add(size)
    if len(seen) < 2:
        raise InputError("one message size; a fit needs two sizes at least", source=source)


def parse_file(path: Path, op: str | None = None, ranks: int | None = None, nodes: int | None = None) -> dict:
    if op is not None:
        op = _collective(op)
    text = read_input_text(path)
    stripped = text.lstrip()
    if stripped.startswith("{"):
        parsed = parse_json(io.parse_json(text, str(path)), str(path), op)
    else:
        parsed = parse_text(text, str(path), op)
    parsed["op"] = op or parsed["op"] or _op_from(Path(path).name)
    if parsed["op"] is None:
        raise InputError("cannot tell which collective this is; pass --op", source=str(path))
    _check_sizes(parsed["rows"], str(path))
    if ranks:
        parsed["ranks"] = ranks
    if nodes:
        parsed["nodes"] = nodes
    if not parsed["ranks"]:
        raise InputError("the file does not say how many ranks ran; pass --ranks", source=str(path))
    if parsed["ranks"] % parsed["nodes"]:
        raise InputError(
            f"{parsed['ranks']} ranks do not split over {parsed['nodes']} nodes", source=str(path)
        )
    return parsed


def to_raw(parsed_files: list[dict], command: str) -> dict:
    records = []
    for f in parsed_files:
        for size, t in f["rows"]:
            records.append(
                {
                    "op": f["op"],
                    "nodes": f["nodes"],
                    "gpus_per_node": f["ranks"] // f["nodes"],
                    "ranks": f["ranks"],
                    "bytes": size,
                    "median_s": t,
                    "p10_s": t,
                    "p90_s": t,
                    "repeats": 1,
                }
            )
    devices = {f["device"] for f in parsed_files}
    device = devices.pop() if len(devices) == 1 else "cpu"
    return {
        "format": "clustersim-raw",
        "format_version": 1,
        "backend": "nccl-tests",
        "provenance": {"source": command, "catalog_device": device},
        "collectives": records,
    }
