"""Small helpers the CLI commands share: error handling, JSON output, rich tables."""

from __future__ import annotations

import functools
import inspect
import json
import math
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from clustersim.errors import InputError

console = Console()
err_console = Console(stderr=True)


def fail(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def user_errors(fn):
    """Turn InputError into one line on stderr and exit code 2 (no traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            fail(str(exc))

    return wrapper


def emit_json(data) -> None:
    """Print ``data`` as JSON. NaN and Infinity are not JSON: they are refused, never printed."""
    try:
        text = json.dumps(data, indent=2, default=str, allow_nan=False)
    except ValueError:
        fail("a result is not a finite number (NaN or infinity); check the inputs' magnitudes")
    sys.stdout.write(text + "\n")


def finite_option(value: float | None, key: str, *, positive: bool = True) -> float | None:
    """A numeric command option: a finite number (positive unless told), else one line naming it."""
    if value is None:
        return None
    if not math.isfinite(value) or (positive and value <= 0):
        raise InputError(f"expected a finite{' positive' if positive else ''} number, got {value:g}", key=key)
    return value


def table(
    title: str, columns: list[str], rows: list[list], justify_numbers: bool = True, left: int = 1
) -> Table:
    """A rich table; the first ``left`` columns (names) are left-aligned, numbers right-aligned."""
    t = Table(title=title, title_justify="left", header_style="bold")
    for i, c in enumerate(columns):
        t.add_column(c, justify="right" if (justify_numbers and i >= left) else "left")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    return t


ScenarioArg = typer.Argument(..., help="Scenario file (YAML/JSON) or preset:NAME.")
JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")
SamplesOpt = typer.Option(
    16,
    "--samples",
    min=0,
    max=1000,
    help="Draws of the uncertain parameters (calibration covariance or documented default widths) for the "
    "P10–P90 band; each re-runs the simulation. 0 turns the band off.",
)
ProfileOpt = typer.Option(
    None, "--profile", help="Calibration profile (file or builtin:NAME); measured costs win over defaults."
)


CatalogOpt = typer.Option(
    None,
    "--catalog",
    help="User catalog file (YAML): GPU entries in the shipped gpus.yaml schema and/or model entries in "
    "models.yaml's (e.g. from `clustersim models import`); they are added to the catalog, replacing "
    "shipped ones of the same name. Repeatable; a later file wins.",
)


def with_catalogs(fn):
    """Give a command the ``--catalog`` option: the user catalogs are in use while it runs."""
    sig = inspect.signature(fn)
    extra = inspect.Parameter(
        "catalogs", inspect.Parameter.KEYWORD_ONLY, default=CatalogOpt, annotation=Optional[list[Path]]
    )

    @functools.wraps(fn)
    def wrapper(*args, catalogs: Optional[list[Path]] = None, **kwargs):
        from clustersim.catalog import user_catalogs

        with user_catalogs(catalogs):
            return fn(*args, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[*sig.parameters.values(), extra])
    wrapper.__annotations__ = {**getattr(fn, "__annotations__", {}), "catalogs": Optional[list[Path]]}
    return wrapper


def load_scenario_ref(ref: str):
    from clustersim.scenario import load_scenario

    return load_scenario(ref)


def ms(t: float) -> str:
    return f"{t * 1e3:,.2f}"


@contextmanager
def spinner(description: str, disabled: bool = False):
    """A one-line live status for long work of unknown length; yields ``progress(message)``."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=disabled,
    ) as bar:
        task = bar.add_task(description, total=None)
        yield lambda message: bar.update(task, description=str(message)[:70])
