"""`clustersim hardware|models|topology|presets`: look at the catalogs and a scenario's cluster."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from clustersim.commands.support import (
    JsonOpt,
    ScenarioArg,
    console,
    emit_json,
    table,
    user_errors,
    with_catalogs,
)
from clustersim.commands.support import load_scenario_ref as _load
from clustersim.errors import InputError
from clustersim.units import format_bytes

hardware_app = typer.Typer(help="The GPU catalog.", no_args_is_help=True)
models_app = typer.Typer(
    help="The model catalog (parameters, FLOPs computed from the architecture).", no_args_is_help=True
)
topology_app = typer.Typer(help="Inspect a scenario's cluster topology.", no_args_is_help=True)
presets_app = typer.Typer(help="Shipped scenarios for published clusters.", no_args_is_help=True)


@hardware_app.command("list")
@user_errors
@with_catalogs
def hardware_list(json_out: bool = JsonOpt):
    """List the GPUs in the catalog."""
    from clustersim import catalog

    gpus = catalog.gpus()
    if json_out:
        emit_json({n: g.model_dump() for n, g in gpus.items()})
        return
    rows = [
        [
            n,
            _plain(g.peak_tflops.get("fp16", g.peak_tflops["fp32"])),
            _plain(g.peak_tflops.get("bf16", "-")),
            _plain(g.hbm_gbs),
            _plain(g.memory_gib),
            f"{g.nvlink.links} x {_plain(g.nvlink.gbs_per_link)}",
            g.pcie_gen,
        ]
        for n, g in gpus.items()
    ]
    console.print(
        table(
            "GPUs",
            ["name", "fp16 TFLOP/s", "bf16 TFLOP/s", "HBM GB/s", "GiB", "NVLink (GB/s)", "PCIe gen"],
            rows,
        )
    )


@hardware_app.command("show")
@user_errors
@with_catalogs
def hardware_show(name: str = typer.Argument(..., help="GPU name, e.g. H100-SXM"), json_out: bool = JsonOpt):
    """Show one GPU's properties."""
    from clustersim import catalog

    g = catalog.gpu(name)
    if json_out:
        emit_json(g.model_dump())
        return
    from clustersim.report.prices import gpu_price

    console.print(f"[bold]{g.name}[/]: {g.description}")
    for k, v in g.model_dump(exclude={"name", "description", "price_per_gpu_hour"}).items():
        console.print(f"  {k}: {_plain(v)}", highlight=False)
    price = gpu_price(g.name)
    where = (
        "this catalog entry"
        if g.price_per_gpu_hour is not None
        else "catalogs/prices.yaml, on-demand: the rented rate where no instance sells it"
    )
    console.print(
        f"  price_per_gpu_hour: {price:g} USD ({where})"
        if price is not None
        else "  price_per_gpu_hour: not priced (plan/report --price, or price_per_gpu_hour in a catalog)",
        highlight=False,
    )
    for line in _cost_lines(g.name):
        console.print(f"  {line}", highlight=False, markup=False)


def _cost_lines(gpu: str) -> list[str]:
    """What the two cost models know of a GPU: its server (owned) and the instances that sell it (rented)."""
    from clustersim.report.costing import load_instances, load_ownership

    server = load_ownership()["servers"].get(gpu)
    owned = (
        f"owned: ${server['price']:,.0f} per {server['gpus']:g}-GPU server, {server['power_kw']:g} kW "
        f"(ownership.yaml: {server['source']})"
        if server
        else "owned: no server price (ownership.yaml); plan/report price it as rented"
    )
    sold = [i for i in load_instances().values() if i["gpu"] == gpu]
    rented = [
        f"rented: {i['name']} ({i['provider']}) ${i['price_per_hour']:,.2f}/h for {i['gpus']} GPUs, "
        f"network {i['network_as_sold']}"
        for i in sorted(sold, key=lambda i: i["price_per_hour"] / i["gpus"])
    ] or ["rented: no instance sells it (instances.yaml)"]
    return [owned, *rented]


