"""Issue 33: stage_weights.yml runs the copy as an async job and follows it, printing its progress (phase, bytes
copied of the total, MB/s) from the file the module keeps, then one summary line; locally (transport local), as an
operator types it. This test holds the stage lock until the playbook has printed the job's first line (waiting for
the lock), so the job is seen running whatever this machine's speed (a copy of a few MiB ends before a first look)."""
import fcntl
import json
import os
import subprocess
import sys

import pytest
from ansible_helpers import BIN, ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ENV = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"),
           PATH=BIN + os.pathsep + os.environ.get("PATH", ""))
MB = 1 << 20


def test_staging_prints_its_progress_while_the_job_runs_then_a_summary(tmp_path):
    src, shm = tmp_path / "store" / "M", tmp_path / "shm"
    src.mkdir(parents=True)
    shm.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(os.urandom(8 * MB))
    inv = tmp_path / "inventory.json"
    inv.write_text(json.dumps({"dflash_training": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "dflash_transport": "local",
        "dflash_model_source": str(src), "dflash_model_dest": str(shm / "M"),
        "dflash_runs_root": str(tmp_path / "runs")}}}}))
    waiting = "staging %s: waiting for the lock, 0.00 of 0.00 GiB (0.0%%) at 0.0 MB/s" % (shm / "M")
    lock = open(str(shm / ".M.lock"), "a")
    fcntl.flock(lock, fcntl.LOCK_EX)  # another staging of the same dest, as far as the module knows
    proc = subprocess.Popen([os.path.join(BIN, "ansible-playbook"), "-i", str(inv),
                             os.path.join(ROOT, "playbooks", "stage_weights.yml"),
                             "-e", "model_weights_poll_interval=1"],
                            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if not lock.closed and waiting in " ".join("".join(lines[-3:]).split()):
                lock.close()  # the line was printed while the job ran: let it stage
    finally:
        if not lock.closed:
            lock.close()
    out = "".join(lines)
    assert proc.wait(timeout=60) == 0, out[-3000:]
    assert waiting in " ".join(out.split()), out[-3000:]
    assert (shm / "M" / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    kept = json.loads((shm / ".M.progress.json").read_text())
    assert kept["phase"] == "copied" and kept["copied_bytes"] == kept["total_bytes"] == 8 * MB + 2
    assert "%s: copied 2 of 2 files (0.01 of 0.01 GiB at " % (shm / "M") in " ".join(out.split()), out[-3000:]
