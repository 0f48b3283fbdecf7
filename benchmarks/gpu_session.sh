#!/usr/bin/env bash
# One GPU session, end to end, in one call: what the machine is, the calibration suite
# (`calibrate run`), real training steps of common models (benchmarks/gpu_real_steps.py),
# `calibrate model` of the catalog's versions of them, and some of the same steps under torch.compile. Every step writes under $OUT as it goes and
# has its own time limit, so a step that fails or overruns loses nothing measured before it.
#
#   OUT=gpu-out bash benchmarks/gpu_session.sh               # on a machine with a GPU
#   OUT=/tmp/rehearsal DEVICE=cpu QUICK=1 bash benchmarks/gpu_session.sh   # a minute-long rehearsal
#
# Python packages the machine lacks can sit as wheels in .whl/ (installed to /tmp/site first).
set -u
OUT=${OUT:-gpu-out}
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
CS="$PY -m clustersim.cli"
step() { echo "=== $(date +%T) $1"; }

step "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.sm,power.limit --format=csv 2>/dev/null
  $PY -c "import torch, platform; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'python', platform.python_version(), 'cores', __import__('os').cpu_count())"
  $PY -c "import transformers, torchvision; print('transformers', transformers.__version__, 'torchvision', torchvision.__version__)" 2>&1 | tail -1
  $PY -c "import clustersim.cli; print('clustersim imports')"
} | tee "$OUT/machine.txt"

# calibrate model times the code the steps run: the Hugging Face configs of the same shapes (stored
# under the catalog names), and ResNet-50 through the catalog build (torchvision's structure)
CFG=$(mktemp -d)
if [ -n "$QUICK" ]; then
    $PY benchmarks/gpu_real_steps.py --write-hf-configs "$CFG" --layers 2
    RUN_ARGS="--quick"; STEPS="bert-base:1,2 resnet50:2"; TIMED="--steps 2 --warmup 1"; TRACE="bert-base:1"
    COMPILED="bert-base:1"
    BERT="--hf-config $CFG/bert-base/config.json --name BERT-Base-2L --seq-len 128 --micro-batches 1,2,4 --holdout 3 --steps 2 --warmup 1"
    RESNET=""; GPT=""
else
    $PY benchmarks/gpu_real_steps.py --write-hf-configs "$CFG"
    RUN_ARGS=""; STEPS="bert-large:8,16,32 bert-base:32 resnet50:64,128,256 gpt2-xl:1,4"; TIMED=""
    TRACE="bert-base:32 gpt2-xl:4"  # models outside the H200 dev traces, for calibrate import-trace
    # the same code under torch.compile: one host-bound, one device-bound transformer and the CNN
    COMPILED="bert-large:16 gpt2-xl:4 resnet50:128"
    BERT="--hf-config $CFG/bert-large/config.json --name BERT-Large --seq-len 128 --micro-batches 8,16,32 --holdout 24"
    RESNET="--model ResNet-50 --optimizer sgd --micro-batches 32,64,128 --holdout 96"
    GPT="--hf-config $CFG/gpt2-xl/config.json --name GPT-2-1.5B --seq-len 1024 --micro-batches 1,2,4 --holdout 3"
fi

step "calibrate run"
timeout 150 $CS calibrate run --device "$DEVICE" $RUN_ARGS --out "$OUT/profile.json" --raw-out "$OUT/raw.json" \
    || echo "calibrate run FAILED ($?)"

step "real steps"
timeout 240 $PY benchmarks/gpu_real_steps.py --device "$DEVICE" $TIMED --out "$OUT/steps.json" --cases $STEPS --trace $TRACE \
    || echo "real steps FAILED ($?)"

for args in "$BERT" "$RESNET" "$GPT"; do
    [ -z "$args" ] && continue
    step "calibrate model $args"
    # the profile from calibrate run is extended in place (its rates and fits stay)
    timeout 120 $CS calibrate model $args --device "$DEVICE" --out "$OUT/profile.json" \
        || echo "calibrate model FAILED ($?)"
done
# last: compiling takes minutes of host time, and the eager measurements above matter more
step "real steps, torch.compile"
timeout 240 $PY benchmarks/gpu_real_steps.py --device "$DEVICE" $TIMED --compile --out "$OUT/steps-compiled.json" \
    --cases $COMPILED || echo "compiled steps FAILED ($?)"
step "done"
ls -la "$OUT"
