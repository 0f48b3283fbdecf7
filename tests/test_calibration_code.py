"""What was measured is part of the measurement: a profile's entry records the model's code
(Fingerprint.implementation) and prices a scenario directly only when the scenario runs that code
(workload.implementation) in the same execution mode; otherwise only per-op rates carry, and the band of
a carried prediction is how far carrying went on the profile's own measurements."""

from __future__ import annotations

import json
import math

import pytest

from clustersim import catalog
from clustersim.calibration.profile import (
    implementation_from_source,
    load_profile,
    optimizer_from_source,
    parse_profile,
)
from clustersim.scenario import validate_scenario
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.simulator.measured_compute import carry_errors, carry_sigma, host_rates
from clustersim.simulator.uncertainty import SESSION_SIGMA, compute_sigma


def _scenario(model: str = "BERT-Large", **workload):
    return validate_scenario(
        {
            "cluster": {"gpu": "H200", "nodes": 1, "gpus_per_node": 1},
            "workload": {"model": model, "micro_batch": 16, "seq_len": 128, "precision": "bf16", **workload},
            "training": {"optimizer": "adam"},
        },
        "test",
    )


@pytest.mark.parametrize(
    "model, parallel, code",
    [
        ("BERT-Large", {}, "hf"),
        ("GPT-2-1.5B", {}, "hf"),
        ("ResNet-50", {}, "torchvision"),
        ("BERT-Large", {"tensor": 2}, "megatron"),
    ],
)
def test_a_scenarios_code_defaults_to_what_the_catalog_model_runs(model, parallel, code):
    s = validate_scenario(
        {
            "cluster": {"gpu": "H200", "nodes": 1, "gpus_per_node": 2},
            "workload": {"model": model, "micro_batch": 4, "precision": "bf16"},
            "training": {"parallelism": parallel},
        },
        "test",
    )
    assert s.implementation == code
    assert s.with_changes(**{"workload.implementation": "plain"}).implementation == "plain"


@pytest.mark.parametrize(
    "source, model, code",
    [
        ("clustersim calibrate model --hf-config gpt2-xl/config.json --name GPT-2-1.5B", "GPT-2-1.5B", "hf"),
        ("clustersim calibrate model --model BERT-Large --micro-batches 8,16,32", "BERT-Large", "plain"),
        ("clustersim calibrate model --module bench:build --name my-net", "my-net", "my-net"),
        ("clustersim calibrate import-trace step.json --model ResNet-50", "ResNet-50", "torchvision"),
        ("the 1-bit Adam paper", "BERT-Large", None),
    ],
)
def test_an_older_profiles_code_is_read_off_its_source(source, model, code):
    assert implementation_from_source(source, model) == code


@pytest.mark.parametrize(
    "source, optimizer",
    [
        ("clustersim calibrate model --model ResNet-50 --optimizer sgd --micro-batches 32,64,128", "sgd"),
        ("clustersim calibrate model --hf-config gpt2-xl/config.json", "adamw"),
        ("clustersim calibrate import-trace step.json --model BERT-Large", None),
    ],
)
def test_an_older_profiles_optimizer_is_read_off_its_source(source, optimizer):
    assert optimizer_from_source(source) == optimizer


def test_the_shipped_profiles_say_which_code_they_measured():
    h200, h100 = load_profile("builtin:h200-pytorch-2.11"), load_profile("builtin:h100-pytorch-2.11")
    assert {mc.fingerprint.implementation for mc in h200.model_compute} == {"plain"}
    assert [mc.fingerprint.implementation for mc in h100.model_compute] == ["hf"]


def test_a_plain_build_measurement_does_not_price_hugging_faces_code():
    """The H200 profile timed clustersim's plain-torch BERT-Large: a scenario of Hugging Face's BERT-Large
    (the default code) is not priced by it, nor by its host rates (a host's cost per op is the code's);
    a scenario of the plain build is, exactly."""
    profile = load_profile("builtin:h200-pytorch-2.11")
    hf = build_context(_scenario(), profile)
    assert hf.model_compute is None and hf.transferred_from is None
    assert hf.dispatch.source.startswith("default")
    assert any("plain code" in n and "hf code" in n for n in hf.notes)
    plain = build_context(_scenario(**{"implementation": "plain"}), profile)
    assert plain.model_compute is not None and plain.model_compute.model == "BERT-Large"
    assert plain.dispatch.source.startswith("measured")


