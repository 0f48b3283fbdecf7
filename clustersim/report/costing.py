"""What a cluster costs per hour of training, by one of two whole cost models.

``rent``: N cloud instances of one type (catalogs/instances.yaml). The instance's price per hour buys
its GPUs and the network it is sold with, so nothing is added for the network. ``own``: total cost of
ownership (catalogs/ownership.yaml): the servers and their network (network_prices.yaml, per port and
tier) bought and amortised over the catalog's years at its utilisation, plus power at the node's draw x
PUE x $/kWh. The two are never mixed: a row says which model priced it (``basis``).

Each figure carries an uncertainty (a +- fraction read as its P10-P90 half-width on a log scale); a
price's ``sigma`` is the log-space standard deviation of the hourly price those give (the parts'
shares weight them), and ``cost_band`` combines it with a time-to-train band.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from clustersim.errors import InputError
from clustersim.io import parse_yaml, read_input_text
from clustersim.report.prices import (
    amortisation_terms,
    catalog_number,
    network_capex_per_node,
    network_catalog,
    only_known_keys,
)

Z90 = 1.2815515655446004  # the standard normal's P90: a P10-P90 half-width of z sigmas
INSTANCES = "instances.yaml"
OWNERSHIP = "ownership.yaml"
NETWORK_UNCERTAINTY = 0.5  # network_prices.yaml: "treat every figure as +-50%"
DEFAULT_RENT_UNCERTAINTY = 0.1  # a planning assumption for a dated list price (instances.yaml says why)
MODELS = ("own", "rent")
# Bounds that catch a typo or a unit slip in a user's copy, not a judgement of a quote. The dearest server
# in ownership.yaml, a DGX B200, is $505,400 for 8 GPUs (about $63,000 per GPU); $1,000,000 per GPU is
# far above any server sold. The dearest instance in instances.yaml is $98.32/h for 8 H100 (about $12
# per GPU-hour); $1,000 per GPU-hour is far above any list price.
MOST_SERVER_USD_PER_GPU = 1_000_000.0
MOST_RENT_USD_PER_GPU_HOUR = 1_000.0
INSTANCE_KEYS = (
    "gpu",
    "gpus",
    "nic",
    "price_per_hour",
    "uncertainty",
    "max_instances",
    "provider",
    "region",
    "network_as_sold",
    "source",
    "date",
)
SERVER_KEYS = ("gpus", "price", "uncertainty", "power_kw", "power_uncertainty", "source")


def sigma_of(uncertainty: float) -> float:
    """The log-space standard deviation of a figure whose P10-P90 is value / (1+u) .. value x (1+u)."""
    return math.log1p(uncertainty) / Z90


@dataclass(frozen=True)
class Price:
    """One cluster's price per hour of training under one model, with its parts and where it came from."""

    model: str  # "rent" or "own"
    per_hour: float  # USD per hour, the whole cluster
    parts: dict[str, float]  # USD per hour: rent | servers, network, power
    sigma: float  # log-space standard deviation of per_hour
    basis: str  # how it was priced, without the run's hours
    capital: float = 0.0  # own: USD bought (servers + network); rent: 0
    warning: str | None = None  # rent: the simulated network is not the instance's
    extra: dict[str, Any] = field(default_factory=dict)
    # the basis without what grows with the cluster (capital, the instances' count), the same for every
    # size of one cluster: compare says it once, the figures per size in its table; None: the basis
    common: str | None = None

    def describe(self, hours: float) -> str:
        """What a run of ``hours`` costs and why, in one phrase: "rented at $55.04/h x 16 p5.48xlarge ..."
        or "owned: $A of $C capital amortised over N years at U% utilisation + $B power"."""
        if self.model == "rent":
            return self.basis
        e = self.extra
        share = (self.parts["servers"] + self.parts["network"]) * hours
        return (
            f"owned: ${share:,.0f} of ${self.capital:,.0f} capital amortised over {e['years']:g} years at "
            f"{100 * e['utilisation']:.0f}% utilisation + ${self.parts['power'] * hours:,.0f} power "
            f"({e['power_note']})"
        )


