"""`clustersim calibrate import-trace`: a model's measured compute from a user's own torch.profiler trace.

A Kineto JSON trace (``torch.profiler`` with CPU and CUDA activities, what ``export_chrome_trace``
or ``tensorboard_trace_handler`` writes) of a real training job holds every op the host dispatched
and every kernel the device ran. Per training step it is split into phases:

- steps: ``ProfilerStep#N`` annotations when the job called ``prof.step()``; else the optimizer's
  own annotations (``Optimizer.step#...``, ``Optimizer.zero_grad#...``), one step per
  ``Optimizer.step`` with the ``zero_grad`` that follows it;
- forward: from the step's start on the main thread (the one that runs the optimizer) until the
  autograd engine's thread starts the backward; backward: from then until the optimizer starts;
  optimizer: its annotations (else what the main thread runs after the backward);
- kernels, memsets and copies belong to the phase whose host thread launched them (the launch
  is found through its correlation id); device busy = the union of their intervals.

Host time is the phase's wall time on the host minus time blocked in synchronising calls (waiting
for the device) minus the profiler's own cost, which is per recorded op: ``PROFILER_OVERHEAD_S`` by
default (measured on an H200, see below), or derived from ``--step-time``, the same step measured
without the profiler. The first step of a trace pays the profiler's warm-up, so with two or more
steps the later ones are used (the median per quantity).
"""

from __future__ import annotations

import gzip
import json
import math
import re
import statistics
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from clustersim.calibration.profile import DispatchRates, Fingerprint, Linear, ModelCompute, PhaseMeasurement
from clustersim.errors import InputError
from clustersim.io import _DuplicateKey, _unique_keys

# The profiler's cost per recorded cpu_op event, from one NVIDIA H200 (PyTorch 2.11 eager, bf16
# autocast, BERT-Large seq 128 micro-batch 16; ../shared/gpu/h200-dev-steps.json and its trace):
# profiled forward 32.6 ms with 4,151 cpu_op events against 19.74 ms unprofiled, backward 64.1 ms
# with 10,193 events against 31.32 ms; pooled: (12.86 + 32.78) ms / 14,344 events.
PROFILER_OVERHEAD_S = (0.0326 - 0.01974 + 0.0641 - 0.03132) / (4151 + 10193)

PHASES = ("forward", "backward", "optimizer")
DEVICE_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
# Host calls that block until the device catches up: their time is the device's, not dispatch.
SYNC_CALLS = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaStreamWaitEvent",
    "cudaMemcpy",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
)


@dataclass
class Phase:
    """One phase of one step as the trace shows it (times in seconds, profiled)."""

    wall_s: float
    sync_s: float
    events: int
    kernels: int
    device_busy_s: float
    kernel_durations_s: list[float] = field(default_factory=list, repr=False)

    def host_s(self, overhead_s: float) -> float:
        return max(0.0, self.wall_s - self.sync_s - overhead_s * self.events)


@dataclass
class Step:
    phases: dict[str, Phase]
    param_tensors: int


@dataclass
class TraceAnalysis:
    source: str
    steps: list[Step]
    device_name: str
    device_memory_gb: float | None
    cuda: str | None
    precision: str
    attention: str | None
    execution: str
    convolutions: bool = False  # the trace runs convolutions (a CNN's step)
    optimizer: str | None = None  # the optimizer's class as its annotations name it, lower case
    params: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def used(self) -> list[Step]:
        """The steps measured from: all but the first (the profiler's warm-up) when there are two or more."""
        return self.steps[1:] if len(self.steps) > 1 else self.steps

    def median(self, phase: str, what: str) -> float:
        return statistics.median(getattr(s.phases[phase], what) for s in self.used)

    def host_s(self, phase: str, overhead_s: float) -> float:
        return statistics.median(s.phases[phase].host_s(overhead_s) for s in self.used)

    def profiled_step_s(self) -> float:
        return statistics.median(sum(p.wall_s for p in s.phases.values()) for s in self.used)

    def events(self) -> float:
        return statistics.median(sum(p.events for p in s.phases.values()) for s in self.used)


# The largest trace read, uncompressed: a torch.profiler trace of a few steps of a large model is tens to
# hundreds of MB; 1 GiB keeps a mistaken file (or a gzip that expands without end) from filling memory.
MAX_TRACE_BYTES = 2**30


