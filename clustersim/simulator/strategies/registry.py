"""Name -> strategy class. Adding an optimizer = adding a module and one line here."""

from __future__ import annotations

from pydantic import ValidationError

from clustersim.errors import InputError


def _strategies() -> dict:
    from clustersim.simulator.strategies.binsgdm import BinSGDM
    from clustersim.simulator.strategies.ddp import AdamDDP, SgdmDDP
    from clustersim.simulator.strategies.onebit_adam import OneBitAdam
    from clustersim.simulator.strategies.zero_one_adam import ZeroOneAdam

    return {cls.name: cls for cls in (AdamDDP, SgdmDDP, OneBitAdam, ZeroOneAdam, BinSGDM)}


def names() -> list[str]:
    return list(_strategies())


def get(name: str):
    table = _strategies()
    if name not in table:
        raise InputError(f"unknown optimizer {name!r} (known: {', '.join(table)})", key="training.optimizer")
    return table[name]


def parse_options(cls, options: dict):
    try:
        return cls.Options.model_validate(options)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(["training.optimizer_options", *(str(p) for p in err["loc"])])
        msg = "unknown key for optimizer " + cls.name if err["type"] == "extra_forbidden" else err["msg"]
        raise InputError(msg, key=key) from None


def validate_training(scenario) -> None:
    cls = get(scenario.training.optimizer)
    parse_options(cls, scenario.training.optimizer_options)


def create(ctx):
    cls = get(ctx.scenario.training.optimizer)
    return cls(ctx, parse_options(cls, ctx.scenario.training.optimizer_options))
