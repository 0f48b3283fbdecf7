"""The options before a command (--version, shell completion), `clustersim schema`, and progress on
every command that runs longer than HEARTBEAT_AFTER_S without showing its own."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import clustersim
from clustersim.cli import app
from clustersim.commands import support as cli_support

ROOT = Path(__file__).resolve().parents[1]


def test_version_is_the_packages(runner):
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert r.stdout.strip() == f"clustersim {version}" == f"clustersim {clustersim.__version__}"


def test_shell_completion_completes_commands():
    """typer's completion: the options are offered, and the shell's request completes a command name."""
    env = {
        **os.environ,
        "_CLUSTERSIM_COMPLETE": "complete_bash",
        "COMP_WORDS": "clustersim vali",
        "COMP_CWORD": "1",
    }
    env["PYTHONPATH"] = str(ROOT)
    code = "from clustersim.cli import app; app(prog_name='clustersim')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split() == ["validate"], out.stdout + out.stderr


def test_help_offers_version_and_completion(runner):
    r = runner.invoke(app, ["--help"])
    assert all(opt in r.stdout for opt in ("--version", "--install-completion", "--show-completion"))


def test_schema_is_the_scenario_json_schema(runner):
    from clustersim.scenario import Scenario

    r = runner.invoke(app, ["schema"])
    assert r.exit_code == 0, r.output
    schema = json.loads(r.stdout)
    assert schema == json.loads(json.dumps(Scenario.model_json_schema()))
    assert {"cluster", "workload", "training"} <= set(schema["properties"])
    assert schema["additionalProperties"] is False  # unknown keys are refused, and editors can say so


def test_schema_markdown_is_the_reference(runner):
    r = runner.invoke(app, ["schema", "--markdown"])
    assert r.exit_code == 0
    assert r.stdout.startswith("# Scenario reference") and "\n## cluster.nic\n" in r.stdout


def test_a_silent_command_says_it_is_working(runner, monkeypatch):
    """`run` shows no progress of its own: after HEARTBEAT_AFTER_S a plain line on stderr says it works."""
    monkeypatch.setattr(cli_support, "HEARTBEAT_AFTER_S", 0.0)
    monkeypatch.setattr(cli_support, "PROGRESS_EVERY_S", 60.0)
    r = runner.invoke(app, ["run", "preset:default", "--samples", "4"])
    assert r.exit_code == 0, r.output
    assert r.stderr.startswith("run: working, ") and "elapsed" in r.stderr
    assert "working" not in r.stdout


def test_no_heartbeat_with_json(runner, monkeypatch):
    monkeypatch.setattr(cli_support, "HEARTBEAT_AFTER_S", 0.0)
    r = runner.invoke(app, ["run", "preset:default", "--samples", "4", "--json"])
    assert r.exit_code == 0 and r.stderr == ""
    json.loads(r.stdout)


def test_a_command_with_its_own_progress_gets_no_heartbeat(monkeypatch, capsys):
    """Once a bar, spinner or progress lines start, the heartbeat stops (no second kind of line)."""
    monkeypatch.setattr(cli_support, "HEARTBEAT_AFTER_S", 0.2)
    with cli_support.heartbeat("x"), cli_support.progress_bar("x", "rows", 2) as update:
        update(2)
        import time

        time.sleep(0.4)
    err = capsys.readouterr().err
    assert "working" not in err and "x: 2/2 rows" in err


def test_validate_counts_its_rows(runner):
    r = runner.invoke(app, ["validate", "--dataset", "megatron_weak_scaling", "--samples", "0"])
    assert r.exit_code == 0, r.output
    assert "validate: 10/10 rows" in r.stderr and "validate:" not in r.stdout
