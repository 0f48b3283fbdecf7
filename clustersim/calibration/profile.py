"""The calibration profile: a versioned, validated JSON file of measured costs.

A profile holds what was measured on one device type (GEMM TFLOP/s per precision, streaming
bandwidth, named kernels' bandwidth, per-micro-step compute phases of a model, collective fits) and
where it came from (provenance). The simulator prefers measured values over catalog defaults and
reports which ones it used.

Scaling to another GPU type (documented in docs/calibration.md): a compute-bound measurement keeps its
*efficiency* (measured / the measuring GPU's peak) and is applied to the target's peak FLOP/s; a
memory-bound one keeps its fraction of HBM bandwidth and is applied to the target's HBM bandwidth.
Compute phases and collective fits apply only to the device and cluster they were measured on.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)

from clustersim import catalog
from clustersim.catalog import LIMITS_SOURCE, Count, Number, below, beyond, limit
from clustersim.errors import InputError
from clustersim.identifiers import CollectiveAlgorithm, CollectiveOp, Protocol
from clustersim.io import first_error, parse_json, read_input_text

FORMAT = "clustersim-profile"
FORMAT_VERSION = 5
BUILTIN_PREFIX = "builtin:"


class _Strict(BaseModel):
    # NaN/inf never enter the simulator from a profile (json.loads reads NaN and Infinity).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# Numbers as every input schema reads them: finite, never true/false (catalog.Number / Count).
Positive = Annotated[Number, Field(gt=0)]


def _measured_time(value: float) -> float:
    """A measured time: 1 ns at the least (below any timer's resolution) and a day at the most
    (hardware_defaults.yaml limits measured_s_min, latency_s_max)."""
    why = below(value, "measured_s_min", "s, a timer's resolution") or beyond(
        value, "latency_s_max", "s, a day", "any measured step"
    )
    if why:
        raise ValueError(why)
    return value


def _time_at_most_a_day(value: float) -> float:
    why = beyond(value, "latency_s_max", "s, a day", "any measured step")
    if why:
        raise ValueError(why)
    return value


def _rate(name: str, what: str):
    """A measured rate no faster than the limit ``name`` (hardware_defaults limits): a GPU's peak or
    HBM, a host's DRAM."""

    def check(value: float) -> float:
        why = beyond(value, name, what, "any real part")
        if why:
            raise ValueError(why)
        return value

    return AfterValidator(check)


#: measured rates: a GPU's FLOP/s and memory bandwidth, a host's copy bandwidth
Tflops = Annotated[Number, Field(gt=0), _rate("gpu_peak_tflops", "TFLOP/s per GPU")]
DeviceGbs = Annotated[Number, Field(gt=0), _rate("gpu_hbm_gbs", "GB/s of device memory")]
HostGbs = Annotated[Number, Field(gt=0), _rate("host_dram_gbs", "GB/s of host memory")]

#: a measured duration: 1 ns to a day
MeasuredSeconds = Annotated[Number, Field(gt=0), AfterValidator(_measured_time)]
#: a fitted time or a time per unit that may be 0: at most a day
Seconds = Annotated[Number, Field(ge=0), AfterValidator(_time_at_most_a_day)]


# CPU Adam reads at least a parameter, its gradient and two moments per parameter (4 x fp32: 16 bytes)
# from host memory each step, so no host updates more parameters per second than the fastest host DRAM
# (hardware_defaults.yaml limits.host_dram_gbs) streams 16-byte records: 2.5e11 at 4,000 GB/s.
ADAM_BYTES_PER_PARAM = 16


def _adam_rate(value: float) -> float:
    top = limit("host_dram_gbs") * 1e9 / ADAM_BYTES_PER_PARAM
    if value > top:
        raise ValueError(
            f"{value:g} parameters/s is beyond any host (at most {top:.3g}: host_dram_gbs / "
            f"{ADAM_BYTES_PER_PARAM} bytes read per parameter; {LIMITS_SOURCE})"
        )
    return value


AdamRate = Annotated[Number, Field(gt=0), AfterValidator(_adam_rate)]


# Linux's largest CPU count (CONFIG_MAXSMP: NR_CPUS 8,192): no torch process runs more intra-op threads.
MAX_THREADS = 8192
# Commands listed in one profile's provenance: each `calibrate` run into it adds one; a list longer than
# this is not a profile a tool wrote (and reading one must not cost seconds).
MAX_COMMANDS = 1000


class CommandRecord(_Strict):
    """One command that wrote into a profile, and the machine and settings it measured on: a profile
    merges several (``calibrate run``'s hardware rates, then ``calibrate model`` or ``import-trace``
    entries, each possibly from another machine)."""

    source: str = Field(description="the command line")
    date: str | None = None
    wrote: str = Field("", description="what it wrote, e.g. 'model tiny-bert seq 128 fp32 (replaced ...)'")
    device_name: str | None = None
    cpu: str | None = Field(None, description="the measuring machine's CPU model (None: not known)")
    host: str | None = None
    torch: str | None = None
    threads: Count | None = Field(
        None, gt=0, le=MAX_THREADS, description="torch's intra-op threads (None: not known)"
    )
    quick: StrictBool | None = Field(None, description="calibrate run --quick (fewer sizes, no held-out)")


class HostCpuShare(_Strict):
    """One emulated host's CPU share (testbed/cpu_share.py): a CFS quota per period, on given cores."""

    cpu_quota_us: Count = Field(gt=0, description="CPU time the host may use per period, µs")
    cpu_period_us: Count = Field(gt=0, description="the CFS period, µs")
    cpus: list[Annotated[Count, Field(ge=0, lt=MAX_THREADS)]] = Field(
        default_factory=list, description="the machine's cores the host was pinned to"
    )


class TestbedRecord(_Strict):
    """The emulated testbed a collective sweep ran on (``calibrate run --testbed``, docs/testbed.md): N
    hosts as network namespaces on one machine, each linked to a shared bridge through a veth shaped
    with tc to a rate. Not real NICs: what a fit of it says about a real cluster rests on the model, not
    on the hardware (a None field: the sweep did not record it)."""

    __test__ = False  # not a pytest test class, whatever its name

    emulated: str = Field(description="how the hosts and links were emulated")
    hosts: Count | None = Field(None, ge=2, description="emulated hosts the sweep ran on (its largest group)")
    kind: Literal["ethernet_tcp"] | None = Field(
        None, description="the modelled NIC kind (TCP over Ethernet)"
    )
    line_rate_gbps: Positive | None = Field(None, description="each host's shaped link rate, Gb/s")
    shaper: str | None = Field(None, description="the tc qdisc that shaped each link, e.g. tbf")
    cpus_per_host: Annotated[Number, Field(ge=0, le=MAX_THREADS)] | None = Field(
        None,
        description="each host's CPU share in cores (0: no share, the hosts shared the machine's cores; "
        "None: not recorded)",
    )
    host_cpu_shares: list[HostCpuShare] | None = Field(
        None,
        description="each host's CFS quota, period and cores, host 0 first (None: no share or not recorded)",
    )
    cfs_bandwidth_slice_us: Annotated[Number, Field(gt=0)] | None = Field(
        None, description="the kernel's CFS bandwidth slice the shares ran under, µs"
    )
    machine_cpus: Count | None = Field(None, gt=0, le=MAX_THREADS, description="the machine's cores")
    machine: str | None = Field(None, description="the machine's host name")
    kernel: str | None = Field(None, description="the machine's Linux kernel release")

    @field_validator("line_rate_gbps")
    @classmethod
    def _a_nic(cls, value: float | None) -> float | None:
        why = beyond(value, "nic_line_rate_gbps", "Gb/s", "any NIC")
        if why:
            raise ValueError(why)
        return value

    @model_validator(mode="after")
    def _one_share_per_host(self) -> "TestbedRecord":
        if (
            self.host_cpu_shares is not None
            and self.hosts is not None
            and len(self.host_cpu_shares) != self.hosts
        ):
            raise ValueError(
                f"host_cpu_shares lists {len(self.host_cpu_shares)} hosts, hosts says {self.hosts}: "
                "one share per host"
            )
        return self


class CollectiveSweep(_Strict):
    """What a collective sweep measured across two or more ranks, read off its records (the fits use
    these and only these): the ops, group shapes and message sizes, and the timed repetitions."""

    ops: list[str] = Field(description="the collectives measured")
    groups: list[tuple[Count, Count]] = Field(description="(nodes, ranks per node) of each group measured")
    sizes: Count = Field(gt=0, description="distinct message sizes measured")
    min_bytes: Positive = Field(description="the smallest message measured, bytes")
    max_bytes: Positive = Field(description="the largest message measured, bytes")
    repeats: Count | None = Field(
        None, gt=0, description="timed repetitions per size, the fewest of any (None: not recorded)"
    )

    @model_validator(mode="after")
    def _ordered(self) -> "CollectiveSweep":
        if self.max_bytes < self.min_bytes:
            raise ValueError(f"max_bytes {self.max_bytes:g} is below min_bytes {self.min_bytes:g}")
        return self


class Provenance(_Strict):
    """Where the profile's hardware rates came from (the first command that wrote it, usually
    ``calibrate run``), and in ``commands`` every command that wrote into it since, in order."""

    source: str = Field(description="what produced it: a command line, or a publication")
    date: str | None = None
    device_name: str | None = None
    device_count: Count | None = None
    driver: str | None = None
    cuda: str | None = None
    torch: str | None = None
    nccl: str | None = None
    gloo: str | None = None
    cpu: str | None = None
    host: str | None = None
    threads: Count | None = Field(
        None,
        gt=0,
        le=MAX_THREADS,
        description="torch's intra-op threads the hardware rates were measured with",
    )
    quick: StrictBool | None = Field(None, description="measured with calibrate run --quick")
    testbed: TestbedRecord | None = Field(
        None, description="the emulated testbed the collectives were measured on (None: not a testbed sweep)"
    )
    collective_sweep: CollectiveSweep | None = Field(
        None, description="what the collective sweep measured (None: no collectives across 2+ ranks)"
    )
    commands: list[CommandRecord] = Field(
        default_factory=list,
        max_length=MAX_COMMANDS,
        description="every command that wrote into the profile, oldest first",
    )
    dropped: list[str] = Field(
        default_factory=list, description="measurements not fitted (stalls, outliers), each with why"
    )
    defaults: list[str] = Field(
        default_factory=list,
        description="blocks left out, so the simulator keeps its defaults for them, each with why",
    )


class ComputePhases(_Strict):
    """Measured per-micro-step times of one model configuration on ``Profile.device``."""

    model: str
    micro_batch: Count = Field(gt=0)
    seq_len: Count = Field(gt=0)
    precision: str
    forward_s: MeasuredSeconds
    backward_s: MeasuredSeconds
    other_s: Annotated[Number, AfterValidator(_time_at_most_a_day)] = Field(
        0.0, ge=0, description="per-step work outside forward/backward/communication, optimizer included"
    )
    source: str = ""
    stated: StrictBool = Field(
        False,
        description="the phases are a stated assumption (a paper's simulated step time), not a measurement: "
        "exact, so the band leaves them fixed and moves only what the device prices",
    )
    compute_only: StrictBool = Field(
        False,
        description="the stated step (forward + backward) is all the work a step does: the simulation it "
        "reproduces gives everything else no time (the optimizer update, casts, copies, compression and "
        "outer-optimizer kernels are priced at zero), so a step is its phases plus the communication they "
        "do not hide; requires stated",
    )

    @field_validator("compute_only")
    @classmethod
    def _compute_only_is_stated(cls, value: bool, info):
        if value and not info.data.get("stated"):
            raise ValueError(
                "compute_only needs stated: true (an idealised simulation's step time, not a measurement: "
                "a measured step's update and kernels take time)"
            )
        return value


class FitQuality(_Strict):
    """How well a fit describes its measurements (stored so `calibrate show` can report it)."""

    points: Count
    residual_rms_rel: Number = Field(description="RMS of (fit - measured) / measured over all points")
    holdout_max_rel_error: Number | None = Field(
        None, description="max |error| on sizes held out of a fit to the other sizes (every other size)"
    )
    holdout_points: Count = 0
    alpha_ci95_s: list[Number] = Field(default_factory=list, description="per segment, +- 95% interval")
    beta_ci95_s_per_byte: list[Number] = Field(default_factory=list)


class CollectiveFit(_Strict):
    """α-β fit of one collective on one group shape: time = alpha + bytes * beta (segmented)."""

    op: str
    nodes: Count = Field(gt=0)
    gpus_per_node: Count = Field(gt=0)
    segments: list[tuple[Number, Number, Number]] = Field(
        description="(min_bytes, alpha_s, beta_s_per_byte), ascending by min_bytes"
    )
    source: str = ""
    quality: FitQuality | None = None
    busbw_by_size: list[tuple[Number, Number]] = Field(
        default_factory=list,
        description="(bytes, measured bus bandwidth GB/s): the per-size efficiency table",
    )

    @field_validator("segments")
    @classmethod
    def _physical(cls, segments: list) -> list:
        if not segments:
            raise ValueError("a fit needs at least one segment")
        for start, alpha, beta in segments:
            for name, v in (("min_bytes", start), ("alpha_s", alpha), ("beta_s_per_byte", beta)):
                _finite(v, name)
                if v < 0:
                    raise ValueError(f"{name} {v:g} is negative: a collective cannot take negative time")
        starts = [seg[0] for seg in segments]
        if any(b <= a for a, b in zip(starts, starts[1:])):
            raise ValueError("segments must be in ascending order of min_bytes, each size in one segment")
        return segments


def _finite(value: float, what: str) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number")
    return value


def _log_sigma(sigma: float, what: str) -> None:
    """A log-sigma no fit gives (limits.profile_log_sigma_max): its bands would span decades."""
    top = limit("profile_log_sigma_max")
    if sigma > top:
        raise ValueError(
            f"{what} is a log-sigma of {sigma:.3g}, beyond any fit (at most {top:g}, a factor of "
            f"{math.exp(top):.0f} per sigma; {LIMITS_SOURCE})"
        )


def _covariance(matrix: list[list[float]], k: int, what: str) -> None:
    """A covariance of ``k`` parameters: k x k, finite, symmetric and positive semi-definite. Intervals
    are drawn from it (a Cholesky factor), which a matrix of another shape or sign cannot give."""
    import numpy as np

    if len(matrix) != k or any(len(row) != k for row in matrix):
        raise ValueError(f"{what} must be {k} x {k}, one row and column per parameter")
    for row in matrix:
        for v in row:
            _finite(v, f"{what} entry")
    for i in range(k):
        _log_sigma(math.sqrt(max(matrix[i][i], 0.0)), f"{what}[{i}][{i}] (a variance)")
    if k == 0:
        return
    m = np.asarray(matrix, float)
    scale = max(float(np.abs(m).max()), 1e-300)
    if not np.allclose(m, m.T, rtol=1e-6, atol=1e-12 * scale):
        raise ValueError(f"{what} is not symmetric: not a covariance")
    if float(np.linalg.eigvalsh(m).min()) < -1e-9 * scale:
        raise ValueError(f"{what} has a negative eigenvalue: not a covariance (not positive semi-definite)")


class ExtrapolationCheck(_Strict):
    """The network fit redone without the largest measured group, then used to predict it."""

    fitted_on_ranks: list[Count]
    predicted_ranks: Count
    points: Count
    median_abs_rel_error: Number = Field(ge=0)
    max_abs_rel_error: Number = Field(ge=0)
    p10_p90_coverage: Number = Field(ge=0, le=1)
    by_op: dict[str, Number] = Field(default_factory=dict)


class NetworkCalibration(_Strict):
    """Fitted parameters of the topology collective model (calibration/network_fit.py), usable at any
    scale: per link class effective bandwidth factor and hop latency, launch latency, per-op
    efficiency and latency factor, with the covariance of their logarithms."""

    backend: Literal["nccl", "gloo"] = Field(
        description="whose algorithms and protocols were measured (the two the collective model knows)"
    )
    cluster: dict = Field(description="the cluster the measurements were taken on (scenario cluster schema)")
    source: str = ""
    parameters: dict[str, Number] = Field(
        description="base_s, hop_s.<class>, bw_eff.<class>, op_bw_eff.<op>, op_latency_scale.<op>, "
        "pacing_cv.<network class>"
    )
    log_covariance: list[list[Number]] = Field(description="covariance of log(parameters), in their order")
    residual_sigma: Number = Field(ge=0, description="log-sigma of measured medians about the fitted model")
    calibrated_classes: list[str] = Field(default_factory=list)
    algorithms: dict[CollectiveOp, CollectiveAlgorithm] = Field(
        default_factory=dict, description="op -> the algorithm the backend runs (no fit chose it)"
    )
    protocols: list[Protocol] | None = None
    points: Count = Field(ge=0)
    shapes: list[tuple[Count, Count]] = Field(default_factory=list)
    extrapolation: ExtrapolationCheck | None = None
    spread: dict[CollectiveOp, list[tuple[Number, Number]]] = Field(
        default_factory=dict,
        description="op -> (bytes, log-sigma of one timed collective about its median: the median over "
        "the measured group shapes of that size's P10-P90), ascending: the measured sizes and their "
        "run-to-run spread, which every band priced from this fit holds",
    )

    @field_validator("shapes")
    @classmethod
    def _shapes(cls, shapes: list) -> list:
        """The group shapes the fit measured, (nodes, ranks per node): each at least one of each (a band
        past the measured node counts widens from the largest of them)."""
        most = limit("cluster_gpus")  # the largest cluster a scenario may describe
        for nodes, ranks in shapes:
            if nodes < 1 or ranks < 1:
                raise ValueError(f"a measured group shape needs a node and a rank, got {nodes}x{ranks}")
            if nodes * ranks > most:
                raise ValueError(f"a measured group of {nodes:,}x{ranks:,} GPUs is more than {most:,}")
        return shapes

    @field_validator("spread")
    @classmethod
    def _spread(cls, spread: dict) -> dict:
        for op, table in spread.items():
            sizes = [b for b, _ in table]
            if any(b <= 0 for b in sizes) or any(b <= a for a, b in zip(sizes, sizes[1:])):
                raise ValueError(f"spread of {op}: sizes must be positive and ascending")
            for _, sigma in table:
                if sigma < 0:
                    raise ValueError(f"spread of {op}: a log-sigma cannot be negative")
                _log_sigma(sigma, f"spread of {op}")
        return spread

    @field_validator("cluster")
    @classmethod
    def _a_cluster(cls, cluster: dict) -> dict:
        """The measured cluster in the scenario's cluster schema (``nodes: many`` is no cluster): the
        simulator prices collectives on it."""
        from clustersim.scenario import ClusterSpec

        try:
            ClusterSpec.model_validate(cluster)
        except ValidationError as exc:
            key, msg = first_error(exc, ("gpu name", "inline gpu"), model=ClusterSpec)
            raise ValueError(f"cluster.{key}: {msg}") from None
        return cluster

    @field_validator("parameters")
    @classmethod
    def _plausible_parameters(cls, parameters: dict) -> dict:
        """Latencies (base_s, hop_s.*) positive and at most a day; factors (bw_eff, op_bw_eff,
        op_latency_scale) within the decades a fit of a real stack lands in (hardware_defaults limits)."""
        for name, value in parameters.items():
            _finite(value, name)
            if value <= 0:
                raise ValueError(f"parameter {name} must be positive (got {value:g})")
            if name.split(".")[0] in ("base_s", "hop_s"):
                why = beyond(value, "latency_s_max", "s, a day", "any real link")
            else:
                why = beyond(value, "profile_factor_max", "as a factor", "any fitted factor") or below(
                    value, "profile_factor_min", "as a factor"
                )
            if why:
                raise ValueError(f"parameter {name}: {why}")
        return parameters

    @model_validator(mode="after")
    def _consistent(self) -> "NetworkCalibration":
        _covariance(self.log_covariance, len(self.parameters), "log_covariance")
        _finite(self.residual_sigma, "residual_sigma")
        _log_sigma(self.residual_sigma, "residual_sigma")
        return self


class GemmHoldout(_Strict):
    fitted_on: str
    predicted: Count
    median_abs_rel_error: Number = Field(ge=0)
    max_abs_rel_error: Number = Field(ge=0)


class GemmModel(_Strict):
    """The GEMM shape model of one precision (calibration/compute_fit.py):
    t = launch + max(W / R_max, bytes / memory)."""

    r_max_tflops: Tflops
    launch_s: Number = Field(ge=0)
    memory_gbs: DeviceGbs
    log_sigma: Number = Field(ge=0, description="scatter of log time about the model")
    log_covariance: list[list[Number]] = Field(default_factory=list)
    points: Count = Field(ge=0)
    holdout: GemmHoldout | None = None

    @model_validator(mode="after")
    def _finite_values(self) -> "GemmModel":
        for name in ("r_max_tflops", "launch_s", "memory_gbs", "log_sigma"):
            _finite(getattr(self, name), name)
        _log_sigma(self.log_sigma, "log_sigma")
        if self.log_covariance:  # log r_max and log launch
            _covariance(self.log_covariance, 2, "log_covariance")
        return self


class HostMeasurements(_Strict):
    """Host-side rates (CPU optimizer offload, staging copies)."""

    cpu_adam_params_per_s: dict[Annotated[int, Field(gt=0)], AdamRate] = Field(
        default_factory=dict, description="by thread count"
    )
    copy_gbs: dict[str, HostGbs] = Field(default_factory=dict, description="h2d/d2h, pinned/pageable")


class Fingerprint(_Strict):
    """What a compute measurement depends on besides the model: a step timed under other software
    or settings (another torch, eager against CUDA graphs, another attention kernel) is another
    measurement. The simulator warns when a scenario asks for settings that differ from these."""

    device: str = Field(description="the device's own name, e.g. 'NVIDIA H200' or 'cpu'")
    torch: str | None = None
    cuda: str | None = None
    precision: str = Field(description="fp32 | fp16 | bf16: the autocast dtype (fp32: no autocast)")
    autocast: bool = True
    attention: str | None = Field(None, description="sdpa | eager | flash_attention_2 | ...")
    execution: Literal["eager", "compiled", "cuda_graphs"] = "eager"
    implementation: str | None = Field(
        None,
        description="the model's code (workload.implementation): plain (clustersim's plain-torch build of "
        "a catalog model), hf (Hugging Face transformers), torchvision, megatron, deepspeed, or the name "
        "of the user's own measured code (--module, an imported job); None: not recorded (an older "
        "profile whose source does not say)",
    )
    optimizer: str | None = Field(
        None,
        description="the optimizer the optimizer phase timed, as torch names it in lower case: adamw "
        "(fused on a GPU), sgd, ...; None: not recorded",
    )
    threads: Count | None = Field(
        None,
        gt=0,
        le=MAX_THREADS,
        description="torch's intra-op threads the step ran with (torch.get_num_threads()): on a CPU the "
        "step's time depends on it; None: not recorded (an imported trace, an older profile)",
    )
    cpu: str | None = Field(None, description="the measuring machine's CPU model (None: not recorded)")
    host: str | None = Field(None, description="the measuring machine's host name (None: not recorded)")


def implementation_from_source(source: str, model: str = "") -> str | None:
    """The code a measurement stored without ``implementation`` timed, read off the command that made it
    (profiles written before the field): ``--hf-config`` a Hugging Face model, ``--model`` or
    ``--scenario`` clustersim's plain-torch build, ``--module`` the user's own code (its name), an
    imported trace the user's job, taken as the code its catalog model runs by default."""
    if "--hf-config" in source:
        return "hf"
    if "--module" in source:
        return model or None
    if "import-trace" in source:
        try:
            return catalog.default_implementation(catalog.model(model))
        except InputError:
            return model or None
    if "calibrate model" in source:
        return "plain"
    return None


def optimizer_from_source(source: str) -> str | None:
    """The optimizer a measurement stored without ``optimizer`` timed: ``calibrate model``'s
    ``--optimizer`` (adamw unless it says sgd); an imported trace's is not in its command."""
    if "calibrate model" not in source:
        return None
    return "sgd" if "--optimizer sgd" in source else "adamw"


def _with_implementation(entry: object, model: str = "") -> object:
    """A stored measurement (a dict) with its fingerprint's implementation and optimizer filled from its
    source where they are missing."""
    if not isinstance(entry, dict) or not isinstance(entry.get("fingerprint"), dict):
        return entry
    fingerprint, source = dict(entry["fingerprint"]), str(entry.get("source", ""))
    if fingerprint.get("implementation") is None:
        fingerprint["implementation"] = implementation_from_source(source, str(entry.get("model", model)))
    if fingerprint.get("optimizer") is None:
        fingerprint["optimizer"] = optimizer_from_source(source)
    return {**entry, "fingerprint": fingerprint}


class Linear(_Strict):
    """time = intercept_s + per_sample_s x micro_batch (least squares over the measured sizes)."""

    intercept_s: Seconds
    per_sample_s: Seconds

    def at(self, micro_batch: float) -> float:
        return self.intercept_s + self.per_sample_s * micro_batch


class PhaseMeasurement(_Strict):
    """One phase (forward, backward or optimizer) of one micro-step, split into the two resources
    that bound an eager step: the host thread that dispatches ops and the device that runs kernels."""

    host_s: Linear = Field(description="host dispatch time of the phase (profiler overhead removed)")
    device_s: Linear = Field(description="device busy time of the phase (sum of its kernels)")
    kernels: Count = Field(ge=0, description="kernels launched by the phase")
    ops: Count | None = Field(None, ge=0, description="ops the phase's host threads ran (profiler records)")
    wall_s: Linear | None = Field(None, description="the phase's measured wall time (synchronised), if timed")

    def device_time(self, b: float, device: str) -> float:
        """The phase's device time at micro-batch ``b`` when its kernels run back to back. On a GPU the
        measurement is its kernels' busy time (the union of their intervals, from the profiler), which
        leaves out the device's gap between each two queued kernels (catalogs/execution.yaml
        device_s_between_kernels); on the CPU (``device`` "cpu") the device time is the phase's wall time
        less its dispatch: nothing is left out."""
        gap = 0.0 if device == "cpu" else catalog.device_s_between_kernels()
        return self.device_s.at(b) + self.kernels * gap


class ModelHoldout(_Strict):
    """One measured micro-batch left out of the fit and predicted from it."""

    micro_batch: Count = Field(gt=0)
    measured_s: Number = Field(gt=0)
    predicted_s: Number = Field(gt=0)
    rel_error: Number


class ModelCompute(_Strict):
    """A model's own measured compute (``calibrate model`` or ``calibrate import-trace``): per phase,
    host dispatch and device time as functions of the micro-batch at one sequence length."""

    model: str = Field(description="catalog model name (or the user's label) the scenario names")
    seq_len: Count = Field(gt=0, description="sequence length measured (ResNet: image side)")
    micro_batches: list[Count] = Field(description="the micro-batch sizes measured (and fitted)")
    forward: PhaseMeasurement
    backward: PhaseMeasurement
    optimizer: PhaseMeasurement
    fingerprint: Fingerprint
    holdout: ModelHoldout | None = None
    source: str = ""

    @model_validator(mode="after")
    def _sizes(self) -> "ModelCompute":
        if not self.micro_batches or any(b <= 0 for b in self.micro_batches):
            raise ValueError("micro_batches must list the positive sizes measured")
        return self


class DispatchRates(_Strict):
    """Per-op costs of the framework on this device, for models that were not measured: host time per
    launched kernel (forward runs Python; backward runs the autograd engine's C++ thread), the
    device's fixed cost per kernel, and the optimizer's host time per parameter tensor."""

    # measured times (1 ns to a day, as every time a profile holds), never true/false or 1e308 s
    host_s_per_kernel_forward: MeasuredSeconds
    host_s_per_kernel_backward: MeasuredSeconds
    host_s_per_op_backward: MeasuredSeconds | None = Field(
        None, description="the backward's host time per autograd op it ran (None: not measured)"
    )
    device_s_per_kernel: Seconds
    host_s_per_param_tensor: Seconds = Field(description="optimizer step + zero_grad, per tensor")
    fingerprint: Fingerprint
    spread_rel: Number = Field(0.0, ge=0, description="p10-p90 half-width of the measurements, relative")
    source: str = ""


class Profile(_Strict):
    format: Literal["clustersim-profile"]
    format_version: int
    device: str = Field(description="GPU catalog name, or 'cpu'")
    provenance: Provenance
    matmul_tflops: dict[str, Tflops] = Field(default_factory=dict)
    memory_gbs: DeviceGbs | None = None
    kernels_gbs: dict[str, DeviceGbs] = Field(default_factory=dict)
    compute_phases: list[ComputePhases] = Field(default_factory=list)
    collectives: list[CollectiveFit] = Field(default_factory=list)
    gemm_tflops_by_size: dict[str, list[tuple[Count, Tflops]]] = Field(default_factory=dict)
    host: HostMeasurements = HostMeasurements()
    launch_latency_s: Annotated[Number | None, AfterValidator(lambda v: v and _time_at_most_a_day(v))] = (
        Field(None, ge=0)
    )
    network: NetworkCalibration | None = Field(None, description="fitted collective model parameters (v3)")
    compute_model: dict[str, GemmModel] = Field(
        default_factory=dict, description="GEMM shape model per precision, used for any model (v3)"
    )
    model_compute: list[ModelCompute] = Field(
        default_factory=list, description="models' own measured phases by micro-batch (v4)"
    )
    dispatch: DispatchRates | None = Field(None, description="per-op host and kernel costs (v4)")
    raw: dict = Field(default_factory=dict, description="the medians the fits were made from")
    _source: str = PrivateAttr("")  # the file or builtin name it was read from, for messages

    @property
    def label(self) -> str:
        return self._source or self.provenance.source

    @property
    def copy_stream_gbs(self) -> float | None:
        """HBM's streaming rate from the copies ``calibrate run`` timed (raw ``memory``), GB/s; None
        where the profile holds fewer than two sizes of them (``memory_gbs`` alone)."""
        return copy_stream_gbs(self.raw.get("memory"))


def has_hardware_rates(profile: Profile) -> bool:
    """Whether the profile measured the device's compute rates (calibrate run's GEMMs and copies)."""
    return bool(profile.matmul_tflops or profile.compute_model or profile.memory_gbs or profile.kernels_gbs)


def thread_mismatch(profile: Profile, entry: ModelCompute) -> str | None:
    """Why a CPU profile's model entry and its hardware rates do not describe the same machine setting:
    torch's intra-op threads set how many cores run each GEMM (on a 2-vCPU VM, 2 threads timed GEMMs at
    0.19-0.21 TFLOP/s; a model timed on 1 thread and carried at those rates came out 2x too fast). None
    where they agree, either is not recorded, or the device is a GPU (whose kernels do not use them)."""
    hw, own = profile.provenance.threads, entry.fingerprint.threads
    if profile.device != "cpu" or hw is None or own is None or hw == own or not has_hardware_rates(profile):
        return None
    return (
        f"{entry.model} was measured on {own} torch thread(s), the profile's hardware rates (GEMMs, copies) "
        f"on {hw}: a CPU's rates depend on its threads, so predictions mixing them are off by up to "
        f"{max(hw, own) / min(hw, own):g}x (measure both with the same --threads, or `calibrate run` "
        f"with OMP_NUM_THREADS={own})"
    )


def copy_stream_gbs(records: object) -> float | None:
    """The streaming rate of timed copies, GB/s: the traffic between the two largest copies over the
    time between them. Each timing brackets the copy with the host's timer and a synchronise
    (calibration/timing.py), a fixed cost (about 13 us on the H100 and H200 VMs) that the difference
    cancels and the largest copy's own rate (``memory_gbs``) keeps: on two H200 sessions that rate read
    3,864 and 3,784 GB/s, the difference 4,268 and 4,268. Never below the largest copy's own rate,
    which a fixed cost can only lower (a smaller copy held in cache would make the difference read low).
    None for fewer than two well-formed sizes or sizes whose times do not grow."""
    if not isinstance(records, list):
        return None
    sizes = {}
    for r in records:
        if not isinstance(r, dict):
            continue
        traffic, t = r.get("traffic_bytes"), r.get("median_s")
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in (traffic, t)):
            sizes[float(traffic)] = float(t)
    if len(sizes) < 2:
        return None
    (small, t_small), (big, t_big) = sorted(sizes.items())[-2:]
    if not math.isfinite(big) or not math.isfinite(t_big) or t_big <= t_small:
        return None
    return max((big - small) / (t_big - t_small), big / t_big) / 1e9


