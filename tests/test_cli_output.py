"""Output when stdout is not a terminal (a pipe, a file, CliRunner): tables whole, one row per line, and
plain progress lines on stderr for long commands."""

import time

import yaml

from clustersim.cli import app
from clustersim.commands.support import PlainProgress, console, progress_bar, spinner, table


def test_piped_console_does_not_wrap(capsys):
    long_name = "a-model-name-" + "x" * 150
    console.print(table("t", ["name", "value"], [[long_name, "1.0"], ["short", "2.0"]]))
    console.print("word " * 60)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(long_name in line and line.rstrip().endswith("1.0") for line in lines), out
    assert ("word " * 60).strip() in out
    assert "┃" not in out and "│" not in out  # plain text, no box characters
    long_title = "A table title longer than its table " * 3
    console.print(table(long_title, ["a"], [["1"]]))
    assert long_title in capsys.readouterr().out  # the title is not wrapped to the table's width


def test_compare_table_rows_whole_when_piped(runner):
    r = runner.invoke(
        app,
        ["compare", "preset:default", "--gpus", "8,16", "--optimizers", "adam,onebit-adam", "--samples", "0"]
        + ["--break-even-at", "0", "--steps", "1000"],
    )
    assert r.exit_code == 0, r.output
    rows = [line.split() for line in r.stdout.splitlines() if line.split()[:1] in (["8"], ["16"])]
    split_rows = [row for row in rows if len(row) == 8 and "MiB" not in row and row[1] == "onebit-adam"]
    assert len(split_rows) == 2, r.stdout  # each row of the split table on one line
    speedups = [row for row in rows if len(row) == 6 and row[1] == "onebit-adam" and row[2].endswith("x")]
    assert len(speedups) == 2, r.stdout  # and of the speedup table, time to train included
    title = next(line for line in r.stdout.splitlines() if line.startswith("Speedup over"))
    assert title.rstrip() == "Speedup over adam on the same GPUs"
    assert "compare: 4/4 simulations" in r.stderr and "compare:" not in r.stdout


def test_plain_progress_lines(capsys):
    p = PlainProgress("sweep", "rows", 40, every_s=3600, min_gap_s=0)
    for i in range(1, 41):
        p.update(i)
    p.close()
    err = capsys.readouterr().err.splitlines()
    # no estimate of the time left before a fifth of the work (support.time_left), then one
    assert err[0].startswith("sweep: 4/40 rows, ") and err[0].endswith(" s elapsed")
    assert err[1].startswith("sweep: 8/40 rows, ") and err[1].endswith(" s left")
    assert len(err) == 10 and err[-1].startswith("sweep: 40/40 rows, ")  # every 10%, and the end
    p = PlainProgress("plan", "candidates", None, every_s=0.05)
    p.update(3, 10)
    time.sleep(0.3)  # nothing new: the ticker still says where it is
    p.close()
    err = capsys.readouterr().err
    assert "plan: 3/10 candidates" in err and "left" in err


def test_spinner_and_bar_off_a_terminal(capsys):
    with spinner("calibrate") as say:
        say("GEMMs")
        say("GEMMs")
        say("collectives")
    with progress_bar("x", "rows", 2) as update:
        update(1)
        update(2)
    with progress_bar("x", "rows", 2, disabled=True) as update:
        update(1)
    err = capsys.readouterr().err.splitlines()  # a quick job: no 10% lines, only its last line
    assert [e.split(",")[0] for e in err] == ["calibrate: GEMMs", "calibrate: done", "x: 2/2 rows"]
    p = PlainProgress("calibrate", every_s=0.05)
    p.say("GEMMs")
    p.say("collectives")
    time.sleep(0.3)  # the ticker says the latest stage
    p.close()
    assert "calibrate: collectives, " in capsys.readouterr().err


def test_sweep_progress_on_stderr(tmp_path, runner):
    sweep = tmp_path / "sweep.yaml"
    data = {"name": "t", "base": "preset:default", "vary": {"gpus": [8, 16], "optimizer": ["adam", "sgdm"]}}
    sweep.write_text(yaml.safe_dump(data | {"steps": 100, "global_batch": 512}))
    r = runner.invoke(app, ["sweep", str(sweep), "--out", str(tmp_path / "out"), "--samples", "0"])
    assert r.exit_code == 0, r.output
    assert "sweep: 4/4 rows" in r.stderr and "sweep:" not in r.stdout
    r = runner.invoke(app, ["sweep", str(sweep), "--out", str(tmp_path / "out2"), "--samples", "0", "--json"])
    assert r.exit_code == 0 and r.stderr == ""


def test_compare_says_a_refusal_once_and_keeps_its_table_aligned(runner):
    """An optimizer that cannot run at the break-even's GPU count: its reason on its own line once, the
    break-even line only names it; the time table's numeric columns stay as narrow as their numbers."""
    r = runner.invoke(
        app,
        ["compare", "preset:dgx-h100-gpt3-1.3b", "--set", "training.parallelism.tensor=2", "--gpus", "64"]
        + ["--optimizers", "adam,onebit-adam", "--samples", "0"],
    )
    assert r.exit_code == 0, r.output
    reason = "onebit-adam is modelled with data parallelism only"
    assert r.stdout.count(reason) == 1, r.stdout
    assert "break-even at 64 GPUs not computed for onebit-adam: not simulated there (above)" in r.stdout
    lines = r.stdout.splitlines()
    head = next(line for line in lines if line.startswith("GPUs  optimizer") and "iter" in line)
    refused = next(line for line in lines if line.startswith("64") and "onebit-adam (not simulated" in line)
    # every column ends where its header does (right-aligned numbers under their titles)
    assert len(refused) == len(head.rstrip()) and refused.rstrip().endswith("—")
    assert head.index("iter") - head.index("optimizer") < 40


def test_a_sweep_says_an_invalid_rows_reason_once(tmp_path, runner):
    sweep = tmp_path / "sweep.yaml"
    data = {"name": "t", "base": "preset:dgx-h100-gpt3-175b-zero3-tp8"}
    sweep.write_text(yaml.safe_dump(data | {"vary": {"gpus": [64], "optimizer": ["adam", "onebit-adam"]}}))
    r = runner.invoke(app, ["sweep", str(sweep), "--out", str(tmp_path / "out"), "--samples", "0"])
    assert r.exit_code == 0, r.output
    assert r.stdout.count("not compatible with ZeRO") == 1, r.stdout
    assert "1 row(s) could not be simulated, 1 of them the invalid rows above" in r.stdout


def test_offload_plan_says_when_no_offload_is_faster(runner):
    """On a cluster whose optimizer state fits, `offload plan` ended with 'interleaved is 1.17x faster than
    ZeRO-Offload', which read as advice to offload, while no offload was faster still; and '1 subgroups'."""
    import json

    args = ["offload", "plan", "examples/a100-8gpu-ethernet.yaml"]
    modes = json.loads(runner.invoke(app, [*args, "--json"]).stdout)["modes"]
    ratio = modes["interleaved"]["iteration_time_s"] / modes["none"]["iteration_time_s"]
    assert modes["none"]["fits"] and ratio > 1
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert f"no offload is {ratio:.2f}x faster than interleaved" in r.stdout
    assert "1 subgroup of" in r.stdout and "1 subgroups" not in r.stdout
    big = runner.invoke(app, ["offload", "plan", "preset:offload-llama7b-h100"])  # it does not fit there
    assert big.exit_code == 0 and "no offload is" not in big.stdout and "674 subgroups of" in big.stdout