def read_json(path: Path, what: str) -> dict:
    """A JSON object from ``path``, gzipped or not; any damage is one InputError naming the file."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} not found", source=str(path))
    if not path.is_file():
        raise InputError(f"{what} is not a regular file", source=str(path))
    try:
        with open(path, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
        opener = gzip.open if gz else open
        with opener(path, "rb") as fh:
            raw = fh.read(MAX_TRACE_BYTES + 1)
        if len(raw) > MAX_TRACE_BYTES:
            raise InputError(
                f"{what} is over {MAX_TRACE_BYTES // 2**30} GiB (uncompressed): profile fewer steps",
                source=str(path),
            )
        data = json.loads(raw, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise InputError(f"{what} gives the key {str(exc)!r} twice in one object", source=str(path)) from None
    except (EOFError, gzip.BadGzipFile, OSError) as exc:
        raise InputError(
            f"cannot read {what} (truncated or corrupt gzip: {exc.__class__.__name__})", source=str(path)
        ) from None
    except json.JSONDecodeError as exc:  # where, as every other JSON input's error says
        raise InputError(f"{what} is not JSON: line {exc.lineno}: {exc.msg}", source=str(path)) from None
    except (UnicodeDecodeError, RecursionError) as exc:
        raise InputError(f"{what} is not JSON ({exc.__class__.__name__})", source=str(path)) from None
    if not isinstance(data, dict):
        raise InputError(f"{what} is not a JSON object", source=str(path))
    return data


def analyse(trace: dict, source: str) -> TraceAnalysis:
    """Split a Kineto trace into steps and phases (see the module docstring)."""
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        raise InputError(
            "no traceEvents list: not a torch.profiler (Kineto) trace", source=source, key="traceEvents"
        )
    spans = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and _is_span(e)]
    device_events = [e for e in spans if e.get("cat") in DEVICE_CATEGORIES]
    if not any(e["cat"] == "kernel" for e in device_events):
        raise InputError(
            "no GPU kernels in the trace: profile with "
            "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]",
            source=source,
            key="traceEvents",
        )
    ops = [e for e in spans if e.get("cat") == "cpu_op"]
    annotations = sorted((e for e in spans if e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    optimizer = [e for e in annotations if str(e.get("name", "")).startswith("Optimizer.")]
    profiler_steps = [e for e in annotations if str(e.get("name", "")).startswith("ProfilerStep#")]
    anchor = (profiler_steps or optimizer or [None])[0]
    if anchor is None:
        raise InputError(
            "no training step found: neither ProfilerStep# (call prof.step() each step) nor "
            "Optimizer.step# annotations",
            source=source,
        )
    main = (anchor["pid"], anchor["tid"])
    autograd = _autograd_threads(events, ops, main)
    windows = (
        [(e["ts"], e["ts"] + e["dur"]) for e in profiler_steps]
        if profiler_steps
        else _optimizer_windows(optimizer, ops, main)
    )
    launches = {
        e["args"]["correlation"]: e
        for e in spans
        if e.get("cat") in LAUNCH_CATEGORIES
        and isinstance(e.get("args"), dict)
        and "correlation" in e["args"]
    }
    steps = []
    for start, end in windows:
        step = _step(start, end, ops, optimizer, launches, device_events, spans, main, autograd)
        if step is not None:
            steps.append(step)
    if not steps:
        raise InputError(
            "no complete training step (forward, a backward on the autograd thread, optimizer)",
            source=source,
        )
    props = (
        (trace.get("deviceProperties") or [{}])[0] if isinstance(trace.get("deviceProperties"), list) else {}
    )
    names = [str(e.get("name", "")) for e in spans]
    return TraceAnalysis(
        source=source,
        steps=steps,
        device_name=str(props.get("name") or "unknown GPU"),
        device_memory_gb=_memory_gb(props.get("totalGlobalMem")),
        cuda=_cuda_version(trace.get("cuda_runtime_version")),
        precision=_precision(names),
        attention=_attention(names),
        execution=_execution(names),
        convolutions=any("convolution" in n for n in names),
        optimizer=_optimizer_name(optimizer),
    )


def _optimizer_name(annotations: list) -> str | None:
    """The optimizer's class from its annotations (``Optimizer.step#AdamW.step``), lower case."""
    for e in annotations:
        match = re.match(r"Optimizer\.step#(\w+)\.step", str(e.get("name", "")))
        if match:
            return match.group(1).lower()
    return None