def migrate(data: dict) -> dict:
    """Bring an older profile up to FORMAT_VERSION. v1 -> v2: v1 had no fit quality, host section,
    GEMM-by-size table or raw medians; v2 -> v3: v2 had no fitted network model; v3 -> v4: no model
    compute or dispatch rates; v4 -> v5: no thread counts, machines per entry or list of the commands
    that wrote the profile (its first command is listed from the provenance). Fields carry over."""
    data = dict(data)
    if data.get("format_version") == 1:
        data["format_version"] = 2
    if data.get("format_version") == 2:  # v2 -> v3 adds the optional fitted network model
        data["format_version"] = 3
    if data.get("format_version") == 3:  # v3 -> v4 adds the optional model compute and dispatch rates
        data["format_version"] = 4
    if data.get("format_version") == 4:  # v4 -> v5: thread counts, machines, the list of commands
        data["format_version"] = 5
    if isinstance(data.get("provenance"), dict) and data["provenance"].get("commands") in (None, []):
        data["provenance"] = _with_commands(data["provenance"])
    if isinstance(data.get("provenance"), dict) and isinstance(data.get("raw"), dict):
        data["provenance"] = _with_measured_on(data["provenance"], data["raw"])
    # v4 profiles written before fingerprints recorded the model's code: read it off each source
    if isinstance(data.get("model_compute"), list):
        data["model_compute"] = [_with_implementation(mc) for mc in data["model_compute"]]
    if isinstance(data.get("dispatch"), dict):
        data["dispatch"] = _with_implementation(data["dispatch"], _dispatch_model(data))
    return data


