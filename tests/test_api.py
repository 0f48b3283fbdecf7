"""The Python API (`from clustersim import ...`): the same numbers as the CLI, plain results with
to_dict()/to_dataframe(), errors as InputError, and `import clustersim` that imports nothing heavy."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import clustersim
from clustersim import compare, load_scenario, plan, simulate, sweep
from clustersim.cli import app
from clustersim.errors import InputError

ROOT = Path(__file__).resolve().parents[1]


def test_import_is_light():
    """`import clustersim` loads neither the API nor pydantic, simpy or the catalogs (lazy names)."""
    code = (
        "import sys, clustersim; "
        "print(sorted(m for m in ('pydantic', 'simpy', 'numpy', 'clustersim.api') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"
    assert set(clustersim.__all__) == {"__version__", "load_scenario", "simulate", "compare", "sweep", "plan"}
    assert set(clustersim.__all__) <= set(dir(clustersim))


def test_the_names_stay_functions_after_the_engine_module_is_imported():
    """The comparison engine (clustersim/planner/compare.py) lives in its own package, so importing it
    leaves the API's compare() a function."""
    import importlib

    engine = importlib.import_module("clustersim.planner.compare")
    assert hasattr(engine, "CompareRow")
    from clustersim import compare as again

    assert callable(again) and again is compare
    with pytest.raises(AttributeError):
        clustersim.no_such_name  # noqa: B018


def test_simulate_is_what_run_prints(runner):
    result = simulate("preset:default")
    r = runner.invoke(app, ["run", "preset:default", "--json", "--samples", "0"])
    assert r.exit_code == 0, r.output
    assert result.to_dict() == json.loads(r.stdout)
    assert result.iteration_time_s == pytest.approx(sum(result.breakdown_s.values()))
    assert result.p10_p90_s is None


def test_load_scenario_takes_presets_files_mappings_and_changes(tmp_path):
    base = load_scenario("preset:default")
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(base.model_dump(mode="json")))
    same = [s.model_dump() for s in (load_scenario(path), load_scenario(base.model_dump(mode="json")), base)]
    assert same[0] == same[1] == same[2]
    changed = load_scenario(base, {"cluster.nodes": 2, "training.optimizer": "binsgdm"})
    assert changed.cluster.world_size == 8 and changed.training.optimizer == "binsgdm"
    assert simulate(changed).to_dict()["optimizer"] == "binsgdm"


def test_bad_input_is_an_input_error_naming_the_key(tmp_path):
    with pytest.raises(InputError, match="cluster.nodes"):
        load_scenario("preset:default", {"cluster.nodes": -1})
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: {nodes: 1}\n")
    with pytest.raises(InputError, match="bad.yaml"):
        simulate(bad)
    with pytest.raises(InputError, match="deadline"):
        plan("BERT-Large", steps=10, deadline="soon")
    # a string without its unit is refused as the CLI refuses it, and so is a bare number
    with pytest.raises(InputError, match="deadline: 60 has no unit"):
        plan("BERT-Large", steps=10, deadline="60")
    with pytest.raises(InputError, match="deadline: .*bare number"):
        plan("BERT-Large", steps=10, deadline=30.0)
    # True is an int to Python: it is not a deadline of one hour
    with pytest.raises(InputError, match="deadline: must be a duration"):
        plan("BERT-Large", steps=10, deadline=True)


def test_compare_is_what_compare_prints(runner):
    """The whole document, baseline and break-even included, not only the cells."""
    table = compare("preset:default", ["adam", "binsgdm"], gpus=[8, 32], samples=0)
    r = runner.invoke(
        app,
        ["compare", "preset:default", "--optimizers", "adam,binsgdm", "--gpus", "8,32"]
        + ["--samples", "0", "--json"],
    )
    assert r.exit_code == 0, r.output
    printed = json.loads(r.stdout)
    assert json.loads(json.dumps(table.to_dict())) == printed
    assert printed["baseline"] == "adam" and [b["gpus"] for b in printed["break_even"]] == [32]
    assert table.row("binsgdm", 32).speedup > 1
    assert compare("preset:default", ["adam", "binsgdm"], [8], samples=0, break_even_at=0).break_even == []
    with pytest.raises(KeyError):
        table.row("sgdm", 8)


