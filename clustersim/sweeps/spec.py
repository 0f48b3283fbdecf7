"""The sweep file: a base scenario plus lists of values to vary, expanded into rows.

```yaml
name: bert-large-networks
base: preset:default            # preset, a path (relative to this file) or an inline scenario
vary:
  gpus: [8, 32, 128]            # total GPUs (the base's GPUs per node, fewer below one node)
  nic_gbps: [10, 40, 100]
  optimizer: [adam, onebit-adam, binsgdm]
  cluster.fabric.nodes_per_leaf: [16, 32]   # any dotted scenario key works too
steps: 100000                   # optional: time-to-train per row
global_batch: 4096              # optional: samples per step, fixed across GPU counts (strong scaling)
warmup: 0.15                    # optional: 1-bit Adam warmup fraction
```

With ``global_batch`` every row trains the same recipe (global batch x steps): each GPU's share
B/p is run as micro-batches of at most the configured size with gradient accumulation. Without it,
each GPU keeps the configured micro-batch, so the global batch grows with the GPU count.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from clustersim.catalog import Count, Number
from clustersim.errors import InputError
from clustersim.io import first_error, read_input_text
from clustersim.planner.compare import split_global_batch
from clustersim.scenario import (
    MEGATRON_KEYS,
    PRESET_PREFIX,
    Scenario,
    key_not_applying,
    load_scenario,
    read_structured_file,
    validate_scenario,
    with_one_pointwise_code,
)

# Named axes and the scenario keys they set. "gpus" is special: the total GPU count.
AXES: dict[str, str | None] = {
    "gpus": None,
    "nodes": "cluster.nodes",
    "gpus_per_node": "cluster.gpus_per_node",
    "gpu": "cluster.gpu",
    "fabric": "cluster.intra_node.fabric",
    "nic_kind": "cluster.nic.kind",
    "nic_gbps": "cluster.nic.line_rate_gbps",  # clears the base's measured effective rate
    "nic_effective_gbps": "cluster.nic.effective_gbps",
    "nic_count": "cluster.nic.count",
    "oversubscription": "cluster.fabric.oversubscription",
    "optimizer": "training.optimizer",
    "offload": "training.offload.mode",
    "model": "workload.model",
    "micro_batch": "workload.micro_batch",
    "seq_len": "workload.seq_len",
    "precision": "workload.precision",
}
# Applied first, so that "gpus" is split over the row's GPUs per node.
_ORDER = ["gpu", "gpus_per_node", "nodes"]


class SweepFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    name: str = "sweep"
    base: str | dict[str, Any]
    vary: dict[str, list[Any]]
    per_gpu: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="axis values that belong to a GPU of the gpu axis, set on its rows only (e.g. "
        "{L40S: {fabric: pcie}}: a PCIe card has no NVSwitch); other GPUs' rows keep the base's",
    )
    catalog: str | list[str] | None = Field(
        None, description="user catalog file(s) (GPUs/models), relative to the sweep file"
    )
    steps: Count | None = Field(None, gt=0)
    global_batch: Count | None = Field(None, gt=0)
    warmup: Number | None = Field(None, ge=0, lt=1)
    samples: Count = Field(
        32,  # simulator.uncertainty.DEFAULT_SAMPLES, as every command
        ge=0,
        le=1000,
        description="draws of the uncertain parameters per row for the "
        "P10-P90 band (simulator/uncertainty.py); 0: none",
    )

    @field_validator("samples")
    @classmethod
    def _a_band_needs_two_draws(cls, value: int) -> int:
        from clustersim.simulator.uncertainty import draws_refusal

        if why := draws_refusal(value):
            raise ValueError(why)
        return value


def _field(dotted: str):
    """The pydantic field a dotted scenario key names, or None."""
    model: Any = Scenario
    info = None
    for part in dotted.split("."):
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        info = fields[part]
        ann = info.annotation
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return info


def _value_problem(axis: str, value: Any) -> str | None:
    """Why ``value`` can never be a valid value of ``axis`` on its own (whatever the other axes), or
    None. Combinations that do not work (a GPU count that does not fill the nodes, out of memory) are
    not this: they are recorded as invalid rows."""
    from clustersim import catalog
    from clustersim.simulator.strategies import registry

    try:
        if axis == "gpus":
            try:
                _GPU_COUNT.validate_python(value)
            except ValidationError:
                return "a GPU count must be a positive integer"
            return None
        if axis == "optimizer":
            registry.get(str(value))
            return None
        if (AXES.get(axis) or axis) == "training.optimizer_options":
            return _options_problem(value)
        option = _option_name(axis)
        if option is not None:
            return _options_problem({option: value})
        if axis == "gpu":
            catalog.gpu(str(value))
        elif axis == "model":
            catalog.model(str(value))
        info = _field(AXES.get(axis) or axis)
        if info is not None:
            ann = info.annotation
            is_model = isinstance(ann, type) and issubclass(ann, BaseModel)
            config = None if is_model else ConfigDict(allow_inf_nan=False)
            TypeAdapter(Annotated[ann, info], config=config).validate_python(value)
    except InputError as exc:
        return exc.message
    except ValidationError as exc:
        return first_error(exc)[1]
    return None


# The gpus axis is a count like every integer scenario field (catalog.Count): 8 and 8.0 are eight GPUs;
# 8.5, true and "8" are not.
_GPU_COUNT = TypeAdapter(Annotated[Count, Field(gt=0)])


def _whole_value(axis: str, value: Any) -> Any:
    """``value`` as the integer it is when ``axis`` is an integer field and ``value`` a whole float
    (``nodes: [8.0]`` is the row of 8 nodes, listed and identified as 8, as the scenario reads it);
    any other value as it is (checked by _value_problem)."""
    if not isinstance(value, float) or not value.is_integer():
        return value
    if axis == "gpus":
        return int(value)
    info = _field(AXES.get(axis) or axis)
    ann = info.annotation if info is not None else None
    if ann is None or (isinstance(ann, type) and issubclass(ann, BaseModel)):
        return value
    try:
        whole = TypeAdapter(Annotated[ann, info]).validate_python(value)
    except ValidationError:
        return value
    return whole if isinstance(whole, int) and not isinstance(whole, bool) else value


def _options_problem(value: Any) -> str | None:
    """Why an optimizer-options mapping is valid for no optimizer at all (whatever the optimizer axis
    picks), or None: the message of an optimizer that has every key it names, else the first's."""
    from clustersim.optimizer_options import OPTIONS, parse_options

    if not isinstance(value, dict):
        return "optimizer options are a mapping of option names to values"
    problems = []
    for name, schema in OPTIONS.items():
        try:
            parse_options(name, value)
            return None
        except InputError as exc:
            has_keys = set(value) <= set(schema.model_fields)
            problems.append((not has_keys, f"{exc.key}: {exc.message}" if exc.key else exc.message))
    return min(problems)[1]