def _with_commands(provenance: dict) -> dict:
    """A provenance written before profiles listed their commands: its one command, the first that wrote
    the profile, read off its own fields (later merges into it were not recorded)."""
    if not isinstance(provenance.get("source"), str):
        return provenance  # the schema says what is wrong
    from clustersim.calibration.provenance import command_record

    first = command_record(provenance, "the profile (before profiles listed each command that wrote them)")
    if "calibrate run" in provenance["source"] and provenance.get("quick") is None:
        first["quick"] = "--quick" in provenance["source"]
    return {**provenance, "commands": [first]}


def _with_measured_on(provenance: dict, raw: dict) -> dict:
    """A provenance written before profiles recorded the emulated testbed and the collective sweep: both
    read off the profile's kept raw medians (its topology's network, its collective records) where they
    say, and left out (not recorded) where what they say is not a valid record. The testbed's kernel and
    machine were not kept: they stay not recorded."""
    from clustersim.calibration.provenance import collective_sweep, testbed_record

    found = {
        "testbed": (TestbedRecord, lambda: testbed_record({"topology": raw.get("topology")})),
        "collective_sweep": (CollectiveSweep, lambda: collective_sweep(raw.get("collectives"))),
    }
    out = dict(provenance)
    for key, (schema, derive) in found.items():
        if key in out:
            continue
        record = derive()
        try:
            out[key] = schema.model_validate(record).model_dump() if record is not None else None
        except ValidationError:
            continue  # an unreadable kept record: not recorded, as before
        if out[key] is None:
            del out[key]
    return out


