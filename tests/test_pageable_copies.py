"""Copies to and from pageable host memory go through the driver's pinned bounce buffer: the DMA at the
link's pinned rate and one CPU thread's memcpy at the staging rate, one after the other
(simulator/host.py HostModel.pageable_copy; hardware_defaults.yaml pageable_staging_gbs)."""

import pytest

from clustersim.calibration.profile import load_profile
from clustersim.catalog import hardware_defaults
from clustersim.scenario import load_scenario
from clustersim.simulator import simulate
from clustersim.simulator.context import build_context
from clustersim.simulator.host import HostModel, staging_rates


def _host(pcie: float, **kw) -> HostModel:
    return HostModel(pcie, pcie, 400e9, 8, None, True, **kw)


@pytest.mark.parametrize("to_host", [True, False])
def test_the_dma_and_the_staging_memcpy_add(to_host):
    d = hardware_defaults()["pageable_staging_gbs"]
    staging = (d["d2h"] if to_host else d["h2d"]) * 1e9
    secs, demands = _host(25e9).pageable_copy(1e9, to_host=to_host)
    assert secs == pytest.approx(1e9 / 25e9 + 1e9 / staging)
    rate = 1e9 / secs
    assert rate < min(25e9, staging)
    assert demands["host_dram"] == pytest.approx(2 * rate)  # into the bounce buffer, then out of it


def test_a_faster_link_or_host_is_never_slower():
    for to_host in (True, False):
        times = [_host(p).pageable_copy(1e9, to_host)[0] for p in (12e9, 25e9, 50e9)]
        assert times == sorted(times, reverse=True)
        slow, fast = (_host(25e9, scale=s).pageable_copy(1e9, to_host)[0] for s in (1.3, 0.8))
        assert fast < slow


def test_the_defaults_reproduce_the_calibrations_they_come_from():
    """Each shipped GPU calibration measured pinned and pageable 256 MiB copies on a PCIe 5.0 host;
    the default staging rates (their geometric means) give those pageable rates within 10% at the
    measured pinned rate."""
    for name in ("h100-pytorch-2.11", "h200-pytorch-2.11"):
        copies = load_profile(f"builtin:{name}").host.copy_gbs
        for direction in ("d2h", "h2d"):
            host = _host(copies[f"{direction}_pinned"] * 1e9)
            secs, _ = host.pageable_copy(1e9, to_host=direction == "d2h")
            assert 1 / secs == pytest.approx(copies[f"{direction}_pageable"], rel=0.10), (name, direction)


def test_a_profile_gives_its_own_hosts_staging_rate():
    copies = load_profile("builtin:h200-pytorch-2.11").host.copy_gbs
    d2h, h2d = staging_rates(copies)
    assert d2h == pytest.approx(1e9 / (1 / copies["d2h_pageable"] - 1 / copies["d2h_pinned"]))
    assert h2d == pytest.approx(1e9 / (1 / copies["h2d_pageable"] - 1 / copies["h2d_pinned"]))
    # at the profile's own pinned rate it gives back exactly what it measured
    host = _host(copies["d2h_pinned"] * 1e9, staging_d2h=d2h, staging_h2d=h2d)
    assert 1e9 / host.pageable_copy(1e9, to_host=True)[0] == pytest.approx(copies["d2h_pageable"] * 1e9)
    defaults = hardware_defaults()["pageable_staging_gbs"]
    assert staging_rates({}) == (defaults["d2h"] * 1e9, defaults["h2d"] * 1e9)
    # a measurement that cannot be a staged copy (pageable no slower than pinned) is not used
    assert staging_rates({"d2h_pinned": 20.0, "d2h_pageable": 25.0})[0] == defaults["d2h"] * 1e9


def test_one_bit_adams_host_staged_copies_are_the_hosts_pageable_copies():
    """DeepSpeed's MPI backend without CUDA-aware MPI moves each phase's packed buffer through host
    memory: every staging op lasts the host's pageable copy of its bytes plus one host sync."""
    s = load_scenario("preset:onebit-adam-ethernet")
    result = simulate(s)
    host = build_context(s).host
    sync = hardware_defaults()["host_sync_s"]
    staged = [op for op in result.ops if op.name.endswith(("D2H", "H2D"))]
    assert staged
    for op in staged:
        copy_s, _ = host.pageable_copy(op.meta["bytes"], to_host=op.name.endswith("D2H"))
        assert op.end - op.start == pytest.approx(copy_s + sync, rel=1e-9), op.name


def test_page_faults_are_drawn_apart_from_the_hosts_rates():
    """A draw's fault factor moves the blocking copy's page faults and nothing else of the host's
    work; the rates' factor moves the rest and not the faults."""
    from clustersim.simulator.context import Perturbation, network_params

    s = load_scenario("preset:offload-dos-7b-h100")
    net = network_params(None)

    def host_ops(perturbation):
        result = simulate(s, perturbation=perturbation)
        faults = sum(o.end - o.start for o in result.ops if o.name.startswith("page faults"))
        update = sum(o.end - o.start for o in result.ops if o.name.startswith("CPU update"))
        return faults, update

    faults, update = host_ops(Perturbation(net))
    assert faults > 0 and update > 0
    doubled_faults, same_update = host_ops(Perturbation(net, fault_scale=2.0))
    assert doubled_faults == pytest.approx(2 * faults) and same_update == pytest.approx(update)
    same_faults, slower_update = host_ops(Perturbation(net, host_scale=1.5))
    assert same_faults == pytest.approx(faults) and slower_update == pytest.approx(1.5 * update, rel=0.01)
