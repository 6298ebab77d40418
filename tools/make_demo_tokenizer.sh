#!/usr/bin/env bash
# Rebuild procap/assets/demo_tokenizer.safetensors, the demo's embedded tokenizer (docs/training.md, "The demo's
# tokenizer"). Single-threaded so that the result does not depend on the machine's core count; about 25 minutes on
# one idle core. Usage: tools/make_demo_tokenizer.sh [WORK_FOLDER]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-runs/demo_tokenizer}
export OMP_NUM_THREADS=1
synth="procap synth --out $work/data --scenes 2000 --size 64 --seed 0"
train="procap vqgan --data $work/data --dataset clevr-change --out $work/vqgan --preset tiny --steps 1200 --batch-size 16 --lr 1e-3 --warmup-steps 100 --decay cosine --seed 0 --device cpu --save-every 200"
$synth
$train
python -m procap.train.tokenizer ship --vqgan "$work/vqgan/vqgan.safetensors" --data "$work/data" \
    --command "OMP_NUM_THREADS=1 $synth" --command "OMP_NUM_THREADS=1 $train"
