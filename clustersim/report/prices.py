"""What a configuration costs per hour: GPU rent plus the network it needs, amortised.

GPUs are priced per GPU-hour (catalogs/prices.yaml, a catalog entry's own price, or --price). The
network is priced as bought: per node port a NIC, a cable and a leaf port, and for each tier above
the leaves, per node port, (an uplink port, a spine port and a cable) / that tier's oversubscription,
all at the NIC's line rate (catalogs/network_prices.yaml), spread evenly over the amortisation period
stated there. That is what makes a faster NIC cost more: without it 25 and 100 GbE cost the same
and the faster one always wins.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from clustersim.errors import InputError
from clustersim.io import load_yaml

NETWORK_CATALOG = "network_prices.yaml"


def default_prices() -> dict[str, float]:
    return load_yaml(resources.files("clustersim.catalogs").joinpath("prices.yaml").read_text())


def gpu_price(gpu: str, price: float | None = None) -> float | None:
    """USD per GPU-hour: ``price`` when given, else the GPU's catalog entry, else prices.yaml; None when
    none of them prices it."""
    if price is not None:
        if price <= 0:
            raise InputError(f"price per GPU-hour must be positive, got {price}", key="--price")
        return price
    from clustersim import catalog

    try:
        own = catalog.gpu(gpu).price_per_gpu_hour  # a user catalog's entry may carry its price
    except InputError:
        own = None
    return own if own is not None else default_prices().get(gpu)


def price_of(gpu: str, price: float | None) -> float:
    found = gpu_price(gpu, price)
    if found is None:
        raise InputError(
            f"no default price for {gpu}; pass --price, or give its catalog entry price_per_gpu_hour",
            key="--price",
        )
    return found


def network_catalog(path: str | None = None) -> dict[str, Any]:
    """The shipped network price catalog, or a copy with the user's quotes (``path``)."""
    if path is None:
        text, source = (
            resources.files("clustersim.catalogs").joinpath(NETWORK_CATALOG).read_text(),
            NETWORK_CATALOG,
        )
    else:
        if not Path(path).is_file():
            raise InputError("no such file", source=str(path), key="--network-prices")
        text, source = Path(path).read_text(), str(path)
    data = load_yaml(text)
    if not isinstance(data, dict):
        raise InputError("expected a mapping like catalogs/network_prices.yaml", source=source)
    for key in ("amortisation_years", "hours_per_year"):
        value = data.get(key)
        if not isinstance(value, int | float) or value <= 0:
            raise InputError(f"{key} must be a positive number", source=source, key=key)
    for kind in ("ethernet_tcp", "infiniband"):
        for rate, parts in (data.get(kind) or {}).items():
            for part in ("nic", "switch_port", "cable"):
                value = (parts or {}).get(part)
                if not isinstance(value, int | float) or value < 0:
                    raise InputError(
                        f"{part} must be a price in USD (a number >= 0)",
                        source=source,
                        key=f"{kind}.{rate}.{part}",
                    )
    data["source"] = source
    return data


def port_prices(kind: str, gbps: float, catalog: dict[str, Any]) -> dict[str, float]:
    """The parts of one port at ``gbps``: the catalog's entry at that rate, else the next faster one
    (what one buys for it)."""
    table = catalog.get(kind) or {}
    faster = sorted(float(r) for r in table if float(r) >= gbps - 1e-9)
    if not faster:
        rates = ", ".join(f"{float(r):g}" for r in sorted(table, key=float)) or "none"
        raise InputError(
            f"no network price for {kind} at {gbps:g} Gb/s (priced: {rates} Gb/s); add it to a copy of "
            f"{NETWORK_CATALOG} and pass --network-prices, or --network-prices none",
            source=catalog["source"],
            key=kind,
        )
    return next(v for r, v in table.items() if float(r) == faster[0])


def network_capex_per_node(cluster: dict[str, Any], catalog: dict[str, Any]) -> float:
    """USD of network bought per node: per NIC port a NIC, a cable and a leaf port; per tier above,
    (uplink port + spine port + cable) / oversubscription. No network on a single node."""
    if cluster["nodes"] <= 1:
        return 0.0
    nic, fabric = cluster["nic"], cluster.get("fabric") or {}
    p = port_prices(nic["kind"], float(nic["line_rate_gbps"]), catalog)
    per_port = p["nic"] + p["cable"] + p["switch_port"]
    if fabric.get("kind") == "leaf_spine":
        share = 1.0 / float(fabric.get("oversubscription", 1.0))
        per_port += share * (2 * p["switch_port"] + p["cable"])
        if fabric.get("leaves_per_pod"):
            share /= float(fabric.get("core_oversubscription", 1.0))
            per_port += share * (2 * p["switch_port"] + p["cable"])
    return nic["count"] * per_port


def network_per_node_hour(cluster: dict[str, Any], catalog: dict[str, Any] | None) -> float:
    """The network's capex per node and hour over the catalog's amortisation period (0 without one)."""
    if catalog is None:
        return 0.0
    hours = catalog["amortisation_years"] * catalog["hours_per_year"]
    return network_capex_per_node(cluster, catalog) / hours


def network_note(catalog: dict[str, Any] | None) -> str:
    if catalog is None:
        return "network not priced (--network-prices none)"
    return (
        f"network (NIC, switch ports, cables per node and tier) amortised over "
        f"{catalog['amortisation_years']:g} years ({catalog['source']})"
    )
