# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""The ranks of a torchrun job: who they are, whether they live, and stopping the whole job.

torchrun (the elastic agent, the process the lifecycle launches) starts every rank in a session of its own, so a
signal to the agent's process group never reaches them, and on SIGTERM it SIGKILLs its ranks --shutdown-timeout
seconds later. Each rank writes its pid to <ranks dir>/<rank>.pid (trainer: dist_world.py). Here a pid from such a
file counts as rank r of the run only while /proc says so: the process is alive, leads its own process group
(torchrun's new session), and its environment holds the run's DFLASH_RUN_DIR and RANK=r; a reused pid is never
signalled. The stop never waits on torchrun's timeout: every rank gets SIGTERM itself first (the drafter ranks
checkpoint), the agent only once its ranks are gone; whatever is left at the deadline gets SIGKILL.

Stdlib only: part of the package shipped into the container (see controller/lifecycle_shipping.py).
"""

import os
import signal
import time

from .procfs import POLL_S, environ, group_members, is_alive, proc_pgrp

RANKS_DIR = "ranks"
AGENT_GRACE_S = 3.0  # after its last rank exited, the agent ends by itself (it polls every 0.1 s)
KILL_WAIT_S = 30


def ranks_dir(launch_info, run_dir):
    """Where the launch's ranks write their pid files (launch.json's job.ranks_dir), None for one process."""
    job = (launch_info or {}).get("job")
    return (job.get("ranks_dir") or os.path.join(run_dir, RANKS_DIR)) if job else None


def clear_rank_files(directory):
    """Remove the pid and end files of an earlier job (called after it was stopped): a file left by a killed rank
    must not make the next job look as if one of its ranks died."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.endswith((".pid", ".end.json")) or ".pid.tmp" in name:  # .end.json: rank_ends.py
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def rank_files(directory, suffix):
    """[(rank, path)] of the files `<rank><suffix>` in directory (none when it cannot be listed)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    stems = ((name[: -len(suffix)], name) for name in names if name.endswith(suffix))
    return [(int(stem), os.path.join(directory, name)) for stem, name in stems if stem.isdigit()]


def _registered(directory):
    """{rank: pid} of the pid files present (unreadable or malformed ones are skipped)."""
    found = {}
    for rank, path in rank_files(directory, ".pid"):
        try:
            with open(path) as f:
                found[rank] = int(f.read().strip())
        except (OSError, ValueError):
            continue
    return found


def is_rank(pid, rank, run_dir):
    """Is pid, now, rank `rank` of the job launched for run_dir? (never a reused pid, nor a rank's own child)"""
    if not is_alive(pid) or proc_pgrp(pid) != pid:
        return False
    env = environ(pid) or {}
    return env.get("DFLASH_RUN_DIR") == run_dir and env.get("RANK") == str(rank)


def rank_states(run_dir, launch_info):
    """[{rank, pid, alive}] of the ranks that registered, by rank; [] for a one-process run or none yet."""
    directory = ranks_dir(launch_info, run_dir)
    if directory is None:
        return []
    job = launch_info["job"]
    env_dir = job.get("run_dir") or run_dir  # the DFLASH_RUN_DIR the lifecycle gave the agent, and so every rank
    layout = dict((e.get("rank"), e) for e in job.get("layout") or [])
    out = []
    for rank, pid in sorted(_registered(directory).items()):
        row = {"rank": rank, "pid": pid, "alive": is_rank(pid, rank, env_dir)}
        for key in ("role", "gpu", "gpus", "node"):  # gpus: a target rank over several GPUs; node: a job over nodes
            if key in layout.get(rank, {}):
                row[key] = layout[rank][key]
        out.append(row)
    return out


def live_rank_pids(run_dir, launch_info):
    return [row["pid"] for row in rank_states(run_dir, launch_info) if row["alive"]]


def is_healthy(pid, ranks):
    """Alive as a run: the launched process, and every rank of a torchrun job that registered (a rank that died
    makes the job not alive; torchrun is ending it)."""
    return pid is not None and all(r["alive"] for r in ranks)


def job_state(pid, ranks):
    """The phrase for a torchrun job that is not whole (an agent without some rank, ranks without their agent),
    else None."""
    dead = ["%d (pid %d)" % (r["rank"], r["pid"]) for r in ranks if not r["alive"]]
    left = ["%d (pid %d)" % (r["rank"], r["pid"]) for r in ranks if r["alive"]]
    if pid is not None and dead:
        return ("failing (rank %s gone while the torchrun agent, pid %d, lives: torchrun is ending the job; "
                "restart the run if it stays)" % (", ".join(dead), pid))
    if pid is None and left:
        return "not running (the torchrun agent is gone but rank %s is left: stop the run to end it)" % ", ".join(left)
    return None


def slowest_rank(heartbeat, now):
    """The rank furthest behind, from the heartbeat's `ranks` (rank 0 writes every rank's last step): the lowest
    step among the ranks still working (ties: the oldest update), with how many steps it trails the furthest rank
    and how long ago it last moved; None for one process or when every rank is done."""
    ranks = (heartbeat or {}).get("ranks") or {}
    working = [(r, row) for r, row in ranks.items() if isinstance(row, dict) and not row.get("done")]
    if not working:
        return None
    rank, row = min(working, key=lambda kv: (kv[1].get("step", 0), kv[1].get("updated_at", 0)))
    top = max(r.get("step", 0) for r in ranks.values() if isinstance(r, dict))
    return {"rank": int(rank), "role": row.get("role"), "step": row.get("step"),
            "steps_behind": top - row.get("step", 0),
            "updated_s_ago": round(now - float(row.get("updated_at", now)), 1)}


def _kill(pid, sig, group=False):
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _left(agent_pid, run_dir, launch_info):
    ranks = live_rank_pids(run_dir, launch_info)
    agent = bool(agent_pid) and bool(group_members(agent_pid))
    return ranks, agent


def stop_job(agent_pid, run_dir, launch_info, grace_s):
    """Stop a torchrun job: SIGTERM every rank, the agent once they are gone (or at once when none registered),
    SIGKILL to the agent's group and every rank's group at grace_s; return once all are gone.

    agent_pid may be None (the agent died, ranks may be left). Returns {"pgid", "signal", "waited_s", "ranks"}.
    """
    start = time.monotonic()
    termed, seen, gone_since, agent_termed = set(), set(), None, False
    used = "SIGTERM"
    while True:
        ranks, agent = _left(agent_pid, run_dir, launch_info)
        for pid in ranks:
            if pid not in termed:
                _kill(pid, signal.SIGTERM)  # the rank itself: it checkpoints (drafters) and exits
                termed.add(pid)
        seen.update(ranks)
        if not ranks and not agent:
            break
        now = time.monotonic()
        gone_since = None if ranks else (gone_since or now)
        if agent and not agent_termed and (not seen or (gone_since and now - gone_since >= AGENT_GRACE_S)):
            _kill(agent_pid, signal.SIGTERM, group=True)
            agent_termed = True
        if now - start >= grace_s:
            used = "SIGKILL"
            _kill_all(agent_pid, ranks)
            break
        time.sleep(POLL_S)
    deadline = time.monotonic() + KILL_WAIT_S
    while True:
        ranks, agent = _left(agent_pid, run_dir, launch_info)
        seen.update(ranks)
        helpers = [pid for pid in seen if pid not in ranks and group_members(pid)]  # a gone rank's own children
        if not ranks and not agent and not helpers:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("torchrun job of %s (agent pid %s, ranks %s) survived SIGKILL for %d s (stuck in the "
                               "kernel?)" % (run_dir, agent_pid, sorted(seen), KILL_WAIT_S))
        if used == "SIGKILL":
            _kill_all(agent_pid, ranks)
        for pid in helpers:
            _kill(pid, signal.SIGKILL, group=True)
        time.sleep(POLL_S)
    return {"pgid": agent_pid, "signal": used, "waited_s": round(time.monotonic() - start, 3),
            "ranks": sorted(seen)}


def _kill_all(agent_pid, rank_pids):
    if agent_pid and group_members(agent_pid):
        _kill(agent_pid, signal.SIGKILL, group=True)
    for pid in rank_pids:
        _kill(pid, signal.SIGKILL, group=True)  # each rank leads its group: its own children go with it
