"""`calibrate run --testbed N`: the whole calibrate -> fit loop over a real (emulated) TCP network."""

from __future__ import annotations

from pathlib import Path

from clustersim.calibration.collectives import OPS, parse_ops
from clustersim.calibration.run import save_profile
from clustersim.errors import InputError
from clustersim.testbed import hosts, sweep
from clustersim.testbed.shaping import parse_rate
from clustersim.units import parse_bytes


@hosts.down_on_sigterm
def calibrate_on_testbed(
    n_hosts: int,
    rate: str,
    out: Path,
    raw_out: Path | None,
    min_bytes: str,
    max_bytes: str,
    ops: str,
    repeat: int,
    progress=None,
    cpus_per_host: float | None = None,
):
    """Bring the testbed up (unless it is), sweep, fit and write the profile; ``progress(message)``."""
    bits = parse_rate(rate)
    lo, hi = _size(min_bytes, "--min-bytes"), _size(max_bytes, "--max-bytes")
    if lo > hi:  # checked before the testbed comes up: a sweep of no sizes measures nothing
        raise InputError(
            f"{min_bytes} is more than --max-bytes {max_bytes}: no message size to measure",
            key="--min-bytes",
        )
    named = parse_ops(ops)
    unknown = [op for op in named if op not in OPS]
    if unknown or not named:
        raise InputError(
            f"unknown collective {', '.join(map(repr, unknown)) or repr(ops)}; known: {', '.join(OPS)}",
            key="--ops",
        )
    tb, created = hosts.up(n_hosts, bits, cpus_per_host=cpus_per_host)
    try:
        command = (
            f"clustersim calibrate run --testbed {n_hosts} --rate {rate} --min-bytes {min_bytes} "
            f"--max-bytes {max_bytes} --ops {ops} --repeat {repeat} --cpus-per-host {tb.cpus_per_host or 0:g}"
        )
        raw = sweep.run(
            tb,
            raw_out or out.with_suffix(".raw.json"),
            ",".join(named),
            lo,
            hi,
            repeat,
            warmup=1,
            progress=progress,
            command=command,
        )
    finally:
        if created:
            hosts.down(tb)
    return save_profile(raw, out)


def _size(text: str, option: str) -> int:
    try:
        return int(parse_bytes(text))
    except InputError as exc:
        raise exc.located(key_prefix=option) from None