@pytest.mark.parametrize("hardware", [True, False])
def test_the_notes_of_a_measurement_of_other_code_say_one_thing(hardware):
    """A profile that measured BERT-Large as plain code, for Hugging Face's BERT-Large: no per-op rate
    carries (no measurement of hf code), so no note says one does; and the device time is at the
    profile's measured hardware rates only where it measured them (a ``calibrate model`` profile alone
    measured none: the default rates, as 'source of matmul' says)."""
    data = json.loads(json.dumps(load_profile("builtin:h200-pytorch-2.11").model_dump(mode="json")))
    if not hardware:
        data["compute_model"], data["matmul_tflops"] = {}, {}
    ctx = build_context(_scenario(), parse_profile(data, "test"))
    notes = " ".join(ctx.notes)
    assert ctx.transferred_from is None and "no measurement of hf code" in notes
    assert "carry" not in notes.replace("no measured host rate per op carries", "")
    assert ("measured hardware rates" in notes) == hardware
    assert ("profile measured no bf16 GEMM rate" in notes) == (not hardware)
    assert ("measured" in simulate(_scenario(), parse_profile(data, "test")).sources["matmul"]) == hardware


def test_a_measurement_of_the_same_code_carries_its_host_rates_per_kernel():
    """H100 profile: Hugging Face's GPT-2 XL carries to Hugging Face's BERT-Large as host time per
    launched kernel (at its smallest micro-batch) over BERT's own kernels; device time is the profile's
    hardware rates (no ratio of GPT-2's measured to modelled time)."""
    profile = load_profile("builtin:h100-pytorch-2.11")
    s = _scenario().with_changes(**{"cluster.gpu": "H100-SXM"})
    ctx = build_context(s, profile)
    (gpt2,) = profile.model_compute
    assert ctx.transferred_from is gpt2
    fwd, bwd = host_rates(gpt2)
    assert fwd == pytest.approx(gpt2.forward.host_s.at(1) / gpt2.forward.kernels)
    assert ctx._host_fwd_scale * ctx.dispatch.host_s_per_kernel_forward == pytest.approx(fwd)
    assert ctx._host_bwd_scale * ctx.dispatch.host_s_per_kernel_backward == pytest.approx(bwd)
    assert ctx._fwd_scale == ctx._bwd_scale == 1.0
    # one model of that code: carrying cannot be measured on the profile, the documented band applies
    assert ctx.carry_sigma is None and carry_errors(ctx, profile, gpt2) == []


def _entry(model: str, host_fwd: float, kernels: int, code: str = "hf") -> dict:
    def phase(host: float, device: float, k: int) -> dict:
        return {
            "host_s": {"intercept_s": host, "per_sample_s": 0.0},
            "device_s": {"intercept_s": device, "per_sample_s": 0.0},
            "kernels": k,
        }

    return {
        "model": model,
        "seq_len": 128,
        "micro_batches": [1, 2, 4],
        "forward": phase(host_fwd, 0.001, kernels),
        "backward": phase(2 * host_fwd, 0.002, 2 * kernels),
        "optimizer": phase(0.002, 0.001, 10),
        "fingerprint": {"device": "NVIDIA H200", "precision": "bf16", "implementation": code},
        "holdout": {"micro_batch": 3, "measured_s": 0.1, "predicted_s": 0.1, "rel_error": 0.0},
    }


