"""Parsing and formatting of sizes, bandwidths, times and counts.

Internally everything is SI base units: bytes, bytes per second, seconds. Network line rates are
quoted in bits per second by vendors (40 GbE, 200 Gb/s HDR), memory and bus bandwidths in bytes per
second, so both spellings are accepted and the unit decides.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

from clustersim.errors import InputError

# Integers above 2**53 are not exact as floats, and every count is multiplied into float costs:
# ``micro_batch: 1e308`` overflowed there (OverflowError). No count of anything a training job holds
# (samples, GPUs, layers, steps) comes near 9e15.
MAX_COUNT = 2**53

_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str | int | float) -> float:
    """``"32MiB"`` -> 33554432.0; plain numbers are bytes."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _SIZE_RE.match(str(text))
        if not match or match.group(2).lower() not in _BYTE_UNITS:
            raise InputError(f"cannot read size {text!r} (use e.g. 512, 64KiB, 32MiB, 1.5GB)")
        value = float(match.group(1)) * _BYTE_UNITS[match.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"size must be a finite positive number of bytes, got {text!r}")
    if value < 1:  # hardware_defaults.yaml limits.size_bytes_min: nothing sent or stored is smaller
        raise InputError(f"{value:g} bytes is less than one byte ({text!r})")
    return value


def format_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:.0f} B"


_BIT_RATES = (("b/s", 1.0), ("kb/s", 1e3), ("Mb/s", 1e6), ("Gb/s", 1e9), ("Tb/s", 1e12))
_BYTE_RATES = (("B/s", 1.0), ("kB/s", 1e3), ("MB/s", 1e6), ("GB/s", 1e9), ("TB/s", 1e12))


def format_rate(bytes_per_s: float, *, bits: bool) -> str:
    """A bandwidth to three significant figures (trailing zeros kept) in the decimal unit that puts it
    at 1 to 999: ``bits`` for links and collectives, whose rates are quoted in bits per second (a
    200 Mb/s shaped link, 100 Gb/s InfiniBand), else bytes per second for memory and copies. A 200 Mb/s
    link is ``200 Mb/s``, not ``0.02 GB/s``; 2.5e7 bytes/s with ``bits`` is ``200 Mb/s`` too."""
    value = bytes_per_s * 8 if bits else bytes_per_s
    units = _BIT_RATES if bits else _BYTE_RATES
    if not math.isfinite(value) or value <= 0:
        return f"{value:g} {units[0][0]}"
    name, scale = units[0]
    for unit, size in units:
        if float(f"{value / size:.3g}") >= 1:  # rounded first: 999.7 Mb/s is 1.00 Gb/s
            name, scale = unit, size
    shown = float(f"{value / scale:.3g}")
    if shown >= 1000:  # past the largest unit: whole units, thousands separated
        return f"{value / scale:,.0f} {name}"
    decimals = max(0, 2 - math.floor(math.log10(shown))) if shown > 0 else 2
    return f"{shown:.{decimals}f} {name}"


def format_link_rate(gbps: float) -> str:
    """A link's line rate given in Gb/s (a scenario's ``line_rate_gbps``), as format_rate prints it."""
    return format_rate(gbps * 1e9 / 8, bits=True)


def count_of(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` things in words, the noun plural but for one: 1 GPU, 16,384 GPUs, 1 sample, 2 samples."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def ordinal(n: int) -> str:
    """``n`` as an ordinal in English: 1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st, 22nd, 101st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n:,}{suffix}"


def on_off(flag: bool) -> str:
    """A setting's boolean as a person says it: on / off (not Python's True / False)."""
    return "on" if flag else "off"


def format_seconds(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.2f} ms"
    return f"{t * 1e6:.1f} µs"


# the plain decimal forms --set reads (commands/support.py) and io.load_yaml resolves as numbers
_PLAIN = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


def parse_count(text: str, key: str, least: int | None = 1) -> int:
    """``text`` as a whole number of at least ``least`` (None: any sign, the caller bounds it) and at
    most MAX_COUNT (2**53, the largest count exact in floating point), else an InputError naming
    ``key``. The one reader of counts typed as text: the CLI's count options (commands/counts.py) and
    the API's (planner.compare.StepsPlan), so that both refuse the same text with the same words."""
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
