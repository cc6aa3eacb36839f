#!/usr/bin/env python3
"""A stand-in trainer that holds GPU memory, for benchmarks/gpu_release_device.py (stdlib + torch).

Follows the run contract (docs/design.md): heartbeat.json {pid, phase, step, epoch, updated_at} in $DFLASH_RUN_DIR
(or --run-dir) every --interval s. Phase "loading" while torch starts and --gib GiB are allocated on cuda:0,
then "training". On SIGTERM: "checkpointing" for --slow-exit s, STILL holding the memory (a checkpoint being
written), then "finished" and exit. --ignore-term makes it deaf to SIGTERM (only SIGKILL ends it).
--gib 0 imports no torch (the CPU dry run); --hold PATH keeps a file open (a fake /dev/nvidiaN).
"""
import argparse
import json
import os
import signal
import sys
import time


def heartbeat(run_dir, phase, step):
    path = os.path.join(run_dir, "heartbeat.json")
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as fh:
        json.dump({"pid": os.getpid(), "phase": phase, "step": step, "epoch": 0, "updated_at": time.time()}, fh)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run-dir", default=os.environ.get("DFLASH_RUN_DIR"))
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--slow-exit", type=float, default=0.0)
    ap.add_argument("--ignore-term", action="store_true")
    ap.add_argument("--hold", default=None)
    ap.add_argument("--tag", default="", help="free text, only to change the fingerprint")
    args = ap.parse_args()
    if not args.run_dir:
        print("gpu_holder: no run dir (DFLASH_RUN_DIR or --run-dir)", file=sys.stderr)
        return 2
    stop = []
    # Set before the slow start-up: a SIGTERM during loading must also take the checkpoint path.
    signal.signal(signal.SIGTERM, signal.SIG_IGN if args.ignore_term else lambda *_: stop.append(1))
    heartbeat(args.run_dir, "loading", 0)
    held = [open(args.hold, "a")] if args.hold else []
    if args.gib > 0:
        import torch
        # ones, not empty: every page is touched, so NVML counts it for certain.
        held.append(torch.ones(int(args.gib * 2**30), dtype=torch.uint8, device="cuda:0"))
        torch.cuda.synchronize()
    print("gpu_holder pid=%d holding %.1f GiB, argv=%s" % (os.getpid(), args.gib, sys.argv[1:]), flush=True)
    step = 0
    while not stop:
        heartbeat(args.run_dir, "training", step)
        time.sleep(args.interval)
        step += 1
    print("gpu_holder: SIGTERM at step %d, 'checkpointing' for %ss" % (step, args.slow_exit), flush=True)
    heartbeat(args.run_dir, "checkpointing", step)
    time.sleep(args.slow_exit)
    heartbeat(args.run_dir, "finished", step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