# An event's duration in a trace of a few training steps (microseconds): a day is far beyond any op,
# and a start time past 1e17 us (3,000 years) is not a clock's.
MAX_EVENT_US, MAX_TS_US = 86_400e6, 1e17


def _memory_gb(total) -> float | None:
    """The device's memory in GiB from deviceProperties' totalGlobalMem (bytes), or None where that is
    not a positive number of bytes (then the catalog names the device from its name alone)."""
    ok = isinstance(total, (int, float)) and not isinstance(total, bool) and 0 < total < 2**60
    return total / 2**30 if ok else None


def _is_span(e: dict) -> bool:
    """A complete event with a start and a duration; one whose numbers cannot be times is refused."""
    ts, dur = e.get("ts"), e.get("dur")
    if not (isinstance(ts, (int, float)) and isinstance(dur, (int, float))):
        return False
    if (
        isinstance(ts, bool)
        or isinstance(dur, bool)
        or not (0 <= dur <= MAX_EVENT_US and 0 <= ts <= MAX_TS_US)
    ):
        raise InputError(
            f"event {str(e.get('name'))[:60]!r} has ts {ts!r} and dur {dur!r}: not times in microseconds",
            key="traceEvents",
        )
    return True


def _autograd_threads(events: list, ops: list, main: tuple) -> set:
    """Threads named by the profiler as the autograd engine's (pt_autograd_N); else every other thread
    that ran ops."""
    named = {
        (e.get("pid"), e.get("tid"))
        for e in events
        if isinstance(e, dict)
        and e.get("ph") == "M"
        and e.get("name") == "thread_name"
        and "autograd" in str((e.get("args") or {}).get("name", ""))
    }
    return named or {(e["pid"], e["tid"]) for e in ops} - {main}


def _optimizer_windows(optimizer: list, ops: list, main: tuple) -> list[tuple[float, float]]:
    """One step per Optimizer.step annotation on the main thread, ending after the zero_grad that
    follows it."""
    mine = [e for e in optimizer if (e["pid"], e["tid"]) == main]
    first = min((e["ts"] for e in ops if (e["pid"], e["tid"]) == main), default=mine[0]["ts"])
    windows, start = [], first
    for i, e in enumerate(mine):
        if ".step#" not in e["name"] and not e["name"].startswith("Optimizer.step"):
            continue
        end = e["ts"] + e["dur"]
        nxt = mine[i + 1] if i + 1 < len(mine) else None
        if nxt is not None and nxt["name"].startswith("Optimizer.zero_grad"):
            end = nxt["ts"] + nxt["dur"]
        windows.append((start, end))
        start = end
    return windows


def _step(start, end, ops, optimizer, launches, device_events, spans, main, autograd) -> Step | None:
    inside = [e for e in ops if start <= e["ts"] < end]
    backward_ops = [e for e in inside if (e["pid"], e["tid"]) in autograd]
    if not backward_ops:
        return None
    b0 = min(e["ts"] for e in backward_ops)
    b1 = max(e["ts"] + e["dur"] for e in backward_ops)
    opt = [e for e in optimizer if start <= e["ts"] < end and (e["pid"], e["tid"]) == main and e["ts"] >= b0]
    o0 = min((e["ts"] for e in opt), default=b1)
    bounds = {"forward": (start, b0), "backward": (b0, o0), "optimizer": (o0, end)}
    phases = {}
    for name, (a, b) in bounds.items():
        phases[name] = _phase(
            a, b, inside, launches, device_events, spans, main if name != "backward" else None, autograd
        )
    param_tensors = sum(
        1
        for e in backward_ops
        if str(e.get("name", "")).startswith("autograd::engine::evaluate_function: ")
        and str(e["name"]).endswith("AccumulateGrad")
    )
    return Step(phases, param_tensors)


