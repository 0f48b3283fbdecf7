"""What a configuration costs per hour: GPU rent plus the network it needs, amortised.

GPUs are priced per GPU-hour (catalogs/prices.yaml, a catalog entry's own price, or --price). The
network is priced as bought: per node port a NIC, a cable and a leaf port, and for each tier above
the leaves, per node port, (an uplink port, a spine port and a cable) / that tier's oversubscription,
all at the NIC's line rate (catalogs/network_prices.yaml), spread evenly over the amortisation period
stated there. That is what makes a faster NIC cost more: without it 25 and 100 GbE cost the same
and the faster one always wins.
"""

from __future__ import annotations

import math
from importlib import resources
from typing import Any

from clustersim.errors import InputError
from clustersim.io import load_yaml, parse_yaml, read_input_text

NETWORK_CATALOG = "network_prices.yaml"
NETWORK_PARTS = ("nic", "switch_port", "cable")
NETWORK_KINDS = ("ethernet_tcp", "infiniband")
# Bounds that catch a typo or a unit slip (cents for dollars, an extra zero run), not a judgement of a
# quote. A part's price: a whole 64-port 400 Gb/s InfiniBand switch is about $36,000
# (network_prices.yaml [B]), so one NIC, switch port or cable above $100,000 is no price of one part.
MOST_PART_USD = 100_000.0
HOURS_IN_A_LEAP_YEAR = 366 * 24  # hours_per_year can be no more
# amortisation periods: servers and network gear are written off over 3-6 years; 30 allows any
# accounting choice and refuses 1e9 (which would price the hardware at nothing)
MOST_AMORTISATION_YEARS = 30.0


def amortisation_terms(data: dict[str, Any], source: str) -> tuple[float, float]:
    """A price catalog's ``amortisation_years`` and ``hours_per_year``, checked as every catalog that
    amortises a purchase checks them (the network's and the servers' alike)."""
    years = catalog_number(
        data.get("amortisation_years"),
        source,
        "amortisation_years",
        most=MOST_AMORTISATION_YEARS,
        why_most="servers and network gear are written off over 3-6 years",
    )
    hours = catalog_number(
        data.get("hours_per_year"),
        source,
        "hours_per_year",
        most=HOURS_IN_A_LEAP_YEAR,
        why_most="the hours in a leap year",
    )
    return years, hours


def catalog_number(
    value: Any,
    source: str,
    key: str,
    *,
    low: float = 0.0,
    strict: bool = True,
    most: float | None = None,
    why_most: str = "",
) -> float:
    """``value`` as a finite number above ``low`` (at least ``low`` when not ``strict``) and at most
    ``most``; else one error naming the file and key. NaN and infinity are refused: a price of .nan would
    print "$nan" and break every comparison after it."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= low if strict else value < low):
        rel = ">" if strict else ">="
        raise InputError(f"must be a finite number {rel} {low:g}, got {value!r}", source=source, key=key)
    if most is not None and value > most:
        why = f" ({why_most})" if why_most else ""
        raise InputError(f"{value:g} is implausible: at most {most:,.0f}{why}", source=source, key=key)
    return float(value)


def only_known_keys(data: dict, known, source: str, prefix: str | None = None) -> None:
    """Refuse a key the catalog does not read (a misspelt one would otherwise be silently ignored)."""
    for key in data:
        if key not in known:
            where = f"{prefix}.{key}" if prefix else str(key)
            raise InputError(f"unknown key; expected one of: {', '.join(known)}", source=source, key=where)


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
        try:
            text, source = read_input_text(path), str(path)
        except InputError as exc:
            raise exc.located(key_prefix="--network-prices") from None
    data = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise InputError("expected a mapping like catalogs/network_prices.yaml", source=source)
    only_known_keys(data, ("amortisation_years", "hours_per_year", *NETWORK_KINDS), source)
    data["amortisation_years"], data["hours_per_year"] = amortisation_terms(data, source)
    for kind in NETWORK_KINDS:
        table = data.get(kind) or {}
        if not isinstance(table, dict):
            raise InputError("expected a mapping of line rate (Gb/s) to prices", source=source, key=kind)
        checked = {}
        for rate, parts in table.items():
            key = f"{kind}.{rate}"
            if isinstance(rate, str):  # YAML reads `25:` as a number; a quoted "25" is fine too
                try:
                    rate_value = float(rate)
                except ValueError:
                    rate_value = None
            else:
                rate_value = rate
            try:
                catalog_number(rate_value if rate_value is not None else rate, source, key)
            except InputError:
                raise InputError(
                    f"a line rate must be a number of Gb/s > 0 (e.g. 25: or 100:), got {rate!r}",
                    source=source,
                    key=key,
                ) from None
            if not isinstance(parts, dict):
                raise InputError(
                    f"expected a mapping of {', '.join(NETWORK_PARTS)} to USD", source=source, key=key
                )
            only_known_keys(parts, NETWORK_PARTS, source, key)
            checked[rate] = {
                part: catalog_number(
                    parts.get(part),
                    source,
                    f"{key}.{part}",
                    strict=False,
                    most=MOST_PART_USD,
                    why_most="a whole 64-port 400 Gb/s switch is about $36,000",
                )
                for part in NETWORK_PARTS
            }
        data[kind] = checked
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