def cost_band(cost: float, sigma: float, ttt_ratio_lo: float | None, ttt_ratio_hi: float | None):
    """P10 and P90 of a run's cost: the price's log-normal spread and the time band's (its P10/P90 over
    the central time), taken as independent and added in quadrature on each side of the log scale."""
    z = Z90 * sigma
    lo = math.log(ttt_ratio_lo) if ttt_ratio_lo else 0.0
    hi = math.log(ttt_ratio_hi) if ttt_ratio_hi else 0.0
    return cost * math.exp(-math.hypot(min(lo, 0.0), z)), cost * math.exp(math.hypot(max(hi, 0.0), z))


def _number(value, source, key, *, low: float = 0.0, strict: bool = True, most=None, why_most="") -> float:
    return catalog_number(value, source, key, low=low, strict=strict, most=most, why_most=why_most)


def _text(name: str, path: str | None) -> tuple[str, str]:
    if path is None:
        return resources.files("clustersim.catalogs").joinpath(name).read_text(), name
    return read_input_text(path), str(path)


def _mapping(data, source: str, key: str | None = None) -> dict:
    if not isinstance(data, dict):
        raise InputError("expected a mapping", source=source, key=key)
    return data


def load_instances(path: str | None = None) -> dict[str, dict[str, Any]]:
    """The instance catalog (or a copy with the user's prices), every entry checked."""
    from clustersim import catalog

    text, source = _text(INSTANCES, path)
    data = _mapping(parse_yaml(text, source), source)
    table = _mapping(data.get("instances"), source, "instances")
    out = {}
    for name, entry in table.items():
        key = f"instances.{name}"
        entry = _mapping(entry, source, key)
        only_known_keys(entry, INSTANCE_KEYS, source, key)
        for text in ("provider", "region", "network_as_sold"):
            if not isinstance(entry.get(text), str) or not entry[text].strip():
                raise InputError("must be given, as text", source=source, key=f"{key}.{text}")
        gpu = entry.get("gpu")
        try:
            catalog.gpu(str(gpu))
        except InputError as exc:
            raise InputError(exc.message, source=source, key=f"{key}.gpu") from None
        nic = _mapping(entry.get("nic"), source, f"{key}.nic")
        only_known_keys(nic, ("kind", "count", "line_rate_gbps"), source, f"{key}.nic")
        if nic.get("kind") not in ("ethernet_tcp", "infiniband"):
            raise InputError(
                f"must be ethernet_tcp or infiniband, got {nic.get('kind')!r}",
                source=source,
                key=f"{key}.nic.kind",
            )
        gpus = _number(entry.get("gpus"), source, f"{key}.gpus")
        count = _number(nic.get("count"), source, f"{key}.nic.count")
        for whole, k in ((gpus, "gpus"), (count, "nic.count")):
            if whole != int(whole):
                raise InputError(f"must be a whole number, got {whole:g}", source=source, key=f"{key}.{k}")
        most = entry.get("max_instances")
        out[str(name)] = {
            **entry,
            "name": str(name),
            "gpu": str(gpu),
            "gpus": int(gpus),
            "nic": {
                "kind": nic["kind"],
                "count": int(count),
                "line_rate_gbps": _number(nic.get("line_rate_gbps"), source, f"{key}.nic.line_rate_gbps"),
            },
            "price_per_hour": _number(
                entry.get("price_per_hour"),
                source,
                f"{key}.price_per_hour",
                most=MOST_RENT_USD_PER_GPU_HOUR * gpus,
                why_most=f"${MOST_RENT_USD_PER_GPU_HOUR:,.0f} per GPU-hour; the dearest listed is about $12",
            ),
            "uncertainty": _number(
                entry.get("uncertainty", DEFAULT_RENT_UNCERTAINTY), source, f"{key}.uncertainty", strict=False
            ),
            "max_instances": None if most is None else int(_number(most, source, f"{key}.max_instances")),
            "source": str(entry.get("source") or source),
            "date": str(entry.get("date") or "undated"),
        }
    if not out:
        raise InputError("lists no instances", source=source, key="instances")
    return out


