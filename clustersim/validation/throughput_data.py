"""Single-GPU and single-node training throughputs as typed rows: the published ones
(data/gpu_throughput.yaml) and this project's own GPU measurements (data/gpu_steps.yaml).

The file groups rows by the published table they come from: a table's keys (source, system, GPU,
model, framework, execution, ...) apply to each of its rows, and a row adds or overrides its own
(GPU count, precision, micro-batch, throughput). Loading flattens that into one self-contained
``ThroughputRow`` per published number, checked against the catalogs, so a comparison never has to
know the grouping. This module only reads the data; predicting the rows is the validation's job.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, model_validator

from clustersim import catalog
from clustersim.catalog import Precision
from clustersim.errors import InputError
from clustersim.io import first_error, load_yaml
from clustersim.optimizer_options import UpdateImplementation
from clustersim.scenario import Attention, BatchNorm, GradientClipping

FILE = "gpu_throughput.yaml"
# dataset name (validate --dataset) -> its file under data/
THROUGHPUT_DATASETS = {"gpu_throughput": FILE, "gpu_steps": "gpu_steps.yaml"}

# How the published code issues its kernels: PyTorch eager; a model compiled to fused kernels
# (TorchScript/nvFuser, torch.compile); or a training step replayed as captured CUDA graphs.
Execution = Literal["eager", "compiled", "cuda_graphs"]
# Optimizers as the published code runs them; lamb and lars are layer-wise trust-ratio variants of
# Adam and SGD momentum.
PublishedOptimizer = Literal["adam", "lamb", "sgdm", "lars"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ThroughputRow(_Strict):
    """One published throughput with the settings it was measured at."""

    source: str = Field(min_length=1, description="repository + file + table heading, or URL")
    source_version: str = Field(min_length=1, description="the upstream version the number was read at")
    system: str = Field(min_length=1, description="the machine as the source names it")
    gpu: str = Field(description="catalogs/gpus.yaml name")
    gpu_memory_gb: float = Field(gt=0, description="the published GPU's memory (a catalog GPU may differ)")
    gpus: int = Field(gt=0)
    nodes: int = Field(gt=0)
    model: str = Field(description="catalogs/models.yaml name")
    task: str = Field(min_length=1)
    micro_batch: int = Field(gt=0, description="samples per GPU per forward/backward pass")
    gradient_accumulation: int = Field(1, gt=0)
    seq_len: int | None = Field(
        None, gt=0, description="transformers: tokens per sequence (the maximum if variable)"
    )
    variable_length: bool = Field(False, description="sequences binned or unpadded, so shorter than seq_len")
    image_size: int | None = Field(None, gt=0, description="CNNs: input height = width")
    precision: Precision
    optimizer: PublishedOptimizer
    execution: Execution
    memory_format: Literal["channels_last", "contiguous"] | None = Field(
        None, description="CNNs: the activations' layout (contiguous = NCHW)"
    )
    batch_norm: BatchNorm = Field(
        "separate",
        description="CNNs: batch-norm kernels separate or fused with the convolutions (workload.batch_norm)",
    )
    attention: Attention = Field(
        "unfused",
        description="transformers: scaled_dot_product_attention (fused), scores in memory through fused "
        "softmax kernels (unfused), or through plain PyTorch ops (eager): workload.attention",
    )
    pointwise: Literal["unfused", "fused"] | None = Field(
        None, description="transformers: the model code's pointwise kernels (workload.pointwise)"
    )
    optimizer_implementation: UpdateImplementation = Field(
        "fused", description="how the update's kernels run (training.optimizer_options.implementation)"
    )
    gradient_clipping: GradientClipping = Field(
        "none", description="clipping by gradient norm before the update (training.gradient_clipping)"
    )
    host_sync_before_update: StrictBool | None = Field(
        None,
        description="the training loop reads a device value on the host between backward and the "
        "optimizer step (training.host_sync_before_update); unset: the simulator's default",
    )
    host_sync_after_forward: StrictBool = Field(
        False,
        description="the host waits for the device between forward and backward: a per-phase timer's "
        "synchronise (training.host_sync_after_forward)",
    )
    implementation: str | None = Field(
        None, description="the model's code (workload.implementation); unset: the catalog model's default"
    )
    pad_vocab_to_multiple_of: int = Field(
        1, gt=0, description="transformers: the code pads the vocabulary to a multiple of this"
    )
    framework: str = Field(min_length=1)
    data_loader: str = Field(min_length=1)
    throughput: float = Field(gt=0, description="samples/s of the whole job (sequences/s, images/s)")
    notes: str = Field(min_length=1, description="where each setting not in the table was read")

    @model_validator(mode="after")
    def _whole_nodes(self) -> "ThroughputRow":
        if self.gpus % self.nodes:
            raise ValueError(f"{self.gpus} GPUs is not a whole number of {self.nodes} nodes")
        return self

    @property
    def source_label(self) -> str:
        """The source in a few words for a table: MLPerf's round, DeepLearningExamples' NGC container, or
        the framework a step was measured with (``source`` and ``source_version`` say it in full)."""
        mlperf = re.search(r"training_results_(v\d+\.\d+)", self.source)
        if mlperf:
            return f"MLPerf {mlperf.group(1)}"
        container = re.search(r"(\d\d\.\d\d)", self.framework)
        if "DeepLearningExamples" in self.source and container:
            return f"DLE {container.group(1)}"
        torch = re.search(r"PyTorch \d+\.\d+", self.framework)
        return torch.group(0) if torch else self.framework.split(",")[0]

    @property
    def samples_per_step(self) -> int:
        """Samples per optimizer step over the whole job."""
        return self.micro_batch * self.gradient_accumulation * self.gpus


class ThroughputDataset(_Strict):
    name: str
    description: str
    metric: Literal["samples_per_s"]
    rows: list[ThroughputRow]


def parse_gpu_throughput(raw: dict, source: str = FILE) -> ThroughputDataset:
    """Flatten the tables of ``raw`` into rows and check each against the catalogs; errors name the
    file and the key (``tables[2].rows[1].gpu``)."""
    if not isinstance(raw, dict) or not isinstance(raw.get("tables"), list):
        raise InputError("expected a mapping with a list under 'tables'", source=source, key="tables")
    rows = []
    for i, table in enumerate(raw["tables"]):
        if not isinstance(table, dict) or not isinstance(table.get("rows"), list) or not table["rows"]:
            raise InputError("a table needs a non-empty list of rows", source=source, key=f"tables[{i}].rows")
        shared = {k: v for k, v in table.items() if k != "rows"}
        for j, entry in enumerate(table["rows"]):
            key = f"tables[{i}].rows[{j}]"
            if not isinstance(entry, dict):
                raise InputError("a row is a mapping of settings", source=source, key=key)
            try:
                row = ThroughputRow.model_validate({**shared, **entry})
            except ValidationError as exc:
                field, msg = first_error(exc)
                where = key if field == "(top level)" else f"{key}.{field}"  # a whole-row check
                raise InputError(msg, source=source, key=where) from None
            _check_catalogs(row, source, key)
            rows.append(row)
    header = {k: raw.get(k) for k in ("name", "description", "metric")}
    try:
        return ThroughputDataset(**header, rows=rows)
    except ValidationError as exc:
        field, msg = first_error(exc)
        raise InputError(msg, source=source, key=field) from None


def _check_catalogs(row: ThroughputRow, source: str, key: str) -> None:
    """Exact catalog names (no case folding: the file is data others read), and the shape keys the
    model's family needs."""
    gpus, models = catalog.gpus(), catalog.models()
    if row.gpu not in gpus:
        raise InputError(
            f"unknown GPU {row.gpu!r} (known: {', '.join(sorted(gpus))})", source=source, key=f"{key}.gpu"
        )
    if row.model not in models:
        raise InputError(
            f"unknown model {row.model!r} (known: {', '.join(sorted(models))})",
            source=source,
            key=f"{key}.model",
        )
    arch = models[row.model]
    if arch.family == "transformer":
        if row.seq_len is None or row.image_size is not None:
            raise InputError(
                "a transformer row gives seq_len, not image_size", source=source, key=f"{key}.seq_len"
            )
        if row.seq_len > arch.max_positions:
            raise InputError(
                f"seq_len {row.seq_len} exceeds {row.model}'s {arch.max_positions} positions",
                source=source,
                key=f"{key}.seq_len",
            )
        if row.batch_norm != "separate":
            raise InputError(
                "batch_norm describes a convolution network's kernels; a transformer row has none",
                source=source,
                key=f"{key}.batch_norm",
            )
    elif row.image_size is None or row.seq_len is not None:
        raise InputError("a CNN row gives image_size, not seq_len", source=source, key=f"{key}.image_size")
    peaks = gpus[row.gpu].peak_tflops
    if row.precision not in peaks:  # e.g. tf32 or bf16 on a V100: a transcription error
        raise InputError(
            f"{row.gpu} has no {row.precision} rate in the catalog (it has {', '.join(sorted(peaks))})",
            source=source,
            key=f"{key}.precision",
        )


def load_gpu_throughput(dataset: str = "gpu_throughput") -> ThroughputDataset:
    """A shipped throughput dataset (THROUGHPUT_DATASETS: clustersim/validation/data/)."""
    name = THROUGHPUT_DATASETS[dataset]
    text = resources.files("clustersim.validation").joinpath("data", name).read_text()
    return parse_gpu_throughput(load_yaml(text), source=name)
