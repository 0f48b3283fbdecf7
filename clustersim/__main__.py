"""The ``clustersim`` console script and ``python -m clustersim``: the CLI (cli.py), started so that a
Ctrl-C while its modules are still being imported (typer, rich and pydantic take about half a second)
ends as an interrupt during a command does, with one line and exit code 130, not a traceback."""

import sys


def main() -> None:
    try:
        from clustersim.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted: nothing written\n")
        raise SystemExit(130) from None
    cli_main()


if __name__ == "__main__":
    main()
