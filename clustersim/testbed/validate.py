"""End-to-end check on the emulated testbed: predict a real training step, then run it.

Protocol (nothing from the predicted job itself feeds the prediction's network side):
1. One collective sweep over gloo (all-reduce for DDP; all-to-all and all-gather too when a compressed
   optimizer is checked, as its compressed all-reduce uses them), 4 KiB - 8 MiB, over the testbed's
   first 2, 4, ... hosts.
2. The collective model is fitted on the groups smaller than the largest (calibration/network_fit.py);
   no exact-shape fit is kept, so every host count is predicted from the model.
3. Per host count, the model runs on every host at once without communication (``--mode local``): the
   compute rate of an emulated host while its neighbours share this machine's cores. These forward /
   backward / optimizer medians are the device calibration, as ``compute_phases`` of the profile. For
   the compressed optimizers the calibration microbenchmarks of their kernels run the same way
   (compressed_job.py ``--mode kernels``), at the job's size, and become the profile's ``kernels_gbs``.
4. The job is predicted (P10-P90 from the fit's uncertainty) and then run: under DDP with Adam
   (ddp_job.py), under FSDP2 with Adam (``zero3``, ddp_job.py ``--mode fsdp``: ZeRO-3, its all-gathers
   and reduce-scatters in the sweep too), or with 1-bit Adam's compression stage or BinSGDM
   (compressed_job.py), which do the communication in the optimizer step, pass by pass as the
   strategies model it.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from clustersim.calibration.fit import build_profile
from clustersim.calibration.profile import parse_profile
from clustersim.cost_models.kernel_bytes import FUSED_ADAM, padded_elements
from clustersim.scenario import validate_scenario
from clustersim.simulator import simulate
from clustersim.simulator.uncertainty import Interval
from clustersim.testbed import hosts as tb_hosts
from clustersim.testbed.shaping import parse_rate
from clustersim.testbed.sweep import host_cpus, run_on_hosts
from clustersim.testbed.sweep import run as run_sweep

# optimizer -> (job module, its --mode)
JOBS = {
    "adam": ("clustersim.testbed.ddp_job", "ddp"),
    "onebit-adam": ("clustersim.testbed.compressed_job", "onebit"),
    "binsgdm": ("clustersim.testbed.compressed_job", "binsgdm"),
    "zero-one-adam": ("clustersim.testbed.compressed_job", "zero-one"),
    "zero3": ("clustersim.testbed.ddp_job", "fsdp"),
}
COMPRESSED = ("onebit-adam", "binsgdm")  # every step's update waits for one compressed all-reduce
KERNELS = (*COMPRESSED, "zero-one-adam")  # priced with the compression kernels' calibration
SHARDED = ("zero3",)  # Adam, its parameters, gradients and state sharded over the hosts


@dataclass(frozen=True)
class Job:
    """The model trained on the testbed (ddp_job.py builds it from the same arguments)."""

    model: str = "mlp"
    layers: int = 4
    width: int = 512
    batch: int = 256
    seq: int = 64
    heads: int = 4
    steps: int = 20
    interval: int = 4  # 0/1 Adam: local steps between two syncs (DeepSpeed's local_step_clipper)

    def args(self) -> list[str]:
        return [
            *("--model", self.model, "--layers", str(self.layers), "--width", str(self.width)),
            *("--batch", str(self.batch), "--seq", str(self.seq), "--heads", str(self.heads)),
            *("--steps", str(self.steps)),
        ]

    @property
    def layer_params(self) -> int:
        """Parameters of one layer as torch counts them: Linear(w, w) is w² + w; a post-norm encoder
        layer is 12·d² + 13·d (QKV in-projection 3d² + 3d, out-projection d² + d, feed-forward
        d·4d + 4d and 4d·d + d, two LayerNorms 2d each)."""
        w = self.width
        return 12 * w * w + 13 * w if self.model == "transformer" else w * w + w

    @property
    def layer_tensors(self) -> list[int]:
        """One layer's parameter tensors in the order torch registers them (DDP buckets gradients by
        tensor): TransformerEncoderLayer's attention in- and out-projections, two feed-forward
        Linears and two LayerNorms, weight then bias; Linear's weight and bias."""
        w = self.width
        if self.model == "transformer":
            return [3 * w * w, 3 * w, w * w, w, 4 * w * w, 4 * w, 4 * w * w, w, w, w, w, w]
        return [w * w, w]

    @property
    def params(self) -> int:
        return self.layers * self.layer_params

    @property
    def layer_flops(self) -> float:
        """Forward FLOPs per sample and layer: 2 per weight and token, plus attention's QKᵀ and AV
        (2 · 2 · seq² · d) for the transformer."""
        if self.model == "transformer":
            return self.seq * 2.0 * self.layer_params + 4.0 * self.seq * self.seq * self.width
        return 2.0 * self.width * self.width

    @property
    def label(self) -> str:
        if self.model == "transformer":
            return f"{self.layers}-layer transformer (d={self.width}, {self.seq} tokens)"
        return f"MLP ({self.layers} x Linear({self.width}, {self.width}))"


