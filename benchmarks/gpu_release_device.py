#!/usr/bin/env python3
"""The restart lifecycle's GPU-release path (NVML) against a real NVIDIA GPU. On the device, from the repo root:

    python3 benchmarks/gpu_release_device.py            # needs GPU 0, torch with CUDA, nvidia-ml-py
    .venv/bin/python benchmarks/gpu_release_device.py --dry-cpu   # plumbing only: no GPU, no NVML

Calls training_backend.manage_run with transport=local, i.e. what the training_run module does in local mode:
build_request → `python -c BOOTSTRAP` with the shipped procfs/gpu_release/run_lifecycle sources on stdin.
Needs no ansible. The trainer is benchmarks/gpu_holder.py (holds --gib GiB on cuda:0). Scenarios:
  1 launch     run A comes up in phase training; NVML shows >= GIB used
  2 restart    new fingerprint: A gets SIGTERM (slow checkpoint), memory wait via NVML, B comes up
  3 sigkill    a trainer deaf to SIGTERM is SIGKILLed after stop_timeout, memory wait, next launch
  4 refusal    gpus=[7] on a 1-GPU box fails "GPU 7 does not exist" before anything is stopped
  5 timeout    a foreign process (not a run) holds memory: restart fails "were not released within"
  cleanup      everything stopped, GPU memory back under the threshold
Prints one row per scenario; exit 0 all PASS, 1 any FAIL, 77 no GPU (skip). $OUT/gpu_release.json gets it all.
About 1 minute on one H200 (five trainer starts, 8 GiB each); everything runs under a temp dir in /tmp.
--dry-cpu runs the same scenarios with a holder that allocates nothing and keeps a fake /dev/nvidiaN open
(NVML absent → the memory wait is skipped, GPU indexes cannot be checked: expectations change accordingly).
"""

import argparse
import atexit
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOLDER = os.path.join(ROOT, "benchmarks", "gpu_holder.py")
RUN = "gpurel"
SKIP = 77

# Run in a child so this process never opens /dev/nvidia*: the lifecycle would count us as a holder.
NVML_PROBE = """
import json, pynvml
pynvml.nvmlInit()
try:
    out = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        out.append({"used_mib": pynvml.nvmlDeviceGetMemoryInfo(h).used // 2**20,
                    "processes": [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]})
    print(json.dumps(out))
finally:
    pynvml.nvmlShutdown()
"""


def import_backend():
    """The collection's module_utils without ansible: ansible_collections is a namespace package."""
    path = os.path.join(ROOT, ".collections")
    if not os.path.isdir(os.path.join(path, "ansible_collections", "dflash", "ops", "plugins")):
        # The checked-in symlink did not survive the copy: make an equivalent one.
        path = tempfile.mkdtemp(prefix="dflash-collections-")
        os.makedirs(os.path.join(path, "ansible_collections", "dflash"))
        os.symlink(ROOT, os.path.join(path, "ansible_collections", "dflash", "ops"))
        atexit.register(shutil.rmtree, path, True)
    sys.path.insert(0, path)
    from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import procfs
    from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import training_backend
    return training_backend, procfs


def nvml(env=None):
    """[{used_mib, processes}] per GPU; RuntimeError when NVML is unusable."""
    p = subprocess.run([sys.executable, "-c", NVML_PROBE], capture_output=True, text=True, timeout=60, env=env)
    if p.returncode != 0:
        raise RuntimeError((p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1])
    return json.loads(p.stdout)


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


class Module(object):
    """What training_backend.manage_run uses of AnsibleModule."""

    def __init__(self, params):
        self.params, self.check_mode, self.warnings = params, False, []

    def warn(self, msg):
        self.warnings.append(msg)


