"""The rank's host dispatch thread as a lane of the program: a layer's kernels wait for their launch.

Eager PyTorch dispatches every op from one host thread (the autograd engine's in backward), and the
GPU runs the kernels as they arrive (cost_models/dispatch.py). In the program a layer's pass is a
dispatch op on stream "dispatch" (its kernels times the host's cost per kernel) and a compute op that
starts no earlier than the end of the dispatch op before it, when the layer's first kernel is queued;
on an asynchronous device the host goes on dispatching while the kernels run, so over a stack of
layers a phase takes about max(host, device). A layer's last kernel may so end before its own
dispatch does, by at most that layer's dispatch; the next layer waits for it, so the error does not
accumulate. On a synchronous device (a CPU) the thread runs its kernels after dispatching them.

One op per layer and lane, never one per kernel, and fewer still where the device is the bottleneck:
when at every layer of a pass the dispatch done so far is no longer than the device work done so
far, no kernel can ever wait for its launch (the host starts first and stays ahead), so the pass's
dispatch is one op and only its first kernel waits for the host. That is exact for this model: a
NCCL kernel slowing the compute stream or a late start only widens the host's lead.
"""

from __future__ import annotations

from itertools import accumulate

from clustersim.simulator.context import SimulationContext
from clustersim.simulator.program import Program


def add_dispatch(
    prog: Program,
    ctx: SimulationContext,
    name: str,
    seconds: float,
    after: tuple = (),
    meta: dict | None = None,
) -> int | None:
    """Host dispatch work of ``seconds`` on the rank's dispatch thread; None when there is none (CUDA
    graphs). On a synchronous device the thread first finishes the kernels it ran before. ``after``:
    ops the host waits for before it starts (a host synchronisation, such as ``.item()`` on a value
    the device computes), on any device."""
    if seconds <= 0:
        return None
    deps = () if ctx.dispatch.asynchronous else (prog.last_on("compute"),)
    return prog.add(
        name, "dispatch", seconds, "host", (*deps, *(d for d in after if d is not None)), meta=meta
    )


class PassSequence:
    """One micro-step's forward (or backward) over ``layers``, added in that order by ``add``."""

    def __init__(
        self, prog: Program, ctx: SimulationContext, layers, forward: bool, after: tuple = ()
    ) -> None:
        """``after``: ops the host waits for before it dispatches the pass (a host synchronisation
        between forward and backward, SimulationContext.host_syncs_after_forward)."""
        self.prog, self.ctx, self.forward = prog, ctx, forward
        self.host, self.device, coalesced = pass_times(ctx, layers, forward)
        # after a synchronisation the host is not ahead of the device: each layer waits for its dispatch
        self.coalesced = coalesced and not after
        self.index = 0
        self.after = after

    def add(self, layer, deps: tuple = (), meta: dict | None = None) -> int:
        """The next layer's pass; returns its compute op's id."""
        i, prog, ctx = self.index, self.prog, self.ctx
        self.index += 1
        prefix = "fwd" if self.forward else "bwd"
        name = f"{prefix} {layer.name}"
        category = "forward" if self.forward else "backward"
        launch = None
        if self.coalesced:
            if i == 0:
                launch = prog.last_on("dispatch")
                n = len(self.host)
                add_dispatch(prog, ctx, f"dispatch {prefix} ({n} layers)", sum(self.host), self.after)
        elif self.host[i] > 0:
            queued = prog.last_on("dispatch") if ctx.dispatch.asynchronous else None
            own = add_dispatch(prog, ctx, f"dispatch {name}", self.host[i], self.after if i == 0 else ())
            launch = queued if ctx.dispatch.asynchronous else own
        if launch is not None:
            deps = (*deps, launch)
        return prog.add(name, "compute", self.device[i], category, deps, meta=meta)