def test_compare_errors_name_the_keyword_argument():
    """An API caller gave `steps=`, not `--steps`: the error names what they wrote."""
    with pytest.raises(InputError, match=r"^steps: unknown optimizer 'x'"):
        compare("preset:default", ["adam"], gpus=[8], samples=0, steps="x=1")
    with pytest.raises(InputError, match=r"^global_batch: 8: global batch 7 does not split"):
        compare("preset:default", ["adam"], gpus=[8], samples=0, global_batch=7)
    with pytest.raises(InputError, match=r"^optimizers: no optimizers given"):
        compare("preset:default", [], gpus=[8], samples=0)


@pytest.mark.parametrize(
    "arguments,argument",
    [
        ({"optimizers": None}, "optimizers"),
        ({"optimizers": "adam"}, "optimizers"),
        ({"optimizers": 5}, "optimizers"),
        ({"gpus": []}, "gpus"),
        ({"gpus": [0]}, "gpus"),
        ({"gpus": ["8"]}, "gpus"),
        ({"gpus": 8}, "gpus"),
        ({"gpus": [10**12]}, "gpus"),
        ({"gpus": [10]}, "gpus"),  # 4-GPU nodes
        ({"samples": -1}, "samples"),
        ({"samples": 1001}, "samples"),
        ({"global_batch": 0}, "global_batch"),
        ({"global_batch": -64}, "global_batch"),
        ({"global_batch": "64"}, "global_batch"),
        ({"break_even_at": -8}, "break_even_at"),
        ({"break_even_at": 10}, "break_even_at"),
        ({"break_even_at": True}, "break_even_at"),
        ({"steps": True}, "steps"),
        ({"warmup": "0.1"}, "warmup"),
        ({"warmup": 1.5, "steps": 100}, "warmup"),
        ({"baseline": "binsgdm"}, "baseline"),
        ({"global_batch": 2**60}, "global_batch"),
        ({"steps": 2**60}, "steps"),
    ],
)
def test_compare_refuses_what_the_command_refuses(arguments, argument):
    """What typer checks for `compare`, the API checks for a Python caller: an InputError naming the
    keyword argument, never a TypeError or an empty answer (the battery's cases)."""
    call = {"optimizers": ["adam", "binsgdm"], "gpus": [8], "samples": 0} | arguments
    with pytest.raises(InputError) as err:
        compare("preset:default", **call)
    assert err.value.key == argument, str(err.value)


SWEEP_FILE = "name: s\nbase: preset:default\nvary:\n  gpus: [8, 16]\nsamples: 0\n"
CALLS_WITH_SAMPLES = {
    "simulate": lambda tmp, n: simulate("preset:default", samples=n),
    "compare": lambda tmp, n: compare("preset:default", ["adam"], [8], samples=n, break_even_at=0),
    "sweep": lambda tmp, n: sweep(tmp / "s.yaml", tmp / "out", workers=1, samples=n),
    "plan": lambda tmp, n: plan("BERT-Large", 1000, "72h", samples=n),
}


@pytest.mark.parametrize("function", CALLS_WITH_SAMPLES)
@pytest.mark.parametrize("samples", [2.5, "8", -1, 1001, True, None])
def test_every_function_taking_samples_refuses_a_bad_count(tmp_path, function, samples):
    """`samples` of 2.5 or "8" was a TypeError from deep inside, -1 silently turned the band off, and a
    sweep wrote its folder before failing: each function refuses what --samples refuses (a whole number
    0..1000) with an InputError naming the argument, before any work or any file. (None is the sweep
    file's own count for `sweep` only.)"""
    (tmp_path / "s.yaml").write_text(SWEEP_FILE, encoding="utf-8")
    if samples is None and function == "sweep":
        assert CALLS_WITH_SAMPLES[function](tmp_path, samples).counts["written"] == 2
        return
    with pytest.raises(InputError) as err:
        CALLS_WITH_SAMPLES[function](tmp_path, samples)
    assert err.value.key == "samples", str(err.value)
    assert "draws" in err.value.message or "whole number" in err.value.message
    assert not (tmp_path / "out").exists()


