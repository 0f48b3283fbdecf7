"""`clustersim calibrate model`: time the scenario's own model on the local device.

For each micro-batch size the model takes training steps in three phases: forward (including the
loss), backward, optimizer (step and zero_grad). Each phase is timed twice:

- without the profiler, the device synchronised before and after the phase: the phase's time, and
  on a GPU its host time (from the phase's start until its Python call returns: the time the host
  thread spent dispatching, since nothing in a training phase waits for the device). On the CPU
  with one torch thread the clock is that thread's CPU time, which other processes on a shared
  machine do not inflate;
- under ``torch.profiler``: the ops the phase recorded, and what they ran. On a GPU: the kernels,
  memsets and copies it launched (by correlation id), their count and the device's busy time (the
  union of their intervals).

On the CPU host and device are the same thread and a kernel runs inside its op. The kernels are the
ops that compute (not composite, view or allocation ops, not autograd's records); the host time is
the phase's ops, each at the cost of dispatching a trivial op on this machine (``op_costs``), and
the device time is the rest of the phase's time.

The profiler's own cost per recorded op is measured and reported; it never enters the stored times
(host time comes from the unprofiled run or the op count, device time from kernel durations). Each
phase's host and device times are fitted linear in the micro-batch, and one size left out of the
fit is predicted: the step (forward + backward + optimizer), a phase taking host + device on the
CPU, where they run in series, and max(host, device) on a GPU, where they overlap (the device's
time there being its busy time and the gaps between its queued kernels).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from clustersim.calibration.profile import (
    DispatchRates,
    Fingerprint,
    Linear,
    ModelCompute,
    ModelHoldout,
    PhaseMeasurement,
)
from clustersim.calibration.trace_import import DEVICE_CATEGORIES, LAUNCH_CATEGORIES, _union
from clustersim.errors import InputError

PHASES = ("forward", "backward", "optimizer")
PHASE_LABEL = "clustersim.{}"  # record_function names that mark the phases in the profile
# Ops that make a view of a tensor or allocate one without computing: on the CPU they are dispatch
# (host) time, not kernels; on a GPU they launch nothing.
NON_COMPUTE_OPS = frozenset(
    {
        "aten::view",
        "aten::t",
        "aten::transpose",
        "aten::reshape",
        "aten::expand",
        "aten::permute",
        "aten::detach",
        "aten::alias",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::select",
        "aten::slice",
        "aten::as_strided",
        "aten::_unsafe_view",
        "aten::_reshape_alias",
        "aten::resolve_conj",
        "aten::resolve_neg",
        "aten::split",
        "aten::split_with_sizes",
        "aten::chunk",
        "aten::narrow",
        "aten::unbind",
        "aten::empty",
        "aten::empty_strided",
        "aten::empty_like",
        "aten::lift_fresh",
        "aten::contiguous",
        "aten::flatten",
        "aten::unflatten",
        "aten::view_as",
        "aten::expand_as",
        "aten::type_as",
        "aten::is_nonzero",
        "aten::item",
        "aten::_local_scalar_dense",
        "aten::lift",
    }
)


@dataclass
class PhaseSample:
    """One phase at one micro-batch (medians over the timed steps), seconds."""

    wall_s: float
    host_s: float
    device_s: float
    kernels: int
    ops: int
    profiled_wall_s: float
    kernel_durations_s: list[float] = field(default_factory=list, repr=False)


@dataclass
class Measured:
    micro_batch: int
    phases: dict[str, PhaseSample]

    def step_wall_s(self) -> float:
        return sum(p.wall_s for p in self.phases.values())


@dataclass
class Runner:
    """What to time: ``make(micro_batch)`` gives (model, batch); ``loss(model, batch)`` runs a forward
    that returns the loss."""

    make: Callable
    loss: Callable
    attention: str | None


def fit_linear(xs: list[float], ys: list[float]) -> Linear:
    """Least squares y = a + b x with a, b >= 0 (a negative intercept refits through the origin, a
    negative slope takes the mean): times never fall below zero or with more samples."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    a = my - b * mx
    if b < 0:
        return Linear(intercept_s=max(my, 0.0), per_sample_s=0.0)
    if a < 0:
        b = sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
        return Linear(intercept_s=0.0, per_sample_s=max(b, 0.0))
    return Linear(intercept_s=a, per_sample_s=b)


def _constant(xs: list[float], ys: list[float]) -> Linear:
    """A time that does not depend on the micro-batch: the median of the measurements."""
    return Linear(intercept_s=statistics.median(ys), per_sample_s=0.0)