def _phase(a, b, inside, launches, device_events, spans, host_thread, autograd) -> Phase:
    threads = {host_thread} if host_thread is not None else autograd
    mine = [e for e in inside if a <= e["ts"] < b]
    sync = sum(
        e["dur"]
        for e in spans
        if e.get("cat") in LAUNCH_CATEGORIES
        and e.get("name") in SYNC_CALLS
        and a <= e["ts"] < b
        and (e["pid"], e["tid"]) in threads
    )
    launched = [
        e
        for e in device_events
        if (launch := launches.get((e.get("args") or {}).get("correlation"))) is not None
        and a <= launch["ts"] < b
    ]
    kernels = [e["dur"] * 1e-6 for e in launched if e["cat"] == "kernel"]
    return Phase(
        wall_s=(b - a) * 1e-6,
        sync_s=sync * 1e-6,
        events=len(mine),
        # every launch the host made (kernels, memsets, copies): each is an op dispatched, and what the
        # catalog's kernel counts count (catalogs/execution.yaml)
        kernels=len(launched),
        device_busy_s=_union([(e["ts"], e["ts"] + e["dur"]) for e in launched]) * 1e-6,
        kernel_durations_s=kernels,
    )


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _cuda_version(v) -> str | None:
    """Kineto's cuda_runtime_version is an int like 13000 (13.0)."""
    if isinstance(v, int) and v > 0:
        return f"{v // 1000}.{v % 1000 // 10}"
    return None


def _precision(names: list[str]) -> str:
    """The autocast dtype as the kernels show it: bf16 kernels, else fp16 ones, else fp32."""
    text = " ".join(n for n in names if "copy" in n or "gemm" in n.lower() or "cutlass" in n)
    if "bfloat16" in text or "bf16" in text:
        return "bf16"
    if "Half" in text or "half" in text or "fp16" in text or "f16" in text:
        return "fp16"
    return "fp32"


def _attention(names: list[str]) -> str | None:
    joined = set(names)
    if any("flash_attn" in n for n in joined):
        return "flash_attention_2"
    if any("scaled_dot_product" in n for n in joined):
        return "sdpa"
    if any(n == "aten::softmax" or n == "aten::_softmax" for n in joined) and any(
        n == "aten::bmm" for n in joined
    ):
        return "eager"
    return None


def _execution(names: list[str]) -> str:
    if any(n.startswith("cudaGraphLaunch") or n.startswith("cuGraphLaunch") for n in names):
        return "cuda_graphs"
    if any("CompiledFunction" in n or "Torch-Compiled Region" in n for n in names):
        return "compiled"
    return "eager"


def _dimension(d) -> bool:
    """A tensor dimension: a whole number from 0 to 2^40 (no bool, no float)."""
    return isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= 2**40


def read_execution_trace(path: Path) -> dict:
    """What an execution trace adds: the parameter tensors and parameter count the optimizer updates,
    which a Kineto trace does not record. They are the tensor lists a fused or foreach optimizer op
    takes first (its step counters are lists of scalars): one call per parameter group (weight decay
    and none, as most training scripts split them), so the calls of one op are added up; calls with the
    same list of shapes are one group's tensors in another role (foreach SGD adds into the momentum
    buffers, then into the parameters) and count once. The op whose calls cover most parameters is
    the update."""
    data = read_json(path, "execution trace")
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        raise InputError("no nodes list: not a PyTorch execution trace", source=str(path), key="nodes")
    groups: dict[str, dict[tuple, list]] = {}
    for node in nodes:
        name = str(node.get("name", "")) if isinstance(node, dict) else ""
        if not (name.startswith("aten::_fused_") or name.startswith("aten::_foreach_")):
            continue
        inputs = node.get("inputs")
        shapes = inputs.get("shapes") if isinstance(inputs, dict) else None
        shapes = shapes[0] if isinstance(shapes, list) and shapes else None
        if not (isinstance(shapes, list) and shapes and all(isinstance(s, list) for s in shapes)):
            continue
        if all(not s for s in shapes):  # the step counters, a list of scalars
            continue
        if not all(_dimension(d) for s in shapes for d in s):
            raise InputError(
                f"{name}'s tensor shapes hold a value that is not a dimension: {str(shapes)[:80]}",
                source=str(path),
                key="nodes",
            )
        key = tuple(tuple(int(d) for d in s) for s in shapes)
        groups.setdefault(name, {})[key] = shapes
    best: dict = {}
    for name, calls in groups.items():
        tensors = [shape for shapes in calls.values() for shape in shapes]
        params = sum(math.prod(int(d) for d in s) for s in tensors)
        if params > best.get("params", 0):
            best = {"param_tensors": len(tensors), "params": params, "op": name}
    if not best:
        raise InputError(
            "no fused or foreach optimizer op over parameter tensors: not the execution trace of a "
            "training step with a fused or foreach optimizer",
            source=str(path),
            key="nodes",
        )
    return best


