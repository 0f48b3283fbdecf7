"""`calibrate import-trace`: a model's measured compute from a torch.profiler trace.

Fixtures: two real H200 training steps (tests/data/h200-*.trace.json.gz, derived from the shared
development traces by keeping only the events and fields import-trace reads; *.et.json.gz likewise
from their execution traces). The unprofiled truth per phase is from h200-dev-steps.json: BERT-Large
seq 128 micro-batch 16 forward 19.74 ms, backward 31.32 ms, optimizer 4.55 ms, step 55.85 ms;
ResNet-50 batch 128 forward 13.68 ms, backward 17.77 ms, optimizer 1.40 ms, step 32.85 ms.
"""

import gzip
import json
import re
from pathlib import Path

import pytest

from clustersim.calibration import trace_import as ti
from clustersim.calibration.profile import load_profile
from clustersim.cli import app
from clustersim.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
BERT = DATA / "h200-bert-large-s128-mb16.trace.json.gz"
BERT_ET = DATA / "h200-bert-large-s128-mb16.et.json.gz"
RESNET = DATA / "h200-resnet50-224-bs128.trace.json.gz"
RESNET_ET = DATA / "h200-resnet50-224-bs128.et.json.gz"
SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "gpu"

# h200-dev-steps.json: unprofiled, synchronised per phase, median of 10 steps
BERT_TRUTH = {"forward": 0.01974, "backward": 0.031316, "optimizer": 0.004552, "step": 0.055847}
RESNET_TRUTH = {"forward": 0.013681, "backward": 0.017767, "optimizer": 0.001401, "step": 0.032854}


def _analyse(path):
    return ti.analyse(ti.read_json(path, "trace"), str(path))


def test_bert_large_step_phases_match_the_unprofiled_truth():
    """BERT-Large at micro-batch 16 is bound by the host thread: host time with the profiler's cost
    removed is each phase's time within 10%, and the device is busy for well under half the step."""
    a = _analyse(BERT)
    assert len(a.steps) == 2 and len(a.used) == 1  # the first step pays the profiler's warm-up
    kernels = {p: a.median(p, "kernels") for p in ti.PHASES}
    # launches (780 and 1,251 kernels, 25 and 171 memsets): what the catalog's BERT counts count
    assert kernels == {"forward": 805, "backward": 1422, "optimizer": 21}
    for phase in ti.PHASES:
        host = a.host_s(phase, ti.PROFILER_OVERHEAD_S)
        assert host == pytest.approx(BERT_TRUTH[phase], rel=0.10), phase
        assert a.median(phase, "device_busy_s") < host
    busy = sum(a.median(p, "device_busy_s") for p in ti.PHASES)
    assert 0.019 < busy < 0.023  # "keeps the GPU busy about 21 ms of a 56 ms step"
    assert (a.device_name, a.cuda, a.precision, a.attention, a.execution) == (
        "NVIDIA H200",
        "13.0",
        "bf16",
        "sdpa",
        "eager",
    )


def test_resnet50_is_bound_by_the_device():
    """ResNet-50 at batch 128: the device's busy time is most of each compute phase and never more
    than the measured phase; the backward's host is half as busy as the device. The forward's host
    comes out 5% above the phase itself: ResNet's ops cost the profiler more than BERT's, from which
    the default overhead was measured (what --step-time is for)."""
    a = _analyse(RESNET)
    for phase in ("forward", "backward"):
        device = a.median(phase, "device_busy_s")
        assert 0.8 * RESNET_TRUTH[phase] < device <= RESNET_TRUTH[phase], phase
        assert a.host_s(phase, ti.PROFILER_OVERHEAD_S) < 1.1 * RESNET_TRUTH[phase]
    assert a.host_s("backward", ti.PROFILER_OVERHEAD_S) < 0.6 * a.median("backward", "device_busy_s")
    assert a.attention is None and a.precision == "bf16"


