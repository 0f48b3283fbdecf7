"""Single-GPU and single-node training throughput, predicted against published measurements.

Each row of validation/data/gpu_throughput.yaml (NVIDIA DeepLearningExamples' BERT-Large and
ResNet-50 tables, MLPerf Training logs) becomes a scenario with the row's own published settings:
GPU and count, model, micro-batch, gradient accumulation, sequence length, precision and execution
mode. What the row's code does that the workload cannot express is mapped once for all rows, never
per row:

* optimizer: LAMB is priced as Adam (the same fp32 states; its trust ratios add two reductions, under
  0.5% of a step at the tables' 32-512 accumulated micro-batches), LARS as SGD with momentum;
* attention: DeepLearningExamples' BERT (modeling.py, 2020-2022) writes the attention scores and runs
  scale, mask, softmax and dropout over them as separate ops in eager PyTorch (``workload.attention:
  eager``, the eager tables say so) and as TorchScript-fused kernels when scripted (``unfused``, the
  default of a row);
* a DGX-1's V100s are an NVLink mesh, DGX A100/H100 nodes an NVSwitch.

Rows whose sequences are binned by length (``variable_length``) run shorter sequences than their
``seq_len`` on average, which a fixed-length workload cannot represent: they are predicted and shown
but not scored.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from clustersim import catalog
from clustersim.errors import InputError
from clustersim.scenario import validate_scenario
from clustersim.simulator import simulate
from clustersim.validation.published import slowness
from clustersim.validation.throughput_data import ThroughputRow, load_gpu_throughput

OPTIMIZER = {"lamb": "adam", "adam": "adam", "sgd_momentum": "sgdm", "sgdm": "sgdm", "lars": "sgdm"}


@dataclass
class ThroughputResult:
    model: str
    gpu: str
    gpus: int
    micro_batch: int
    seq_len: int | None
    precision: str
    execution: str
    published: float
    predicted: float
    error: float
    p10: float | None
    p90: float | None
    scored: bool  # False: sequences binned by length, shorter than seq_len (shown, not scored)
    source: str
    source_label: str = ""  # the source in a few words (ThroughputRow.source_label)
    compute: str = "defaults"  # what priced the compute: "measured" (this model's own), "carried", "defaults"
    carried_from: str | None = None  # compute "carried": whose measurement ("GPT-2-1.5B seq 1024")
    implementation: str | None = None  # the code the row's step ran (ThroughputRow.implementation)

    @property
    def inside(self) -> bool | None:
        return None if self.p10 is None else self.p10 <= self.published <= self.p90

    def as_dict(self) -> dict:
        """``error`` raw, (predicted - published) / published of samples/s; ``slowness_error`` as the
        table signs it, + predicted too slow (a rate: the raw error turned)."""
        slow = slowness(self.error, "samples_per_s")
        return {**asdict(self), "inside": self.inside, "slowness_error": slow}


@dataclass
class ThroughputReport:
    name: str
    description: str
    rows: list[ThroughputResult]

    @property
    def scored(self) -> list[ThroughputResult]:
        return [r for r in self.rows if r.scored]

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(r.error) for r in self.scored)

    @property
    def max_abs_error(self) -> float:
        return max(abs(r.error) for r in self.scored)

    @property
    def coverage(self) -> float | None:
        flags = [r.inside for r in self.scored if r.inside is not None]
        return sum(flags) / len(flags) if flags else None


def unused_measurements(rows: list[ThroughputResult], profile) -> list[str]:
    """Why a profile's own measurement of a row's model did not price it: for each model the profile
    measured whose rows came out 'defaults', the code it measured against the code the rows ran (a
    measurement prices only the code it timed: docs/gpu-compute.md). One line per model."""
    out = []
    for model in sorted({r.model for r in rows if r.compute == "defaults"}):
        measured = sorted(
            {
                m.fingerprint.implementation or "not recorded"
                for m in profile.model_compute
                if m.model == model
            }
        )
        ran = sorted({r.implementation or "the catalog's default" for r in rows if r.model == model})
        if measured:
            out.append(
                f"{model}: the profile measured code {', '.join(measured)}, these rows ran {', '.join(ran)}: "
                "only the profile's hardware rates price them"
            )
    return out


def scenario_for(row: ThroughputRow, name: str = "published row"):
    """The row's own published setup as a scenario (module docstring: what is mapped and why)."""
    workload = {
        "model": row.model,
        "micro_batch": row.micro_batch,
        "precision": row.precision,
        "gradient_accumulation": row.gradient_accumulation,
        "execution": row.execution,
    }
    if row.memory_format is not None:
        workload["memory_format"] = row.memory_format
    if row.image_size is not None:
        workload["batch_norm"] = row.batch_norm
    if row.pointwise is not None:
        workload["pointwise"] = row.pointwise
    if row.implementation is not None:
        workload["implementation"] = row.implementation
    if row.seq_len is not None:
        workload["seq_len"] = row.seq_len
        workload["attention"] = row.attention
        workload["pad_vocab_to_multiple_of"] = row.pad_vocab_to_multiple_of
    training = {
        "optimizer": OPTIMIZER[row.optimizer],
        "optimizer_options": {"implementation": row.optimizer_implementation},
        "gradient_clipping": row.gradient_clipping,
        "host_sync_before_update": row.host_sync_before_update,  # None: the simulator's default
        "host_sync_after_forward": row.host_sync_after_forward,
    }
    return validate_scenario(
        {
            "name": name,
            "cluster": {
                "nodes": row.nodes,
                "gpus_per_node": row.gpus // row.nodes,
                "gpu": row.gpu,
                "intra_node": {"fabric": "nvlink_mesh" if row.gpu.startswith("V100") else "nvswitch"},
                "nic": {"kind": "infiniband", "count": 8, "line_rate_gbps": 200},
            },
            "workload": workload,
            "training": training,
        },
        name,
    )