def overhead_from_step_time(analysis: TraceAnalysis, step_time_s: float) -> float:
    """The profiler's cost per recorded op that makes the profiled step equal ``step_time_s``."""
    profiled = analysis.profiled_step_s()
    if step_time_s >= profiled:
        raise InputError(
            f"--step-time {step_time_s * 1e3:.2f} ms is not shorter than the profiled step "
            f"({profiled * 1e3:.2f} ms): it should be the same step measured without the profiler",
            key="--step-time",
        )
    overhead = (profiled - step_time_s) / analysis.events()
    for name in ("forward", "backward"):
        if analysis.host_s(name, overhead) <= 0:
            raise InputError(
                f"--step-time {step_time_s * 1e3:.2f} ms would make the profiler cost more than the whole "
                f"{name} phase's host time (profiled step {profiled * 1e3:.2f} ms): it should be the same "
                "step measured without the profiler",
                key="--step-time",
            )
    return overhead


def cnn_image_side(model: str, seq_len: int | None) -> int | None:
    """A CNN's image side, the only one the simulator builds it at (the catalog's ``image_size``), so the
    one its measurement is stored and found under; None for a transformer. Another side is refused: a
    measurement at it would never be used."""
    from clustersim import catalog
    from clustersim.catalog import ResNetArch

    try:
        arch = catalog.model(model)
    except InputError as exc:
        raise InputError(exc.message, key="--model") from None
    if not isinstance(arch, ResNetArch):
        return None
    if seq_len is not None and seq_len != arch.image_size:
        raise InputError(
            f"{model} is simulated at {arch.image_size} px images (its catalog image_size), so a "
            f"measurement at {seq_len} px would never be used: measure at {arch.image_size}",
            key="--seq-len",
        )
    return arch.image_size


# How far a traced job's parameter count may be from the named catalog model's: heads, tied or untied
# embeddings and vocabulary padding move it by up to about a third (GPT-2 124M with an untied head:
# 163M). Only a gross mismatch is caught (another model size); a few layers more or fewer are not.
PARAMS_RATIO_LIMIT = 1.5


def check_model_matches(
    analysis: TraceAnalysis, model: str, seq_len: int | None = None, params: int | None = None
) -> None:
    """Refuse a catalog model that is not what the trace ran: a CNN named for a step that runs
    attention, or a transformer for one that runs only convolutions; a sequence longer than its
    positions; with an execution trace, a parameter count of another size."""
    from clustersim import catalog
    from clustersim.catalog import ResNetArch
    from clustersim.workloads.builder import model_params

    arch = catalog.model(model)
    cnn = isinstance(arch, ResNetArch)
    if not cnn and seq_len is not None and arch.max_positions and seq_len > arch.max_positions:
        raise InputError(
            f"--seq-len {seq_len} is longer than {model}'s {arch.max_positions} positions", key="--seq-len"
        )
    if params:
        own = model_params(model)
        if not 1 / PARAMS_RATIO_LIMIT <= params / own <= PARAMS_RATIO_LIMIT:
            raise InputError(
                f"the execution trace's optimizer updates {params:,} parameters, {model} has {own:,}: "
                "name the model the job ran",
                key="--model",
            )
    if cnn and analysis.attention is not None:
        raise InputError(
            f"{model} is a CNN, but the trace runs attention ({analysis.attention}): name the model it ran",
            key="--model",
        )
    if not cnn and analysis.convolutions and analysis.attention is None:
        raise InputError(
            f"{model} is a transformer, but the trace runs convolutions and no attention: "
            "name the model it ran",
            key="--model",
        )


def fingerprint(
    analysis: TraceAnalysis, torch_version: str | None = None, implementation: str | None = None
) -> Fingerprint:
    """``implementation``: the job's model code (--implementation, else its model's default code)."""
    return Fingerprint(
        device=analysis.device_name,
        torch=torch_version,
        cuda=analysis.cuda,
        precision=analysis.precision,
        autocast=analysis.precision != "fp32",
        attention=analysis.attention,
        execution=analysis.execution,
        implementation=implementation,
        optimizer=analysis.optimizer,
    )


