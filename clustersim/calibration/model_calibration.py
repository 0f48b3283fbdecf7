"""Which model ``calibrate model`` times, and the run from measurement to the stored profile entry.

A model comes from one of: a catalog name (shipped or a ``--catalog`` file's, optionally with fewer
``--layers`` for a quick run, stored under its own name), a scenario's ``workload.model``, a Hugging
Face ``config.json`` (through ``transformers``, when installed), or ``module:function``, the user's
own code, called as ``function(micro_batch=..., seq_len=..., device=...)`` and returning
``(nn.Module, batch)``; the module's output, called with the batch (a dict as keyword arguments, a
tuple as positional ones, else one argument), is the loss or has a ``loss``.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from clustersim.calibration.model_timing import Runner
from clustersim.errors import InputError
from clustersim.io import read_structured_file


@dataclass
class ModelChoice:
    catalog: str | None = None
    scenario: str | None = None
    hf_config: Path | None = None
    module: str | None = None
    layers: int | None = None
    name: str | None = None
    #: a catalog model's code: hf (its Hugging Face class, the default where transformers is installed),
    #: torchvision (ResNets, where torchvision is), plain (clustersim's plain-torch build); None: default
    implementation: str | None = None

    def check(self) -> None:
        given = [x for x in (self.catalog, self.scenario, self.hf_config, self.module) if x is not None]
        if len(given) != 1:
            raise InputError(
                "name exactly one model: --model NAME, --scenario FILE, --hf-config PATH "
                "or --module MOD:FUNC",
                key="--model",
            )
        if self.layers is not None and self.catalog is None and self.scenario is None:
            raise InputError("--layers applies to a catalog model (--model or --scenario)", key="--layers")
        if self.implementation is not None:
            if self.catalog is None and self.scenario is None:
                raise InputError(
                    "--implementation picks a catalog model's code (--model or --scenario); --hf-config "
                    "is Hugging Face's and --module your own",
                    key="--implementation",
                )
            if self.implementation not in CATALOG_CODES:
                raise InputError(
                    f"unknown implementation {self.implementation!r} ({', '.join(CATALOG_CODES)})",
                    key="--implementation",
                )


# The codes calibrate model builds a catalog model in (catalogs/execution.yaml implementations).
CATALOG_CODES = ("hf", "torchvision", "plain")


# The largest micro-batch calibrate model times: 2^20 samples, far above any one GPU's memory and below
# what the index types of torch's input builders overflow on.
MAX_MICRO_BATCH = 2**20


@dataclass
class Resolved:
    runner: Runner
    name: str
    seq_len: int
    precision: str | None  # the scenario's, when it names one
    param_tensors: Callable[[], int]
    #: the code timed (Fingerprint.implementation): plain, hf, torchvision, or the user's module's name
    implementation: str | None = None
    #: why the code is not the catalog model's default (its package is not installed), for the report
    note: str | None = None
    #: a CNN: seq_len is its image side
    image: bool = False


def resolve(torch, choice: ModelChoice, seq_len: int | None, device: str, attention: str) -> Resolved:
    choice.check()
    if choice.module is not None:
        resolved = _user_module(torch, choice, seq_len, device)
        resolved.implementation = resolved.name
        return resolved
    if choice.hf_config is not None:
        resolved = _hugging_face(torch, choice, seq_len, device)
        resolved.implementation = "hf"
        return resolved
    precision = None
    name = choice.catalog
    if choice.scenario is not None:
        from clustersim.scenario import load_scenario

        workload = load_scenario(choice.scenario).workload
        if workload.model is None:
            raise InputError(
                "the scenario's workload has custom layers, not a model to build", key="workload.model"
            )
        name, precision = workload.model, workload.precision
        seq_len = seq_len or workload.seq_len
    return _catalog(torch, name, choice, seq_len, device, attention, precision)


def _catalog(torch, name, choice, seq_len, device, attention, precision) -> Resolved:
    from clustersim import catalog
    from clustersim.calibration.torch_models import batch, build, loss_of

    try:
        arch = catalog.model(name)
    except InputError as exc:
        raise InputError(exc.message, key="--model" if choice.catalog else "workload.model") from None
    name = catalog.model_name(name)
    if choice.layers is not None:
        if arch.family != "transformer":
            raise InputError("--layers applies to transformer models", key="--layers")
        if name not in catalog.models():  # already NAME-<N>L: one cut, named once
            raise InputError(f"--layers cuts a whole model, and {name} is already cut", key="--layers")
        if choice.layers > arch.layers:
            raise InputError(
                f"{name} has {arch.layers} layers: --layers {choice.layers} is more", key="--layers"
            )
        arch = arch.model_copy(update={"layers": choice.layers})
        name = f"{name}-{choice.layers}L"
    if arch.family == "resnet":
        from clustersim.calibration.trace_import import cnn_image_side

        seq_len = cnn_image_side(name, seq_len)
    elif seq_len is None:
        seq_len = arch.default_seq_len
    if arch.family == "transformer" and arch.max_positions and seq_len > arch.max_positions:
        raise InputError(
            f"--seq-len {seq_len} is longer than the model's {arch.max_positions} positions", key="--seq-len"
        )
    code, note = _catalog_code(arch, choice.implementation)
    if code == "hf":
        config, cls = _hf_config_of(arch, attention)
        runner, param_tensors = _hf_runner(torch, config, cls, seq_len, device, "--model")
        return Resolved(runner, choice.name or name, seq_len, precision, param_tensors, "hf", note)
    cache: dict = {}

    def make(micro_batch: int):
        if "model" not in cache:
            cache["model"] = (
                _torchvision(torch, arch, device)
                if code == "torchvision"
                else build(torch, arch, device, attention)
            )
        return cache["model"], batch(torch, arch, micro_batch, seq_len, device)

    runner = Runner(make=make, loss=loss_of, attention=attention if arch.family == "transformer" else None)
    return Resolved(
        runner,
        choice.name or name,
        seq_len,
        precision,
        lambda: len(list(cache["model"].parameters())),
        code,
        note,
        image=arch.family == "resnet",
    )


def _catalog_code(arch, asked: str | None) -> tuple[str, str | None]:
    """The code to build a catalog model in: ``asked`` (--implementation), else the code the model runs
    by default (catalog.default_implementation: Hugging Face's transformers, torchvision's ResNets) where
    its package is installed, else clustersim's plain-torch build, with a note saying so."""
    from clustersim import catalog

    default = catalog.default_implementation(arch)
    code = asked or default
    package = {"hf": "transformers", "torchvision": "torchvision"}.get(code)
    if code == "torchvision" and arch.family != "resnet":
        raise InputError("torchvision builds ResNets; a transformer is hf or plain", key="--implementation")
    if code == "hf" and arch.family != "transformer":
        raise InputError("hf builds transformers; a ResNet is torchvision or plain", key="--implementation")
    if package is not None:
        try:
            importlib.import_module(package)
        except ImportError:
            if asked is not None:
                raise InputError(
                    f"--implementation {code} needs the {package} package", key="--implementation"
                ) from None
            return "plain", (
                f"{package} is not installed: timing clustersim's plain-torch build, which prices only "
                f"scenarios with workload.implementation: plain (pip install {package} to time {default})"
            )
    return code, None