def load_ownership(path: str | None = None) -> dict[str, Any]:
    """The ownership catalog (or a copy with the user's figures), every entry checked."""
    text, source = _text(OWNERSHIP, path)
    data = _mapping(parse_yaml(text, source), source)
    only_known_keys(
        data, ("amortisation_years", "hours_per_year", "utilisation", "pue", "usd_per_kwh", "servers"), source
    )
    out: dict[str, Any] = {"source": source}
    out["amortisation_years"], out["hours_per_year"] = amortisation_terms(data, source)
    out["utilisation"] = _number(data.get("utilisation"), source, "utilisation")
    if out["utilisation"] > 1:
        raise InputError(f"must be at most 1, got {out['utilisation']:g}", source=source, key="utilisation")
    for key, low in (("pue", 1.0), ("usd_per_kwh", 0.0)):
        entry = _mapping(data.get(key), source, key)
        only_known_keys(entry, ("value", "uncertainty"), source, key)
        out[key] = _number(entry.get("value"), source, f"{key}.value", low=low, strict=key != "pue")
        out[f"{key}_uncertainty"] = _number(
            entry.get("uncertainty", 0.0), source, f"{key}.uncertainty", strict=False
        )
    servers = {}
    for gpu, entry in _mapping(data.get("servers"), source, "servers").items():
        key = f"servers.{gpu}"
        entry = _mapping(entry, source, key)
        only_known_keys(entry, SERVER_KEYS, source, key)
        gpus = _number(entry.get("gpus"), source, f"{key}.gpus")
        servers[str(gpu)] = {
            "gpus": gpus,
            "price": _number(
                entry.get("price"),
                source,
                f"{key}.price",
                strict=False,
                most=MOST_SERVER_USD_PER_GPU * gpus,
                why_most=f"${MOST_SERVER_USD_PER_GPU:,.0f} per GPU; the dearest listed is about $63,000",
            ),
            "uncertainty": _number(entry.get("uncertainty", 0.0), source, f"{key}.uncertainty", strict=False),
            "power_kw": _number(entry.get("power_kw"), source, f"{key}.power_kw", strict=False),
            "power_uncertainty": _number(
                entry.get("power_uncertainty", 0.0), source, f"{key}.power_uncertainty", strict=False
            ),
            "source": str(entry.get("source") or source),
        }
    out["servers"] = servers
    return out


def nic_label(nic: dict[str, Any]) -> str:
    kind = {"ethernet_tcp": "Ethernet", "infiniband": "InfiniBand"}.get(nic.get("kind"), nic.get("kind"))
    count = int(nic.get("count") or 1)
    rate = float(nic.get("line_rate_gbps") or 0)
    return f"{count} x {rate:g} Gb/s {kind}" if count > 1 else f"{rate:g} Gb/s {kind}"


def _same_nic(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        a.get("kind") == b.get("kind")
        and int(a.get("count") or 1) == int(b.get("count") or 1)
        and abs(float(a.get("line_rate_gbps") or 0) - float(b.get("line_rate_gbps") or 0)) < 1e-9
    )


