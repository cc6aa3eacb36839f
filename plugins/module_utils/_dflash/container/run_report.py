# -*- coding: utf-8 -*-
"""training_run status with report=true: the trainer's `dflash-report` drawn in the container (the run's trainer
venv: the python beside its launch command), and the page returned base64-encoded in the result, so the role saves
it on the controller whatever the transport (pct exec, local). Runs on the container side (stdlib only)."""
import base64
import os
import subprocess

REPORT_NAME = "report.html"
MAX_BYTES = 32 * 1024 * 1024  # a page of PNGs is well under 1 MiB; a result this large would choke the transport
TIMEOUT_S = 300


def trainer_python(launch_info):
    """The python of the venv whose trainer the run was launched with (dflash-train, or torchrun's python)."""
    argv = (launch_info or {}).get("argv") or []
    if not argv:
        return None
    path = os.path.join(os.path.dirname(argv[0]), "python")
    return path if os.path.isfile(path) else None


def run_report(run_dir, launch_info):
    """{path, bytes, html_b64} of the page written to <run_dir>/report.html, or {error} in one line."""
    python = trainer_python(launch_info)
    if python is None:
        return {"error": "no trainer venv found for run %s (it has no launch record with a trainer command beside a "
                         "python); launch it once with restart_training.yml" % os.path.basename(run_dir)}
    out = os.path.join(run_dir, REPORT_NAME)
    try:
        proc = subprocess.run([python, "-m", "dflash_trainer.report.cli", run_dir, "--out", out],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return {"error": "dflash-report took more than %d s" % TIMEOUT_S}
    if proc.returncode != 0:
        lines = proc.stdout.decode("utf-8", "replace").strip().splitlines() or ["exit %d" % proc.returncode]
        return {"error": lines[-1][:500]}
    size = os.path.getsize(out)
    if size > MAX_BYTES:
        return {"error": "%s is %d bytes, more than %d; copy it from the container by hand" % (out, size, MAX_BYTES)}
    with open(out, "rb") as f:
        data = f.read()
    return {"path": out, "bytes": size, "html_b64": base64.b64encode(data).decode("ascii")}