def _hf_config_of(arch, attention: str):
    """The Hugging Face config and class of a catalog transformer: BertForPreTraining, GPT2LMHeadModel
    or LlamaForCausalLM at the catalog's shapes, with ``attention`` as its attention implementation."""
    import transformers

    if arch.style == "bert":
        config = transformers.BertConfig(
            vocab_size=arch.vocab,
            hidden_size=arch.hidden,
            num_hidden_layers=arch.layers,
            num_attention_heads=arch.heads,
            intermediate_size=arch.ffn,
            max_position_embeddings=arch.max_positions or 512,
            type_vocab_size=arch.token_types or 2,
        )
        cls = transformers.BertForPreTraining
    elif arch.style == "gpt":
        config = transformers.GPT2Config(
            vocab_size=arch.vocab,
            n_embd=arch.hidden,
            n_layer=arch.layers,
            n_head=arch.heads,
            n_inner=arch.ffn,
            n_positions=arch.max_positions or 1024,
            tie_word_embeddings=arch.tied_head is not False,
        )
        cls = transformers.GPT2LMHeadModel
    else:
        config = transformers.LlamaConfig(
            vocab_size=arch.vocab,
            hidden_size=arch.hidden,
            num_hidden_layers=arch.layers,
            num_attention_heads=arch.heads,
            num_key_value_heads=arch.kv_heads or arch.heads,
            intermediate_size=arch.ffn,
            max_position_embeddings=max(arch.max_positions or 0, 4096),
            tie_word_embeddings=bool(arch.tied_head),
        )
        cls = transformers.LlamaForCausalLM
    config._attn_implementation = attention
    return config, cls