def model_compute(
    analysis: TraceAnalysis,
    overhead_s: float,
    model: str,
    micro_batch: int,
    seq_len: int,
    source: str,
    implementation: str | None = None,
    torch_version: str | None = None,
) -> ModelCompute:
    """One measured micro-batch: host time as the intercept (dispatch does not grow with the batch in
    eager mode), forward and backward device time as per-sample (the simplest scaling one point
    allows), the optimizer's device time as the intercept (its work is the parameters', not the batch's)."""

    def phase(name: str) -> PhaseMeasurement:
        device = analysis.median(name, "device_busy_s")
        return PhaseMeasurement(
            host_s=Linear(intercept_s=analysis.host_s(name, overhead_s), per_sample_s=0.0),
            device_s=(
                Linear(intercept_s=device, per_sample_s=0.0)
                if name == "optimizer"
                else Linear(intercept_s=0.0, per_sample_s=device / micro_batch)
            ),
            kernels=round(analysis.median(name, "kernels")),
            ops=round(analysis.median(name, "events")),
        )

    return ModelCompute(
        model=model,
        seq_len=seq_len,
        micro_batches=[micro_batch],
        forward=phase("forward"),
        backward=phase("backward"),
        optimizer=phase("optimizer"),
        fingerprint=fingerprint(analysis, torch_version, implementation),
        source=source,
    )


