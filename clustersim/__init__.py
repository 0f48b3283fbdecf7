"""clustersim: a discrete-event performance model of distributed deep-learning training.

Data flows one way: a validated :class:`~clustersim.scenario.Scenario` and the hardware/model
catalogs feed the topology and cost models; a strategy (the optimizer) turns them into a
:class:`~clustersim.simulator.program.Program` of ops for one representative rank; the engine
executes the program and returns a :class:`~clustersim.simulator.result.SimulationResult`.

The Python API (docs/api.md) is ``from clustersim import load_scenario, simulate, compare, sweep,
plan``. Its names are imported on first use (module ``__getattr__``), so ``import clustersim`` and
``clustersim --help`` do not pay for pydantic, simpy or the catalogs.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "compare", "load_scenario", "plan", "simulate", "sweep"]

_API = frozenset(__all__) - {"__version__"}


def __getattr__(name: str):
    if name in _API:
        from clustersim import api

        value = getattr(api, name)
        globals()[name] = value  # once imported, an ordinary attribute
        return value
    raise AttributeError(f"module 'clustersim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _API)
