"""The in-container trainer install on real virtual environments in a tmp dir: python -m venv, real pip installing a
tiny wheel offline (--no-index), the link switched only after `dflash-train --help` ran, failures leaving the previous
environment in place, no-op on the same key, reuse of a kept environment, pruning, adoption of a hand-made venv."""
import errno
import glob
import hashlib
import json
import os
import subprocess
import sys
import zipfile

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import trainer_install, trainer_venvs


def make_wheel(directory, version="0.1.0", help_rc=0, corrupt=False):
    """A minimal dflash_trainer wheel whose dflash-train prints its version (and exits help_rc)."""
    name = "dflash_trainer-%s-py3-none-any.whl" % version
    path = os.path.join(str(directory), name)
    if corrupt:
        with open(path, "wb") as f:
            f.write(b"PK\x03\x04 this is not a wheel")
        return path
    info = "dflash_trainer-%s.dist-info" % version
    files = {
        "dflash_trainer/__init__.py": "__version__ = %r\n" % version,
        "dflash_trainer/cli.py": "import sys\ndef main():\n    print('usage: dflash-train %s')\n"
                                 "    sys.exit(%d)\n" % (version, help_rc),
        "dflash_trainer/not_imported.py": "# no --help imports this: only pip's byte-compiling makes its .pyc\n",
        info + "/METADATA": "Metadata-Version: 2.1\nName: dflash_trainer\nVersion: %s\n" % version,
        info + "/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        info + "/entry_points.txt": "[console_scripts]\ndflash-train = dflash_trainer.cli:main\n",
    }
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in files.items():
            z.writestr(arc, text)
        z.writestr(info + "/RECORD", "".join("%s,,\n" % arc for arc in files) + info + "/RECORD,,\n")
    return path


@pytest.fixture(autouse=True)
def bytecode_in_the_venv(monkeypatch):
    """pip's byte-compiling writes into the venv's __pycache__ (where the container's trainer finds it), unless
    PYTHONPYCACHEPREFIX sends it elsewhere: scripts/test sets that for its own processes, not the container's."""
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)


def compiled(venv):
    """Byte-compiled modules of the installed package that nothing imported."""
    found = glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "dflash_trainer", "__pycache__",
                                   "not_imported.*.pyc"))
    return [os.path.basename(p).split(".")[0] for p in found]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class Box(object):
    """venvs_root + link in a tmp dir, and a helper that stages a wheel and installs it like the backend does."""

    def __init__(self, tmp_path, keep=3):
        self.tmp = tmp_path
        self.root = str(tmp_path / "opt" / "venvs")
        self.link = str(tmp_path / "opt" / "venv")
        self.keep = keep
        os.makedirs(self.root)

    def request(self, wheel, action="install", key=None, **extra):
        digest = hashlib.sha256(("%s|%s" % (os.path.basename(wheel), sha256(wheel))).encode()).hexdigest()
        key = key or digest[:16]
        req = {"action": action, "key": key, "source_hash": digest, "version": os.path.basename(wheel).split("-")[1],
               "wheel_name": os.path.basename(wheel), "wheel_sha256": sha256(wheel), "venvs_root": self.root,
               "link": self.link, "keep": self.keep, "pins": [], "no_index": True,
               "find_links": [os.path.join(self.root, trainer_install.STAGING_PREFIX + key)], "pip_timeout": 300}
        req.update(extra)
        return req

    def install(self, wheel, **extra):
        req = self.request(wheel, **extra)
        planned = trainer_install.plan(dict(req, action="plan", prepare=True))
        if planned.get("staging"):
            with open(wheel, "rb") as src, open(os.path.join(planned["staging"], req["wheel_name"]), "wb") as dst:
                dst.write(src.read())
        return trainer_install.install(req)

    def help(self):
        return subprocess.run([os.path.join(self.link, "bin", "dflash-train"), "--help"], capture_output=True,
                              text=True)

    def venvs(self):
        return sorted(n for n in os.listdir(self.root))