def _training(job: Job, optimizer: str) -> dict:
    """PyTorch DDP's default buckets (used by Adam; the compressed optimizers communicate in their
    step), or for ``zero3`` the schedule FSDP2 runs on CPU over gloo (ddp_job.shard), written as
    ZeRO-3 settings: each layer gathered before its forward and again before its backward with no
    prefetch (``prefetch_bucket_mb: 0``: FSDP2's CPU all-gathers block, so nothing is gathered ahead
    of the layer that needs it; its backward prefetch only moves a blocking call earlier), one
    reduce-scatter per layer (``reduce_bucket_mb`` = one layer's fp32 gradient: FSDP2 reduces per
    unit) that blocks the next backward (``overlap_comm: false``), Adam on the rank's 1/n.

    One difference remains that no setting expresses: the simulated ZeRO-3 issues a layer's backward
    all-gather on its gather stream as soon as the previous layer's backward ends (DeepSpeed does, on a
    GPU), so it runs beside that layer's reduce-scatter, sharing the NIC; FSDP2 on CPU runs the two one
    after the other. The prediction is short by up to L - 1 of those overlaps (README, testbed)."""
    if optimizer in SHARDED:
        return {
            "optimizer": "adam",
            "sharding": {
                "stage": 3,
                "framework": "deepspeed",
                "prefetch_bucket_mb": 0,
                "reduce_bucket_mb": job.layer_params * 4 / 2**20,  # exact: an integer over 2^20
                "overlap_comm": False,
            },
        }
    if optimizer == "zero-one-adam":
        return {
            "optimizer": optimizer,
            "optimizer_options": zero_one_options(job.interval),
            "ddp_bucket_cap_mb": 25,
            "first_bucket_cap_mb": 1,
        }
    return {"optimizer": optimizer, "ddp_bucket_cap_mb": 25, "first_bucket_cap_mb": 1}


def zero_one_options(interval: int) -> dict:
    """0/1 Adam as the testbed runs it (compressed_job.ZeroOneAdam): past its variance freeze, a sync
    every ``interval`` steps. In DeepSpeed's schedule: frozen from the start, the local interval doubled
    after every step (``local_step_scaler`` 1) up to ``local_step_clipper`` = ``interval``; over 10^6
    steps the two syncs before the interval reaches its cap weigh 2 in a million."""
    return {
        "var_freeze_step": 0,
        "total_steps": 1_000_000,
        "local_step_scaler": 1,
        "local_step_clipper": interval,
    }