OPTIONS_PREFIX = "training.optimizer_options."


def _axis_hint(axis: str) -> str:
    """ ", did you mean X?" for a misspelt optimizer option, else nothing."""
    import difflib

    if not axis.startswith(OPTIONS_PREFIX):
        return ""
    close = difflib.get_close_matches(axis.removeprefix(OPTIONS_PREFIX), sorted(_all_option_names()), n=1)
    return f" (did you mean {OPTIONS_PREFIX}{close[0]}?)" if close else ""


def _option_name(axis: str) -> str | None:
    """The option an axis such as ``training.optimizer_options.implementation`` varies, or None. It is
    one key of the options mapping, which each optimizer defines for itself (optimizer_options.py), so
    it is a sweep axis when some optimizer has that option."""
    name = axis.removeprefix(OPTIONS_PREFIX)
    return name if name != axis and name in _all_option_names() else None


def _all_option_names() -> set[str]:
    """Every option some optimizer takes (optimizer_options.OPTIONS)."""
    from clustersim.optimizer_options import OPTIONS

    return {n for schema in OPTIONS.values() for n in schema.model_fields}


def _options_of(optimizer: str) -> set[str]:
    """The option names ``optimizer`` takes (none for an unknown name, refused elsewhere)."""
    from clustersim.optimizer_options import OPTIONS

    schema = OPTIONS.get(optimizer)
    return set(schema.model_fields) if schema is not None else set()