def test_step_time_measures_the_profiler_overhead():
    """The overhead derived from BERT's unprofiled step agrees with the default (measured per phase
    on the same GPU) within 5%."""
    a = _analyse(BERT)
    derived = ti.overhead_from_step_time(a, BERT_TRUTH["step"])
    assert derived == pytest.approx(ti.PROFILER_OVERHEAD_S, rel=0.05)
    with pytest.raises(InputError, match="not shorter than the profiled step"):
        ti.overhead_from_step_time(a, 1.0)


def test_execution_trace_gives_the_parameters():
    assert ti.read_execution_trace(BERT_ET) == {
        "param_tensors": 398,
        "params": 336226108,  # h200-dev-steps.json: BERT-Large 336,226,108
        "op": "aten::_fused_adamw_",
    }
    assert ti.read_execution_trace(RESNET_ET)["params"] == 25557032  # ResNet-50: 25,557,032


@pytest.mark.skipif(not (SHARED / "bert-large-s128-mb16.kineto.json.gz").exists(), reason="no ../shared/gpu")
def test_the_full_shared_trace_gives_what_the_derived_fixture_gives():
    full, small = _analyse(SHARED / "bert-large-s128-mb16.kineto.json.gz"), _analyse(BERT)
    for phase in ti.PHASES:
        for what in ("wall_s", "sync_s", "events", "kernels", "device_busy_s"):
            assert full.median(phase, what) == pytest.approx(small.median(phase, what)), (phase, what)
    assert ti.read_execution_trace(SHARED / "bert-large-s128-mb16.et.json.gz")["params"] == 336226108


