#!/usr/bin/env bash
# The SmolLM2 proof on a lent GPU machine whose working-tree copy is capped at 64 MiB per call and that
# has no network, no `gguf` package and no `datasets` (dflash-prepare-data reads through it: the trainer's `data`
# extra). The 98 MB GGUF therefore travels in two halves over two consecutive calls (the machine keeps /var/tmp
# while it stays warm), with those wheels.
#
# Here (once a machine; git-ignored files do not outlast it):
#               (cd trainer && ../.venv/bin/python -m proofs.stash_here --record results/<a proof's record>.json)
#               (proofs/stash_here.py: dev-a gets the GGUF's first half and the wheels, dev-b the second half, its
#               sha256, the wheels, prompts.jsonl.gz (41,607 prompts, runs 4 on), extra.jsonl (the PyPI prompt sets;
#               launch copies it to $S/extra.jsonl) and flags.sh, whose $F is the record's proof flags; it checks
#               that each folder with the working tree fits a call)
#               (optional) .venv/bin/python trainer/proofs/data_sendback.py join <files_at of each call>... \
#                   --to .artifacts/dev-a   (the data-NN.tar that launch and every watch sent back as it was made:
#               prepare-data resumes from them, or skips the regeneration where they hold all of it; 41,575 rows
#               were 8.7 MB; dev-a must stay under the 64 MiB a call carries: its wheels may go)
#               (where one call would exceed 64 MiB, split the data: e.g. run 17 carried the synthesized and extra
#               prompts' data as dev-a/data-new.tar.gz, the proof's own as dev-b/data.tar and the prompts as
#               dev-b/prompts.jsonl.gz; launch takes data*.tar* from both folders and either prompts file;
#               run 19 carried the three batches its first lease sent as dev-a/data-01.tar.gz, data-02.tar.gz and
#               dev-b/data-03.tar.gz: gzip -9 made 24.9 MB 18.1 MB, and the 64 MiB count includes the working tree;
#               xz -9e makes another 12 % less: run 25 carried data-01.tar.xz and data-02.tar.xz, tar reads either;
#               the tree plus dev-a at 65.4 and 65.6 MB by `du -b` went, at 66.7 MB it was refused: keep some room)
#               (optional) cp <files_at of an earlier watch>/data-baseline.tar .artifacts/dev-a/  (the baseline:
#               a proof with the same target, prompts and settings reuses it, PROOF.md "The baseline kept")
# Call 1 (carry .artifacts/dev-a):  bash trainer/proofs/device_proof.sh stash [smoke|nosmoke]  (GPU smoke test)
#                                   (REGEN_BENCH=1 also times the regeneration's KV caches and attentions,
#                                   benchmarks/regeneration.py, about 6 minutes on an H100 (run 19 cut it off at
#                                   270 s): launch may then pass the fastest as --regen-kv-cache /
#                                   --regen-decode-attention; REGEN_BENCH_ARGS adds the benchmark's own flags,
#                                   e.g. "--caches dynamic": two rows, sdpa and packed-gqa, in about 2 minutes)
# Call 2 (carry .artifacts/dev-b):  bash trainer/proofs/device_proof.sh launch PROOF_FLAGS...
#                                   (starts proofs.proof_smollm2 detached, then follows it for $WATCH_S s;
#                                   the proof trains with dflash-train: PROOF_FLAGS holds dflash-train's own
#                                   flags, e.g. the 10-minute proof on one H200:
#                                   --device cuda --eval-device cuda:0 --time-budget-min 10
#                                   --snapshot-minutes 2,5 --compile-warmup-batches 2 --epochs 100
#                                   --block-size 16 --gamma 7 --max-anchors 256 --token-budget 32768
#                                   --max-seq-len 1024 --grad-accum 1 --lr 1e-3 --use-soft-labels
#                                   --log-interval 50 --checkpoint-interval 100000 --num-eval 32
#                                   --eval-max-new-tokens 128 --temperature 0 --regen-max-new-tokens 160
#                                   --regen-batch-size 2048 --regen-rows-per-shard 2048 --regen-budget-s 420
#                                   (--eval-device cuda:0: an evaluation worker beside dflash-train on
#                                   the same GPU; after training the baseline alone took ~520 s, PROOF.md
#                                   run 12; beside training everything finished in the lease, at 27 % fewer
#                                   training steps, PROOF.md run 13; every snapshot is also evaluated on the
#                                   78 other-styles prompts:
#                                   --num-other-styles N evaluates fewer, PROOF.md "Two held-out sets")
#                                   --eval-workers 4 decodes the evaluation in 4 processes (2.6x
#                                   sooner alone, PROOF.md "Evaluation in several processes");
#                                   --synthesize-prompts N also trains on N prompts SmolLM2 writes
#                                   itself (PROOF.md run 14: 10,000 in ~90 s with their answers);
#                                   PROOF_B="FLAGS" also starts a second proof on the same data once
#                                   it is ready, reported as proof-b.*; with PROOF_B_AFTER=1 once the
#                                   first proof has ended: two ablations in one lease, one after the other;
#                                   PROOF_C="FLAGS" a third after proof B, reported as proof-c.*;
#                                   SERVE_BENCH=1 then runs serve_bench.py on the best export with the
#                                   other-styles prompts (`serve` below; SERVE_BENCH_ARGS: its flags).
#                                   On a warm machine whose proofs have ended, launch again starts new ones
#                                   (the data, the GGUF and inductor's cache reused; the earlier logs and
#                                   reports move to $S/earlier-N); it refuses while one runs)
# (launch spends ~40 s joining and converting the GGUF before it follows: WATCH_S=560 overran a 600 s call in
# run 13, so keep WATCH_S <= 520)
# Calls 3.. (within 30 s of the last): bash trainer/proofs/device_proof.sh watch [SECONDS]
# (or serve: serve_bench.py on the best finished export now, with the other-styles prompts)
# Warm start (optional, between calls 1 and 2; carry .artifacts/dev-c holding the init.tar.part-* that the
# last watch of an earlier session sent): bash trainer/proofs/device_proof.sh stash-init, then launch
# with --init-drafter /var/tmp/dflash/init-drafter
# Data that fits neither dev-a nor dev-b (optional, between calls 1 and 2; carry .artifacts/dev-d holding data*.tar*,
# e.g. a whole lease's regenerated data as one data-01.tar.xz, 15.5 MB in run 28, and data-baseline.tar):
# bash trainer/proofs/device_proof.sh stash-data; launch unpacks it with the rest
set -uo pipefail
S=${DFLASH_STASH:-/var/tmp/dflash}   # kept between calls while the machine is warm (override: tests of this script)
OUT=${OUT:-/tmp/dflash-out}
# This stash's proofs (--out $S/proof, and $S/proof-b with the waiter that starts it): not any proof on the machine
OURS="out $S/proof"
mkdir -p "$S" "$OUT"
# the trainer from its source and the proofs package (trainer/proofs, run as `python3 -m proofs.…`)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH="$PWD/trainer/src:$PWD/trainer:$S/site"

