"""`clustersim testbed ...`: an emulated multi-host cluster on this machine (namespaces, veth, tc)."""

from __future__ import annotations

from typing import Optional

import typer

from clustersim.cli_support import JsonOpt, console, emit_json, table, user_errors

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


def _print(tb) -> None:
    d = tb.describe()
    console.print(
        table(
            f"testbed: bridge {d['bridge']}, {d['rate']} per host and direction ({d['shaper']})",
            ["host", "address", "interface"],
            [[m["host"], m["address"], m["interface"]] for m in d["members"]],
        )
    )
