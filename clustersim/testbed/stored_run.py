"""The schema of a stored `testbed validate --out` file, checked before `testbed repredict` uses it.

Only what a prediction is made from is checked: the job, the link rate, the sweep (the raw file's own
schema, calibration/raw_file.py) and, per row, the host count, the optimizer, the measured step and
phases, and the compute and kernel calibrations. Anything out of range is one line naming the file and
the key (``rows.3.calibration_phases_s.forward``), before any row is predicted.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clustersim.calibration.raw_file import KernelRecord, Seconds, check_raw
from clustersim.catalog import Count, Number
from clustersim.errors import InputError
from clustersim.io import first_error, non_finite_at
from clustersim.testbed.hosts import MAX_HOSTS
from clustersim.testbed.shaping import parse_rate

# A measured phase may be empty (a state update that did nothing), never negative or beyond the
# simulator's longest iteration.
PhaseSeconds = Annotated[Number, Field(ge=0, le=1e6)]


class _Stored(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)


class StoredJob(_Stored):
    """testbed/validate.Job as the file stores it (its CLI options' lower bounds)."""

    model: Literal["mlp", "transformer"]
    layers: Count = Field(ge=1)
    width: Count = Field(ge=16)
    batch: Count = Field(ge=1)
    seq: Count = Field(ge=1)
    heads: Count = Field(ge=1)
    steps: Count = Field(ge=2)
    interval: Count = Field(4, ge=1)


class CalibrationPhases(_Stored):
    forward: Seconds
    backward: Seconds
    optimizer: Seconds


class StoredRow(_Stored):
    hosts: Count = Field(ge=2, le=MAX_HOSTS)
    optimizer: Literal["adam", "onebit-adam", "binsgdm", "zero-one-adam", "zero3"] = "adam"
    measured_s: Seconds
    measured_p10_s: Seconds
    measured_p90_s: Seconds
    measured_phases_s: dict[str, PhaseSeconds]
    calibration_phases_s: CalibrationPhases
    calibration_kernels: list[KernelRecord] | None = None
    network_fitted_on_ranks: list[Annotated[Count, Field(ge=2, le=MAX_HOSTS)]] = Field(min_length=1)
    # a paired run's compressed rows: Adam's burst over this optimizer's, one per round
    pair_ratios: list[Annotated[Number, Field(gt=0, le=1e6)]] | None = Field(None, min_length=1)


class StoredRun(_Stored):
    job: StoredJob
    rate: str
    rows: list[StoredRow] = Field(min_length=1)
    sweep: dict
    # what the table's title prints (the model's parameter count and its name) and the job's batch
    # beside it: a list or NaN there ended the table in a TypeError
    params: Count = Field(ge=1)
    label: str = "MLP"
    batch: Count | None = Field(None, ge=1)


def parse_stored_run(data, source: str) -> tuple[StoredRun, float]:
    """The file's contents, checked, and its link rate in bits/s; every failure names ``source`` and
    the key."""
    if not isinstance(data, dict):
        raise InputError("not a `testbed validate --out` file (a JSON object)", source=source)
    missing = [k for k in ("job", "rate", "rows", "sweep") if k not in data]
    if missing:  # another file altogether: a raw sweep, a profile, a scenario
        raise InputError(
            f"not a `testbed validate --out` file (it has no {', '.join(repr(k) for k in missing)})",
            source=source,
            key=missing[0],
        )
    where = non_finite_at(data)  # anywhere, checked or not: the file is written back whole (--out)
    if where is not None:
        raise InputError("not a finite number (NaN or Infinity)", source=source, key=where)
    try:
        run = StoredRun.model_validate(data)
    except ValidationError as exc:
        key, msg = first_error(exc)
        raise InputError(msg, source=source, key=key) from None
    try:
        rate_bits = parse_rate(run.rate)
    except InputError as exc:
        raise InputError(exc.message, source=source, key="rate") from None
    try:
        check_raw(run.sweep, source)
    except InputError as exc:
        raise exc.located(key_prefix="sweep") from None
    return run, rate_bits
