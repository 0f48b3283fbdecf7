"""Reading and writing files the one way the project does it: errors that name the file and the key,
and writes that never leave half a file behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustersim.errors import InputError

if TYPE_CHECKING:  # pydantic and PyYAML are imported when used: `--help` and `presets list` stay quick
    from pydantic import ValidationError


def first_error(exc: ValidationError) -> tuple[str, str]:
    """The first pydantic error as (dotted key, one-line reason). A misspelt key shows up as an unknown
    key beside a missing one (``micro_bach`` / ``micro_batch``): that pair is reported as the typo."""
    import difflib

    errors = exc.errors()
    missing = [e["loc"] for e in errors if e["type"] == "missing"]
    for e in errors:
        if e["type"] != "extra_forbidden" or not e["loc"]:
            continue
        siblings = [str(m[-1]) for m in missing if m[:-1] == e["loc"][:-1]]
        match = difflib.get_close_matches(str(e["loc"][-1]), siblings, n=1)
        if match:
            return ".".join(str(p) for p in e["loc"]), f"unknown key (did you mean {match[0]}?)"
    err = errors[0]
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        return key, "unknown key"
    if err["type"] == "missing":
        msg = "required key is missing"
    msg = msg.removeprefix("Value error, ")
    if isinstance(err.get("input"), bool) and "true/false" not in msg:
        msg = f"{msg}, not {str(err['input']).lower()}"
    return key, msg


_LOADER = None


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
                                None, None, f"key {key!r} given twice in one mapping", key_node.start_mark
                            )
                        seen.add(key)
                return super().construct_mapping(node, deep)

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


def read_structured_file(path: Path) -> Any:
    """Parse YAML or JSON; errors name the file and the line."""
    import yaml

    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError("file not found", source=str(path)) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read file ({exc.__class__.__name__})", source=str(path)) from None
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text, object_pairs_hook=_unique_keys)
        return load_yaml(text)
    except _DuplicateKey as exc:
        raise InputError(
            f"invalid JSON: key {exc.args[0]!r} given twice in one object", source=str(path)
        ) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON at line {exc.lineno}: {exc.msg}", source=str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise InputError(f"invalid YAML{where}: {problem}", source=str(path)) from None


def check_writable_file(path: Path) -> Path:
    """``path`` can be written as a file: not a folder, and its folder exists (never created silently).
    Call it before long work so that a bad ``--out`` fails first."""
    path = Path(path)
    if path.is_dir():
        raise InputError("is a folder; give a file name", source=str(path))
    if not path.parent.is_dir():
        what = "is not a folder" if path.parent.exists() else "does not exist"
        raise InputError(f"cannot write: {path.parent} {what}", source=str(path))
    return path


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