def _span(cat, name, ts, dur, tid=1, **args):
    e = {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = args
    return e


def _synthetic_step(t0: float, corr: int) -> list[dict]:
    """One step: forward op (10 us, one 4 us kernel), backward op on thread 2 (20 us, one 6 us kernel),
    optimizer (5 us, one 1 us kernel); times in microseconds as Kineto writes them."""
    return [
        _span("cpu_op", "aten::linear", t0, 10),
        _span("cuda_runtime", "cudaLaunchKernel", t0 + 1, 2, correlation=corr),
        _span("kernel", "gemm", t0 + 5, 4, tid=7, correlation=corr),
        _span(
            "cpu_op",
            "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad",
            t0 + 12,
            20,
            tid=2,
        ),
        _span("cuda_runtime", "cudaLaunchKernel", t0 + 13, 2, tid=2, correlation=corr + 1),
        _span("kernel", "gemm_bwd", t0 + 16, 6, tid=7, correlation=corr + 1),
        _span("user_annotation", "Optimizer.step#SGD.step", t0 + 35, 5),
        _span("cpu_op", "aten::_foreach_add_", t0 + 35, 4),
        _span("cuda_runtime", "cudaLaunchKernel", t0 + 36, 1, correlation=corr + 2),
        _span("kernel", "foreach", t0 + 38, 1, tid=7, correlation=corr + 2),
    ]


def test_profiler_steps_split_phases_by_thread_and_correlation():
    events = []
    for i in range(3):
        events += [_span("user_annotation", f"ProfilerStep#{i}", 100.0 * i, 45)] + _synthetic_step(
            100.0 * i, 10 * i
        )
    a = ti.analyse({"traceEvents": events}, "synthetic")
    assert len(a.steps) == 3 and len(a.used) == 2
    f, b, o = (a.steps[1].phases[p] for p in ti.PHASES)
    assert (f.wall_s, f.kernels, f.device_busy_s, f.events) == pytest.approx((12e-6, 1, 4e-6, 1))
    assert (b.wall_s, b.kernels, b.device_busy_s) == pytest.approx((23e-6, 1, 6e-6))
    assert (o.wall_s, o.kernels, o.device_busy_s) == pytest.approx((10e-6, 1, 1e-6))
    assert a.steps[1].param_tensors == 1
    assert f.host_s(1e-6) == pytest.approx(11e-6)


def test_a_step_without_annotations_is_refused():
    events = [e for e in _synthetic_step(0.0, 1) if e["cat"] != "user_annotation"]
    with pytest.raises(InputError, match="no training step"):
        ti.analyse({"traceEvents": events}, "synthetic")


def _one_line(result, name):
    assert result.exit_code == 2, result.output
    # a loaded machine may print the progress line ("working, 2.0 s elapsed") before the error
    progress = re.compile(r"^calibrate import trace: .* elapsed")
    lines = [line for line in result.output.splitlines() if line.strip() and not progress.match(line)]
    assert len(lines) == 1 and name in lines[0] and "Traceback" not in result.output, result.output
    return lines[0]


@pytest.fixture
def damaged(tmp_path):
    raw = gzip.decompress(BERT.read_bytes())
    files = {
        "not-json.json": b"this is not json",
        "truncated.json.gz": BERT.read_bytes()[:50_000],
        "no-events.json": json.dumps({"schemaVersion": 1}).encode(),
        "no-kernels.json": json.dumps(
            {"traceEvents": [e for e in json.loads(raw)["traceEvents"] if e.get("cat") != "kernel"]}
        ).encode(),
        "list.json": b"[1, 2]",
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path


@pytest.mark.parametrize(
    "name, says",
    [
        ("not-json.json", "not JSON: line 1: Expecting value"),
        ("truncated.json.gz", "truncated"),
        ("no-events.json", "traceEvents"),
        ("no-kernels.json", "no GPU kernels"),
        ("list.json", "not a JSON object"),
        ("missing.json", "not found"),
    ],
)
def test_a_damaged_trace_is_one_line(runner, damaged, name, says):
    result = runner.invoke(
        app, ["calibrate", "import-trace", str(damaged / name), "--out", str(damaged / "p.json")]
    )
    assert says in _one_line(result, name)
    assert not (damaged / "p.json").exists()


def test_dev_zero_is_one_line(runner, tmp_path):
    result = runner.invoke(app, ["calibrate", "import-trace", "/dev/zero", "--out", str(tmp_path / "p.json")])
    assert "not a regular file" in _one_line(result, "/dev/zero")


def test_cli_writes_and_merges_model_compute(runner, tmp_path):
    out = tmp_path / "profile.json"
    args = ["calibrate", "import-trace", str(BERT), "--et", str(BERT_ET), "--out", str(out)]
    result = runner.invoke(app, args + ["--model", "bert-large", "--micro-batch", "16", "--seq-len", "128"])
    assert result.exit_code == 0, result.output
    assert "805" in result.output and "1,422" in result.output
    p = load_profile(str(out))
    assert p.device == "H200" and p.provenance.device_name == "NVIDIA H200"
    (mc,) = p.model_compute
    assert (mc.model, mc.seq_len, mc.micro_batches, mc.fingerprint.precision) == (
        "BERT-Large",  # the catalog's spelling, which a scenario's model matches
        128,
        [16],
        "bf16",
    )
    assert mc.forward.host_s.at(16) == pytest.approx(BERT_TRUTH["forward"], rel=0.10)
    assert mc.backward.device_s.at(16) == pytest.approx(0.0122, rel=0.01)
    assert mc.forward.device_s.intercept_s == 0 and mc.forward.host_s.per_sample_s == 0
    # the optimizer's work does not grow with the micro-batch
    assert mc.optimizer.device_s.at(64) == mc.optimizer.device_s.at(16) > 0
    d = p.dispatch
    assert 15e-6 < d.host_s_per_kernel_forward < 35e-6 and 15e-6 < d.host_s_per_kernel_backward < 35e-6
    assert d.host_s_per_param_tensor == pytest.approx(mc.optimizer.host_s.intercept_s / 398)
    assert 0 < d.device_s_per_kernel < 5e-6
    # another model is added, the same one replaced, the rest of the profile kept
    result = runner.invoke(
        app,
        ["calibrate", "import-trace", str(RESNET), "--out", str(out), "--model", "ResNet-50"]
        + ["--micro-batch", "128", "--step-time", str(RESNET_TRUTH["step"])],  # a CNN's side: 224
    )
    assert result.exit_code == 0, result.output
    assert [(m.model, m.seq_len) for m in load_profile(str(out)).model_compute] == [
        ("BERT-Large", 128),
        ("ResNet-50", 224),
    ]
    result = runner.invoke(app, args + ["--model", "bert-large", "--micro-batch", "16", "--seq-len", "128"])
    assert [m.model for m in load_profile(str(out)).model_compute] == ["ResNet-50", "BERT-Large"]
    shown = runner.invoke(app, ["calibrate", "show", str(out)])
    assert shown.exit_code == 0 and "dispatch rates" in shown.output and "ResNet-50" in shown.output
    # a scenario spelling the model otherwise (names are case-insensitive) finds the same measurement
    example = str(ROOT / "examples" / "h200-bert-large-one-gpu.yaml")
    ran = runner.invoke(
        app, ["run", example, "--profile", str(out), "--samples", "0", "--set", "workload.model=bert-large"]
    )
    assert ran.exit_code == 0 and "BERT-Large's own measured phases" in ran.output, ran.output


def test_cli_without_a_model_stores_dispatch_rates_only(runner, tmp_path):
    out = tmp_path / "p.json"
    result = runner.invoke(app, ["calibrate", "import-trace", str(RESNET), "--out", str(out)])
    assert result.exit_code == 0, result.output
    p = load_profile(str(out))
    assert p.model_compute == [] and p.dispatch is not None
    result = runner.invoke(
        app, ["calibrate", "import-trace", str(RESNET), "--out", str(out), "--model", "BERT-Large"]
    )
    assert "go together" in _one_line(result, "--model")


@pytest.mark.parametrize(
    "trace,extra,key,says",
    [
        (
            "bert",
            ["--model", "Foo", "--micro-batch", "16", "--seq-len", "128"],
            "--model",
            "unknown model 'Foo'",
        ),
        ("bert", ["--model", "ResNet-50", "--micro-batch", "16"], "--model", "runs attention"),
        (
            "resnet",
            ["--model", "BERT-Large", "--micro-batch", "128", "--seq-len", "128"],
            "--model",
            "convolutions",
        ),
        (
            "resnet",
            ["--model", "ResNet-50", "--micro-batch", "128", "--seq-len", "160"],
            "--seq-len",
            "224 px",
        ),
        ("bert", ["--step-time", "0.001"], "--step-time", "more than the whole"),
        ("bert", ["--et", "RESNET_ET"], "--et", "161 parameter tensors, the trace's 398"),
        ("bert", ["--et", "BERT"], "nodes", "no nodes list"),
        ("bert", ["--model", "BERT-Large", "--micro-batch", "16", "--seq-len", "100000"], "--seq-len", "512"),
        (
            "bert",
            ["--model", "GPT-2-124M", "--micro-batch", "16", "--seq-len", "128", "--et", "BERT_ET"],
            "--model",
            "updates 336,226,108 parameters, GPT-2-124M has 124,439,808",
        ),
    ],
)
def test_what_the_trace_did_not_run_is_refused(runner, tmp_path, trace, extra, key, says):
    """A model the trace did not run, a side it was not measured at, a step time that leaves the profiler
    more than the step, another job's execution trace: one line each, and nothing written."""
    out = tmp_path / "p.json"
    files = {"RESNET_ET": str(RESNET_ET), "BERT_ET": str(BERT_ET), "BERT": str(BERT)}
    extra = [files.get(x, x) for x in extra]
    path = BERT if trace == "bert" else RESNET
    result = runner.invoke(app, ["calibrate", "import-trace", str(path), "--out", str(out), *extra])
    assert says in _one_line(result, key)
    assert not out.exists()


def test_a_profile_of_another_device_is_refused(runner, tmp_path):
    out = tmp_path / "p.json"
    out.write_text(
        json.dumps(
            {
                "format": "clustersim-profile",
                "format_version": 4,
                "device": "A100-SXM",
                "provenance": {"source": "test"},
            }
        )
    )
    result = runner.invoke(app, ["calibrate", "import-trace", str(RESNET), "--out", str(out)])
    assert "A100-SXM" in _one_line(result, str(out))


def test_optimizer_annotations_split_steps_with_zero_grad_first():
    """A loop that calls zero_grad before the forward: each step still gets one zero_grad and one
    optimizer step, and the forward starts after the zero_grad."""
    events = []
    for i in range(3):
        t0 = 100.0 * i
        events.append(_span("user_annotation", "Optimizer.zero_grad#SGD.zero_grad", t0, 2))
        events += _synthetic_step(t0 + 5, 10 * i)
    a = ti.analyse({"traceEvents": events}, "synthetic")
    assert len(a.steps) == 3
    for step in a.steps[1:]:
        assert {p: step.phases[p].kernels for p in ti.PHASES} == {"forward": 1, "backward": 1, "optimizer": 1}
        assert step.phases["forward"].events == 1 and step.phases["optimizer"].events == 1


def test_an_optimizer_with_parameter_groups_counts_every_group(tmp_path):
    """Training scripts split weight decay and none into two parameter groups, and the optimizer runs
    one fused or foreach call per group: the execution trace's parameters are all groups' (its step
    counters, lists of scalars, are not parameters)."""
    torch = pytest.importorskip("torch")
    from torch.profiler import ExecutionTraceObserver

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1))
    decay = [p for p in model.parameters() if p.dim() > 1]
    rest = [p for p in model.parameters() if p.dim() <= 1]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, foreach=True)

    def step():
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    observer = ExecutionTraceObserver()
    observer.register_callback(str(tmp_path / "et.json"))
    observer.start()
    step()
    observer.stop()
    observer.unregister_callback()
    got = ti.read_execution_trace(tmp_path / "et.json")
    assert (got["param_tensors"], got["params"]) == (6, sum(p.numel() for p in model.parameters()))