def _is_schema_key(dotted: str) -> bool:
    """A scenario key (a pydantic field, walked by _field) or one optimizer option."""
    return _option_name(dotted) is not None or _field(dotted) is not None


# The most rows one sweep may expand into. Rows are listed in memory (~1 KB each with their resolved
# values) and each is a simulation of milliseconds to seconds, so 100,000 rows are ~100 MB and hours of
# work; larger studies are several sweeps (docs/scale-limits.md). Not a model constant.
MAX_ROWS = 100_000
# The most values (scalars and containers, an alias counted each time it is used) in ``vary``: a
# YAML alias of an alias of a list is a list of 10^9 values that takes a few hundred bytes to write
# and forever to print or hash. Real axes hold tens of values. Not a model constant.
MAX_VARY_VALUES = 100_000


def expanded_size(value: Any, limit: int) -> int:
    """Values in ``value`` with every shared (aliased) part counted each time it appears, computed once
    per distinct object; stops counting past ``limit``."""
    memo: dict[int, int] = {}

    def size(v: Any) -> int:
        if not isinstance(v, dict | list):
            return 1
        key = id(v)
        if key not in memo:
            memo[key] = limit + 1  # a cycle (not from YAML's safe loader) counts as too many
            children = v.values() if isinstance(v, dict) else v
            total = 1
            for c in children:
                total += size(c)
                if total > limit:
                    break
            memo[key] = min(total, limit + 1)
        return memo[key]

    return size(value)


def check_size(vary: dict[str, list[Any]], source: str) -> None:
    """Refuse a ``vary`` too large to expand, before anything expands, hashes or prints it."""
    for axis, values in vary.items():
        if expanded_size(values, MAX_VARY_VALUES) > MAX_VARY_VALUES:
            raise InputError(
                f"more than {MAX_VARY_VALUES:,} values once its aliases are expanded (docs/scale-limits.md)",
                source=source,
                key=f"vary.{axis}",
            )
    rows = 1
    for values in vary.values():
        rows *= max(len(values), 1)
    if rows > MAX_ROWS:
        sizes = " x ".join(str(len(v)) for v in vary.values())
        raise InputError(
            f"{sizes} = {rows:,} rows, over the {MAX_ROWS:,} one sweep may have; split it into several "
            "sweeps (docs/scale-limits.md)",
            source=source,
            key="vary",
        )