def scenario_for(n: int, rate_bits: float, job: Job, optimizer: str = "adam"):
    """The job as a scenario: CPU hosts with one rank each, the model as custom layers (parameters and
    per-sample forward FLOPs of each layer, as torch builds it), the optimizer and how it communicates
    (``_training``)."""
    return validate_scenario(
        {
            "name": f"testbed-{job.model}-{n}-hosts",
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
                        "name": job.model,
                        "params": job.layer_params,
                        "param_tensors": job.layer_tensors,
                        "forward_flops": job.layer_flops,
                        "repeat": job.layers,
                    }
                ],
                "micro_batch": job.batch,
                "precision": "fp32",
            },
            "training": _training(job, optimizer),
        },
        source="testbed validation",
    )


def _profile(raw: dict, fit_ranks: int, local: dict, job: Job, kernels: list[dict] | None):
    """Network model fitted on groups below ``fit_ranks`` hosts, plus the measured compute phases, Adam's
    update at the local job's rate and, for the compressed optimizers, the kernels measured on the hosts
    at once."""
    small = {**raw, "collectives": [r for r in raw["collectives"] if r["ranks"] < fit_ranks]}
    # Adam's update at the rate the local job ran it (its optimizer phase, Adam over every parameter):
    # the measured phase less this update is the per-step overhead every optimizer pays, so the
    # overhead is what remains once the job's own update is taken off, not a microbenchmark's update
    adam = {
        "name": "optimizer",
        "elements": job.params,
        "bytes": FUSED_ADAM * job.params,
        "median_s": local["optimizer"]["median_s"],
    }
    small["kernels"] = [*(kernels or []), adam]
    data = build_profile(small)
    data["collectives"] = []  # predict from the model, never by replaying a measured shape
    data["compute_phases"] = [
        {
            "model": "custom",
            "micro_batch": job.batch,
            "seq_len": 1,
            "precision": "fp32",
            "forward_s": local["forward"]["median_s"],
            "backward_s": local["backward"]["median_s"],
            "other_s": local["optimizer"]["median_s"],
            "source": f"{job.model} on {local['hosts']} emulated hosts at once, no communication",
        }
    ]
    return parse_profile(data, "testbed calibration")


def _sweep(tb, optimizers: list[str], rate: str, progress, sizes: tuple[int, int], repeat: int) -> dict:
    ops = ["all_reduce"] + (["all_to_all", "all_gather"] if set(optimizers) & set(KERNELS) else [])
    if set(optimizers) & set(SHARDED):
        ops += [op for op in ("all_gather", "reduce_scatter") if op not in ops]
    with tempfile.TemporaryDirectory(prefix="cst-validate-") as tmp:
        return run_sweep(
            tb,
            Path(tmp) / "raw.json",
            ",".join(ops),
            sizes[0],
            sizes[1],
            repeat,
            1,
            subgroups=True,
            progress=progress,
            command=f"clustersim testbed validate --rate {rate}",
        )


def _row(
    n: int,
    optimizer: str,
    measured: dict,
    result,
    fitted_on: list[int],
    local: dict,
    kernels: list[dict] | None,
) -> dict:
    iv = result.interval or Interval(result.iteration_time, result.iteration_time, result.iteration_time, 0)
    step = measured["step"]
    row = {
        "hosts": n,
        "optimizer": optimizer,
        "measured_s": step["median_s"],
        "measured_p10_s": step["p10_s"],
        "measured_p90_s": step["p90_s"],
        "predicted_s": result.iteration_time,
        "predicted_p10_s": iv.p10,
        "predicted_p90_s": iv.p90,
        "error": result.iteration_time / step["median_s"] - 1,
        "inside": iv.p10 <= step["median_s"] <= iv.p90,
        "exposed_communication_s": result.breakdown["exposed_communication"],
        "predicted_breakdown_s": dict(result.breakdown),
        "measured_phases_s": {k: v["median_s"] for k, v in measured.items() if isinstance(v, dict)},
        # the device calibration the prediction used: the model on every host at once, no communication
        "calibration_phases_s": {k: local[k]["median_s"] for k in ("forward", "backward", "optimizer")},
        # and the compressed optimizers' kernels measured the same way, so the row can be re-predicted
        # later from what is stored (repredict)
        "calibration_kernels": kernels,
        "network_fitted_on_ranks": fitted_on,
        # bytes the busiest host put on its link per step (/proc/net/dev: TCP/IP headers, barriers), and
        # what the simulated step sends out of each node's NIC (one rank per host)
        "measured_wire_sent_bytes": measured.get("wire_sent_bytes_per_step"),
        "predicted_wire_sent_bytes": result.bytes_per_link_kind["inter_node_per_node"],
    }
    if optimizer in COMPRESSED:
        b = result.breakdown
        # nothing overlaps the compressed all-reduce: its kernels, its collectives, its host syncs
        predicted = b["compression"] + b["exposed_communication"] + b["exposed_host"]
        row["compressed_allreduce_measured_s"] = measured["compressed_allreduce"]["median_s"]
        row["compressed_allreduce_predicted_s"] = predicted
        row["compressed_allreduce_error"] = predicted / measured["compressed_allreduce"]["median_s"] - 1
    return row


