"""Telemetry of a run (telemetry.py, wandb_log.py): profile rows and log lines, NVML's absence said once, rows of
several processes sharing a file, and Weights & Biases offline runs of a real dflash-train, one process and a 1 + 1
gloo torchrun job, read back from the files wandb writes (with no network, and the API key in no file)."""

import glob
import http.server
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import threading

import pytest

from harness.wandb_files import artifacts, file_history, offline_runs, run_id_of
from trainer_testlib import read_heartbeat, read_metrics, start, train_cmd
from dflash_trainer.telemetry.writers import JsonlWriter, NvmlTelemetry, read_jsonl

STEPS = 5
KEY = "k3y-of-this-test-never-on-disk-0123456789abcdef"  # 40+ characters, as a real W&B key


def _append_rows(path, who, count):
    writer = JsonlWriter(path)
    for i in range(count):
        writer.write({"who": who, "i": i, "pad": "x" * 3000})  # rows larger than a line buffer
    writer.close()


def test_rows_of_several_processes_in_one_file_stay_whole(tmp_path):
    path = str(tmp_path / "profile.jsonl")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_rows, args=(path, who, 300)) for who in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = [json.loads(line) for line in open(path)]
    assert sorted((r["who"], r["i"]) for r in rows) == [(w, i) for w in range(4) for i in range(300)]


def test_the_reader_returns_whole_rows_only(tmp_path):
    """read_jsonl (what drivers, benchmarks and tests read run files with): nothing before the file exists; a row
    still being written and the garbled line a cut-short write leaves behind are left out, the rest kept."""
    path = tmp_path / "metrics.jsonl"
    assert read_jsonl(path) == []
    writer = JsonlWriter(str(path))
    writer.write({"step": 1})
    with open(path, "a") as f:
        f.write('{"step": 2, "lo')            # a full disk cut this row short (JsonlWriter then raised)
    writer.write({"step": 3})                 # ...so the next row lands on the same line
    writer.write({"step": 4})
    with open(path, "a") as f:
        f.write('{"step": 5}')                # being written: no newline yet
    writer.close()
    assert read_jsonl(path) == [{"step": 1}, {"step": 4}]


def test_without_nvml_telemetry_says_why_and_writes_nothing(tmp_path):
    nvml = NvmlTelemetry(str(tmp_path), 0.01, [], rank=0).start(lambda: 3)
    if not nvml.unavailable:
        nvml.close()
        pytest.skip("NVML answers on this machine: the absent case cannot be shown here")
    assert "NVML" in nvml.unavailable or "nvidia-ml-py" in nvml.unavailable
    assert nvml.read(3) == [] and nvml.latest == {}
    nvml.close()
    assert not os.path.exists(tmp_path / "telemetry.jsonl")


def wandb_history(run_dir):
    """{step: {key: value}} of the one offline W&B run under <run_dir>/wandb."""
    [path] = offline_runs(run_dir)
    return file_history(path)


def assert_key_nowhere(*paths):
    for root in paths:
        files = [root] if os.path.isfile(root) else [os.path.join(d, n) for d, _, names in os.walk(root)
                                                       for n in names]
        for path in files:
            if not os.path.islink(path):
                with open(path, "rb") as f:
                    assert KEY.encode() not in f.read(), f"the W&B key is in {path}"


def wandb_env(tmp_path):
    # no network: offline, and a proxy that cannot be reached should anything still try
    return {"WANDB_MODE": "offline", "WANDB_PROJECT": "dflash-test", "WANDB_API_KEY": KEY,
            "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"), "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
            "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9", "DFLASH_PROFILE_INTERVAL": "0"}


@pytest.fixture(scope="module")
def one_process_run(tiny, tmp_path_factory):
    """A one-process run logging an offline W&B run: read here, and exported by the artifact test (from a copy);
    a run costs ~6 CPU-s, mostly its imports."""
    pytest.importorskip("wandb")
    tmp = tmp_path_factory.mktemp("one-process")
    out, log = tmp / "out", tmp / "train.log"
    proc = start(train_cmd(tiny, out, "--max-steps", str(STEPS)), log, env=wandb_env(tmp))
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    return tmp