# The carried wheels (gguf; datasets, dill, multiprocess), once per warm machine.
install_wheels() {
    [ -d "$S/site/gguf" ] && [ -d "$S/site/datasets" ] && return
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$S/site" "$1"/*.whl || exit 4
    python3 -c "import gguf, datasets" || { echo "the carried wheels do not import: see the header"; exit 4; }
}

# What of the regenerated data has come back (run by path; it imports no torch)
SENDBACK="$(dirname "$0")/data_sendback.py"

# What a call prints of a proof's log: where it stands (training steps, each snapshot's τ, the results table, an error)
# and its last lines; the whole logs come back under $OUT. A long reply is slow to read, and a gap of more than the
# machine's 30 s warm time between two calls gives the machine back with the proofs on it (run 20 lost two so).
brief() {
    grep -E "^step |^finished:|^\[eval .*\] after|^dflash  |^\| (DFlash|prompt lookup)|Traceback|Error|error:" "$1" \
        | tail -n "${BRIEF_LINES:-12}"
    echo "(last lines)"; tail -n 2 "$1"
}

# Follow the detached proof's log for up to $1 seconds (or until it exits); copy its reports to $OUT.
watch_proof() {
    local until=$((SECONDS + $1))
    while [ $SECONDS -lt $until ] && { pgrep -f "$OURS" > /dev/null || serve_pending; }; do sleep 5; done
    local noise="Loading weights|Writing model|forward_call|FutureWarning|warnings.warn"
    grep -v -E "$noise" "$S/proof.log" > "$OUT/proof.log"
    brief "$OUT/proof.log"
    cp "$S"/report/proof.json "$OUT/" 2>/dev/null  # proof.md is in the log's last lines and in proof.json
    for x in b c; do  # the later proofs (PROOF_B, PROOF_C at launch)
        [ -f "$S/proof-$x.log" ] || continue
        grep -v -E "$noise" "$S/proof-$x.log" > "$OUT/proof-$x.log"
        echo "--- proof ${x^^}:"; brief "$OUT/proof-$x.log"
        cp "$S/report-$x/proof.json" "$OUT/proof-$x.json" 2>/dev/null
    done
    # The regenerated data comes back as it is made, at every call (data_sendback.py: the settled files that were
    # neither carried in nor sent before, as data-NN.tar.part-* of 15 MiB; $OUT takes 8 files, one is kept for
    # data-baseline.tar), so that a lease lost in the middle of the regeneration still keeps what its calls made.
    # Here: `.venv/bin/python trainer/proofs/data_sendback.py join <files_at>... --to .artifacts/dev-a` (stash
    # carries it in; the project's venv: the script imports the trainer).
    [ -d "$S/proof/data" ] && python3 "$SENDBACK" send --proof "$S/proof" --stash "$S" --out "$OUT" \
        --places $((7 - $(ls "$OUT" | wc -l)))
    # The baseline a proof keeps under its data root (proofs/baseline_cache.py) comes back once too, as
    # data-baseline.tar: put it beside the data-NN.tar in dev-a, and a later lease's proof with the same target,
    # prompts and settings reuses it instead of decoding it again (stash and launch carry every data*.tar).
    if [ ! -f "$S/baseline.sent" ] && [ -d "$S/proof/baseline-cache" ]; then
        tar -C "$S/proof" -cf "$OUT/data-baseline.tar" baseline-cache && touch "$S/baseline.sent"
    fi
    if pgrep -f "$OURS" > /dev/null; then echo "STILL RUNNING"; return; fi
    # Once all is done: the longest-trained export of the better proof comes back in three pieces
    # (init.tar.part-*, ~39 MB in all), for a later session's warm start (stash-init, --init-drafter).
    local best
    best=$(best_export)
    if [ -n "$best" ] && [ ! -f "$S/init.sent" ] && [ "$(ls "$OUT" | wc -l)" -le 5 ]; then
        tar -C "$(dirname "$best")" --transform "s,^$(basename "$best"),init-drafter," -cf - "$(basename "$best")" \
            | split -b 15M - "$OUT/init.tar.part-" && touch "$S/init.sent" && echo "export sent: $best"
    elif [ -n "$best" ] && [ ! -f "$S/init.sent" ]; then  # (three proofs' reports alone fill 6 of the 8 files)
        echo "export not sent (\$OUT holds $(ls "$OUT" | wc -l) files; its 3 pieces need <= 5 there)"
    fi
    if [ -f "$S/serve-bench.log" ]; then  # SERVE_BENCH=1 at launch: serve_bench.py on the best export
        echo "--- serve_bench (other styles):"
        grep -E "^prompts |^speedup|^tau|^lossless|^plain|^speculative|error" "$S/serve-bench.log" | tail -n 8
        cp "$S/serve-bench.json" "$OUT/" 2>/dev/null  # (the report; its log is these lines: $OUT takes 8 files)
    fi
    if serve_pending; then echo "STILL RUNNING (serve_bench)"; return; fi
    echo "PROOF FINISHED"
}