def _torchvision(torch, arch, device: str):
    """torchvision's ResNet of the catalog's blocks (Bottleneck, v1.5), channels-last on a GPU."""
    from torchvision.models.resnet import Bottleneck, ResNet

    if arch.width != 64:
        raise InputError(
            f"torchvision's ResNet is 64 channels wide, the model {arch.width}: use --implementation plain",
            key="--implementation",
        )
    model = ResNet(Bottleneck, list(arch.blocks), num_classes=arch.num_classes).to(device)
    return model.to(memory_format=torch.channels_last) if device == "cuda" else model


def _culprit(choice: ModelChoice, exc: Exception) -> str:
    """The option to blame for a model that failed while timed: the user's own code (--module) whose
    step raised, else the micro-batch sizes (a catalog or Hugging Face model fails on memory or size)."""
    out_of_memory = "out of memory" in str(exc).lower()
    return "--module" if choice.module is not None and not out_of_memory else "--micro-batches"


def _call(model, batch):
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _loss(output):
    if hasattr(output, "loss") and output.loss is not None:
        return output.loss
    if isinstance(output, dict) and output.get("loss") is not None:
        return output["loss"]
    if hasattr(output, "backward") and getattr(output, "ndim", 1) == 0:
        return output
    raise InputError("the model's output is neither a scalar loss nor has a 'loss'", key="--module")


def _user_module(torch, choice: ModelChoice, seq_len: int | None, device: str) -> Resolved:
    spec = choice.module
    mod_name, _, fn_name = spec.partition(":")
    if not mod_name or not fn_name:
        raise InputError(f"--module {spec!r} is not MODULE:FUNCTION", key="--module")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except ImportError as exc:
        raise InputError(f"cannot import {mod_name!r} ({exc})", key="--module") from None
    except AttributeError:
        raise InputError(f"module {mod_name!r} has no {fn_name!r}", key="--module") from None
    seq = seq_len or 1
    cache: dict = {}

    def make(micro_batch: int):
        result = fn(micro_batch=micro_batch, seq_len=seq, device=device)
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
            raise InputError(f"{spec} must return (nn.Module, batch)", key="--module")
        model = result[0].to(device)
        cache["model"] = model
        return model, result[1]

    runner = Runner(make=make, loss=lambda m, b: _loss(_call(m, b)), attention=None)
    return Resolved(runner, choice.name or spec, seq, None, lambda: len(list(cache["model"].parameters())))


# Shape keys of a Hugging Face config that the parameter estimate reads (BERT and GPT-2 names).
_HF_SHAPE_KEYS = (
    ("num_hidden_layers", "n_layer"),
    ("hidden_size", "n_embd"),
    ("intermediate_size", "n_inner"),
    ("vocab_size",),
    ("num_attention_heads", "n_head"),
)
# Bytes per parameter a training step holds: fp32 weight, gradient and Adam's two moments.
_TRAINING_BYTES_PER_PARAM = 16