@tb_hosts.down_on_sigterm
def validate(
    host_counts: list[int],
    rate: str,
    job: Job = Job(),  # noqa: B008 - frozen dataclass
    optimizers: tuple[str, ...] = ("adam",),
    samples: int = 32,
    progress=None,
    sweep_bytes: tuple[int, int] = (1 << 12, 1 << 23),
    sweep_repeat: int = 5,
    cpus_per_host: float | None = None,
) -> dict:
    """Sweep, fit, then per host count calibrate the hosts' compute and predict and run each optimizer.
    ``sweep_bytes`` is the collective sweep's range (4 KiB - 8 MiB: the compressed all-reduce's
    packed momentum and scales up to DDP's 25 MiB buckets' neighbourhood). ``cpus_per_host``: each
    host's CPU share (hosts.up); the compute and kernel calibrations run inside it, as the jobs do."""
    bits = parse_rate(rate)
    top = max(host_counts)
    tb, created = tb_hosts.up(top, bits, cpus_per_host=cpus_per_host)
    testbed = {"hosts": tb.hosts, "rate_gbps": tb.rate_bits / 1e9, "shaper": tb.shaper, **host_cpus(tb)}
    rows, raw = [], None
    try:
        raw = _sweep(tb, list(optimizers), rate, progress, sweep_bytes, sweep_repeat)
        fit_below = top if top > 2 else 3  # fit on the smaller groups; with 2 hosts only, on those
        fitted_on = sorted({r["ranks"] for r in raw["collectives"] if r["ranks"] < fit_below})
        for n in sorted(host_counts):
            local = run_on_hosts(
                tb,
                JOBS["adam"][0],
                ["--mode", "local", *job.args()],
                {},
                progress,
                900,
                "the local job",
                count=n,
            )
            kernels = None
            if set(optimizers) & set(KERNELS):
                kernels = run_on_hosts(
                    tb,
                    JOBS["binsgdm"][0],
                    ["--mode", "kernels", "--elements", str(padded_elements(job.params, n)), *job.args()],
                    {},
                    progress,
                    900,
                    "the kernel microbenchmarks",
                    count=n,
                )["kernels"]
            profile = _profile(raw, fit_below, local, job, kernels)
            for optimizer in optimizers:
                module, mode = JOBS[optimizer]
                measured = run_on_hosts(
                    tb,
                    module,
                    [
                        "--mode",
                        mode,
                        *job.args(),
                        *(["--interval", str(job.interval)] if mode == "zero-one" else []),
                    ],
                    {},
                    progress,
                    900,
                    f"the {optimizer} job",
                    count=n,
                )
                result = simulate(scenario_for(n, bits, job, optimizer), profile, uncertainty_samples=samples)
                rows.append(_row(n, optimizer, measured, result, fitted_on, local, kernels))
    finally:
        if created:
            tb_hosts.down(tb)
    return {
        "rate": rate,
        "model": job.model,
        "label": job.label,
        "job": job.__dict__,
        "params": job.params,
        "batch": job.batch,
        "testbed": testbed,  # what the hosts ran on: each one's CPU share
        "rows": rows,
        "sweep": raw,  # the measured collectives the network model was fitted on (a clustersim-raw file)
    }


