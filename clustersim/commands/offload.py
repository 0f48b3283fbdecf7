"""`clustersim offload plan`: where the optimizer update runs, and what offload buys."""

from __future__ import annotations

from typing import Optional

import typer

from clustersim.commands.support import (
    JsonOpt,
    ProfileOpt,
    SamplesOpt,
    ScenarioArg,
    SetOpt,
    console,
    emit_json,
    table,
    user_errors,
    with_catalogs,
)
from clustersim.commands.support import load_scenario_ref as _load
from clustersim.commands.support import ms as _ms
from clustersim.errors import InputError
from clustersim.simulator.offload import step_phases
from clustersim.units import count_of, format_bytes

offload_app = typer.Typer(
    help="CPU optimizer offload: ZeRO-Offload and interleaved (Deep Optimizer States).", no_args_is_help=True
)


def _print_placement(off: dict) -> None:
    pl = off["placement"]
    span = off.get("subgroup_params_range")
    size = (
        f"up to {off['subgroup_params'] / 1e6:,.1f}M parameters"  # sub_group_size: the last holds the rest
        if span is None
        else f"{span[0] / 1e6:,.1f}M to {span[1] / 1e6:,.1f}M parameters (DeepSpeed's whole tensors)"
    )
    console.print(
        f"offload ({off['mode']}): {count_of(off['subgroups'], 'subgroup')} of {size}: "
        f"{pl['cpu']} on the CPU, {pl['gpu_streamed']} streamed to the GPU, {pl['gpu_resident']} "
        "resident on the GPU "
        f"(chosen by: {off['chosen_by']}); CPU optimizer {off['cpu_params_per_s'] / 1e9:,.2f} Gparams/s, "
        f"PCIe {off['pcie_gbs']:.0f} GB/s, host DRAM {off['host_dram_gbs_per_gpu']:.0f} GB/s per GPU"
    )


SAME_SPEED = 0.005
"""Two modes whose iteration times differ by less than this fraction are called the same speed: a ratio
printed to two decimals reads 1.00x there, and "1.00x faster" says nothing (the band is wider)."""


def _faster(first: str, second: str, ratio: float) -> str:
    """``first is 1.17x faster than second``, or, within SAME_SPEED, that the two run at the same speed."""
    if abs(ratio - 1.0) < SAME_SPEED:
        return f"{first} runs at the same speed as {second} (within {100 * SAME_SPEED:.1f}%)"
    return f"{first} is {ratio:.2f}x faster than {second}"


def _refusal(scenario) -> str | None:
    """Why a scenario without offload does not fit in GPU memory (None: it fits): the check simulate
    makes before it builds the iteration (simulator/runner.py _run), without simulating."""
    from clustersim.simulator.context import build_context
    from clustersim.simulator.memory import check_fits, gpu_memory
    from clustersim.simulator.strategies import registry

    try:
        ctx = build_context(scenario)
        check_fits(ctx, gpu_memory(ctx, registry.create(ctx)))
    except InputError as exc:
        return exc.message
    return None


def _fits(scenario) -> bool:
    return _refusal(scenario) is None


def largest_micro_batch(scenario) -> int:
    """The largest micro-batch below the scenario's that fits in GPU memory without offload (0: not even
    one sample), by bisection (memory grows with the micro-batch): what a user weighs against offload."""
    lo, hi = 0, scenario.workload.micro_batch - 1  # lo fits (0 trivially), hi+1 does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(scenario.with_changes(**{"workload.micro_batch": mid})):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _without_offload(scenario, exc: InputError) -> dict:
    """The no-offload mode that does not fit: why, the largest micro-batch that fits, and, where none
    does, why a micro-batch of 1 does not (its need, not the requested micro-batch's larger one)."""
    out = {"fits": False, "why": exc.message, "largest_micro_batch": largest_micro_batch(scenario)}
    if not out["largest_micro_batch"]:
        one = scenario.with_changes(**{"workload.micro_batch": 1})
        out["why_micro_batch_1"] = _refusal(one) or exc.message
    return out


def _what_fits_without_offload(plain: dict, micro_batch: int) -> str:
    """The line under the table when no offload does not fit at the scenario's micro-batch."""

    def why(message: str) -> str:
        return message.split("; per rank:")[0].removeprefix("does not fit in GPU memory: ")

    fit = plain["largest_micro_batch"]
    if fit:
        return (
            f"without offload the largest micro-batch that fits is {fit} (workload.micro_batch; "
            f"at {micro_batch}: {why(plain['why'])})"
        )
    return f"without offload not even a micro-batch of 1 fits ({why(plain['why_micro_batch_1'])})"


def _band_ms(m: dict) -> str:
    if m.get("iteration_time_p10_s") is None:
        return "-"
    return f"{_ms(m['iteration_time_p10_s'])}–{_ms(m['iteration_time_p90_s'])}"


def _zero_label(gap: int | None) -> str:
    """The ZeRO-Offload row's name: every update on the CPU, or Deep Optimizer States' schedule."""
    if gap is None:
        return "ZeRO-Offload (all updates on the CPU)"
    from clustersim.units import ordinal

    return f"ZeRO-Offload (every {ordinal(gap)} subgroup's update on the GPU)"


def _mode_resets(mode: str) -> dict:
    """What another offload mode takes back to its default: without offload there is no offloaded
    gradient path (its copy mode); Deep Optimizer States' GPU-update gap is a ZeRO-Offload schedule, so
    only the ZeRO-Offload row keeps it."""
    reset: dict = {"training.offload.gradient_copy": None} if mode == "none" else {}
    if mode != "zero":
        reset["training.offload.gpu_update_gap"] = None
    return reset