@pytest.mark.parametrize(
    "change,says",
    [
        (lambda e: e.update(dur=-1.0), "not times in microseconds"),
        (lambda e: e.update(ts=float("nan")), "not times in microseconds"),
        (lambda e: e.update(dur=True), "not times in microseconds"),
        (lambda e: e.pop("pid"), "cannot read (KeyError: 'pid')"),
    ],
)
def test_a_damaged_event_is_one_line_naming_the_trace(runner, tmp_path, change, says):
    """An optimizer annotation whose numbers cannot be times, or that lacks a field the analysis reads:
    one line naming the trace, exit 2, nothing written."""
    trace = ti.read_json(BERT, "trace")
    annotation = next(e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("Optimizer."))
    change(annotation)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(trace))
    out = tmp_path / "p.json"
    result = runner.invoke(app, ["calibrate", "import-trace", str(bad), "--out", str(out)])
    assert says in _one_line(result, str(bad))
    assert not out.exists()


def test_an_execution_trace_with_a_bad_dimension_is_one_line(runner, tmp_path):
    et = ti.read_json(BERT_ET, "execution trace")
    node = next(n for n in et["nodes"] if str(n.get("name", "")).startswith("aten::_fused_adamw"))
    node["inputs"]["shapes"][0][0][0] = -5
    bad = tmp_path / "et.json"
    bad.write_text(json.dumps(et))
    out = tmp_path / "p.json"
    result = runner.invoke(app, ["calibrate", "import-trace", str(BERT), "--et", str(bad), "--out", str(out)])
    assert "not a dimension" in _one_line(result, str(bad))
    assert not out.exists()
