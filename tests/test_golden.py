"""The engine may get faster, never different: every preset (and each optimizer on the default preset,
GPT-3 175B, the offload variants) reproduces the outputs recorded before the speed work of issue #15
to 1e-9 relative: iteration time, breakdown, bytes, buckets, steps, offload candidates, and every op's
start and end."""

import json
import math

import pytest

from tests.golden import GOLDEN, cases, run_case

REL = 1e-9
ABS = 1e-15  # seconds: for values that are (or round to) zero
_CASES = cases()
_EXPECTED = json.loads(GOLDEN.read_text())


def _close(got, want, where: str) -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), where
        for k in want:
            _close(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list | tuple) and len(got) == len(want), f"{where}: length"
        for i, (g, w) in enumerate(zip(got, want)):
            _close(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert math.isclose(got, want, rel_tol=REL, abs_tol=ABS), f"{where}: {got!r} != {want!r}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def test_every_case_has_a_golden_output():
    assert sorted(_CASES) == sorted(_EXPECTED)


@pytest.mark.parametrize("name", sorted(_CASES))
def test_reproduces_golden_outputs(name):
    scenario, check = _CASES[name]
    got = json.loads(json.dumps(run_case(scenario, check)))
    want = dict(_EXPECTED[name])
    ruled_out = got.pop("offload_ruled_out")
    want.pop("offload_ruled_out", None)
    # A placement the planner ruled out without simulating it was slower than the chosen one when it
    # was simulated, and its reported bound is a true lower bound on that simulated time.
    want["offload_candidates"] = dict(want["offload_candidates"])
    for placement, bound in ruled_out.items():
        simulated = want["offload_candidates"].pop(placement)
        assert got["iteration_time_s"] <= bound <= simulated * (1 + REL), (placement, bound, simulated)
    _close(got, want, name)