class Sweep:
    def __init__(self, spec: SweepFile, base: Scenario, source: str, catalogs: tuple[str, ...] = ()):
        self.spec = spec
        self.base = base
        self.source = source
        self.catalogs = catalogs  # absolute paths of the user catalogs every row is simulated with
        check_size(spec.vary, source)
        for axis, values in spec.vary.items():
            if axis not in AXES and not _is_schema_key(axis):
                raise InputError(
                    f"unknown axis {axis!r}{_axis_hint(axis)} (named axes: {', '.join(AXES)}; or a "
                    "dotted scenario key such as cluster.nic.count)",
                    source=source,
                    key=f"vary.{axis}",
                )
            if not values:
                raise InputError("empty axis: give at least one value", source=source, key=f"vary.{axis}")
        if not spec.vary:
            raise InputError("nothing to vary", source=source, key="vary")
        _refuse_two_axes_on_one_key(spec.vary, source)
        # what vary sets, by the scenario key each axis names (nic_gbps and cluster.nic.line_rate_gbps are
        # one key; a GPU count sets the nodes)
        varied = {AXES.get(a) or a for a in spec.vary if a != "gpus"} | {"cluster.gpu"}
        if "gpus" in spec.vary:
            varied |= {"cluster.nodes", "gpus"}
        for gpu, values in spec.per_gpu.items():
            if gpu not in spec.vary.get("gpu", []):
                raise InputError("not a value of the gpu axis", source=source, key=f"per_gpu.{gpu}")
            for axis in values:
                if (AXES.get(axis) or axis) in varied or (axis not in AXES and not _is_schema_key(axis)):
                    raise InputError(
                        "not an axis a GPU's rows can set (a named axis or a dotted scenario key that "
                        "vary does not vary)",
                        source=source,
                        key=f"per_gpu.{gpu}.{axis}",
                    )
        # rows varying the Megatron layout are compared on one model code
        self.base = with_one_pointwise_code(base, (v for k in MEGATRON_KEYS for v in spec.vary.get(k, [])))

    def catalogs_in_use(self):
        """A context in which the sweep's user catalogs are in use (check, expand, simulate in it)."""
        from clustersim.catalog import user_catalogs

        return user_catalogs(self.catalogs)

    @property
    def axes(self) -> list[str]:
        """The varied axes, then those per_gpu sets (a column each in a sweep's results)."""
        per_gpu = (a for values in self.spec.per_gpu.values() for a in values)
        return list(dict.fromkeys([*self.spec.vary, *per_gpu]))

    def rows(self) -> list[dict[str, Any]]:
        names = list(self.spec.vary)
        rows = [dict(zip(names, combo)) for combo in itertools.product(*(self.spec.vary[n] for n in names))]
        return [{**r, **self.spec.per_gpu.get(r.get("gpu"), {})} for r in rows]

    def check_values(self) -> None:
        """Every axis value on its own, before any work: one line per kind of problem, naming the file,
        the axis and its bad values."""
        problems: dict[tuple[str, str], list[Any]] = {}
        # a GPU's own values (per_gpu) are axis values too, checked the same way
        settings = [(f"vary.{axis}", axis, values) for axis, values in self.spec.vary.items()]
        settings += [
            (f"per_gpu.{gpu}.{axis}", axis, [value])
            for gpu, values in self.spec.per_gpu.items()
            for axis, value in values.items()
        ]
        for key, axis, values in settings:
            for value in values:
                why = _value_problem(axis, value)
                if why is not None:
                    problems.setdefault((key, _without_value(why, value)), []).append(value)
        if problems:
            lines = [
                str(
                    InputError(
                        f"{', '.join(json.dumps(v) for v in vals)}: {why}",
                        source=self.source,
                        key=key,
                    )
                )
                for (key, why), vals in problems.items()
            ]
            raise InputError("\n".join(lines))

    def unused_axes(self) -> list[str]:
        """One note per axis that varies a workload key none of the sweep's models uses (a transformer's
        attention over ResNet-50 rows, batch-norm fusion over BERT rows), or an optimizer option some of
        its optimizers lack: those rows come out the same, so it is said before they run, as ``run``
        says it of a scenario's key."""

        notes = self._unused_option_axes() + self._sequence_length_notes()
        models = {self.base.workload.model, *self.spec.vary.get("model", [])}
        models |= set(self.spec.vary.get("workload.model", []))
        models.discard(None)  # a custom list of layers: no family to check against
        if not models:
            return notes
        for axis in self.axes:
            key = AXES.get(axis) or axis
            if not key or not key.startswith("workload."):
                continue
            said = key_not_applying(key.removeprefix("workload."), models)
            if said is not None:
                notes.append(f"vary.{axis}: {said}: the rows along it are the same")
        return notes

    def _sequence_length_notes(self) -> list[str]:
        """A model axis gives each other model its own default sequence length: said when the base
        sets one that those rows then do not use."""
        others = [m for m in self.spec.vary.get("model", []) if m != self.base.workload.model]
        given = self.base.workload.seq_len
        if not others or "seq_len" in self.spec.vary or given is None:
            return []
        return [
            f"vary.model: rows of {', '.join(map(str, others))} use each model's default seq_len, not the "
            f"base's {given}; vary seq_len to set it"
        ]

    def _unused_option_axes(self) -> list[str]:
        """A note per optimizer-option axis for each of the sweep's optimizers without that option:
        those rows run the optimizer as it is, the same along the axis."""
        optimizers = [str(o) for o in self.spec.vary.get("optimizer", [self.base.training.optimizer])]
        notes = []
        for axis in self.axes:
            option = _option_name(axis)
            if option is None:
                continue
            lacking = [o for o in dict.fromkeys(optimizers) if option not in _options_of(o)]
            if lacking:
                notes.append(
                    f"vary.{axis}: {', '.join(lacking)} {'has' if len(lacking) == 1 else 'have'} no "
                    f"option {option}: {'its' if len(lacking) == 1 else 'their'} rows along it are the same"
                )
        return notes

    def invalid_rows(self) -> dict[str, int]:
        """Rows whose combination cannot be a valid scenario (resolved up front, cheap): reason -> count,
        each reason as the row records it (row_reason)."""
        from collections import Counter

        reasons: Counter = Counter()
        for values in self.rows():
            try:
                resolve_row(self.base, values, self.spec.steps, self.spec.global_batch)
            except InputError as exc:
                reasons[row_reason(exc)] += 1
        return dict(reasons)

    def refuse_without_a_valid_row(self, invalid: dict[str, int]) -> None:
        """A grid none of whose rows is valid has nothing to run: a value no row of it can take
        (``recompute_num_layers: [100]`` over 24-layer stages, ``gpus: [6]`` in nodes of 4 with nothing
        else varied) is then a file error, one line per reason naming the file and key, before any work.
        Where some row is valid, the others are invalid combinations, recorded as rows with their reason
        (``invalid``: invalid_rows())."""
        if sum(invalid.values()) < len(self.rows()):
            return
        said = (InputError(f"{reason} (every row of the sweep)", source=self.source) for reason in invalid)
        lines = [str(e) for e in said]
        raise InputError("\n".join(lines))

    def fingerprint(self) -> str:
        payload = {
            "base": self.base.model_dump(mode="json"),
            "vary": self.spec.vary,
            "steps": self.spec.steps,
            "warmup": self.spec.warmup,
            "global_batch": self.spec.global_batch,
            "samples": self.spec.samples,
        }
        if self.spec.per_gpu:
            payload["per_gpu"] = self.spec.per_gpu
        if self.catalogs:  # another catalog content is another sweep
            payload["catalogs"] = [read_input_text(p) for p in self.catalogs]
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def row_reason(exc: InputError) -> str:
    """Why a row is invalid: its key and message, as results.csv records it (str(exc)) less the source
    the row's scenario is validated under ("row: "), so a reason said before a sweep runs is found again
    among those recorded after it."""
    return str(InputError(exc.message, key=exc.key))