def pass_times(ctx: SimulationContext, layers, forward: bool) -> tuple[list[float], list[float], bool]:
    """(dispatch times, device times, whether the dispatch can be one op) of a pass over ``layers``
    in the order given: once per context and pass, since every micro-step and step kind of a run
    passes over the same layers (the cache holds ``layers``, so its id stays its own)."""
    cache = ctx.__dict__.setdefault("_pass_times", {})
    hit = cache.get((id(layers), forward))
    if hit is not None and hit[0] is layers:
        return hit[1]
    if forward:
        device = [ctx.forward_time(layer) for layer in layers]
        host = [ctx.host_forward_time(layer) for layer in layers]
    else:
        device = [ctx.backward_time(layer) for layer in layers]
        host = [ctx.host_backward_time(layer) for layer in layers]
    times = (host, device, ctx.dispatch.asynchronous and _host_stays_ahead(host, device))
    cache[(id(layers), forward)] = (layers, times)
    return times


def _host_stays_ahead(host: list[float], device: list[float]) -> bool:
    """Whether the dispatch of layers 0..i-1 never takes longer than their device work, for every i:
    then layer i's kernels are always queued before the device is free for them."""
    return all(h <= d for h, d in zip(accumulate(host[:-1]), accumulate(device[:-1])))


def merge_from(ctx: SimulationContext, layers) -> int | None:
    """From which micro-step on identical plain micro-steps can be merged into one op per pass
    (strategies.common.add_micro_steps) without changing when any kernel runs, or None.

    On a synchronous device always (dispatch and kernels are one thread's work in series). On an
    asynchronous one a kernel waits for its launch only while the host has not got ahead of the device:
    with d and h the device and dispatch times of one micro-step's layers in order, the host's lead over
    the device at the end of a micro-step grows by sum(d) - sum(h) each micro-step, and no kernel of a
    micro-step waits when the lead covers the largest prefix of h - d. From micro-step 0 on when that
    prefix is never positive (the host starts first); from micro-step 1 on when one micro-step's lead
    sum(d) - sum(h) covers it; else never (the host binds: the micro-steps are listed)."""
    if not ctx.dispatch.asynchronous:
        return 0
    fwd_host, fwd_device, _ = pass_times(ctx, layers, True)
    bwd_host, bwd_device, _ = pass_times(ctx, reversed_layers(ctx, layers), False)
    host, device = fwd_host + bwd_host, fwd_device + bwd_device
    # the kernels of layer i wait for the dispatch of layers 0..i-1
    deficit = max((h - d for h, d in zip(accumulate(host[:-1]), accumulate(device[:-1]))), default=0.0)
    if deficit <= 0:
        return 0
    if sum(device) - sum(host) >= deficit:
        return 1
    return None


def add_merged_micro_steps(prog: Program, ctx: SimulationContext, layers, count: int, meta: dict) -> None:
    """``count`` identical micro-steps as one forward and one backward op with their dispatch as one op,
    where merge_from says no kernel of them waits for its launch (a synchronous device's thread runs
    the dispatch first, then the kernels: the same total, in series)."""
    fwd_host, fwd_device, _ = pass_times(ctx, layers, True)
    bwd_host, bwd_device, _ = pass_times(ctx, reversed_layers(ctx, layers), False)
    own = add_dispatch(
        prog, ctx, f"dispatch x{count} micro-steps", count * (sum(fwd_host) + sum(bwd_host)),
        meta={"micro_steps": count},
    )  # fmt: skip
    deps = (own,) if own is not None and not ctx.dispatch.asynchronous else ()
    fwd, bwd = count * sum(fwd_device), count * sum(bwd_device)
    prog.add(f"fwd x{count} micro-steps", "compute", fwd, "forward", deps, meta=meta)
    prog.add(f"bwd x{count} micro-steps", "compute", bwd, "backward", meta=meta)


def reversed_layers(ctx: SimulationContext, layers):
    """``layers`` in backward order, one list per context and layer list (pass_times caches by it)."""
    cache = ctx.__dict__.setdefault("_reversed_layers", {})
    hit = cache.get(id(layers))
    if hit is None or hit[0] is not layers:
        hit = cache[id(layers)] = (layers, layers[::-1])
    return hit[1]
