"""playbooks/install_trainer.yml through the real chain (ansible-playbook -> ssh -tt -> pct push/exec -> LXC): the
first install adopts the golden's hand-made /opt/dflash/venv and installs torch & co. offline from the harness wheel
cache into a new venv; the second run changes nothing; a broken trainer leaves the previous one working; a restart
onto an older or a missing trainer is refused naming both versions, and the previous run keeps running.
One container for the whole sequence: the torch install (~30-60 s) happens once per session."""
import json
import re
import shutil
from pathlib import Path

import pytest

from harness.fixtures import FAKE_TRAINER_CT, REPO_ROOT

pytestmark = pytest.mark.containers
INSTALL = REPO_ROOT / "playbooks" / "install_trainer.yml"
RESTART = REPO_ROOT / "playbooks" / "restart_training.yml"
TR = Path(__file__).resolve().parent / "playbooks" / "training_run.yml"
LINK, VENVS = "/opt/dflash/venv", "/opt/dflash/venvs"
FAST = {"settle_time": 0.5, "heartbeat_timeout": 20, "stop_timeout": 10, "gpu_release_timeout": 5}


def install_result(r):
    names = [n for n in r.results if n and n.startswith("Install trainer ")]
    assert names, (list(r.results), r.stdout[-3000:])
    return r.outcome(names[-1]), r.task(names[-1])


