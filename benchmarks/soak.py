#!/usr/bin/env python3
"""Soak: forced restarts of the real trainer through the product (restart_training.yml over ssh -tt → pct → a real
LXC container), one process and torchrun jobs (1 target + 2 drafter ranks), with a fault injected before most.

    .venv/bin/python benchmarks/soak.py [--minutes 30] [--restarts 1000] [--single-share 0.4] [--vmid 290] [--seed 0]

Runs `soak` (one process) for the first --single-share of the time, then `soak-job` (torchrun), both declared in
inventories/harness (checkpoints every 5 steps, 2 kept; debug pauses of 0.3 s inside each checkpoint write and each
prune give the timed kills a window). Stops at --restarts or when --minutes are spent. Before each restart, in turn:
nothing (a plain forced restart), kill -9 of the trainer / the torchrun agent, of the target rank, of a drafter rank,
and kills timed inside a checkpoint write (once checkpoints/.tmp-step-N appears) and inside a prune (once
.pruning-step-N appears) of the writing process. After each restart it checks:
  - one live job: the processes of the trainer in the container are exactly the new job's (agent + ranks);
  - the resume: the new job resumed from the newest complete checkpoint (after a kill: the newest step-N holding
    every file once the killed job's processes are gone; after a plain restart: the SIGTERM checkpoint, the old
    log's last `checkpoint <dir>` line);
  - nothing incomplete: no .tmp-*, .pruning-* or incomplete step-N stays under checkpoints/ once the new job ran
    its start (checkpoint.clean_leftovers): one seen in two listings 2 s apart (the new job's own write or prune in
    progress, 0.3 s with the debug pauses, is not one);
  - steps lost per kill: the heartbeat's step at the kill − the step resumed from (≤ one interval, 5, is the goal;
    the heartbeat lags by up to its 1 s interval).
Prints one line per restart and a table, with the container's disk use (run dirs and checkpoints) and memory (its
cgroup's memory.current, or memory.usage_in_bytes on cgroup v1) when each mode's first job runs and after its last
restart (a torchrun job holds four processes where one process runs one: compare like with like).
Needs root and the harness (tests/harness/setup.sh). Its own vmid (290) and its own lock, so the container tests
(vmids 200/201, the harness's lock) are not held up; it starts a loopback sshd, clones the golden container with the
checkout's trainer installed, and removes both at the end.
"""

import argparse
import fcntl
import json
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

MODES = {"single": "soak", "torchrun": "soak-job"}  # runs declared in inventories/harness
FAULTS = {"single": ["none", "kill-trainer", "kill-in-write", "kill-in-prune"],
          "torchrun": ["none", "kill-agent", "kill-target", "kill-drafter", "kill-in-write", "kill-in-prune"]}
PATTERN = "dflash_trainer.cli|dflash-train"  # the trainer, a torchrun agent and its ranks (pgrep -f)
FILES = ("model.safetensors", "drafter_config.json", "train_state.pt")  # a complete checkpoint (loop/checkpoint.py)


def paths(run):
    return f"/workspace/runs/{run}", f"/workspace/checkpoints/{run}/checkpoints"


def restart(data_dir, env, run, vmid):
    """restart_training.yml -e run=RUN force=true dflash_vmid=VMID; returns (wall s, training_run result)."""
    return playbook(data_dir, str(ROOT / "inventories" / "harness"), {"run": run, "force": True, "dflash_vmid": vmid},
                    env, limit="ct200")


def checkpoint_listing(ct, ckpt):
    """(newest complete step or None, leftovers: names no load reads that only a kill leaves)."""
    script = (f"cd {ckpt} 2>/dev/null || exit 0; for d in .tmp-* .pruning-* step-*; do [ -e \"$d\" ] || continue; "
              f"ok=1; for f in {' '.join(FILES)}; do [ -f \"$d/$f\" ] || ok=0; done; echo \"$d $ok\"; done")
    complete, left = [], []
    for line in ct.sh(script).stdout.split("\n"):
        if not line.strip():
            continue
        name, ok = line.split()
        m = re.fullmatch(r"step-(\d+)", name)
        if m and ok == "1":
            complete.append(int(m[1]))
        else:
            left.append(name)
    return (max(complete) if complete else None), left


def resumed_step(ct, run_dir, ckpt):
    m = re.search(rf"resumed from {re.escape(ckpt)}/step-(\d+) at step (\d+)", ct.read(f"{run_dir}/train.log") or "")
    return int(m[1]) if m and m[1] == m[2] else None


def last_saved(ct, kept_log, ckpt):
    found = re.findall(rf"checkpoint {re.escape(ckpt)}/step-(\d+) ", ct.read(kept_log) or "")
    return int(found[-1]) if found else None


def victim(mode, fault, res, rng):
    """The pid a fault kills: the trainer or agent, a rank, or the process that writes checkpoints."""
    ranks = {r["rank"]: r["pid"] for r in res.get("ranks") or []}
    if fault in ("kill-trainer", "kill-agent") or mode == "single":
        return res["pid"]
    if fault == "kill-target":
        return ranks[0]
    if fault == "kill-drafter":
        return ranks[rng.choice([1, 2])]
    return ranks[1]  # the first drafter rank writes and prunes the checkpoints