def row_id(values: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps(values, sort_keys=True, default=str).encode()).hexdigest()[:12]


# Dotted keys whose validation depends on the row's GPU count (tensor x pipeline must divide it).
_AFTER_GPUS = ("training.parallelism.",)
# Keys whose validation depends on the row's micro-batches too (the interleaved schedule needs their
# count to be a multiple of the pipeline stages): applied once the global batch is split.
_SCHEDULE, _VIRTUAL = "training.parallelism.schedule", "training.parallelism.virtual_stages"


def resolve_row(
    base: Scenario, values: dict[str, Any], steps: int | None, global_batch: int | None = None
) -> Scenario:
    """The scenario of one row. Raises InputError when the combination is not a valid cluster."""
    from clustersim.planner.compare import scenario_for_optimizer

    data = base.model_dump(mode="json")
    ordered = sorted(values, key=lambda a: (_ORDER.index(a) if a in _ORDER else len(_ORDER), a))
    # A tensor x pipeline layout is checked against the row's GPU count: applied once that is set.
    layout = {a: values[a] for a in ordered if a.startswith(_AFTER_GPUS)}
    for axis in ordered:
        if axis in ("gpus", "optimizer") or axis in layout or _option_name(axis) is not None:
            continue
        key = AXES.get(axis) or axis
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = values[axis]
    if "model" in values and values["model"] != base.workload.model:
        # another model takes its own default sequence length unless seq_len is varied (Sweep notes it)
        data["workload"]["seq_len"] = values.get("seq_len")
    if ("nic_gbps" in values or "nic_kind" in values) and "nic_effective_gbps" not in values:
        # A measured rate belongs to the base's NIC; another NIC gets line rate x efficiency.
        data["cluster"]["nic"]["effective_gbps"] = None
    scenario = validate_scenario(data, source="row")
    if "gpus" in values:
        scenario = scenario.with_world_size(int(values["gpus"]))
    scenario = with_layout(scenario, layout, global_batch)
    optimizer = values.get("optimizer", scenario.training.optimizer)
    options_axis = next((a for a in values if (AXES.get(a) or a) == "training.optimizer_options"), None)
    # A row that names its options: they are its own optimizer's, checked against that optimizer's
    # schema (an option it does not have makes the row invalid, not silently dropped).
    named = dict(
        values[options_axis] if options_axis is not None and optimizer != scenario.training.optimizer else {}
    )
    # One option varied by itself is the row's optimizer's, whichever that is, applied once the
    # optimizer is chosen; an optimizer without that option runs as it is (unused_axes says so).
    named.update({name: v for a, v in values.items() if (name := _option_name(a)) in _options_of(optimizer)})
    return scenario_for_optimizer(scenario, optimizer, steps, **named)


