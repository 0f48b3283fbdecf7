"""Whole-number command options (``--steps``, ``--tokens``, ``--global-batch``, ``--gpus``,
``--break-even-at``) read as a file reads a count: a plain decimal, with a point or an exponent where it
is whole (``1e9``, ``1000000000``, ``8.0``; ``010`` is ten), as ``--set`` and io.load_yaml read numbers.
``1.5e0`` is not a count; ``0x10``, ``4_00``, ``1:30``, ``nan`` are not plain decimals. An ``int``
option refused ``1e9`` and Python's ``int`` took ``4_00``, which a file refuses; one parser
(units.parse_count, which the API's StepsPlan uses too) serves every such option (a typer ``parser=``),
so they read counts alike.
"""

from __future__ import annotations

import typer

from clustersim.errors import InputError
from clustersim.units import parse_count

__all__ = ["count_option", "counts_by_name", "parse_count"]


def count_option(least: int | None = 1):
    """The parser of a one-count option (parse_count): ``typer.Option(None, "--tokens",
    parser=count_option())``. A bad value is click's one line 'Invalid value for '--tokens': why' and
    exit 2 (commands/support.one_line_usage_errors), which names the option."""

    def parse(text: str) -> int:
        try:
            return parse_count(str(text), "value", least)
        except InputError as exc:
            raise typer.BadParameter(exc.message) from None

    return parse


def counts_by_name(text: str) -> str:
    """The parser of ``--steps``: ``100000`` or ``adam=100000,binsgdm=1.1e5``, each count read by
    parse_count and written back as its digits, so the command's own reader (planner.compare.StepsPlan,
    which also says a count that is not positive) sees whole numbers only."""
    parts = []
    for part in str(text).split(","):
        name, eq, number = part.rpartition("=")
        if not part.strip():
            parts.append(part)
            continue
        try:
            parts.append(f"{name}{eq}{parse_count(number, 'value', least=None)}")
        except InputError as exc:
            said = f"{part.strip()!r}: {exc.message}" if eq else exc.message
            raise typer.BadParameter(said) from None
    return ",".join(parts)
