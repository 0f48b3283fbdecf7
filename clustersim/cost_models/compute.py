"""Compute costs on one GPU: a roofline per kernel, with measured rates where a profile has them.

time(kernel group) = launches x (device cost per kernel + gap between queued kernels)
                     + max(FLOPs / (peak x class efficiency), bytes / (HBM bandwidth x class efficiency))

The per-kernel term is what a small kernel costs beyond its bytes (launch, ramp-up, tail: ~3 us on a
recent GPU, catalogs/execution.yaml); eager PyTorch launches tens of kernels per transformer block, so
at small micro-batches it is a large part of the device time. Convolutions and batch-norm have their
own rates (cuDNN at ResNet shapes, each convolution its own roofline; batch-norm bound by the SMs:
its statistics pass at SMs x clock x elements per SM-cycle, its streaming passes at SMs x clock x
bytes per SM-cycle, neither above HBM's streaming rate; ReLU and residual adds by HBM); GEMMs the
matmul efficiency, and tensor-core GEMMs over an unpadded vocabulary (rows not a multiple of 16
bytes) the lower rate of cuBLAS's unaligned kernels.

Efficiencies default to the catalog's documented constants. A profile measured on the same GPU
replaces them with the measured rates; one measured on another GPU is scaled by peak FLOP/s
(compute-bound) or HBM bandwidth (memory-bound), see calibration/profile.py.
"""

from __future__ import annotations

from collections.abc import Iterable

from clustersim import catalog
from clustersim.calibration.profile import Profile
from clustersim.catalog import BYTES_PER_ELEMENT, GpuSpec, hardware_defaults, storage_precision
from clustersim.cost_models import attention as attention_rates
from clustersim.workloads.layers import Kernel

# Kernel groups whose launches are the pointwise kernels a compiler fuses (execution: compiled).
_POINTWISE = frozenset(
    {"elementwise", "batch_norm", "batch_norm_stats", "activation", "loss", "gather", "scatter_add"}
)


def _streaming_gbs(profile: Profile) -> float:
    """The rate a profile's copies say streaming kernels run at: its copies' streaming rate times the
    ratio the default's kernel constants were set at on the H200 (hardware_defaults.yaml
    memory_per_copy), or, where it timed one size of copy only, that copy's rate, which on the H200
    was the defaults' streaming rate within 1% (3,864 against 3,840 GB/s)."""
    copy = profile.copy_stream_gbs
    if copy is None:
        return profile.memory_gbs
    return copy * hardware_defaults()["efficiency"]["memory_per_copy"]


