"""Every command's --help: help text on every option and argument, plain metavars (no typer <bool>, <str>,
<list[Path]>), flags without a metavar."""

import click
import pytest
import typer

from clustersim.cli import app


def _walk(command: click.Command, path: tuple[str, ...] = ()):
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _walk(sub, (*path, name))


COMMANDS = list(_walk(typer.main.get_command(app)))


def test_every_command_is_walked():
    names = {" ".join(p) for p, _ in COMMANDS}
    assert {"run", "sweep", "plan", "report", "calibrate run", "calibrate fit", "testbed up"} <= names


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) or "clustersim" for p, _ in COMMANDS])
def test_every_option_has_help_and_a_plain_metavar(runner, path, command):
    for param in command.params:
        assert (getattr(param, "help", None) or "").strip(), f"{' '.join(path)} {param.name}: no help"
        if getattr(param, "is_flag", False):
            assert param.metavar == "", f"{param.name}: a flag shows no metavar"
    r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "<bool>" not in r.output and "<list[" not in r.output and "<str>" not in r.output, r.output
    assert "<int" not in r.output and "<path>" not in r.output, r.output


def test_list_argument_and_flag_metavars(runner):
    r = runner.invoke(app, ["calibrate", "check", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "FILE..." in r.output or "RAW..." in r.output, r.output


def test_metavars_of_plain_click_parameters():
    """What typer releases before 0.29 hand over (click types, no type descriptor)."""
    from clustersim.commands.support import value_metavar

    assert value_metavar(click.Option(["--n"], type=click.IntRange(0, 5))) == "INTEGER"
    assert value_metavar(click.Option(["--p"], type=click.Path())) == "PATH"
    assert value_metavar(click.Option(["--f"], is_flag=True)) == ""
    assert value_metavar(click.Argument(["files"], nargs=-1)) == "FILES..."


def test_help_into_a_pipe_has_no_box_borders():
    """`clustersim run --help | less` or into a CI log: the panels' text without rounded borders."""
    import subprocess
    import sys

    code = "import sys; from clustersim.cli import main; sys.argv = ['clustersim', 'run', '--help']; main()"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "Usage: clustersim run" in out and "--samples" in out
    assert not any(ch in out for ch in "╭╮╰╯│─")


@pytest.mark.parametrize(
    "args,option",
    [
        (["run", "preset:default", "--samples", "-1"], "--samples"),
        (
            ["plan", "--model", "GPT-3-1.3B", "--steps", "10", "--deadline", "1d", "--global-batch", "0"],
            "--global-batch",
        ),
        (["run", "preset:default", "--bogus", "x"], "--bogus"),
    ],
)
def test_a_bad_option_value_is_one_line_naming_it(runner, args, option):
    """Typer's own parameter errors (a value out of range, an unknown option) are one line naming the
    option and exit 2, like every other bad input: no usage box, no traceback."""
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and option in lines[0] and "╭" not in res.output and "Traceback" not in res.output


def test_run_help_says_traces_have_a_process_or_file_per_pipeline_stage(runner):
    """With tensor/pipeline parallelism the trace has a process per stage and the Chakra export a file
    per stage; --help said only "one track per stream" and "one .et per rank class"."""
    r = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "one process per rank class" in text and "or pipeline stage, one track per stream" in text
    assert "one .et per rank class or pipeline stage" in text


def test_plan_help_names_the_built_in_candidates(runner):
    """`plan --help` says what the built-in grid holds: every GPU, GPU count, NIC and optimizer of
    catalogs/plan_candidates.yaml (the help is kept in step with the file)."""
    from importlib import resources

    import yaml

    grid = yaml.safe_load(resources.files("clustersim.catalogs").joinpath("plan_candidates.yaml").read_text())
    r = runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "200"})
    text = " ".join(r.output.replace("│", " ").split())
    vary = grid["vary"]
    from clustersim import catalog

    left_out = set(catalog.gpus()) - set(vary["gpu"])  # the help names what the grid leaves out
    assert "every GPU of the catalog but the " + " and ".join(sorted(left_out)) + " stand-ins" in text
    assert f"{min(vary['gpus']):,} to {max(vary['gpus']):,} GPUs" in text
    assert "Ethernet" in text and "InfiniBand" in text
    *rates, last = (str(r) for r in vary["nic_gbps"])
    assert ", ".join(rates) + f" or {last} Gb/s" in text
    assert f"{grid['global_batch']:,} samples per step" in text
    for optimizer in vary["optimizer"]:
        assert optimizer in text


def test_compare_help_lists_every_optimizer_compare_accepts(runner):
    """`compare --help` listed adam, sgdm, onebit-adam, zero-one-adam and binsgdm, while compare also
    runs diloco (Streaming DiLoCo): a user asking about DiLoCo read that it was not there."""
    from clustersim.simulator.strategies import registry

    r = runner.invoke(app, ["compare", "--help"], env={"COLUMNS": "200"})
    text = " ".join(r.output.replace("│", " ").split())
    assert "Comma-separated: " + ", ".join(registry.names()) in text


def test_top_level_help_names_diloco_beside_the_compressed_optimizers(runner):
    """`clustersim --help` named 1-bit Adam, 0/1 Adam and BinSGDM only; DiLoCo is simulated as well."""
    r = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    text = " ".join(r.output.replace("│", " ").split())
    assert "(1-bit Adam, 0/1 Adam, BinSGDM) or rarely-synchronising ones (DiLoCo, Streaming DiLoCo)" in text


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(p) or "clustersim" for p, _ in COMMANDS])
def test_no_help_text_is_cut_at_80_columns(runner, path, command):
    """rich cuts an over-long unbreakable token (a default like a,b,c,d) with an ellipsis at the
    terminal's width; a user on an 80-column terminal must still read every default whole."""
    r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert "…" not in r.output, r.output


def test_plan_help_says_what_the_answer_holds(runner):
    """`plan --help` listed options only: a new user could not tell the lines of the answer apart (the
    equivalent simpler choice, the MFU line, the counts of pruned candidates). Its epilog names each, in
    the order printed, and --json's fields for them."""
    r = runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    epilog = r.output[r.output.index("The answer, in this order") :]
    said = [
        "Header:",
        "cost:",
        "Recommended:",
        "Sooner for about the same cost:",
        "Risk:",
        "the two are equivalent, so the simpler one is kept",
        "Fastest:",
        "One line per compressed optimizer",
        "% MFU",
        "Runners-up:",
        "'*' marks",
        "too slow for the deadline",
        "not simulated",
        "not searched",
        "Exit 1",
        "kept_simpler",
    ]
    where = [epilog.find(s) for s in said]
    assert -1 not in where, [s for s, w in zip(said, where) if w == -1]
    assert where == sorted(where)  # in the order the answer prints them
