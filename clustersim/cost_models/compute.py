"""Compute costs on one GPU: a roofline per kernel, with measured rates where a profile has them.

time(kernel) = max(FLOPs / (peak x matmul efficiency), bytes / (HBM bandwidth x memory efficiency))

Efficiencies default to the catalog's documented constants. A profile measured on the same GPU
replaces them with the measured rates; one measured on another GPU is scaled by peak FLOP/s
(compute-bound) or HBM bandwidth (memory-bound), see calibration/profile.py.
"""

from __future__ import annotations

from collections.abc import Iterable

from clustersim import catalog
from clustersim.calibration.profile import Profile
from clustersim.catalog import GpuSpec, hardware_defaults
from clustersim.workloads.layers import Kernel


class DeviceCosts:
    def __init__(self, gpu: GpuSpec, profile: Profile | None = None):
        self.gpu = gpu
        self.profile = profile
        eff = hardware_defaults()["efficiency"]
        self.matmul_eff = {p: eff["matmul"] for p in gpu.peak_tflops}
        self.memory_eff = eff["memory"]
        self.kernel_bw: dict[str, float] = {}
        self.gemm_model: dict[str, tuple[float, float, float]] = {}  # precision -> r_max, launch, mem
        self.sources: dict[str, str] = {"matmul": "default efficiency", "memory": "default efficiency"}
        if profile is not None:
            self._apply(profile)
        self._roofline: dict[str, tuple[float, float]] = {}  # precision -> (FLOP/s, bytes/s)

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
            self.sources["matmul"] = how
        if profile.memory_gbs and (same or ref is not None):
            self.memory_eff = min(1.0, profile.memory_gbs / (ref or self.gpu).hbm_gbs)
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
            self.sources["matmul"] = "GEMM shape model, " + how
        if ref is not None or same:
            scale = self.gpu.hbm_gbs / (ref or self.gpu).hbm_gbs
            for name, gbs in profile.kernels_gbs.items():
                self.kernel_bw[name] = gbs * 1e9 * scale
                self.sources[f"kernel:{name}"] = how

    def flops_rate(self, precision: str) -> float:
        key = precision if precision in self.gpu.peak_tflops else "fp32"
        return self.gpu.peak_flops(precision) * self.matmul_eff.get(
            key, hardware_defaults()["efficiency"]["matmul"]
        )

    @property
    def memory_rate(self) -> float:
        return self.gpu.hbm_bytes_per_s * self.memory_eff

    def kernel_time(self, kernel: Kernel, precision: str) -> float:
        if kernel.name in self.kernel_bw:
            return kernel.bytes / self.kernel_bw[kernel.name]
        model = self.gemm_model.get(precision) if kernel.flops > 0 else None
        if model is not None:  # calibration/compute_fit.py: launch + max(W / R_max, bytes / B) per GEMM
            r_max, launch, mem = model
            return kernel.launches * launch + max(kernel.flops / r_max, kernel.bytes / mem)
        # The roofline's two rates, once per precision: a program prices thousands of kernels and
        # the rates are fixed once the profile is applied (issue #15). Same values as computed here.
        rates = self._roofline.get(precision)
        if rates is None:
            rates = self._roofline[precision] = (self.flops_rate(precision), self.memory_rate)
        return max(kernel.flops / rates[0], kernel.bytes / rates[1])

    def kernels_time(self, kernels: Iterable[Kernel], precision: str) -> float:
        return sum(self.kernel_time(k, precision) for k in kernels)

    def stream_time(self, nbytes: float, name: str = "stream") -> float:
        """A memory-bound pass (copy, scale, elementwise update) over ``nbytes`` of HBM traffic."""
        return self.kernel_time(Kernel(name, 0.0, nbytes), "fp32")