def inject(ct, mode, fault, res, rng, run_dir, ckpt):
    """Kill as `fault` says; returns the heartbeat's step at the kill (None for `none`, or a window never seen)."""
    pid = victim(mode, fault, res, rng)
    wait = {"kill-in-write": ".tmp-step-*", "kill-in-prune": ".pruning-step-*"}.get(fault)
    if wait is None:
        time.sleep(rng.uniform(0, 3))  # anywhere in the run, checkpoint writes included
        script = f"cat {run_dir}/heartbeat.json; echo; kill -KILL {pid}"
    else:  # in the container, polling every 20 ms: the window is the 0.3 s debug pause
        script = (f"for i in $(seq 3000); do ls -d {ckpt}/{wait} >/dev/null 2>&1 && break; sleep 0.02; done; "
                  f"ls -d {ckpt}/{wait} >/dev/null 2>&1 || {{ echo MISSED; exit 0; }}; "
                  f"cat {run_dir}/heartbeat.json; echo; kill -KILL {pid}")
    out = ct.sh(script, check=False, timeout=120).stdout
    if "MISSED" in out:
        return None
    try:
        return json.loads(out.strip().splitlines()[0]).get("step")
    except (ValueError, IndexError):
        return None


def live_job(ct):
    return sorted(ct.pids(PATTERN))


def wait_gone(ct, timeout=120):
    deadline = time.monotonic() + timeout
    while live_job(ct) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not live_job(ct)


def usage(ct, runs):
    """(bytes in the run dirs and checkpoints, files there, the container's memory.current or None)."""
    dirs = " ".join(f"{a} {b}" for a, b in (paths(r) for r in runs))
    out = ct.sh(f"du -sbc {dirs} 2>/dev/null | tail -1; find {dirs} -type f 2>/dev/null | wc -l").stdout.split()
    disk, files = int(out[0]), int(out[-1])
    mem = None
    for key in ("memory.current", "memory.usage_in_bytes"):  # cgroup v2, v1
        p = subprocess.run(["lxc-cgroup", "-n", ct.name, key], capture_output=True, text=True, check=False)
        if p.returncode == 0 and p.stdout.strip().isdigit():
            mem = int(p.stdout)
            break
    return disk, files, mem


def first_job(ct, data, env, run, vmid):
    """Launch `run` and wait for its first checkpoint, so that every later start resumes."""
    _, res = restart(data, env, run, vmid)
    deadline = time.monotonic() + 300
    while checkpoint_listing(ct, paths(run)[1])[0] is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"no checkpoint of {run} within 300 s")
        time.sleep(0.5)
    return res


def one_restart(ct, data, env, mode, fault, res, rng, vmid):
    run = MODES[mode]
    run_dir, ckpt = paths(run)
    at_kill = expected = None
    if fault != "none":
        at_kill = inject(ct, mode, fault, res, rng, run_dir, ckpt)
        old = {res["pid"], *(r["pid"] for r in res.get("ranks") or [])}
        deadline = time.monotonic() + 120  # the job ends by itself (torchrun ends it when a rank died)
        while set(live_job(ct)) & old and time.monotonic() < deadline:
            time.sleep(0.2)
        expected = checkpoint_listing(ct, ckpt)[0]
    wall, res = restart(data, env, run, vmid)
    live = live_job(ct)
    job = sorted({res["pid"], *(r["pid"] for r in res.get("ranks") or [])})
    if fault == "none":
        kept = [k for k in res.get("kept") or [] if k.endswith(".log")]
        expected = last_saved(ct, kept[0], ckpt) if kept else None
    got = resumed_step(ct, run_dir, ckpt)
    # what stays: the new job's own write or prune in progress (a 0.3 s window) is gone 2 s later
    _, first = checkpoint_listing(ct, ckpt)
    time.sleep(2)
    left = sorted(set(first) & set(checkpoint_listing(ct, ckpt)[1]))
    lost = (at_kill - got) if at_kill is not None and got is not None else None
    stop = sum(s.get("waited_s") or 0 for s in res.get("stopped") or [])
    row = {"mode": mode, "fault": fault, "wall": wall, "stop_s": stop,
           "start_s": (res.get("timings") or {}).get("first_heartbeat"), "one": live == job, "resumed": got is not None and got == expected,
           "lost": lost, "left": left, "missed": fault != "none" and at_kill is None}
    return row, res, live, got, expected