def broken_trainer(tmp_path):
    """A copy of trainer/ (version 0.1.1, no dependencies) whose dflash-train dies at start."""
    src = REPO_ROOT / "trainer"
    dest = tmp_path / "trainer"
    shutil.copytree(src / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    text = (src / "pyproject.toml").read_text()
    text = re.sub(r'^version = ".*"$', 'version = "0.1.1"', text, flags=re.M)
    text = re.sub(r"^dependencies = \[.*\]$", "dependencies = []", text, flags=re.M)
    (dest / "pyproject.toml").write_text(text)
    (dest / "requirements.txt").write_text("")
    (dest / "src" / "dflash_trainer" / "cli.py").write_text("raise SystemExit('broken on purpose')\n")
    return dest


def test_install_twice_broken_install_and_restart_refusals(play, make_container, tmp_path):
    ct = make_container(200)
    assert ct.sh(f"test -d {LINK} && ! test -L {LINK}", check=False).returncode == 0  # the golden's real venv

    r1 = play(INSTALL, limit="ct200")
    outcome, res1 = install_result(r1)
    assert r1.rc == 0 and outcome == "ok", (res1, r1.stdout[-3000:])
    assert res1["changed"] and res1["installed"] and res1["adopted"].startswith(VENVS + "/adopted-"), res1
    assert ct.sh(f"readlink {LINK}").stdout.strip() == res1["venv"] == f"{VENVS}/{res1['key']}"
    assert "usage" in ct.sh(f"{LINK}/bin/dflash-train --help").stdout.lower()
    record = ct.read_json(f"{LINK}/dflash-install.json")
    assert record["version"] == "0.1.0" and record["source_hash"].startswith(res1["key"]), record
    assert ct.sh(f"{LINK}/bin/python -c 'import torch, transformers, safetensors, pyarrow, pynvml'",
                 check=False).returncode == 0
    # the adopted golden venv still runs its interpreter from its new place
    assert ct.sh(f"{res1['adopted']}/bin/python -c 'import torch'", check=False).returncode == 0

    r2 = play(INSTALL, limit="ct200")
    outcome, res2 = install_result(r2)
    assert r2.rc == 0 and outcome == "ok" and res2["changed"] is False and res2["up_to_date"], res2
    assert re.search(r"ct200\s*:\s*ok=\d+\s+changed=0\b", r2.stdout), (
        r1.results.get("Copy the wheel to the Proxmox host"), r2.results.get("Copy the wheel to the Proxmox host"))
    print(f"\n[harness] install_trainer.yml: first {r1.seconds:.1f}s (in-container {res1['timings']}), "
          f"no-op re-run {r2.seconds:.1f}s")

    # The role's default extras, fp8 (torchao, the FP8 drafter linears) and fla (flash-linear-attention, the seed
    # target's Gated DeltaNet kernels; the harness inventory installs no extras on its CPU containers): their pins
    # join the install in another venv from the harness's wheel cache, offline, dflash-train --help runs there, and
    # going back is a switch, not a reinstall.
    r_fp8 = play(INSTALL, {"trainer_extras": ["fp8", "fla"]}, limit="ct200")
    outcome, res_fp8 = install_result(r_fp8)
    assert r_fp8.rc == 0 and outcome == "ok" and res_fp8["changed"] and res_fp8["installed"], res_fp8
    assert res_fp8["key"] != res1["key"] and ct.sh(f"readlink {LINK}").stdout.strip() == res_fp8["venv"]
    pins = ct.read_json(f"{LINK}/dflash-install.json")["pins"]
    assert "torchao==0.18.0" in pins and "flash-linear-attention==0.6.0" in pins and "fla-core==0.6.0" in pins
    assert ct.sh(f"{LINK}/bin/python -c 'import torchao.float8'", check=False).returncode == 0
    shown = ct.sh(f"{LINK}/bin/python -m pip show flash-linear-attention fla-core einops", check=False)
    assert shown.returncode == 0 and shown.stdout.count("Version: ") == 3, shown.stdout
    assert ct.sh(f"{LINK}/bin/dflash-train --help", check=False).returncode == 0
    assert ct.sh(f"{res1['venv']}/bin/python -c 'import torchao'", check=False).returncode != 0
    r_back = play(INSTALL, limit="ct200")
    outcome, res_back = install_result(r_back)
    assert r_back.rc == 0 and res_back["changed"] and not res_back["installed"], res_back  # switched back
    assert ct.sh(f"readlink {LINK}").stdout.strip() == res1["venv"]

    before = sorted(ct.sh(f"ls -A {VENVS}").stdout.split())
    r3 = play(INSTALL, {"trainer_source": str(broken_trainer(tmp_path))}, limit="ct200")
    outcome, res3 = install_result(r3)
    assert r3.rc != 0 and outcome == "failed", r3.stdout[-3000:]
    assert "dflash-train --help failed" in res3["msg"] and "\n" not in res3["msg"].strip(), res3["msg"]
    assert ct.sh(f"readlink {LINK}").stdout.strip() == res1["venv"]
    assert ct.sh(f"{LINK}/bin/dflash-train --help", check=False).returncode == 0
    assert sorted(ct.sh(f"ls -A {VENVS}").stdout.split()) == before  # no half-built venv, no staging left

    # A run going; then restarts onto a trainer older than the collection's, or missing: refused before the stop.
    fake = [f"{LINK}/bin/python", FAKE_TRAINER_CT]
    r = play(TR, {"tr": {"name": "keep", "command": fake, "expect_trainer_version": "0.1.0", **FAST}})
    first = r.task("Training run")
    assert r.outcome("Training run") == "ok" and first["action"] == "launched", (first, r.stdout[-2000:])
    ct.write(f"{res1['venv']}/dflash-install.json", json.dumps(dict(record, version="0.0.9")))

    r = play(TR, {"tr": {"name": "keep", "command": fake, "expect_trainer_version": "0.1.0", "force": True, **FAST}})
    res = r.task("Training run")
    assert r.outcome("Training run") == "failed" and res["rc"] == 126, res
    assert "installed trainer 0.0.9 is older than the 0.1.0 this collection expects: run " \
           "playbooks/install_trainer.yml" in res["msg"], res["msg"]
    # the restart playbook (role training) expects the bundled version too; --check still runs the refusal
    rp = play(RESTART, {"run": "tiny"}, limit="ct200", cmdline="--check")
    msg = rp.task("Training run tiny: restarted").get("msg", "")
    assert rp.rc != 0 and "installed trainer 0.0.9 is older than the 0.1.0" in msg, rp.stdout[-2000:]

    r = play(TR, {"tr": {"name": "keep", "command": [f"{LINK}/bin/dflash-nope"], "force": True, **FAST}})
    res = r.task("Training run")
    assert r.outcome("Training run") == "failed" and res["rc"] == 127 and "dflash-nope does not exist" in res["msg"]

    assert ct.pids("fake_trainer") == [first["pid"]]  # the first run was never stopped
    assert ct.read_json("/workspace/runs/keep/heartbeat.json")["pid"] == first["pid"]