def dispatch_rates(
    analysis: TraceAnalysis, overhead_s: float, param_tensors: int | None, source: str
) -> DispatchRates:
    """Per-op costs: host time per launched kernel (forward, backward), the device's fixed cost per
    kernel (the 10th percentile of kernel durations: the shortest kernels are almost only that cost),
    and the optimizer's host time per parameter tensor."""
    for name in ("forward", "backward"):
        if analysis.median(name, "kernels") <= 0:
            raise InputError(f"the {name} phase launched no kernels", source=analysis.source)
    tensors = param_tensors or statistics.median(s.param_tensors for s in analysis.used)
    durations = sorted(d for s in analysis.used for p in s.phases.values() for d in p.kernel_durations_s)
    p10 = durations[len(durations) // 10]
    per_kernel = {
        name: [s.phases[name].host_s(overhead_s) / s.phases[name].kernels for s in analysis.used]
        for name in ("forward", "backward")
    }
    spread = 0.0
    if len(analysis.used) >= 2:
        values = per_kernel["forward"]
        spread = (max(values) - min(values)) / 2 / statistics.median(values)
    return DispatchRates(
        host_s_per_kernel_forward=statistics.median(per_kernel["forward"]),
        host_s_per_kernel_backward=statistics.median(per_kernel["backward"]),
        host_s_per_op_backward=statistics.median(
            s.phases["backward"].host_s(overhead_s) / s.phases["backward"].events
            for s in analysis.used
            if s.phases["backward"].events
        )
        if any(s.phases["backward"].events for s in analysis.used)
        else None,
        device_s_per_kernel=p10,
        host_s_per_param_tensor=(analysis.host_s("optimizer", overhead_s) / tensors) if tensors else 0.0,
        fingerprint=fingerprint(analysis),
        spread_rel=spread,
        source=source,
    )


@contextmanager
def _malformed(path: Path | None, what: str):
    """A trace whose structure or values the analysis cannot use (a field of the wrong type, a missing
    one, a value no measurement has) is one line naming the file, never a traceback."""
    try:
        yield
    except InputError as exc:
        raise exc.located(source=str(path)) from None
    except (
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
        OverflowError,
        IndexError,
        ZeroDivisionError,
    ) as exc:
        detail = (
            f"{exc.__class__.__name__}: {str(exc).splitlines()[0][:100]}" if str(exc) else type(exc).__name__
        )
        raise InputError(
            f"{what} has an entry this import cannot read ({detail})", source=str(path)
        ) from None


def import_trace(
    trace_path: Path,
    out: Path,
    et_path: Path | None = None,
    model: str | None = None,
    micro_batch: int | None = None,
    seq_len: int | None = None,
    step_time_s: float | None = None,
    base: Path | None = None,
    command: str = "clustersim calibrate import-trace",
    implementation: str | None = None,
    torch_version: str | None = None,
):
    """Analyse a trace, write its ModelCompute (when the model, micro-batch and sequence length are
    named) and DispatchRates into ``out``; returns (profile, report). ``implementation``: the job's
    model code (default: the code the named catalog model runs by default, else not recorded);
    ``torch_version``: the job's torch (a Kineto trace does not record it; None: not recorded). The
    trace holds no CPU model, host name or thread count either: the entry records the GPU it names."""
    from datetime import datetime, timezone

    from clustersim import catalog
    from clustersim.calibration.compute_store import store
    from clustersim.calibration.torch_support import catalog_name_from_string

    if model is not None:
        seq_len = cnn_image_side(model, seq_len) or seq_len
        model = catalog.model_name(model)  # stored as the scenario names it
    named = [model is not None, micro_batch is not None, seq_len is not None]
    if any(named) and not all(named):
        raise InputError(
            "--model, --micro-batch and --seq-len go together (a model's entry needs all three; "
            "a CNN's --seq-len is its catalog image side)",
            key="--model",
        )
    with _malformed(trace_path, "trace"):
        analysis = analyse(read_json(trace_path, "trace"), str(trace_path))
    with _malformed(et_path, "execution trace"):
        et = read_execution_trace(et_path) if et_path is not None else {}
    if model is not None:
        check_model_matches(analysis, model, seq_len, et.get("params"))
        implementation = implementation or catalog.default_implementation(catalog.model(model))
    traced = statistics.median(s.param_tensors for s in analysis.used)
    if et.get("param_tensors") and traced and et["param_tensors"] != traced:
        raise InputError(
            f"its optimizer updates {et['param_tensors']} parameter tensors, the trace's {traced:g}: "
            "give the execution trace of the same job",
            source=str(et_path),
            key="--et",
        )
    if step_time_s is not None:
        overhead = overhead_from_step_time(analysis, step_time_s)
        profiled = analysis.profiled_step_s() * 1e3
        overhead_source = (
            f"from --step-time {step_time_s * 1e3:.2f} ms against the profiled {profiled:.2f} ms"
        )
    else:
        overhead = PROFILER_OVERHEAD_S
        overhead_source = (
            "default, measured on an NVIDIA H200 (PyTorch 2.11 eager, BERT-Large); "
            "pass --step-time to measure it"
        )
    steps = len(analysis.used)
    source = (
        f"{command}: {Path(trace_path).name}, {steps} step(s)"
        + (" after the first" if len(analysis.steps) > 1 else "")
        + f", profiler overhead {overhead * 1e6:.2f} us per op ({overhead_source.split(',')[0]})"
    )
    with _malformed(trace_path, "trace"):  # values the analysis kept that no measurement can hold
        mc = (
            model_compute(
                analysis, overhead, model, micro_batch, seq_len, source, implementation, torch_version
            )
            if all(named)
            else None
        )
        rates = dispatch_rates(analysis, overhead, et.get("param_tensors"), source)
        rates = rates.model_copy(update={"fingerprint": fingerprint(analysis, torch_version, implementation)})
    device = catalog_name_from_string(analysis.device_name, analysis.device_memory_gb)
    provenance = {
        "source": command,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device_name": analysis.device_name,
        "cuda": analysis.cuda,
        "torch": torch_version,
    }
    profile = store(out, device, provenance, mc, rates, base)
    report = {
        "trace": str(trace_path),
        "steps_in_trace": len(analysis.steps),
        "steps_used": steps,
        "device": analysis.device_name,
        "fingerprint": fingerprint(analysis, torch_version, implementation).model_dump(),
        "profiler_overhead_s_per_op": overhead,
        "profiler_overhead_source": overhead_source,
        "phases": {
            name: {
                "profiled_wall_s": analysis.median(name, "wall_s"),
                "sync_s": analysis.median(name, "sync_s"),
                "ops": analysis.median(name, "events"),
                "kernels": analysis.median(name, "kernels"),
                "host_s": analysis.host_s(name, overhead),
                "device_s": analysis.median(name, "device_busy_s"),
            }
            for name in PHASES
        },
        "param_tensors": et.get("param_tensors") or traced,
        "params": et.get("params"),
        "execution_trace": str(et_path) if et_path is not None else None,
        "dispatch": rates.model_dump(exclude={"fingerprint", "source"}),
        "model_compute": mc is not None,
    }
    return profile, report
