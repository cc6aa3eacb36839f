"""device_proof.sh's refusals that need no GPU: a `watch` on a machine that was given back since the launch."""
import os
import subprocess

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "proofs", "device_proof.sh")


def test_watch_on_a_bare_machine_says_the_proof_is_gone_instead_of_finished(tmp_path):
    env = dict(os.environ, DFLASH_STASH=str(tmp_path / "stash"), OUT=str(tmp_path / "out"))
    r = subprocess.run(["bash", SCRIPT, "watch", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 3
    assert "given back since launch" in r.stdout
    assert "PROOF FINISHED" not in r.stdout


def test_watch_follows_a_proof_log_that_is_there(tmp_path):
    stash = tmp_path / "stash"
    stash.mkdir()
    (stash / "proof.log").write_text("[  1.0 s] data: {}\n")
    (stash / "proof").mkdir()
    env = dict(os.environ, DFLASH_STASH=str(stash), OUT=str(tmp_path / "out"))
    r = subprocess.run(["bash", SCRIPT, "watch", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "PROOF FINISHED" in r.stdout
    assert (tmp_path / "out" / "proof.log").read_text().startswith("[  1.0 s] data:")