def _dispatch_model(data: dict) -> str:
    """The model whose measurement the dispatch rates came from: the stored entry of the same source."""
    source = data["dispatch"].get("source")
    for mc in data.get("model_compute") or []:
        if isinstance(mc, dict) and mc.get("source") == source:
            return str(mc.get("model", ""))
    return ""


def builtin_profiles() -> list[str]:
    folder = resources.files("clustersim.calibration").joinpath("profiles")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def _read(ref: str) -> tuple[str, str]:
    if ref.startswith(BUILTIN_PREFIX):
        name = ref[len(BUILTIN_PREFIX) :]
        if name not in builtin_profiles():
            raise InputError(
                f"unknown built-in profile {name!r} (known: {', '.join(builtin_profiles())})", source=ref
            )
        return ref, resources.files("clustersim.calibration").joinpath("profiles").joinpath(
            f"{name}.json"
        ).read_text()
    return ref, read_input_text(ref)


def parse_profile(data: object, source: str) -> Profile:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise InputError(
            f'not a clustersim profile (expected "format": "{FORMAT}")', source=source, key="format"
        )
    version = data.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
        raise InputError(
            f"profile format_version {json.dumps(version) if isinstance(version, bool) else repr(version)} "
            "is not supported by this clustersim "
            f"(reads versions 1..{FORMAT_VERSION}); upgrade clustersim or re-run calibration",
            source=source,
            key="format_version",
        )
    try:
        return Profile.model_validate(migrate(data))
    except ValidationError as exc:
        key, msg = first_error(exc)
        raise InputError(msg, source=source, key=key) from None


def load_profile(ref: str) -> Profile:
    source, text = _read(ref)
    profile = parse_profile(parse_json(text, source), source)
    profile._source = source
    return profile