def _plain(value) -> str:
    """A catalog value as a reader writes it: ``fp16 989.4, bf16 989.4`` rather than a Python dict, numbers
    with thousands separators; unset entries left out."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {_plain(v)}" for k, v in value.items() if v is not None) or "—"
    if isinstance(value, list | tuple):
        return ", ".join(_plain(v) for v in value)
    if value is None:
        return "—"  # unset (a user catalog's GPU without cuda_name), not "None"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:,}"  # 3,350.0 GB/s as every other table writes it, not 3350.0
    return str(value)


@models_app.command("list")
@user_errors
@with_catalogs
def models_list(json_out: bool = JsonOpt):
    """List catalog models with parameter counts computed from their architectures."""
    from clustersim import catalog
    from clustersim.scenario import WorkloadSpec
    from clustersim.workloads import build_workload

    rows = []
    for name, arch in catalog.models().items():
        w = build_workload(WorkloadSpec(model=name, micro_batch=1))
        rows.append(
            {
                "name": name,
                "family": arch.family,
                "params": w.params,
                "forward_gflops_per_sample": w.forward_flops / 1e9,
                "default_seq_len": w.seq_len,
            }
        )
    if json_out:
        emit_json(rows)
        return
    console.print(
        table(
            "Models",
            ["name", "family", "parameters (M)", "fwd GFLOP/sample", "seq"],
            [
                [
                    r["name"],
                    r["family"],
                    f"{r['params'] / 1e6:,.1f}",
                    f"{r['forward_gflops_per_sample']:,.1f}",
                    r["default_seq_len"],
                ]
                for r in rows
            ],
        )
    )


@models_app.command("show")
@user_errors
@with_catalogs
def models_show(
    name: str = typer.Argument(..., help="Model name, e.g. BERT-Large"),
    micro_batch: int = typer.Option(
        1, "--micro-batch", min=1, help="Samples per GPU per step, for FLOPs and activations."
    ),
    seq_len: Optional[int] = typer.Option(
        None, "--seq-len", min=1, help="Sequence length of transformers (default: the model's)."
    ),
    json_out: bool = JsonOpt,
):
    """Show a model's layers: parameters, forward FLOPs and saved activations per micro-batch."""
    from clustersim import catalog
    from clustersim.scenario import workload_for_command
    from clustersim.workloads import build_workload

    arch = catalog.model(name)
    w = build_workload(workload_for_command(name, {"--micro-batch": micro_batch, "--seq-len": seq_len}))
    layers = [
        {
            "layer": layer.name,
            "params": layer.params,
            "forward_gflops": layer.forward_flops / 1e9,
            "activation_bytes": layer.activation_bytes,
        }
        for layer in w.layers
    ]
    if json_out:
        emit_json({"name": name, "architecture": arch.model_dump(), "params": w.params, "layers": layers})
        return
    console.print(
        f"[bold]{name}[/]: {arch.description}; {w.params:,} parameters; micro-batch {micro_batch}, seq "
        f"{w.seq_len}"
    )
    console.print(
        table(
            "Layers",
            ["layer", "params", "fwd GFLOP", "activations"],
            [
                [
                    row["layer"],
                    f"{row['params']:,}",
                    f"{row['forward_gflops']:,.2f}",
                    format_bytes(row["activation_bytes"]),
                ]
                for row in layers
            ],
        )
    )


@topology_app.command("show")
@user_errors
@with_catalogs
def topology_show(scenario: str = ScenarioArg, json_out: bool = JsonOpt):
    """Nodes, link kinds and bandwidths, and the bottleneck link of each collective group."""
    from clustersim.topologies import GroupShape, build_cluster

    s = _load(scenario)
    cl = build_cluster(s.cluster)
    c = s.cluster
    groups = {}
    if cl.gpu.dies_per_package == 2 and c.gpus_per_node >= 2:
        groups["GCD pair (one package's two dies)"] = GroupShape(1, 2)
    groups["intra-node (one node's GPUs)"] = GroupShape(1, c.gpus_per_node)
    if c.nodes > 1:
        groups["inter-node rail (one GPU per node)"] = GroupShape(c.nodes, 1)
        groups["world (all GPUs)"] = GroupShape(c.nodes, c.gpus_per_node)
    info = cl.describe()
    info["groups"] = {
        name: {
            "ranks": g.ranks,
            "ring_busbw_gbs": cl.ring(g).bytes_per_s / 1e9,
            "bottleneck": cl.ring(g).bottleneck,
        }
        for name, g in groups.items()
    }
    if json_out:
        emit_json(info)
        return
    console.print(
        f"[bold]{s.name}[/]: {c.nodes} nodes x {c.gpus_per_node} {cl.gpu.name} = {c.world_size} GPUs, "
        f"intra-node {c.intra_node.fabric}, {c.nic.count} x {c.nic.kind} NIC, fabric {c.fabric.kind}"
    )
    console.print(
        table(
            "Links inside one node (full duplex)",
            ["kind", "directed edges", "GB/s per direction", "hop µs"],
            [
                [
                    k,
                    v["directed_edges_per_node"],
                    ", ".join(map(str, v["gbs_per_direction"])),
                    f"{v['hop_latency_us']:.1f}",
                ]
                for k, v in info["link_kinds"].items()
            ],
        )
    )
    console.print(
        f"NIC: {info['nic']['gbs_each']:.3f} GB/s each "
        f"({'measured' if info['nic']['measured'] else 'line rate x efficiency'})"
    )
    console.print(
        table(
            "Collective groups",
            ["group", "ranks", "ring busbw GB/s", "bottleneck"],
            [
                [n, g["ranks"], f"{g['ring_busbw_gbs']:.2f}", g["bottleneck"]]
                for n, g in info["groups"].items()
            ],
        )
    )


