"""container/weights_stage called directly on real directories, with requests built by weights_backend.build_request
from model_weights' own defaults: plan, no-op, one changed shard, adoption, kill mid-copy, room and live-run
refusals, verify=full, and the manifest dflash-train reads."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

try:  # what dflash-train checks at start; ansible-test's units venv has no trainer (scripts/test's .venv has)
    from dflash_trainer.config import check_staged_manifest as trainer_accepts
except ImportError:
    def trainer_accepts(dest):
        return None

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import (
    weights_copy, weights_guards, weights_manifest, weights_stage)
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import weights_backend
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure

COLLECTIONS = os.path.dirname(os.path.abspath(weights_stage.__file__))
for _ in range(7):  # container → … → ansible_collections → the directory on sys.path
    COLLECTIONS = os.path.dirname(COLLECTIONS)
MB = 1 << 20


def write(path, size, seed=0):
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(str(path), "wb") as f:
        f.write(bytes((i * 131 + seed) % 251 for i in range(251)) * (size // 251) + b"x" * (size % 251))


@pytest.fixture
def model(tmp_path):
    src = tmp_path / "store" / "M"
    write(src / "config.json", 50)
    write(src / "tokenizer.json", 3000)
    write(src / "model-00001-of-00002.safetensors", 3 * MB, seed=1)
    write(src / "model-00002-of-00002.safetensors", 2 * MB, seed=2)
    write(src / ".cache" / "huggingface" / "x.lock", 1)  # skipped: dot-names
    (tmp_path / "shm").mkdir()
    return src


def req(tmp_path, **params):
    p = weights_backend.argument_spec().defaults()
    p.update(source=str(tmp_path / "store" / "M"), dest=str(tmp_path / "shm" / "M"), transport="local",
             runs_root=str(tmp_path / "runs"), lock_timeout=5)
    check_mode, diff = params.pop("check_mode", False), params.pop("diff", False)
    p.update(params)
    return weights_backend.build_request(p, check_mode=check_mode, diff=diff)


def stage(tmp_path, **params):
    return weights_stage.stage(req(tmp_path, **params))


def staged_files(dest):
    return dict((rel, open(os.path.join(dest, rel), "rb").read()) for rel in weights_stage.scan_files(dest))


def source_files(src):
    return dict((rel, open(os.path.join(str(src), rel), "rb").read()) for rel in weights_manifest.scan_source(str(src)))


def siblings(tmp_path):
    return sorted(os.listdir(str(tmp_path / "shm")))


def test_first_stage_copies_everything_behind_a_symlink_with_a_complete_manifest(tmp_path, model):
    dest = str(tmp_path / "shm" / "M")
    res = stage(tmp_path)
    assert res["changed"] and res["linked"] == [] and res["bytes_copied"] == res["bytes_total"] == 5 * MB + 3050
    assert res["copied"] == ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                             "tokenizer.json"]
    assert os.path.islink(dest) and os.path.realpath(dest) == res["version"]
    assert staged_files(dest) == source_files(model)
    manifest = weights_manifest.read_manifest(dest)
    assert manifest["complete"] is True and manifest["hash"] == res["hash_algorithm"] == "xxh3_128"
    assert manifest["files"]["config.json"]["hash"] == weights_manifest.hash_file(str(model / "config.json"),
                                                                                  "xxh3_128")
    assert siblings(tmp_path) == [".M.lock", os.path.basename(res["version"]), "M"]
    # what dflash-train checks at start (it does not import the collection; same format, its own reader)
    trainer_accepts(dest)


def test_check_mode_plans_and_writes_nothing(tmp_path, model):
    res = stage(tmp_path, check_mode=True, diff=True)
    assert res["changed"] and res["bytes_copied"] == 5 * MB + 3050 and len(res["copied"]) == 4
    assert "model-00001-of-00002.safetensors %d\n" % (3 * MB) in res["diff"]["after"] and res["diff"]["before"] == ""
    assert siblings(tmp_path) == []


def test_unchanged_source_is_a_noop_that_reads_no_shard(tmp_path, model):
    first = stage(tmp_path)
    os.chmod(str(model / "model-00001-of-00002.safetensors"), 0)  # reading it would now fail (when not root)
    for check_mode in (True, False):
        res = stage(tmp_path, check_mode=check_mode)
        assert not res["changed"] and res["copied"] == res["linked"] == [] and res["bytes_copied"] == 0, res
        assert res["version"] == first["version"]
    assert siblings(tmp_path) == [".M.lock", os.path.basename(first["version"]), "M"]


def test_one_changed_shard_is_the_only_one_copied(tmp_path, model):
    first = stage(tmp_path)
    shard = "model-00002-of-00002.safetensors"
    write(model / shard, 2 * MB + 7, seed=9)
    res = stage(tmp_path, diff=True)
    assert res["changed"] and res["copied"] == [shard] and res["bytes_copied"] == 2 * MB + 7
    assert sorted(res["linked"]) == ["config.json", "model-00001-of-00002.safetensors", "tokenizer.json"]
    dest = str(tmp_path / "shm" / "M")
    assert staged_files(dest) == source_files(model)
    # linked, not copied: the unchanged shard is the same inode as in the first version (which is gone)
    assert os.stat(os.path.join(dest, "config.json")).st_nlink == 1 and not os.path.exists(first["version"])
    assert "%s %d\n" % (shard, 2 * MB) in res["diff"]["before"] and "%s %d\n" % (shard, 2 * MB + 7) in \
        res["diff"]["after"]


def test_same_size_new_content_is_found_by_content_and_a_removed_file_is_dropped(tmp_path, model):
    stage(tmp_path)
    shard = "model-00001-of-00002.safetensors"
    write(model / shard, 3 * MB, seed=5)  # same size, new mtime and content
    os.unlink(str(model / "tokenizer.json"))
    res = stage(tmp_path)
    assert res["copied"] == [shard] and res["mismatched"] == [shard] and res["removed"] == ["tokenizer.json"]
    assert staged_files(str(tmp_path / "shm" / "M")) == source_files(model)


def test_hand_made_stage_is_adopted_without_copying_what_matches(tmp_path, model):
    dest = tmp_path / "shm" / "M"
    subprocess.run(["cp", "-r", str(model), str(dest)], check=True)  # today's stage: cp -r, new mtimes
    write(dest / "model-00002-of-00002.safetensors", 2 * MB, seed=7)  # one damaged file
    inode = os.stat(str(dest / "model-00001-of-00002.safetensors")).st_ino
    res = stage(tmp_path)
    assert res["changed"] and res["copied"] == ["model-00002-of-00002.safetensors"] == res["mismatched"]
    assert os.path.islink(str(dest)) and staged_files(str(dest)) == source_files(model)
    assert os.stat(str(dest / "model-00001-of-00002.safetensors")).st_ino == inode  # linked, not copied
    assert siblings(tmp_path) == [".M.lock", os.path.basename(res["version"]), "M"]
    assert not stage(tmp_path)["changed"]


def test_verify_full_finds_a_corrupted_byte_and_copies_only_that_file(tmp_path, model):
    stage(tmp_path)
    assert not stage(tmp_path, verify="full")["changed"]
    shard = str(tmp_path / "shm" / "M" / "model-00001-of-00002.safetensors")
    os.chmod(shard, 0o644)
    with open(shard, "r+b") as f:  # same size, same mtime in the manifest: only a content hash can tell
        f.seek(MB)
        byte = f.read(1)
        f.seek(MB)
        f.write(bytes([byte[0] ^ 1]))
    assert not stage(tmp_path)["changed"]  # verify=size trusts names, sizes and mtimes
    res = stage(tmp_path, verify="full")
    assert res["changed"] and res["mismatched"] == ["model-00001-of-00002.safetensors"] == res["copied"]
    assert len(res["verified"]) == 4
    assert staged_files(str(tmp_path / "shm" / "M")) == source_files(model)


def staged_then_grown(tmp_path, model, mb):
    """Stage the model, then make its last shard a sparse file of mb MiB: quick to make, slow enough to copy that
    a test catches the next staging mid-way. Returns (first result, dest, the staged files before)."""
    first = stage(tmp_path)
    dest = str(tmp_path / "shm" / "M")
    before = staged_files(dest)
    with open(str(model / "model-00002-of-00002.safetensors"), "wb") as f:
        f.truncate(mb * MB)
    return first, dest, before


def test_kill_mid_copy_keeps_the_previous_copy_served_and_the_next_run_cleans_up(tmp_path, model):
    first, dest, before = staged_then_grown(tmp_path, model, 768)
    code = ("import json,sys; sys.path.insert(0, %r)\n"
            "from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import weights_stage\n"
            "weights_stage.main(json.loads(sys.argv[1]))" % COLLECTIONS)
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(req(tmp_path, threads=1))])
    partial = None
    deadline = time.monotonic() + 30
    while partial is None and time.monotonic() < deadline and proc.poll() is None:
        for name in siblings(tmp_path):
            path = os.path.join(str(tmp_path / "shm"), name, "model-00002-of-00002.safetensors")
            if name.startswith(".M.tmp-") and os.path.exists(path) and 0 < os.path.getsize(path) < 768 * MB:
                partial = name
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert partial, "never saw the copy in progress"
    assert os.path.realpath(dest) == first["version"] and staged_files(dest) == before
    trainer_accepts(dest)  # still complete for the trainer
    res = stage(tmp_path)
    assert os.path.join(str(tmp_path / "shm"), partial) in res["cleaned"]
    assert res["copied"] == ["model-00002-of-00002.safetensors"]
    assert siblings(tmp_path) == [".M.lock", os.path.basename(res["version"]), "M"]


def test_copy_reads_through_a_mapping_or_a_buffer_with_the_same_hash_and_checks_the_source(tmp_path, monkeypatch):
    src = tmp_path / "src"
    write(src, 3 * MB + 7, seed=3)
    st = os.stat(str(src))
    expect = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    algo = weights_manifest.hash_algorithm()
    never = threading.Event()
    mapped = weights_copy.copy_hashing(str(src), str(tmp_path / "a"), algo, expect, never)
    assert mapped == weights_manifest.hash_file(str(src), algo)
    assert (tmp_path / "a").read_bytes() == src.read_bytes() and os.stat(str(tmp_path / "a")).st_mode & 0o777 == 0o444
    with pytest.raises(FileExistsError):  # O_EXCL: never into a file that is already there
        weights_copy.copy_hashing(str(src), str(tmp_path / "a"), algo, expect, never)
    for changed in (dict(expect, mtime_ns=expect["mtime_ns"] - 1), dict(expect, size=expect["size"] + 1)):
        with pytest.raises(weights_copy.SourceChanged):
            weights_copy.copy_hashing(str(src), str(tmp_path / ("c%d" % changed["size"])), algo, changed, never)
    aborted = threading.Event()
    aborted.set()
    with pytest.raises(InterruptedError):
        weights_copy.copy_hashing(str(src), str(tmp_path / "x"), algo, expect, aborted)
    monkeypatch.setattr(weights_copy, "_map", lambda fin: None)  # a filesystem without mmap: read into a buffer
    assert weights_copy.copy_hashing(str(src), str(tmp_path / "b"), algo, expect, never) == mapped
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    st = os.stat(str(empty))
    monkeypatch.undo()
    assert weights_copy.copy_hashing(str(empty), str(tmp_path / "e"), algo,
                                     {"size": 0, "mtime_ns": st.st_mtime_ns}, never) == weights_manifest.hash_file(
        str(empty), algo)


class Module(object):
    def __init__(self, **params):
        self.params, self.check_mode, self._diff = params, False, False


def test_source_truncated_mid_copy_fails_with_its_cause_and_replaces_nothing(tmp_path, model):
    first, dest, before = staged_then_grown(tmp_path, model, 1536)
    big = model / "model-00002-of-00002.safetensors"
    params = weights_backend.argument_spec().defaults()
    params.update(source=str(model), dest=dest, transport="local", runs_root=str(tmp_path / "runs"), threads=1,
                  python=sys.executable)
    out = {}

    def run():
        try:
            out["result"] = weights_backend.stage_weights(Module(**params))
        except ModuleFailure as exc:
            out["error"] = exc
    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 30
    caught = False
    while not caught and time.monotonic() < deadline and t.is_alive():
        for name in siblings(tmp_path):
            path = os.path.join(str(tmp_path / "shm"), name, big.name)
            if name.startswith(".M.tmp-") and os.path.exists(path) and 0 < os.path.getsize(path) < 1024 * MB:
                os.truncate(str(big), MB)  # in place, as cp or rsync --inplace over the shard would
                caught = True
                break
        time.sleep(0.001)
    t.join(60)
    assert caught, "never saw the copy in progress"
    msg = str(out["error"])  # the write past the new end (EFAULT), else the hash's read (SIGBUS), else size/mtime
    assert "source file %s shrank while it was copied" % big in msg or "changed while it was copied" in msg or \
        "the stager died of SIGBUS, which a source file under %s shrinking" % model in msg, msg
    assert out["error"].facts["staged"] == dest
    assert os.path.realpath(dest) == first["version"] and staged_files(dest) == before
    res = stage(tmp_path)
    assert res["copied"] == [big.name] and siblings(tmp_path) == [".M.lock", os.path.basename(res["version"]), "M"]


@pytest.mark.parametrize("rc", [-7, 135])
def test_a_stager_killed_by_sigbus_is_reported_as_a_source_that_shrank(tmp_path, monkeypatch, rc):
    def died(*a, **k):
        raise ModuleFailure("the lifecycle script failed in the local host (exit %d): no output" % rc)
    monkeypatch.setattr(weights_backend, "call_in_container", died)
    params = weights_backend.argument_spec().defaults()
    params.update(source="/store/M", dest="/dev/shm/M", transport="local")
    with pytest.raises(ModuleFailure) as exc:
        weights_backend.stage_weights(Module(**params))
    assert str(exc.value).startswith("model_weights /dev/shm/M: the stager died of SIGBUS, which a source file "
                                     "under /store/M shrinking while it was copied causes; nothing was replaced")
    assert exc.value.facts == {"staged": "/dev/shm/M"}


def test_memory_cgroup_too_small_is_refused_with_the_numbers(tmp_path, model, monkeypatch):
    cg = tmp_path / "cgroup"
    cg.mkdir()
    (cg / "memory.max").write_text("%d\n" % (64 * MB))
    (cg / "memory.current").write_text("%d\n" % (63 * MB))
    (cg / "memory.stat").write_text("anon 1000\nfile %d\nshmem %d\n" % (3 * MB, 2 * MB))  # 1 MB reclaimable
    monkeypatch.setattr(weights_guards, "CGROUP_ROOT", str(cg))
    with pytest.raises(weights_guards.RefusedError) as exc:
        stage(tmp_path)
    msg = str(exc.value)
    assert "\n" not in msg and "not enough room to stage %d bytes" % (5 * MB + 3050) in msg
    assert "memory limit of %d bytes (0.07 GB) leaves %d bytes (0.00 GB)" % (64 * MB, 2 * MB) in msg
    assert "pct set <vmid> --memory" in msg
    assert exc.value.facts["memory_available_bytes"] == 2 * MB and exc.value.facts["memory_limit_bytes"] == 64 * MB
    assert siblings(tmp_path) == [".M.lock"]  # refused before anything was made


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_small_tmpfs_is_refused_with_the_numbers(tmp_path, model):
    shm = tmp_path / "shm"
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(shm)], check=True)
    try:
        with pytest.raises(weights_guards.RefusedError) as exc:
            stage(tmp_path)
        assert "%s has %d bytes (0.00 GB) free" % (shm, exc.value.facts["free_bytes"]) in str(exc.value)
        assert "enlarge that tmpfs" in str(exc.value)
        assert exc.value.facts["free_bytes"] <= 4 * MB < exc.value.facts["needed_bytes"]
        assert siblings(tmp_path) == [".M.lock"]
        with pytest.raises(weights_guards.RefusedError) as exc:
            stage(tmp_path, dest=str(shm))
        assert "%s is a mount point; stage into a directory inside it" % shm in str(exc.value)
    finally:
        subprocess.run(["umount", str(shm)], check=True)


def test_live_run_using_the_weights_is_refused_unless_forced(tmp_path, model):
    first = stage(tmp_path)
    dest = str(tmp_path / "shm" / "M")
    argv = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)", "--target-model=" + dest]
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        # Until the child has exec'd, /proc/PID/cmdline is pytest's and the run does not look live (flaky in CI).
        assert proc.stdout.readline().strip() == b"ready"
        (run_dir / "launch.json").write_text(json.dumps({"argv": argv}))
        (run_dir / "pid").write_text(str(proc.pid))
        write(model / "model-00002-of-00002.safetensors", 2 * MB, seed=3)
        with pytest.raises(weights_guards.RefusedError) as exc:
            stage(tmp_path)
        assert "live run r1 (pid %d)" % proc.pid in str(exc.value) and "force=true" in str(exc.value)
        assert os.path.realpath(dest) == first["version"]
        res = stage(tmp_path, force=True)
        assert res["changed"] and res["live_runs"] == ["r1"] and res["copied"] == ["model-00002-of-00002.safetensors"]
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_main_prints_one_json_line_with_the_refusal(tmp_path, capsys):
    (tmp_path / "shm").mkdir()
    weights_stage.main(req(tmp_path))
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1
    res = json.loads(out[0])
    assert res["failed"] and "source %s is not a directory" % (tmp_path / "store" / "M") in res["msg"]


@pytest.mark.parametrize("params,needle", [
    ({"dest": "/Qwen"}, "must be a directory to create inside an existing one"),
    ({"dest": "/dev/shm/.hidden"}, "not starting with"),
    ({"source": "relative/M"}, "source must be an absolute path"),
    ({"dest": "/mnt/models/M/staged", "source": "/mnt/models/M"}, "overlap"),
    ({"threads": 0}, "threads must be between 1 and 64"),
])
def test_bad_requests_are_refused_on_the_controller(tmp_path, params, needle):
    with pytest.raises(ValueError) as exc:
        req(tmp_path, **params)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_the_copy_keeps_its_progress_in_the_file_the_role_follows(tmp_path, model):
    progress = tmp_path / "shm" / ".M.progress.json"
    first = stage(tmp_path, progress_file=str(progress))
    kept = json.loads(progress.read_text())
    assert kept["phase"] == "copied" and kept["copied_bytes"] == kept["total_bytes"] == first["bytes_copied"]
    assert kept["mb_per_s"] > 0
    write(model / "model-00002-of-00002.safetensors", 2 * MB, seed=9)  # one shard changed: only it is copied
    stage(tmp_path, progress_file=str(progress))
    assert json.loads(progress.read_text())["total_bytes"] == 2 * MB
    progress.unlink()
    stage(tmp_path, progress_file=str(progress))  # nothing to copy: the last phase it reached
    assert json.loads(progress.read_text())["phase"] == "planning"
    stage(tmp_path, progress_file=str(progress), check_mode=True, force=True)
    assert json.loads(progress.read_text())["phase"] == "planning"  # check mode writes nothing
    assert sorted(os.listdir(tmp_path / "shm"))[:2] == [".M.lock", ".M.progress.json"]  # no temp file left
