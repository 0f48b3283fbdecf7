"""Reading and writing files the one way the project does it: errors that name the file and the key,
and writes that never leave half a file behind."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustersim.errors import InputError

if TYPE_CHECKING:  # pydantic and PyYAML are imported when used: `--help` and `presets list` stay quick
    from pydantic import ValidationError


# What a key named in an error may look like. A key of another shape (``root:$6$...``: the first line
# of a file that is not an input at all, read as a YAML key) is not shown, so an error never prints a
# line of a file given by mistake.
_KEY_SHAPE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+\-/() ]{0,63}")


def shown_key(key: object) -> str:
    """``key`` as an error may print it: itself if it looks like a key or a name, else a placeholder."""
    text = str(key)
    return text if isinstance(key, int) or _KEY_SHAPE.fullmatch(text) else "(a key that is not a name)"


def _dotted(loc, tags: tuple[str, ...] = ()) -> str:
    """A pydantic location as a dotted key, without the parts that are not keys the user wrote: a
    tagged union's tag (``tags``) and the ``[key]`` marker of a dict key's error."""
    return ".".join(shown_key(p) for p in loc if p not in tags and p != "[key]")


def _model_in(annotation: Any, depth: int = 0):
    """The pydantic model class an annotation holds (itself, or inside Optional/Annotated/a union)."""
    import typing

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if depth < 3:
        for arg in typing.get_args(annotation):
            found = _model_in(arg, depth + 1)
            if found is not None:
                return found
    return None


def _keys_beside(model: Any, loc: tuple, tags: tuple[str, ...]) -> list[str]:
    """The keys ``model`` accepts beside ``loc``'s last part, following its nested models field by field
    (tags of tagged unions skipped); none where the path leaves the models (a dict, a list item)."""
    current = model
    for part in loc[:-1]:
        if part in tags:
            continue
        fields = getattr(current, "model_fields", None)
        if not isinstance(part, str) or fields is None or part not in fields:
            return []
        current = _model_in(fields[part].annotation)
    fields = getattr(current, "model_fields", None) or {}
    keys = list(fields)
    keys += [f.alias for f in fields.values() if f.alias]
    return keys


def _section_model(annotation: Any):
    """The model a field is a section of (itself, Optional or a union with a name), not one inside a
    list or a mapping: a key at a wrong level is pointed at a place a dotted key can reach."""
    import typing

    if typing.get_origin(annotation) in (list, dict, tuple, set, frozenset):
        return None
    found = _model_in(annotation)
    if found is None:
        return None
    for arg in typing.get_args(annotation):
        if typing.get_origin(arg) in (list, dict, tuple, set, frozenset) and _model_in(arg) is found:
            return None
    return found


_PLACES: dict[Any, dict[str, list[str]]] = {}


def _places(model: Any) -> dict[str, list[str]]:
    """Every key ``model`` accepts anywhere in its sections: leaf name -> dotted paths (cached)."""
    if model not in _PLACES:
        found: dict[str, list[str]] = {}

        def walk(current, prefix: str, depth: int) -> None:
            for name, field in current.model_fields.items():
                path = prefix + (field.alias or name)
                found.setdefault(field.alias or name, []).append(path)
                sub = _section_model(field.annotation)
                if sub is not None and depth < 5:
                    walk(sub, path + ".", depth + 1)

        walk(model, "", 0)
        _PLACES[model] = found
    return _PLACES[model]


# Keys users write that are not settings here, with what to write instead (leaf, or parent.leaf)
_NOT_SETTINGS = {
    "parallelism.data": "the data-parallel degree is not set: it is derived, GPUs / (tensor x pipeline)",
    "cluster.gpus": "the GPU count is cluster.nodes x cluster.gpus_per_node (GPUs per node); "
    "cluster.gpu names the GPU",
    "cluster.model": "the model is workload.model",
    # other tools' names (DeepSpeed's zero_optimization.stage, Megatron's --tensor-model-parallel-size)
    "zero_stage": "the ZeRO stage is training.sharding.stage",
    "tensor_parallel": "the tensor-parallel degree is training.parallelism.tensor",
    "pipeline_parallel": "the pipeline-parallel degree is training.parallelism.pipeline",
    "micro_batch_size": "the micro-batch is workload.micro_batch",
}


def _elsewhere(loc: tuple, tags: tuple[str, ...], model: Any) -> str | None:
    """Where an unknown key belongs when it is a key of another section (``workload.optimizer`` is
    training.optimizer, ``cluster.line_rate_gbps`` is cluster.nic.line_rate_gbps), or what a known
    non-setting means; None otherwise. A place in the same top-level section is preferred."""
    parts = [str(p) for p in loc if p not in tags and p != "[key]"]
    if not parts:
        return None
    leaf, here = parts[-1], ".".join(parts)
    for tail in (leaf, ".".join(parts[-2:]), ".".join(parts)):
        if tail in _NOT_SETTINGS:
            return _NOT_SETTINGS[tail]
    places = [p for p in _places(model).get(leaf, []) if p != here]
    if not places:
        return None
    places.sort(key=lambda p: (p.split(".")[0] != parts[0], p.count("."), p))
    return f"{leaf} is set at {places[0]}"


def first_error(exc: ValidationError, tags: tuple[str, ...] = (), model: Any = None) -> tuple[str, str]:
    """The first pydantic error as (dotted key, one-line reason). A misspelt key shows up as an unknown
    key beside a missing one (``micro_bach`` / ``micro_batch``): that pair is reported as the typo, and
    where ``model`` (the validated class) is given, beside any key it accepts there (``batchnorm`` /
    ``batch_norm``). ``tags``: the tags of tagged unions, which pydantic puts in the location."""
    import difflib

    errors = exc.errors()
    missing = [e["loc"] for e in errors if e["type"] == "missing"]
    for e in errors:
        if e["type"] != "extra_forbidden" or not e["loc"]:
            continue
        if model is not None and (where := _elsewhere(e["loc"], tags, model)):
            return _dotted(e["loc"], tags), f"unknown key here: {where}"
        siblings = [str(m[-1]) for m in missing if m[:-1] == e["loc"][:-1]]
        match = difflib.get_close_matches(str(e["loc"][-1]), siblings, n=1)
        if not match and model is not None:
            match = difflib.get_close_matches(str(e["loc"][-1]), _keys_beside(model, e["loc"], tags), n=1)
        if match:
            return _dotted(e["loc"], tags), f"unknown key (did you mean {match[0]}?)"
    err = errors[0]
    key = _dotted(err["loc"], tags) or "(top level)"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        return key, "unknown key"
    if err["type"] == "missing":
        msg = "required key is missing"
    msg = msg.removeprefix("Value error, ")
    if err["type"] in ("int_parsing", "int_from_float", "int_type"):
        msg = f"not a whole number: {_given(err.get('input'))}"
    elif isinstance(err.get("input"), bool) and "true/false" not in msg:
        msg = f"{msg}, not {str(err['input']).lower()}"
    elif err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        # "a valid dictionary or instance of ClusterSpec" named a class the user never wrote
        msg = f"expected a section of keys (a mapping), not {_given(err.get('input'))}"
    elif err["type"] in ("bool_parsing", "bool_type") and isinstance(
        err.get("input"), str | int | float | None
    ):
        given = "null" if err.get("input") is None else repr(err["input"])
        msg = f"Input should be a boolean (true or false), not {given}"
    elif err["type"] == "literal_error" and isinstance(err.get("input"), str | int | float):
        given = err["input"]
        msg = f"{msg}, not {given!r}"
        value = str(given).lower()  # a hint keyed by the key's last name, or its last two (nic.kind)
        synonym = _SYNONYMS.get((key.rsplit(".", 1)[-1], value)) or _SYNONYMS.get(
            (".".join(key.rsplit(".", 2)[-2:]), value)
        )
        if synonym:
            msg = f"{msg} ({synonym})"
    return key, msg


def _given(value: Any) -> str:
    """A value the user gave, for an error: YAML's spelling of null and booleans, else its repr, cut."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    text = repr(value) if isinstance(value, str | int | float) else f"a {type(value).__name__}"
    return text if len(text) <= 40 else text[:37] + "..."


