"""Layers import downward only, and nothing imports in a circle (function-level imports included).

The order, bottom to top (docs/architecture.md): plain helpers; catalogs and the scenario
schema; workloads and topologies; cost models; calibration (measures and fits, reads profiles);
the simulator; what runs simulations (planner: compare, break-even, layouts, plan; validation, sweeps,
report, testbed, the Python API); the CLI (cli.py and commands/).
A module may import its own layer or any layer below it.
"""

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent / "clustersim"
LAYERS = [
    ("errors", "units", "catalogs", "io", "identifiers"),
    ("catalog", "scenario", "optimizer_options", "sharding_rules", "scenario_reference"),
    ("workloads", "topologies", "model_import"),
    ("cost_models",),
    ("calibration",),
    ("simulator",),
    ("planner", "validation", "sweeps", "report", "testbed", "api"),
    ("cli", "commands", "__main__"),
]
# Known upward imports, each to be removed by the seams work (issue #14); the test fails if one of
# these disappears without being taken off the list, so the list only shrinks.
ALLOWED_UPWARD = {
    ("cost_models.compute", "calibration.profile"),  # the compute model reads a Profile object
    ("cost_models.dispatch", "calibration.profile"),  # annotation only: the dispatch rates a Profile holds
}


def _layer(module: str) -> int:
    top = module.split(".")[0]
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"module {module} is in no layer; add it to LAYERS")


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        module = ".".join(parts) or "__init__"
        deps = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("clustersim"):
                target = node.module[len("clustersim.") :] if node.module != "clustersim" else ""
                for alias in node.names:
                    full = f"{target}.{alias.name}" if target else alias.name
                    deps.add(full if (ROOT / (full.replace(".", "/") + ".py")).exists() else target)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("clustersim."):
                        deps.add(alias.name[len("clustersim.") :])
        deps.discard("")
        deps.discard(module)
    return graph


def _upward() -> set[tuple[str, str]]:
    found = set()
    for module, deps in _imports().items():
        if module == "__init__":
            continue
        for dep in deps:
            if _layer(dep) > _layer(module):
                found.add((module, dep))
    return found


def test_no_upward_imports_beyond_the_known_list():
    found = _upward()
    unexpected = {
        (m, d)
        for m, d in found
        if not any(m == a and (d == b or d.startswith(b + ".")) for a, b in ALLOWED_UPWARD)
    }
    assert not unexpected, f"lower layer imports a higher one: {sorted(unexpected)}"


def test_the_known_list_only_shrinks():
    found = _upward()
    stale = {
        (a, b)
        for a, b in ALLOWED_UPWARD
        if not any(m == a and (d == b or d.startswith(b + ".")) for m, d in found)
    }
    assert not stale, f"these upward imports are gone: take them off ALLOWED_UPWARD: {sorted(stale)}"


def test_no_import_cycles_between_modules():
    g = nx.DiGraph()
    for module, deps in _imports().items():
        for dep in deps:
            g.add_edge(module, dep)
    cycles = [c for c in nx.simple_cycles(g) if len(c) > 1]
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_every_optimizer_has_an_options_schema_and_a_strategy():
    from clustersim.optimizer_options import OPTIONS
    from clustersim.simulator.strategies import registry

    assert set(registry.names()) == set(OPTIONS)
    for name in registry.names():
        assert registry.get(name).Options is OPTIONS[name]


def test_strategies_say_what_they_compress_and_whether_they_warm_up():
    from clustersim.simulator.strategies import registry

    assert {n: registry.get(n).baseline for n in registry.names()} == {
        "adam": None,
        "sgdm": None,
        "onebit-adam": "adam",
        "zero-one-adam": "adam",
        "binsgdm": "sgdm",
        "diloco": "adam",
    }
    assert registry.get("onebit-adam").warmup_options({"freeze_step": 10}) == {
        "freeze_step": 10,
        "stage": "warmup",
    }
    assert registry.get("binsgdm").warmup_options({}) is None
    assert registry.get("zero-one-adam").run_options({}, 1000)["var_freeze_step"] == 1000