# The export of the longest-trained snapshot of this stash's best proof (by τ on the split), or nothing.
best_export() {
    python3 - "$S"/report/proof.json "$S"/report-[bc]/proof.json <<'PY' 2>/dev/null
import json, os, sys
runs = [json.load(open(p)) for p in sys.argv[1:] if os.path.isfile(p)]
snaps = [s for r in runs for s in r["snapshots"][-1:] if s.get("eval")]
print(max(snaps, key=lambda s: s["eval"]["tau"])["export"] if snaps else "")
PY
}

# Whether serve_bench (SERVE_BENCH=1 at launch) is still to come or running: its waiter's pid, alive.
serve_pending() {
    [ -f "$S/serve.pid" ] && kill -0 "$(cat "$S/serve.pid")" 2> /dev/null
}

# A carried folder's regenerated data (data*.tar*) put beside the GGUF part, where launch unpacks every data*.tar*.
stash_data() {
    cp "$1"/data*.tar* "$S/" 2>/dev/null && echo "regenerated data stashed: $(ls "$S"/data*.tar*)"
}

case "${1:-}" in
stash)
    cp .artifacts/dev-a/gguf-part-00 "$S/" || exit 3
    stash_data .artifacts/dev-a
    # (dev-a may leave its wheels out to stay under the 64 MiB a call carries with the data: launch installs dev-b's)
    if ls .artifacts/dev-a/*.whl > /dev/null 2>&1; then install_wheels .artifacts/dev-a; fi
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
    python3 -c "import torch, transformers, gguf
print('torch', torch.__version__, 'transformers', transformers.__version__, 'gguf ok', torch.cuda.is_available())"
    python3 -c "import transformers, inspect
print('GgufConfig', hasattr(transformers, 'GgufConfig') and inspect.signature(transformers.GgufConfig))"
    if [ "${REGEN_BENCH:-0}" = 1 ]; then
        read -ra bench_flags <<< "${REGEN_BENCH_ARGS:-}"
        python3 -m benchmarks.regeneration --preset smollm2-135m --device cuda "${bench_flags[@]}" \
            --out "$OUT/regeneration.json" 2>&1 \
            | grep --line-buffered -v -E "Loading weights|Writing model" | tee "$OUT/regeneration.log" | tail -n 45
    fi
    # GPU smoke test of the whole proof path on the tiny target (regenerate, flex-attention training, eval)
    [ "${2:-smoke}" = smoke ] && python3 -m proofs.proof_smollm2 --tiny --out "$S/tiny" --device cuda \
        --report-dir "$OUT" \
        2>&1 | grep --line-buffered -v -E "Loading weights|Writing model" | tee "$OUT/tiny.log"
    ls -la "$S"
    ;;
stash-init)
    # A warm start for this session's proof: the pieces `watch` sent at the end of an earlier session,
    # put into .artifacts/dev-c/; then launch with --init-drafter /var/tmp/dflash/init-drafter.
    cat .artifacts/dev-c/init.tar.part-* | tar -C "$S" -xf - || exit 3
    ls -la "$S/init-drafter"
    ;;
stash-data)
    stash_data .artifacts/dev-d || { echo "no data*.tar* in .artifacts/dev-d: carry that folder"; exit 3; }
    ;;
launch)
    # Join, check and convert the GGUF, then start the proof in its own session (setsid), so that it
    # outlives this call: the machine keeps running it while later `watch` calls keep the machine warm.
    # (checked before anything starts)
    [ -n "${PROOF_C:-}" ] && [ "${PROOF_B_AFTER:-0}:${PROOF_B:+b}" != 1:b ] && {
        echo "PROOF_C runs after proof B ends: set PROOF_B and PROOF_B_AFTER=1 with it"; exit 2; }
    # A second launch on the warm machine never runs beside this stash's proofs (one GPU, one log)
    if pgrep -f "$OURS" > /dev/null || serve_pending; then
        echo "a proof of this machine is still running: watch it to its end, then launch again"; exit 2
    fi
    [ -f "$S/gguf-part-00" ] || { echo "part 1 is not here: the machine was not kept warm; run stash again"; exit 3; }
    # ...and the earlier launch's logs and reports move aside, so that watch reports this launch's alone
    if [ -f "$S/proof.log" ]; then
        n=1; while [ -e "$S/earlier-$n" ]; do n=$((n + 1)); done
        mkdir "$S/earlier-$n" && mv "$S"/proof*.log "$S"/report* "$S"/serve* "$S"/init.sent "$S/earlier-$n/" 2>/dev/null
        echo "the earlier launch's logs and reports: $S/earlier-$n"
    fi
    mkdir -p "$S/gguf"
    gguf="$S/gguf/SmolLM2-135M-Instruct.Q4_1.gguf"
    cat "$S/gguf-part-00" .artifacts/dev-b/gguf-part-01 > "$gguf"
    echo "$(cut -d' ' -f1 .artifacts/dev-b/gguf.sha256)  $gguf" | sha256sum -c || exit 5
    install_wheels .artifacts/dev-b
    # (prompts.jsonl.gz and data*.tar.gz where a call's 64 MiB would not hold them plain; tar reads either)
    if [ -f .artifacts/dev-b/prompts.jsonl.gz ]; then gzip -dc .artifacts/dev-b/prompts.jsonl.gz > "$S/prompts.jsonl"
    else cp .artifacts/dev-b/prompts.jsonl "$S/prompts.jsonl"; fi
    cp .artifacts/dev-b/data*.tar* "$S/" 2>/dev/null
    # one path on every machine: prepare-data's fingerprint holds it, so carried data of it stays valid
    [ -f .artifacts/dev-b/extra.jsonl ] && cp .artifacts/dev-b/extra.jsonl "$S/extra.jsonl"
    # Data regenerated by an earlier session (the data*.tar* files from `watch`, from dev-a's stash and dev-b):
    # prepare-data finds it complete for these exact prompts and settings (its fingerprint) and skips
    # the regeneration (217 s in run 3).
    for t in "$S"/data*.tar*; do
        [ -f "$t" ] && mkdir -p "$S/proof" && tar -C "$S/proof" -xf "$t" && echo "regenerated data carried in: $t"
    done
    python3 "$SENDBACK" mark --proof "$S/proof" --stash "$S"  # what came in is not sent back
    python3 -m dflash_trainer.prep.smollm2 --gguf "$gguf" --out "$S/smollm2" \
        2>&1 | grep --line-buffered -v -E "Converting|Loading weights|Writing model"
    [ -f "$S/smollm2/dflash_smollm2.json" ] || exit 6
    shift
    proof=(python3 -m proofs.proof_smollm2 --target-model "$S/smollm2" --prompts "$S/prompts.jsonl")
    setsid nohup "${proof[@]}" --out "$S/proof" --report-dir "$S/report" "$@" > "$S/proof.log" 2>&1 < /dev/null &
    echo "proof started (pid $!): $*"
    # PROOF_B, and PROOF_C after it, hold the flags of more proofs on the first one's data (--data-root): e.g.
    # another configuration on the second GPU. --num-eval, --seed and --regen-devices must match the first proof's (the
    # split is checked). PROOF_B starts once the first proof's data is complete; with PROOF_B_AFTER=1 once the first
    # proof has ended instead, with the GPU to itself: an ablation comparable with the first run (the baseline is
    # reused from the data root's cache, inductor's cache is warm). PROOF_C always starts once proof B has ended.
    previous="$S/proof"
    for x in b c; do
        flags_var="PROOF_${x^^}"
        [ -n "${!flags_var:-}" ] || continue
        read -ra x_flags <<< "${!flags_var}"
        # $1: the stash, $2: the proof this one follows; each waiter checks the first proof's data
        waits="the data" wait_for='until grep -q "\] data: " "$1/proof.log"; do
                                       pgrep -f "out $1/proof " > /dev/null || exit 1; sleep 5; done'
        if [ "${PROOF_B_AFTER:-0}" = 1 ]; then
            waits="the end of $(basename "$previous")" wait_for='while pgrep -f "out $2 " > /dev/null; do sleep 5; done
                                                    grep -q "\] data: " "$1/proof.log" || exit 1'
        fi
        setsid nohup bash -c "$wait_for"'; shift 2; exec "$@"' \
            _ "$S" "$previous" "${proof[@]}" --out "$S/proof-$x" --report-dir "$S/report-$x" --data-root "$S/proof" \
            "${x_flags[@]}" > "$S/proof-$x.log" 2>&1 < /dev/null &
        echo "proof ${x^^} waits for $waits (pid $!): ${!flags_var}"
        previous="$S/proof-$x"
    done
    # SERVE_BENCH=1: serve_bench.py on the best export once every proof has ended (the `serve` command below)
    if [ "${SERVE_BENCH:-0}" = 1 ]; then
        setsid nohup bash "$0" serve-after > "$S/serve-waiter.log" 2>&1 < /dev/null &
        echo $! > "$S/serve.pid"
        echo "serve_bench waits for the end of the proofs (pid $!): ${SERVE_BENCH_ARGS:-}"
    fi
    watch_proof "${WATCH_S:-520}"
    ;;
serve-after)
    # (launch starts it detached with SERVE_BENCH=1; its pid in $S/serve.pid) `serve` once every proof has ended
    while pgrep -f "$OURS" > /dev/null; do sleep 5; done
    exec bash "$0" serve
    ;;
serve)
    # serve_bench.py (batch-1 greedy decoding: the target alone against the speculative loop, the same prompts)
    # with the best export of this stash's proofs, on the other-styles set: issue 34's serving figure.
    # SERVE_BENCH_ARGS adds its own flags, e.g. "--compile"; all 78 prompts take ~470 s by run 8's 193 s for 32 on an
    # H200 (--num-prompts N takes the first N, and the set runs style by style: fewer leave styles out).
    drafter=$(best_export)
    [ -n "$drafter" ] || { echo "no export of a finished proof on this machine: launch a proof first"; exit 3; }
    other=trainer/src/dflash_trainer/prep/other_styles.jsonl
    read -ra serve_flags <<< "${SERVE_BENCH_ARGS:-}"
    echo "serve_bench: $drafter on $other"
    python3 -m benchmarks.serve_bench --target-model "$S/smollm2" --drafter "$drafter" --prompts "$other" \
        --num-prompts "$(wc -l < "$other")" --max-new-tokens 128 --out "$S/serve-bench.json" "${serve_flags[@]}" \
        2>&1 | grep --line-buffered -v -E "Loading weights" > "$S/serve-bench.log"
    tail -n 3 "$S/serve-bench.log"
    ;;
watch)
    # A machine given back since the launch (more than its warm time between calls) comes back bare: say so, rather
    # than report an empty log as a finished proof.
    [ -f "$S/proof.log" ] || { echo "no proof on this machine: it was given back since launch (a gap between calls" \
        "longer than its warm time); run stash and launch again, carrying the data that came back"; exit 3; }
    watch_proof "${2:-540}"
    ;;
*)
    echo "usage: $0 stash [smoke|nosmoke] | stash-init | stash-data | launch PROOF_FLAGS... | watch [SECONDS]" \
        "| serve"; exit 2 ;;
esac