def _sync(torch, device: str):
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def _optimizer(torch, params, kind: str, device: str):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9, foreach=True)
    if device == "cuda":
        return torch.optim.AdamW(params, lr=1e-4, fused=True)
    return torch.optim.AdamW(params, lr=1e-4, foreach=True)


def _autocast(torch, device: str, precision: str):
    import contextlib

    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return torch.autocast(device_type=device, dtype=dtype)


def measure(
    torch,
    runner: Runner,
    micro_batches: list[int],
    device: str,
    precision: str,
    optimizer: str,
    steps: int,
    warmup: int,
    costs: OpCosts,
    progress=None,
) -> list[Measured]:
    """Time every micro-batch size: ``warmup`` steps each, then ``steps`` rounds of one unprofiled
    step per size (interleaved, so that a machine's changing load or clock touches every size
    alike), then ``max(3, steps // 2)`` profiled steps per size. ``costs``: ``op_costs``."""
    sync = _sync(torch, device)
    # One CPU thread does all the work when torch uses one: its CPU time is the phase's time, which
    # other processes on a shared machine do not inflate (wall time would count their time slices).
    clock = time.thread_time if device == "cpu" and torch.get_num_threads() == 1 else time.perf_counter
    contexts, optimizers = {}, {}
    for b in micro_batches:
        model, batch = runner.make(b)
        model.train()
        if id(model) not in optimizers:  # one optimizer per model: sizes that share it share its state
            params = [p for p in model.parameters() if p.requires_grad]
            optimizers[id(model)] = _optimizer(torch, params, optimizer, device)
        contexts[b] = (model, batch, optimizers[id(model)])
    say = progress or (lambda message: None)

    def step(b: int, marks: bool):
        model, batch, opt = contexts[b]
        times = {}
        for name in PHASES:
            sync()
            t0 = clock()
            with torch.profiler.record_function(PHASE_LABEL.format(name)) if marks else _null():
                if name == "forward":
                    with _autocast(torch, device, precision):
                        loss = runner.loss(model, batch)
                elif name == "backward":
                    loss.backward()
                else:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            t1 = clock()
            sync()
            times[name] = (t1 - t0, clock() - t0)
        return times

    for b in micro_batches:
        say(f"micro-batch {b}: {warmup} warm-up steps")
        for _ in range(warmup):
            step(b, False)
    plain: dict[int, list] = {b: [] for b in micro_batches}
    for i in range(steps):
        for j, b in enumerate(micro_batches, 1):
            # each step said: a round of large micro-batches outlasts the progress interval
            say(f"round {i + 1} of {steps}: micro-batch {b} ({j} of {len(micro_batches)} sizes)")
            plain[b].append(step(b, False))
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    dispatch_only = dispatch_only_ops(torch)
    out = []
    for b in micro_batches:
        say(f"micro-batch {b}: profiled steps")
        with _profiler_log_kept_quiet(), torch.profiler.profile(activities=activities) as prof:
            profiled = [step(b, True) for _ in range(max(3, steps // 2))]
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            trace = json.loads(path.read_text())
        out.append(
            _summarise(b, plain[b], profiled, _phases_from_trace(trace, device, dispatch_only), device, costs)
        )
    return out


def _summarise(b: int, plain: list, profiled: list, phases: dict, device: str, costs: "OpCosts") -> Measured:
    out = {}
    for name in PHASES:
        wall = statistics.median(t[name][1] for t in plain)
        host_return = statistics.median(t[name][0] for t in plain)
        got = phases[name]
        if device == "cpu":
            # Host and kernels share the thread: the host's part is the phase's ops, each at the
            # cost of dispatching a trivial op; the rest is the kernels'. (The ops' self times in
            # the trace are wall-clock, which a shared machine's time slices make meaningless.)
            host = min(statistics.median(got["ops"]) * costs.dispatch_s, wall)
            device_s = wall - host
        else:
            host, device_s = host_return, statistics.median(got["device_s"])
        out[name] = PhaseSample(
            wall_s=wall,
            host_s=host,
            device_s=device_s,
            kernels=round(statistics.median(got["kernels"])),
            ops=round(statistics.median(got["ops"])),
            profiled_wall_s=statistics.median(t[name][1] for t in profiled),
            kernel_durations_s=got["durations"],
        )
    return Measured(b, out)


# What torch.profiler's C++ side (Kineto) writes to the process's stderr each time it starts or stops,
# e.g. "USDT: ... SyncActivityProfilerHandler.cpp:52] profiler_start": its bookkeeping, not the user's.
_PROFILER_LOG = re.compile(r"^(USDT|STAGE):|ActivityProfiler|ProfilerHandler|kineto", re.IGNORECASE)


@contextlib.contextmanager
def _profiler_log_kept_quiet():
    """Hold file descriptor 2 in a temporary file while the profiler runs, then pass on every line it
    wrote but Kineto's own bookkeeping, so `calibrate model` prints its progress and real warnings only."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # no real stderr (a test runner's capture)
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            held.seek(0)
            kept = [
                line
                for line in held.read().decode(errors="replace").splitlines()
                if line.strip() and not _PROFILER_LOG.search(line)
            ]
            if kept:
                print("\n".join(kept), file=sys.stderr)


@dataclass(frozen=True)
class OpCosts:
    """Per-op costs on this machine, from a loop of one-element in-place adds (one op, on a GPU one
    kernel, each; the fastest of several repeats): ``dispatch_s`` the time of one such op unprofiled,
    ``profiler_s`` what recording it adds."""

    dispatch_s: float
    profiler_s: float


def op_costs(torch, device: str, ops: int = 2000, repeats: int = 5) -> OpCosts:
    x = torch.zeros(1, device=device)
    sync = _sync(torch, device)
    clock = time.thread_time if device == "cpu" and torch.get_num_threads() == 1 else time.perf_counter
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def loop() -> float:
        sync()
        t0 = clock()
        for _ in range(ops):
            x.add_(1)
        sync()
        return clock() - t0

    loop()
    plain = min(loop() for _ in range(repeats))
    with _profiler_log_kept_quiet(), torch.profiler.profile(activities=activities):
        profiled = min(loop() for _ in range(repeats))
    return OpCosts(dispatch_s=plain / ops, profiler_s=max(profiled - plain, 0.0) / ops)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _phases_from_trace(trace: dict, device: str, dispatch_only: Callable[[str], bool]) -> dict[str, dict]:
    """Per phase (marked by our record_function labels): per profiled step the ops recorded, the
    kernels and device time (see the module docstring), and all kernel durations."""
    spans = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    marks = {
        name: [
            e
            for e in spans
            if e.get("name") == PHASE_LABEL.format(name) and e.get("cat") == "user_annotation"
        ]
        for name in PHASES
    }
    ops = [e for e in spans if e.get("cat") == "cpu_op"]
    launches = {
        e["args"]["correlation"]: e
        for e in spans
        if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in (e.get("args") or {})
    }
    device_events = [e for e in spans if e.get("cat") in DEVICE_CATEGORIES]
    result = {}
    for name, windows in marks.items():
        if not windows:
            raise InputError(
                f"the profiler recorded no {name} phase (is torch.profiler working?)", key="--device"
            )
        per = {"ops": [], "kernels": [], "device_s": [], "durations": []}
        for w in windows:
            a, b = w["ts"], w["ts"] + w["dur"]
            inside = [e for e in ops if a <= e["ts"] < b]
            per["ops"].append(len(inside))
            if device == "cuda":
                launched = [
                    e
                    for e in device_events
                    if (launch := launches.get((e.get("args") or {}).get("correlation"))) is not None
                    and a <= launch["ts"] < b
                ]
                kernels = [e["dur"] * 1e-6 for e in launched if e["cat"] == "kernel"]
                busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in launched]) * 1e-6
                # every launch (kernels, memsets, copies) is an op the host dispatched, and what the
                # catalog's kernel counts count (catalogs/execution.yaml)
                count = len(launched)
            else:
                computing = _compute_ops(inside, dispatch_only)
                kernels = [e["dur"] * 1e-6 for e in computing]
                busy = sum(kernels)
                count = len(kernels)
            per["kernels"].append(count)
            per["device_s"].append(busy)
            per["durations"] += kernels
        result[name] = per
    return result


def _compute_ops(ops: list[dict], dispatch_only: Callable[[str], bool]) -> list[dict]:
    """The ops that compute, each with ``dur`` set to its self time (its duration minus the ops inside
    it): every op except those ``dispatch_only`` names, whose self time is the host's."""
    out = []
    by_thread: dict = {}
    for e in ops:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        inner = [0.0] * len(events)
        stack: list[int] = []
        for i, e in enumerate(events):
            while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                inner[stack[-1]] += e["dur"]
            stack.append(i)
        for e, children in zip(events, inner):
            if not dispatch_only(str(e.get("name", ""))):
                out.append({**e, "dur": max(e["dur"] - children, 0.0)})
    return out


def dispatch_only_ops(torch) -> Callable[[str], bool]:
    """Ops whose own time is dispatch, not computation: autograd and annotation records (no aten::
    prefix), view and allocation ops, and composite ops (CompositeImplicitAutograd: they only call
    other ops), as torch's dispatcher registers them."""
    cache: dict[str, bool] = {}

    def composite(short: str) -> bool:
        packet = getattr(torch.ops.aten, short, None)
        if packet is None:
            return False
        for overload in sorted(packet.overloads(), key=lambda o: o != "default"):
            full = f"aten::{short}" if overload == "default" else f"aten::{short}.{overload}"
            try:
                return torch._C._dispatch_has_kernel_for_dispatch_key(full, "CompositeImplicitAutograd")
            except RuntimeError:
                continue
        return False

    def dispatch_only(name: str) -> bool:
        if name not in cache:
            cache[name] = (
                not name.startswith("aten::") or name in NON_COMPUTE_OPS or composite(name[len("aten::") :])
            )
        return cache[name]

    return dispatch_only


def _combine(device: str) -> Callable[[float, float], float]:
    """How a phase's host and device times make its time: in series on the CPU, overlapped on a GPU."""
    return (lambda h, d: h + d) if device == "cpu" else max


def fit(
    measured: list[Measured],
    holdout: Measured | None,
    device: str,
    model: str,
    seq_len: int,
    fingerprint: Fingerprint,
    param_tensors: int,
    source: str,
) -> tuple[ModelCompute, DispatchRates]:
    """ModelCompute (per phase host and device time linear in the micro-batch) and DispatchRates."""
    xs = [m.micro_batch for m in measured]
    largest = max(measured, key=lambda m: m.micro_batch)

    def phase(name: str) -> PhaseMeasurement:
        # the optimizer's work is the parameters', whatever the micro-batch: its median, not a slope
        # fitted to noise (which would grow it with the micro-batch)
        fitted = fit_linear if name != "optimizer" else _constant
        return PhaseMeasurement(
            host_s=fitted(xs, [m.phases[name].host_s for m in measured]),
            device_s=fitted(xs, [m.phases[name].device_s for m in measured]),
            kernels=largest.phases[name].kernels,
            ops=largest.phases[name].ops,
            wall_s=fitted(xs, [m.phases[name].wall_s for m in measured]),
        )

    phases = {name: phase(name) for name in PHASES}
    combine = _combine(device)
    held = None
    if holdout is not None:
        b = holdout.micro_batch
        # on a GPU a device-bound phase also spends the gap between its queued kernels, which its
        # busy time leaves out, as the simulator prices it (PhaseMeasurement.device_time)
        predicted = sum(combine(p.host_s.at(b), p.device_time(b, device)) for p in phases.values())
        measured_s = holdout.step_wall_s()
        held = ModelHoldout(
            micro_batch=b, measured_s=measured_s, predicted_s=predicted, rel_error=predicted / measured_s - 1
        )
    mc = ModelCompute(
        model=model,
        seq_len=seq_len,
        micro_batches=xs,
        forward=phases["forward"],
        backward=phases["backward"],
        optimizer=phases["optimizer"],
        fingerprint=fingerprint,
        holdout=held,
        source=source,
    )
    per_kernel = {
        name: [m.phases[name].host_s / m.phases[name].kernels for m in measured if m.phases[name].kernels]
        for name in ("forward", "backward")
    }
    for name, values in per_kernel.items():
        if not values:
            raise InputError(f"the {name} phase ran no kernels at any micro-batch", key="--model")
    durations = sorted(d for m in measured for p in m.phases.values() for d in p.kernel_durations_s)
    fwd = per_kernel["forward"]
    rates = DispatchRates(
        host_s_per_kernel_forward=statistics.median(fwd),
        host_s_per_kernel_backward=statistics.median(per_kernel["backward"]),
        host_s_per_op_backward=_per_op(
            [(m.phases["backward"].host_s, m.phases["backward"].ops) for m in measured]
        ),
        device_s_per_kernel=durations[len(durations) // 10] if durations else 0.0,
        host_s_per_param_tensor=statistics.median(m.phases["optimizer"].host_s for m in measured)
        / param_tensors,
        fingerprint=fingerprint,
        spread_rel=(max(fwd) - min(fwd)) / 2 / statistics.median(fwd),
        source=source,
    )
    return mc, rates


def _per_op(pairs: list[tuple[float, int]]) -> float | None:
    """The median host time per op over (host seconds, ops) pairs; None where no op was recorded."""
    values = [host / ops for host, ops in pairs if ops and host > 0]
    return statistics.median(values) if values else None


def profiler_overhead_s(measured: list[Measured]) -> float | None:
    """The profiler's cost per recorded op: (profiled - unprofiled wall) / ops, over every phase."""
    extra = sum(p.profiled_wall_s - p.wall_s for m in measured for p in m.phases.values())
    ops = sum(p.ops for m in measured for p in m.phases.values())
    return extra / ops if ops else None
