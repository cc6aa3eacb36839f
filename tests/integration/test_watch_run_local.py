"""Issue 33 locally, through the playbooks as an operator runs them, with the real trainer on the CPU: one run
launched, force-restarted mid-run and left to finish, watched the whole time. Shared by every test here (one run):
- progress: the log lines, metrics rows, heartbeat and training_status.yml's line carry step of total, the share
  done and an ETA, and the ETA falls as the run advances;
- W&B (offline): one run id across the restart, its history continuous from the step the restart resumed at, the
  restart an event with its reason (also in events.jsonl);
- the report: training_status.yml -e report=true draws it in the "container" and saves it here; headless Chromium
  opens it and every chart image has loaded (the screenshot stays in .artifacts/watch-report.png)."""
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest
from ansible_helpers import BIN, ROOT, live_pids_with
from harness.wandb_files import file_history, offline_runs, run_id_of

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
ENV = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
           PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
# Long enough that the first process is still training when the forced restart comes: a step takes ~50 ms here, and
# under the test command's load restart_training.yml took longer than 150 steps (the run had finished, and the
# restart resumed at its last step)
STEPS = 400
ARTIFACTS = os.path.join(ROOT, ".artifacts")
LOG_STEP = re.compile(r"^step (\d+)/(\d+) \(([\d.]+)%\) eta (\S+) by (steps|time budget) epoch ")


def _inventory(tmp, tiny):
    args = {"target_model": str(tiny / "target"), "data_dir": str(tiny / "data"), "output_dir": str(tmp / "out"),
            "device": "cpu", "epochs": 1000, "max_steps": STEPS, "block_size": 4, "max_anchors": 16,
            "num_draft_layers": 1, "gamma": 4, "token_budget": 1024, "max_seq_len": 256, "max_batch_size": 4,
            "grad_accum": 1, "log_interval": 1, "heartbeat_interval": 0.2, "checkpoint_interval": 1000}
    # W&B offline, and a proxy that cannot be reached should anything still try the network
    env = {"OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_PROJECT": "dflash-watch",
           "WANDB_CONFIG_DIR": str(tmp / "wandb-config"), "WANDB_CACHE_DIR": str(tmp / "wandb-cache"),
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    path = tmp / "inventory.json"
    path.write_text(json.dumps({"dflash_training": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "dflash_transport": "local", "dflash_runs_root": str(tmp / "runs"),
        "dflash_trainer_command": [os.path.join(BIN, "dflash-train")],
        "dflash_target_gpus": [], "dflash_drafter_gpus": [], "dflash_wait_for_phase": "training",
        "dflash_run_defaults": {"trainer_args": args, "env": env}, "dflash_runs": {"r1": {}}}}}}))
    return str(path)


def _playbook(inv, name, *extra):
    proc = subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", inv, os.path.join(ROOT, "playbooks", name),
                           "-e", "run=r1", *extra], env=ENV, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc.stdout + proc.stderr


