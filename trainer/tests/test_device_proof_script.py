"""device_proof.sh without a GPU: `watch` on a machine that was given back since the launch, and following only
its own stash's proof (a process named as the proof stands in for it); `launch` refusing PROOF_C before anything
starts, and a second launch beside a running proof; `serve` (serve_bench.py on the CPU with a tiny export)."""
import os
import subprocess

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "proofs", "device_proof.sh")


def test_watch_on_a_bare_machine_says_the_proof_is_gone_instead_of_finished(tmp_path):
    env = dict(os.environ, DFLASH_STASH=str(tmp_path / "stash"), OUT=str(tmp_path / "out"))
    r = subprocess.run(["bash", SCRIPT, "watch", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3
    assert "given back since launch" in r.stdout
    assert "PROOF FINISHED" not in r.stdout


@pytest.mark.parametrize("running, finished", [(None, True), ("stash", False), ("elsewhere", True)])
def test_watch_follows_a_proof_log_that_is_there_and_waits_only_for_its_own_proof(tmp_path, running, finished):
    stash = tmp_path / "stash"
    stash.mkdir()
    (stash / "proof.log").write_text("[  1.0 s] data: {}\n")
    (stash / "proof" / "data").mkdir(parents=True)
    (stash / "proof" / "data" / "rows.parquet").write_bytes(b"rows")
    proof = None
    if running:  # a live process whose command line is a proof's, in this stash or in another one
        out = tmp_path / running / "proof"
        proof = subprocess.Popen(["bash", "-c", f"exec -a 'python3 -m proofs.proof_smollm2 --out {out} ' sleep 60"])
    try:
        env = dict(os.environ, DFLASH_STASH=str(stash), OUT=str(tmp_path / "out"))
        r = subprocess.run(["bash", SCRIPT, "watch", "1"], env=env, capture_output=True, text=True, timeout=60)
    finally:
        if proof:
            proof.kill()
            proof.wait()
    assert r.returncode == 0, r.stderr
    assert ("PROOF FINISHED" in r.stdout) == finished
    assert ("STILL RUNNING" in r.stdout) == (not finished)
    assert (tmp_path / "out" / "proof.log").read_text().startswith("[  1.0 s] data:")
    # the data came back as the pieces of a numbered tar that hold it (data_sendback.py)
    parts = sorted((tmp_path / "out").glob("data-01.tar.part-*"))
    assert parts and b"rows.parquet" in b"".join(p.read_bytes() for p in parts)


@pytest.mark.parametrize("proof_b, after", [("", "1"), ("--lr 2e-3", "0")])
def test_launch_refuses_a_third_proof_that_would_not_follow_the_second_before_anything_starts(tmp_path, proof_b, after):
    env = dict(os.environ, DFLASH_STASH=str(tmp_path / "stash"), OUT=str(tmp_path / "out"),
               PROOF_B=proof_b, PROOF_B_AFTER=after, PROOF_C="--lr-schedule wsd")
    r = subprocess.run(["bash", SCRIPT, "launch", "--lr", "1e-3"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "PROOF_C runs after proof B ends: set PROOF_B and PROOF_B_AFTER=1" in r.stdout
    assert os.listdir(tmp_path / "stash") == []  # no GGUF joined, no proof started


@pytest.mark.parametrize("added", [False, True])
def test_watch_sends_back_only_data_that_was_not_carried_in(tmp_path, added):
    stash = tmp_path / "stash"
    data = stash / "proof" / "data"
    data.mkdir(parents=True)
    (stash / "proof.log").write_text("[  1.0 s] data: {}\n")
    (data / "shard-00000.parquet").write_bytes(b"carried")
    (data / "progress.json").write_text('{"num_shards": 1}')
    # what launch records after unpacking the carried tars
    subprocess.run(["python3", os.path.join(os.path.dirname(SCRIPT), "data_sendback.py"), "mark", "--proof",
                    str(stash / "proof"), "--stash", str(stash)], check=True)
    if added:  # the proof regenerated rows the carried tars lacked
        (data / "shard-00001.parquet").write_bytes(b"regenerated")
        (data / "progress.json").write_text('{"num_shards": 2}')
    env = dict(os.environ, DFLASH_STASH=str(stash), OUT=str(tmp_path / "out"))
    r = subprocess.run(["bash", SCRIPT, "watch", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    parts = sorted((tmp_path / "out").glob("data-*.tar.part-*"))
    assert bool(parts) == added
    assert ("no new settled data to send" in r.stdout) == (not added)
    if added:
        sent = b"".join(p.read_bytes() for p in parts)
        assert b"regenerated" in sent and b"carried" not in sent


def test_watch_prints_where_the_proofs_stand_and_sends_their_whole_logs(tmp_path):
    # a real proof's log (run 20 A, one H100) as the first proof's, its first lines as a second one still running
    log = os.path.join(os.path.dirname(__file__), "..", "results",
                       "proof-smollm2-h100-2026-12-06-run20-a-lr-schedule-wsd.log")
    text = open(log).read()
    stash = tmp_path / "stash"
    stash.mkdir()
    (stash / "proof.log").write_text(text)
    head = text.splitlines(keepends=True)[:40]
    (stash / "proof-b.log").write_text("".join(head))
    env = dict(os.environ, DFLASH_STASH=str(stash), OUT=str(tmp_path / "out"))
    r = subprocess.run(["bash", SCRIPT, "watch", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.split("--- proof B:")
    assert "| DFlash | 5.0 | 1748 |" in first and "finished: 1748 optimizer steps" in first
    assert "dflash  1.86" in first  # the other-styles snapshot's τ line
    assert first.count("\n") <= 16 and len(r.stdout) < len(text) / 4
    last_step = [line for line in head if line.startswith("step ")][-1]
    assert last_step in second  # how far the second proof has trained
    assert (tmp_path / "out" / "proof.log").read_text().count("\n") > 100  # the whole log comes back


def _live(cmdline: str) -> subprocess.Popen:
    """A live process whose command line is `cmdline` (stands in for a proof or serve_bench's waiter)."""
    return subprocess.Popen(["bash", "-c", f"exec -a '{cmdline}' sleep 60"])


def test_launch_refuses_while_a_proof_of_this_machine_runs_and_moves_nothing(tmp_path):
    stash = tmp_path / "stash"
    stash.mkdir()
    (stash / "proof.log").write_text("step 10/100\n")
    proof = _live(f"python3 -m proofs.proof_smollm2 --out {stash}/proof ")
    try:
        env = dict(os.environ, DFLASH_STASH=str(stash), OUT=str(tmp_path / "out"))
        r = subprocess.run(["bash", SCRIPT, "launch", "--lr", "1e-3"], env=env, capture_output=True, text=True,
                           timeout=60)
    finally:
        proof.kill()
        proof.wait()
    assert r.returncode == 2
    assert "still running: watch it to its end, then launch again" in r.stdout
    assert sorted(os.listdir(stash)) == ["proof.log"]


def test_a_second_launch_moves_the_earlier_launchs_logs_and_reports_aside(tmp_path):
    stash = tmp_path / "stash"
    for d in ("report", "report-b", "proof/data"):
        (stash / d).mkdir(parents=True)
    for name in ("proof.log", "proof-b.log", "report/proof.json", "report-b/proof.json", "init.sent",
                 "serve-bench.json"):
        (stash / name).write_text(name)
    (stash / "gguf-part-00").write_bytes(b"half")
    env = dict(os.environ, DFLASH_STASH=str(stash), OUT=str(tmp_path / "out"))
    # run where dev-b's half is absent: launch stops at the GGUF's checksum, after the move
    r = subprocess.run(["bash", SCRIPT, "launch", "--lr", "1e-3"], env=env, capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 5
    assert f"the earlier launch's logs and reports: {stash}/earlier-1" in r.stdout
    earlier = stash / "earlier-1"
    for name in ("proof.log", "proof-b.log", "report/proof.json", "report-b/proof.json", "init.sent",
                 "serve-bench.json"):
        assert (earlier / name).read_text() == name  # kept, not overwritten by the new launch
    assert not (stash / "proof.log").exists() and not (stash / "init.sent").exists()
    assert (stash / "proof" / "data").is_dir()  # the data stays for the new proofs


@pytest.mark.parametrize("serving", [True, False])
def test_watch_waits_for_serve_bench_and_reports_it(tmp_path, serving):
    stash = tmp_path / "stash"
    stash.mkdir()
    (stash / "proof.log").write_text("finished: 10 optimizer steps\n")
    (stash / "serve-bench.log").write_text("prompts 78, block 16, max new tokens 128\nspeedup      3.05x\n"
                                           "tau          3.10\nlossless     True (78/78 prompts identical)\n")
    (stash / "serve-bench.json").write_text("{}")
    waiter = _live("bash -c waiter")
    (stash / "serve.pid").write_text(str(waiter.pid))
    if not serving:
        waiter.kill()
        waiter.wait()
    try:
        env = dict(os.environ, DFLASH_STASH=str(stash), OUT=str(tmp_path / "out"))
        r = subprocess.run(["bash", SCRIPT, "watch", "1"], env=env, capture_output=True, text=True, timeout=60)
    finally:
        waiter.kill()
        waiter.wait()
    assert r.returncode == 0, r.stderr
    assert "--- serve_bench (other styles):" in r.stdout and "speedup      3.05x" in r.stdout
    assert ("STILL RUNNING (serve_bench)" in r.stdout) == serving
    assert ("PROOF FINISHED" in r.stdout) == (not serving)
    assert (tmp_path / "out" / "serve-bench.json").is_file()


def test_serve_without_a_finished_proof_says_so(tmp_path):
    env = dict(os.environ, DFLASH_STASH=str(tmp_path / "stash"), OUT=str(tmp_path / "out"))
    r = subprocess.run(["bash", SCRIPT, "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3
    assert "no export of a finished proof on this machine" in r.stdout


def test_serve_measures_the_best_export_on_the_other_styles_prompts(tmp_path, chat_target):
    """`serve` runs serve_bench.py (on the CPU here, through SERVE_BENCH_ARGS) with the export of the proof whose
    last snapshot has the higher τ, on the trainer's other-styles prompts."""
    import json
    import shutil

    import torch
    from transformers import AutoConfig

    from dflash_trainer.export.exporter import export_checkpoint
    from dflash_trainer.loop.checkpoint import save_checkpoint
    from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig
    stash = tmp_path / "stash"
    shutil.copytree(chat_target, stash / "smollm2")
    cfg = DrafterConfig.from_target(AutoConfig.from_pretrained(chat_target), 1, [1, 3, 5], block_size=4,
                                    mask_token_id=511)
    torch.manual_seed(0)
    save_checkpoint(str(tmp_path / "train"), 1, DFlashDrafter(cfg).trainable_state_dict(), cfg.to_dict(),
                    {"step": 1}, keep=1)
    export_checkpoint(str(tmp_path / "train"), chat_target, str(tmp_path / "export"), dtype="float32")
    for report, tau, export in (("report", 2.0, tmp_path / "absent"), ("report-b", 2.5, tmp_path / "export")):
        (stash / report).mkdir()
        snapshots = [{"eval": {"tau": tau - 1}, "export": "older"}, {"eval": {"tau": tau}, "export": str(export)}]
        (stash / report / "proof.json").write_text(json.dumps({"snapshots": snapshots}))
    repo = os.path.join(os.path.dirname(SCRIPT), "..", "..")
    env = dict(os.environ, DFLASH_STASH=str(stash), OUT=str(tmp_path / "out"),
               SERVE_BENCH_ARGS="--device cpu --dtype float32 --num-prompts 2 --max-new-tokens 8")
    r = subprocess.run(["bash", SCRIPT, "serve"], env=env, capture_output=True, text=True, timeout=300, cwd=repo)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"serve_bench: {tmp_path / 'export'} on trainer/src/dflash_trainer/prep/other_styles.jsonl" in r.stdout
    report = json.load(open(stash / "serve-bench.json"))
    assert report["num_prompts"] == 2 and report["block_size"] == 4 and report["max_new_tokens"] == 8
    assert report["lossless"] and report["settings"]["drafter"] == str(tmp_path / "export")
    assert "speedup" in (stash / "serve-bench.log").read_text()


def test_serve_after_waits_for_the_proofs_of_this_machine_then_serves(tmp_path):
    """What SERVE_BENCH=1 starts detached at launch: `serve` only once no proof of this stash runs (here a stand-in
    proof that ends by itself; `serve` then finds no export and says so)."""
    stash = tmp_path / "stash"
    stash.mkdir()
    proof = subprocess.Popen(["bash", "-c", f"exec -a 'python3 -m proofs.proof_smollm2 --out {stash}/proof ' sleep 3"])
    try:
        env = dict(os.environ, DFLASH_STASH=str(stash), OUT=str(tmp_path / "out"))
        r = subprocess.run(["bash", SCRIPT, "serve-after"], env=env, capture_output=True, text=True, timeout=60)
        assert proof.poll() is not None  # it served only after the proof had ended
    finally:
        proof.kill()
        proof.wait()
    assert r.returncode == 3
    assert "no export of a finished proof on this machine" in r.stdout


def test_stash_data_puts_a_third_folders_data_where_launch_unpacks_it_and_refuses_an_empty_one(tmp_path):
    env = dict(os.environ, DFLASH_STASH=str(tmp_path / "stash"), OUT=str(tmp_path / "out"))
    folder = tmp_path / ".artifacts" / "dev-d"
    folder.mkdir(parents=True)
    r = subprocess.run(["bash", SCRIPT, "stash-data"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 3
    assert "no data*.tar* in .artifacts/dev-d" in r.stdout
    (folder / "data-01.tar.xz").write_bytes(b"xz")
    (folder / "data-baseline.tar").write_bytes(b"tar")
    (folder / "notes.txt").write_text("not data")
    r = subprocess.run(["bash", SCRIPT, "stash-data"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(os.listdir(tmp_path / "stash")) == ["data-01.tar.xz", "data-baseline.tar"]
    assert (tmp_path / "stash" / "data-01.tar.xz").read_bytes() == b"xz"