_ROCE = (
    "RoCE at 100-800 Gb/s is 'infiniband' at the Ethernet link's rate; at 25 or 50 GbE, 'ethernet_tcp' "
    "with cluster.nic.gpudirect_rdma: true"
)

# Names users bring from other tools for a value this one spells otherwise: (key's last name, or its
# last two, value) -> hint
_SYNONYMS = {
    ("attention", "sdpa"): "PyTorch's scaled_dot_product_attention is 'fused'",
    ("attention", "flash_attention_2"): "FlashAttention is 'fused'",
    ("attention", "flash"): "FlashAttention is 'fused'",
    ("execution", "torch.compile"): "torch.compile is 'compiled'",
    ("memory_format", "nhwc"): "NHWC is 'channels_last'",
    ("memory_format", "nchw"): "NCHW is 'contiguous'",
    # RoCE is NCCL's IB verbs transport over Ethernet (docs/network.md, "Which NIC kind"): modelled as
    # infiniband at the link's rate; 25/50 GbE, which InfiniBand has no port for, as ethernet_tcp with
    # gpudirect_rdma (the RDMA data path and latency at the Ethernet rate)
    ("nic.kind", "roce"): _ROCE,
    ("nic.kind", "rocev2"): _ROCE,
    ("nic.kind", "ethernet"): "TCP over Ethernet is 'ethernet_tcp'; " + _ROCE,
    ("nic.kind", "tcp"): "TCP over Ethernet is 'ethernet_tcp'",
    ("nic.kind", "ib"): "InfiniBand is 'infiniband'",
}


