"""playbooks/site.yml from a container that does not exist yet to a live demo run, over the production chain:
the Proxmox API stand-in (tests/harness/pve_api, a real LXC container behind it) called from the controller, the
harness sshd as the "Proxmox host" (ssh -tt, no pipelining) and `pct` there. The inventory is the Molecule provision
scenario's host_vars + the harness inventory's connection and run settings, plus what the later plays need: a model
store holding a tiny target (dflash-make-tiny, as scripts/demo) bind-mounted read-only, the harness wheel cache
bind-mounted read-only (the trainer installs offline from it), the run `tiny` on CPU reading the staged /dev/shm copy.
A second site.yml changes nothing and leaves the same trainer process running. The pve_api fixture destroys the CT."""
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from harness import CT_WHEELS, WHEEL_DIR, lxc
from harness.fixtures import HARNESS_INVENTORY, REPO_ROOT, VENV_BIN

pytestmark = pytest.mark.containers
SITE = REPO_ROOT / "playbooks" / "site.yml"
VMID, HOST = 320, "site-ct320"  # not 310/311: Molecule's provision scenario and test_proxmox_lxc may run meanwhile
STORE_CT = "/mnt/models"  # the model store inside the container
DEST = "/dev/shm/tiny-target"
RUN_DIR = "/workspace/runs/tiny"
LINK, VENVS = "/opt/dflash/venv", "/opt/dflash/venvs"
RESTART_TASK = "Training run tiny: restarted"
STEPS = 5  # the heartbeat must pass this step, advancing


@pytest.fixture
def model_store(tmp_path):
    """The "model store" on the host: a tiny target and its dataset, made as scripts/demo makes them."""
    store = tmp_path / "store"
    t0 = time.monotonic()
    subprocess.run([str(VENV_BIN / "dflash-make-tiny"), "--target-dir", str(store / "tiny" / "target"),
                    "--data-dir", str(store / "tiny" / "data")], check=True, capture_output=True, timeout=300)
    return store, time.monotonic() - t0


@pytest.fixture
def trainer_snapshot(tmp_path):
    """This checkout's trainer/ as it is now. The tree is shared with people editing trainer/ while this test runs;
    an edit between the two site.yml runs would be a new trainer, which the second run must (and does) install."""
    src, dest = REPO_ROOT / "trainer", tmp_path / "trainer"
    shutil.copytree(src / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "requirements.txt", "setup.cfg", "setup.py"):
        if (src / name).exists():
            shutil.copy(src / name, dest / name)
    return dest


def site_inventory(directory: Path, pve: dict, store: Path, trainer: Path) -> Path:
    """hosts.yml: one host of dflash_training with the harness inventory's connection (ssh -tt to the harness sshd);
    group_vars: the harness inventory's (transport pct, wheel cache, the CPU run `tiny`); host_vars/<host>/: the
    Molecule provision scenario's file, then this test's additions (later file wins)."""
    connection = yaml.safe_load(HARNESS_INVENTORY.read_text())["dflash_training"]["vars"]
    (directory / "group_vars").mkdir(parents=True)
    (directory / "hosts.yml").write_text(yaml.safe_dump({"dflash_training": {"vars": connection,
                                                                             "hosts": {HOST: {}}}}))
    shutil.copy(HARNESS_INVENTORY.parent / "group_vars" / "dflash_training.yml",
                directory / "group_vars" / "dflash_training.yml")
    host_vars = directory / "host_vars" / HOST
    host_vars.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "molecule" / "provision" / "host_vars" / "pve-ct310.yml", host_vars / "10-provision.yml")
    (host_vars / "20-site.yml").write_text(yaml.safe_dump({
        "_pve": pve,  # the stand-in's pve_api.json (Molecule reads it through DFLASH_PVE_STATE)
        "dflash_vmid": VMID,
        "proxmox_lxc_hostname": "ct%d" % VMID,
        "dflash_target_gpus": [],  # the demo runs on the CPU
        "dflash_drafter_gpus": [],
        "proxmox_lxc_cores": 2,
        "proxmox_lxc_memory": 4096,  # /dev/shm 1 GiB (0.5 GiB of weights + margin, rounded up) + the CPU trainer
        "proxmox_lxc_trainer_memory_gib": 2,
        "proxmox_lxc_mounts": [
            {"source": str(store), "target": STORE_CT, "read_only": True},
            {"source": str(WHEEL_DIR), "target": CT_WHEELS, "read_only": True},  # dflash_trainer_container_wheelhouse
        ],
        "dflash_model_source": STORE_CT + "/tiny/target",
        "dflash_model_dest": DEST,
        # the run reads the staged copy in /dev/shm and the dataset straight from the read-only store
        "dflash_runs": {"tiny": {"trainer_args": {"target_model": DEST, "data_dir": STORE_CT + "/tiny/data"}}},
        "trainer_source": str(trainer),
    }))
    return directory


def ct_sh(script: str, check: bool = True) -> subprocess.CompletedProcess:
    return lxc.sh(str(VMID), script, check=check, timeout=60)


def heartbeat() -> dict:
    p = ct_sh(f"cat {RUN_DIR}/heartbeat.json", check=False)
    return json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else {}