def test_the_carried_band_is_leave_one_model_out_over_the_profiles_models_of_that_code():
    """Two models of one code: each is predicted from the other at each of its 3 micro-batches (6
    errors, what `run` gives it without its own entry: tests/test_compute_band_evidence.py); the carried
    sigma is their root mean square, a model of other code does not count, and the band adds a
    session's spread to it."""
    data = json.loads(json.dumps(load_profile("builtin:h200-pytorch-2.11").model_dump(mode="json")))
    data["model_compute"] = [
        _entry("BERT-Large", 0.020, 1000),
        _entry("GPT-2-1.5B", 0.060, 2000),
        _entry("BERT-Base", 0.001, 1000, code="plain"),
    ]
    profile = parse_profile(data, "test")
    a = profile.model_compute[0]
    ctx = build_context(_scenario("BERT-Base"), profile)  # hf code: carried from BERT-Large (same style)
    assert ctx.transferred_from.model == "BERT-Large" and not ctx.carry_same_model
    errors = carry_errors(ctx, profile, a)
    assert len(errors) == 6
    rms = math.sqrt(sum(e * e for e in errors) / 6)
    assert carry_sigma(ctx, profile, a) == pytest.approx(rms, rel=1e-9)
    assert compute_sigma(ctx) == pytest.approx(math.hypot(rms, SESSION_SIGMA))
    # BERT-Large's 20 us per forward kernel carried to GPT-2's 2,000 kernels is too fast, GPT-2's 60 us
    # carried to BERT's 1,000 too slow: both directions are counted
    assert min(errors) < 0 < max(errors)


def test_an_eager_measurement_does_not_price_a_compiled_scenario():
    profile = load_profile("builtin:h100-pytorch-2.11")
    s = _scenario("GPT-2-1.5B").with_changes(
        **{"cluster.gpu": "H100-SXM", "workload.seq_len": 1024, "workload.micro_batch": 2}
    )
    assert build_context(s, profile).model_compute is not None
    compiled = build_context(s.with_changes(**{"workload.execution": "compiled"}), profile)
    assert compiled.model_compute is None and compiled.transferred_from is None
    assert any("eager" in n and "compiled" in n for n in compiled.notes)


