"""Counts past their documented limits (docs/scale-limits.md) are refused by the CLI as any bad input
is: exit 2, one line, the file and the key to lower, no traceback, before the work starts."""

import pytest
import yaml

from clustersim.cli import app


def _one_line(r, *pieces: str) -> None:
    out = r.output.strip()
    assert r.exit_code == 2, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    for piece in pieces:
        assert piece in out, out


def _scenario(tmp_path, **changes):
    from clustersim.scenario import load_scenario

    data = load_scenario("preset:default").with_changes(**changes).model_dump(mode="json", exclude_none=True)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize(
    "changes,key",
    [
        (
            {"workload.gradient_accumulation": 10**6, "training.sharding": {"stage": 3}},
            "workload.gradient_accumulation",
        ),
        (
            {"cluster.nodes": 8192, "cluster.gpus_per_node": 1, "training.network": "flow"},
            "training.network",
        ),
    ],
)
def test_run_past_a_limit_is_one_line_naming_the_key(runner, tmp_path, changes, key):
    path = _scenario(tmp_path, **changes)
    _one_line(runner.invoke(app, ["run", path, "--samples", "0"]), path, key)


def test_sweep_past_its_row_limit_is_one_line(runner, tmp_path):
    vary = {k: list(range(1, 41)) for k in ("gpus", "nic_gbps", "micro_batch", "seq_len")}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "big", "base": "preset:default", "vary": vary}))
    _one_line(
        runner.invoke(app, ["sweep", str(path), "--out", str(tmp_path / "out")]), str(path), "vary", "rows"
    )
    assert not (tmp_path / "out").exists()  # refused before the results folder was made