def recap_changed(r) -> int:
    m = re.search(r"^%s\s*:\s*ok=\d+\s+changed=(\d+)" % re.escape(HOST), r.stdout, re.M)
    assert m, r.stdout[-3000:]
    return int(m.group(1))


def print_phases(label, r):
    phases = ", ".join("%s %.1fs" % (name, s) for name, s in r.plays)
    print(f"[site] {label}: {r.seconds:.1f}s wall; plays: {phases}")


@pytest.mark.timeout(1800)  # the torch install takes 30-60 s on an idle machine, minutes on a busy one
def test_site_from_no_container_to_a_live_demo_run(pve_api, model_store, trainer_snapshot, play, tmp_path):
    store, make_tiny_s = model_store
    inventory = site_inventory(tmp_path / "inventory", pve_api, store, trainer_snapshot)
    conf = Path(pve_api["pve_dir"]) / "lxc" / ("%d.conf" % VMID)
    assert not conf.exists() and not lxc.exists(str(VMID))  # no container yet

    r1 = play(SITE, {"run": "tiny"}, inventory=inventory, timeout=1200)
    print(f"\n[site] dflash-make-tiny on the host {make_tiny_s:.1f}s")
    print_phases("first site.yml", r1)
    assert r1.rc == 0, r1.stdout[-4000:]

    # provisioned: the CT exists in the API's config store and runs, the store and the wheel cache bound read-only
    assert lxc.state(str(VMID)) == "RUNNING"
    text = conf.read_text()
    assert re.search(r"(?m)^mp\d+: %s,mp=%s,ro=1$" % (re.escape(str(store)), STORE_CT), text), text
    assert re.search(r"(?m)^lxc.mount.entry: tmpfs dev/shm tmpfs \S*size=1g", text), text
    assert ct_sh(f"touch {STORE_CT}/x", check=False).returncode != 0  # read-only inside

    # staged: a complete manifest listing exactly the store's files with their sizes
    res = r1.task("Model weights " + DEST)
    assert res["changed"], res
    manifest = json.loads(ct_sh(f"cat {DEST}/.dflash-manifest.json").stdout)
    target = store / "tiny" / "target"
    want = {str(p.relative_to(target)): p.stat().st_size for p in target.rglob("*")
            if p.is_file() and not p.name.startswith(".")}
    assert manifest["complete"] is True and {k: v["size"] for k, v in manifest["files"].items()} == want, manifest

    # installed: /opt/dflash/venv is the new environment holding this checkout's trainer
    installs = [n for n in r1.results if n and n.startswith("Install trainer ")]
    assert installs, list(r1.results)
    inst = r1.task(installs[-1])
    assert inst["changed"] and inst["installed"], inst
    assert ct_sh(f"readlink {LINK}").stdout.strip() == inst["venv"] and inst["venv"].startswith(VENVS + "/")
    version = re.search(r'(?m)^version = "(.*)"$', (trainer_snapshot / "pyproject.toml").read_text()).group(1)
    assert json.loads(ct_sh(f"cat {LINK}/dflash-install.json").stdout)["version"] == version
    print(f"[site] trainer install in the container: {inst.get('timings')}")

    # live: the launched pid is the one process of the run, from the installed venv, on the staged weights, and its
    # heartbeat passes step STEPS, advancing
    run = r1.task(RESTART_TASK)
    pid = run["pid"]
    assert run["action"] == "launched" and run["phase"] == "training", run
    cmdline = ct_sh(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout
    assert f"{LINK}/bin/dflash-train" in cmdline and f"--target-model={DEST}" in cmdline, cmdline
    t0, seen = time.monotonic(), []
    while True:
        hb = heartbeat()
        assert hb.get("pid") == pid, hb
        seen.append(hb.get("step", 0))
        if seen[-1] > STEPS and len(set(seen)) > 1:
            break
        assert time.monotonic() - t0 < 240, f"heartbeat steps {seen[-10:]} after 240 s"
        time.sleep(1)
    print(f"[site] heartbeat past step {STEPS} {time.monotonic() - t0:.1f}s after the play (steps seen {seen[0]}"
          f"..{seen[-1]})")

    # a second site.yml: nothing changes, the same trainer keeps running
    r2 = play(SITE, {"run": "tiny"}, inventory=inventory, timeout=1200)
    print_phases("second site.yml (no-op)", r2)
    assert r2.rc == 0, r2.stdout[-4000:]
    changed = sorted({task for task, rows in r2.results.items() for host, _, res in rows
                      if host == HOST and res.get("changed")})
    assert changed == [] and recap_changed(r2) == 0, changed
    assert not r2.task("Model weights " + DEST)["copied"]
    assert r2.task(installs[-1])["up_to_date"]
    again = r2.task(RESTART_TASK)
    assert again["action"] == "noop" and again["pid"] == pid, again
    assert lxc.attach(str(VMID), "pgrep", "-f", "--", "dflash-train", check=False).stdout.split() == [str(pid)]
    assert heartbeat()["pid"] == pid and heartbeat()["step"] >= seen[-1]
