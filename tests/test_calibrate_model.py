"""`calibrate model`: a model's own training step timed on this machine (CPU here), fitted linear in
the micro-batch with one size held out, stored with its fingerprint. No timing is asserted: the
held-out error is reported (docs/gpu-compute.md), not tested, since this machine is shared."""

import json
import math
import textwrap

import pytest

torch = pytest.importorskip("torch")

from clustersim import catalog  # noqa: E402
from clustersim.calibration import model_timing, torch_models  # noqa: E402
from clustersim.calibration.profile import load_profile  # noqa: E402
from clustersim.cli import app  # noqa: E402
from clustersim.workloads.resnet import resnet_layers  # noqa: E402
from clustersim.workloads.transformer import transformer_layers  # noqa: E402

TINY = """
Tiny-BERT:
  family: transformer
  description: a two-layer BERT-style encoder, small enough to time on a CPU in a test
  layers: 2
  hidden: 64
  heads: 4
  ffn: 256
  vocab: 500
  max_positions: 64
  token_types: 2
  style: bert
  default_seq_len: 16
Tiny-LLaMA:
  family: transformer
  description: a two-layer LLaMA-style decoder with grouped-query attention
  layers: 2
  hidden: 64
  heads: 4
  kv_heads: 2
  ffn: 128
  vocab: 500
  max_positions: 0
  style: llama
  default_seq_len: 16
Tiny-ResNet:
  family: resnet
  description: one bottleneck per stage, 8 channels wide, 64x64 images
  blocks: [1, 1, 1, 1]
  width: 8
  image_size: 64
  num_classes: 10
"""
QUICK = ["--device", "cpu", "--steps", "3", "--warmup", "1", "--threads", "1"]


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


@pytest.mark.parametrize("name", sorted(catalog.models()))
def test_torch_models_have_the_catalog_parameter_tensors(name):
    """The plain-torch model and the simulator's workload count the same parameter tensors (built on
    the meta device: no memory), so what is timed is what is simulated."""
    arch = catalog.model(name)
    with torch.device("meta"):
        model = torch_models.build(torch, arch, "meta")
    if arch.family == "resnet":
        layers = resnet_layers(arch, 1, 2)
    else:
        layers = transformer_layers(arch, 1, arch.default_seq_len, 2)
    assert sorted(p.numel() for p in model.parameters()) == sorted(t for x in layers for t in x.param_tensors)


def test_bert_large_has_the_hugging_face_parameter_count():
    with torch.device("meta"):
        model = torch_models.build(torch, catalog.model("BERT-Large"), "meta")
    assert sum(p.numel() for p in model.parameters()) == 336226108  # HF BertForPreTraining (H200 dev data)


def test_fit_linear():
    exact = model_timing.fit_linear([1, 2, 4], [3.0, 5.0, 9.0])
    assert (exact.intercept_s, exact.per_sample_s) == pytest.approx((1.0, 2.0))
    through_origin = model_timing.fit_linear([1, 2, 4], [1.0, 3.0, 7.0])  # a = -1 < 0
    assert through_origin.intercept_s == 0 and through_origin.per_sample_s == pytest.approx(35 / 21)
    falling = model_timing.fit_linear([1, 2, 4], [3.0, 2.0, 1.0])
    assert (falling.intercept_s, falling.per_sample_s) == pytest.approx((2.0, 0.0))