def _heartbeat(run_dir):
    try:
        with open(os.path.join(run_dir, "heartbeat.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class _Watcher(threading.Thread):
    """Reads the heartbeat every 0.1 s in the background, keeping one reading per distinct write, so it also sees
    the heartbeats written while a playbook runs (under load, restart_training.yml returns many steps after the
    new process started training)."""

    def __init__(self, run_dir):
        super().__init__(daemon=True)
        self.run_dir, self.seen, self.lock, self.done = run_dir, [], threading.Lock(), threading.Event()
        self.start()

    def run(self):
        while not self.done.is_set():
            hb = _heartbeat(self.run_dir)
            with self.lock:
                if hb and (not self.seen or hb["updated_at"] != self.seen[-1]["updated_at"]):
                    self.seen.append(hb)
            time.sleep(0.1)

    def wait(self, until, timeout=240):
        """The readings so far, once until(readings) holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                seen = list(self.seen)
            if seen and until(seen):
                return seen
            time.sleep(0.1)
        raise AssertionError("timed out watching the heartbeat; last %s" % (seen[-1:] or None))


@pytest.fixture(scope="module")
def watched(tiny, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("watch")
    inv = _inventory(tmp, tiny)
    run_dir = str(tmp / "runs" / "r1")
    out = {"tmp": tmp, "run_dir": run_dir}
    watcher = None
    try:
        out["first"] = _playbook(inv, "restart_training.yml")
        watcher = _Watcher(run_dir)
        # past step 15, and three readings with an ETA (the playbook may return after step 15, under load)
        out["beats1"] = watcher.wait(lambda seen: (seen[-1].get("step") or 0) >= 15
                                     and len([b for b in seen if b.get("eta_s") is not None]) >= 3)
        out["restart"] = _playbook(inv, "restart_training.yml", "-e", "force=true")
        pid = int(open(os.path.join(run_dir, "pid")).read())
        # a few steps of the new process in its heartbeat before the status is asked for
        watcher.wait(lambda seen: len([b for b in seen if b["pid"] == pid and b.get("eta_s")]) >= 3)
        out["status"] = _playbook(inv, "training_status.yml")
        beats = watcher.wait(lambda seen: seen[-1].get("phase") == "finished")
        out["beats2"] = [b for b in beats if b["updated_at"] > out["beats1"][-1]["updated_at"]]  # from the restart
        out["log"] = open(os.path.join(run_dir, "train.log")).read()
        out["report_dest"] = str(tmp / "r1-report.html")
        out["report_status"] = _playbook(inv, "training_status.yml", "-e", "report=true",
                                         "-e", "report_dest=" + out["report_dest"])
    finally:
        if watcher is not None:
            watcher.done.set()
        # a run that finished has ended by itself: the stop only where a process of the run is left (one that failed
        # mid-way; its command line names this module's tmp dir)
        if live_pids_with(str(tmp)):
            subprocess.run([os.path.join(BIN, "ansible-playbook"), "-i", inv,
                            os.path.join(ROOT, "playbooks", "stop_training.yml"), "-e", "run=r1"],
                           env=ENV, capture_output=True, cwd=ROOT, timeout=300)
    return out


def _metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_progress_and_eta_in_the_log_heartbeat_and_status_fall_as_the_run_advances(watched):
    lines = [LOG_STEP.match(ln) for ln in watched["log"].splitlines()]
    steps = [m for m in lines if m]
    assert len(steps) >= 10, watched["log"][-2000:]
    assert {int(m.group(2)) for m in steps} == {STEPS}
    assert [float(m.group(3)) for m in steps] == sorted(float(m.group(3)) for m in steps)
    assert steps[-1].group(1) == str(STEPS) and steps[-1].group(3) == "100.0" and steps[-1].group(4) == "0s"

    with open(os.path.join(watched["run_dir"], "events.jsonl")) as f:
        resumed = [json.loads(line) for line in f][-1]["step"]
    rows = [r for r in _metrics(watched["run_dir"]) if r["step"] > resumed]  # the second process's rows
    assert all(r["total_steps"] == STEPS and r["ends_by"] == "steps" for r in rows)
    assert rows[0]["eta_s"] is None  # its first step: no pace of its own yet
    # compared a quarter and three quarters in (three times the steps left): a pace of one or two steps under load
    # is noisy (2026-12-04, a fresh clone with the cores 94 % busy: 6.2 s at step 2 of the second process, 7.1 s
    # half-way)
    assert len(rows) >= 8 and all(r["eta_s"] is not None for r in rows[1:]), rows
    assert rows[len(rows) // 4]["eta_s"] > rows[3 * len(rows) // 4]["eta_s"] > rows[-1]["eta_s"] == 0

    for beats in (watched["beats1"], watched["beats2"]):
        mine = [b for b in beats if b.get("eta_s") is not None and b["pid"] == beats[-1]["pid"]]
        assert len(mine) >= 3 and all(b["total_steps"] == STEPS for b in mine), beats
        assert [b["done_pct"] for b in mine] == sorted(b["done_pct"] for b in mine)
    # over the second process's steps (the first few steps' pace is noisy: compared a quarter and three apart)
    mine = [b for b in watched["beats2"] if b.get("eta_s") and b["pid"] == watched["beats2"][-1]["pid"]]
    assert mine[len(mine) // 4]["eta_s"] > mine[3 * len(mine) // 4]["eta_s"] > 0
    assert watched["beats2"][-1]["eta_s"] == 0 and watched["beats2"][-1]["done_pct"] == 100.0
    _note_eta_accuracy(watched["beats2"])

    [line] = [ln for ln in watched["status"].splitlines() if " progress: step " in ln]
    m = re.search(r"progress: step (\d+)/(\d+) \(([\d.]+)%\), ETA (\d+) min (\d+) s of training by steps", line)
    assert m and int(m.group(2)) == STEPS and 0 < float(m.group(3)) <= 100, line


def _note_eta_accuracy(beats):
    """How close the ETA came to the real end (a note for the reader, not an assertion): the predicted end at a
    quarter and at half of the second process's steps against its `finished` heartbeat, in .artifacts/."""
    done = beats[-1]
    mine = [b for b in beats if b["pid"] == done["pid"] and b.get("eta_s")]
    notes = []
    for share in (0.25, 0.5):
        b = mine[int(len(mine) * share)]
        notes.append({"at_step": b["step"], "eta_s": b["eta_s"], "real_s": round(done["updated_at"] - b["updated_at"],
                                                                                    1)})
    os.makedirs(ARTIFACTS, exist_ok=True)
    with open(os.path.join(ARTIFACTS, "watch-eta.json"), "w") as f:
        json.dump(notes, f)


def test_one_wandb_run_across_a_restart_with_a_continuous_history(watched):
    run_dir = watched["run_dir"]
    assert "(first launch)" in watched["first"] and "(force)" in watched["restart"]
    with open(os.path.join(run_dir, "events.jsonl")) as f:
        events = [json.loads(line) for line in f]
    assert [(e["event"], e["reason"]) for e in events] == [("start", "first launch"), ("restart", "force")]
    resumed = events[1]["step"]
    assert resumed >= 15
    files = offline_runs(run_dir)
    with open(os.path.join(run_dir, "wandb_run_id")) as f:
        kept = f.read().strip()
    assert len(files) == 2 and {run_id_of(p) for p in files} == {kept}
    first, second = file_history(files[0]), file_history(files[1])
    assert sorted(first) == list(range(1, resumed + 1))  # SIGTERM checkpointed the last step: nothing lost
    assert sorted(second) == list(range(resumed + 1, STEPS + 1))  # and the resumed run goes on from the next
    assert second[resumed + 1]["events/restart_reason"] == "force" and "train/loss" in second[resumed + 1]
    assert first[1]["events/start_reason"] == "first launch"


def _chromium():
    path = shutil.which("chromium")
    assert path, "chromium is not installed: tests/harness/setup.sh installs it (as root)"
    return [path, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=5000"]


# Appended to a copy of the page: each image's natural width once loaded (0 when the PNG did not decode)
MEASURE = ("<script>window.addEventListener('load',()=>{for(const i of document.images)"
           "{i.dataset.naturalWidth=i.naturalWidth;}document.body.dataset.measured='yes';});</script>")


def test_the_report_opens_in_headless_chromium_with_every_chart_drawn(watched, tmp_path):
    dest = watched["report_dest"]
    assert " report: %s (" % dest in watched["report_status"], watched["report_status"][-2000:]
    page = open(dest).read()
    assert "<script" not in page and not re.search(r"(src|href)=['\"]https?:", page)  # nothing from elsewhere
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", MEASURE + "</body>"))
    dom = subprocess.run(_chromium() + ["--dump-dom", probe.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    assert 'data-measured="yes"' in dom, dom[-2000:]
    charts = re.findall(r'<figure id="([\w-]+)">.*?</figure>', dom, re.S)
    assert charts[:4] == ["loss", "accuracy", "tau-proxy", "tokens-per-s"], charts
    widths = re.findall(r'<img class="chart"[^>]*data-natural-width="(\d+)"', dom)
    assert len(widths) == 4 and all(int(w) > 300 for w in widths), widths
    assert "no GPU telemetry" in dom and "no hidden-state queue" in dom  # a CPU run, one process: said, not drawn
    assert "restart" in dom and "force" in dom  # the summary lists the restart and its reason
    os.makedirs(ARTIFACTS, exist_ok=True)
    shot = os.path.join(ARTIFACTS, "watch-report.png")
    subprocess.run(_chromium() + ["--window-size=1000,2200", "--screenshot=" + shot, "file://" + dest],
                   capture_output=True, timeout=120, cwd=str(tmp_path))
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
