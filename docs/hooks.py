"""mkdocs hooks (mkdocs.yml `hooks:`): the scenario reference, written from the schema at build time, and
pages not named in `nav` added under "More" so that a new page never goes missing from the site."""

from __future__ import annotations

import sys
from pathlib import Path

GENERATED = "scenario-reference.md"  # written from clustersim.scenario_reference, never checked in
MORE = "More"  # the nav section that collects pages mkdocs.yml does not name


def _named(nav) -> set[str]:
    """Every page path named anywhere in a nav tree."""
    found: set[str] = set()
    for item in nav or []:
        if isinstance(item, str):
            found.add(item)
        elif isinstance(item, dict):
            for value in item.values():
                found |= _named(value) if isinstance(value, list) else {value}
    return found


def on_config(config, **kwargs):
    docs = Path(config["docs_dir"])
    named = _named(config["nav"])
    extra = sorted(
        p.relative_to(docs).as_posix()
        for p in docs.rglob("*.md")
        if p.relative_to(docs).as_posix() not in named
    )
    if extra and config["nav"] is not None:
        config["nav"].append({MORE: extra})
    return config


def on_files(files, config, **kwargs):
    from mkdocs.structure.files import File

    root = str(Path(config.config_file_path).resolve().parent)
    if root not in sys.path:  # the reference of this checkout's schema, whatever else is installed
        sys.path.insert(0, root)
    from clustersim.scenario_reference import reference_markdown

    files.append(File.generated(config, GENERATED, content=reference_markdown()))
    return files
