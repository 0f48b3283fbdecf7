"""End-to-end check on the emulated testbed: predict a real DDP training step, then run it.

Protocol (nothing from the predicted job itself feeds the prediction's network side):
1. One collective sweep (gloo all-reduce, 64 KiB - 8 MiB) over the testbed's first 2, 4, ... hosts.
2. The collective model is fitted on the groups smaller than the largest (calibration/network_fit.py);
   no exact-shape fit is kept, so every host count is predicted from the model.
3. Per host count, the MLP runs on every host at once without communication (``--mode local``): the
   compute rate of an emulated host while its neighbours share this machine's cores. These forward /
   backward / optimizer medians are the device calibration, as ``compute_phases`` of the profile.
4. The same MLP under DDP is predicted (P10-P90 from the fit's uncertainty) and then run.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from clustersim.calibration.fit import build_profile
from clustersim.calibration.profile import parse_profile
from clustersim.scenario import validate_scenario
from clustersim.simulator import simulate
from clustersim.testbed import hosts as tb_hosts
from clustersim.testbed.shaping import parse_rate
from clustersim.testbed.sweep import run as run_sweep
from clustersim.testbed.sweep import run_on_hosts


def scenario_for(n: int, rate_bits: float, layers: int, width: int, batch: int):
    """The DDP job as a scenario: CPU hosts with one rank each, the MLP as custom layers (weight and
    bias of each Linear, 2·width² FLOPs per sample forward), Adam, PyTorch DDP's default buckets."""
    return validate_scenario(
        {
            "name": f"testbed-mlp-{n}-hosts",
            "cluster": {
                "nodes": n,
                "gpus_per_node": 1,
                "gpu": "CPU-2vCPU",
                "intra_node": {"fabric": "pcie"},
                "nic": {
                    "kind": "ethernet_tcp",
                    "count": 1,
                    "line_rate_gbps": rate_bits / 1e9,
                    "gpudirect_rdma": False,
                },
            },
            "workload": {
                "layers": [
                    {
                        "name": "linear",
                        "params": width * width + width,
                        "forward_flops": 2.0 * width * width,
                        "repeat": layers,
                    }
                ],
                "micro_batch": batch,
                "precision": "fp32",
            },
            "training": {"optimizer": "adam", "ddp_bucket_cap_mb": 25, "first_bucket_cap_mb": 1},
        },
        source="testbed validation",
    )


def _profile(raw: dict, fit_ranks: int, local: dict, batch: int):
    """Network model fitted on groups below ``fit_ranks`` hosts, plus the measured compute phases."""
    small = {**raw, "collectives": [r for r in raw["collectives"] if r["ranks"] < fit_ranks]}
    data = build_profile(small)
    data["collectives"] = []  # predict from the model, never by replaying a measured shape
    data["compute_phases"] = [
        {
            "model": "custom",
            "micro_batch": batch,
            "seq_len": 1,
            "precision": "fp32",
            "forward_s": local["forward"]["median_s"],
            "backward_s": local["backward"]["median_s"],
            "other_s": local["optimizer"]["median_s"],
            "source": f"MLP on {local['hosts']} emulated hosts at once, no communication",
        }
    ]
    return parse_profile(data, "testbed calibration")


def validate_ddp(
    host_counts: list[int],
    rate: str,
    layers: int = 4,
    width: int = 512,
    batch: int = 256,
    steps: int = 20,
    samples: int = 16,
    progress=None,
) -> dict:
    bits = parse_rate(rate)
    top = max(host_counts)
    job = ["--layers", str(layers), "--width", str(width), "--batch", str(batch), "--steps", str(steps)]
    tb, created = tb_hosts.up(top, bits)
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="cst-validate-") as tmp:
            raw = run_sweep(
                tb,
                Path(tmp) / "raw.json",
                "all_reduce",
                1 << 16,
                1 << 23,
                5,
                1,
                subgroups=True,
                progress=progress,
                command=f"clustersim testbed validate --rate {rate}",
            )
        for n in sorted(host_counts):
            local = run_on_hosts(
                tb,
                "clustersim.testbed.ddp_job",
                ["--mode", "local", *job],
                {},
                progress,
                900,
                "the local MLP job",
                count=n,
            )
            measured = run_on_hosts(
                tb,
                "clustersim.testbed.ddp_job",
                ["--mode", "ddp", *job],
                {},
                progress,
                900,
                "the DDP job",
                count=n,
            )
            fit_below = top if top > 2 else 3  # fit on the smaller groups; with 2 hosts only, on those
            profile = _profile(raw, fit_below, local, batch)
            result = simulate(
                scenario_for(n, bits, layers, width, batch), profile, uncertainty_samples=samples
            )
            iv = result.interval
            step = measured["step"]
            rows.append(
                {
                    "hosts": n,
                    "measured_s": step["median_s"],
                    "measured_p10_s": step["p10_s"],
                    "measured_p90_s": step["p90_s"],
                    "predicted_s": result.iteration_time,
                    "predicted_p10_s": iv.p10,
                    "predicted_p90_s": iv.p90,
                    "error": result.iteration_time / step["median_s"] - 1,
                    "inside": iv.p10 <= step["median_s"] <= iv.p90,
                    "compute_s": local["forward"]["median_s"] + local["backward"]["median_s"],
                    "exposed_communication_s": result.breakdown["exposed_communication"],
                    "network_fitted_on_ranks": sorted(
                        {r["ranks"] for r in raw["collectives"] if r["ranks"] < fit_below}
                    ),
                }
            )
    finally:
        if created:
            tb_hosts.down(tb)
    return {"rate": rate, "params": layers * (width * width + width), "batch": batch, "rows": rows}
