"""Where a profile's measurements came from: torch's thread count and the CPU in each measurement, every
command that wrote into a profile (and what it replaced), a thread-count mismatch warned where it is made
and noted where it is used, and the calibrate commands' messages a new user meets (a Hugging Face config
without its shape, a failing --module, a model measured but not in the catalog, an interrupt)."""

import copy
import json

import pytest

from clustersim.calibration.compute_store import store
from clustersim.calibration.profile import (
    FORMAT_VERSION,
    ModelCompute,
    load_profile,
    parse_profile,
    thread_mismatch,
)
from clustersim.cli import app
from clustersim.errors import InputError
from clustersim.simulator import simulate
from tests.conftest import cpu_bert_scenario


def _phase(h0, h1, d0, d1, kernels):
    return {
        "host_s": {"intercept_s": h0, "per_sample_s": h1},
        "device_s": {"intercept_s": d0, "per_sample_s": d1},
        "kernels": kernels,
    }


def _entry(threads=None, model="BERT-Base", source="clustersim calibrate model --model BERT-Base: 3 sizes"):
    fingerprint = {"device": "cpu", "torch": "2.13.0", "precision": "fp32", "execution": "eager"}
    if threads is not None:
        fingerprint |= {"threads": threads, "cpu": "AMD EPYC", "host": "vm"}
    return {
        "model": model,
        "seq_len": 32,
        "micro_batches": [1, 2, 4],
        "forward": _phase(0.010, 0.0005, 0.002, 0.004, 300),
        "backward": _phase(0.020, 0.001, 0.004, 0.008, 500),
        "optimizer": _phase(0.003, 0.0, 0.005, 0.0, 20),
        "fingerprint": fingerprint,
        "source": source,
    }


def _profile(hardware_threads=2, entry_threads=1, version=FORMAT_VERSION) -> dict:
    """A CPU profile with calibrate run's hardware rates at ``hardware_threads`` and a model entry
    measured at ``entry_threads``."""
    provenance = {"source": "clustersim calibrate run --device cpu --quick --out p.json", "cpu": "AMD EPYC"}
    if hardware_threads is not None:
        provenance["threads"] = hardware_threads
    return {
        "format": "clustersim-profile",
        "format_version": version,
        "device": "cpu",
        "provenance": provenance,
        "matmul_tflops": {"fp32": 0.2},
        "memory_gbs": 15.0,
        "model_compute": [_entry(entry_threads)],
    }


def _cpu_scenario():
    # the code the entries' source (calibrate model --model) timed
    return cpu_bert_scenario(implementation="plain")


# --- threads ------------------------------------------------------------------------------------------


def test_a_model_measured_on_other_threads_than_the_hardware_rates_is_named():
    profile = parse_profile(_profile(2, 1), "p.json")
    (mc,) = profile.model_compute
    why = thread_mismatch(profile, mc)
    assert why is not None and "1 torch thread" in why and "on 2" in why and "--threads" in why
    # the same threads, or either not recorded (an older profile, an imported trace): nothing to say
    for hw, own in ((2, 2), (None, 1), (2, None)):
        p = parse_profile(_profile(hw, own), "p.json")
        assert thread_mismatch(p, p.model_compute[0]) is None
    # a model-only profile has no hardware rates to disagree with
    data = _profile(2, 1)
    del data["matmul_tflops"], data["memory_gbs"]
    p = parse_profile(data, "p.json")
    assert thread_mismatch(p, p.model_compute[0]) is None


def test_run_notes_a_thread_mismatch_between_the_model_and_the_hardware_rates():
    noted = simulate(_cpu_scenario(), parse_profile(_profile(2, 1), "p.json")).notes
    assert any("1 torch thread" in n and "hardware rates" in n for n in noted), noted
    same = simulate(_cpu_scenario(), parse_profile(_profile(1, 1), "p.json")).notes
    assert not any("torch thread" in n for n in same)


