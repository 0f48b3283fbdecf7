"""Name -> strategy class. Adding an optimizer = a strategy module, one line here, and its options
schema in optimizer_options.py (the scenario layer)."""

from __future__ import annotations

from clustersim.errors import InputError
from clustersim.optimizer_options import parse_options


def _strategies() -> dict:
    from clustersim.simulator.strategies.binsgdm import BinSGDM
    from clustersim.simulator.strategies.ddp import AdamDDP, SgdmDDP
    from clustersim.simulator.strategies.diloco import DiLoCo
    from clustersim.simulator.strategies.onebit_adam import OneBitAdam
    from clustersim.simulator.strategies.zero_one_adam import ZeroOneAdam

    return {cls.name: cls for cls in (AdamDDP, SgdmDDP, OneBitAdam, ZeroOneAdam, BinSGDM, DiLoCo)}


def names() -> list[str]:
    return list(_strategies())


def get(name: str):
    table = _strategies()
    if name not in table:
        raise InputError(f"unknown optimizer {name!r} (known: {', '.join(table)})", key="training.optimizer")
    return table[name]


def create(ctx):
    """The optimizer's strategy; under training.sharding (ZeRO/FSDP) wrapped by the sharding layer."""
    from clustersim.simulator.strategies.zero import Sharded

    cls = get(ctx.scenario.training.optimizer)
    strategy = cls(ctx, parse_options(cls.name, ctx.scenario.training.optimizer_options))
    if ctx.scenario.training.sharding.enabled:
        return Sharded(ctx, strategy)
    return strategy