def test_install_noop_broken_wheel_corrupt_wheel_reuse_and_prune(tmp_path):
    box = Box(tmp_path, keep=3)
    # A hand-made venv at the link (as in CT 200 today, and in the harness's golden container) is adopted.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", box.link], check=True)
    open(os.path.join(box.link, "hand-made"), "w").close()
    w1 = make_wheel(tmp_path, "0.1.0")
    first = box.install(w1)
    assert first["changed"] and first["installed"] and first["link_kind"] == "directory", first
    adopted = first["adopted"]
    assert adopted.startswith(os.path.join(box.root, "adopted-")) and os.path.exists(os.path.join(adopted, "hand-made"))
    assert subprocess.run([os.path.join(adopted, "bin", "python"), "-c", "pass"]).returncode == 0
    assert os.readlink(box.link) == first["venv"] and box.help().stdout.strip() == "usage: dflash-train 0.1.0"
    record = json.load(open(os.path.join(first["venv"], "dflash-install.json")))
    assert record["version"] == "0.1.0" and record["source_hash"].startswith(first["key"]) and record["installed_at"]
    assert box.venvs() == sorted([first["key"], os.path.basename(adopted)])  # the staging directory is gone
    assert compiled(first["venv"]) == ["not_imported"]  # pip's default: every installed module byte-compiled

    again = box.install(w1)
    assert again["changed"] is False and again["up_to_date"] and not again["installed"], again
    assert box.venvs() == sorted([first["key"], os.path.basename(adopted)])
    before = box.venvs()

    # A wheel whose dflash-train --help fails: refused, the half-built venv removed, the link untouched.
    os.makedirs(tmp_path / "b")
    broken = make_wheel(tmp_path / "b", "0.2.0", help_rc=3)
    with pytest.raises(trainer_install.InstallError, match=r"dflash-train --help failed \(exit 3\)"):
        box.install(broken)
    assert os.readlink(box.link) == first["venv"] and box.help().returncode == 0 and box.venvs() == before

    # A pin the offline wheelhouse cannot satisfy: pip fails; same guarantees.
    with pytest.raises(trainer_install.InstallError, match="pip install of the trainer failed") as exc:
        box.install(w1, key="f" * 16, pins=["dflash-no-such-package==1.0"])
    assert any("dflash-no-such-package" in line for line in exc.value.facts["output_tail"])
    assert os.readlink(box.link) == first["venv"] and box.help().returncode == 0 and box.venvs() == before

    # Not a wheel at all: refused before a venv is made.
    os.makedirs(tmp_path / "c")
    with pytest.raises(trainer_install.InstallError, match="is not a wheel"):
        box.install(make_wheel(tmp_path / "c", "0.2.0", corrupt=True))
    assert os.readlink(box.link) == first["venv"] and box.venvs() == before

    # Old environments beyond keep=3 are pruned, oldest first; never the new one nor the previous one (a run may still use it).
    for i, name in enumerate(["old-a", "old-b"]):
        os.makedirs(os.path.join(box.root, name))
        open(os.path.join(box.root, name, "pyvenv.cfg"), "w").close()
        with open(os.path.join(box.root, name, "dflash-install.json"), "w") as f:
            json.dump({"version": "0.0.%d" % i, "installed_at": 1000 + i}, f)
    os.makedirs(tmp_path / "d")
    w2 = make_wheel(tmp_path / "d", "0.2.0")
    second = box.install(w2, compile_bytecode=False)  # pip --no-compile (the harness inventory's choice)
    assert second["installed"] and second["previous"] == first["venv"], second
    assert compiled(second["venv"]) == []
    # kept: the new one, the previous one, and the newest other (the adopted one: no record, so its mtime counts)
    assert sorted(second["pruned"]) == [os.path.join(box.root, "old-a"), os.path.join(box.root, "old-b")]
    assert box.venvs() == sorted([first["key"], second["key"], os.path.basename(adopted)])
    assert box.help().stdout.strip() == "usage: dflash-train 0.2.0"

    # Going back to a kept environment reuses it: no pip, the link switches.
    back = box.install(w1)
    assert back["changed"] and back["reusable"] and not back["installed"] and back["pruned"] == []
    assert box.help().stdout.strip() == "usage: dflash-train 0.1.0"


def test_check_mode_plan_changes_nothing_and_a_bad_copy_is_refused(tmp_path):
    box = Box(tmp_path)
    wheel = make_wheel(tmp_path, "0.1.0")
    planned = trainer_install.plan(box.request(wheel, action="plan", prepare=True, check_mode=True))
    assert planned["changed"] and not planned["up_to_date"] and "staging" not in planned
    assert box.venvs() == [] and not os.path.lexists(box.link)
    req = box.request(wheel)
    staging = trainer_install.plan(dict(req, prepare=True))["staging"]
    with open(os.path.join(staging, req["wheel_name"]), "wb") as f:
        f.write(b"truncated")
    with pytest.raises(trainer_install.InstallError, match="does not match its sha256"):
        trainer_install.install(req)
    assert box.venvs() == [] and not os.path.lexists(box.link)


