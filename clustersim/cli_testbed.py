"""`clustersim testbed ...`: an emulated multi-host cluster on this machine (namespaces, veth, tc)."""

from __future__ import annotations

from typing import Optional

import typer

from clustersim.cli_support import JsonOpt, console, emit_json, spinner, table, user_errors

testbed_app = typer.Typer(
    help="An emulated cluster on one Linux machine: N hosts in network namespaces, "
    "each on a shaped link (tc tbf) to one bridge. Needs root, ip and tc.",
    no_args_is_help=True,
)


@testbed_app.command("up")
@user_errors
def testbed_up(
    hosts: int = typer.Option(..., "--hosts", help="Number of emulated hosts (2..64)."),
    rate: str = typer.Option(
        ..., "--rate", help="Link rate per host and direction, tc units: 200mbit, 1gbit."
    ),
    delay: Optional[float] = typer.Option(None, "--delay", help="One-way delay, ms (needs tc netem)."),
    json_out: bool = JsonOpt,
):
    """Create the hosts (idempotent: the same parameters keep a running testbed; others rebuild it)."""
    from clustersim.testbed.hosts import up
    from clustersim.testbed.shaping import parse_rate

    tb, created = up(hosts, parse_rate(rate), delay)
    if json_out:
        emit_json({**tb.describe(), "created": created})
        return
    console.print(
        ("created" if created else "already up:") + f" {tb.hosts} hosts at {tb.describe()['rate']} "
        f"per direction, shaped with {tb.shaper}"
    )
    _print(tb)


@testbed_app.command("down")
@user_errors
def testbed_down():
    """Remove everything the testbed created (and nothing else)."""
    from clustersim.testbed.hosts import down, require_tools

    require_tools()
    removed = down()
    console.print(f"removed {len(removed)} namespaces and links" if removed else "no testbed was up")


@testbed_app.command("status")
@user_errors
def testbed_status(json_out: bool = JsonOpt):
    """Hosts, addresses, rate and shaper of the running testbed."""
    from clustersim.testbed.hosts import load_state

    tb = load_state()
    if json_out:
        emit_json(tb.describe() if tb else None)
        return
    if tb is None:
        console.print("no testbed is up")
        return
    _print(tb)


@testbed_app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@user_errors
def testbed_exec(ctx: typer.Context, host: str = typer.Argument(..., help="h0, h1, ... (or cst-h0)")):
    """Run a command on one host: clustersim testbed exec h1 -- python -c 'print(1)'. Exits with its code."""
    from clustersim.errors import InputError
    from clustersim.testbed.hosts import exec_in, require_tools

    require_tools()
    if not ctx.args:
        raise InputError("give the command after --", key="CMD")
    raise typer.Exit(exec_in(host, list(ctx.args)).wait())


@testbed_app.command("validate")
@user_errors
def testbed_validate(
    hosts: str = typer.Option(
        "2,4,8", "--hosts", help="Host counts to run the DDP job on (comma-separated)."
    ),
    rate: str = typer.Option("200mbit", "--rate", help="Link rate per host and direction, tc units."),
    width: int = typer.Option(512, "--width", min=16, help="MLP width (4 Linear layers of width x width)."),
    batch: int = typer.Option(256, "--batch", min=1, help="Samples per host per step."),
    samples: int = typer.Option(16, "--samples", min=0, max=1000, help="Parameter draws for the P10–P90."),
    json_out: bool = JsonOpt,
):
    """Predict a real PyTorch DDP training step on the emulated hosts, then run it: measured vs predicted.

    The network model is fitted on a collective sweep over the smaller host groups; each host's compute
    is measured by running the same MLP on all hosts at once without communication."""
    from clustersim.errors import InputError
    from clustersim.testbed.hosts import require_tools
    from clustersim.testbed.validate import validate_ddp

    require_tools()
    try:
        counts = sorted({int(x) for x in hosts.split(",") if x.strip()})
    except ValueError:
        raise InputError(f"expected comma-separated host counts, got {hosts!r}", key="--hosts") from None
    if not counts or counts[0] < 2:
        raise InputError("host counts must be 2 or more", key="--hosts")
    with spinner("testbed validation", json_out) as progress:
        result = validate_ddp(counts, rate, width=width, batch=batch, samples=samples, progress=progress)
    if json_out:
        emit_json(result)
        return

    def ms(mid: float, lo: float, hi: float) -> str:
        return f"{1e3 * mid:,.0f} ({1e3 * lo:,.0f}–{1e3 * hi:,.0f})"

    rows = [
        [
            r["hosts"],
            ms(r["measured_s"], r["measured_p10_s"], r["measured_p90_s"]),
            ms(r["predicted_s"], r["predicted_p10_s"], r["predicted_p90_s"])
            + (" ✓" if r["inside"] else " ✗"),
            f"{100 * r['error']:+.1f}%",
        ]
        for r in result["rows"]
    ]
    console.print(
        table(
            f"DDP step of a {result['params']:,}-parameter MLP at {rate}, ms (P10–P90)",
            ["hosts", "measured", "predicted", "error"],
            rows,
        )
    )
    console.print(
        f"[dim]network model fitted on groups of {result['rows'][-1]['network_fitted_on_ranks']} hosts; "
        "✓: the measured median is inside the predicted P10–P90[/]"
    )


def _print(tb) -> None:
    d = tb.describe()
    console.print(
        table(
            f"testbed: bridge {d['bridge']}, {d['rate']} per host and direction ({d['shaper']})",
            ["host", "address", "interface"],
            [[m["host"], m["address"], m["interface"]] for m in d["members"]],
        )
    )
