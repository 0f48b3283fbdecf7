"""One-line errors a new user met that did not name what to fix: a sweep's missing base scenario, and a
collective's misspelled --op."""

from typer.testing import CliRunner

from clustersim.cli import app


def test_a_sweeps_missing_base_names_the_sweep_file_and_its_base_key(tmp_path):
    sweep = tmp_path / "se3.yaml"
    sweep.write_text("name: s\nbase: bertt.yaml\nvary:\n  gpus: [8]\n")
    out = CliRunner().invoke(app, ["sweep", str(sweep), "--out", str(tmp_path / "out")])
    assert out.exit_code == 2
    line = out.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert f"{sweep}: base: base scenario 'bertt.yaml' not found" in line
    assert not (tmp_path / "out").exists()


def test_a_misspelled_collective_names_the_option_and_the_near_name():
    out = CliRunner().invoke(app, ["collective", "preset:default", "--op", "allreduce", "--bytes", "1e6"])
    assert out.exit_code == 2
    assert "error: --op: unknown collective 'allreduce'; did you mean all_reduce?" in out.output
