"""Store a model's measured compute (ModelCompute) and per-op dispatch rates in a profile.

``calibrate model`` and ``calibrate import-trace`` add to a profile rather than replace it: the
GEMM, memory and collective measurements of ``calibrate run`` stay, an entry for the same model,
sequence length and precision is replaced, others are kept. A profile of another device is refused,
since a profile describes one device type.
"""

from __future__ import annotations

from pathlib import Path

from clustersim.calibration.profile import (
    FORMAT,
    FORMAT_VERSION,
    DispatchRates,
    ModelCompute,
    Profile,
    load_profile,
    parse_profile,
)
from clustersim.calibration.provenance import command_record
from clustersim.errors import InputError
from clustersim.io import write_json_atomically


def same_entry(a: ModelCompute, b: ModelCompute) -> bool:
    """Entries the simulator would look up by the same key (model, sequence length, precision)."""
    return (a.model, a.seq_len, a.fingerprint.precision) == (b.model, b.seq_len, b.fingerprint.precision)


def check_target(out: Path, device: str, base: Path | None = None) -> Profile | None:
    """The profile a measurement of ``device`` merges into (``base``, else ``out`` when it exists), after
    checking it is one of that device: called before measuring too, so a wrong ``--out`` costs nothing."""
    source = base if base is not None else (out if Path(out).exists() else None)
    if source is None:
        return None
    existing = load_profile(str(source))
    if existing.device != device:
        raise InputError(
            f"this profile is for device {existing.device!r} but the measurement is from {device!r}; "
            "a profile holds one device type (write another --out)",
            source=str(source),
            key="device",
        )
    return existing


def store(
    out: Path,
    device: str,
    provenance: dict,
    model_compute: ModelCompute | None,
    dispatch: DispatchRates | None,
    base: Path | None = None,
) -> Profile:
    """Merge into ``base`` (default: ``out`` when it exists) and write ``out`` atomically. The command
    (``provenance``: its source, date and machine) is added to the profile's list of the commands that
    wrote it, with what it wrote and what it replaced; a new profile also takes it as its header."""
    existing = check_target(out, device, base)
    if existing is not None:
        data = existing.model_dump()
        data["format_version"] = FORMAT_VERSION
    else:
        data = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "device": device,
            "provenance": {**provenance, "commands": []},
        }
    commands = [c.get("source") for c in data["provenance"].get("commands") or []]
    wrote = []
    if model_compute is not None:
        entries = [ModelCompute(**m) for m in data.get("model_compute", [])]
        replaced = [m for m in entries if same_entry(m, model_compute)]
        data["model_compute"] = [m.model_dump() for m in entries if m not in replaced] + [
            model_compute.model_dump()
        ]
        wrote.append(
            f"model {model_compute.model} seq {model_compute.seq_len} {model_compute.fingerprint.precision}"
            + "".join(f" (replaced {_written_by(m.source, commands, 'the entry')})" for m in replaced)
        )
    if dispatch is not None:
        before = data.get("dispatch")
        data["dispatch"] = dispatch.model_dump()
        wrote.append(
            "dispatch rates"
            + (f" (replaced {_written_by(before.get('source', ''), commands, 'those')})" if before else "")
        )
    data["provenance"]["commands"] = list(data["provenance"].get("commands") or []) + [
        command_record(provenance, "; ".join(wrote))
    ]
    profile = parse_profile(data, str(out))
    write_json_atomically(out, profile.model_dump(mode="json"))
    return profile


def _written_by(source: str, commands: list, what: str) -> str:
    """Which earlier command wrote a replaced measurement: its number in the profile's list of commands
    (a measurement's source is its command line, then how it measured), else its command line."""
    command = (source or "").split(": ", 1)[0]
    numbers = [i for i, c in enumerate(commands, 1) if c == command]
    if numbers:
        return f"{what} written by command {numbers[-1]}"
    return f"{what} from {command[:200] or 'an unrecorded command'}"
