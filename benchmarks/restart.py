#!/usr/bin/env python3
"""Wall time of `restart_training.yml` in local mode: the idempotent no-op, and a restart's overhead.

    .venv/bin/python benchmarks/restart.py [--repeat 5] [--trainer fake|demo]

overhead = restart wall time − intrinsic, where intrinsic = the old process's exit after SIGTERM
(stopped[].waited_s) + the new process's time to its first heartbeat (timings.first_heartbeat), both
measured by the lifecycle in the same run. Goals (issue 2): no-op ≤ 2 s, overhead ≤ 2 s.
`--trainer demo` uses the real dflash-train on the tiny demo model (run scripts/demo once first).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import ansible_runner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAKE = os.path.join(ROOT, "tests", "integration", "programs", "fake_trainer.py")


def inventory(tmp, trainer):
    runs = os.path.join(tmp, "runs")
    command = [FAKE] if trainer == "fake" else [os.path.join(ROOT, ".venv", "bin", "dflash-train")]
    vars_ = {"dflash_transport": "local", "dflash_runs_root": runs, "dflash_trainer_command": command,
             "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
             "dflash_stop_timeout": 60}
    if trainer == "fake":
        vars_["dflash_run_defaults"] = {"trainer_args": {"lr": 1}}
        vars_["dflash_runs"] = {"bench": {}}
    path = os.path.join(tmp, "inventory.json")
    with open(path, "w") as f:
        json.dump({"dflash_training": {"hosts": {"localhost": vars_}}}, f)
    return path


def playbook(inv, extra, trainer, data_dir):
    """Run restart_training.yml through ansible-runner (the AWX engine); return (wall s, module result)."""
    inventories = [inv] if trainer == "fake" else [os.path.join(ROOT, "inventories", "local"), inv]
    t0 = time.monotonic()
    r = ansible_runner.run(
        private_data_dir=data_dir, project_dir=os.path.join(ROOT, "playbooks"), playbook="restart_training.yml",
        inventory=inventories, extravars=dict(extra, run="bench" if trainer == "fake" else "demo"), quiet=True,
        envvars={"ANSIBLE_CONFIG": os.path.join(ROOT, "ansible.cfg"),
                 "ANSIBLE_COLLECTIONS_PATH": os.path.join(ROOT, ".collections"),
                 "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")})
    wall = time.monotonic() - t0
    res = [e["event_data"]["res"] for e in r.events if e.get("event") in ("runner_on_ok", "runner_on_failed")
           and e["event_data"].get("task", "").startswith("Training run")]
    if r.status != "successful" or not res:
        raise SystemExit("restart failed (%s): %s" % (r.status, res[-1].get("msg") if res else r.stdout.read()[-2000:]))
    return wall, res[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--trainer", choices=["fake", "demo"], default="fake")
    args = ap.parse_args()
    noop, restart, intrinsic, lifecycle = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        inv = inventory(tmp, args.trainer)
        data = os.path.join(tmp, "runner")
        os.mkdir(data)
        pid = None
        try:
            wall, res = playbook(inv, {"dflash_runs_root": os.path.join(tmp, "runs")}, args.trainer, data)
            pid = res["pid"]
            for i in range(args.repeat):
                wall, res = playbook(inv, {"dflash_runs_root": os.path.join(tmp, "runs")}, args.trainer, data)
                assert not res["changed"] and res["pid"] == pid, res
                noop.append(wall)
                wall, res = playbook(inv, {"dflash_runs_root": os.path.join(tmp, "runs"), "force": True},
                                     args.trainer, data)
                assert res["changed"] and res["pid"] != pid, res
                pid = res["pid"]
                stop_s = sum(s["waited_s"] for s in res["stopped"])
                restart.append(wall)
                intrinsic.append(stop_s + res["timings"]["first_heartbeat"])
                lifecycle.append(sum(v for k, v in res["timings"].items() if k != "first_heartbeat"))
        finally:
            if pid:
                try:
                    os.killpg(pid, 9)
                except ProcessLookupError:
                    pass
    overhead = [r - i for r, i in zip(restart, intrinsic)]
    med = statistics.median
    rows = [("no-op re-run (playbook wall)", med(noop), 2.0),
            ("restart (playbook wall)", med(restart), None),
            ("  intrinsic: old exit + first heartbeat", med(intrinsic), None),
            ("  overhead = restart - intrinsic", med(overhead), 2.0),
            ("    of it: lifecycle (lock..verify, settle)", med(lifecycle) - med(intrinsic), None),
            ("    of it: ansible-playbook + transport", med(restart) - med(lifecycle), None)]
    print("trainer: %s, %d repetitions, medians, local mode on %d CPUs" % (args.trainer, args.repeat,
                                                                           os.cpu_count()))
    print("%-42s %9s %7s %9s" % ("figure", "seconds", "goal", "vs goal"))
    for name, value, goal in rows:
        print("%-42s %9.3f %7s %9s" % (name, value, "%.1f" % goal if goal else "-",
                                       "%.2fx" % (value / goal) if goal else "-"))


if __name__ == "__main__":
    main()
