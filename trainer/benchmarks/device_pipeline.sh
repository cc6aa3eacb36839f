#!/usr/bin/env bash
# Issue 13 on a lent GPU machine, in one call of under 8 minutes: first the transport check (a CUDA test: the
# losses with overlapped hidden-state transfers equal, bit for bit, those with --hs-sync-transfers; over NCCL
# with 2 GPUs, host-staged between two processes on one GPU otherwise), then benchmarks.pipeline at the 27B
# shape (nccl on 2 GPUs; shared = two processes on one GPU, plus the one-process run, on 1 GPU).
#
# Device call (nothing to carry: the trainer runs from trainer/src with the machine's torch and transformers):
#   run(kind="nvidia-h200-x2", timeout_s=540, command="bash trainer/benchmarks/device_pipeline.sh")
# MODE=shared (environment) runs the one-GPU mode on a 2-GPU machine; SKIP_TEST=1 skips the transport check.
# Everything lands in $OUT: gpus.txt, transport_test.log, pipeline.json, pipeline.log (+ the job's own logs).
set -uo pipefail
OUT=${OUT:-/tmp/dflash-out}
mkdir -p "$OUT"
# NVLink multicast stays off (KINDS.md); one inductor cache for the test and the benchmark
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD/trainer/src:$PWD/trainer" NCCL_NVLS_ENABLE=0 \
    TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 TORCHINDUCTOR_CACHE_DIR=/tmp/dflash-inductor
START=$SECONDS
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv | tee "$OUT/gpus.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'GPUs', torch.cuda.device_count())" \
    | tee -a "$OUT/gpus.txt"
free -g | tee -a "$OUT/gpus.txt"

if [ "${SKIP_TEST:-0}" != 1 ]; then
    echo "=== transport check (trainer/tests/test_cuda.py, overlap on/off)"
    timeout 170 python3 -m pytest trainer/tests/test_cuda.py -k overlapped -q -s -p no:cacheprovider \
        2>&1 | tee "$OUT/transport_test.log" | grep -v -E "Loading weights|Writing model" | tail -n 25
    echo "transport check: $((SECONDS - START)) s"
fi

echo "=== pipeline benchmark (h200-27b)"
left=$((470 - (SECONDS - START)))
mode=()
[ -n "${MODE:-}" ] && mode=(--mode "$MODE")
timeout "$left" python3 -m benchmarks.pipeline --preset h200-27b ${mode[@]+"${mode[@]}"} --timeout $((left - 90)) \
    --work-dir /tmp/dflash-pipeline --out "$OUT/pipeline.json" "$@" 2>&1 \
    | grep --line-buffered -v -E "Loading weights|Writing model" | tee "$OUT/pipeline.log"
status=${PIPESTATUS[0]}
for f in pipeline serial; do  # the jobs' own logs (ranks' lines), without the progress bars
    [ -f "/tmp/dflash-pipeline/$f.log" ] && grep -v -E "Loading weights|Writing model" "/tmp/dflash-pipeline/$f.log" \
        | tail -n 400 > "$OUT/job-$f.log"
done
echo "total: $((SECONDS - START)) s, pipeline.py exit $status"
