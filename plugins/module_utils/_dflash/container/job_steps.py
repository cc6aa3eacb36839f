# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0
"""One node's part of restarting a torchrun job that spans nodes, one step per call (the training role calls each
step on every node before the next step anywhere: reserve; stop, then this node's GPU release; launch; verify, then
release - alone when the job was kept, or after a failure).

A restart of such a job cannot run under one flock: it spans several module calls and several containers. So
`reserve` writes a reservation (<runs root>/.dflash-job.json: the restart's token, the run, when) under this node's
lifecycle lock; every later step, and any other lifecycle operation on this node, finds it and refuses another
token until `release` removes it, or it is older than lock_timeout (a play that died mid-restart). Another restart's
`reserve` waits for it instead (up to lock_timeout, then refuses naming the holder): two restarts of one job run one
after the other. The role takes
the reservations node after node in the nodes' order, so two restarts cannot each hold half the nodes.

Stdlib only: part of the package shipped into the container (controller/lifecycle_shipping.py).
"""

import os
import time

from .job_nodes import node_label
from .job_ranks import is_healthy, rank_states
from .procfs import POLL_S, cmdline, cmdline_matches, is_alive
from .run_records import LOG_NAME, read_json, read_pid, unlink, write_json_atomic
from .run_status import conflicting_runs, log_tail, own_heartbeat

RESERVATION = ".dflash-job.json"


def reservation_path(req):
    return os.path.join(req["runs_root"], RESERVATION)


def live_reservation(req):
    """The reservation of this node by another restart, still in force, else None."""
    held = read_json(reservation_path(req))
    if not held or held.get("token") == req.get("job_token"):
        return None
    if time.time() - float(held.get("at", 0)) > req["lock_timeout"]:
        return None  # its play died mid-restart: the lock timeout is how long anyone waits for it
    return held


def refuse_if_reserved(req, error, waited_s=None):
    held = live_reservation(req)
    if held:
        waited = "; waited %ds for it" % waited_s if waited_s is not None else ""
        raise error("this node is reserved by the restart of job %s (token %s, %ds ago) across its nodes%s; wait "
                    "for that restart to end (or %ss after it began, if its play died)"
                    % (held.get("run"), held.get("token"), time.time() - float(held.get("at", 0)), waited,
                       req["lock_timeout"]))


def wait_while_reserved(req, error, poll_s=POLL_S):
    """A second restart's reserve waits for the restart holding this node to give it back - outside the lifecycle
    lock, which the holder's own steps take - for at most lock_timeout (the holder's reservation expires by then,
    unless it was taken later than it says); then refuses, naming the holder. Returns the holder waited for
    ({run, token, waited_s}) or None."""
    t0, holder = time.monotonic(), None
    while True:
        held = live_reservation(req)
        if not held:
            return holder and dict(holder, waited_s=round(time.monotonic() - t0, 1))
        holder = {"run": held.get("run"), "token": held.get("token")}
        if time.monotonic() - t0 >= req["lock_timeout"]:
            refuse_if_reserved(req, error, time.monotonic() - t0)
        time.sleep(poll_s)


def node_state(req):
    """This node's part of the job as it runs now: (alive, same configuration, agent pid, heartbeat, runs to stop)."""
    runs, agent_pid, own_launch = conflicting_runs(req)
    alive = is_healthy(agent_pid, rank_states(req["run_dir"], own_launch))
    hb = own_heartbeat(req["run_dir"]) if alive else None
    same = alive and (own_launch or {}).get("fingerprint") == req.get("fingerprint")
    return alive, same, (agent_pid if alive else None), hb, runs


def reserve(req, settings_of):
    """Take this node for the restart; report whether its part of the job runs with this configuration, and (when
    it does not) check the new configuration with the trainer (settings_of) before anything is stopped."""
    alive, same, pid, hb, runs = node_state(req)
    doc = {"token": req["job_token"], "run": req["run"], "at": time.time(), "settings": None, "job": None}
    if not (same and not req.get("force")):
        doc["settings"] = settings_of(req)  # fills in req["job"]'s layout and ranks' directory
        doc["job"] = req.get("job")
    write_json_atomic(reservation_path(req), doc)
    return {"alive": alive, "same_config": same, "pid": pid, "heartbeat": hb,
            "would_stop": [name for name, _pid in runs],
            "fingerprint": req.get("fingerprint"), "node": node_label(req)}


def reserved(req, error):
    """The reservation this restart took (reserve), or error naming the node."""
    held = read_json(reservation_path(req))
    if not held or held.get("token") != req.get("job_token"):
        raise error("%s: the restart's reservation (token %s) is gone - another restart took the node after its "
                    "lock timeout; run the restart again" % (node_label(req), req.get("job_token")))
    return held


def release(req):
    held = read_json(reservation_path(req))
    if held and held.get("token") == req.get("job_token"):
        unlink(reservation_path(req))
        return True
    return False


def verify_node(req, error, stop_leftovers):
    """This node's part of the launched job is live: its agent runs the launched command and all of its ranks
    registered and live; on the node holding rank 0 also the heartbeat written for its agent (and the phase asked
    for). Anything dead here fails naming the node, after what is left of this node's part was stopped."""
    run_dir, job = req["run_dir"], req["job"]
    launch_info = read_json(os.path.join(run_dir, "launch.json"))
    pid = read_pid(run_dir)
    label = node_label(req)
    log_path = os.path.join(run_dir, LOG_NAME)
    holds_rank0 = job.get("first_rank") == 0
    want = req.get("wait_for_phase")
    start = time.monotonic()
    limit = req["heartbeat_timeout"] + (req["phase_timeout"] if want else 0) + req["settle_time"]

    def fail(what):
        info = stop_leftovers(req, pid)
        return error("%s: %s; this node's part was stopped (%s); see log_tail" % (label, what, info.get("signal")),
                     pid=pid, node=label, log_tail=log_tail(log_path, req["log_tail_lines"]),
                     ranks=rank_states(run_dir, launch_info))

    while True:
        ranks = rank_states(run_dir, launch_info)
        if pid is None or not is_alive(pid) or not cmdline_matches(cmdline(pid), req["argv"]):
            raise fail("the torchrun agent (pid %s) is gone" % pid)
        dead = [r for r in ranks if not r["alive"]]
        if dead:
            raise fail("rank %d (pid %d) died" % (dead[0]["rank"], dead[0]["pid"]))
        hb = own_heartbeat(run_dir)
        if hb and hb.get("phase") == "failed":
            raise fail("the job reported phase failed: %s" % hb.get("error", "no error text"))
        up = len(ranks) >= job["nproc_per_node"]
        hb_ok = not holds_rank0 or (hb is not None and (not want or hb.get("phase") in (want, "finished")))
        if up and hb_ok and time.monotonic() - start >= req["settle_time"]:
            return {"pid": pid, "ranks": ranks, "heartbeat": hb, "node": label,
                    "phase": (hb or {}).get("phase"), "world": job}
        if time.monotonic() - start > limit:
            raise fail("%d of %d ranks registered%s within %ss" % (
                len(ranks), job["nproc_per_node"], "" if hb_ok else ", no heartbeat%s" % (
                    " in phase %s" % want if want and hb else ""), round(limit, 1)))
        time.sleep(POLL_S)
