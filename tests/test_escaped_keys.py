"""A key or file name the user wrote is quoted in an error escaped (errors.escaped via InputError.__str__):
a NUL or a newline in a sweep file's per_gpu key reached the terminal raw, splitting the one-line error
and hiding what the key held."""

from __future__ import annotations

from clustersim.cli import app
from clustersim.errors import InputError, escaped


def test_control_characters_are_written_as_a_repr_writes_them():
    assert escaped("fab\x00ric\nx") == "fab\\x00ric\\nx"
    assert escaped("a\x1b[31mb\u202ec\td") == "a\\x1b[31mb\\u202ec\\td"
    assert escaped("per_gpu.A100-80GB.fabric (ok) é") == "per_gpu.A100-80GB.fabric (ok) é"


def test_an_error_quotes_its_key_and_source_escaped():
    err = InputError("not an axis", source="sw\neep.yaml", key="per_gpu.H100.fab\x00ric\nx")
    assert str(err) == "sw\\neep.yaml: per_gpu.H100.fab\\x00ric\\nx: not an axis"
    assert err.key == "per_gpu.H100.fab\x00ric\nx"  # the key itself is kept as given


def _sweep(tmp_path, per_gpu: str):
    path = tmp_path / "sweep.yaml"
    path.write_text(f"base: preset:default\nsamples: 0\nvary:\n  gpu: [A100-80GB]\nper_gpu:\n{per_gpu}\n")
    return path


def test_a_nul_and_a_newline_in_a_per_gpu_key_are_one_escaped_line(runner, tmp_path):
    for per_gpu, key in [
        ('  A100-80GB: {"fab\\0ric\\nx": pcie}', "per_gpu.A100-80GB.fab\\x00ric\\nx"),
        ('  "A1\\0\\n": {fabric: pcie}', "per_gpu.A1\\x00\\n"),
    ]:
        path = _sweep(tmp_path, per_gpu)
        r = runner.invoke(app, ["sweep", str(path), "--out", str(tmp_path / "out")])
        assert r.exit_code == 2 and "Traceback" not in r.output
        assert "\x00" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
        assert f"{path}: {key}: " in r.output
        assert not (tmp_path / "out").exists()
