#!/usr/bin/env python3
"""Wall time of `restart_training.yml`: the idempotent no-op, and a restart's overhead — locally, and through
the production chain (ssh -tt to the "Proxmox host" → pct exec → a real LXC container) for comparison.

    .venv/bin/python benchmarks/restart.py [--repeat 5] [--via local|ssh-pct|both]

overhead = restart wall time − intrinsic, where intrinsic = the old process's exit after SIGTERM
(stopped[].waited_s) + the new process's time to its first heartbeat (timings.first_heartbeat), both measured
by the lifecycle in the same run. Goals (issue 2): no-op ≤ 2 s, overhead ≤ 2 s (local mode).
The trainer is the harness's stand-in (tests/harness/fake_trainer.py), identical in both places.
`--via ssh-pct` needs root and the harness (tests/harness/setup.sh): it starts a loopback sshd and clones CT 200
from the golden container, and removes both at the end.
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
sys.path.insert(0, os.path.join(ROOT, "tests"))
HOST_FAKE = os.path.join(ROOT, "tests", "harness", "fake_trainer.py")
CT_FAKE = "/opt/dflash/fake_trainer.py"  # harness.fixtures.FAKE_TRAINER_CT
RUN_CONFIG = {"dflash_run_defaults": {"trainer_args": {"interval": 0.2}}, "dflash_runs": {"bench": {}},
              "dflash_stop_timeout": 60}


def playbook(data_dir, inventory, extravars, envvars, limit=None):
    """Run restart_training.yml through ansible-runner (the AWX engine); return (wall s, module result).
    The run is `bench` unless extravars names another (benchmarks/soak.py restarts `tiny`)."""
    t0 = time.monotonic()
    r = ansible_runner.run(
        private_data_dir=data_dir, project_dir=os.path.join(ROOT, "playbooks"), playbook="restart_training.yml",
        inventory=inventory, extravars=dict({"run": "bench"}, **extravars), quiet=True, limit=limit,
        envvars=dict(envvars, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
                     ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".collections")))
    wall = time.monotonic() - t0
    res = [e["event_data"]["res"] for e in r.events if e.get("event") in ("runner_on_ok", "runner_on_failed")
           and e["event_data"].get("task", "").startswith("Training run")]
    if r.status != "successful" or not res:
        raise SystemExit("restart failed (%s): %s" % (r.status, res[-1].get("msg") if res else r.stdout.read()[-2000:]))
    return wall, res[-1]


def measure(repeat, run_once):
    """First launch, then `repeat` × (no-op re-run, forced restart). Returns lists of figures."""
    figs = {"noop": [], "restart": [], "intrinsic": [], "lifecycle": []}
    _, res = run_once({})
    pid = res["pid"]
    for _ in range(repeat):
        wall, res = run_once({})
        assert not res["changed"] and res["pid"] == pid, res
        figs["noop"].append(wall)
        wall, res = run_once({"force": True})
        assert res["changed"] and res["pid"] != pid, res
        pid = res["pid"]
        figs["restart"].append(wall)
        figs["intrinsic"].append(sum(s["waited_s"] for s in res["stopped"]) + res["timings"]["first_heartbeat"])
        figs["lifecycle"].append(sum(v for k, v in res["timings"].items() if k != "first_heartbeat"))
    return figs, pid


def local(repeat, tmp):
    runs = os.path.join(tmp, "runs")
    inv = os.path.join(tmp, "inventory.json")
    with open(inv, "w") as f:
        json.dump({"dflash_training": {"hosts": {"localhost": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
            "dflash_transport": "local", "dflash_runs_root": runs,
            "dflash_trainer_command": [sys.executable, HOST_FAKE]}}}}, f)
    data = os.path.join(tmp, "runner-local")
    os.mkdir(data)
    env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    figs, pid = measure(repeat, lambda extra: playbook(data, inv, dict(RUN_CONFIG, **extra), env))
    os.killpg(pid, 9)
    return figs


def ssh_pct(repeat, tmp):
    from harness import golden, lxc
    from harness.fixtures import _prepare_clone
    from harness.sshd import Sshd

    sshd = Sshd(__import__("pathlib").Path(tmp) / "sshd").start()
    ct = None
    try:
        ct = _prepare_clone(golden.build()["name"], 200)
        data = os.path.join(tmp, "runner-pct")
        os.mkdir(data)
        env = dict(sshd.env(), PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        cfg = dict(RUN_CONFIG, dflash_trainer_command=["/usr/bin/python3", CT_FAKE])
        figs, _ = measure(repeat, lambda extra: playbook(data, os.path.join(ROOT, "inventories", "harness"),
                                                         dict(cfg, **extra), env, limit="ct200"))
        return figs
    finally:
        if ct is not None:
            lxc.stop(ct.name, kill=True)
            lxc.destroy(ct.name)
        sshd.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--via", choices=["local", "ssh-pct", "both"], default="local")
    args = ap.parse_args()
    med = statistics.median
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.via in ("local", "both"):
            results["local"] = local(args.repeat, tmp)
        if args.via in ("ssh-pct", "both"):
            results["ssh+pct"] = ssh_pct(args.repeat, tmp)
    print("%d repetitions, medians in seconds, %d CPUs" % (args.repeat, os.cpu_count()))
    cols = list(results)
    print("%-40s" % "figure" + "".join("%10s" % c for c in cols) + ("%12s" % "ratio" if len(cols) == 2 else "")
          + "%8s" % "goal")
    rows = [("no-op re-run (playbook wall)", "noop", 2.0), ("restart (playbook wall)", "restart", None),
            ("  intrinsic: old exit + first heartbeat", "intrinsic", None),
            ("  overhead = restart - intrinsic", "overhead", 2.0),
            ("    of it: lifecycle incl. settle", "lifecycle_only", None),
            ("    of it: ansible-playbook + transport", "ansible", None)]
    for figs in results.values():
        figs["overhead"] = [r - i for r, i in zip(figs["restart"], figs["intrinsic"])]
        figs["lifecycle_only"] = [l - i for l, i in zip(figs["lifecycle"], figs["intrinsic"])]
        figs["ansible"] = [r - l for r, l in zip(figs["restart"], figs["lifecycle"])]
    for name, key, goal in rows:
        values = [med(results[c][key]) for c in cols]
        line = "%-40s" % name + "".join("%10.3f" % v for v in values)
        if len(values) == 2:
            line += "%11.2fx" % (values[1] / values[0]) if values[0] > 0 else "%12s" % "-"
        print(line + "%8s" % ("%.1f" % goal if goal else "-"))


if __name__ == "__main__":
    main()
