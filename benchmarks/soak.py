#!/usr/bin/env python3
"""Soak: N forced restarts of the real trainer through the product (restart_training.yml over ssh -tt → pct →
a real LXC container), with a kill -9 of the trainer before some of them.

    .venv/bin/python benchmarks/soak.py [--restarts 200] [--kill-chance 0.25] [--seed 0]

After each restart it counts the live trainer processes in the container (exactly one is the goal) and checks
that the new trainer resumed from the last complete checkpoint: after a SIGTERM restart the step the old
trainer checkpointed at ("SIGTERM: stopped at step S"), after a kill -9 the step `latest` named when it died
(steps lost = the heartbeat's step at the kill − that step; a lower bound, as the heartbeat is written every
heartbeat interval). Prints a table and the container's disk use (run
directory and checkpoints) and memory (its cgroup's memory.current, or memory.usage_in_bytes on cgroup v1) at the start and the end.
Needs root and the harness (tests/harness/setup.sh): it takes the harness's vmid lock, starts a loopback sshd,
clones CT 200 from the golden container with the checkout's trainer installed, and removes both at the end.
"""

import argparse
import fcntl
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from restart import playbook  # noqa: E402  (one runner call for both benchmarks)

RUN = "tiny"  # declared in inventories/harness/group_vars/dflash_training.yml (the real trainer, CPU)
RUN_DIR = f"/workspace/runs/{RUN}"
CKPT = f"/workspace/checkpoints/{RUN}/checkpoints"
TRAINER = "dflash-train"


def restart(data_dir, env, force):
    """restart_training.yml -e run=tiny [force] through ansible-runner; returns (wall s, training_run result)."""
    return playbook(data_dir, str(ROOT / "inventories" / "harness"), {"run": RUN, "force": force}, env,
                    limit="ct200")


def latest_step(ct):
    name = (ct.read(f"{CKPT}/latest") or "").strip()
    return int(name.rsplit("-", 1)[1]) if name.startswith("step-") else None


def resumed_step(ct):
    m = re.search(rf"resumed from {re.escape(CKPT)}/step-(\d+) at step (\d+)", ct.read(f"{RUN_DIR}/train.log") or "")
    return int(m[1]) if m and m[1] == m[2] else None


def sigterm_step(ct):
    """The step the previous trainer checkpointed at on SIGTERM: its log is the newest train.<stamp>.log."""
    logs = sorted(f for f in ct.sh(f"ls {RUN_DIR}").stdout.split() if re.fullmatch(r"train\.[\d.-]+\.log", f))
    m = re.search(r"SIGTERM: stopped at step (\d+) after checkpointing", ct.read(f"{RUN_DIR}/{logs[-1]}") or "")
    return int(m[1]) if m else None


def usage(ct):
    """(bytes in the run dir and checkpoints, files there, the container's memory.current or None)."""
    out = ct.sh(f"du -sb {RUN_DIR} {CKPT}; find {RUN_DIR} {CKPT} -type f | wc -l").stdout.split()
    disk, files = int(out[0]) + int(out[2]), int(out[-1])
    mem = None
    for key in ("memory.current", "memory.usage_in_bytes"):  # cgroup v2, v1
        p = subprocess.run(["lxc-cgroup", "-n", ct.name, key], capture_output=True, text=True, check=False)
        if p.returncode == 0 and p.stdout.strip().isdigit():
            mem = int(p.stdout)
            break
    return disk, files, mem


def soak(args, tmp):
    from harness import LOCK_DIR, golden, lxc
    from harness.fixtures import _prepare_clone, install_trainer, make_tiny
    from harness.sshd import Sshd

    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    lock = open(LOCK_DIR / "vmids.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # one harness session at a time owns vmid 200
    sshd = Sshd(tmp / "sshd").start()
    ct = None
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp / "wheel"), str(ROOT / "trainer")], check=True)
        ct = _prepare_clone(golden.build()["name"], 200)
        install_trainer(ct, next((tmp / "wheel").glob("*.whl")))
        make_tiny(ct)
        env = dict(sshd.env(), PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        data = tmp / "runner"
        data.mkdir()
        rng = random.Random(args.seed)
        _, res = restart(data, env, False)
        deadline = time.monotonic() + 300
        while latest_step(ct) is None:  # a first checkpoint, so that every later start resumes
            if time.monotonic() > deadline:
                raise SystemExit("no checkpoint within 300 s")
            time.sleep(0.5)
        start_usage = usage(ct)
        rows = []
        for i in range(args.restarts):
            killed = rng.random() < args.kill_chance
            expected = lost = None
            if killed:
                time.sleep(rng.uniform(0, 3))  # anywhere in the run, checkpoint writes included
                ct.sh(f"kill -KILL {res['pid']}", check=False)
                while ct.pids(TRAINER):
                    time.sleep(0.1)
                expected = latest_step(ct)
                lost = (ct.read_json(f"{RUN_DIR}/heartbeat.json") or {}).get("step", 0) - (expected or 0)
            wall, res = restart(data, env, True)
            live = ct.pids(TRAINER)
            if not killed:
                expected = sigterm_step(ct)
            got = resumed_step(ct)
            rows.append({"wall": wall, "one": live == [res["pid"]], "resumed": got is not None and got == expected,
                         "killed": killed, "lost": lost})
            print(f"restart {i + 1}: {'kill -9 + ' if killed else ''}forced, {wall:.1f} s, live {live}, resumed "
                  f"{got} (expected {expected})" + (f", {lost} steps lost" if killed else ""), flush=True)
        end_usage = usage(ct)
        return rows, start_usage, end_usage
    finally:
        if ct is not None:
            lxc.stop(ct.name, kill=True)
            lxc.destroy(ct.name)
        sshd.stop()
        fcntl.flock(lock, fcntl.LOCK_UN)


def p90(values):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--restarts", type=int, default=200)
    ap.add_argument("--kill-chance", type=float, default=0.25, help="chance of a kill -9 before a restart")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        rows, start, end = soak(args, Path(tmp))
    kills = [r for r in rows if r["killed"]]
    walls = [r["wall"] for r in rows]
    lost = [r["lost"] for r in kills]
    print("%-34s %s" % ("restarts", len(rows)))
    print("%-34s %d/%d" % ("exactly one live trainer", sum(r["one"] for r in rows), len(rows)))
    print("%-34s %d/%d" % ("resumes verified", sum(r["resumed"] for r in rows), len(rows)))
    print("%-34s %d (steps lost: median %s, max %s)" % ("kill -9 before a restart", len(kills),
          statistics.median(lost) if lost else "-", max(lost) if lost else "-"))
    print("%-34s median %.1f s, p90 %.1f s" % ("restart wall time", statistics.median(walls), p90(walls)))
    for name, (disk, files, mem) in (("start", start), ("end", end)):
        print("%-34s disk %d bytes in %d files, memory %s" % (
            f"container at the {name}", disk, files, "%d bytes" % mem if mem is not None else "unknown"))
    print("%-34s %.0f s" % ("total", time.monotonic() - t0))


if __name__ == "__main__":
    main()