def test_compute_ops_take_self_time_of_kernels_only():
    """addmm inside linear: linear (composite) and the view are dispatch; addmm's self time excludes
    the copy inside it, which is a kernel of its own."""
    ops = [
        {"name": "aten::linear", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
        {"name": "aten::t", "ts": 1, "dur": 4, "pid": 1, "tid": 1},
        {"name": "aten::addmm", "ts": 10, "dur": 80, "pid": 1, "tid": 1},
        {"name": "aten::copy_", "ts": 12, "dur": 20, "pid": 1, "tid": 1},
        {
            "name": "autograd::engine::evaluate_function: AddmmBackward0",
            "ts": 200,
            "dur": 50,
            "pid": 1,
            "tid": 2,
        },
    ]
    got = {e["name"]: e["dur"] for e in model_timing._compute_ops(ops, model_timing.dispatch_only_ops(torch))}
    assert got == {"aten::addmm": 60, "aten::copy_": 20}


def test_calibrate_model_on_the_cpu(runner, tiny, tmp_path):
    out = tmp_path / "profile.json"
    args = ["calibrate", "model", "--model", "Tiny-BERT", "--catalog", str(tiny), "--out", str(out)]
    result = runner.invoke(app, args + QUICK + ["--micro-batches", "1,2,4", "--holdout", "3", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output[result.output.index("{") :])
    p = load_profile(str(out))
    assert p.device == "cpu"
    (mc,) = p.model_compute
    assert (mc.model, mc.seq_len, mc.micro_batches) == ("Tiny-BERT", 16, [1, 2, 4])
    fp = mc.fingerprint
    assert (fp.device, fp.torch, fp.precision, fp.autocast, fp.attention, fp.execution) == (
        "cpu",
        torch.__version__,
        "fp32",
        False,
        "sdpa",
        "eager",
    )
    assert mc.holdout.micro_batch == 3 and math.isfinite(mc.holdout.rel_error)
    assert mc.holdout.measured_s == pytest.approx(
        sum(ph["wall_s"] for ph in report["measured"][-1]["phases"].values())
    )
    for m in report["measured"]:
        for phase in m["phases"].values():  # on the CPU host and kernels run in series
            assert phase["host_s"] + phase["device_s"] == pytest.approx(phase["wall_s"])
            assert phase["ops"] > 0
    assert mc.forward.kernels > 0 and mc.backward.kernels > 0 and mc.optimizer.kernels > 0
    # the optimizer's time is the parameters', not the batch's: no slope in the micro-batch
    assert mc.optimizer.host_s.per_sample_s == mc.optimizer.device_s.per_sample_s == 0
    d = p.dispatch
    assert d.host_s_per_kernel_forward > 0 and d.host_s_per_kernel_backward > 0
    assert d.fingerprint == fp
    # a ResNet (seq_len: the image side) joins the same profile; calibrate show prints both
    result = runner.invoke(
        app,
        ["calibrate", "model", "--model", "Tiny-ResNet", "--catalog", str(tiny), "--out", str(out)]
        + QUICK
        + ["--micro-batches", "1,2,3", "--holdout", "4", "--optimizer", "sgd"],
    )
    assert result.exit_code == 0, result.output
    assert "held out micro-batch 4" in result.output
    p = load_profile(str(out))
    assert [(m.model, m.seq_len) for m in p.model_compute] == [("Tiny-BERT", 16), ("Tiny-ResNet", 64)]
    shown = runner.invoke(app, ["calibrate", "show", str(out)])
    assert shown.exit_code == 0 and "Tiny-ResNet" in shown.output


def test_a_scenario_names_the_model_and_fewer_layers_are_stored_apart(runner, tiny, tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        textwrap.dedent(
            """
            name: tiny
            cluster:
              nodes: 1
              gpus_per_node: 1
              gpu: H100-SXM
              nic: {kind: infiniband, count: 1, line_rate_gbps: 400}
            workload: {model: Tiny-LLaMA, micro_batch: 2, seq_len: 8, precision: bf16}
            """
        )
    )
    out = tmp_path / "p.json"
    result = runner.invoke(
        app,
        ["calibrate", "model", "--scenario", str(scenario), "--catalog", str(tiny), "--layers", "1"]
        + ["--out", str(out), "--micro-batches", "1,2,3", "--holdout", "4"]
        + QUICK,
    )
    assert result.exit_code == 0, result.output
    (mc,) = load_profile(str(out)).model_compute
    assert (mc.model, mc.seq_len, mc.fingerprint.precision, mc.fingerprint.autocast) == (
        "Tiny-LLaMA-1L",
        8,
        "bf16",
        True,
    )


USER_MODULE = """
import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(32, 64)
        self.b = torch.nn.Linear(64, 1)

    def forward(self, x, y):
        return torch.nn.functional.mse_loss(self.b(torch.relu(self.a(x))).squeeze(-1), y)


def build(micro_batch, seq_len, device):
    return Net(), {"x": torch.randn(micro_batch, seq_len, 32), "y": torch.randn(micro_batch, seq_len)}


def not_a_model(micro_batch, seq_len, device):
    return "nope"
"""


def test_a_users_own_module(runner, tmp_path, monkeypatch):
    (tmp_path / "my_net.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "p.json"
    base = ["calibrate", "model", "--out", str(out), "--seq-len", "8"] + QUICK
    result = runner.invoke(app, base + ["--module", "my_net:build", "--name", "my-net"])
    assert result.exit_code == 0, result.output
    (mc,) = load_profile(str(out)).model_compute
    assert (mc.model, mc.seq_len, mc.fingerprint.attention) == ("my-net", 8, None)
    result = runner.invoke(app, base + ["--module", "my_net:not_a_model"])
    assert result.exit_code == 2 and "must return (nn.Module, batch)" in result.output
    result = runner.invoke(app, base + ["--module", "my_net"])
    assert result.exit_code == 2 and "MODULE:FUNCTION" in result.output


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--model", "Tiny-BERT", "--micro-batches", "1,2"], "at least 3"),
        (["--model", "Tiny-BERT", "--holdout", "2", "--micro-batches", "1,2,4"], "held-out"),
        (["--model", "Tiny-BERT", "--module", "x:y"], "exactly one model"),
        (["--model", "Tiny-BERT", "--micro-batches", "1,x"], "integers"),
        (["--model", "Tiny-ResNet", "--layers", "2"], "transformer"),
        (["--model", "Tiny-BERT", "--seq-len", "65"], "64 positions"),
        (["--model", "Tiny-BERT", "--attention", "flash"], "attention"),
        (["--model", "Tiny-BERT", "--layers", "9"], "--layers 9 is more"),
        (["--model", "Tiny-BERT-1L", "--layers", "1"], "already cut"),
        (["--model", "Tiny-BERT", "--micro-batches", "2,4,99999999999999999999"], "is more than 1,048,576"),
        (["--model", "Tiny-BERT", "--holdout", "99999999999999999999"], "is more than 1,048,576"),
    ],
)
def test_bad_requests_are_one_line(runner, tiny, tmp_path, extra, says):
    result = runner.invoke(
        app, ["calibrate", "model", "--catalog", str(tiny), "--out", str(tmp_path / "p.json")] + QUICK + extra
    )
    assert result.exit_code == 2 and says in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "p.json").exists()


