"""The tarball is the collection: build it, install it where nothing of the checkout is visible, check what it
holds, and run the playbooks from the installed copy with its own inventories/local."""
import glob
import os
import subprocess
import tarfile

import pytest
from ansible_helpers import BIN, ROOT, live_pids_with

pytestmark = pytest.mark.timeout(300)

REQUIRED = ["LICENSE", "README.md", "requirements.txt", "meta/runtime.yml", "changelogs/changelog.yaml",
            "roles/training/tasks/main.yml", "roles/training/meta/argument_specs.yml",
            "inventories/local/hosts.yml", "inventories/local/group_vars/dflash_training.yml",
            "trainer/pyproject.toml", "trainer/README.md"]
# Left out of the tarball: development, tests, harness, benchmarks and their results, other inventories.
# tests/sanity is the exception: ansible-test reads its ignore files (each line with its reason) from there.
KEPT_UNDER_TESTS = "tests/sanity/"
FORBIDDEN_PREFIXES = ("tests/unit/", "tests/integration/", "tests/harness/", "tests/containers/", "molecule/", "scripts/", "benchmarks/", ".ci/", "trainer/tests/",
                      "trainer/benchmarks/", "trainer/proofs/", "trainer/results/", "inventories/example/",
                      "inventories/harness/", ".venv/",
                      ".collections/", ".ansible/", ".artifacts/", ".cache/")
FORBIDDEN_PARTS = ("__pycache__", ".egg-info", ".pytest_cache")


def _env(collections):
    """ansible from this virtual environment; nothing of the checkout's configuration (scripts/test exports
    ANSIBLE_CONFIG=<checkout>/ansible.cfg, which must not leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(PATH=BIN + os.pathsep + os.environ.get("PATH", ""), ANSIBLE_COLLECTIONS_PATH=str(collections),
               ANSIBLE_NOCOLOR="1", ANSIBLE_RETRY_FILES_ENABLED="False")
    return env


def _run(args, env, cwd):
    proc = subprocess.run(args, env=env, cwd=str(cwd), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, "%s failed (rc %d):\n%s\n%s" % (args, proc.returncode, proc.stdout[-3000:],
                                                                proc.stderr[-3000:])
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(tarball, installed collection root, env, a work directory outside the checkout)."""
    tmp = tmp_path_factory.mktemp("tarball")
    work = tmp / "work"
    work.mkdir()
    collections = tmp / "collections"
    env = _env(collections)
    _run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--output-path", str(tmp / "build"), ROOT],
         env, work)
    tarballs = glob.glob(str(tmp / "build" / "dflash-ops-*.tar.gz"))
    assert len(tarballs) == 1, tarballs
    _run([os.path.join(BIN, "ansible-galaxy"), "collection", "install", tarballs[0], "-p", str(collections)],
         env, work)
    root = collections / "ansible_collections" / "dflash" / "ops"
    assert (root / "MANIFEST.json").is_file()
    return tarballs[0], root, env, work


def _tar_files(tarball):
    with tarfile.open(tarball) as tar:
        return {m.name for m in tar.getmembers() if not m.isdir()}


def test_tarball_holds_the_collection_and_the_trainer_source(installed):
    tarball, root, _, _ = installed
    names = _tar_files(tarball)
    missing = [n for n in REQUIRED if n not in names]
    assert not missing, missing
    for pattern in ["plugins/modules/*.py", "playbooks/*.yml", "trainer/src/dflash_trainer/**/*.py"]:
        expected = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)}
        assert expected and expected <= names, (pattern, sorted(expected - names))
    # The installed copy is the tarball.
    on_disk = {os.path.relpath(os.path.join(d, f), str(root)) for d, _, files in os.walk(str(root)) for f in files}
    assert names <= on_disk


def test_tarball_leaves_out_tests_harness_benchmarks_and_environments(installed):
    names = _tar_files(installed[0])
    bad = sorted(n for n in names if n.startswith(FORBIDDEN_PREFIXES) or any(p in n for p in FORBIDDEN_PARTS)
                 or n.endswith((".log", ".pyc", ".tar.gz"))
                 or (n.endswith(".json") and n not in ("MANIFEST.json", "FILES.json")))
    assert not bad, bad
    assert not [n for n in names if n.startswith(("tests", "molecule", "scripts", "benchmarks"))
                and not n.startswith(KEPT_UNDER_TESTS) and n != "tests"]
    assert "tests/sanity/ignore-2.19.txt" in names


def _playbook(installed, tmp_path, playbook, *extra):
    _, root, env, work = installed
    # Never the real demo's /tmp/dflash-demo: runs, checkpoints and models go to this test's tmp dir.
    return _run([os.path.join(BIN, "ansible-playbook"), "-i", str(root / "inventories" / "local"),
                 str(root / "playbooks" / playbook), "-e", "run=demo",
                 "-e", "dflash_demo_root=%s" % (tmp_path / "demo"), "-e", "dflash_demo_models=%s" % (tmp_path / "m"),
                 "-e", "dflash_runs_root=%s" % (tmp_path / "runs")] + list(extra), env, work)


def test_status_playbook_runs_from_the_installed_collection(installed, tmp_path):
    proc = _playbook(installed, tmp_path, "training_status.yml")
    assert "run demo: not running (never launched)" in proc.stdout, proc.stdout[-2000:]
    assert "failed=0" in proc.stdout


def test_check_mode_restart_from_the_installed_collection_launches_nothing(installed, tmp_path, tiny):
    # the tiny target and data the demo's flags name: the trainer's check (run in check mode too) needs them (the
    # session's, which nothing writes to)
    (tmp_path / "m").mkdir()
    for name in ("target", "data"):
        (tmp_path / "m" / name).symlink_to(tiny / name)
    proc = _playbook(installed, tmp_path, "restart_training.yml", "--check")
    assert "failed=0" in proc.stdout and "run demo: would launch (check mode" in proc.stdout, proc.stdout[-2000:]
    assert not (tmp_path / "runs").exists()  # check mode creates nothing: no runs root, no lock file
    assert not (tmp_path / "demo").exists()
    assert live_pids_with(str(tmp_path)) == []


def test_local_inventory_renders_a_trainer_command_that_exists(installed, tmp_path):
    """inventories/local's dflash_trainer_command, rendered by ansible-playbook from the installed collection, is
    the dflash-train next to the Python running ansible-playbook (this virtual environment's)."""
    play = tmp_path / "trainer_command.yml"
    play.write_text("""---
- name: Trainer command of inventories/local
  hosts: dflash_training
  gather_facts: false
  tasks:
    - name: Stat the trainer command
      ansible.builtin.stat:
        path: "{{ dflash_trainer_command[0] }}"
      register: trainer
    - name: The trainer command exists and is executable
      ansible.builtin.assert:
        that: [trainer.stat.exists, trainer.stat.executable]
        fail_msg: "{{ dflash_trainer_command }} does not exist"
    - name: Show it
      ansible.builtin.debug:
        msg: "trainer command: {{ dflash_trainer_command[0] }}"
""")
    _, root, env, work = installed
    proc = _run([os.path.join(BIN, "ansible-playbook"), "-i", str(root / "inventories" / "local"), str(play)],
                env, work)
    assert "trainer command: %s" % os.path.join(BIN, "dflash-train") in proc.stdout, proc.stdout[-2000:]
