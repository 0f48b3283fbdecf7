"""Link rates as tc writes them, and the token-bucket (tbf) parameters that shape a host link.

tbf (Token Bucket Filter) is in every Linux kernel; netem (delay, loss) is a module that some kernels
lack, so delay is offered only where ``tc`` accepts netem.
"""

from __future__ import annotations

import re

from clustersim.errors import InputError

# tc's units (tc(8) "RATES"): bit-based decimal units, and byte-based ones ending in "bps".
_RATE_UNITS = {
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 8,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
    "tbps": 8e12,
}
_RATE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
MIN_RATE_BITS = 1e5  # 100 kbit/s: below this gloo's connection setup alone times out
MAX_RATE_BITS = 1e11  # 100 Gbit/s: far above what veth pairs on one host can carry
MTU_FRAME = 1514  # Ethernet frame at MTU 1500
BURST_SECONDS = 0.004  # tokens for 4 ms: above one kernel tick at HZ=250, so tbf can reach its rate


def parse_rate(text: str, key: str = "--rate") -> float:
    """``"500mbit"`` -> 5e8 bits per second, as tc reads it."""
    match = _RATE_RE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _RATE_UNITS:
        raise InputError(
            f"cannot read rate {text!r} (use tc units: 100mbit, 1gbit, 500kbit, 10mbps)", key=key
        )
    bits = float(match.group(1)) * _RATE_UNITS[unit]
    if not MIN_RATE_BITS <= bits <= MAX_RATE_BITS:
        raise InputError(
            f"rate {text!r} is outside {MIN_RATE_BITS / 1e3:g} kbit .. {MAX_RATE_BITS / 1e9:g} gbit", key=key
        )
    return bits


def format_rate(bits: float) -> str:
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits >= scale:
            return f"{bits / scale:g}{unit}"
    return f"{bits:g}bit"


def tbf_burst_bytes(bits: float) -> int:
    """Bucket size: ``rate x BURST_SECONDS``, at least two full frames (tbf refuses a bucket smaller
    than one packet, and a bucket below rate/HZ cannot deliver the rate)."""
    return max(2 * MTU_FRAME, int(bits / 8 * BURST_SECONDS))


def tbf_args(bits: float) -> list[str]:
    """``tc qdisc replace dev X root`` arguments; ``latency`` bounds the queue (50 ms of backlog)."""
    return ["tbf", "rate", f"{int(bits)}bit", "burst", str(tbf_burst_bytes(bits)), "latency", "50ms"]