def test_the_same_chip_note_names_only_what_the_profile_holds():
    """A profile of a model's measurement alone (calibrate model) has no compute rates to keep."""
    data = _profile(2, 1)
    del data["matmul_tflops"], data["memory_gbs"]
    notes = simulate(_cpu_scenario(), parse_profile(data, "p.json")).notes
    (note,) = [n for n in notes if "same cpu chip" in n]
    assert "compute rates" not in note and "interconnect" not in note
    notes = simulate(_cpu_scenario(), parse_profile(_profile(2, 2), "p.json")).notes
    assert any("same cpu chip" in n and "compute rates keep their efficiency" in n for n in notes)


# --- format migration and the list of commands ------------------------------------------------------


def test_a_v4_profile_loads_with_its_one_command_listed():
    data = _profile(None, None, version=4)
    data["provenance"]["date"] = "2026-11-22T06:59:59+00:00"
    profile = parse_profile(data, "old.json")
    assert profile.format_version == FORMAT_VERSION == 5
    (first,) = profile.provenance.commands
    assert first.source == data["provenance"]["source"] and first.quick is True
    assert first.cpu == "AMD EPYC" and first.date == "2026-11-22T06:59:59+00:00"
    assert profile.model_compute[0].fingerprint.threads is None  # not recorded then


def test_builtin_profiles_still_load():
    from clustersim.calibration.profile import builtin_profiles

    for name in builtin_profiles():
        profile = load_profile(f"builtin:{name}")
        assert profile.provenance.commands and profile.provenance.commands[0].source


def test_each_command_that_writes_into_a_profile_is_listed_with_what_it_replaced(tmp_path):
    out = tmp_path / "p.json"
    out.write_text(json.dumps({**_profile(2, None), "model_compute": []}))
    first_cmd = "clustersim calibrate model --threads 1 --out p.json"
    machine = {"cpu": "AMD EPYC", "host": "vm", "threads": 1, "torch": "2.13.0"}
    entry = ModelCompute(**_entry(1, source=f"{first_cmd}: 3 micro-batches"))
    store(out, "cpu", {"source": first_cmd, "date": "d1", **machine}, entry, None)
    again = ModelCompute(**_entry(2, source="clustersim calibrate model --out p.json: 3 micro-batches"))
    profile = store(out, "cpu", {"source": "clustersim calibrate model --out p.json", **machine}, again, None)
    run, first, second = profile.provenance.commands
    assert run.source.startswith("clustersim calibrate run")
    assert first.source == first_cmd and first.threads == 1 and first.cpu == "AMD EPYC"
    assert "model BERT-Base seq 32 fp32" in first.wrote and "replaced" not in first.wrote
    # the second replaced the first's entry: said, with the number of the command that wrote it
    assert "replaced the entry written by command 2" in second.wrote
    (kept,) = load_profile(str(out)).model_compute
    assert kept.fingerprint.threads == 2
    # the header stays the hardware rates' own (the first command's)
    assert (
        profile.provenance.source.startswith("clustersim calibrate run") and profile.provenance.threads == 2
    )


def test_show_lists_each_command_and_each_models_code_optimizer_threads_and_source(runner, tmp_path):
    out = tmp_path / "p.json"
    data = _profile(2, 1)
    data["model_compute"][0]["fingerprint"] |= {"implementation": "hf", "optimizer": "adamw"}
    out.write_text(json.dumps(data))
    store(out, "cpu", {"source": "clustersim calibrate import-trace t.json", "torch": "2.11.0"}, None, None)
    result = runner.invoke(app, ["calibrate", "show", str(out)])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "threads: 2" in text and "commands that wrote into it (2" in text
    assert "clustersim calibrate import-trace t.json" in text and "torch 2.11.0" in text
    assert "code hf, optimizer adamw, torch 2.13.0, threads 1, machine AMD EPYC (vm)" in text
    assert "source: clustersim calibrate model --model BERT-Base" in text
    assert "measured on 1 torch thread(s)" in text  # the mismatch, where the entry is shown
    assert "BERT-Base seq 32, micro-batches" in text