@offload_app.command("plan")
@user_errors
@with_catalogs
def offload_plan(
    scenario: str = ScenarioArg,
    json_out: bool = JsonOpt,
    profile: Optional[str] = ProfileOpt,
    samples: int = SamplesOpt,
    settings: Optional[list[str]] = SetOpt,
):
    """Per-subgroup placement of the optimizer update; iteration time (with its P10–P90 band) without
    offload, ZeRO-Offload, interleaved; without offload, the largest micro-batch that fits."""
    from clustersim.simulator import simulate

    s = _load(scenario, settings)
    results: dict[str, dict] = {}
    interleaved = None
    for mode in ("none", "zero", "interleaved"):
        mine = s.with_changes(**{"training.offload.mode": mode, **_mode_resets(mode)})
        try:
            r = simulate(mine, profile, uncertainty_samples=samples)
        except InputError as exc:
            if mode == "interleaved" or "does not fit" not in exc.message:
                raise
            results[mode] = (
                _without_offload(mine, exc) if mode == "none" else {"fits": False, "why": exc.message}
            )
            continue
        iv = r.interval
        results[mode] = {
            "fits": True,
            "iteration_time_s": r.iteration_time,
            "iteration_time_p10_s": iv.p10 if iv is not None else None,
            "iteration_time_p90_s": iv.p90 if iv is not None else None,
            "samples_per_s": r.samples_per_s,
            "breakdown_s": r.breakdown,
            "phases_s": step_phases(r.ops, r.iteration_time),
            "gpu_memory_bytes": r.memory["total"],
            # what `run` notes of a fit with little to spare (memory.thin_headroom_note)
            "memory_notes": [n for n in r.notes if n.startswith("GPU memory:")],
        }
        if mode == "interleaved":
            interleaved = r
    off = interleaved.extra["offload"]
    if json_out:
        emit_json({"scenario": s.name, "samples": samples, "modes": results, "placement": off})
        return
    console.print(
        f"[bold]{s.name}[/]: {s.workload.model or 'custom'} on {s.cluster.world_size} x "
        f"{s.cluster.gpu_name}, optimizer {s.training.optimizer}, micro-batch {s.workload.micro_batch}"
    )
    _print_placement(off)
    console.print(
        table(
            "Placement of the optimizer update by subgroup",
            ["subgroups", "count", "where"],
            [[f"{a}-{b}" if a != b else str(a), b - a + 1, k.replace("_", " ")] for a, b, k in off["ranges"]],
        )
    )
    if off.get("candidates"):
        kept = off["candidates"][off["chosen_by"]]
        console.print(
            table(
                "Plans checked (the fastest is kept)",
                ["plan", "iteration ms"],
                [
                    [k + (" (kept)" if k == off["chosen_by"] else f" (+{100 * (v / kept - 1):.1f}%)"), _ms(v)]
                    for k, v in off["candidates"].items()
                ]
                + [
                    [f"{k} (ruled out: no faster without contention)", f">= {_ms(v)}"]
                    for k, v in off.get("ruled_out", {}).items()
                ],
            )
        )
    rows = []
    base = results.get("zero", {}).get("iteration_time_s")
    for mode, label in (
        ("none", "no offload"),
        ("zero", _zero_label(s.training.offload.gpu_update_gap)),
        ("interleaved", "interleaved offload"),
    ):
        m = results[mode]
        if not m["fits"]:
            rows.append([label, "does not fit", "-", "-", "-", m["why"].split(":")[0]])
            continue
        b, ph = m["breakdown_s"], m["phases_s"]
        rows.append(
            [
                label,
                _ms(m["iteration_time_s"]),
                _band_ms(m),
                _ms(ph["backward"] if ph else b["backward"]),
                _ms(ph["step"] if ph else b["exposed_host"] + b["exposed_transfer"] + b["optimizer"]),
                format_bytes(m["gpu_memory_bytes"]),
            ]
        )
    console.print(
        table(
            "Offload modes compared",
            ["mode", "iteration ms", "P10–P90 ms", "backward ms", "step ms", "GPU memory"],
            rows,
        )
    )
    console.print(
        "[dim]backward and step as DeepSpeed's wall_clock_breakdown times them: backward runs from the end "
        "of forward to the start of the optimizer step, with what the GPU waits for meanwhile (a blocking "
        "gradient copy's pageable copies and page faults, which `run` counts as exposed host and exposed "
        "transfer); step, from the optimizer update's first op to its last copy[/]"
    )
    if samples:
        console.print(
            f"[dim]P10–P90: {samples} draws of the calibrated or default parameter uncertainty per mode[/]"
        )
    for mode, label in (("none", "no offload"), ("zero", "ZeRO-Offload"), ("interleaved", "interleaved")):
        for note in results[mode].get("memory_notes", []):
            console.print(f"note ({label}): {note}", markup=False, highlight=False)
    plain = results["none"]
    if not plain["fits"]:
        # the text said only "does not fit"; what does fit without offload is what the question needs
        console.print(
            _what_fits_without_offload(plain, s.workload.micro_batch), markup=False, highlight=False
        )
    if base:
        console.print(
            _faster("interleaved", "ZeRO-Offload", base / results["interleaved"]["iteration_time_s"])
        )
    if plain["fits"] and plain["iteration_time_s"] < results["interleaved"]["iteration_time_s"]:
        # the line above alone read as a recommendation to offload where nothing needs it
        ratio = results["interleaved"]["iteration_time_s"] / plain["iteration_time_s"]
        console.print(
            _faster("no offload", "interleaved", ratio)
            + ": the optimizer state fits in GPU memory, so offload only frees memory here"
        )