@pytest.fixture
def tiny_catalog(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(
        "Tiny-BERT:\n  family: transformer\n  description: two-layer BERT for a CPU test\n  layers: 2\n"
        "  hidden: 64\n  heads: 4\n  ffn: 256\n  vocab: 500\n  max_positions: 64\n  token_types: 2\n"
        "  style: bert\n  default_seq_len: 16\n"
    )
    return path


QUICK = ["--device", "cpu", "--steps", "3", "--warmup", "1", "--threads", "1", "--micro-batches", "1,2,4"]


def test_calibrate_model_times_hugging_faces_class_of_a_catalog_model(runner, tiny_catalog, tmp_path):
    """With transformers installed, `calibrate model --model` times the model's Hugging Face class (what
    people run), recorded as hf; a scenario of that model (default code hf) is priced by it, one of the
    plain build is not. --implementation plain times clustersim's build instead."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from clustersim.cli import app

    out = tmp_path / "p.json"
    args = ["calibrate", "model", "--model", "Tiny-BERT", "--catalog", str(tiny_catalog), "--out", str(out)]
    result = runner.invoke(app, args + QUICK + ["--holdout", "3"])
    assert result.exit_code == 0, result.output
    profile = load_profile(str(out))
    (mc,) = profile.model_compute
    assert mc.fingerprint.implementation == "hf" and profile.dispatch.fingerprint.implementation == "hf"
    with catalog.user_catalogs([tiny_catalog]):
        scenario = validate_scenario(
            {
                "cluster": {
                    "gpu": "CPU-2vCPU",
                    "nodes": 1,
                    "gpus_per_node": 1,
                    "intra_node": {"fabric": "pcie"},
                    "nic": {"kind": "ethernet_tcp", "count": 1, "line_rate_gbps": 10},
                },
                "workload": {"model": "Tiny-BERT", "micro_batch": 2, "seq_len": 16, "precision": "fp32"},
            },
            "test",
        )
        assert simulate(scenario, profile).compute_from == "measured"
        plain = scenario.with_changes(**{"workload.implementation": "plain"})
        assert simulate(plain, profile).compute_from != "measured"
    plain_out = tmp_path / "plain.json"
    args[-1] = str(plain_out)
    result = runner.invoke(app, args + QUICK + ["--holdout", "3", "--implementation", "plain"])
    assert result.exit_code == 0, result.output
    assert load_profile(str(plain_out)).model_compute[0].fingerprint.implementation == "plain"


def test_an_hf_config_is_recorded_as_hugging_faces_code(runner, tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from clustersim.cli import app

    folder = tmp_path / "tiny-bert"
    transformers.BertConfig(
        vocab_size=500,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        architectures=["BertForPreTraining"],
    ).save_pretrained(folder)
    out = tmp_path / "p.json"
    args = ["calibrate", "model", "--hf-config", str(folder), "--seq-len", "16", "--out", str(out)]
    result = runner.invoke(app, args + QUICK + ["--holdout", "3"])
    assert result.exit_code == 0, result.output
    (mc,) = load_profile(str(out)).model_compute
    assert mc.fingerprint.implementation == "hf"
    assert mc.holdout is not None and math.isfinite(mc.holdout.rel_error)


def test_implementation_applies_to_a_catalog_model_only(runner, tmp_path):
    from clustersim.cli import app

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "bert"}))
    result = runner.invoke(
        app,
        ["calibrate", "model", "--hf-config", str(config), "--implementation", "plain", "--device", "cpu"],
    )
    assert result.exit_code == 2 and "--implementation" in result.output
    result = runner.invoke(
        app, ["calibrate", "model", "--model", "BERT-Base", "--implementation", "megatron", "--device", "cpu"]
    )
    assert result.exit_code == 2 and "unknown implementation" in result.output


def _bert(**training):
    return validate_scenario(
        {
            "cluster": {"gpu": "H200", "nodes": 1, "gpus_per_node": 1},
            "workload": {"model": "BERT-Large", "micro_batch": 16, "seq_len": 128, "precision": "bf16"},
            "training": {"optimizer": "adam", **training},
        },
        "test",
    )


def test_a_host_sync_after_forward_starts_backward_when_the_device_is_done():
    """training.host_sync_after_forward (a per-phase timer, loss.item()): backward's dispatch waits for
    forward's kernels. BERT-Large at micro-batch 16 is bound by the host: without the sync the host
    dispatches backward while the device still runs forward's last kernels (the LM head); with it the
    host starts backward only when they are done, and the step is longer by exactly that lag (backward
    stays bound by the host). With CUDA graphs (no dispatch) the sync changes nothing."""
    plain, synced = (simulate(_bert(host_sync_after_forward=x)) for x in (False, True))
    end = {o.name: o.end for o in plain.ops}
    lag = end["fwd head"] - end["dispatch fwd head"]
    assert lag > 0
    assert synced.iteration_time - plain.iteration_time == pytest.approx(lag, rel=1e-6)
    graphs = {"workload.execution": "cuda_graphs"}
    a, b = (simulate(_bert(host_sync_after_forward=x).with_changes(**graphs)) for x in (False, True))
    assert b.iteration_time == pytest.approx(a.iteration_time, rel=1e-12)


def test_the_adam_update_carries_from_a_measurement_of_any_code():
    """The H200 profile measured plain builds only, with AdamW (BERT-Large, GPT-2 XL) and SGD
    (ResNet-50): a Hugging Face BERT-Large with fused Adam takes the update's rate from a measured AdamW
    phase (torch.optim's kernels whatever the model's code), so that the measured model's own update is
    its measurement; an SGD scenario takes none."""
    from clustersim.cost_models.kernel_bytes import FUSED_ADAM
    from clustersim.simulator.measured_compute import _measured_workload, device_time

    profile = load_profile("builtin:h200-pytorch-2.11")
    assert {mc.model: mc.fingerprint.optimizer for mc in profile.model_compute} == {
        "BERT-Large": "adamw",
        "ResNet-50": "sgd",
        "GPT-2-1.5B": "adamw",
    }
    ctx = build_context(_scenario(), profile)
    mc = ctx.update_from
    assert mc is not None and mc.fingerprint.optimizer == "adamw" and ctx.model_compute is None
    params = _measured_workload(mc).params
    modelled = ctx.device.stream_time(FUSED_ADAM * params, "optimizer")
    measured = device_time(mc, mc.optimizer, mc.micro_batches[0])  # busy time and the kernels' gaps
    assert ctx._update_scale * modelled == pytest.approx(measured)
    sgd = build_context(_scenario().with_changes(**{"training.optimizer": "sgdm"}), profile)
    assert sgd.update_from is None and sgd._update_scale == 1.0


@pytest.mark.parametrize("model, ratio", [("BERT-Large", 7.17), ("GPT-2-1.5B", 5.43), ("ResNet-50", 4.68)])
def test_the_backward_host_goes_with_its_autograd_ops(model, ratio):
    """Eager backward's host time is 3.07 us per autograd op (BERT-Large's H200 trace: 31.32 ms over
    10,193 ops), times the ops each style runs per launch (its own trace): BERT's per-launch rate is the
    trace's 22.0 us, GPT-2's and ResNet-50's lower (16.7 and 14.4 us)."""
    s = _scenario(model, **({"seq_len": 1024} if model.startswith("GPT") else {}))
    if model == "ResNet-50":
        s = s.with_changes(**{"workload.seq_len": None})
    ctx = build_context(s)
    assert ctx.dispatch.backward_ops_per_launch == ratio
    assert ctx.dispatch.host_s_per_kernel_backward == pytest.approx(3.07e-6 * ratio)
    compiled = build_context(s.with_changes(**{"workload.execution": "compiled"}))
    assert compiled.dispatch.host_s_per_kernel_backward == 22.0e-6  # no autograd op by op: per launch


