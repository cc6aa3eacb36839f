"""stage_weights.yml through the real chain (ansible-playbook -> ssh -tt -> pct -> lxc-attach) into a real
container's /dev/shm: stage, re-run no-op, one changed shard, SIGKILL mid-copy, a tmpfs too small."""
import threading
import time

import pytest

from harness.fixtures import REPO_ROOT

pytestmark = pytest.mark.containers
PLAY = REPO_ROOT / "playbooks" / "stage_weights.yml"
STORE = "/workspace/store/M"
DEST = "/dev/shm/M"
TASK = "Model weights " + DEST
MB = 1 << 20


def make_store(ct, big_mb=8):
    ct.sh(f"mkdir -p {STORE} && echo '{{\"vocab_size\": 8}}' > {STORE}/config.json && "
          f"head -c {4 * MB} /dev/urandom > {STORE}/model-1.safetensors && "
          f"head -c {big_mb * MB} /dev/urandom > {STORE}/model-2.safetensors")


def stage(play, dest=DEST, **extra):
    r = play(PLAY, {"dflash_model_source": STORE, "dflash_model_dest": dest, **extra}, limit="ct200")
    return r.outcome("Model weights " + dest), r.task("Model weights " + dest)


def staged_sums(ct, dest=DEST):
    return ct.sh(f"cd {dest}/ && sha256sum * | sort").stdout


def test_stage_noop_and_one_changed_shard(play, make_container):
    ct = make_container(200)
    make_store(ct)
    outcome, res = stage(play)
    assert outcome == "ok" and res["changed"] and len(res["copied"]) == 3, res
    assert ct.sh(f"readlink {DEST}").stdout.strip().startswith(".M.v")
    assert staged_sums(ct) == ct.sh(f"cd {STORE}/ && sha256sum * | sort").stdout
    manifest = ct.read_json(f"{DEST}/.dflash-manifest.json")
    assert manifest["complete"] is True and manifest["hash"] == res["hash_algorithm"] == "blake2b-128"  # no xxhash
    outcome, res = stage(play)
    assert outcome == "ok" and not res["changed"] and res["copied"] == []
    ct.sh(f"head -c {MB} /dev/urandom > {STORE}/model-2.safetensors")
    outcome, res = stage(play)
    assert outcome == "ok" and res["changed"] and res["copied"] == ["model-2.safetensors"], res
    assert sorted(res["linked"]) == ["config.json", "model-1.safetensors"]
    assert staged_sums(ct) == ct.sh(f"cd {STORE}/ && sha256sum * | sort").stdout


def test_kill_mid_copy_keeps_the_staged_copy(play, make_container):
    ct = make_container(200)
    make_store(ct)
    assert stage(play)[0] == "ok"
    before = staged_sums(ct)
    version = ct.sh(f"readlink {DEST}").stdout.strip()
    ct.sh(f"truncate -s 1500M {STORE}/model-2.safetensors")  # sparse: a long copy into /dev/shm
    out = {}
    t = threading.Thread(target=lambda: out.update(r=stage(play, dflash_stage_threads=1)))
    t.start()
    killed = None
    deadline = time.monotonic() + 60
    while killed is None and time.monotonic() < deadline:
        p = ct.sh("ls -d /dev/shm/.M.tmp-*/model-2.safetensors 2>/dev/null && pgrep -f 'importlib[.]abc'", check=False)  # [.]: not this shell
        pids = [int(x) for x in p.stdout.split()[1:]] if p.returncode == 0 else []
        if pids:
            ct.sh(" ".join(["kill", "-KILL"] + [str(pid) for pid in pids]))
            killed = pids
        time.sleep(0.05)
    t.join(120)
    assert killed, "never caught the copy in progress"
    assert out["r"][0] == "failed"
    assert ct.sh(f"readlink {DEST}").stdout.strip() == version and staged_sums(ct) == before
    ct.sh(f"truncate -s {MB} {STORE}/model-2.safetensors")
    outcome, res = stage(play)
    assert outcome == "ok" and res["copied"] == ["model-2.safetensors"] and res["cleaned"], res
    assert ct.sh("ls -a /dev/shm | grep '^.M.tmp-' || true").stdout == ""


def test_dev_shm_too_small_is_refused_with_the_numbers(play, make_container):
    ct = make_container(200)
    make_store(ct)
    ct.sh("mkdir -p /mnt/small && mount -t tmpfs -o size=4m tmpfs /mnt/small")
    outcome, res = stage(play, dest="/mnt/small/M")
    needed = 12 * MB + len('{"vocab_size": 8}\n')
    assert outcome == "failed" and "not enough room to stage %d bytes" % needed in res["msg"], res
    assert "/mnt/small has %d bytes (0.00 GB) free" % res["free_bytes"] in res["msg"], res["msg"]
    assert "enlarge that tmpfs" in res["msg"] and res["needed_bytes"] == needed and res["free_bytes"] <= 4 * MB
    assert ct.sh("ls -A /mnt/small").stdout == ".M.lock\n"
