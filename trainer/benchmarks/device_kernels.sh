#!/usr/bin/env bash
# Issue 31 on one lent H200, in one call of under 10 minutes: the seed family's target forward
# (benchmarks/target_forward.py --preset qwen3.6-27b --target-layers kinds) with flash-linear-attention (the trainer's
# fla extra, carried as wheels: the machine has no index), then with transformers' torch fallback (no fla on the path).
#
# Here first: python3 -m pip download --no-deps -d .artifacts/whl flash-linear-attention==0.6.0 fla-core==0.6.0 \
#   einops==0.8.2 (the extra's pins; pure-Python wheels; .artifacts is ignored by git, so it is carried):
#   run(kind="nvidia-h200", timeout_s=600, carry=[".artifacts/whl"],
#       command="bash trainer/benchmarks/device_kernels.sh")
# FLA_STRATEGIES (default: all of layer_kinds.STRATEGIES) picks the strategies run with fla; FALLBACK=0 skips the
# fallback's run; FLA_PROFILE=1 profiles each strategy's forward after its timings (time per part, top kernels).
# Everything lands in $OUT: versions.txt, target-forward-{fla,fallback}.{json,log}.
set -uo pipefail
OUT=${OUT:-/tmp/dflash-out}
WHL=${WHL:-$PWD/.artifacts/whl}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD/trainer/src:$PWD/trainer" \
    TORCHINDUCTOR_CACHE_DIR=/tmp/dflash-inductor
START=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/fla-site "$WHL"/*.whl \
    2>&1 | tail -n 2
FLA_PATH="/tmp/fla-site:$PYTHONPATH"
PYTHONPATH=$FLA_PATH python3 -c "import torch, transformers, fla; print('torch', torch.__version__, 'transformers', transformers.__version__, 'fla', fla.__version__, torch.cuda.get_device_name())" \
    | tee "$OUT/versions.txt"
cd trainer
quiet() { grep --line-buffered -v -E "Loading weights|Writing model"; }
echo "=== with flash-linear-attention"
PYTHONPATH=$FLA_PATH timeout "${FLA_S:-380}" python3 -m benchmarks.target_forward --preset qwen3.6-27b \
    --target-layers kinds ${FLA_STRATEGIES:+--strategies "$FLA_STRATEGIES"} ${FLA_PROFILE:+--profile} \
    --out "$OUT/target-forward-fla.json" \
    2>&1 | quiet | tee "$OUT/target-forward-fla.log"
echo "fla: $((SECONDS - START)) s"
[ "${FALLBACK:-1}" = 0 ] && exit 0
echo "=== transformers' torch fallback (no fla)"
left=$((560 - (SECONDS - START)))
timeout "$left" python3 -m benchmarks.target_forward --preset qwen3.6-27b --target-layers kinds \
    --strategies eager,by-kind --out "$OUT/target-forward-fallback.json" 2>&1 | quiet \
    | tee "$OUT/target-forward-fallback.log"
echo "total: $((SECONDS - START)) s"