def with_layout(scenario: Scenario, layout: dict[str, Any], global_batch: int | None) -> Scenario:
    """``scenario`` with dotted parallelism changes and, with a global batch, its micro-batches split
    over the layout's data-parallel replicas. An interleaved schedule (the row's or the base's) is set
    last, the rest under 1F1B: Megatron's rules for it are checked against the micro-batches the row
    runs, not the ones it had before the split, and against the row's own pipeline x chunks."""
    par = scenario.training.parallelism
    late = {k: v for k, v in layout.items() if k in (_SCHEDULE, _VIRTUAL)}
    early = {k: v for k, v in layout.items() if k not in late}
    if "interleaved" in (par.schedule, late.get(_SCHEDULE)):
        late = {_SCHEDULE: par.schedule, _VIRTUAL: par.virtual_stages, **late}
        early |= {_SCHEDULE: "1f1b", _VIRTUAL: 1}
    if early:
        scenario = scenario.with_changes(**early)
    if global_batch:
        scenario = split_global_batch(scenario, global_batch)
    return scenario.with_changes(**late) if late else scenario


def resolve_profile_ref(ref: str) -> str:
    """Check a profile loads (a clear error before any work) and name it so every Dask worker finds
    it: builtin names as they are, files by absolute path."""
    from clustersim.calibration.profile import BUILTIN_PREFIX, load_profile

    load_profile(ref)
    return ref if ref.startswith(BUILTIN_PREFIX) else str(Path(ref).resolve())


def load_sweep(
    path: str | Path,
    profile: str | None = None,
    samples: int | None = None,
    catalogs: list[str | Path] | None = None,
) -> Sweep:
    """Read a sweep file; ``profile`` (every row simulated with it) and ``samples`` override the file's;
    ``catalogs`` (user catalog files) come after the file's own ``catalog:`` and win over it."""
    path = Path(path)
    raw = read_structured_file(path)
    if not isinstance(raw, dict):
        raise InputError("a sweep file must be a mapping with keys base and vary", source=str(path))
    if isinstance(raw.get("vary"), dict):  # sized before pydantic or anything else walks it
        check_size({k: v if isinstance(v, list) else [v] for k, v in raw["vary"].items()}, str(path))
    try:
        spec = SweepFile.model_validate(raw)
    except ValidationError as exc:
        key, msg = first_error(exc)
        raise InputError(msg, source=str(path), key=key) from None
    own = [spec.catalog] if isinstance(spec.catalog, str) else list(spec.catalog or [])
    paths = tuple(str((path.parent / p).resolve()) for p in own)
    paths += tuple(str(Path(p).resolve()) for p in catalogs or ())
    from clustersim.catalog import user_catalogs

    try:
        with user_catalogs(paths):
            return _load_sweep(path, spec, profile, samples, paths)
    except InputError as exc:
        if own and exc.source is None:
            raise exc.located(source=str(path)) from None
        raise