def repredict(stored: dict, source: str, samples: int = 32, progress=None, profiles_out=None) -> dict:
    """Predict a stored validation's measured steps again with today's model: the network model refitted
    on the file's own sweep, each host count's compute and kernels from its stored calibration. The
    measurements are the file's; only the predicted columns are new. A model change is checked against
    real runs in seconds, without hosts. The file is checked first (stored_run.py), and whatever the
    model then refuses is named in the file too; nothing is predicted until every row is ready.
    ``profiles_out``, a list, receives each row's profile (paired.repredict predicts speedups with them)."""
    from clustersim.errors import InputError
    from clustersim.testbed.stored_run import parse_stored_run

    run, rate_bits = parse_stored_run(stored, source)
    j = run.job
    job = Job(j.model, j.layers, j.width, j.batch, j.seq, j.heads, j.steps, j.interval)
    parsed, profiles = [], {}  # the rows of one host count share a calibration: one fit for them all
    for i, row in enumerate(run.rows):
        where = f"rows.{i}"
        if row.optimizer in KERNELS and not row.calibration_kernels:
            raise InputError(
                f"{row.optimizer} on {row.hosts} hosts has no stored kernel calibration (written by an "
                "older version): re-run `clustersim testbed validate` to re-predict it",
                source=source,
                key=f"{where}.calibration_kernels",
            )
        kernels = [k.model_dump() for k in row.calibration_kernels] if row.calibration_kernels else None
        phases = row.calibration_phases_s.model_dump()
        local = {"hosts": row.hosts, **{k: {"median_s": v} for k, v in phases.items()}}
        measured = {k: {"median_s": v} for k, v in row.measured_phases_s.items()}
        step = (row.measured_s, row.measured_p10_s, row.measured_p90_s)
        measured["step"] = dict(zip(("median_s", "p10_s", "p90_s"), step))
        try:  # what the model refuses (a job too large to simulate, a calibration it cannot use)
            key = json.dumps([row.network_fitted_on_ranks, phases, kernels], sort_keys=True)
            if key not in profiles:
                profiles[key] = _profile(run.sweep, max(row.network_fitted_on_ranks) + 1, local, job, kernels)
            profile = profiles[key]
            scenario = scenario_for(row.hosts, rate_bits, job, row.optimizer)
        except InputError as exc:
            raise _in_file(exc, source, where) from None
        parsed.append((row, measured, local, kernels, profile, scenario))
    new_rows = []
    for i, (row, measured, local, kernels, profile, scenario) in enumerate(parsed):
        try:
            result = simulate(scenario, profile, uncertainty_samples=samples)
        except InputError as exc:
            raise _in_file(exc, source, f"rows.{i}") from None
        new = _row(row.hosts, row.optimizer, measured, result, row.network_fitted_on_ranks, local, kernels)
        new["measured_wire_sent_bytes"] = stored["rows"][i].get("measured_wire_sent_bytes")
        if row.pair_ratios:
            new["pair_ratios"] = list(row.pair_ratios)
        new_rows.append(new)
        if progress is not None:
            progress(f"{row.optimizer} on {row.hosts} hosts ({i + 1} of {len(parsed)})")
    if profiles_out is not None:
        profiles_out.extend(p[4] for p in parsed)
    return {**stored, "rows": new_rows}


def _in_file(exc, source: str, where: str):
    """An error of the scenario or profile built from a stored row, named in the stored file."""
    from clustersim.errors import InputError

    inner = f"{exc.key}: " if exc.key else ""
    return InputError(f"{inner}{exc.message} (from this row and the file's job)", source=source, key=where)
