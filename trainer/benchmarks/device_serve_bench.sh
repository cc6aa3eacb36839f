#!/usr/bin/env bash
# serve_bench.py on one lent H200 with the export of the dflash-train proof (PROOF.md run 6), SmolLM2-135M-Instruct
# as the target (converted from the GGUF on the machine, as the proof does), the proof's 32 held-out prompts.
# The GGUF travels in two halves as for the proof (device_proof.sh), the export as .artifacts/dev-d2/init.tar.part-*.
#
# Call 1 (carry .artifacts/dev-a):  bash trainer/proofs/device_proof.sh stash nosmoke
# Call 2 (carry .artifacts/dev-b .artifacts/dev-d2, within the warm window):
#                                   bash trainer/benchmarks/device_serve_bench.sh [SERVE_BENCH_FLAGS...]
# Writes $OUT/serve-bench.json and $OUT/serve-bench.log (they come back with the call).
# Other prompts: later flags win, e.g. the other-styles set (issue 34's serving figure; ~470 s for 78 prompts by
# run 8's 193 s for 32): --prompts trainer/src/dflash_trainer/prep/other_styles.jsonl --num-prompts 78
# An export that came back from an earlier session (init.tar.part-* in .artifacts/dev-c): run
# `device_proof.sh stash-init` (carry dev-c) between calls 1 and 2; it is used instead of dev-d2's.
set -uo pipefail
S=${DFLASH_STASH:-/var/tmp/dflash}
OUT=${OUT:-/tmp/dflash-out}
mkdir -p "$S" "$OUT"
# the trainer from its source and the benchmarks and proofs packages (run as `python3 -m benchmarks.…`)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD/trainer/src:$PWD/trainer:$S/site"

[ -f "$S/gguf-part-00" ] || { echo "part 1 of the GGUF is not here: run call 1 (device_proof.sh stash) first"; exit 3; }
if [ ! -f "$S/smollm2/dflash_smollm2.json" ]; then
    mkdir -p "$S/gguf"
    cat "$S/gguf-part-00" .artifacts/dev-b/gguf-part-01 > "$S/gguf/SmolLM2-135M-Instruct.Q4_1.gguf"
    echo "$(cut -d' ' -f1 .artifacts/dev-b/gguf.sha256)  $S/gguf/SmolLM2-135M-Instruct.Q4_1.gguf" \
        | sha256sum -c || exit 5
    [ -d "$S/site/gguf" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$S/site" .artifacts/dev-b/gguf-*.whl || exit 4
    python3 -m dflash_trainer.prep.smollm2 --gguf "$S/gguf/SmolLM2-135M-Instruct.Q4_1.gguf" --out "$S/smollm2" \
        2>&1 | grep --line-buffered -v -E "Converting|Loading weights|Writing model"
    [ -f "$S/smollm2/dflash_smollm2.json" ] || exit 6
fi
# the export of run 6 (dflash-train, 10-minute schedule): the tar holds init-drafter/
[ -d "$S/init-drafter" ] || { cat .artifacts/dev-d2/init.tar.part-* | tar -C "$S" -xf - || exit 7; }
# the proof's held-out split: the last 32 prompts after the shuffle with dflash-train's default seed (0)
# (dev-b holds prompts.jsonl, or prompts.jsonl.gz where a call's 64 MiB would not hold it plain)
mkdir -p "$S/serve"
if [ -f .artifacts/dev-b/prompts.jsonl.gz ]; then gzip -dc .artifacts/dev-b/prompts.jsonl.gz > "$S/prompts.jsonl"
else cp .artifacts/dev-b/prompts.jsonl "$S/prompts.jsonl" || exit 8; fi
python3 - "$S" <<'EOF' || exit 8
import sys
from proofs.proof_smollm2 import split_prompts
print("held-out prompts:", split_prompts(sys.argv[1] + "/prompts.jsonl", sys.argv[1] + "/serve", 32, 0, False)[1])
EOF
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python3 -m benchmarks.serve_bench --target-model "$S/smollm2" --drafter "$S/init-drafter" \
    --prompts "$S/serve/eval_prompts.jsonl" --num-prompts 32 --max-new-tokens 128 --device cuda --dtype bfloat16 \
    --out "$OUT/serve-bench.json" "$@" 2>&1 | grep --line-buffered -v -E "Loading weights" | tee "$OUT/serve-bench.log"
