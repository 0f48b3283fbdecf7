"""The host thread that dispatches a rank's kernels.

Eager PyTorch runs the model's Python on one host thread per rank (the autograd engine's thread
in backward): every op goes through Python, the dispatcher and autocast before its kernel is queued,
tens of microseconds per kernel. The GPU runs kernels as they arrive, so a phase takes about
max(host dispatch, device time) and a small model at a small micro-batch is bound by the host: a
BERT-Large step at micro-batch 16 on an H200 keeps the GPU busy 21 ms of 56 (catalogs/execution.yaml).

Rates, in order of preference: the profile's own measured ones (``calibrate model`` or
``calibrate import-trace``) when their execution mode and model code are the scenario's (a host's cost
per op is the code's: Hugging Face's and a plain-torch op take other paths through Python), else the
catalog's for the mode. Every kernel counted by the workload is one dispatch (pointwise ones fewer
when compiled).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from clustersim import catalog
from clustersim.catalog import GpuSpec

if TYPE_CHECKING:  # annotation only: profiles are read above this layer
    from clustersim.calibration.profile import Profile


@dataclass(frozen=True)
class Dispatch:
    execution: str
    host_s_per_kernel_forward: float
    #: per launch: where the backward is priced per autograd op, that rate times the style's ops per launch
    host_s_per_kernel_backward: float
    host_s_per_param_tensor: float
    #: False for a CPU device: the thread that dispatches an op also runs its kernels
    asynchronous: bool
    source: str
    #: autograd ops the model's backward runs per launch (None: custom layers, priced per launch)
    backward_ops_per_launch: float | None = None

    @classmethod
    def of(
        cls,
        gpu: GpuSpec,
        execution: str,
        profile: Profile | None,
        implementation: str | None = None,
        backward_ops_per_launch: float | None = None,
    ) -> "Dispatch":
        """``implementation``: the scenario's model code (workload.implementation); a profile's rates
        are the code's they were measured on (None on either side: not recorded, taken as the same).
        ``backward_ops_per_launch``: autograd ops the model's backward runs per launch (its style's,
        catalog.backward_ops_per_launch); with a rate per op (eager), the backward's host time per
        launch is that rate times these ops, else the rate per launch."""
        measured = profile.dispatch if profile is not None else None
        code = measured.fingerprint.implementation if measured is not None else None
        same_code = code is None or implementation is None or code.lower() == implementation.lower()
        if measured is not None and measured.fingerprint.execution == execution and same_code:
            per_op = measured.host_s_per_op_backward
            return cls(
                execution,
                measured.host_s_per_kernel_forward,
                _per_launch(per_op, backward_ops_per_launch, measured.host_s_per_kernel_backward),
                measured.host_s_per_param_tensor,
                gpu.asynchronous_launch,
                f"measured ({measured.source or profile.label})",
                backward_ops_per_launch,
            )
        mode = catalog.execution_mode(execution)
        per_op = mode.host_s_per_op_backward
        return cls(
            execution,
            mode.host_s_per_kernel_forward,
            _per_launch(per_op, backward_ops_per_launch, mode.host_s_per_kernel_backward),
            mode.host_s_per_param_tensor,
            gpu.asynchronous_launch,
            f"default for {execution} execution (catalogs/execution.yaml)"
            + (f", backward {per_op * 1e6:.2f} us per op" if per_op and backward_ops_per_launch else ""),
            backward_ops_per_launch,
        )

    def pass_time(self, kernels: float, forward: bool) -> float:
        """Host time to dispatch ``kernels`` kernels of a forward or backward pass."""
        return kernels * (self.host_s_per_kernel_forward if forward else self.host_s_per_kernel_backward)

    def optimizer_time(self, param_tensors: int, kernels_per_tensor: int = 0) -> float:
        """Host time of the optimizer step and zero_grad over ``param_tensors`` tensors (Python loops
        over parameters and their states, outside the update's kernels), plus, for an update that
        launches ``kernels_per_tensor`` ops per tensor from Python (torch.optim's for-loop path), each
        op's dispatch at the eager forward rate (a Python-issued op, as the model's own)."""
        loop = param_tensors * self.host_s_per_param_tensor
        return loop + self.pass_time(param_tensors * kernels_per_tensor, forward=True)


def _per_launch(per_op: float | None, ops_per_launch: float | None, per_launch: float) -> float:
    """The backward's host time per launch: per op times ops per launch where both are known."""
    if per_op is None or ops_per_launch is None:
        return per_launch
    return per_op * ops_per_launch
