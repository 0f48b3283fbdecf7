"""Real single-GPU training steps of common models, the truth the compute model is compared with.

The same method as the project's H200 development steps (``shared/gpu/h200-dev-steps.json``): one
process, one device, bf16 autocast (fp32 on a CPU), random inputs, ``--warmup`` untimed steps, then
the median of ``--steps`` steps, each phase timed with a device synchronise after it (forward incl.
the loss, backward, optimizer step + zero_grad), and ``step_nosync_s``: the same step without the
phase synchronises. ``--compile`` wraps each model in ``torch.compile`` (Inductor, default mode)
before timing, so the rows are the same code compiled (the warm-up steps pay the compilation; the
row's ``execution`` says which). The models are the frameworks' own, not clustersim's builders:

- ``bert-large`` / ``bert-base``: Hugging Face ``BertForPreTraining`` (sdpa attention), seq 128, MLM
  labels on every token and an NSP label; ``AdamW(fused=True)`` on a GPU;
- ``gpt2-xl`` / ``gpt3-1.3b``: Hugging Face ``GPT2LMHeadModel`` at GPT-2 XL's shape (seq 1024) or
  GPT-3 XL's (Brown et al. 2020: hidden 2048, 24 layers, 16 heads, seq 2048), next-token loss; AdamW;
- ``resnet50``: torchvision's ``resnet50`` (channels_last on a GPU), 224x224 images;
  ``SGD(momentum=0.9, foreach=True)``. Without torchvision, clustersim's own ResNet v1.5 builder
  (the same parameter tensors) is used and the case says so.

Each case's result is written to ``--out`` as soon as it is measured, so a run that stops early
keeps what it measured. A case that fails (out of memory, a missing package) is recorded with its
error and the rest go on.

    python benchmarks/gpu_real_steps.py --out steps.json --cases bert-large:8,16,32 resnet50:64,128
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

SEQ_LEN = {"bert-large": 128, "bert-base": 128, "gpt2-xl": 1024, "gpt3-1.3b": 2048, "resnet50": 224}
CATALOG_NAME = {
    "bert-large": "BERT-Large",
    "bert-base": "BERT-Base",
    "gpt2-xl": "GPT-2-1.5B",
    "gpt3-1.3b": "GPT-3-1.3B",
    "resnet50": "ResNet-50",
}
# hidden, layers, heads (GPT-2's code: ffn 4 x hidden, tied head, learned positions)
GPT_SHAPES = {"gpt2-xl": (1600, 48, 25), "gpt3-1.3b": (2048, 24, 16)}
# hidden, layers, heads, ffn
BERT_SHAPES = {"bert-large": (1024, 24, 16, 4096), "bert-base": (768, 12, 12, 3072)}


def _bert(torch, case: str, device: str):
    from transformers import BertConfig, BertForPreTraining

    hidden, layers, heads, ffn = BERT_SHAPES[case]
    config = BertConfig(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        attn_implementation="sdpa",
    )
    with torch.device(device):
        model = BertForPreTraining(config)

    def batch(b: int) -> dict:
        s = SEQ_LEN[case]
        return {
            "input_ids": torch.randint(0, config.vocab_size, (b, s), device=device),
            "token_type_ids": torch.zeros(b, s, dtype=torch.long, device=device),
            "labels": torch.randint(0, config.vocab_size, (b, s), device=device),
            "next_sentence_label": torch.randint(0, 2, (b,), device=device),
        }

    return model, batch, lambda m, x: m(**x).loss, "transformers BertForPreTraining (sdpa)"


def _gpt2(torch, case: str, device: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    hidden, layers, heads = GPT_SHAPES[case]
    config = GPT2Config(
        n_embd=hidden, n_layer=layers, n_head=heads, n_positions=SEQ_LEN[case], attn_implementation="sdpa"
    )
    with torch.device(device):
        model = GPT2LMHeadModel(config)

    def batch(b: int) -> dict:
        tokens = torch.randint(0, config.vocab_size, (b, SEQ_LEN[case]), device=device)
        return {"input_ids": tokens, "labels": tokens}

    shape = f"{CATALOG_NAME[case]} shape"
    return model, batch, lambda m, x: m(**x).loss, f"transformers GPT2LMHeadModel (sdpa), {shape}"


def _resnet50(torch, case: str, device: str):
    try:
        import torchvision

        model = torchvision.models.resnet50().to(device)
        source = f"torchvision {torchvision.__version__} resnet50"
        forward = lambda m, x: torch.nn.functional.cross_entropy(m(x["images"]), x["labels"])  # noqa: E731
    except Exception:  # noqa: BLE001 - any torchvision failure falls back to the equivalent builder
        from clustersim import catalog
        from clustersim.calibration import torch_models

        model = torch_models.build(torch, catalog.model("ResNet-50"), device)
        source = "clustersim ResNet v1.5 builder (torchvision unavailable)"
        forward = lambda m, x: m(**x)  # noqa: E731
    if device == "cuda":
        model = model.to(memory_format=torch.channels_last)

    def batch(b: int) -> dict:
        images = torch.randn(b, 3, 224, 224, device=device)
        if device == "cuda":
            images = images.to(memory_format=torch.channels_last)
        return {"images": images, "labels": torch.randint(0, 1000, (b,), device=device)}

    return model, batch, forward, source


BUILDERS = {
    "bert-large": _bert,
    "bert-base": _bert,
    "gpt2-xl": _gpt2,
    "gpt3-1.3b": _gpt2,
    "resnet50": _resnet50,
}


def _optimizer(torch, case: str, model, device: str):
    if case == "resnet50":
        sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
        return sgd, "sgd momentum 0.9 foreach"
    fused = device == "cuda"
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused), f"adamw fused={fused}"


def _trace(torch, step, device: str, path: Path) -> None:
    """Two more steps under torch.profiler (CPU and CUDA activities, shapes), as a user would trace
    their job: a gzipped Kineto JSON for ``calibrate import-trace``."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(2):
            step(False)
            prof.step()
    plain = path.with_suffix("")  # x.kineto.json.gz -> x.kineto.json
    prof.export_chrome_trace(str(plain))
    with plain.open("rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    plain.unlink()


def _measure(
    torch,
    case: str,
    micro_batch: int,
    device: str,
    warmup: int,
    steps: int,
    trace: Path | None,
    compiled: bool = False,
) -> dict:
    model, make_batch, forward, source = BUILDERS[case](torch, case, device)
    model.train()
    opt, opt_name = _optimizer(torch, case, model, device)
    if compiled:
        # the compiled module shares the parameters the optimizer holds; the first (warm-up) forward
        # and backward compile the graphs, which is why --warmup must be at least 1
        model = torch.compile(model)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = make_batch(micro_batch)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def step(timed: bool):
        marks = [time.perf_counter()]
        with torch.autocast(device_type=device, dtype=dtype, enabled=device == "cuda"):
            loss = forward(model, x)
        if timed:
            sync()
            marks.append(time.perf_counter())
        loss.backward()
        if timed:
            sync()
            marks.append(time.perf_counter())
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        marks.append(time.perf_counter())
        return marks

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(warmup):
        step(True)
    phases = {"forward_s": [], "backward_s": [], "optimizer_s": [], "step_s": []}
    for _ in range(steps):
        t0, t1, t2, t3 = step(True)
        for key, value in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
            phases[key].append(value)
    nosync = []
    for _ in range(steps):
        marks = step(False)
        nosync.append(marks[-1] - marks[0])
    if trace is not None:
        _trace(torch, step, device, trace)
    row = {
        "case": f"{case}-{SEQ_LEN[case]}" if case == "resnet50" else f"{case}-s{SEQ_LEN[case]}",
        "model": CATALOG_NAME[case],
        "seq_len": None if case == "resnet50" else SEQ_LEN[case],
        "micro_batch": micro_batch,
        "execution": "compiled" if compiled else "eager",
        "params": sum(p.numel() for p in model.parameters()),
        "model_source": source,
        "optimizer": opt_name,
        **{k: round(statistics.median(v), 6) for k, v in phases.items()},
        "step_nosync_s": round(statistics.median(nosync), 6),
        "step_spread_s": [round(min(phases["step_s"]), 6), round(max(phases["step_s"]), 6)],
    }
    if device == "cuda":
        row["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
    return row


def _device_line(torch, device: str) -> str:
    if device != "cuda":
        return f"CPU ({platform.processor() or platform.machine()}), {torch.get_num_threads()} torch threads"
    p = torch.cuda.get_device_properties(0)
    return f"{p.name} ({p.total_memory // 2**20} MiB, {p.multi_processor_count} SMs)"


def write_hf_configs(folder: Path, layers: int | None = None) -> None:
    """The Hugging Face configs of the transformer cases (FOLDER/CASE/config.json), for `clustersim
    calibrate model --hf-config`: the same code and shapes as the steps timed here. ``layers``
    shortens every model (a quick rehearsal)."""
    from transformers import BertConfig, GPT2Config

    for case, (hidden, n, heads, ffn) in BERT_SHAPES.items():
        config = BertConfig(
            hidden_size=hidden,
            num_hidden_layers=layers or n,
            num_attention_heads=heads,
            intermediate_size=ffn,
        )
        config.architectures = ["BertForPreTraining"]
        config.save_pretrained(folder / case)
    for case, (hidden, n, heads) in GPT_SHAPES.items():
        config = GPT2Config(n_embd=hidden, n_layer=layers or n, n_head=heads, n_positions=SEQ_LEN[case])
        config.architectures = ["GPT2LMHeadModel"]
        config.save_pretrained(folder / case)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument(
        "--write-hf-configs", type=Path, metavar="DIR", help="write the cases' HF configs and stop"
    )
    ap.add_argument("--layers", type=int, help="--write-hf-configs: fewer layers (a rehearsal)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    cases = ", ".join(BUILDERS)
    ap.add_argument("--cases", nargs="+", help=f"CASE:MB,MB,... (cases: {cases})")
    ap.add_argument("--trace", nargs="*", default=[], help="CASE:MB also traced (2 steps), beside --out")
    ap.add_argument(
        "--compile",
        action="store_true",
        help="time each model under torch.compile (Inductor, default mode); the rows say execution: compiled",
    )
    args = ap.parse_args()
    if args.write_hf_configs is not None:
        write_hf_configs(args.write_hf_configs, args.layers)
        return
    if args.out is None or not args.cases:
        ap.error("--out and --cases are required (or --write-hf-configs DIR)")
    if args.compile and args.warmup < 1:
        ap.error("--compile needs --warmup 1 or more: the first step compiles and is not timed")
    import torch

    result = {
        "device": _device_line(torch, args.device),
        "software": f"PyTorch {torch.__version__}"
        + (f" (CUDA {torch.version.cuda})" if args.device == "cuda" else ""),
        "method": __doc__.split("\n\n")[1].replace("\n", " "),
        "date": time.strftime("%Y-%m-%d"),
        "steps": [],
        "failed": [],
    }
    plan = []
    for spec in args.cases:
        case, _, sizes = spec.partition(":")
        try:
            micro_batches = [int(s) for s in sizes.split(",")]
        except ValueError:
            ap.error(f"--cases {spec!r}: CASE:MB,MB,... with whole micro-batches")
        if case not in BUILDERS or any(mb < 1 for mb in micro_batches):
            ap.error(f"--cases {spec!r}: cases are {cases}, micro-batches at least 1")
        plan.append((case, micro_batches))
    for case, micro_batches in plan:
        for mb in micro_batches:
            started = time.perf_counter()
            if args.device == "cuda":
                torch.cuda.empty_cache()  # the previous case's model is gone
            trace = None
            if f"{case}:{mb}" in args.trace:
                mode = "-compiled" if args.compile else ""
                trace = args.out.parent / f"{case}-mb{mb}{mode}.kineto.json.gz"
            try:
                row = _measure(torch, case, mb, args.device, args.warmup, args.steps, trace, args.compile)
                result["steps"].append(row)
                took = time.perf_counter() - started
                print(
                    f"{row['case']} mb {mb} ({row['execution']}): step {row['step_s'] * 1e3:.2f} ms "
                    f"(nosync {row['step_nosync_s'] * 1e3:.2f}) [{took:.0f} s]",
                    flush=True,
                )
            except Exception as exc:  # noqa: BLE001 - record and go on to the next case
                error = f"{type(exc).__name__}: {exc}"[:300]
                result["failed"].append({"case": case, "micro_batch": mb, "error": error})
                print(f"{case} mb {mb}: FAILED {error}", flush=True)
            args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
