"""`--set KEY=VALUE` on run and compare (a what-if without editing a file), and `presets show`."""

from __future__ import annotations

import json

import pytest

from clustersim.cli import app
from clustersim.scenario import load_scenario


def _run(runner, *args):
    return runner.invoke(app, ["run", "preset:binsgdm-bert-base", "--json", "--samples", "0", *args])


def test_run_with_set_is_the_scenario_with_that_key_changed(runner):
    from clustersim.simulator import simulate

    res = _run(runner, "--set", "cluster.nic.line_rate_gbps=100", "--set", "workload.attention=fused")
    assert res.exit_code == 0, res.output
    changed = load_scenario("preset:binsgdm-bert-base").with_changes(
        **{"cluster.nic.line_rate_gbps": 100, "workload.attention": "fused"}
    )
    assert json.loads(res.stdout)["iteration_time_s"] == pytest.approx(simulate(changed).iteration_time)
    plain = json.loads(_run(runner).stdout)["iteration_time_s"]
    assert (
        json.loads(res.stdout)["iteration_time_s"] < plain
    )  # a faster NIC, and attention without the scores


def test_compare_takes_set_too(runner):
    res = runner.invoke(
        app,
        ["compare", "preset:binsgdm-bert-base", "--gpus", "64", "--optimizers", "binsgdm", "--samples", "0",
         "--break-even-at", "0", "--json", "--set", "cluster.nic.line_rate_gbps=100"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    slow = runner.invoke(
        app,
        ["compare", "preset:binsgdm-bert-base", "--gpus", "64", "--optimizers", "binsgdm", "--samples", "0",
         "--break-even-at", "0", "--json"],
    )  # fmt: skip
    assert res.stdout != slow.stdout


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("nope", "--set: 'nope' is not KEY=VALUE"),
        ("workload..x=1", "is not KEY=VALUE with a dotted key"),
        ("=3", "is not KEY=VALUE"),
        ("workload.micro_batch=-1", "--set: workload.micro_batch: Input should be greater than 0"),
        (
            "workload.attention=sdpa",
            "--set: workload.attention: Input should be 'fused', 'unfused' or 'eager'",
        ),
        ("foo.bar=1", "--set: foo: unknown key"),
        ("workload.micro_batch=[1", "--set: workload.micro_batch: '[1' is not a YAML value"),
        (
            "workload.layers.0.params=1",
            "--set: workload.layers.0.params: --set changes keys, not a list's items",
        ),
        ("cluster.gpu.memory_gib=80", "cluster.gpu is 'A100-80GB', a value, not a section with keys"),
        ("cluster.nic.line_rate_gbps=1:30", "'1:30' is not a plain decimal number (YAML 1.1 reads it as 90)"),
        ("cluster.nodes=0x10", "'0x10' is not a plain decimal number"),
        (
            "cluster.nic.line_rate_gbps=1e400",
            "--set: cluster.nic.line_rate_gbps: Input should be a finite number",
        ),
        ("workload.precision=fp8", "A100-80GB has no fp8 tensor cores"),
        (
            "workload.micro_batch=1e5",
            "preset:binsgdm-bert-base with --set: workload.micro_batch: does not fit in GPU memory",
        ),
    ],
)
def test_a_bad_set_is_one_line_naming_set_and_the_key(runner, setting, says):
    res = _run(runner, "--set", setting)
    assert res.exit_code == 2
    assert says in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_presets_show_prints_the_shipped_file_and_json_fills_the_defaults(runner):
    res = runner.invoke(app, ["presets", "show", "binsgdm-bert-base"])
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("# The BinSGDM paper's cluster")
    assert "attention: eager" in res.stdout
    same = runner.invoke(app, ["presets", "show", "preset:binsgdm-bert-base"])
    assert same.stdout == res.stdout
    data = json.loads(runner.invoke(app, ["presets", "show", "default", "--json"]).stdout)
    assert data["workload"]["attention"] == "fused" and data["name"] == "default"


def test_presets_show_an_unknown_name_is_one_line(runner):
    res = runner.invoke(app, ["presets", "show", "nope"])
    assert res.exit_code == 2 and "unknown preset 'nope' (known: " in res.output


def test_set_reads_numbers_as_written():
    from clustersim.commands.support import load_scenario_ref

    s = load_scenario_ref(
        "preset:binsgdm-bert-base", ["cluster.nodes=016", "cluster.nic.line_rate_gbps=2.5e1"]
    )
    assert s.cluster.nodes == 16 and s.cluster.nic.line_rate_gbps == 25.0
    last = load_scenario_ref("preset:binsgdm-bert-base", ["cluster.nodes=4", "cluster.nodes=2"])
    assert last.cluster.nodes == 2  # a later --set of the same key wins, as --help says


