"""GPU memory per rank: parameters, gradients, optimizer state, activations, strategy buffers.

Mixed precision (fp16/bf16) keeps an fp32 master copy of the parameters (4 B) beside the 16-bit
weights (2 B); optimizer state is fp32. Activations are those kept for backward of one micro-batch
(Korthikanti et al. 2022 for transformers). DDP buckets hold a second copy of the gradients.
"""

from __future__ import annotations

from clustersim.catalog import BYTES_PER_ELEMENT


def gpu_memory(ctx, strategy) -> dict[str, float]:
    P = ctx.params
    d = BYTES_PER_ELEMENT[ctx.precision]
    mem = {
        "parameters": P * d + (4 * P if d < 4 else 0),
        "gradients": P * ctx.grad_bytes,
        "ddp_buckets": P * ctx.grad_bytes,
        "optimizer_state": P * strategy.state_bytes_per_param,
        "activations": ctx.workload.activation_bytes,
    }
    mem.update(strategy.extra_gpu_memory())
    mem["total"] = sum(mem.values())
    mem["capacity"] = ctx.gpu.memory_bytes
    return mem