def rows_for_profile(rows: list[ThroughputRow], profile) -> list[ThroughputRow]:
    """The rows a profile can price: those on its GPU's chip (a profile describes one device); all rows
    without a profile. None of them is one line naming the profile."""
    if profile is None:
        return rows
    chip = catalog.chip_of(profile.device)
    kept = [r for r in rows if catalog.gpu(r.gpu).chip == chip]
    if not kept:
        gpus = ", ".join(sorted({r.gpu for r in rows}))
        raise InputError(
            f"profile measured on {profile.device!r} matches no row (the rows' GPUs: {gpus})",
            source=profile.label,
            key="device",
        )
    return kept


def validate_throughput(
    profile=None, samples: int = 32, progress=None, dataset: str = "gpu_throughput"
) -> ThroughputReport:
    """Predict every row of ``dataset``; with a profile, the rows on its GPU (rows_for_profile)."""
    from clustersim.calibration.profile import load_profile

    data = load_gpu_throughput(dataset)
    if isinstance(profile, str):
        profile = load_profile(profile)
    rows = rows_for_profile(list(data.rows), profile)
    description = data.description
    if len(rows) < len(data.rows):
        description += f" (the {len(rows)} rows on {profile.device}, the profile's GPU)"
    results = []
    for i, row in enumerate(rows):
        result = simulate(scenario_for(row), profile, uncertainty_samples=samples)
        predicted = row.samples_per_step / result.iteration_time
        lo = hi = None
        if result.interval is not None:
            lo, hi = row.samples_per_step / result.interval.p90, row.samples_per_step / result.interval.p10
        results.append(
            ThroughputResult(
                row.model, row.gpu, row.gpus, row.micro_batch, row.seq_len or row.image_size, row.precision,
                row.execution, row.throughput, predicted, predicted / row.throughput - 1, lo, hi,
                not row.variable_length, row.source, row.source_label, result.compute_from,
                result.carried_from, row.implementation,
            )
        )  # fmt: skip
        if progress is not None:
            progress(i + 1, len(rows))
    return ThroughputReport(data.name, description, results)