def _hf_config(transformers, path: Path):
    """(config, the file's own keys, the file): the config a config.json (or a folder holding one)
    describes, read by the project's reader (one line naming the file for anything unreadable: missing,
    not UTF-8, not JSON, nested too deep) and built with transformers.AutoConfig.for_model, never looked
    up on the Hub."""
    file = path / "config.json" if path.is_dir() else path
    raw = read_structured_file(file, "json")
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise InputError("a Hugging Face config.json is a JSON object with a 'model_type'", source=str(file))
    fields = dict(raw)
    try:
        config = transformers.AutoConfig.for_model(fields.pop("model_type"), **fields)
    except Exception as exc:  # transformers' own checks raise several kinds (and its hub's dataclasses)
        message = str(exc).splitlines()[0][:160]
        field = re.search(r"field '(\w+)'", message)  # huggingface_hub names the field it refused
        raise InputError(
            f"not a Hugging Face config ({message})",
            source=str(file),
            key=field.group(1) if field else "model_type",
        ) from None
    return config, raw, file


# The shape a transformer's config must state (the keys `clustersim models import` requires, in their
# Hugging Face spellings): transformers' config classes default each one (BertConfig: hidden_size 768,
# 12 layers, 12 heads), so a config.json that leaves one out would time a model nobody described.
_REQUIRED_SHAPE = (
    ("hidden_size", "n_embd", "d_model"),
    ("num_hidden_layers", "n_layer", "num_layers"),
    ("num_attention_heads", "n_head"),
    ("vocab_size",),
)


def _check_shape_given(raw: dict, config, file: Path) -> None:
    """Refuse a config.json that leaves out a shape key its config class has (and would default)."""
    for names in _REQUIRED_SHAPE:
        default = next((v for v in (getattr(config, n, None) for n in names) if v is not None), None)
        if default is not None and all(raw.get(n) is None for n in names):
            raise InputError(
                f"no {' or '.join(names)} in the config (transformers would build its default, {default!r})",
                source=str(file),
                key=names[0],
            )


def _check_hf_size(torch, config, device: str, path: Path) -> None:
    """Refuse, before any memory is taken, a config whose shape is not positive whole numbers or whose
    model cannot train on ``device``: parameters (embedding + 12 h^2 per layer, or 4h^2 + 2hf with the
    MLP width given) x 16 bytes against the device's memory."""
    shape = {}
    for names in _HF_SHAPE_KEYS:
        for name in names:
            value = getattr(config, name, None)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InputError(
                    f"must be a positive whole number, not {value!r}", source=str(path), key=name
                )
            shape[names[0]] = value
    h, layers = shape.get("hidden_size"), shape.get("num_hidden_layers")
    if h is None or layers is None:
        return  # another kind of model: its own code sizes it
    f = shape.get("intermediate_size", 4 * h)
    params = layers * (4 * h * h + 2 * h * f) + shape.get("vocab_size", 0) * h
    if device == "cuda" and torch.cuda.is_available():
        memory = torch.cuda.get_device_properties(0).total_memory
    else:
        import os

        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    need = params * _TRAINING_BYTES_PER_PARAM
    if need > memory:
        raise InputError(
            f"about {params:.3g} parameters need {need / 2**30:,.0f} GiB to train (weights, gradients and "
            f"Adam's state), more than the {memory / 2**30:,.0f} GiB of this {device}",
            source=str(path),
            key="hidden_size",
        )


