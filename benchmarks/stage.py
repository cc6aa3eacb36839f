"""Staging throughput of dflash.ops.model_weights against plain `cp -r`, and the cost of an unchanged re-run.

    .venv/bin/python benchmarks/stage.py [--shards 4] [--shard-mb 512] [--repeats 3]

Source: shard-sized files in a tmp dir under /dev/shm (made once; warm page cache for both contenders). Staging
goes through the module's backend (controller/weights_backend.stage_weights, local transport: the same shipped
in-container code a container runs), never a copy loop of its own. Rows: cp -r vs staging (alternating order,
median of `--repeats`), the unchanged re-run of the backend, and stage_weights.yml vs an empty play (the issue's
reference: no task, no connection) and vs a floor play (one `ping` to the same host: no play that looks at the
staged copy can cost less). The CPU seconds (user + sys of the child processes: cp; the stager the local
transport starts) are printed too: on a shared machine the wall-clock ratio follows the other load, the CPU each
contender spends per byte does not.
"""
import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, ".collections"))

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import weights_backend  # noqa: E402


class Module(object):
    """What the backend uses of an AnsibleModule."""

    def __init__(self, **params):
        self.params = weights_backend.argument_spec().defaults()
        self.params.update(params)
        self.check_mode, self._diff = False, False


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def stage(src, dest, cpu=None):
    c0, t0 = children_cpu(), time.monotonic()
    res = weights_backend.stage_weights(Module(transport="local", source=src, dest=dest, python=sys.executable))
    if cpu is not None:
        cpu.append(children_cpu() - c0)
    return time.monotonic() - t0, res


def cp(src, dest, cpu):
    c0, t0 = children_cpu(), time.monotonic()
    subprocess.run(["cp", "-r", src, dest], check=True)
    cpu.append(children_cpu() - c0)
    return time.monotonic() - t0


def playbook(path, env, extravars):
    t0 = time.monotonic()
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "inventories/local",
                    path] + sum((["-e", "%s=%s" % kv] for kv in extravars.items()), []),
                   check=True, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--shard-mb", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    total = a.shards * a.shard_mb << 20
    avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if avail < 4 * total:  # source + cp copy + staged copy + margin
        sys.exit("stage.py: needs %.1f GB of free memory, %.1f GB free; use fewer --shards or a smaller --shard-mb"
                 % (4 * total / 1e9, avail / 1e9))
    work = tempfile.mkdtemp(prefix="dflash-stage-bench-", dir="/dev/shm")
    try:
        src = os.path.join(work, "store", "M")
        os.makedirs(src)
        with open(os.path.join(src, "config.json"), "w") as f:
            f.write('{"vocab_size": 8}\n')
        for i in range(a.shards):
            with open(os.path.join(src, "model-%05d.safetensors" % i), "wb") as f:
                for _ in range(a.shard_mb):
                    f.write(os.urandom(1 << 20))
        cp_s, stage_s, cp_cpu, stage_cpu, algo = [], [], [], [], None
        for i in range(a.repeats):
            for name in (("cp", "stage") if i % 2 == 0 else ("stage", "cp")):
                dest = os.path.join(work, "%s-%d" % (name, i))
                if name == "cp":
                    cp_s.append(cp(src, dest, cp_cpu))
                    shutil.rmtree(dest)
                else:
                    s, res = stage(src, dest, stage_cpu)
                    stage_s.append(s)
                    algo = res["hash_algorithm"]
                    assert res["bytes_copied"] == res["bytes_total"]
                    if i < a.repeats - 1:
                        shutil.rmtree(os.path.realpath(dest))
                        os.unlink(dest)
                    else:
                        last = dest
        noop = [stage(src, last) for _ in range(a.repeats)]
        assert not any(r["changed"] for _, r in noop)
        env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"))
        empty = os.path.join(work, "empty.yml")
        with open(empty, "w") as f:
            f.write("- name: Empty\n  hosts: dflash_training\n  gather_facts: false\n  tasks: []\n")
        extra = {"dflash_model_source": src, "dflash_model_dest": last}
        floor = os.path.join(work, "floor.yml")
        with open(floor, "w") as f:  # one no-op module round trip to where the staged copy lives
            f.write("- name: Floor\n  hosts: dflash_training\n  gather_facts: false\n"
                    "  tasks:\n    - name: One no-op module call\n      ansible.builtin.ping:\n")
        plays = {"play": ("playbooks/stage_weights.yml", extra), "empty": (empty, {}), "floor": (floor, {})}
        times = {name: [] for name in plays}
        for i in range(a.repeats):
            order = list(plays) if i % 2 == 0 else list(reversed(list(plays)))
            for name in order:
                times[name].append(playbook(plays[name][0], env, plays[name][1]))
        play_s, empty_s, floor_s = times["play"], times["empty"], times["floor"]
        mb = total / 1e6
        cp_m, st_m = statistics.median(cp_s), statistics.median(stage_s)
        rows = [
            ("data", "%d x %d MiB = %.2f GB, /dev/shm -> /dev/shm, warm, %s" % (a.shards, a.shard_mb, total / 1e9, algo)),
            ("cp -r (median of %d)" % a.repeats, "%.2f s  %.0f MB/s  cpu %.2f s" % (cp_m, mb / cp_m,
                                                                               statistics.median(cp_cpu))),
            ("model_weights backend, hashing", "%.2f s  %.0f MB/s  cpu %.2f s" % (st_m, mb / st_m,
                                                                                statistics.median(stage_cpu))),
            ("ratio staging/cp throughput", "%.2fx (goal >= 0.8x); per cpu second %.2fx" % (
                cp_m / st_m, statistics.median(cp_cpu) / statistics.median(stage_cpu))),
            ("unchanged re-run, backend", "%.3f s (goal <= 1 s)" % statistics.median(s for s, _ in noop)),
            ("stage_weights.yml unchanged", "%.2f s" % statistics.median(play_s)),
            ("empty play", "%.2f s" % statistics.median(empty_s)),
            ("floor play (one ping)", "%.2f s" % statistics.median(floor_s)),
            ("ratio playbook/empty play", "%.2fx (goal <= 1.5x)" % (statistics.median(play_s) /
                                                                    statistics.median(empty_s))),
            ("ratio floor/empty play", "%.2fx" % (statistics.median(floor_s) / statistics.median(empty_s))),
            ("ratio playbook/floor play", "%.2fx" % (statistics.median(play_s) / statistics.median(floor_s))),
        ]
        width = max(len(k) for k, _ in rows)
        for k, v in rows:
            print("%-*s  %s" % (width, k, v))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