class Bench(object):
    def __init__(self, args, backend, tmp):
        self.args, self.backend, self.tmp = args, backend, tmp
        self.runs_root = os.path.join(tmp, "runs")
        self.rows, self.pids = [], set()
        self.dev_pattern = os.path.join(tmp, "dev", "nvidia{index}") if args.dry_cpu else "/dev/nvidia{index}"
        os.makedirs(os.path.join(tmp, "dev"))
        if args.dry_cpu:  # the stand-in device file of GPU 0: without NVML the lifecycle checks that it exists
            open(self.dev_pattern.format(index=0), "w").close()
        self.threshold = 1024
        self.gib = 0 if args.dry_cpu else args.gib

    def lifecycle(self, state="restarted", **over):
        """One training_run call in local mode; returns the result, with failed/msg on failure."""
        params = self.backend.argument_spec().defaults()
        # The trainer starts from `env -i`: hand on what finds torch and libcuda if this shell needed it.
        env = dict((k, os.environ[k]) for k in ("LD_LIBRARY_PATH", "PYTHONPATH") if os.environ.get(k))
        params.update(name=RUN, state=state, transport="local", runs_root=self.runs_root, gpus=[0],
                      command=[sys.executable, HOLDER], env=env, wait_for_phase="training",
                      phase_timeout=60, heartbeat_timeout=60, stop_timeout=15, gpu_release_timeout=30,
                      gpu_memory_threshold_mib=self.threshold, gpu_device_pattern=self.dev_pattern, timeout=150)
        params.update(over)
        try:
            res = dict(self.backend.manage_run(Module(params)), failed=False)
        except self.backend.ModuleFailure as exc:
            res = dict(exc.facts, failed=True, msg=str(exc))
        if res.get("pid"):
            self.pids.add(res["pid"])
        return res

    def trainer(self, tag, **extra):
        args = {"gib": self.gib, "slow_exit": 1.5, "tag": tag}
        if self.args.dry_cpu:
            args["hold"] = self.dev_pattern.format(index=0)  # stands in for the CUDA context's /dev/nvidia0
        args.update(extra)
        return args

    def used_mib(self):
        return None if self.args.dry_cpu else nvml()[0]["used_mib"]

    def row(self, name, expected, checks, observed, **data):
        failed = [what for what, ok in checks if not ok]
        if failed:
            observed += " | NOT: " + "; ".join(failed)
        self.rows.append(dict(data, scenario=name, expected=expected, observed=observed,
                              result="FAIL" if failed else "PASS"))
        print("%-10s | %s | %s | %s" % (name, expected, observed, self.rows[-1]["result"]), flush=True)

    def gpu_wait_checks(self, res):
        w = res.get("gpu_wait") or {}
        if self.args.dry_cpu:
            return [("gpu_wait skipped for lack of NVML, reason given", w.get("skipped") is True
                     and w.get("nvml") == "unavailable" and "wait skipped" in (w.get("reason") or ""))]
        return [("gpu_wait.nvml == used", w.get("nvml") == "used"), ("gpu_wait not skipped", w.get("skipped") is False),
                ("gpu_wait.waited_s reported", isinstance(w.get("waited_s"), (int, float)))]

    def launched_checks(self, res, old_pid=None):
        checks = [("no failure: %s" % res.get("msg"), not res["failed"]),
                  ("action launched", res.get("action") == "launched"),
                  ("phase training", res.get("phase") == "training"), ("new pid alive", alive(res.get("pid") or 0))]
        if old_pid:
            checks += [("new pid != old", res.get("pid") != old_pid), ("old pid gone", not alive(old_pid))]
        return checks

    def scenario1(self):
        res = self.lifecycle(trainer_args=self.trainer("A"))
        used = self.used_mib()
        checks = self.launched_checks(res)
        if not self.args.dry_cpu:
            checks.append(("NVML used >= %d MiB" % (self.gib * 1024), used is not None and used >= self.gib * 1024))
        self.row("1 launch", "launched, phase training, NVML used >= %s GiB" % self.gib,
                 checks, "action %s pid %s phase %s, NVML used %s MiB" % (res.get("action"), res.get("pid"),
                                                                          res.get("phase"), used), lifecycle=res)
        return res.get("pid")

    def scenario2(self, pid_a):
        res = self.lifecycle(trainer_args=self.trainer("B"))
        stop = (res.get("stopped") or [{}])[0]
        checks = self.launched_checks(res, pid_a) + self.gpu_wait_checks(res) + [
            ("stopped[0] is A by SIGTERM", stop.get("pid") == pid_a and stop.get("signal") == "SIGTERM"),
            ("stop waited the slow exit (>= 1.4 s)", (stop.get("waited_s") or 0) >= 1.4)]
        t = res.get("timings") or {}
        self.row("2 restart", "A SIGTERMed, memory wait (NVML), B launched", checks,
                 "stopped %s by %s in %ss; gpu_wait %s; B pid %s phase %s; timings stop %s gpu_wait %s launch %s "
                 "verify %s first_heartbeat %s; NVML used now %s MiB" % (
                     stop.get("pid"), stop.get("signal"), stop.get("waited_s"), res.get("gpu_wait"), res.get("pid"),
                     res.get("phase"), t.get("stop"), t.get("gpu_wait"), t.get("launch"), t.get("verify"),
                     t.get("first_heartbeat"), self.used_mib()), lifecycle=res)
        return res.get("pid")

    def scenario3(self, pid_b):
        deaf = self.lifecycle(trainer_args=self.trainer("C", ignore_term=True))
        pid_c = deaf.get("pid")
        res = self.lifecycle(trainer_args=self.trainer("D"), stop_timeout=2)
        stop = (res.get("stopped") or [{}])[0]
        checks = [("C launched: %s" % deaf.get("msg"), not deaf["failed"] and deaf.get("phase") == "training"
                   and pid_c != pid_b)]
        checks += self.launched_checks(res, pid_c) + self.gpu_wait_checks(res) + [
            ("stopped[0] is C by SIGKILL", stop.get("pid") == pid_c and stop.get("signal") == "SIGKILL"),
            ("SIGKILL only after stop_timeout 2 s", (stop.get("waited_s") or 0) >= 2)]
        self.row("3 sigkill", "deaf C SIGKILLed after 2 s, memory wait, D launched", checks,
                 "stopped %s by %s in %ss; gpu_wait %s; D pid %s phase %s; timings %s" % (
                     stop.get("pid"), stop.get("signal"), stop.get("waited_s"), res.get("gpu_wait"), res.get("pid"),
                     res.get("phase"), res.get("timings")), lifecycle_c=deaf, lifecycle=res)
        return res.get("pid")

    def scenario4(self, pid_d):
        res = self.lifecycle(trainer_args=self.trainer("E"), gpus=[7])
        st = self.lifecycle(state="status")
        # Refused on both paths: NVML counts the GPUs, and without it /dev/nvidia7 (here its stand-in) is missing.
        expected = "failed 'GPU 7 does not exist', nothing stopped, D alive with the same pid"
        checks = [("failed", res["failed"]), ("msg names GPU 7", "GPU 7 does not exist" in (res.get("msg") or "")),
                  ("nothing stopped", not res.get("stopped")),
                  ("D alive, same pid", st.get("alive") is True and st.get("pid") == pid_d and alive(pid_d))]
        new_pid = pid_d
        self.row("4 refusal", expected, checks, "failed %s: %s; status alive %s pid %s (D was %s)" % (
            res["failed"], res.get("msg"), st.get("alive"), st.get("pid"), pid_d), lifecycle=res, status=st)
        return new_pid

    def scenario5(self, pid_run):
        fdir = os.path.join(self.tmp, "foreign")  # outside the runs root: not a run
        os.makedirs(fdir)
        cmd = [sys.executable, HOLDER, "--run-dir", fdir, "--gib", str(self.gib)]
        if self.args.dry_cpu:
            cmd += ["--hold", self.dev_pattern.format(index=0)]
        with open(os.path.join(fdir, "out.log"), "w") as log:
            self.foreign = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.foreign.poll() is None:
            try:
                with open(os.path.join(fdir, "heartbeat.json")) as f:
                    if json.load(f).get("phase") == "training":
                        break
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        used = self.used_mib()
        res = self.lifecycle(trainer_args=self.trainer("F"), gpu_release_timeout=3.0)  # float, as the spec gives it
        msg = res.get("msg") or ""
        checks = [("failed", res["failed"]),
                  ("'were not released within 3.0s'", "were not released within 3.0s" in msg),
                  ("run stopped first", not alive(pid_run))]
        if self.args.dry_cpu:
            checks.append(("names the foreign holder", "pid %d" % self.foreign.pid in msg))
        else:
            m = re.search(r"GPU 0 has (\d+) MiB in use", msg)
            checks.append(("names GPU 0 used MiB >= %d" % (self.gib * 1024), m and int(m.group(1)) >= self.gib * 1024))
        self.row("5 timeout", "failed 'GPUs 0 were not released within 3.0s: … GPU 0 has N MiB in use'", checks,
                 "foreign pid %d (NVML used %s MiB): %s" % (self.foreign.pid, used, msg), lifecycle=res)
        kill_group(self.foreign.pid, wait=self.foreign)

    def cleanup(self):
        res = self.lifecycle(state="stopped")
        if getattr(self, "foreign", None) is not None:
            kill_group(self.foreign.pid, wait=self.foreign)
        left = sorted(p for p in self.pids if alive(p))
        for pid in left:
            kill_group(pid)
        used = None
        if not self.args.dry_cpu:
            deadline = time.monotonic() + 20
            while (used is None or used >= self.threshold) and time.monotonic() < deadline:
                used = self.used_mib()
                time.sleep(0.25)
        checks = [("stop call ok: %s" % res.get("msg"), not res["failed"]), ("no leftover pids %s" % left, not left)]
        if not self.args.dry_cpu:
            checks.append(("NVML used < %d MiB" % self.threshold, used is not None and used < self.threshold))
        self.row("cleanup", "everything stopped, GPU memory released", checks,
                 "stop action %s; leftovers killed %s; NVML used %s MiB" % (res.get("action"), left, used),
                 lifecycle=res)