def _hugging_face(torch, choice: ModelChoice, seq_len: int | None, device: str) -> Resolved:
    """A Hugging Face model from its config.json (random weights: timing needs no checkpoint)."""
    try:
        import transformers
    except ImportError:
        raise InputError(
            "--hf-config needs the transformers package: pip install 'clustersim[hf]' (or transformers)",
            key="--hf-config",
        ) from None
    path = Path(choice.hf_config)
    config, raw, file = _hf_config(transformers, path)
    architecture = (getattr(config, "architectures", None) or [None])[0]
    if architecture is None:  # no class named: a causal language model of the config's type
        build = transformers.AutoModelForCausalLM.from_config
    elif isinstance(getattr(transformers, str(architecture), None), type):
        build = getattr(transformers, architecture)._from_config
    else:
        raise InputError(f"no transformers class {architecture!r}", source=str(path), key="architectures")
    _check_hf_size(torch, config, device, path)
    _check_shape_given(raw, config, file)
    seq = seq_len or min(getattr(config, "max_position_embeddings", 512) or 512, 512)
    runner, param_tensors = _hf_runner(torch, config, build, seq, device, str(path), architecture)
    name = choice.name or (path.parent.name if path.is_file() else path.name)
    return Resolved(runner, name, seq, None, param_tensors)


def _hf_runner(torch, config, cls, seq: int, device: str, source: str, architecture: str | None = None):
    """What to time for a Hugging Face model of ``config`` (random weights: timing needs no checkpoint):
    ``cls`` its class (or a factory taking the config), fed random token ids as inputs and labels (and a
    next-sentence label for a pre-training BERT)."""
    build = getattr(cls, "_from_config", cls)
    architecture = architecture or getattr(cls, "__name__", None)
    vocab = config.vocab_size
    cache: dict = {}

    def make(micro_batch: int):
        if "model" not in cache:
            try:
                cache["model"] = build(config).to(device)
            except ValueError as exc:  # e.g. a config type AutoModelForCausalLM has no model for
                raise InputError(
                    f"cannot build a model from it ({str(exc).splitlines()[0][:160]})", source=source
                ) from None
            # the attention kernel is chosen when the model is made ("sdpa", "eager", ...)
            runner.attention = getattr(cache["model"].config, "_attn_implementation", None)
        ids = torch.randint(0, vocab, (micro_batch, seq), device=device)
        batch = {"input_ids": ids, "labels": ids}
        if "ForPreTraining" in (architecture or "") and hasattr(config, "type_vocab_size"):
            batch["next_sentence_label"] = torch.zeros(micro_batch, dtype=torch.long, device=device)
        return cache["model"], batch

    runner = Runner(
        make=make,
        loss=lambda m, b: _loss(_call(m, b)),
        attention=getattr(config, "_attn_implementation", None),
    )
    return runner, lambda: len(list(cache["model"].parameters()))