class Rent:
    """N instances of one type; or, with ``per_gpu_hour`` (--price), any GPU at that flat rate."""

    model = "rent"

    def __init__(
        self,
        instances: dict[str, dict],
        instance: str | None = None,
        per_gpu_hour: float | None = None,
        *,
        price_option: bool = True,
    ):
        self.price_option = price_option  # the command has --price (compare has not: cost_model)
        self.owned_prices: dict[str, Any] | None = None  # the ownership catalog, where the command has one
        if per_gpu_hour is not None and not (math.isfinite(per_gpu_hour) and per_gpu_hour > 0):
            raise InputError(f"price per GPU-hour must be positive, got {per_gpu_hour}", key="--price")
        if instance is not None and instance not in instances:
            known = ", ".join(sorted(instances))
            raise InputError(f"unknown instance {instance!r}; known: {known}", key="--instance")
        self.instances, self.instance, self.per_gpu_hour = instances, instance, per_gpu_hour

    def describe(self) -> str:
        if self.per_gpu_hour is not None:
            return f"rented at ${self.per_gpu_hour:g} per GPU-hour (--price), network included"
        only = f" {self.instance}" if self.instance else ""
        why = f" ({self.reason})" if getattr(self, "reason", None) else ""
        return (
            f"rented{why}:{only} instance-hours at the providers' on-demand list prices ({INSTANCES}), each "
            "instance's network included in its price; a GPU no instance sells at its per-GPU-hour rate "
            "(its catalog entry, else prices.yaml)"
        )

    def sold_for(self, gpu: str, nodes: int = 1) -> list[dict[str, Any]]:
        """The instances that sell ``gpu`` and may be rented ``nodes`` at a time, cheapest per GPU first."""
        rows = [
            i
            for i in self.instances.values()
            if i["gpu"] == gpu and (i["max_instances"] is None or nodes <= i["max_instances"])
        ]
        return sorted(rows, key=lambda i: (i["price_per_hour"] / i["gpus"], i["name"]))

    def choose(self, cluster: dict[str, Any]) -> dict[str, Any] | None:
        """The instance a cluster is rented as: --instance; else the one selling its GPU with its network;
        else the cheapest selling its GPU."""
        if self.instance is not None:
            inst = self.instances[self.instance]
            if inst["gpu"] != cluster["gpu"]:
                raise InputError(
                    f"{inst['name']} sells {inst['gpu']}, not {cluster['gpu']}", key="--instance"
                )
            return inst
        sold = self.sold_for(cluster["gpu"], int(cluster["nodes"]))
        same = [i for i in sold if _same_nic(i["nic"], cluster.get("nic") or {})]
        return (same or sold or [None])[0]

    def price(self, cluster: dict[str, Any]) -> Price:
        gpus = int(cluster["nodes"]) * int(cluster["gpus_per_node"])
        if self.per_gpu_hour is not None:
            rate = self.per_gpu_hour
            return Price(
                "rent",
                gpus * rate,
                {"rent": gpus * rate},
                0.0,
                f"rented at ${rate:g} per GPU-hour (--price), network included",
            )
        inst = self.choose(cluster)
        if inst is None:
            rate = _per_gpu_hour(cluster["gpu"])  # a catalog entry's price_per_gpu_hour, else prices.yaml
            if rate is None:
                gpu = cluster["gpu"]
                ways = ["add one to a copy (--instances FILE)"]
                if self.price_option:
                    ways.append("give --price USD per GPU-hour")
                ways.append(f"give {gpu} a price_per_gpu_hour in a user catalog (--catalog)")
                owned = self.owned_prices is not None and gpu in self.owned_prices["servers"]
                ways.append(
                    "price it as owned (--cost own)"
                    if owned
                    else "price it as owned with its server price in a copy of ownership.yaml "
                    "(--cost own --own-prices FILE)"
                )
                raise InputError(
                    f"no instance in {INSTANCES} sells {gpu}; {', '.join(ways[:-1])}, or {ways[-1]}",
                    key="--cost",
                )
            return Price(
                "rent",
                gpus * rate,
                {"rent": gpus * rate},
                sigma_of(DEFAULT_RENT_UNCERTAINTY),
                f"rented at ${rate:g} per GPU-hour ({rate_source(cluster['gpu'])}), network included",
            )
        n = -(-gpus // inst["gpus"])
        per_hour = n * inst["price_per_hour"]
        warning = None
        if not _same_nic(inst["nic"], cluster.get("nic") or {}):
            warning = (
                f"simulated on {nic_label(cluster.get('nic') or {})} per node; {inst['name']} is sold with "
                f"{inst['network_as_sold']}"
            )
        sold = (
            f"{inst['provider']} on-demand, {inst['region']}, price of {_month(inst['date'])}; network "
            f"{inst['network_as_sold']}, included"
        )
        basis = f"rented at ${inst['price_per_hour']:,.2f}/h x {n} {inst['name']} ({sold})"
        return Price(
            "rent",
            per_hour,
            {"rent": per_hour},
            sigma_of(inst["uncertainty"]),
            basis,
            warning=warning,
            common=f"rented as {inst['name']} at ${inst['price_per_hour']:,.2f}/h each ({sold})",
            # simulated on the instance's own network: its rows name that network in the provider's words
            extra={
                "instance": inst["name"],
                "instances": n,
                "network": None if warning else inst["network_as_sold"],
            },
        )


def _month(date: str) -> str:
    """An instance price's date as its month ("November 2026"): when it was read, said as people say it."""
    import datetime

    try:
        return datetime.date.fromisoformat(date).strftime("%B %Y")
    except ValueError:
        return date


def _catalog_entry_price(gpu: str) -> float | None:
    from clustersim import catalog

    try:
        return catalog.gpu(gpu).price_per_gpu_hour
    except InputError:
        return None


def _per_gpu_hour(gpu: str) -> float | None:
    """A GPU's rate per GPU-hour where no instance sells it: its catalog entry's price_per_gpu_hour, else
    prices.yaml's on-demand rate (AWS list prices per GPU, 2024)."""
    from clustersim.report.prices import gpu_price

    return gpu_price(gpu)


def rate_source(gpu: str) -> str:
    return "its catalog entry" if _catalog_entry_price(gpu) is not None else "prices.yaml, on-demand per GPU"


class Own:
    """Bought servers and network amortised over the years at the utilisation, plus power."""

    model = "own"

    def __init__(
        self,
        ownership: dict[str, Any],
        network: dict[str, Any] | None,
        rent: "Rent | None" = None,
    ):
        """``rent``: the rental model the command would use with --cost rent, so that a GPU with no
        server price is sent there only where renting can price it; None where the command has no
        --cost (plan --have)."""
        self.o, self.network, self.rent = ownership, network, rent

    def describe(self) -> str:
        o = self.o
        net = "not priced (--network-prices none)" if self.network is None else self.network["source"]
        return (
            f"owned: servers ({o['source']}) and network ({net}) amortised over {o['amortisation_years']:g} "
            f"years at {100 * o['utilisation']:.0f}% utilisation, plus power at each node's draw x PUE "
            f"{o['pue']:g} x ${o['usd_per_kwh']:g}/kWh"
        )

    def server(self, gpu: str) -> dict[str, Any]:
        entry = self.o["servers"].get(gpu)
        if entry is None:
            priced = ", ".join(sorted(self.o["servers"])) or "none"
            ways = "add it to a copy (--own-prices FILE)"
            if self.rent is not None:
                if self.rent.sold_for(gpu) or _per_gpu_hour(gpu) is not None:
                    ways += " or price it as rented (--cost rent)"
                elif self.rent.price_option:
                    ways += " or price it as rented at your rate (--cost rent --price USD per GPU-hour)"
                else:
                    ways += (
                        " or price it as rented (--cost rent) with an instance selling it (--instances FILE) "
                        "or its price_per_gpu_hour in a user catalog (--catalog)"
                    )
            raise InputError(
                f"no server price for {gpu} in {self.o['source']} (priced: {priced}); {ways}",
                key="--cost" if self.rent is not None else "--own-prices",
            )
        return entry

    def capital(self, cluster: dict[str, Any]) -> tuple[float, float]:
        """USD of servers and of network bought for ``cluster``."""
        nodes = int(cluster["nodes"])
        s = self.server(cluster["gpu"])
        servers = nodes * int(cluster["gpus_per_node"]) / s["gpus"] * s["price"]
        network = 0.0 if self.network is None else nodes * network_capex_per_node(cluster, self.network)
        return servers, network

    def price(self, cluster: dict[str, Any]) -> Price:
        o, s = self.o, self.server(cluster["gpu"])
        life_h = o["amortisation_years"] * o["hours_per_year"] * o["utilisation"]
        servers, network = self.capital(cluster)
        per_node_kw = int(cluster["gpus_per_node"]) / s["gpus"] * s["power_kw"]
        power = int(cluster["nodes"]) * per_node_kw * o["pue"] * o["usd_per_kwh"]
        parts = {"servers": servers / life_h, "network": network / life_h, "power": power}
        total = sum(parts.values())
        sig_power = math.sqrt(
            sigma_of(s["power_uncertainty"]) ** 2
            + sigma_of(o["pue_uncertainty"]) ** 2
            + sigma_of(o["usd_per_kwh_uncertainty"]) ** 2
        )
        spread = {
            "servers": sigma_of(s["uncertainty"]),
            "network": sigma_of(NETWORK_UNCERTAINTY),
            "power": sig_power,
        }
        sigma = math.sqrt(sum((parts[k] / total * spread[k]) ** 2 for k in parts)) if total > 0 else 0.0
        note = f"{per_node_kw:g} kW per node x PUE {o['pue']:g} x ${o['usd_per_kwh']:g}/kWh"
        amortised = (
            f"amortised over {o['amortisation_years']:g} years at {100 * o['utilisation']:.0f}% utilisation "
            f"+ power ({note})"
        )
        basis = f"owned: ${servers + network:,.0f} capital {amortised}"
        return Price(
            "own",
            total,
            parts,
            sigma,
            basis,
            capital=servers + network,
            extra={"years": o["amortisation_years"], "utilisation": o["utilisation"], "power_note": note},
            common=f"owned: each size's capital {amortised}",
        )


def auto_model(
    gpus: set[str],
    price: float | None = None,
    network: Any = "default",
    instance: str | None = None,
    instances: str | None = None,
    own_prices: str | None = None,
    price_option: bool = True,
):
    """The model a command uses when none is asked for: owned, when the ownership catalog prices every
    GPU among ``gpus``; else rented (one model for every row, never a mix), saying which GPU it lacks.
    ``price_option``: as cost_model's."""
    model = cost_model(None, price, network, instance, instances, own_prices, price_option)
    if isinstance(model, Own):
        missing = sorted(g for g in gpus if g not in model.o["servers"])
        if missing:
            rent = Rent(load_instances(instances), price_option=price_option)
            rent.owned_prices = model.o
            rent.reason = f"{model.o['source']} has no server price for {', '.join(missing)}"
            return rent
    return model


def _own_prices_unused(kind_given: bool, price: float | None, instance: str | None) -> str:
    """Why --own-prices is refused: the options that made the run rented, which reads no ownership
    figure (servers, power, amortisation), so the file would be silently unused."""
    why = ["--cost rent"] if kind_given else []
    why += [name for name, value in (("--price", price), ("--instance", instance)) if value is not None]
    verb = "prices" if len(why) == 1 else "price"
    rented = [w for w in why if w != "--cost rent"]
    return (
        f"{_listed(why)} {verb} the run as rented, which reads no ownership figure; drop --own-prices, "
        "or price the run as owned with --cost own" + (f" without {_listed(rented)}" if rented else "")
    )


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def cost_model(
    kind: str | None = None,
    price: float | None = None,
    network: Any = "default",
    instance: str | None = None,
    instances: str | None = None,
    own_prices: str | None = None,
    price_option: bool = True,
    have_cost_option: bool = True,
):
    """The cost model a command asked for: ``kind`` "own" or "rent" (default: "rent" when --price or
    --instance is given, else "own"); ``network`` the network price catalog for owned clusters
    ("default", a path, or None for servers and power only). ``price_option``: whether the command has
    --price (compare has not), and ``have_cost_option`` whether it has --cost (plan --have has not), so
    that a message names only options the user can give and that could work."""
    kind_given = kind is not None
    if kind is None:
        kind = "rent" if price is not None or instance is not None else "own"
    if kind not in MODELS:
        raise InputError(f"must be own or rent, got {kind!r}", key="--cost")
    if kind == "rent":
        if own_prices is not None:  # a rented run reads no ownership figure: the file would go unused
            raise InputError(_own_prices_unused(kind_given, price, instance), key="--own-prices")
        if network not in ("default", None):  # nor a network catalog: a rented network comes with it
            raise InputError(
                "a rented run's network comes with the instance (or inside the flat --price), so nothing "
                "reads a network price catalog: drop --network-prices, or price the run as owned with "
                "--cost own",
                key="--network-prices",
            )
        if price is not None and (instance is not None or instances is not None):
            # a flat --price prices every GPU-hour alike: the instance (catalog) would go unused
            unused = "--instance" if instance is not None else "--instances"
            raise InputError(
                f"--price prices every GPU at one flat rate, so nothing reads {unused}: give one of them",
                key=unused,
            )
        rent = Rent(load_instances(instances), instance, price, price_option=price_option)
        if have_cost_option:
            rent.owned_prices = load_ownership(None)
        return rent
    given = [name for name, value in (("--price", price), ("--instance", instance)) if value is not None]
    if given:
        verb, them = ("prices", "it") if len(given) == 1 else ("price", "them")
        raise InputError(
            f"{' and '.join(given)} {verb} a rented cluster; drop {them} or use --cost rent",
            key="--cost",
        )
    if kind_given and instances is not None:  # an owned run reads no instance price
        raise InputError(
            "--cost own prices servers (the ownership catalog, --own-prices), so nothing reads --instances: "
            "drop it, or price the run as rented with --cost rent",
            key="--instances",
        )
    net = None if network is None else network_catalog(None if network == "default" else str(network))
    rent = Rent(load_instances(instances), price_option=price_option) if have_cost_option else None
    return Own(load_ownership(own_prices), net, rent)


def network_option(value: str | None):
    """``--network-prices`` (or the API's ``network_prices``) as the cost model reads it: None (not given)
    is the shipped catalog ("default"), "none" no network at all (servers and power only), else a path."""
    return "default" if value is None else None if value.strip().lower() == "none" else value


def model_from_options(cost, price, network_prices, instance, instances, own_prices):
    """The cost model plan's and report's options ask for, every file checked before any work; None when
    no option chooses one, so that the command picks (auto_model: owned where every GPU has a server
    price). The CLI and the Python API both call it, so both read the same options the same way."""
    if cost is None and price is None and instance is None and instances is None and own_prices is None:
        return None
    return cost_model(cost, price, network_option(network_prices), instance, instances, own_prices)


def refuse_cost_options_with_have(**given) -> None:
    """`plan --have` prices each option by its own model (keeping, upgrading or growing the cluster as
    owned, renting as rented): --cost, --price and --instance (``given``, by name) choose one model for
    every row, so they would be ignored there; given, they are refused instead, naming the option."""
    for name, value in given.items():
        if value is not None:
            raise InputError(
                "--have prices keeping, upgrading and growing the cluster as owned and renting as rented, "
                f"each option by its own model; --{name} does not apply (--own-prices and --instances give "
                "your prices)",
                key=f"--{name}",
            )


def have_models(network_prices, instances, own_prices, **refused):
    """`plan --have`'s two cost models, (own, rent), from the options as typed; ``refused`` as
    refuse_cost_options_with_have."""
    refuse_cost_options_with_have(**refused)
    return owned_and_rented(network_option(network_prices), instances, own_prices)


def owned_and_rented(network, instances, own_prices):
    """`plan --have`'s (own, rent) models from the network catalog as cost_model reads it ("default",
    None or a path; network_option)."""
    # --have has no --cost: its messages send the user only to --own-prices and --instances
    own = cost_model("own", None, network, own_prices=own_prices, have_cost_option=False)
    return own, cost_model("rent", instances=instances, have_cost_option=False)


def price_compare_rows(scenario, rows, costs) -> list[dict[str, Any]]:
    """What each simulated compare cell costs to train: its hours, the cost under ``costs`` (one model
    for every cell) with a P10-P90 from the price's spread and the cell's time band, and how it was
    priced. The one place compare's table, its --json and the API's ``Comparison.costs`` come from, so
    the three say the same. Raises InputError where the model cannot price a cell's cluster."""
    priced_rows = []
    for r in rows:
        if r.error or not r.time_to_train_s:
            continue
        cluster = scenario.with_world_size(r.gpus).cluster.model_dump(mode="json")
        priced = costs.price(cluster)
        hours = r.time_to_train_s / 3600
        mid = r.iteration_time_s or 0.0
        lo = r.iteration_time_p10_s / mid if mid and r.iteration_time_p10_s else None
        hi = r.iteration_time_p90_s / mid if mid and r.iteration_time_p90_s else None
        cost = hours * priced.per_hour
        p10, p90 = cost_band(cost, priced.sigma, lo, hi)
        priced_rows.append(
            {
                "gpus": r.gpus,
                "optimizer": r.optimizer,
                "hours": hours,
                "cost_usd": cost,
                "cost_p10_usd": p10,
                "cost_p90_usd": p90,
                "band": "price and time" if lo is not None else "price only",
                "cost_model": priced.model,
                "per_hour_usd": priced.per_hour,
                "capital_usd": priced.capital,
                "basis": priced.basis,
                "common_basis": priced.common or priced.basis,
                "instance": priced.extra.get("instance"),  # rented as an instance type (None: flat rate)
                "instances": priced.extra.get("instances"),
                "warning": priced.warning,
            }
        )
    return priced_rows


def compare_costs(
    scenario,
    rows,
    cost: str | None = None,
    instance: str | None = None,
    *,
    network: Any = "default",
    instances: str | None = None,
    own_prices: str | None = None,
):
    """Compare's costs as its --json and the API give them: each cell priced by the model asked for
    (``cost``, ``instance``), or by the default one (auto_model), whose failure to price the GPU is a
    reason returned beside an empty list rather than an error."""
    asked = cost is not None or instance is not None
    model = compare_model(scenario.cluster.gpu, cost, instance, network, instances, own_prices)
    try:
        return price_compare_rows(scenario, rows, model), None
    except InputError as exc:
        if asked:
            raise
        return [], exc.message


def refuse_costs_without_steps(steps, **given) -> None:
    """Compare prices each cell's run of ``steps``: without them a cost option (``given``: the option's
    name, with its leading -- and - as _, to its value) would price nothing, and is refused by name."""
    if steps:
        return
    for name, value in given.items():
        if value is not None:
            option = "--" + name.replace("_", "-")
            raise InputError(
                f"prices a run of --steps, and none is given: give --steps or drop {option}", key=option
            )


def compare_model(
    gpu: str,
    cost: str | None = None,
    instance: str | None = None,
    network: Any = "default",
    instances: str | None = None,
    own_prices: str | None = None,
):
    """Compare's cost model: the one asked for (--cost, --instance), else the default (auto_model), with
    the user's catalogs where given; compare has no --price."""
    if cost is not None or instance is not None:
        return cost_model(cost, None, network, instance, instances, own_prices, price_option=False)
    return auto_model({gpu}, None, network, None, instances, own_prices, price_option=False)
