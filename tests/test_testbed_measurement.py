"""How testbed validate measures and calibrates: a step's phases are one rank's (the slowest), so they
add up to its step; Adam's update is priced at the rate the local job ran it, so no optimizer pays it
as overhead."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from clustersim.testbed.ddp_job import slowest  # noqa: E402


class _TwoRanks:
    """torch.distributed's all_gather over two ranks, the other rank's values given."""

    def __init__(self, other: dict[str, list[float]], keys):
        self.other = torch.tensor([other[k] for k in keys], dtype=torch.float64)

    def get_world_size(self) -> int:
        return 2

    def all_gather(self, out, mine):
        out[0].copy_(mine)
        out[1].copy_(self.other)


def test_each_step_takes_every_phase_from_the_rank_whose_step_is_longest():
    keys = ("step", "kernels", "collectives")
    # rank 0 computes long and waits little; rank 1 computes fast and waits for rank 0 in the collective
    mine = {"step": [10.0, 10.0, 10.0], "kernels": [8.0, 8.0, 8.0], "collectives": [2.0, 2.0, 2.0]}
    other = {"step": [9.0, 9.5, 11.0], "kernels": [3.0, 3.0, 5.0], "collectives": [6.0, 6.5, 6.0]}
    got = slowest(torch, _TwoRanks(other, keys), mine, keys)
    # steps 1 and 2 from rank 0 (10 > 9, 9.5), step 3 from rank 1 (11 > 10)
    assert got["step"]["median_s"] == 10.0
    assert got["kernels"]["median_s"] == 8.0 and got["collectives"]["median_s"] == 2.0
    assert got["kernels"]["p90_s"] >= 8.0 and got["collectives"]["p90_s"] >= 2.0
    # the largest of each phase over ranks (6 + 8 = 14 > any step) is what this replaces
    assert got["kernels"]["median_s"] + got["collectives"]["median_s"] <= got["step"]["median_s"]


def test_adam_update_is_the_local_jobs_own_and_no_other_optimizer_pays_it():
    from clustersim.simulator import simulate
    from clustersim.testbed.validate import Job, _profile, scenario_for

    job = Job()
    local = {p: {"median_s": s} for p, s in (("forward", 0.025), ("backward", 0.06), ("optimizer", 0.015))}
    kernels = [  # BinSGDM's own update passes, as the kernel calibration records them
        {"name": "binsgdm_update", "elements": job.params, "bytes": 20.0 * job.params, "median_s": 0.002},
        {"name": "binsgdm_apply", "elements": job.params, "bytes": 10.125 * job.params, "median_s": 0.003},
    ]
    profile = _profile({"device": "cpu", "collectives": []}, 3, {**local, "hosts": 2}, job, kernels)
    adam = simulate(scenario_for(2, 200e6, job, "adam"), profile).breakdown
    assert adam["optimizer"] + adam["other"] == pytest.approx(0.015, rel=1e-6)
    binsgdm = simulate(scenario_for(2, 200e6, job, "binsgdm"), profile).breakdown
    assert binsgdm["optimizer"] + binsgdm["other"] == pytest.approx(0.005, rel=1e-6)