def calibrate_model(
    choice: ModelChoice,
    device: str,
    micro_batches: list[int],
    holdout: int | None,
    seq_len: int | None,
    precision: str | None,
    attention: str,
    optimizer: str,
    steps: int,
    warmup: int,
    out: Path,
    base: Path | None = None,
    threads: int | None = None,
    progress=None,
    command: str = "clustersim calibrate model",
):
    """Measure, fit, store; returns (profile, report)."""
    from clustersim.calibration import model_timing
    from clustersim.calibration.compute_store import check_target, store
    from clustersim.calibration.profile import Fingerprint, thread_mismatch
    from clustersim.calibration.provenance import provenance
    from clustersim.calibration.torch_support import catalog_name_for, require_torch, resolve_device

    torch = require_torch()
    device = resolve_device(torch, device)
    check_target(out, catalog_name_for(torch, device), base)  # before minutes of measuring
    for size, key in [(b, "--micro-batches") for b in micro_batches] + [(holdout, "--holdout")]:
        if size is not None and size > MAX_MICRO_BATCH:
            raise InputError(f"micro-batch {size:,} is more than {MAX_MICRO_BATCH:,} samples", key=key)
    if len(set(micro_batches)) < 3:
        raise InputError("give at least 3 different micro-batch sizes to fit", key="--micro-batches")
    if holdout is not None and holdout in micro_batches:
        raise InputError("the held-out micro-batch must not be one of the fitted sizes", key="--holdout")
    if threads is not None:
        torch.set_num_threads(threads)
    resolved = resolve(torch, choice, seq_len, device, attention)
    precision = precision or resolved.precision or ("bf16" if device == "cuda" else "fp32")
    if precision not in ("fp32", "bf16", "fp16"):
        raise InputError(f"precision {precision!r}: fp32, bf16 or fp16", key="--precision")
    say = progress or (lambda message: None)
    if resolved.note:
        say(resolved.note)
    say(f"per-op dispatch and profiler cost on {device}")
    costs = model_timing.op_costs(torch, device)
    sizes = sorted(set(micro_batches)) + ([holdout] if holdout is not None else [])
    say(f"{resolved.name}: micro-batches {', '.join(map(str, sizes))} on {device}, {steps} steps each")
    try:
        measured = model_timing.measure(
            torch,
            resolved.runner,
            sizes,
            device,
            precision,
            optimizer,
            steps,
            warmup,
            costs,
            progress=lambda message: say(f"{resolved.name}: {message}"),
        )
    except (RuntimeError, ValueError) as exc:  # out of memory, a shape the model refuses
        raise InputError(
            f"the model failed on {device}: {str(exc).splitlines()[0][:200]}", key=_culprit(choice, exc)
        ) from None
    for m in measured:
        p = m.phases
        say(
            f"{resolved.name}: micro-batch {m.micro_batch}: step {m.step_wall_s() * 1e3:.2f} ms (forward "
            f"{p['forward'].wall_s * 1e3:.2f}, backward {p['backward'].wall_s * 1e3:.2f}, optimizer "
            f"{p['optimizer'].wall_s * 1e3:.2f})"
        )
    held = measured.pop() if holdout is not None else None
    machine = provenance(torch, device, command)
    fp = Fingerprint(
        device=torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        torch=torch.__version__,
        cuda=torch.version.cuda if device == "cuda" else None,
        precision=precision,
        autocast=precision != "fp32",
        attention=resolved.runner.attention,
        execution="eager",
        implementation=resolved.implementation,
        optimizer=optimizer,
        threads=machine["threads"],
        cpu=machine["cpu"],
        host=machine["host"],
    )
    overhead = model_timing.profiler_overhead_s(measured)
    source = (
        f"{command}: {len(measured)} micro-batches, {steps} steps each (median); a trivial op: "
        f"{costs.dispatch_s * 1e6:.2f} us, the profiler's cost {costs.profiler_s * 1e6:.2f} us per op"
    )
    mc, rates = model_timing.fit(
        measured, held, device, resolved.name, resolved.seq_len, fp, resolved.param_tensors(), source
    )
    from clustersim.calibration.provenance import MACHINE_FIELDS

    prov = {k: v for k, v in machine.items() if k in MACHINE_FIELDS}
    prov.setdefault("date", datetime.now(timezone.utc).isoformat(timespec="seconds"))
    profile = store(out, catalog_name_for(torch, device), prov, mc, rates, base)
    mismatch = thread_mismatch(profile, mc)
    report = {
        "model": resolved.name,
        "implementation": resolved.implementation,
        "note": resolved.note,
        "warnings": [mismatch] if mismatch else [],
        "threads": fp.threads,
        "image": resolved.image,
        "seq_len": resolved.seq_len,
        "device": fp.device,
        "precision": precision,
        "profiler_overhead_s_per_op": costs.profiler_s,
        "trivial_op_s": costs.dispatch_s,
        "profiler_overhead_in_steps_s_per_op": overhead,
        "measured": [
            {
                "micro_batch": m.micro_batch,
                "held_out": m is held,
                "step_s": m.step_wall_s(),
                "phases": {
                    name: {
                        "wall_s": p.wall_s,
                        "host_s": p.host_s,
                        "device_s": p.device_s,
                        "kernels": p.kernels,
                        "ops": p.ops,
                        "profiled_wall_s": p.profiled_wall_s,
                    }
                    for name, p in m.phases.items()
                },
            }
            for m in measured + ([held] if held is not None else [])
        ],
        "model_compute": mc.model_dump(),
        "dispatch": rates.model_dump(exclude={"fingerprint"}),
    }
    return profile, report