@pytest.mark.slow
def test_one_process_run_logs_profile_and_an_offline_wandb_run(one_process_run):
    tmp_path = one_process_run
    out, log = tmp_path / "out", tmp_path / "train.log"
    text = log.read_text()
    if not glob.glob("/dev/nvidia[0-9]*"):
        assert text.count("note: no GPU telemetry:") == 1
    profile = [json.loads(line) for line in open(out / "profile.jsonl")]
    assert [r["step"] for r in profile][:STEPS] == list(range(1, STEPS + 1))
    assert {"data", "target", "drafter_fwd_bwd", "optimizer"} <= set(profile[-1]["seconds"])
    assert profile[-1]["tokens_per_s"] > 0
    assert text.count("profile: step ") == len(profile)
    metrics = read_metrics(out)
    history = wandb_history(out)
    assert sorted(history) == [r["step"] for r in metrics] == list(range(1, STEPS + 1))
    for row in metrics:
        assert history[row["step"]]["train/loss"] == pytest.approx(row["loss"])
    assert history[STEPS]["profile/seconds/target"] == profile[-1]["seconds"]["target"]
    assert_key_nowhere(str(tmp_path))


class _RefusingWandbServer(http.server.BaseHTTPRequestHandler):
    """W&B's API as a revoked key meets it: every request answered 401 with a GraphQL error."""
    requests: list[str] = []

    def _refuse(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.requests.append(f"{self.command} {self.path}")
        body = b'{"errors":[{"message":"user is not logged in"}]}'
        self.send_response(401)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _refuse

    def log_message(self, *args):
        pass


@pytest.mark.slow
@pytest.mark.parametrize("parent_service", [False, True], ids=["own-service", "parents-service"])
def test_a_refused_online_wandb_run_falls_back_to_offline_and_the_run_trains_on(tiny, tmp_path, parent_service,
                                                                                monkeypatch):
    """Online W&B against a real HTTP server that refuses the key: one log line, an offline run under <run-dir>/wandb
    with every step, exit 0 (it used to stop the run after its weights had loaded). With a parent that used wandb (its
    WANDB_SERVICE inherited) too: the parent's service outlived the trainer's teardown and refused the offline run's
    id as in use (seen in CI after an in-process test had started one)."""
    wandb = pytest.importorskip("wandb")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusingWandbServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {k: v for k, v in wandb_env(tmp_path).items() if k != "WANDB_MODE"}
    env.update(WANDB_BASE_URL=f"http://127.0.0.1:{server.server_address[1]}", NO_PROXY="127.0.0.1",
               WANDB_INIT_TIMEOUT="60")
    out, log = tmp_path / "out", tmp_path / "train.log"
    if parent_service:
        monkeypatch.delenv("WANDB_SERVICE", raising=False)  # restored (to none) after the test
        wandb.setup().ensure_service()  # this process is the parent: it sets WANDB_SERVICE, which start() passes on
        assert os.environ.get("WANDB_SERVICE")
    try:
        proc = start(train_cmd(tiny, out, "--max-steps", str(STEPS)), log, env=env)
        assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        server.shutdown()
        if parent_service:
            wandb.teardown()
    text = log.read_text()
    assert any(r.startswith("POST /graphql") for r in _RefusingWandbServer.requests)   # it did go online first
    [line] = [ln for ln in text.splitlines() if "W&B: online run refused or unreachable" in ln]
    # wandb asks for the kept run id's resume status first: the refusal is its answer (its wording varies)
    assert "logging offline under " + str(out / "wandb") in line, line
    history = wandb_history(out)
    assert sorted(history) == [r["step"] for r in read_metrics(out)] == list(range(1, STEPS + 1))
    assert_key_nowhere(str(tmp_path))


@pytest.mark.slow
def test_torchrun_job_logs_every_ranks_profile_and_one_offline_wandb_run(tiny, tmp_path):
    pytest.importorskip("wandb")
    out, log = tmp_path / "out", tmp_path / "train.log"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "dflash_trainer.cli", *train_cmd(tiny, out, "--target-ranks", "1", "--max-steps", str(STEPS),
                                                  "--hs-queue-depth", "3", "--hs-queue-min-ready", "2")[3:]]
    proc = start(cmd, log, env=wandb_env(tmp_path))
    assert proc.wait(timeout=300) == 0, log.read_text()[-3000:]
    text = log.read_text()
    if not glob.glob("/dev/nvidia[0-9]*"):
        assert text.count("note: no GPU telemetry:") == 1  # rank 0 says it for the job
    profile = [json.loads(line) for line in open(out / "profile.jsonl")]
    last = {r["rank"]: r for r in profile if r.get("done")}
    assert sorted(last) == [0, 1]
    assert {"data", "target", "send", "transfer"} <= set(last[0]["seconds"]) and last[0]["role"] == "target"
    assert {"queue_wait", "drafter_fwd_bwd", "optimizer"} <= set(last[1]["seconds"]) and "queue_depth" in last[1]
    assert all(last[r]["tokens_per_s"] > 0 for r in (0, 1))
    assert "profile: rank 1 drafter step 5" in text  # the last row of each rank reaches the log
    assert len(glob.glob(str(out / "wandb" / "offline-run-*"))) == 1  # one rank logs
    history = wandb_history(out)
    metrics = read_metrics(out)
    assert sorted(history) == [r["step"] for r in metrics] == list(range(1, STEPS + 1))
    for row in metrics:
        assert history[row["step"]]["train/loss"] == pytest.approx(row["loss"])
    assert history[STEPS]["profile/rank1/tokens"] == last[1]["tokens"]
    assert history[STEPS]["profile/rank0/items"] == last[0]["items"]
    assert read_heartbeat(out)["phase"] == "finished"
    assert_key_nowhere(str(tmp_path))