def _load_sweep(path: Path, spec: SweepFile, profile, samples, paths: tuple[str, ...]) -> Sweep:
    if isinstance(spec.base, dict):
        base = validate_scenario(spec.base, source=f"{path}: base")
    elif spec.base.startswith(PRESET_PREFIX):
        base = load_scenario(spec.base)
    else:
        base_path = (path.parent / spec.base) if not Path(spec.base).is_absolute() else Path(spec.base)
        if not base_path.is_file():  # the sweep file's key names it: say which file and key
            raise InputError(
                f"base scenario {spec.base!r} not found (looked for {base_path}, relative to the sweep "
                "file's folder)",
                key="base",
                source=str(path),
            )
        base = load_scenario(base_path)
    if profile is not None:
        base = base.with_changes(profile=resolve_profile_ref(profile))
    if samples is not None:
        spec = spec.model_copy(update={"samples": samples})
    sweep = Sweep(spec, base, str(path), paths)
    sweep.check_values()
    sweep.spec = _with_whole_values(sweep.spec)
    _refuse_repeated_values(sweep.spec, str(path))
    return sweep


def _refuse_two_axes_on_one_key(vary: dict[str, list[Any]], source: str) -> None:
    """Two axes that set one scenario key (nic_gbps and cluster.nic.line_rate_gbps; gpus, which sets the
    nodes, and nodes) make rows whose columns disagree with what was simulated (one axis's value wins):
    refused, naming the key and both axes."""
    setters: dict[str, list[str]] = {}
    for axis in vary:
        key = "cluster.nodes" if axis == "gpus" else AXES.get(axis) or axis
        setters.setdefault(key, []).append(axis)
    for key, axes in setters.items():
        if len(axes) > 1:
            how = " (gpus sets the nodes; gpus_per_node may vary beside it)" if "gpus" in axes else ""
            raise InputError(
                f"two axes set {key}: {' and '.join(axes)}{how}; keep one",
                source=source,
                key=f"vary.{axes[1]}",
            )


def _refuse_repeated_values(spec: SweepFile, source: str) -> None:
    """A value given twice in one axis (8 and 8.0 are one count) would make two rows with one row id."""
    for axis, values in spec.vary.items():
        seen: set[str] = set()
        for value in values:
            shown = json.dumps(value, sort_keys=True, default=str)
            if shown in seen:
                raise InputError(
                    f"{shown} is given twice: each value once", source=source, key=f"vary.{axis}"
                )
            seen.add(shown)


def _with_whole_values(spec: SweepFile) -> SweepFile:
    """``spec`` with each integer axis's whole floats as integers (_whole_value)."""
    vary = {axis: [_whole_value(axis, v) for v in values] for axis, values in spec.vary.items()}
    per_gpu = {g: {a: _whole_value(a, v) for a, v in values.items()} for g, values in spec.per_gpu.items()}
    return spec.model_copy(update={"vary": vary, "per_gpu": per_gpu})


def _without_value(why: str, value: Any) -> str:
    """A problem without the value it names (", not 'maybe'"): the line lists the axis's bad values
    itself, and values with the same problem then share one line."""
    shown = str(value).lower() if isinstance(value, bool) else repr(value)
    # the value itself, not a word that starts with it ("not true/false" names no value)
    return re.sub(rf", not {re.escape(shown)}(?![\w/])", "", why, count=1)