@presets_app.command("list")
@user_errors
def presets_list(json_out: bool = JsonOpt):
    """List shipped scenarios (use as preset:NAME)."""
    from importlib import resources

    from clustersim.io import load_yaml

    # The files' own descriptions, without validating every preset (each is validated when used).
    folder = resources.files("clustersim.catalogs").joinpath("presets")
    files = sorted((p for p in folder.iterdir() if p.name.endswith(".yaml")), key=lambda p: p.name)
    rows = [(p.name[:-5], (load_yaml(p.read_text()) or {}).get("description", "")) for p in files]
    if json_out:
        emit_json([{"name": n, "description": d} for n, d in rows])
        return
    console.print(
        table(
            "Presets (use as preset:NAME)",
            ["name", "description"],
            [list(r) for r in rows],
            justify_numbers=False,
        )
    )


@presets_app.command("show")
@user_errors
def presets_show(
    name: str = typer.Argument(
        ..., help="A preset's name, as `presets list` gives it (preset: in front is fine)."
    ),
    json_out: bool = JsonOpt,
):
    """Print a shipped scenario: its file as shipped, with the comments that say where each setting comes
    from (copy it to start your own), or with --json every key with its default filled in."""
    from clustersim.scenario import PRESET_PREFIX, load_scenario, preset_text

    name = name.removeprefix(PRESET_PREFIX)
    scenario = load_scenario(PRESET_PREFIX + name)  # an unknown name is one line with the known ones
    if json_out:
        emit_json(scenario.model_dump(mode="json"))
        return
    text = preset_text(name)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


@models_app.command("import")
@user_errors
def models_import(
    config: Path = typer.Argument(..., help="A Hugging Face transformer config.json."),
    name: Optional[str] = typer.Option(
        None, "--name", help="Name of the entry (default: the config's _name_or_path, else its folder)."
    ),
    out: Optional[Path] = typer.Option(
        None,
        "--out",
        help="User models file to add the entry to (created if missing; an existing name is refused); "
        "load it with --catalog FILE. Default: print the entry.",
    ),
    json_out: bool = JsonOpt,
):
    """Make a model entry (layers, hidden, heads, ffn, vocab, style) from a Hugging Face config.json."""
    from clustersim import catalog
    from clustersim.io import shown_key
    from clustersim.model_import import (
        append_entry,
        arch_from_hf_config,
        default_name,
        entry_yaml,
        read_hf_config,
    )
    from clustersim.scenario import WorkloadSpec
    from clustersim.workloads import build_workload

    cfg = read_hf_config(config)
    entry = arch_from_hf_config(cfg, str(config))
    name = name or default_name(cfg, config)
    if shown_key(name) != name:  # a catalog refuses such a name when it is read back
        raise InputError(
            "not a name a catalog accepts (letters, digits and _ . + - / ( ) or spaces, at most 64)",
            key="--name",
        )
    catalog.check_model_name(name, key="--name")
    with catalog.user_entries(models={name: catalog.TransformerArch(**entry)}):
        params = build_workload(WorkloadSpec(model=name, micro_batch=1)).params
    if out is not None:
        append_entry(out, name, entry, config)
    if json_out:
        emit_json({"name": name, "entry": entry, "params": params, "out": str(out) if out else None})
        return
    if out is None:  # plain text: a file the user can redirect, never wrapped
        typer.echo(entry_yaml(name, entry) + f"# {name}: {params:,} parameters")
    else:
        console.print(f"{name} ({params:,} parameters) added to {out}; use it with --catalog {out}")
