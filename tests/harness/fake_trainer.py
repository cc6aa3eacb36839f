#!/usr/bin/env python3
"""A quick stand-in trainer that honours the run contract (docs/design.md), stdlib only, for fault tests.

Writes heartbeat.json {pid, phase, step, epoch, updated_at} into $DFLASH_RUN_DIR (or --run-dir) every --interval s,
checkpoints to checkpoints/step-N (temp dir + rename, `latest` file) every --ckpt-every steps and on SIGTERM, and
resumes from checkpoints/latest. Fault switches: --crash RC, --ignore-term, --slow-exit S, --hold PATH,
--fork-holder (a child that keeps stdout open and lives on), --no-heartbeat, --fail TEXT with --fail-exit-after S
(as dflash-train fails at start: the `failed` heartbeat with TEXT and its error line, then exit 2 S seconds later).
--check answers as `dflash-train --check` does (one JSON line, then `ok`, exit 0; the settings the lifecycle reads:
checkpoints under --output-dir or the run dir, --keep-checkpoints, the stand-in's own default 3) and starts nothing;
with --refuse-check TEXT it refuses (TEXT on stderr, exit 2).
Each start appends {pid, argv, tag, env, secret_sha, env_names} to <run dir>/starts.jsonl: `env` holds the
variables named in $FAKE_SHOW_ENV, `secret_sha` the sha256 of those named in $FAKE_HASH_ENV (comma lists).
Used on the host by tests/integration and benchmarks/restart.py, and inside the harness containers.
"""
import hashlib
import argparse
import json
import os
import signal
import sys
import time


def atomic_json(path, obj):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def record_start(run_dir, tag):
    show = [k for k in os.environ.get("FAKE_SHOW_ENV", "").split(",") if k]
    hashed = [k for k in os.environ.get("FAKE_HASH_ENV", "").split(",") if k in os.environ]
    facts = {"pid": os.getpid(), "argv": sys.argv, "tag": tag, "env": {k: os.environ.get(k) for k in show},
             "secret_sha": {k: hashlib.sha256(os.environ[k].encode()).hexdigest() for k in hashed},
             "env_names": sorted(os.environ)}
    with open(os.path.join(run_dir, "starts.jsonl"), "a") as fh:
        fh.write(json.dumps(facts) + "\n")


def answer_check(args):
    if args.refuse_check:
        print(json.dumps({"check": "failed", "problems": [args.refuse_check], "settings": None, "layout": None}))
        print("dflash-train: error: %s" % args.refuse_check, file=sys.stderr)
        return 2
    settings = {"run_dir": args.run_dir, "keep_checkpoints": args.keep_checkpoints,
                "checkpoints": os.path.join(args.output_dir or args.run_dir or "", "checkpoints")}
    print(json.dumps({"check": "ok", "problems": [], "settings": settings, "layout": None,
                      "world_size": int(os.environ.get("WORLD_SIZE", "1"))}))
    print("ok")
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", default=os.environ.get("DFLASH_RUN_DIR"))
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--ckpt-every", type=int, default=4)
    ap.add_argument("--crash", type=int, default=None, help="exit with this status right after start")
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--slow-exit", type=float, default=0.0, help="seconds to take to exit after SIGTERM")
    ap.add_argument("--hold", default=None, help="keep this file open (a fake GPU device)")
    ap.add_argument("--tag", default="", help="free text, only to change the fingerprint")
    ap.add_argument("--fork-holder", action="store_true", help="fork a child that keeps stdout open and lives on")
    ap.add_argument("--no-heartbeat", action="store_true", help="never write heartbeat.json")
    ap.add_argument("--fail", default=None, help="fail at start as dflash-train does, with this error text")
    ap.add_argument("--fail-exit-after", type=float, default=0.0, help="with --fail: seconds until the exit")
    ap.add_argument("--check", action="store_true", help="answer as dflash-train --check, start nothing")
    ap.add_argument("--refuse-check", default=None, help="with --check: refuse with this text")
    ap.add_argument("--output-dir", default=None)
    ap.add_argument("--keep-checkpoints", type=int, default=3)
    args, unknown = ap.parse_known_args()
    if args.check:
        return answer_check(args)
    if not args.run_dir:
        print("fake_trainer: no run dir (DFLASH_RUN_DIR or --run-dir)", file=sys.stderr)
        return 2
    run_dir = args.run_dir
    ckdir = os.path.join(run_dir, "checkpoints")
    os.makedirs(ckdir, exist_ok=True)
    record_start(run_dir, args.tag)
    print("fake_trainer pid=%d argv=%s unknown=%s" % (os.getpid(), sys.argv[1:], unknown), flush=True)
    if args.crash is not None:
        print("fake_trainer: crashing at start with status %d (as asked)" % args.crash, flush=True)
        return args.crash
    if args.fail is not None:
        atomic_json(os.path.join(run_dir, "heartbeat.json"),
                    {"pid": os.getpid(), "phase": "failed", "error": args.fail, "updated_at": time.time()})
        print("dflash-train: error: %s" % args.fail, file=sys.stderr, flush=True)
        time.sleep(args.fail_exit_after)
        return 2
    held = open(args.hold, "a") if args.hold else None  # noqa: F841 (kept open on purpose)

    step = 0
    latest = os.path.join(ckdir, "latest")
    if os.path.exists(latest):
        with open(latest) as fh:
            name = fh.read().strip()
        with open(os.path.join(ckdir, name, "state.json")) as fh:
            step = json.load(fh)["step"]
        print("fake_trainer: resumed from %s (step %d)" % (name, step), flush=True)
    state = {"stop": False}

    def checkpoint():
        name = "step-%d" % step
        final = os.path.join(ckdir, name)
        if os.path.isdir(final):
            return
        tmp = os.path.join(ckdir, ".tmp-%s-%d" % (name, os.getpid()))
        os.makedirs(tmp, exist_ok=True)
        atomic_json(os.path.join(tmp, "state.json"), {"step": step})
        os.rename(tmp, final)
        with open(latest + ".tmp", "w") as fh:
            fh.write(name)
        os.replace(latest + ".tmp", latest)

    def heartbeat(phase):
        if args.no_heartbeat:
            return
        atomic_json(os.path.join(run_dir, "heartbeat.json"),
                    {"pid": os.getpid(), "phase": phase, "step": step, "epoch": 0, "updated_at": time.time()})

    def on_term(signum, frame):
        state["stop"] = True

    signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_term else on_term)
    if args.fork_holder and os.fork() == 0:
        time.sleep(3600)  # the child keeps the inherited stdout/stderr (the run's log) open
        os._exit(0)
    heartbeat("training")
    while not state["stop"]:
        time.sleep(args.interval)
        step += 1
        if args.ckpt_every and step % args.ckpt_every == 0:
            heartbeat("checkpointing")
            checkpoint()
        heartbeat("training")
    print("fake_trainer: SIGTERM at step %d, checkpointing" % step, flush=True)
    heartbeat("checkpointing")
    checkpoint()
    if args.slow_exit:
        time.sleep(args.slow_exit)
    heartbeat("finished")
    print("fake_trainer: exiting", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