def test_compare_with_nothing_simulable_is_one_line_and_exit_2(runner):
    res = runner.invoke(
        app,
        ["compare", "preset:binsgdm-bert-base", "--gpus", "64", "--samples", "0", "--break-even-at", "0",
         "--set", "workload.micro_batch=100000"],
    )  # fmt: skip
    assert res.exit_code == 2
    assert "no optimizer at any GPU count could be simulated: does not fit in GPU memory" in res.output


def test_a_scenarios_bad_profile_names_the_scenario_the_key_and_the_profile(runner, tmp_path):
    import yaml

    for profile, says in (
        ("builtin:nosuch", "profile: builtin:nosuch: unknown built-in profile 'nosuch'"),
        (str(tmp_path / "broken.json"), "broken.json: invalid JSON at line 1"),
    ):
        (tmp_path / "broken.json").write_text("not json")
        path = tmp_path / "s.yaml"
        scenario = {
            "cluster": {"nodes": 1, "gpus_per_node": 1, "gpu": "H200"},
            "workload": {"model": "BERT-Large", "micro_batch": 8},
            "profile": profile,
        }
        path.write_text(yaml.safe_dump(scenario))
        res = runner.invoke(app, ["run", str(path), "--samples", "0"])
        assert res.exit_code == 2
        assert f"{path}: profile: " in res.output and says in res.output
        assert len(res.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("0", "should be a boolean (true or false), not 0"),
        ("yes", "should be a boolean (true or false), not 'yes'"),  # YAML 1.2: a word, not a boolean
        ("off", "not 'off'"),
        ("", "no value after '=' (null resets the key to its default)"),
        ("{a: 1, a: 2}", "key 'a' given twice"),
        ("[" + "a, " * 400, "(1,201 characters)"),  # a pasted value is cut, not repeated
    ],
)
def test_a_flag_set_to_anything_but_true_or_false_is_one_line(runner, value, says):
    res = _run(runner, "--set", f"training.host_sync_before_update={value}")
    out = res.stdout + (res.stderr or "")
    assert res.exit_code == 2
    assert len(out.strip().splitlines()) == 1 and len(out) < 300, out
    assert "training.host_sync_before_update" in out and says in out


def test_a_sweeps_bad_values_share_a_line_per_problem(tmp_path, runner):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        "base: preset:default\n"
        "vary:\n"
        "  training.host_sync_before_update: [true, maybe, 2, 0]\n"
        "  training.gradient_clipping: [Global, 0, none]\n"
    )
    res = runner.invoke(app, ["sweep", str(sweep), "--out", str(tmp_path / "out")])
    out = res.stdout + (res.stderr or "")
    assert res.exit_code == 2
    lines = out.strip().splitlines()
    assert len(lines) == 2, out
    assert '"maybe", 2, 0: Input should be a boolean (true or false)' in out
    assert not (tmp_path / "out").exists()


def test_an_overlap_error_names_the_file_and_key_once(runner, tmp_path):
    """DiLoCo's overlap_steps past its period, from --set and from a file: one line naming where the
    value came from and the key, each once."""
    key = "training.optimizer_options.overlap_steps"
    res = runner.invoke(app, ["run", "preset:streaming-diloco-1b", "--set", f"{key}=20"])
    out = res.stdout + (res.stderr or "")
    assert res.exit_code == 2 and len(out.strip().splitlines()) == 1, out
    assert out.count("overlap_steps") == 1 and "preset:streaming-diloco-1b" in out, out
    assert f"{key}: 20 exceeds the 12.5 inner steps" in out
    res = runner.invoke(
        app, ["run", "preset:streaming-diloco-1b", "--set", f"{key}=20", "--set", "workload.micro_batch=2"]
    )
    out = res.stdout + (res.stderr or "")
    assert res.exit_code == 2 and out.count("overlap_steps") == 1, out
    assert "micro_batch" not in out, "an option that is not at fault is not named beside the one that is"
    text = runner.invoke(app, ["presets", "show", "streaming-diloco-1b"]).stdout
    path = tmp_path / "diloco.yaml"
    path.write_text(text.replace("overlap_steps: 1,", "overlap_steps: 20,"))
    res = runner.invoke(app, ["run", str(path)])
    out = res.stdout + (res.stderr or "")
    assert res.exit_code == 2 and out.count("overlap_steps") == 1 and str(path) in out, out


def test_a_misspelled_preset_suggests_the_near_name(runner):
    res = runner.invoke(app, ["run", "preset:defualt"])
    assert res.exit_code == 2 and "did you mean preset:default?" in res.output
    assert "did you mean" not in runner.invoke(app, ["run", "preset:nope"]).output