def test_sweep_counts_are_whole_numbers_in_rows_dicts_and_frames(tmp_path):
    """gpus and nic_count came back as 16.0 and 1.0 beside an int world_size: every count a sweep wrote
    as one (an axis of GPU counts, nic_count, micro_batch) is an int in its rows, to_dict() and, as a
    nullable Int64 where an invalid row leaves it empty, to_dataframe(); measured values stay floats."""
    pytest.importorskip("pandas")
    (tmp_path / "s.yaml").write_text(
        "name: s\nbase: preset:default\nvary:\n  gpus: [8, 6]\n  micro_batch: [4]\nsamples: 0\n",
        encoding="utf-8",
    )
    result = sweep(tmp_path / "s.yaml", tmp_path / "out", workers=1)
    ok = next(r for r in result.rows if r["status"] == "ok")
    bad = next(r for r in result.rows if r["status"] == "invalid")
    for row in (ok, json.loads(json.dumps(result.to_dict()))["rows"][result.rows.index(ok)]):
        for key in ("gpus", "nic_count", "world_size", "micro_batch"):
            assert type(row[key]) is int, (key, row[key])
        assert type(row["iteration_time_s"]) is float and type(row["nic_gbps"]) is float
    assert bad["gpus"] == 6 and type(bad["gpus"]) is int and bad["nic_count"] is None
    frame = result.to_dataframe()
    for key in ("gpus", "nic_count", "world_size", "micro_batch"):
        assert frame[key].dtype.kind in "iu" or str(frame[key].dtype) == "Int64", (key, frame[key].dtype)
    assert frame["iteration_time_s"].dtype.kind == "f"
    assert sorted(frame["gpus"].tolist()) == [6, 8]


def test_a_repeated_gpu_count_is_one_set_of_cells():
    table = compare("preset:default", ["adam"], [8] * 300, samples=0, break_even_at=0)
    assert table.gpu_counts == [8] and len(table.rows) == 1


def test_compare_reads_generators_once():
    table = compare("preset:default", (o for o in ["adam", "binsgdm"]), (g for g in [8]), samples=0)
    assert [(r.optimizer, r.gpus) for r in table.rows] == [("adam", 8), ("binsgdm", 8)]


def test_compare_defaults_to_the_scenarios_own_gpu_count():
    table = compare("preset:default", ["adam"], samples=0)
    assert table.gpu_counts == [32] and [r.gpus for r in table.rows] == [32]


def test_sweep_runs_resumes_and_reads_back(tmp_path):
    spec = tmp_path / "sweep.yaml"
    spec.write_text("name: t\nbase: preset:default\nvary: {gpus: [8, 16], optimizer: [adam, sgdm]}\n")
    first = sweep(spec, tmp_path / "out", workers=1, samples=0)
    assert first.counts["written"] == 4 and len(first.rows) == 4
    again = sweep(spec, tmp_path / "out", workers=1, samples=0)
    assert again.counts["skipped"] == 4 and again.counts["written"] == 0
    assert again.rows == first.rows
    assert json.loads(json.dumps(first.to_dict(), default=str))["rows"][0]["status"] == "ok"


def test_plan_chooses_within_the_deadline():
    answer = plan("BERT-Large", steps=100_000, deadline="72h", global_batch=4096, samples=0)
    assert answer.chosen["ttt_h"] <= 72 and answer.text[0].startswith("Recommended")
    # to_dict is plain data, what `plan --json` prints: a candidate's baseline links back to itself in
    # the summary, so it is given by its own numbers (json.dumps used to fail on the cycle)
    plain = json.loads(json.dumps(answer.to_dict()))
    assert plain["chosen"]["cluster"] == answer.chosen["cluster"]
    assert plain["chosen"]["ttt_h"] == pytest.approx(answer.chosen["ttt_h"])
    # plan keeps the team's optimizer over one within 3% of its cost (the model's uncertainty): no runner-up
    # is cheaper by more than that
    assert all(r["cost"] >= 0.97 * answer.chosen["cost"] for r in answer.runners_up)


