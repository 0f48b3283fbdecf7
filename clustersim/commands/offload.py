"""`clustersim offload plan`: where the optimizer update runs, and what offload buys."""

from __future__ import annotations

from typing import Optional

import typer

from clustersim.commands.support import (
    JsonOpt,
    ProfileOpt,
    ScenarioArg,
    console,
    emit_json,
    table,
    user_errors,
    with_catalogs,
)
from clustersim.commands.support import load_scenario_ref as _load
from clustersim.commands.support import ms as _ms
from clustersim.errors import InputError
from clustersim.units import count_of, format_bytes

offload_app = typer.Typer(
    help="CPU optimizer offload: ZeRO-Offload and interleaved (Deep Optimizer States).", no_args_is_help=True
)


def _print_placement(off: dict) -> None:
    pl = off["placement"]
    console.print(
        f"offload ({off['mode']}): {count_of(off['subgroups'], 'subgroup')} of "
        f"{off['subgroup_params'] / 1e6:,.1f}M "
        "parameters: "
        f"{pl['cpu']} on the CPU, {pl['gpu_streamed']} streamed to the GPU, {pl['gpu_resident']} "
        "resident on the GPU "
        f"(chosen by: {off['chosen_by']}); CPU optimizer {off['cpu_params_per_s'] / 1e9:,.2f} Gparams/s, "
        f"PCIe {off['pcie_gbs']:.0f} GB/s, host DRAM {off['host_dram_gbs_per_gpu']:.0f} GB/s per GPU"
    )


@offload_app.command("plan")
@user_errors
@with_catalogs
def offload_plan(scenario: str = ScenarioArg, json_out: bool = JsonOpt, profile: Optional[str] = ProfileOpt):
    """Per-subgroup placement of the optimizer update; iteration time without offload, ZeRO-Offload,
    interleaved."""
    from clustersim.simulator import simulate

    s = _load(scenario)
    results: dict[str, dict] = {}
    interleaved = None
    for mode in ("none", "zero", "interleaved"):
        try:
            # without offload there is no offloaded gradient path: its copy mode goes back to the default
            reset = {"training.offload.gradient_copy": None} if mode == "none" else {}
            r = simulate(s.with_changes(**{"training.offload.mode": mode, **reset}), profile)
        except InputError as exc:
            if mode == "interleaved" or "does not fit" not in exc.message:
                raise
            results[mode] = {"fits": False, "why": exc.message}
            continue
        results[mode] = {
            "fits": True,
            "iteration_time_s": r.iteration_time,
            "samples_per_s": r.samples_per_s,
            "breakdown_s": r.breakdown,
            "gpu_memory_bytes": r.memory["total"],
        }
        if mode == "interleaved":
            interleaved = r
    off = interleaved.extra["offload"]
    if json_out:
        emit_json({"scenario": s.name, "modes": results, "placement": off})
        return
    console.print(
        f"[bold]{s.name}[/]: {s.workload.model or 'custom'} on {s.cluster.world_size} x "
        f"{s.cluster.gpu_name}, optimizer {s.training.optimizer}"
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
        console.print(
            table(
                "Plans checked (the fastest is kept)",
                ["plan", "iteration ms"],
                [[k, _ms(v)] for k, v in off["candidates"].items()]
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
        ("zero", "ZeRO-Offload (all updates on the CPU)"),
        ("interleaved", "interleaved offload"),
    ):
        m = results[mode]
        if not m["fits"]:
            rows.append([label, "does not fit", "-", "-", m["why"].split(":")[0]])
            continue
        b = m["breakdown_s"]
        rows.append(
            [
                label,
                _ms(m["iteration_time_s"]),
                _ms(b["backward"]),
                _ms(b["exposed_host"] + b["exposed_transfer"] + b["optimizer"]),
                format_bytes(m["gpu_memory_bytes"]),
            ]
        )
    console.print(
        table(
            "Offload modes compared",
            ["mode", "iteration ms", "backward ms", "update (exposed) ms", "GPU memory"],
            rows,
        )
    )
    if base:
        console.print(
            f"interleaved is {base / results['interleaved']['iteration_time_s']:.2f}x faster than "
            "ZeRO-Offload"
        )
    plain = results["none"]
    if plain["fits"] and plain["iteration_time_s"] < results["interleaved"]["iteration_time_s"]:
        # the line above alone read as a recommendation to offload where nothing needs it
        console.print(
            f"no offload is {results['interleaved']['iteration_time_s'] / plain['iteration_time_s']:.2f}x "
            "faster than interleaved: the optimizer state fits in GPU memory, so offload only frees "
            "memory here"
        )
