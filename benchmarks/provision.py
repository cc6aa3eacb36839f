#!/usr/bin/env python3
"""Wall time of `playbooks/provision.yml` against the Proxmox API stand-in (tests/harness/pve_api, real LXC behind it),
over the production chain (ssh -tt to the "Proxmox host" 127.0.0.1, API calls from the controller):
the first converge (create + raw lines + start), then the no-op re-converge as a ratio to two references on the same
host, measured alternately in the same run (median of --repeat):
- the empty play (issue 16's reference; goal ≤ 1.5×). It has no task, so it opens no connection at all: it times
  ansible-playbook's start-up only;
- the floor play: one no-op module call in each place the provisioned state lives (the controller that calls the
  API, the Proxmox host, the container through `pct exec`). A converge that checks the real state, not a cached
  stamp, cannot cost less than these three round trips.

    .venv/bin/python benchmarks/provision.py [--repeat 5]

Needs root and the harness (tests/harness/setup.sh). Starts its own sshd and API stand-in and removes both (and the
container) at the end. The inventory is the Molecule provision scenario's host_vars, so both measure one thing.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
BIN = os.path.dirname(sys.executable)
HOST_VARS = os.path.join(ROOT, "molecule", "provision", "host_vars", "pve-ct310.yml")
EMPTY_PLAY = """---
- name: Empty play on the same host
  hosts: dflash_training
  gather_facts: false
  tasks: []
"""
FLOOR_PLAY = """---
- name: One no-op module call where each part of the state lives
  hosts: dflash_training
  gather_facts: false
  tasks:
    - name: The controller (API calls are made from there)
      ansible.builtin.ping:
      delegate_to: "{{ proxmox_lxc_api_delegate }}"
    - name: The Proxmox host
      ansible.builtin.ping:
    - name: The container
      dflash.ops.pct_exec:
        vmid: "{{ dflash_vmid }}"
        argv: ["true"]
"""


def harness(*args):
    subprocess.run([sys.executable, "-m"] + list(args), cwd=TESTS, check=True, stdout=subprocess.DEVNULL)


def play(path, inventory, env):
    t0 = time.monotonic()
    p = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", inventory, path], env=env,
                       capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit("%s failed:\n%s" % (path, p.stdout[-3000:]))
    recap = [line for line in p.stdout.splitlines() if "changed=" in line]  # a play without tasks has none
    return wall, int(recap[-1].split("changed=")[1].split()[0]) if recap else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root and the LXC harness (tests/harness/setup.sh)")
    work = tempfile.mkdtemp(prefix="dflash-bench-provision-")
    sshd_dir, pve_dir = os.path.join(work, "sshd"), os.path.join(work, "pve")
    try:
        harness("harness.sshd", "start", sshd_dir)
        harness("harness.pve_api", "start", pve_dir)
        with open(os.path.join(sshd_dir, "state.json")) as f:
            sshd = json.load(f)
        inv = os.path.join(work, "inventory")
        os.makedirs(os.path.join(inv, "host_vars"))
        shutil.copy(HOST_VARS, os.path.join(inv, "host_vars", "pve-ct310.yml"))
        with open(os.path.join(inv, "hosts.yml"), "w") as f:
            json.dump({"dflash_training": {"hosts": {"pve-ct310": {
                "ansible_host": "127.0.0.1", "ansible_port": sshd["port"], "ansible_user": "root",
                "ansible_ssh_private_key_file": sshd["key"],
                "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"}}}}, f)
        empty, floor = os.path.join(work, "empty.yml"), os.path.join(work, "floor.yml")
        for path, text in ((empty, EMPTY_PLAY), (floor, FLOOR_PLAY)):
            with open(path, "w") as f:
                f.write(text)
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), DFLASH_PVE_STATE=pve_dir,
                   ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".collections"), PATH=BIN + os.pathsep + os.environ["PATH"])
        provision = os.path.join(ROOT, "playbooks", "provision.yml")
        first, changed = play(provision, inv, env)
        assert changed > 0, "the first converge changed nothing"
        noop, base, least = [], [], []
        for _ in range(args.repeat):  # alternating, so drift hits all alike
            wall, changed = play(provision, inv, env)
            assert changed == 0, "the re-converge changed %d tasks" % changed
            noop.append(wall)
            base.append(play(empty, inv, env)[0])
            least.append(play(floor, inv, env)[0])
        n, b, f = statistics.median(noop), statistics.median(base), statistics.median(least)
        print("%-44s %8s" % ("figure (provision.yml, ssh -tt, API stand-in)", "value"))
        print("%-44s %7.2fs" % ("first converge (create, raw lines, start)", first))
        print("%-44s %7.2fs" % ("no-op re-converge, median of %d" % args.repeat, n))
        print("%-44s %7.2fs" % ("empty play on the same host, median", b))
        print("%-44s %7.2fs" % ("floor play (controller, host, container)", f))
        print("%-44s %7.2fx  (issue's goal <= 1.5x)" % ("ratio no-op / empty play", n / b))
        print("%-44s %7.2fx" % ("ratio no-op / floor play", n / f))
    finally:
        for mod, d in (("harness.pve_api", pve_dir), ("harness.sshd", sshd_dir)):
            if os.path.exists(os.path.join(d, "pve_api.json" if "pve" in mod else "state.json")):
                subprocess.run([sys.executable, "-m", mod, "stop", d], cwd=TESTS)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