def test_show_gives_a_cnn_its_image_side_not_a_sequence(runner, tmp_path):
    data = _profile(2, 2)
    data["model_compute"] = [{**_entry(2, model="ResNet-50"), "seq_len": 224}]
    out = tmp_path / "p.json"
    out.write_text(json.dumps(data))
    result = runner.invoke(app, ["calibrate", "show", str(out)])
    assert result.exit_code == 0, result.output
    assert "ResNet-50 image 224x224, micro-batches" in result.output and "seq 224" not in result.output


def test_show_says_why_a_quick_fit_has_no_held_out_error_and_never_prints_a_zero_alpha(runner, tmp_path):
    def fit(op, points, alpha_s, holdout):
        return {
            "op": op,
            "nodes": 1,
            "gpus_per_node": 2,
            "segments": [[0, alpha_s, 1e-9]],
            "busbw_by_size": [],
            "source": "test",
            "quality": {"points": points, "residual_rms_rel": 0.1, "holdout_max_rel_error": holdout},
        }

    data = _profile(2, 2)
    data["collectives"] = [fit("all_gather", 6, 1e-9, None), fit("all_reduce", 10, 2e-4, 0.05)]
    out = tmp_path / "p.json"
    out.write_text(json.dumps(data))
    result = runner.invoke(app, ["calibrate", "show", str(out)])
    assert result.exit_code == 0, result.output
    assert "none (6 sizes)" in result.output and "fewer than 8 sizes were measured" in result.output
    assert "α 0.0 µs" not in result.output and "α ≈ 0" in result.output
    assert "5.0% ✓" in result.output and "α 200.0 µs" in result.output


# --- calibrate model: messages ---------------------------------------------------------------------

QUICK = ["--device", "cpu", "--steps", "2", "--warmup", "1", "--micro-batches", "1,2,3", "--holdout", "4"]

BERT = {
    "model_type": "bert",
    "architectures": ["BertForPreTraining"],
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "vocab_size": 100,
    "max_position_embeddings": 32,
}


