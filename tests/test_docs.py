"""The README and the docs site: short README, no link leaving the repository, no development log,
the Python API's examples run, the scenario reference covers the schema, the README's commands exist.

`mkdocs build --strict` itself runs in `make test` (the Makefile's `docs` target): it fails on a link to
a missing page or anchor."""

import re
import shlex
from pathlib import Path

import click
import pytest
import typer
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _user_docs() -> list[Path]:
    return [README, *PAGES]


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 200


@pytest.mark.parametrize("path", _user_docs(), ids=lambda p: p.name)
def test_no_link_leaves_the_repository(path):
    for target in LINK.findall(path.read_text()):
        assert "://" not in target and not target.startswith(("mailto:", "/")), f"{path.name}: {target}"
        if target.startswith("#"):
            continue
        resolved = (path.parent / target.split("#")[0]).resolve()
        assert resolved.is_relative_to(ROOT), f"{path.name}: {target} leaves the repository"


DEVELOPMENT_LOG = [
    (re.compile(r"\bissue #?\d+|#\d{1,4}\b", re.I), "an issue number"),
    (re.compile(r"`[0-9a-f]{7,40}`"), "a commit hash"),
    (re.compile(r"\b20\d\d-\d\d-\d\d\b"), "a date"),
    (re.compile(r"shared/reference"), "a path outside the repository"),
]


@pytest.mark.parametrize("path", _user_docs(), ids=lambda p: p.name)
def test_no_development_log(path):
    text = path.read_text()
    for pattern, what in DEVELOPMENT_LOG:
        found = pattern.search(text)
        assert found is None, f"{path.name} holds {what}: {found.group(0)!r}"


def test_what_the_compressed_optimizers_combine_with_is_said_once():
    """One place says what 1-bit Adam and friends cannot be combined with; the others link to it."""
    holders = [p.name for p in _user_docs() if "1bit-Adam is not compatible with ZeRO" in p.read_text()]
    assert holders == ["compressed-optimizers.md"]


def test_api_examples_run():
    """docs/api.md's ```python blocks, run one after another in one namespace, as a notebook would."""
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / "api.md").read_text(), re.S)
    assert len(blocks) >= 5
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/api.md block {i + 1}", "exec"), namespace)
    assert namespace["answer"].chosen is not None


def test_readme_python_example_runs():
    (block,) = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    pytest.importorskip("pandas")
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    assert len(namespace["df"]) == 4  # 2 optimizers x 2 GPU counts


def _cli_lines() -> list[list[str]]:
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("clustersim "):
                lines.append(shlex.split(line)[1:])
    return lines


@pytest.mark.parametrize("argv", _cli_lines(), ids=" ".join)
def test_readme_commands_exist_with_their_options(argv):
    """Every `clustersim ...` line in the README names a real command and options it takes."""
    from clustersim.cli import app

    command = typer.main.get_command(app)
    ctx = command.make_context("clustersim", list(argv), resilient_parsing=True)
    while isinstance(command, click.Group) and ctx.protected_args + ctx.args:
        name, *rest = ctx.protected_args + ctx.args
        command = command.get_command(ctx, name)
        assert command is not None, f"no command {name!r}"
        ctx = command.make_context(name, rest, parent=ctx)  # unknown options fail here


def test_readme_tour_files_exist_and_name_their_files():
    for argv in _cli_lines():
        for arg in argv:
            if arg.startswith("examples/"):
                assert (ROOT / arg).is_file(), arg
    tour = yaml.safe_load((ROOT / "examples" / "tour-bert-nics.yaml").read_text())
    assert tour["vary"]["nic_gbps"] == [25, 50, 100] and tour["vary"]["model"] == ["BERT-Large"]
    # The tour is the planning guide's question in short: the same team cluster (fp16 gradients,
    # framework kernels), not the BinSGDM paper's BERT-Base preset with its fp32 gradient all-reduce.
    assert tour["base"] == "a100-8gpu-ethernet.yaml"
    guide = (ROOT / "docs" / "planning-guide.md").read_text()
    assert "`examples/a100-8gpu-ethernet.yaml` is the team's cluster" in guide


def test_scenario_reference_covers_every_key():
    """The generated reference has a section per object of the schema and a row per key in it."""
    from clustersim.scenario_reference import reference_markdown, scenario_schema

    schema = scenario_schema()
    text = reference_markdown(schema)
    sections = dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", text, re.S | re.M))
    for key in schema["properties"]:
        assert f"| `{key}` |" in sections["scenario"], key
    for name in ("cluster", "cluster.nic", "training.sharding.zeropp", "cluster.heterogeneity.slow_gpus"):
        assert name in sections, name
    nic = schema["$defs"]["NicSpec"]["properties"]
    for key, prop in nic.items():
        assert f"| `{key}` |" in sections["cluster.nic"], key
        if "description" in prop:
            assert prop["description"] in sections["cluster.nic"]
    assert "| `line_rate_gbps` | number | `200.0` | > 0 |" in sections["cluster.nic"]
    assert "`infiniband`" in sections["cluster.nic"]  # an enum lists its values
    assert "[cluster.nic](#clusternic)" in sections["cluster"]  # a nested object links to its section


def test_site_nav_names_the_generated_reference_and_collects_unnamed_pages(tmp_path):
    """mkdocs.yml names every page written here; the hook puts a page nobody named under "More"."""
    import importlib.util

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    named = hooks._named(config["nav"])
    assert "scenario-reference.md" in named
    assert {p.relative_to(DOCS).as_posix() for p in PAGES} <= named  # this repository's pages, placed
    (tmp_path / "index.md").write_text("# Home\n")
    (tmp_path / "new-page.md").write_text("# A new page\n")
    result = hooks.on_config({"docs_dir": str(tmp_path), "nav": [{"Home": "index.md"}]})
    assert result["nav"] == [{"Home": "index.md"}, {hooks.MORE: ["new-page.md"]}]


def test_pyproject_extras_hold_the_docs_tools():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("docs", "test"):
        names = {re.split(r"[<>=\[]", req)[0] for req in extras[extra]}
        assert {"mkdocs", "mkdocs-material"} <= names, extra
    assert "docs" in (ROOT / "Makefile").read_text().split("\ntest:")[1].splitlines()[0]