@pytest.mark.slow
def test_wandb_configured_but_not_installed_is_refused_before_weights_load(tiny, tmp_path):
    shadow = tmp_path / "no-wandb"
    shadow.mkdir()
    (shadow / "wandb.py").write_text("raise ImportError('wandb is not installed here')\n")
    out, log = tmp_path / "out", tmp_path / "train.log"
    env = {"PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])}
    proc = start(train_cmd(tiny, out, "--max-steps", "1", "--wandb-project", "p"), log, env=env)
    assert proc.wait(timeout=120) == 2, log.read_text()[-3000:]
    assert "pip install 'dflash_trainer[wandb]'" in log.read_text()
    hb = read_heartbeat(out)
    assert hb["phase"] == "failed" and "wandb" in hb["error"]
    assert not os.path.exists(out / "checkpoints")


@pytest.mark.slow
def test_an_export_is_logged_as_an_artifact_of_the_training_runs_one_wandb_run(one_process_run, tiny, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(one_process_run / "out", out, symlinks=True)
    env = wandb_env(tmp_path)
    export = subprocess.run([sys.executable, "-m", "dflash_trainer.export.exporter", "--checkpoint", str(out),
                             "--target-model", tiny["target"], "--out", str(tmp_path / "export"),
                             "--wandb-artifact", str(out)], env=dict(os.environ, **env), capture_output=True,
                            text=True, timeout=300)
    assert export.returncode == 0, export.stdout + export.stderr
    trained, exported = offline_runs(out)
    assert run_id_of(trained) == run_id_of(exported) == (out / "wandb_run_id").read_text().strip()
    assert artifacts(exported) == [("out-drafter", "model")]
    no_project = {k: v for k, v in env.items() if k != "WANDB_PROJECT"}
    refused = subprocess.run([sys.executable, "-m", "dflash_trainer.export.exporter", "--checkpoint", str(out),
                              "--target-model", tiny["target"], "--out", str(tmp_path / "export2"),
                              "--wandb-artifact", str(out)], env=dict(os.environ, **no_project, WANDB_PROJECT=""),
                             capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--wandb-artifact needs WANDB_PROJECT" in refused.stderr
    assert_key_nowhere(str(tmp_path))
