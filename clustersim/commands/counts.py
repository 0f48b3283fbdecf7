"""Whole-number command options (``--steps``, ``--tokens``, ``--global-batch``, ``--gpus``,
``--break-even-at``) read as a file reads a count: a plain decimal, with a point or an exponent where it
is whole (``1e9``, ``1000000000``, ``8.0``; ``010`` is ten), as ``--set`` and io.load_yaml read numbers.
``1.5e0`` is not a count; ``0x10``, ``4_00``, ``1:30``, ``nan`` are not plain decimals. An ``int``
option refused ``1e9`` and Python's ``int`` took ``4_00``, which a file refuses; one parser here serves
every such option (a typer ``parser=``), so they read counts alike.
"""

from __future__ import annotations

import re
from decimal import Decimal

import typer

from clustersim.catalog import MAX_COUNT
from clustersim.errors import InputError

# the plain decimal forms --set reads (commands/support.py) and io.load_yaml resolves as numbers
_PLAIN = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


def parse_count(text: str, key: str, least: int | None = 1) -> int:
    """``text`` as a whole number of at least ``least`` (None: any sign, the caller bounds it) and at
    most catalog.MAX_COUNT (2**53, the largest count exact in floating point), else an InputError
    naming ``key``."""
    raw = text.strip()
    if not _PLAIN.fullmatch(raw):
        raise InputError(f"{raw!r} is not a plain decimal number (e.g. 1000000000 or 1e9)", key=key)
    value = Decimal(raw)
    # an exponent past 2**53's 16 digits is too large: said before a billion-digit integer is built
    if value.adjusted() > 16 or abs(value) > MAX_COUNT:
        side = "less than -2**53" if value < 0 else f"more than 2**53 ({MAX_COUNT:.3g})"
        raise InputError(f"{raw} is {side}, beyond any count a job holds", key=key)
    if value != value.to_integral_value():
        raise InputError(f"{raw} is not a whole number", key=key)
    count = int(value)
    if least is not None and count < least:
        raise InputError(f"{raw} is less than {least}", key=key)
    return count


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
