"""Per-parameter HBM traffic of optimizer update passes (bytes per parameter, reads + writes).

DeepSpeed's 1-bit and 0/1 Adam optimizers are written as torch ops over the flat fp32 master
parameters (not fused like FusedAdam's single 28-byte pass), so each constant counts the torch
expressions of deepspeed/runtime/fp16/onebit/{adam,zoadam}.py. Work common to every optimizer under
the FP16 wrapper (fp16 -> fp32 gradient copy, unscale, overflow check, fp32 -> fp16 parameter copy)
is not here: it belongs to "other" (measured, or modelled as loss scaling).
"""

# FusedAdam (multi_tensor_apply): r p, g, m, v (16), w p, m, v (12).
FUSED_ADAM = 28.0
# exp_avg.mul_(beta1) (r4 w4) then .add_(1 - beta1, grad) (r8 w4).
MOMENTUM_UPDATE = 20.0
# exp_avg_sq.mul_(beta2) (r4 w4) then .addcmul_(1 - beta2, grad, grad) (r12 w4).
VARIANCE_UPDATE = 24.0
# update = exp_avg / (exp_avg_sq.sqrt() + eps): sqrt r4 w4, add r4 w4, div r8 w4.
ADAM_DIRECTION = 28.0
# update += weight_decay * p (mul r4 w4, add r8 w4); p.add_(-lr * update) (mul r4 w4, add r8 w4).
APPLY_UPDATE = 40.0
