#!/usr/bin/env python3
"""A stand-in trainer that honours the run contract (heartbeat.json in $DFLASH_RUN_DIR), with misbehaviours.

--behaviour good        heartbeat every 0.2 s, exits 0 on SIGTERM
--behaviour crash       prints a traceback-like line and exits 3 at once
--behaviour ignore-term ignores SIGTERM (must be SIGKILLed)
--behaviour slow-exit   takes --exit-delay seconds to exit after SIGTERM (checkpointing)
--behaviour fork-holder forks a child that keeps stdout open and outlives nobody's patience
--behaviour no-heartbeat never writes a heartbeat
Every start appends argv and selected env facts to $DFLASH_RUN_DIR/starts.jsonl.
"""
import argparse
import hashlib
import json
import os
import signal
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--behaviour", default="good")
p.add_argument("--exit-delay", type=float, default=0.0)
p.add_argument("--tag", default="")
args, _ = p.parse_known_args()
run_dir = os.environ["DFLASH_RUN_DIR"]


def heartbeat(phase, step):
    tmp = os.path.join(run_dir, "heartbeat.json.tmp%d" % os.getpid())
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "phase": phase, "step": step, "epoch": 0, "loss": 1.0 / (step + 1),
                   "tokens_per_s": 100.0, "updated_at": time.time()}, f)
    os.replace(tmp, os.path.join(run_dir, "heartbeat.json"))


facts = {"pid": os.getpid(), "argv": sys.argv, "tag": args.tag,
         "env": {k: os.environ.get(k) for k in os.environ.get("FAKE_SHOW_ENV", "").split(",") if k},
         "secret_sha": {k: hashlib.sha256(os.environ[k].encode()).hexdigest()
                        for k in os.environ.get("FAKE_HASH_ENV", "").split(",") if k in os.environ},
         "env_names": sorted(os.environ)}
with open(os.path.join(run_dir, "starts.jsonl"), "a") as f:
    f.write(json.dumps(facts) + "\n")
print("fake trainer starting: %s" % args.behaviour, flush=True)

if args.behaviour == "crash":
    print("RuntimeError: simulated crash at start", flush=True)
    sys.exit(3)

stopping = []
if args.behaviour == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *a: stopping.append(time.monotonic()))

if args.behaviour == "fork-holder" and os.fork() == 0:
    # The child keeps the inherited stdout/stderr open and lives on.
    time.sleep(3600)
    os._exit(0)

step = 0
while not stopping:
    if args.behaviour != "no-heartbeat":
        heartbeat("training", step)
    step += 1
    time.sleep(0.2)
if args.exit_delay:
    heartbeat("checkpointing", step)
    time.sleep(args.exit_delay)
heartbeat("finished", step)
print("fake trainer stopped after SIGTERM", flush=True)
