"""device_proof.sh without a GPU: `watch` on a machine that was given back since the launch, and following only
its own stash's proof (a process named as the proof stands in for it); `launch` refusing PROOF_C before anything
starts."""
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