class DeviceCosts:
    def __init__(
        self,
        gpu: GpuSpec,
        profile: Profile | None = None,
        execution: str = "eager",
        unfused_pointwise: bool = False,
        implementation: str | None = None,
        attention_kernel: str | None = None,
        attention_dropout: bool = False,
    ):
        """``unfused_pointwise``: the model is plain PyTorch code (Scenario.pointwise_code), whose
        block pointwise kernels stream below a copy's rate under autocast (catalogs/execution.yaml).
        ``implementation``: the model's code (Scenario.implementation); a profile's fixed cost per
        kernel is the 10th percentile of its measured code's kernel durations, a statistic of that
        code's mix of kernels, so it applies to the same code only. ``attention_kernel``,
        ``attention_dropout``: the library that runs fused attention and whether it drops scores
        (Scenario.attention_kernel, attention_dropout), which price it where its published rates exist
        (cost_models/attention.py)."""
        self.gpu = gpu
        # fused attention at its library's published rate on the chips it was measured on; elsewhere
        # (no published curves), or with no library named, at the GEMM rate
        self.attention_kernel = attention_kernel if attention_rates.has_curves(gpu.chip) else None
        self.attention_dropout = attention_dropout
        self.profile = profile
        eff = hardware_defaults()["efficiency"]
        # large GEMMs' fraction of peak: the GPU's own where a published GEMM benchmark measured it
        # (catalogs/gpus.yaml), else the documented default
        self.matmul_eff = {p: gpu.matmul_efficiency.get(p, eff["matmul"]) for p in gpu.peak_tflops}
        self.memory_eff = eff["memory"]
        mode = catalog.execution_mode(execution)
        classes = catalog.execution()["efficiency"]
        self.conv_eff = classes["conv"]
        # unaligned tensor-core GEMMs: bound by the SMs' narrow loads where the catalog gives SMs and
        # clock, else the H200's fraction of peak (catalogs/execution.yaml)
        unaligned = classes["gemm_unaligned"]
        sm_rate = gpu.sm_cycles_per_s
        self._unaligned_flops_per_element = (
            sm_rate * unaligned["flops_per_sm_cycle_per_element"] if sm_rate is not None else None
        )
        self._unaligned_peak_per_element = unaligned["peak_fraction_per_element"]
        self.elementwise_factor = classes["pointwise_unfused"] if unfused_pointwise else 1.0
        # batch-norm: bound by the SMs (and by the streaming rate of HBM), the statistics pass per
        # element, the streaming passes per byte; a GPU without SM figures gets the H200's SM-cycles per
        # HBM byte (catalogs/execution.yaml); ReLU and residual adds stream at HBM's rate
        bn = classes["batch_norm"]
        bn_cycles = sm_rate if sm_rate is not None else gpu.hbm_bytes_per_s * bn["sm_cycles_per_hbm_byte"]
        self._bn_stats_elements_per_s = bn_cycles * bn["statistics_elements_per_sm_cycle"]
        self._bn_stream_bytes_per_s = bn_cycles * bn["streaming_bytes_per_sm_cycle"]
        self.kernel_overhead_s = mode.device_s_per_kernel
        # the device's idle gap between two kernels of one stream when the next is already queued
        # (catalogs/execution.yaml device_s_between_kernels): kernel durations, which every rate above
        # was fitted on, leave it out; a CPU runs each op on the calling thread, with no queue
        self.kernel_gap_s = catalog.device_s_between_kernels() if gpu.asynchronous_launch else 0.0
        self.pointwise_factor = mode.elementwise_kernel_factor
        dispatch = profile.dispatch if profile is not None else None
        if dispatch is not None and dispatch.fingerprint.execution == execution:
            code = dispatch.fingerprint.implementation
            if code is None or implementation is None or code.lower() == implementation.lower():
                self.kernel_overhead_s = dispatch.device_s_per_kernel
        self.kernel_bw: dict[str, float] = {}
        self.gemm_model: dict[str, tuple[float, float, float]] = {}  # precision -> r_max, timed call, mem
        published = "published GEMM benchmark (catalogs/gpus.yaml)"
        # where each precision's GEMM rate comes from: run names the one its scenario uses
        self._matmul_from = {
            p: published if p in gpu.matmul_efficiency else "default efficiency" for p in gpu.peak_tflops
        }
        self.sources: dict[str, str] = {
            "matmul": published if gpu.matmul_efficiency else "default efficiency",
            "memory": "default efficiency",
        }
        if profile is not None:
            self._apply(profile)
        self._roofline: dict[str, tuple[float, float]] = {}  # precision -> (FLOP/s, bytes/s)
        self._priced: dict[tuple[int, str], tuple[object, float]] = {}
        self._launched: dict[int, tuple[object, float]] = {}
        # An uncertainty draw's compute factor (simulator/uncertainty.py) on the passes below: the
        # optimizer update, casts, copies and compression kernels run on the same device as forward
        # and backward, so a draw that finds the device slower than calibrated finds them slower too.
        self.stream_scale = 1.0

    def _apply(self, profile: Profile) -> None:
        ref = catalog.gpus().get(profile.device)
        # the same device, or a profile named by its chip ("cpu") that measured this kind of device
        same = profile.device == self.gpu.name or (
            ref is None and catalog.chip_of(profile.device) == self.gpu.chip
        )
        how = "measured" if same else f"scaled from {profile.device}"
        if profile.matmul_tflops and (same or ref is not None):
            ref = ref or self.gpu
            for precision, tflops in profile.matmul_tflops.items():
                if precision in ref.peak_tflops:
                    self.matmul_eff[precision] = min(1.0, tflops / ref.peak_tflops[precision])
                    self._matmul_from[precision] = how
            self.sources["matmul"] = how
        if profile.memory_gbs and (same or ref is not None):
            self.memory_eff = min(1.0, _streaming_gbs(profile) / (ref or self.gpu).hbm_gbs)
            self.sources["memory"] = how
        for precision, m in profile.compute_model.items():
            src = ref or self.gpu
            if precision not in src.peak_tflops and precision != "fp32":
                continue
            flop_scale = self.gpu.peak_flops(precision) / src.peak_flops(precision)
            mem_scale = self.gpu.hbm_gbs / src.hbm_gbs
            self.gemm_model[precision] = (
                m.r_max_tflops * 1e12 * flop_scale,
                m.launch_s,
                m.memory_gbs * 1e9 * mem_scale,
            )
            self._matmul_from[precision] = self.sources["matmul"] = "GEMM shape model, " + how
        if ref is not None or same:
            scale = self.gpu.hbm_gbs / (ref or self.gpu).hbm_gbs
            for name, gbs in profile.kernels_gbs.items():
                self.kernel_bw[name] = gbs * 1e9 * scale
                self.sources[f"kernel:{name}"] = how

    def matmul_source(self, precision: str) -> str:
        """Where this precision's GEMM rate comes from: the default efficiency, the GPU's published
        benchmark, or a profile's measurement (its GEMM model)."""
        return self._matmul_from.get(self._rate_key(precision), "default efficiency")

    def _rate_key(self, precision: str) -> str:
        """The precision whose GEMM efficiency applies: its own, or fp32's where the GPU has no units."""
        return precision if precision in self.gpu.peak_tflops else "fp32"

    def flops_rate(self, precision: str) -> float:
        key = self._rate_key(precision)
        return self.gpu.peak_flops(precision) * self.matmul_eff.get(
            key, hardware_defaults()["efficiency"]["matmul"]
        )

    @property
    def memory_rate(self) -> float:
        return self.gpu.hbm_bytes_per_s * self.memory_eff

    def launches(self, kernel: Kernel) -> float:
        """Kernels the group launches in this execution mode (pointwise ones fused when compiled)."""
        if kernel.name in _POINTWISE:
            return kernel.launches * self.pointwise_factor
        return kernel.launches

    def kernels_launched(self, kernels: Iterable[Kernel]) -> float:
        hit = self._launched.get(id(kernels))
        if hit is not None and hit[0] is kernels:
            return hit[1]
        n = sum(self.launches(k) for k in kernels if k.dispatched)
        self._launched[id(kernels)] = (kernels, n)  # the reference keeps the id from being reused
        return n

    def kernel_time(self, kernel: Kernel, precision: str) -> float:
        """``precision``: the workload's; a kernel that names its own (FP8 training's GEMMs and the
        bf16 kernels beside them, workloads/fp8.py) runs at that."""
        if kernel.precision is not None:
            precision = kernel.precision
        if kernel.name in self.kernel_bw:
            return kernel.bytes / self.kernel_bw[kernel.name]
        if (
            kernel.attention is not None
            and self.attention_kernel is not None
            and BYTES_PER_ELEMENT[storage_precision(precision)] <= 2
        ):  # fused attention runs on 16-bit (or FP8 training's bf16) tensors; fp32 and tf32 do not
            return self._fused_attention_time(kernel, precision)
        unaligned = kernel.alignment_bytes < 16 and precision != "fp32"
        # a calibration's GEMMs are aligned shapes: an unaligned one keeps its class's own rate
        # a calibration's GEMM model prices GEMMs only: a fused attention kernel is no GEMM and was not timed
        fitted = kernel.flops > 0 and kernel.name not in ("conv", "attention") and not unaligned
        model = self.gemm_model.get(precision) if fitted else None
        if model is not None:  # calibration/compute_fit.py: launch + max(W / R_max, bytes / B) per GEMM
            r_max, timed_call_s, mem = model
            # The fit's fixed cost is that of a call timed between two synchronisations: on a GPU the
            # host's launch and the round trip back, where a GEMM queued in a step pays the device's
            # fixed cost per kernel as every other kernel does (H200 traces: BERT-Large's 441 aligned
            # GEMMs 6.1 ms a step, 6.3 ms so priced and 14.1 ms at the fit's 21 us per call; GPT-2
            # XL's 579 took 67.4 ms, 64.9 and 75.2). On a CPU the thread that calls an op runs it: the
            # timed call's fixed cost is the op's in a step too.
            fixed = self.kernel_overhead_s if self.gpu.asynchronous_launch else timed_call_s
            return kernel.launches * fixed + max(kernel.flops / r_max, kernel.bytes / mem)
        # The roofline's two rates, once per precision: a program prices thousands of kernels and
        # the rates are fixed once the profile is applied. Same values as computed here.
        rates = self._roofline.get(precision)
        if rates is None:
            rates = self._roofline[precision] = (self.flops_rate(precision), self.memory_rate)
        flop_rate, byte_rate = rates
        if unaligned:
            # tensor-core GEMMs with a dimension not a multiple of 16 bytes (an unpadded vocabulary):
            # cuBLAS falls back to narrow-load kernels whose rate goes with their load width
            # (catalogs/execution.yaml); fp32 on the SIMT cores keeps the GEMM's rate
            flop_rate = min(flop_rate, self.unaligned_gemm_rate(precision, kernel.alignment_bytes))
        elif kernel.name == "conv" and precision != "fp32":
            # tensor-core convolutions; fp32 ones run on the SIMT cores at the GEMM's efficiency
            flop_rate = self.gpu.peak_flops(precision) * self.conv_eff
        elif kernel.name == "batch_norm":  # normalise, backward reduction and input gradient
            byte_rate = min(byte_rate, self._bn_stream_bytes_per_s)
        elif kernel.name == "batch_norm_stats":  # the Welford pass: its bytes are one read per element
            byte_rate = min(byte_rate, self._bn_stats_elements_per_s * BYTES_PER_ELEMENT[precision])
        elif kernel.name == "elementwise" and BYTES_PER_ELEMENT[precision] < 4:
            byte_rate *= self.elementwise_factor  # autocast's mixed 16-bit/fp32 operands (as transformer.py)
        fixed = self.launches(kernel) * self.kernel_overhead_s
        return fixed + max(kernel.flops / flop_rate, kernel.bytes / byte_rate)

    def _fused_attention_time(self, kernel: Kernel, precision: str) -> float:
        """A fused attention kernel at its library's published rate for its shape (a fraction of the
        chip's dense 16-bit peak; FlashAttention's FLOP count, half of the group's under a causal
        mask), or HBM's if it moves more bytes than that takes; fp8 attention runs in 16 bits."""
        shape = kernel.attention
        fraction = attention_rates.peak_fraction(self.attention_kernel, shape, self.attention_dropout)
        flops = attention_rates.counted_flops(kernel.flops, shape)
        rate = self.gpu.peak_flops("bf16" if "bf16" in self.gpu.peak_tflops else "fp16") * fraction
        fixed = self.launches(kernel) * self.kernel_overhead_s
        return fixed + max(flops / rate, kernel.bytes / self.memory_rate)

    def unaligned_gemm_rate(self, precision: str, alignment_bytes: int) -> float:
        """FLOP/s of a tensor-core GEMM whose rows start only every ``alignment_bytes`` bytes: cuBLAS's
        narrow-load kernels, bound by how many elements each load brings to the SMs, whatever their
        width in bytes (catalogs/execution.yaml): a tf32 row on 4 bytes loads one element at a time,
        as a bf16 row on 2 does."""
        elements = max(alignment_bytes / BYTES_PER_ELEMENT[precision], 1.0)
        per_element = self._unaligned_flops_per_element
        if per_element is None:  # the H200's fraction of its 16-bit peak
            per_element = self.gpu.peak_flops("fp16") * self._unaligned_peak_per_element
        return per_element * elements

    def kernels_time(self, kernels: Iterable[Kernel], precision: str) -> float:
        """The time of a layer's kernel groups run back to back (their durations and the device's gap
        between each two), once per (groups, precision): a program prices the same layer in every
        micro-step and step kind (the cache holds the groups, so their id stays theirs)."""
        key = (id(kernels), precision)
        hit = self._priced.get(key)
        if hit is not None and hit[0] is kernels:
            return hit[1]
        # every kernel on the stream leaves the gap, a library's own (cuDNN's transposes) included
        gaps = self.kernel_gap_s * sum(self.launches(k) for k in kernels)
        t = sum(self.kernel_time(k, precision) for k in kernels) + gaps
        self._priced[key] = (kernels, t)
        return t

    def launch_time(self, launches: float) -> float:
        """The fixed device cost of ``launches`` kernels issued one by one (a for-loop update's), beyond
        the bytes their passes move."""
        return launches * self.kernel_overhead_s * self.stream_scale

    def stream_time(self, nbytes: float, name: str = "stream") -> float:
        """A memory-bound pass (copy, scale, elementwise update) over ``nbytes`` of HBM traffic."""
        # A pass over a whole buffer: its launch is negligible beside its bytes (and the host's side of
        # it is counted per parameter tensor, Dispatch.optimizer_time), so no per-kernel cost.
        return self.kernel_time(Kernel(name, 0.0, nbytes, 0), "fp32") * self.stream_scale