@pytest.mark.parametrize("key", ["hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"])
def test_a_hugging_face_config_without_its_shape_is_refused_by_the_key(runner, tmp_path, key):
    """transformers would build its default (hidden 768, 12 heads) and store it under the given name;
    `models import` of the same file refuses, and so does calibrate model, before anything is timed."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({k: v for k, v in BERT.items() if k != key}))
    out = tmp_path / "p.json"
    result = runner.invoke(
        app, ["calibrate", "model", "--hf-config", str(path), "--name", "t", "--out", str(out)] + QUICK
    )
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]  # after any heartbeat of a loaded machine
    assert line.startswith("error: ") and str(path) in line and f": {key}: no {key}" in line, line
    assert "multiple of the number of attention heads" not in line and not out.exists()


def test_a_failing_module_is_named_as_the_culprit(runner, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    (tmp_path / "bad_net.py").write_text(
        "import torch\n\n"
        "def build(micro_batch, seq_len, device):\n"
        "    net = torch.nn.Linear(8, 1)\n"
        "    return net, torch.randn(micro_batch, 5)  # 5 features into an 8-input layer\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "p.json"
    result = runner.invoke(
        app, ["calibrate", "model", "--module", "bad_net:build", "--out", str(out), "--threads", "1"] + QUICK
    )
    assert result.exit_code == 2, result.output
    assert "--module: the model failed on cpu" in result.output and "--micro-batches" not in result.output
    assert not out.exists()


def test_a_measured_hugging_face_model_can_be_run_at_once(runner, tmp_path):
    """--catalog-out adds `models import`'s entry beside the measurement: `run --catalog` then knows the
    model; without it, the unknown-model error says how to add it."""
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    cfg, out, models = tmp_path / "cfg.json", tmp_path / "p.json", tmp_path / "models.yaml"
    cfg.write_text(json.dumps(BERT))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: tiny\ncluster: {nodes: 1, gpus_per_node: 1, gpu: CPU-2vCPU, intra_node: {fabric: pcie}}\n"
        "workload: {model: tiny-bert, micro_batch: 2, seq_len: 16, precision: fp32}\n"
        "training: {optimizer: adam}\n"
    )
    unknown = runner.invoke(app, ["run", str(scenario)])
    assert unknown.exit_code == 2
    assert "clustersim models import config.json --name tiny-bert --out models.yaml" in unknown.output
    args = ["calibrate", "model", "--hf-config", str(cfg), "--name", "tiny-bert", "--seq-len", "16"]
    result = runner.invoke(app, args + ["--out", str(out), "--catalog-out", str(models)] + QUICK)
    assert result.exit_code == 0, result.output
    assert "catalog entry 'tiny-bert' added" in result.output
    ran = runner.invoke(app, ["run", str(scenario), "--catalog", str(models), "--profile", str(out)])
    assert ran.exit_code == 0, ran.output
    assert "tiny-bert from its own measurement" in ran.output
    (mc,) = load_profile(str(out)).model_compute
    assert mc.fingerprint.threads and mc.fingerprint.cpu
    # the name is refused before anything is measured when the file already has it
    again = runner.invoke(
        app, args + ["--out", str(tmp_path / "q.json"), "--catalog-out", str(models)] + QUICK
    )
    assert again.exit_code == 2 and "already has a model named 'tiny-bert'" in again.output
    assert not (tmp_path / "q.json").exists()


def test_calibrate_model_warns_of_threads_other_than_the_profiles(runner, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "p.json"
    data = _profile(2, None)
    data["model_compute"] = []
    out.write_text(json.dumps(data))
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(
        "Tiny:\n  family: transformer\n  description: two layers\n  layers: 2\n  hidden: 32\n  heads: 2\n"
        "  ffn: 64\n  vocab: 100\n  max_positions: 32\n  token_types: 2\n  style: bert\n"
        "  default_seq_len: 16\n"
    )
    base = ["calibrate", "model", "--catalog", str(tiny), "--model", "Tiny", "--implementation", "plain"]
    result = runner.invoke(app, base + ["--out", str(out), "--threads", "1"] + QUICK)
    assert result.exit_code == 0, result.output
    assert "warning: Tiny was measured on 1 torch thread(s), the profile's hardware rates" in result.output
    (mc,) = load_profile(str(out)).model_compute
    assert mc.fingerprint.threads == 1
    result = runner.invoke(app, base + ["--out", str(out), "--threads", "2", "--json"] + QUICK)
    assert result.exit_code == 0 and json.loads(result.output)["warnings"] == []


@pytest.mark.parametrize("command", ["run", "model"])
def test_an_interrupt_says_nothing_was_written(runner, tmp_path, monkeypatch, command):
    pytest.importorskip("torch")
    import clustersim.calibration.model_calibration as model_calibration
    import clustersim.calibration.run as run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "calibrate", interrupted)
    monkeypatch.setattr(model_calibration, "calibrate_model", interrupted)
    out = tmp_path / "p.json"
    args = ["--model", "BERT-Base"] if command == "model" else []
    result = runner.invoke(app, ["calibrate", command, "--device", "cpu", "--out", str(out)] + args)
    assert result.exit_code == 130
    assert "interrupted: nothing written" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_a_v4_profile_keeps_its_entries_through_a_merge(tmp_path):
    """A model measured into an older profile: the profile is rewritten as v5, its entries kept."""
    out = tmp_path / "p.json"
    old = _profile(None, None, version=4)
    out.write_text(json.dumps(old))
    entry = ModelCompute(**_entry(1, model="BERT-Large"))
    profile = store(out, "cpu", {"source": "clustersim calibrate model --model BERT-Large"}, entry, None)
    assert [m.model for m in profile.model_compute] == ["BERT-Base", "BERT-Large"]
    assert json.loads(out.read_text())["format_version"] == 5
    assert len(profile.provenance.commands) == 2
    assert copy.deepcopy(old)["provenance"]["source"] == profile.provenance.source


def test_an_interrupt_while_the_cli_is_imported_is_one_line(monkeypatch, capsys):
    """The console script's start-up imports (about half a second) end as an interrupt later does."""
    import sys
    import types

    from clustersim.__main__ import main

    class Interrupted(types.ModuleType):
        def __getattr__(self, name):
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "clustersim.cli", Interrupted("clustersim.cli"))
    with pytest.raises(SystemExit) as exc:
        main()
    assert exc.value.code == 130 and capsys.readouterr().err == "interrupted: nothing written\n"


