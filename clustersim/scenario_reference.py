"""The scenario reference as Markdown, written from the JSON Schema of the pydantic model.

The docs site's scenario reference is generated from this at build time (``docs/hooks.py``), so it
cannot drift from what ``clustersim run`` accepts: every key, its type, default, limits and the
description the schema itself carries. ``clustersim schema`` prints the same schema as JSON.
"""

from __future__ import annotations

import json
from typing import Any

LIMITS = {  # JSON Schema keyword -> how the reference writes it
    "minimum": "≥ {}",
    "exclusiveMinimum": "> {}",
    "gt": "> {}",
    "ge": "≥ {}",
    "maximum": "≤ {}",
    "exclusiveMaximum": "< {}",
    "lt": "< {}",
    "le": "≤ {}",
    "minLength": "at least {} characters",
    "minItems": "at least {} items",
}


def scenario_schema() -> dict[str, Any]:
    """The JSON Schema of a scenario file (pydantic's, draft 2020-12)."""
    from clustersim.scenario import Scenario

    return Scenario.model_json_schema()


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(prop: dict[str, Any], defs: dict[str, Any], anchors: dict[str, str]) -> str:
    if "$ref" in prop:
        name = _ref_name(prop["$ref"])
        target = defs[name]
        if "enum" in target:
            return " | ".join(f"`{v}`" for v in target["enum"])
        return f"[{anchors.get(name, name)}](#{anchors.get(name, name).replace('.', '')})"
    if "enum" in prop:
        return " | ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    if "anyOf" in prop:
        parts = [_type(p, defs, anchors) for p in prop["anyOf"]]
        return " or ".join(p for p in parts if p != "null") + (" or null" if "null" in parts else "")
    kind = prop.get("type")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}), defs, anchors)}"
    if kind == "object":
        extra = prop.get("additionalProperties")
        return (
            "mapping"
            if not isinstance(extra, dict) or not extra
            else f"mapping of {_type(extra, defs, anchors)}"
        )
    return kind or "any"


def _limits(prop: dict[str, Any]) -> str:
    found = []
    for option in [prop, *prop.get("anyOf", [])]:
        found += [text.format(option[key]) for key, text in LIMITS.items() if key in option]
    return ", ".join(dict.fromkeys(found))


def _default(prop: dict[str, Any], required: bool) -> str:
    if required:
        return "required"
    if "default" not in prop:
        return ""
    value = prop["default"]
    if isinstance(value, dict):
        return "see its section" if value else "`{}`"
    text = json.dumps(value)
    return f"`{text}`" if len(text) <= 40 else "see its section"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _sections(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every object of the schema with the dotted key it is reached by, parents before children."""
    defs = schema.get("$defs", {})
    out: list[tuple[str, dict[str, Any]]] = [("scenario", schema)]
    seen = {"scenario"}
    i = 0
    while i < len(out):
        path, obj = out[i]
        i += 1
        for key, prop in obj.get("properties", {}).items():
            for option in [prop, *prop.get("anyOf", []), prop.get("items", {})]:
                items = option.get("items", {}) if option.get("type") == "array" else option
                if "$ref" in items:
                    name = _ref_name(items["$ref"])
                    target = defs[name]
                    if "properties" in target and name not in seen:
                        seen.add(name)
                        dotted = key if path == "scenario" else f"{path}.{key}"
                        out.append((dotted, target | {"_def": name}))
    return out


def reference_markdown(schema: dict[str, Any] | None = None) -> str:
    """The scenario reference page: one section and table per object of the schema."""
    schema = schema or scenario_schema()
    defs = schema.get("$defs", {})
    sections = _sections(schema)
    anchors = {obj["_def"]: path for path, obj in sections if "_def" in obj}
    lines = [
        "# Scenario reference",
        "",
        "Every key of a scenario file, generated from the schema that validates it (the pydantic model in",
        "`clustersim/scenario.py`); `clustersim schema` prints the same schema as JSON Schema, for an",
        "editor's completion and checks. A key not listed here is refused, as is a value outside its",
        "limits: one line naming the file and the key, exit code 2. Lists of names (GPUs, models) are",
        "catalog data: `clustersim hardware list`, `clustersim models list`; each optimizer's",
        "`training.optimizer_options` are in [compressed optimizers](compressed-optimizers.md).",
        "",
    ]
    for path, obj in sections:
        lines += [f"## {path}", ""]
        if obj.get("description") and path != "scenario":
            lines += [" ".join(obj["description"].split()), ""]
        lines += ["| key | type | default | limits | description |", "|---|---|---|---|---|"]
        required = set(obj.get("required", []))
        for key, prop in obj.get("properties", {}).items():
            row = [
                f"`{key}`",
                _type(prop, defs, anchors),
                _default(prop, key in required),
                _limits(prop),
                prop.get("description", ""),
            ]
            lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
        lines.append("")
    return "\n".join(lines)