def kill_group(pid, wait=None):
    """SIGTERM the group, SIGKILL after 10 s; reap our own child."""
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if wait is not None and wait.poll() is not None or wait is None and not alive(pid):
                return
            time.sleep(0.1)


def preflight(args, procfs):
    """None when the GPU path can run, else why not. Notes what already holds GPU 0 (it would block the waits)."""
    if args.dry_cpu:
        return None
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    try:
        gpus = nvml()
    except Exception as exc:
        return "NVML is unusable (%s)" % exc
    if not gpus:
        return "NVML sees no GPU"
    print("GPUs seen by NVML: %d; GPU 0 before: %s" % (len(gpus), gpus[0]))
    try:  # the lifecycle runs under `env -i PATH=…` (transport.py): would NVML work there too?
        nvml(env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
    except Exception as exc:
        print("note: NVML fails in an empty environment, as the lifecycle runs it (%s): gpu_wait will say "
              "nvml unavailable" % exc)
    for pid, paths in sorted(procfs.holders_of(["/dev/nvidia0"]).items()):
        print("note: pid %d (%s) already holds %s: every memory wait will wait for it"
              % (pid, " ".join(procfs.cmdline(pid) or ["?"])[:100], ", ".join(paths)))
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-cpu", action="store_true",
                    help="no GPU: check the plumbing with a holder that allocates nothing")
    ap.add_argument("--gib", type=int, default=8, help="GiB each stand-in trainer holds on cuda:0")
    args = ap.parse_args()
    backend, procfs = import_backend()
    why = preflight(args, procfs)
    if why:
        print("SKIP: this needs an NVIDIA GPU with torch (CUDA) and nvidia-ml-py: %s. Use --dry-cpu for the plumbing."
              % why)
        return SKIP
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="dflash-gpu-release-", dir="/tmp")
    bench = Bench(args, backend, tmp)
    if not args.dry_cpu:
        # The driver may keep some memory in use with no process: the threshold sits 1 GiB above that.
        base = bench.used_mib()
        bench.threshold = max(1024, base + 1024)
        print("baseline GPU 0 used %d MiB -> gpu_memory_threshold_mib %d" % (base, bench.threshold))
    print("python %s, runs root %s, mode %s" % (sys.executable, bench.runs_root, "dry-cpu" if args.dry_cpu else "GPU"))
    print("scenario   | expected | observed | result")
    try:
        pid = bench.scenario1()
        pid = bench.scenario2(pid)
        pid = bench.scenario3(pid)
        pid = bench.scenario4(pid)
        bench.scenario5(pid)
    except Exception as exc:  # record, then still clean up below
        bench.row("error", "no exception", [("%s: %s" % (type(exc).__name__, exc), False)], "aborted")
    finally:
        bench.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    failed = [r["scenario"] for r in bench.rows if r["result"] != "PASS"]
    summary = {"mode": "dry-cpu" if args.dry_cpu else "gpu", "gib": bench.gib, "threshold_mib": bench.threshold,
               "wall_s": round(time.monotonic() - t0, 1), "failed": failed, "rows": bench.rows}
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gpu_release.json"), "w") as f:
            json.dump(summary, f, indent=1, default=str)
    print("%s in %.1f s: %d rows, %s" % ("FAIL" if failed else "PASS", summary["wall_s"], len(bench.rows),
                                         "failed: " + ", ".join(failed) if failed else "all passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