def test_a_measurement_with_ops_carries_the_backward_per_op():
    """A measured model that recorded its backward's ops carries its host time per op: over another
    style's launches at that style's ops per launch (BERT-Large's measurement to GPT-2 XL)."""
    data = json.loads(json.dumps(load_profile("builtin:h200-pytorch-2.11").model_dump(mode="json")))
    entry = _entry("BERT-Large", 0.020, 1000)
    entry["backward"]["ops"] = 14000  # 0.040 s over 14,000 ops: 2.86 us per op
    data["model_compute"] = [entry]
    profile = parse_profile(data, "test")
    s = _scenario("GPT-2-1.5B", seq_len=1024)
    ctx = build_context(s, profile)
    assert ctx.transferred_from.model == "BERT-Large"
    per_launch = ctx._host_bwd_scale * ctx.dispatch.host_s_per_kernel_backward
    assert per_launch == pytest.approx(0.040 / 14000 * 5.43)


def test_an_imported_trace_records_its_jobs_code_and_ops(runner, tmp_path):
    """import-trace: the job's code is its model's default (Hugging Face's BERT) unless
    --implementation says; each phase's launches and ops, and the backward's host time per op, are
    stored (the H200 BERT-Large trace: 805 and 1,422 launches, 10,193 backward ops)."""
    from pathlib import Path

    from clustersim.cli import app

    trace = Path(__file__).parent / "data" / "h200-bert-large-s128-mb16.trace.json.gz"
    args = ["calibrate", "import-trace", str(trace), "--model", "BERT-Large", "--micro-batch", "16"]
    args += ["--seq-len", "128"]
    result = runner.invoke(app, args + ["--out", str(tmp_path / "a.json")])
    assert result.exit_code == 0, result.output
    profile = load_profile(str(tmp_path / "a.json"))
    (mc,) = profile.model_compute
    assert (mc.fingerprint.implementation, mc.fingerprint.optimizer) == ("hf", "adamw")
    assert (mc.forward.kernels, mc.backward.kernels, mc.backward.ops) == (805, 1422, 10193)
    assert profile.dispatch.host_s_per_op_backward == pytest.approx(mc.backward.host_s.at(1) / 10193)
    result = runner.invoke(app, args + ["--implementation", "megatron", "--out", str(tmp_path / "b.json")])
    assert result.exit_code == 0, result.output
    assert load_profile(str(tmp_path / "b.json")).model_compute[0].fingerprint.implementation == "megatron"
    result = runner.invoke(app, args + ["--implementation", "no such!", "--out", str(tmp_path / "c.json")])
    assert result.exit_code == 2 and "--implementation" in result.output


def test_a_code_name_nothing_has_measured_is_said_not_taken_silently():
    """A user's code name is valid only as the name of a measurement: without one (a misspelt name, a
    profile not given) the run says nothing measured prices it; a known code or a measured one says
    nothing."""

    def note(ctx):
        return [n for n in ctx.notes if "workload.implementation" in n]

    assert note(build_context(_scenario(**{"implementation": "my-bert"}), None))
    assert not note(build_context(_scenario(**{"implementation": "hf"}), None))
    assert not note(build_context(_scenario(**{"implementation": "HF"}), None))
    profile = load_profile("builtin:h200-pytorch-2.11")
    assert note(build_context(_scenario(**{"implementation": "my-bert"}), profile))
    assert not note(build_context(_scenario(**{"implementation": "plain"}), profile))