def test_cuda_without_a_gpu_is_one_line(runner, tiny, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = runner.invoke(
        app, ["calibrate", "model", "--model", "Tiny-BERT", "--catalog", str(tiny), "--device", "cuda"]
    )
    assert result.exit_code == 2 and "no CUDA GPU" in result.output


def test_hf_config_needs_transformers(runner, tmp_path):
    try:
        import transformers  # noqa: F401

        pytest.skip("transformers is installed")
    except ImportError:
        pass
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "bert", "architectures": ["BertForPreTraining"]}))
    result = runner.invoke(app, ["calibrate", "model", "--hf-config", str(config), "--device", "cpu"])
    assert result.exit_code == 2 and "needs the transformers package" in result.output


def test_a_hugging_face_config(runner, tmp_path):
    transformers = pytest.importorskip("transformers")
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
    result = runner.invoke(
        app,
        [
            "calibrate",
            "model",
            "--hf-config",
            str(folder / "config.json"),
            "--seq-len",
            "16",
            "--out",
            str(out),
        ]
        + QUICK
        + ["--micro-batches", "1,2,3", "--holdout", "4"],
    )
    assert result.exit_code == 0, result.output
    (mc,) = load_profile(str(out)).model_compute
    assert (mc.model, mc.seq_len) == ("tiny-bert", 16)
    assert mc.fingerprint.attention in ("sdpa", "eager") and mc.forward.kernels > 0


def test_a_missing_hugging_face_config_is_named(runner, tmp_path):
    pytest.importorskip("transformers")
    missing = tmp_path / "nope" / "config.json"
    result = runner.invoke(app, ["calibrate", "model", "--hf-config", str(missing), "--device", "cpu"])
    assert result.exit_code == 2
    assert "file not found" in result.output and "Repo id" not in result.output


@pytest.mark.parametrize(
    "content, key, message",
    [
        (b"\xff\xfe{", None, "not UTF-8"),
        (b'{"model_type": "bert"', None, "invalid JSON"),
        (b"[]", None, "JSON object with a 'model_type'"),
        (b'{"model_type": "nosuch"}', "model_type", "not a Hugging Face config"),
        (b'{"model_type": "bert", "hidden_size": NaN}', "hidden_size", "not a Hugging Face config"),
        (b'{"model_type": "bert", "hidden_size": -64}', "hidden_size", "positive whole number"),
        (
            b'{"model_type": "bert", "architectures": ["NoSuchArch"]}',
            "architectures",
            "no transformers class",
        ),
        (
            b'{"model_type": "bert", "num_hidden_layers": 1000000000, "hidden_size": 64,'
            b' "num_attention_heads": 4, "intermediate_size": 64}',
            "hidden_size",
            "more than the",
        ),
    ],
)
def test_a_bad_hugging_face_config_is_one_line(runner, tmp_path, content, key, message):
    """Read by the project's reader, never looked up on the Hub, and sized before anything is built:
    a billion layers is refused in one line, not allocated."""
    pytest.importorskip("transformers")
    path = tmp_path / "my-model.json"  # any name: the file given is the one read
    path.write_bytes(content)
    result = runner.invoke(app, ["calibrate", "model", "--hf-config", str(path), "--device", "cpu"])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and message in line and str(path) in line
    if key is not None:
        assert f": {key}: " in line
