"""Reading and writing files the one way the project does it: errors that name the file and the key,
and writes that never leave half a file behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from clustersim.errors import InputError


def first_error(exc: ValidationError) -> tuple[str, str]:
    """The first pydantic error as (dotted key, one-line reason)."""
    err = exc.errors()[0]
    key = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "required key is missing"
    return key, msg


# libyaml's C parser when PyYAML was built with it (about 10x faster than the pure-Python one, and every
# run parses a preset and three catalogs); the same safe constructor either way, so the same values.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` through libyaml when available."""
    return yaml.load(text, Loader=_SAFE_LOADER)


def read_structured_file(path: Path) -> Any:
    """Parse YAML or JSON; errors name the file and the line."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError("file not found", source=str(path)) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read file ({exc.__class__.__name__})", source=str(path)) from None
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        return load_yaml(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON at line {exc.lineno}: {exc.msg}", source=str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise InputError(f"invalid YAML{where}: {problem}", source=str(path)) from None


def write_json_atomically(path: Path, data: dict) -> None:
    """Write to a temporary file beside ``path`` and rename: a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes 0600; the result should read like any other file
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
