"""Bytes each optimizer and compression kernel moves through memory: the cost model's kernel tables.

Strategies (which build programs with these kernels) and the calibration microbenchmarks (which
time the same kernels and record the bytes counted here, so measured bytes/s is exactly the rate the
simulator needs) both read them from here.

Optimizer update passes, per parameter (reads + writes). DeepSpeed's 1-bit and 0/1 Adam optimizers
are written as torch ops over the flat fp32 master parameters (not fused like FusedAdam's single
28-byte pass), so each constant counts the torch expressions of
deepspeed/runtime/fp16/onebit/{adam,zoadam}.py. Work common to every optimizer under the FP16
wrapper (fp16 -> fp32 gradient copy, unscale, overflow check, fp32 -> fp16 parameter copy) is not
here: it belongs to "other" (measured, or modelled as loss scaling).
"""

# FusedAdam (multi_tensor_apply): r p, g, m, v (16), w p, m, v (12).
FUSED_ADAM = 28.0
# Fused SGD with momentum: r p, g, m (12), w p, m (8).
SGDM_UPDATE = 20.0
# torch.optim's multi-tensor (foreach) and single-tensor (for_loop) updates run the same ops, each a
# pass of its own over fp32 tensors (torch/optim/adamw.py and sgd.py, PyTorch 2.x, no amsgrad or
# nesterov; the step counters live on the CPU):
#   AdamW: p.mul_(1 - lr*wd) r4 w4; m.lerp_(g) r8 w4; v.mul_(b2) r4 w4; v.addcmul_(g, g) r12 w4;
#          sqrt(v) r4 w4; div_(bias correction) r4 w4; add_(eps) r4 w4; p.addcdiv_(m, denom) r12 w4
#          -> 84 bytes per parameter in 8 kernels (3x the fused pass's 28).
#   SGD with momentum: buf.mul_(momentum) r4 w4; buf.add_(g) r8 w4; p.add_(buf) r8 w4
#          -> 32 bytes per parameter in 3 kernels.
# foreach launches each op over chunks of many tensors; for_loop launches each op once per tensor.
FOREACH_ADAMW = 84.0
FOREACH_SGDM = 32.0
UPDATE_BYTES = {
    ("adam", "fused"): FUSED_ADAM,
    ("adam", "foreach"): FOREACH_ADAMW,
    ("adam", "for_loop"): FOREACH_ADAMW,
    ("sgdm", "fused"): SGDM_UPDATE,
    ("sgdm", "foreach"): FOREACH_SGDM,
    ("sgdm", "for_loop"): FOREACH_SGDM,
}
#: kernels a single-tensor (for_loop) update launches per parameter tensor
UPDATE_KERNELS_PER_TENSOR = {"adam": 8, "sgdm": 3}
# Gradient clipping by norm (training.gradient_clipping) as torch.nn.utils.clip_grad_norm_ runs it
# (PyTorch 1.9 and later: no host sync of its own): each fp32 gradient read once for its norm, then
# read and written once by the multiply with the clamped coefficient, 12 bytes per parameter. "global"
# is one call over all gradients (foreach norms and multiply, or apex's multi_tensor_l2norm and
# multi_tensor_scale): a handful of kernels whatever the tensor count. "per_tensor" is one call per
# tensor inside a for-loop optimizer (the max_grad_norm of BertAdam in Google's and NVIDIA's BERT
# code): per tensor a norm, the stack and norm of the one-element list, the eps add, max_norm's
# division (reciprocal and multiply), the clamp and the gradient's mul_, 8 kernels.
CLIP_BYTES = 12.0
CLIP_KERNELS_PER_TENSOR = {"none": 0, "global": 0, "per_tensor": 8}
# 0/1 Adam's local-step sync, expression by expression (deepspeed/runtime/fp16/onebit/zoadam.py, the
# freeze_key branch), besides the compressed all-reduce: undo the local steps, p.add_(-1 * u) (mul r4 w4,
# add r8 w4: 20); scale the accumulator, u.mul_(v.sqrt() + eps) (sqrt 8, add 8, mul r8 w4: 28); the
# momentum from the synced accumulator, exp_avg.zero_().add_(u / lrs, alpha=-1) (w4, div 8, add 12:
# 24); apply it, p.add_(u / (v.sqrt() + eps)) (sqrt 8, add 8, div 12, add 12: 40); u.zero_() (w4).
ACCUMULATOR_CORRECTION = 116.0
# 0/1 Adam's local step also accumulates its update, u.add_(-lr * update) (mul r4 w4, add r8 w4).
ACCUMULATE = 20.0
# exp_avg.mul_(beta1) (r4 w4) then .add_(1 - beta1, grad) (r8 w4).
MOMENTUM_UPDATE = 20.0
# exp_avg_sq.mul_(beta2) (r4 w4) then .addcmul_(1 - beta2, grad, grad) (r12 w4).
VARIANCE_UPDATE = 24.0
# update = exp_avg / (exp_avg_sq.sqrt() + eps): sqrt r4 w4, add r4 w4, div r8 w4.
ADAM_DIRECTION = 28.0
# update += weight_decay * p (mul r4 w4, add r8 w4); p.add_(-lr * update) (mul r4 w4, add r8 w4).
APPLY_UPDATE = 40.0

