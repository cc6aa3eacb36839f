#!/usr/bin/env bash
# Issue 31's advisor check on one lent H200, in one call of under 10 minutes: a measured job of 1 target + 1 drafter
# rank sharing GPU 0 (benchmarks/seed_layout.py: the seed's shapes, an 8-layer Qwen3.6-27B-shaped target, one
# 8,192-token sequence per micro-batch), then `dflash-train --plan` of that same job (its prediction, to compare),
# then --plan of the seed's 8-GPU job (all 64 layers from a config-only target dir; the 5 + 3 split).
#   run(kind="nvidia-h200", timeout_s=600, carry=[".artifacts/whl"], command="bash trainer/benchmarks/device_plan.sh")
# (.artifacts/whl: the fla extra's wheels, as for device_kernels.sh.) $OUT: seed-1-1-shared.{json,log}, plan-1-1.{json,log},
# plan-seed-8gpu.{json,log}. SEED_8GPU=0 stops after the 1 + 1 check and gives its two parts the whole call: on a
# cold H100 (2026-12-05) the measured job was still compiling at 280 s and --plan at 150 s.
set -uo pipefail
OUT=${OUT:-/tmp/dflash-out}
WHL=${WHL:-$PWD/.artifacts/whl}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/fla-site "$WHL"/*.whl \
    2>&1 | tail -n 2
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="/tmp/fla-site:$PWD/trainer/src:$PWD/trainer" \
    TORCHINDUCTOR_CACHE_DIR=/tmp/dflash-inductor
START=$SECONDS
W=/tmp/seed
cd trainer
quiet() { grep --line-buffered -v -E "Loading weights|Writing model|falling back"; }
SHAPE=(--token-budget 8192 --max-seq-len 8192 --max-batch-size 64 --grad-accum 1 --hs-queue-depth 8
       --hs-queue-min-ready 2)
echo "=== measured: 1 target + 1 drafter sharing GPU 0"
JOB_S=280 PLAN_S=150
[ "${SEED_8GPU:-1}" = 0 ] && JOB_S=350
timeout $((JOB_S + 50)) python3 -m benchmarks.seed_layout --preset h200-x8-seed --target-layers 8 --target-gpus 0 \
    --drafter-gpus 0 "${SHAPE[@]}" --steps 14 --warmup-steps 4 --timeout $JOB_S --work-dir $W \
    --out "$OUT/seed-1-1-shared.json" 2>&1 | quiet | tee "$OUT/seed-1-1-shared.log" | tail -n 30
cp "$W"/*.log "$OUT/" 2>/dev/null  # the job's own log (seed_layout names it in its error)
echo "measured: $((SECONDS - START)) s"
echo "=== predicted: dflash-train --plan of the same job"
[ "${SEED_8GPU:-1}" = 0 ] && PLAN_S=$((590 - (SECONDS - START)))
timeout "$PLAN_S" python3 -m dflash_trainer.cli --plan --target-model $W/target --data-dir $W/data \
    --output-dir /tmp/plan-1-1 --target-gpus 0 --drafter-gpus 0 "${SHAPE[@]}" 2>&1 | quiet \
    | tee "$OUT/plan-1-1.log"
cp /tmp/plan-1-1/plan.json "$OUT/plan-1-1.json"
[ "${SEED_8GPU:-1}" = 0 ] && { echo "total: $((SECONDS - START)) s"; exit 0; }
echo "=== the seed's job on 8 GPUs (64 layers, config only)"
mkdir -p /tmp/seed64 && cp $W/target/added_tokens.json /tmp/seed64/
python3 -c "
import json; c = json.load(open('$W/target/config.json')); t = c['text_config']
t['num_hidden_layers'] = 64; t['layer_types'] = ['full_attention' if i % 4 == 3 else 'linear_attention' for i in range(64)]
json.dump(c, open('/tmp/seed64/config.json', 'w'))"
left=$((590 - (SECONDS - START)))
timeout "$left" python3 -m dflash_trainer.cli --plan --target-model /tmp/seed64 --data-dir $W/data \
    --output-dir /tmp/plan-seed --target-gpus 0,1,2,3,4 --drafter-gpus 5,6,7 --target-gpus-per-rank 1 \
    --token-budget 49152 --max-seq-len 8192 --max-batch-size 64 --grad-accum 4 --hs-queue-depth 90 \
    --hs-queue-min-ready 30 2>&1 | quiet | tee "$OUT/plan-seed-8gpu.log"
cp /tmp/plan-seed/plan.json "$OUT/plan-seed-8gpu.json"
echo "total: $((SECONDS - START)) s"