_LOADER = None


# A plain decimal integer or float (leading zeros are decimal, as `--set` reads them), and YAML's
# .inf / .nan words, which the schemas refuse by name (allow_inf_nan=False).
_PLAIN_INT = re.compile(r"^[-+]?[0-9]+$")
_PLAIN_FLOAT = re.compile(
    r"^(?:[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)


def _loader():
    """The safe loader, refusing a key given twice in one mapping. PyYAML keeps the last silently (the
    YAML spec says keys are unique), so a second ``training:`` block dropped the first without a word.
    Keys merged in with ``<<`` may still be overridden, as YAML means them to be."""
    global _LOADER
    if _LOADER is None:
        import yaml

        class UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            def construct_mapping(self, node, deep=False):
                if isinstance(node, yaml.MappingNode):
                    seen = set()
                    for key_node, _ in node.value:
                        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                            continue
                        key = self.construct_object(key_node)
                        if key in seen:
                            raise yaml.constructor.ConstructorError(
                                None,
                                None,
                                f"key {shown_key(key)!r} given twice in one mapping",
                                key_node.start_mark,
                            )
                        seen.add(key)
                return super().construct_mapping(node, deep)

        # Numbers are plain decimals, as JSON and `--set` read them. YAML 1.1 (PyYAML) reads 1e9 without a
        # dot as text, and 0x190, 0620 (octal), 6:40 (base 60) or 4_00 as numbers nobody wrote; here the
        # first is the number written and the others are text, which every number field refuses by name
        # (catalog.Number, Count: a quoted "25" is not 25 either).
        resolvers = UniqueKeyLoader.yaml_implicit_resolvers = {
            first: [(tag, rx) for tag, rx in pairs if not tag.endswith((":int", ":float"))]
            for first, pairs in UniqueKeyLoader.yaml_implicit_resolvers.items()
        }
        del resolvers  # the class's own copy, filtered: the shared SafeLoader's stays as it is
        UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:int", _PLAIN_INT, list("-+0123456789"))
        UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", _PLAIN_FLOAT, list("-+.0123456789"))
        UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", lambda loader, node: int(node.value))
        _LOADER = UniqueKeyLoader
    return _LOADER


# libyaml's C parser when PyYAML was built with it (about 10x faster than the pure-Python one, and every
# run parses a preset and three catalogs); the same safe constructor either way, so the same values.
def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` through libyaml when available, refusing duplicate keys (``_loader``)."""
    import yaml

    return yaml.load(text, Loader=_loader())


class _DuplicateKey(ValueError):
    """A JSON object gave a key twice: json keeps the last silently, as YAML would (refused there too)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


# The largest file any command reads as input. The biggest legitimate inputs are raw calibration files
# and nccl-tests logs of a few MB (a full sweep of 8 collectives x 30 sizes x 4 shapes is ~1 MB of
# JSON) and sweep results of 1e5 rows (~30 MB of CSV); 256 MiB is ten times that, and keeps a device or
# a mistaken disk image from being read into memory.
MAX_INPUT_BYTES = 256 * 2**20
# Nesting of mappings and lists in a structured input. The deepest schema (a scenario's
# training.optimizer_options.scheme.N.bits, a profile's collectives.N.quality.alpha_ci95_s.N) is 6
# levels deep; 64 is far above any real file and far below Python's recursion limit (1000), which a
# deeply nested file used to hit inside the parser or the validator (RecursionError).
MAX_DEPTH = 64
# Values (numbers, strings, mappings, lists) in one structured input, YAML aliases expanded. The largest
# legitimate one is a raw calibration file: 8 collectives x 30 sizes x a dozen group shapes of records
# of ~10 values each, ~3e4 values; 2e6 leaves room for files many times that, and refuses an alias bomb
# (a few lines that expand to billions of values) before anything walks it.
MAX_VALUES = 2_000_000


def _refuse_special(path: Path) -> int:
    """The file's size, after refusing what is not a regular file: a named pipe blocks its reader
    forever and /dev/zero never ends, so both are refused before the first byte is read."""
    import stat

    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError("file not found", source=str(path)) from None
    except OSError as exc:
        raise InputError(
            f"cannot read ({exc.strerror or exc.__class__.__name__})", source=str(path)
        ) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError("is a folder; give a file", source=str(path))
    if not stat.S_ISREG(st.st_mode):
        kind = "a named pipe" if stat.S_ISFIFO(st.st_mode) else "a device or socket"
        raise InputError(f"is {kind}, not a regular file; give a file", source=str(path))
    if st.st_size > MAX_INPUT_BYTES:
        raise InputError(
            f"{st.st_size:,} bytes is more than an input file may hold ({MAX_INPUT_BYTES:,})",
            source=str(path),
        )
    return st.st_size


def read_input_text(path: str | Path) -> str:
    """The text of an input file: a regular file (not a pipe or device), at most MAX_INPUT_BYTES, UTF-8.
    Every error names the file and never shows its content."""
    path = Path(path)
    _refuse_special(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_INPUT_BYTES + 1)
    except OSError as exc:
        raise InputError(
            f"cannot read ({exc.strerror or exc.__class__.__name__})", source=str(path)
        ) from None
    if len(data) > MAX_INPUT_BYTES:  # it grew after the check
        raise InputError(f"more than an input file may hold ({MAX_INPUT_BYTES:,} bytes)", source=str(path))
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        for magic, kind, tool in _COMPRESSED:
            if data.startswith(magic):
                raise InputError(
                    f"is {kind}-compressed, not text: decompress it first ({tool}), whatever its name says",
                    source=str(path),
                ) from None
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"not UTF-8 text (an invalid byte on line {line})", source=str(path)) from None


# Compressed files given as inputs (a results.csv.gz renamed results.csv, a profile.json.gz saved as
# profile.json): their magic numbers (RFC 1952 for gzip, the bzip2, xz, Zstandard and ZIP formats'
# own), read only once a file has failed to decode as UTF-8 (none of them decodes).
_COMPRESSED = (
    (b"\x1f\x8b", "gzip", "gunzip"),
    (b"BZh", "bzip2", "bunzip2"),
    (b"\xfd7zXZ\x00", "xz", "unxz"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
    (b"PK\x03\x04", "zip", "unzip"),
)


def check_depth(data: Any, source: str | None = None) -> Any:
    """Refuse nesting deeper than MAX_DEPTH, more than MAX_VALUES values once YAML aliases are expanded,
    and a structure that contains itself. YAML anchors and aliases share one object among many places
    (a few lines of ``&a [*b, *b, ...]`` stand for 10**9 values, which every later walk, the validator's
    included, would visit one by one); the sizes are counted once per shared object, in time linear in
    the file, without recursion."""
    done: dict[int, tuple[int, int]] = {}  # id -> (height, values counted with repeats)
    open_: set[int] = set()
    # where each shared object was first met: its key path, so that a refusal names the key it sits
    # under (an alias bomb under ``training.optimizer_options``)
    where: dict[int, tuple] = {id(data): ()}
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, finish = stack.pop()
        if not isinstance(node, dict | list):
            continue
        key = id(node)
        items = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        children = [c for _, c in items]
        if not finish:
            if key in done:
                continue
            if key in open_:
                raise InputError(
                    "a value contains itself (a YAML alias inside its own anchor)",
                    source=source,
                    key=_path_key(where.get(key, ())),
                )
            open_.add(key)
            stack.append((node, True))
            for k, c in items:
                if isinstance(c, dict | list) and id(c) not in done:
                    where.setdefault(id(c), (*where.get(key, ()), k))
                    stack.append((c, False))
            continue
        height, values = 1, 1
        for c in children:
            if isinstance(c, dict | list):
                h, n = done[id(c)]
                height, values = max(height, h + 1), values + n
            else:
                values += 1
        if height > MAX_DEPTH:
            raise _too_deep(source)
        if values > MAX_VALUES:
            raise InputError(
                f"more than {MAX_VALUES:,} values once its YAML aliases are expanded",
                source=source,
                key=_path_key(where.get(key, ())),
            )
        open_.discard(key)
        done[key] = (height, values)
    return data


def non_finite_at(data: Any) -> str | None:
    """The dotted key of the first NaN or infinity in parsed JSON (json reads NaN and Infinity), or None:
    for files whose every value is kept and written back (a stored testbed run), not only those a
    schema checks."""
    stack: list[tuple[Any, tuple]] = [(data, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return ".".join(shown_key(p) for p in path) or "(top level)"
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack.extend((v, (*path, k)) for k, v in reversed(list(items)))
    return None


def _path_key(path: tuple) -> str | None:
    """A key path as an error names it (``training.optimizer_options``), its first two parts: the
    section a value sits under, not a list index deep inside it. None at the top level."""
    return ".".join(shown_key(p) for p in path[:2]) or None


def _check_json_depth(text: str, data: Any, source: str) -> Any:
    """MAX_DEPTH for parsed JSON, which has no aliases: a plain walk, skipped when the text has too few
    brackets to nest that deep (a scenario line of scenarios.jsonl has a few dozen)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return data
    stack = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        if depth > MAX_DEPTH:
            raise _too_deep(source)
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return data


def _too_deep(source: str) -> InputError:
    return InputError(f"nested deeper than {MAX_DEPTH} levels", source=source)


def parse_json(text: str, source: str) -> Any:
    """JSON text with unique keys and bounded nesting; errors name ``source`` and the line."""
    try:
        return _check_json_depth(text, json.loads(text, object_pairs_hook=_unique_keys), source)
    except _DuplicateKey as exc:
        raise InputError(
            f"invalid JSON: key {shown_key(exc.args[0])!r} given twice in one object", source=source
        ) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON at line {exc.lineno}: {exc.msg}", source=source) from None
    except RecursionError:
        raise _too_deep(source) from None


def parse_yaml(text: str, source: str) -> Any:
    """YAML text (the safe loader, unique keys) with bounded nesting; errors name ``source`` and the
    line, and say what is wrong without quoting the file."""
    import yaml

    try:
        return check_depth(load_yaml(text), source)
    except RecursionError:
        raise _too_deep(source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        if "nesting depth" in problem:  # libyaml's own limit (1000), before the reader's
            raise _too_deep(source) from None
        raise InputError(f"invalid YAML{where}: {problem}", source=source) from None


def read_structured_file(path: str | Path, fmt: str | None = None) -> Any:
    """Parse a YAML or JSON input file (``fmt`` "json" or "yaml"; default: by its suffix, .json is JSON)
    through read_input_text and the parsers above: the one reader of structured input."""
    path = Path(path)
    text = read_input_text(path)
    if (fmt or ("json" if path.suffix.lower() == ".json" else "yaml")) == "json":
        return parse_json(text, str(path))
    return parse_yaml(text, str(path))


def read_jsonl(path: str | Path) -> list[tuple[int, Any]]:
    """A JSON-lines file as (line number, value) pairs, blank lines skipped; a damaged line is an
    InputError naming the file and the line."""
    path = Path(path)
    out = []
    for n, line in enumerate(read_input_text(path).splitlines(), 1):
        if line.strip():
            try:
                out.append((n, parse_json(line, str(path))))
            except InputError as exc:
                raise InputError(f"line {n}: {exc.message}", source=str(path)) from None
    return out


def check_writable_file(path: Path, inputs: Iterable[str | Path | None] = ()) -> Path:
    """``path`` can be written as a file: not a folder, and its folder exists (never created silently),
    and it is none of the command's ``inputs`` (the scenario, the raw file, a results folder's files):
    writing one would replace what the command read, so ``--out`` naming an input is refused. Call it
    before long work so that a bad ``--out`` fails first."""
    path = Path(path)
    for given in inputs:
        if given is not None and same_file(path, given):
            also = "" if str(given) == str(path) else f" ({given})"
            raise InputError(
                f"is also this command's input{also}; writing it would replace it: give another file",
                source=str(path),
            )
    try:  # stat raises PermissionError (not False) under a folder this process may not search
        if path.is_dir():
            raise InputError("is a folder; give a file name", source=str(path))
        if not path.parent.is_dir():
            what = "is not a folder" if path.parent.exists() else "does not exist"
            raise InputError(f"cannot write: {path.parent} {what}", source=str(path))
    except OSError as exc:
        raise InputError(
            f"cannot write ({exc.strerror or exc.__class__.__name__}); nothing written", source=str(path)
        ) from None
    if not os.access(path.parent, os.W_OK | os.X_OK):  # a read-only folder or file system, said up front
        raise InputError(f"cannot write: {path.parent} is not writable; nothing written", source=str(path))
    return path


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file: the same file on disk (a hard or symbolic link, ``./x`` and
    ``x``), or, before it exists, the same absolute path with links resolved."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet)
        return Path(a).resolve() == Path(b).resolve()


def write_text_atomically(path: Path, text: str | bytes, mode: int | None = None) -> None:
    """Write to a temporary file beside ``path`` and rename: a crash or a full disk never leaves half a
    file behind; any failure is one InputError naming the file. ``bytes`` are written as they are
    (Chakra's protobuf traces)."""
    path = check_writable_file(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, (0o666 & ~umask) if mode is None else mode)  # mkstemp makes 0600
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise InputError(
            f"cannot write ({exc.strerror or exc.__class__.__name__}); nothing written", source=str(path)
        ) from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def write_json_atomically(path: Path, data: dict) -> None:
    """JSON, written atomically (write_text_atomically). NaN and Infinity are not JSON: refused."""
    try:
        text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    except ValueError:
        raise InputError(
            "a value is not a finite number (NaN or infinity); nothing written", source=str(path)
        ) from None
    write_text_atomically(path, text)