def test_a_file_at_the_link_is_refused_and_main_reports_one_json_line(tmp_path, capsys):
    box = Box(tmp_path)
    open(box.link, "w").close()
    trainer_install.main(box.request(make_wheel(tmp_path), action="plan"))
    out = json.loads(capsys.readouterr().out)
    assert out["failed"] and out["msg"].startswith("%s exists and is neither a directory nor a symlink" % box.link)


def test_prunable_never_takes_a_protected_environment(tmp_path):
    root = tmp_path / "venvs"
    for i, name in enumerate(["a", "b", "c", "d"]):
        (root / name).mkdir(parents=True)
        (root / name / "pyvenv.cfg").write_text("")
        (root / name / "dflash-install.json").write_text(json.dumps({"installed_at": 100 + i}))
    (root / ".staging-x").mkdir()
    assert trainer_venvs.prunable(str(root), 2, [str(root / "a"), str(root / "d")]) == [str(root / "b"),
                                                                                      str(root / "c")]
    assert trainer_venvs.prunable(str(root), 1, [str(root / "a")]) == [str(root / "b"), str(root / "c"),
                                                                     str(root / "d")]
    assert trainer_venvs.prunable(str(root), 3, [str(root / "d")]) == [str(root / "a")]


def test_a_second_install_waits_for_the_first_then_says_it_is_stuck(tmp_path):
    """One install per container: while another holds the lock, an install waits up to pip_timeout, then fails
    with one line naming the lock, before touching anything."""
    from ansible_collections.dflash.ops.plugins.module_utils._dflash.container.file_lock import FileLock
    venvs_root = tmp_path / "venvs"
    venvs_root.mkdir()
    req = {"action": "install", "venvs_root": str(venvs_root), "pip_timeout": 1}
    with FileLock(str(venvs_root / trainer_install.LOCK_NAME), 1, RuntimeError):
        with pytest.raises(trainer_install.InstallError) as refused:
            trainer_install._handle(req)
    msg = str(refused.value)
    assert "another trainer install in this container held" in msg and trainer_install.LOCK_NAME in msg
    assert "\n" not in msg and os.listdir(str(venvs_root)) == [trainer_install.LOCK_NAME]


def test_the_install_keeps_its_phase_in_the_file_the_role_follows(tmp_path):
    box = Box(tmp_path)
    progress = os.path.join(box.root, ".install-progress.json")
    installed = box.install(make_wheel(tmp_path, "0.1.0"), progress_file=progress)
    assert installed["installed"]
    with open(progress) as f:
        assert json.load(f)["phase"] == "switching %s" % box.link  # the last phase it went through
    assert box.venvs() == [".install-progress.json", installed["key"]]  # a dot file: never taken for a venv


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts an overlayfs (root)")
def test_adopting_a_venv_of_an_overlay_lower_layer_copies_it_when_rename_is_refused(tmp_path):
    """overlayfs without redirect_dir refuses to rename a directory of its lower layer (EXDEV): adopt() copies it,
    links kept as links, then removes the original. (The harness's container clones mount with redirect_dir=on, as
    fast as a real rootfs, so this path is tested here.)"""
    lower, upper, work, merged = (tmp_path / n for n in ("lower", "upper", "work", "merged"))
    venv = lower / "opt" / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python3").write_text("#!/bin/sh\n")
    os.symlink("python3", str(venv / "bin" / "python"))
    for d in (upper, work, merged):
        d.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", "lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=off"
                    % (lower, upper, work), str(merged)], check=True)
    try:
        link, venvs_root = merged / "opt" / "venv", merged / "opt" / "venvs"
        venvs_root.mkdir()
        with pytest.raises(OSError) as refused:  # what adopt() meets first
            os.rename(str(link), str(venvs_root / "probe"))
        assert refused.value.errno == errno.EXDEV
        dest = trainer_venvs.adopt(str(link), str(venvs_root), 0)
        assert os.path.basename(dest) == "adopted-19700101-000000" and not os.path.lexists(str(link))
        assert os.readlink(os.path.join(dest, "bin", "python")) == "python3"
        assert sorted(os.listdir(str(venvs_root))) == ["adopted-19700101-000000"]  # no .tmp left
    finally:
        subprocess.run(["umount", str(merged)], check=True)