def soak(args, tmp):
    from harness import LOCK_DIR, golden, lxc
    from harness.fixtures import _prepare_clone, install_trainer, make_tiny
    from harness.sshd import Sshd

    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    lock = open(LOCK_DIR / f"soak-{args.vmid}.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)  # one soak per vmid; the container tests' vmids (200/201) are not taken
    sshd = Sshd(tmp / "sshd").start()
    ct = None
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp / "wheel"), str(ROOT / "trainer")], check=True)
        ct = _prepare_clone(golden.build()["name"], args.vmid)
        install_trainer(ct, next((tmp / "wheel").glob("*.whl")))
        make_tiny(ct)
        env = dict(sshd.env(), PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        data = tmp / "runner"
        data.mkdir()
        rng = random.Random(args.seed)
        t0 = time.monotonic()
        budget = args.minutes * 60
        rows, mode, res, n = [], None, None, {"single": 0, "torchrun": 0}
        marks = []  # (what, usage): each mode's first job running, and its last, so that like meets like
        while len(rows) < args.restarts and time.monotonic() - t0 < budget:
            want = "single" if time.monotonic() - t0 < budget * args.single_share else "torchrun"
            if want != mode:
                if mode is not None:  # the other run stops: one job in the container at a time
                    marks.append((f"{mode}, end", usage(ct, MODES.values())))
                    playbook_stop(data, env, MODES[mode], args.vmid)
                mode = want
                res = first_job(ct, data, env, MODES[mode], args.vmid)
                marks.append((f"{mode}, start", usage(ct, MODES.values())))
            fault = FAULTS[mode][n[mode] % len(FAULTS[mode])]
            n[mode] += 1
            row, res, live, got, expected = one_restart(ct, data, env, mode, fault, res, rng, args.vmid)
            rows.append(row)
            print(f"restart {len(rows)} ({mode}, {fault}): {row['wall']:.1f} s (stop {row['stop_s']:.1f} s, first "
                  f"heartbeat {row['start_s']} s), live job {live}, resumed {got} "
                  f"(newest complete {expected})" + (f", {row['lost']} steps lost" if row["lost"] is not None else "")
                  + (f", LEFT {row['left']}" if row["left"] else "") + (", window missed" if row["missed"] else ""),
                  flush=True)
        marks.append((f"{mode}, end", usage(ct, MODES.values())))
        return rows, marks
    finally:
        if ct is not None:
            lxc.stop(ct.name, kill=True)
            lxc.destroy(ct.name)
        sshd.stop()
        fcntl.flock(lock, fcntl.LOCK_UN)


def playbook_stop(data, env, run, vmid):
    import ansible_runner
    r = ansible_runner.run(private_data_dir=str(data), project_dir=str(ROOT / "playbooks"), playbook="stop_training.yml",
                           inventory=str(ROOT / "inventories" / "harness"), quiet=True, limit="ct200",
                           extravars={"run": run, "dflash_vmid": vmid},
                           envvars=dict(env, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
                                        ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".collections")))
    if r.status != "successful":
        raise SystemExit(f"stop of {run} failed ({r.status})")


def p90(values):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(0.9 * (len(values) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--restarts", type=int, default=1000)
    ap.add_argument("--minutes", type=float, default=30.0, help="stop after this long, whatever --restarts says")
    ap.add_argument("--single-share", type=float, default=0.4, help="share of the time given to one-process runs")
    ap.add_argument("--vmid", type=int, default=290)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        rows, marks = soak(args, Path(tmp))
    kills = [r for r in rows if r["fault"] != "none"]
    lost = [r["lost"] for r in kills if r["lost"] is not None]
    print("%-38s %d (%d one process, %d torchrun)" % ("restarts", len(rows), sum(r["mode"] == "single" for r in rows),
                                                       sum(r["mode"] == "torchrun" for r in rows)))
    print("%-38s %d/%d" % ("exactly one live job after", sum(r["one"] for r in rows), len(rows)))
    print("%-38s %d/%d" % ("resumed from the newest complete", sum(r["resumed"] for r in rows), len(rows)))
    print("%-38s %d/%d" % ("nothing incomplete left after", sum(not r["left"] for r in rows), len(rows)))
    for fault in sorted({r["fault"] for r in kills}):
        mine = [r for r in kills if r["fault"] == fault]
        got = [r["lost"] for r in mine if r["lost"] is not None]
        print("%-38s %d (windows missed %d; steps lost median %s, max %s)" % (
            fault, len(mine), sum(r["missed"] for r in mine), statistics.median(got) if got else "-",
            max(got) if got else "-"))
    print("%-38s %d (steps lost: median %s, max %s)" % ("kills in all", len(kills),
          statistics.median(lost) if lost else "-", max(lost) if lost else "-"))
    for mode in ("single", "torchrun"):
        mine = [r for r in rows if r["mode"] == mode]
        if mine:
            print("%-38s median %.1f s, p90 %.1f s (the stop: median %.1f s; to the first heartbeat: median %s s)" % (
                f"restart wall time, {mode}", statistics.median(r["wall"] for r in mine),
                p90([r["wall"] for r in mine]), statistics.median(r["stop_s"] for r in mine),
                statistics.median(r["start_s"] for r in mine if r["start_s"] is not None)
                if any(r["start_s"] is not None for r in mine) else "-"))
    for name, (disk, files, mem) in marks:
        print("%-38s disk %d bytes in %d files, memory %s" % (
            f"container, {name}", disk, files, "%d bytes" % mem if mem is not None else "unknown"))
    print("%-38s %.0f s" % ("total", time.monotonic() - t0))


if __name__ == "__main__":
    main()