def test_a_stage_said_again_reads_as_still_running(capsys):
    """Off a terminal the ticker repeats the latest stage every few seconds: the repeats say so, rather
    than reading as the same stage started again ('round 2 of 4' twice)."""
    import time

    from clustersim.commands.support import PlainProgress

    p = PlainProgress("calibrate model", every_s=0.05)
    p.say("round 2 of 4: micro-batch 8 (3 of 4 sizes)")
    time.sleep(0.3)
    p.close(finished=False)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 2 and "(still running)" not in lines[0]
    again = "calibrate model: round 2 of 4: micro-batch 8 (3 of 4 sizes) (still running), "
    assert all(line.startswith(again) for line in lines[1:])


def test_a_refit_lists_the_measuring_command_then_calibrate_fit(runner, tmp_path, monkeypatch):
    sizes = [2**k for k in range(12, 24)]
    raw = {
        "format": "clustersim-raw",
        "format_version": 1,
        "device_name": "cpu",
        "provenance": {"source": "clustersim calibrate run --quick", "threads": 2, "quick": True},
        "memory": [{"bytes": 4e8, "traffic_bytes": 8e8, "median_s": 8e-4}],
        "collectives": [
            {"op": "all_reduce", "nodes": 1, "gpus_per_node": 2, "bytes": s, "median_s": 1e-5 + s / 1e11}
            for s in sizes
        ],
    }
    path, out = tmp_path / "raw.json", tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    args = ["calibrate", "fit", str(path), "--out", str(out)]
    monkeypatch.setattr("sys.argv", ["clustersim", *args])  # the command line the record keeps
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    measured, fitted = load_profile(str(out)).provenance.commands
    assert measured.source == "clustersim calibrate run --quick" and measured.threads == 2 and measured.quick
    assert "hardware rates" in measured.wrote and "collective fits" in measured.wrote
    assert fitted.source.startswith("clustersim calibrate fit") and fitted.date


@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        ("provenance.threads", 10**9, "less than or equal to 8192"),
        ("model_compute.0.fingerprint.threads", True, "not a whole number: true"),
        ("model_compute.0.fingerprint.threads", 10**9, "less than or equal to 8192"),
        ("provenance.commands", 0, "valid list"),
        ("provenance.commands", [{"source": "s", "wrote": "w"}] * 1001, "at most 1000 items"),
    ],
)
def test_a_profiles_threads_and_commands_are_checked(tmp_path, where, value, says):
    """Thread counts are whole numbers a machine can run, and a profile's command list is one a tool
    wrote: a thread count of a billion, true, or a million-entry list is one line naming the key."""
    from clustersim.calibration.profile import load_profile

    data = json.loads(open("clustersim/calibration/profiles/h100-pytorch-2.11.json").read())  # noqa: SIM115
    data["format_version"] = 5
    node = data
    *path, last = where.split(".")
    for key in path:
        node = node[int(key)] if key.isdigit() else node[key]
    node[last] = value
    f = tmp_path / "p.json"
    f.write_text(json.dumps(data))
    with pytest.raises(InputError) as err:
        load_profile(str(f))
    assert err.value.key.startswith(where) and says in err.value.message