# (kernel name, bytes per element of n, bytes per element of n/p); reads + writes, fp32 = 4 B,
# bool/uint8 = 1 B. Counted expression by expression from DeepSpeed's runtime/comm/nccl.py:
WORKER_PASSES = (
    ("onebit_error_compensate", 12.0, 0.0),  # buffer_m.add_(worker_error): r8 w4
    ("onebit_norm", 4.0, 0.0),  # torch.norm(buffer_m): r4
    # sign() 8, add_(1) 8, bool() 5, float() 5, add_(-.5) 8, mul_(2) 8, scale* 8, buffer_m - ... 12
    ("onebit_sign_error", 62.0, 0.0),
    # sign_() 8, add_(1) 8, bool() 5, to(uint8) 2, packbits 1.125, torch.stack 0.25, recv zeros 0.125
    ("onebit_pack", 24.5, 0.0),
)
SERVER_PASSES = (
    # unpackbits 1.125, float() 5, add_ 8, mul_ 8, mul_(scales) 8, sum(0) reads 4 (writes 4 per n/p)
    ("onebit_unpack_sum", 34.125, 4.0),
    # on the n/p server chunk: add_(server_error) 12, norm 4, sign/error update 62, pack 24.25
    ("onebit_server_compress", 0.0, 102.25),
)
FINISH_PASSES = (
    # torch.stack 0.25, unpackbits 1.125, float() 5, add_ 8, mul_ 8, mul_(scales) 8, copy_ 8
    ("onebit_unpack_copy", 38.375, 0.0),
)
PADDING_PASS = ("onebit_pad", 8.0, 0.0)  # torch.cat([buffer_m, zeros]) on every call when padded
# Fused elementwise kernels, bytes per parameter: m and b updates (r g, r/w m, r/w b in fp32 + grad),
# stochastic quantize of m/b to the packed bits the 1-bit all-reduce sends (r m, b; w 1/8), and
# unpack + apply to the fp32 master and the 16-bit model copy (r 1/8, r/w 8, w 2).
UPDATE_STATE_BYTES = 16.0
QUANTIZE_BYTES = 8.125
APPLY_BYTES = 10.125


def padded_elements(n: int, p: int) -> int:
    """n padded to a multiple of p * lcm(p, 8) (DeepSpeed's corrected_tensor_size): every rank's chunk
    of the compressed all-reduce packs into whole bytes. Used by the cost model and the testbed's job."""
    from math import lcm

    unit = p * lcm(p, 8)
    return -(-n // unit) * unit


# DiLoCo (Douillard et al. 2024) / Streaming DiLoCo (Douillard et al. 2025), per parameter of the
# fragment being synchronised. Outer gradient: read the fp32 outer (global) copy 4 and the fp32 master
# weight 4, write the outer gradient at the wire's width (bits/8; a quantizer that keeps one scale per
# block adds nothing per element at the block sizes used). Outer step: read the averaged outer
# gradient (bits/8, dequantised on the fly), Nesterov momentum r/w 8, outer copy r/w 8, then the
# workers restart from it: write the fp32 master 4 and the 16-bit model copy (its width).
DILOCO_OUTER_GRADIENT_BYTES = 8.0
DILOCO_OUTER_STEP_BYTES = 20.0
# A low-bit reduction (dequantise both operands, add in fp32, re-quantise): read k shards at bits/8
# and write one, plus the fp32 accumulator r/w 8 per element of the shard.
DILOCO_REDUCE_ACCUMULATOR_BYTES = 8.0