def test_to_dataframe_with_pandas():
    pd = pytest.importorskip("pandas")
    run = simulate("preset:default")
    frame = run.to_dataframe()
    assert isinstance(frame, pd.DataFrame)
    assert frame["seconds"].sum() == pytest.approx(run.iteration_time_s)
    assert frame["share"].sum() == pytest.approx(1.0)
    table = compare("preset:default", ["adam", "onebit-adam"], gpus=[8], samples=0).to_dataframe()
    assert list(table["optimizer"]) == ["adam", "onebit-adam"]


def test_to_dataframe_without_pandas_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # `import pandas` now fails, as when not installed
    with pytest.raises(ImportError, match=r"pip install 'clustersim\[dataframe\]'"):
        simulate("preset:default").to_dataframe()


def test_compare_takes_steps_per_optimizer_as_a_mapping():
    """From Python, steps per optimizer is a dict, the same plan as the command's text."""
    as_dict = compare(
        "preset:default", ["adam", "binsgdm"], gpus=[8], samples=0, steps={"adam": 1000, "binsgdm": 1100}
    )
    as_text = compare(
        "preset:default", ["adam", "binsgdm"], gpus=[8], samples=0, steps="adam=1000,binsgdm=1100"
    )
    assert as_dict.row("binsgdm", 8).time_to_train_s == as_text.row("binsgdm", 8).time_to_train_s
    assert as_dict.row("binsgdm", 8).steps == 1100


def test_one_optimizer_that_cannot_run_leaves_the_others_break_even():
    """1-bit Adam's extra buffers do not fit a 7B model on an H200 under DDP; BinSGDM's break-even is
    still found, and the footnote names 1-bit Adam only."""
    scenario = {
        "name": "llama7b-ddp",
        "cluster": {
            "nodes": 2,
            "gpus_per_node": 8,
            "gpu": "H200",
            "nic": {"kind": "infiniband", "count": 8, "line_rate_gbps": 400},
        },
        "workload": {
            "model": "LLaMA-7B",
            "micro_batch": 1,
            "seq_len": 2048,
            "precision": "bf16",
            "activation_checkpointing": True,
        },
        "training": {"optimizer": "sgdm"},
    }
    table = compare(scenario, ["onebit-adam", "binsgdm"], [16], samples=0)
    assert [b.optimizer for b in table.break_even] == ["binsgdm"]
    assert table.break_even_error.startswith("onebit-adam: does not fit in GPU memory")


def test_a_fixed_global_batch_runs_in_smaller_micro_batches_when_memory_is_short():
    """As sweep and plan do: LLaMA-7B at micro-batch 8 does not fit 16 H100s under ZeRO-1, so with a
    fixed global batch compare halves it (accumulating more) and says so; without one the cell fails."""
    scenario = {
        "name": "llama7b-z1",
        "cluster": {
            "nodes": 2,
            "gpus_per_node": 8,
            "gpu": "H100-SXM",
            "nic": {"kind": "infiniband", "count": 8, "line_rate_gbps": 400},
        },
        "workload": {"model": "LLaMA-7B", "micro_batch": 8, "seq_len": 2048, "precision": "bf16"},
        "training": {"optimizer": "adam", "sharding": {"stage": 1}},
    }
    fixed = compare(scenario, ["adam"], [16], samples=0, global_batch=1024, break_even_at=0)
    cell = fixed.row("adam", 16)
    assert cell.error is None and cell.samples_per_s > 0
    assert (
        "micro-batch 8 does not fit in GPU memory: it runs as micro-batch 4 x 16 accumulation steps"
        in cell.notes[-1]
    )
    grown = compare(scenario, ["adam"], [16], samples=0, break_even_at=0)
    assert "does not fit in GPU memory" in grown.row("adam", 16).error
