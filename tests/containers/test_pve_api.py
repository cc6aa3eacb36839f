"""The Proxmox API stand-in (tests/harness/pve_api) against docs/proxmox.md's statements, one by one, through plain
`requests` and through proxmoxer; its containers are real (memory limit, char device, /dev/shm size, pct exec)."""
import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import requests
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException
from proxmoxer.tools import Tasks

from harness import PCT, lxc
from harness.fixtures import start_pve_api, stop_pve_api

pytestmark = pytest.mark.containers

TEMPLATE = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"
ROOT_DEVICE = "Permission check failed (configuring device passthrough is only allowed for root@pam)"
ROOT_BIND = "Permission check failed (mount point type bind is only allowed for root@pam)"
CLASH = "detected modified configuration - file changed by other user? Try again."


@pytest.fixture(scope="module")
def api(containers_ok, tmp_path_factory):
    d = tmp_path_factory.mktemp("pve_api_mod")
    info = start_pve_api(d, "--vm", "150")
    try:
        yield info
    finally:
        stop_pve_api(d)


def http(info, method, path, token=True, **kw):
    headers = kw.pop("headers", {})
    if token:
        headers["Authorization"] = f"PVEAPIToken={info['token_id']}={info['token_secret']}"
    return requests.request(method, f"{info['url']}/api2/json{path}", headers=headers, verify=info["ca_cert"],
                            timeout=30, **kw)


def root(info):
    return ProxmoxAPI(info["host"], port=info["port"], user="root@pam", password=info["root_password"],
                      verify_ssl=info["ca_cert"])


def token(info):
    user, name = info["token_id"].split("!")
    return ProxmoxAPI(info["host"], port=info["port"], user=user, token_name=name,
                      token_value=info["token_secret"], verify_ssl=info["ca_cert"])


def refused(call, status, text):
    with pytest.raises(ResourceException) as e:
        call()
    assert (e.value.status_code, e.value.content) == (status, text), str(e.value)
    return e.value


def wait_task(px, node, upid, timeout=60):
    st = Tasks.blocking_status(px, upid, timeout=timeout, polling_interval=0.1)
    assert st["status"] == "stopped", st
    return st


def test_shapes_version_nodes_nextid(api):
    r = http(api, "GET", "/version")
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("application/json")
    assert r.json() == {"data": {"version": "8.2.4", "release": "8.2", "repoid": r.json()["data"]["repoid"]}}
    nodes = http(api, "GET", "/nodes").json()["data"]
    assert [(n["node"], n["status"]) for n in nodes] == [("pve1", "online")]
    nextid = http(api, "GET", "/cluster/nextid").json()["data"]
    assert int(nextid) >= 300
    r = http(api, "GET", "/cluster/nextid", params={"vmid": 150})  # taken by the VM
    assert (r.status_code, r.reason) == (400, "Parameter verification failed.")
    assert r.json()["errors"] == {"vmid": "VM 150 already exists"} and r.json()["data"] is None
    assert [v["vmid"] for v in http(api, "GET", "/nodes/pve1/qemu").json()["data"]] == [150]


def test_auth_ticket_csrf_token(api):
    for kw in ({"token": False}, {"token": False, "headers": {"Authorization": "PVEAPIToken=root@pam!ci=wrong"}},
               {"token": False, "cookies": {"PVEAuthCookie": "PVE:root@pam:00000000::forged"}}):
        r = http(api, "GET", "/version", **kw)
        assert (r.status_code, r.content) == (401, b""), kw
    r = http(api, "POST", "/access/ticket", token=False, data={"username": "root@pam", "password": "wrong"})
    assert (r.status_code, r.content) == (401, b"")
    r = http(api, "POST", "/access/ticket", token=False,
             data={"username": "root@pam", "password": api["root_password"]})
    t = r.json()["data"]
    assert set(t) == {"username", "ticket", "CSRFPreventionToken", "cap"} and t["username"] == "root@pam"
    cookies = {"PVEAuthCookie": t["ticket"]}
    assert http(api, "GET", "/nodes/pve1/lxc", token=False, cookies=cookies).status_code == 200
    # a non-GET with a ticket needs the CSRF header; with a token it does not
    r = http(api, "PUT", "/nodes/pve1/lxc/399/config", token=False, cookies=cookies, data={"memory": 64})
    assert (r.status_code, r.content) == (401, b"")
    r = http(api, "PUT", "/nodes/pve1/lxc/399/config", token=False, cookies=cookies, data={"memory": 64},
             headers={"CSRFPreventionToken": t["CSRFPreventionToken"]})
    assert (r.status_code, r.reason) == (500, "Configuration file 'nodes/pve1/lxc/399.conf' does not exist")
    r = http(api, "PUT", "/nodes/pve1/lxc/399/config", data={"memory": 64})
    assert r.status_code == 500


def test_errors_500_not_404_and_501(api):
    r = http(api, "GET", "/nodes/pve1/lxc/399/status/current")
    assert (r.status_code, r.reason) == (500, "Configuration file 'nodes/pve1/lxc/399.conf' does not exist")
    assert r.json() == {"data": None, "message": "Configuration file 'nodes/pve1/lxc/399.conf' does not exist\n"}
    r = http(api, "GET", "/nodes/pve1/frobnicate")
    assert (r.status_code, r.reason) == (501, "Method 'GET /nodes/pve1/frobnicate' not implemented")
    e = refused(lambda: token(api).nodes("pve1").lxc(399).config.get(), 500,
                "Configuration file 'nodes/pve1/lxc/399.conf' does not exist")
    assert str(e) == "500 Internal Server Error: Configuration file 'nodes/pve1/lxc/399.conf' does not exist"


def test_parameter_verification_and_raw_lxc_keys(api):
    e = refused(lambda: root(api).nodes("pve1").lxc.post(vmid=398, ostemplate=TEMPLATE, memory=8), 400,
                "Parameter verification failed.")
    assert e.errors == {"memory": "value must have a minimum value of 16"}
    # raw lxc.* keys are not in the API, for root@pam too
    for px in (root(api), token(api)):
        e = refused(lambda: px.nodes("pve1").lxc.post(**{"vmid": 398, "ostemplate": TEMPLATE,
                                                         "lxc.cgroup2.devices.allow": "c 195:* rwm"}),
                    400, "Parameter verification failed.")
        assert e.errors == {"lxc.cgroup2.devices.allow": "property is not defined in schema and the schema does "
                                                         "not allow additional properties"}
    r = http(api, "POST", "/nodes/pve1/lxc", data={"vmid": "abc"})
    assert r.json()["errors"] == {"vmid": "type check ('integer') failed - got 'abc'",
                                  "ostemplate": "property is missing and it is not optional"}


def test_create_refusals(api):
    n = root(api).nodes("pve1")
    refused(lambda: n.lxc.post(vmid=150, ostemplate=TEMPLATE, rootfs="local-lvm:4"), 500,
            "VM 150 already exists on node 'pve1'")
    refused(lambda: n.lxc.post(vmid=397, ostemplate="local:vztmpl/nope.tar.zst", rootfs="local-lvm:4"), 500,
            "volume 'local:vztmpl/nope.tar.zst' does not exist")
    refused(lambda: n.lxc.post(vmid=397, ostemplate=TEMPLATE, rootfs="tank:4"), 500, "storage 'tank' does not exist")
    refused(lambda: n.lxc.post(vmid=397, ostemplate=TEMPLATE, rootfs="local-lvm:4", dev0="/dev/nvidia99"), 500,
            "Device /dev/nvidia99 does not exist")
    t = token(api).nodes("pve1")
    refused(lambda: t.lxc.post(vmid=397, ostemplate=TEMPLATE, rootfs="local-lvm:4", dev0="/dev/nvidia0"), 403,
            ROOT_DEVICE)
    refused(lambda: t.lxc.post(vmid=397, ostemplate=TEMPLATE, rootfs="local-lvm:4", mp0="/srv,mp=/mnt/models"),
            403, ROOT_BIND)
    assert not (Path(api["pve_dir"]) / "nodes/pve1/lxc/397.conf").exists()  # nothing half-made
    assert not lxc.exists("397")


def test_token_caller_is_not_root(api):
    """A token of root@pam is `root@pam!ci`: it may create a plain CT, its tasks carry that user, and devN,
    bind mounts and features other than nesting stay root@pam's."""
    px, vmid = token(api), 396
    n = px.nodes("pve1")
    upid = n.lxc.post(vmid=vmid, ostemplate=TEMPLATE, rootfs="local-lvm:2", memory=128, features="nesting=1")
    assert upid.split(":")[7] == "root@pam!ci"
    st = wait_task(px, "pve1", upid)
    assert (st["exitstatus"], st["user"], st["type"], st["id"]) == ("OK", "root@pam!ci", "vzcreate", str(vmid))
    refused(lambda: n.lxc(vmid).config.put(dev0="/dev/nvidia0"), 403, ROOT_DEVICE)
    refused(lambda: n.lxc(vmid).config.put(delete="dev0"), 403, ROOT_DEVICE)
    refused(lambda: n.lxc(vmid).config.put(mp0="/srv,mp=/mnt/models,ro=1"), 403, ROOT_BIND)
    refused(lambda: n.lxc(vmid).config.put(features="nesting=1,keyctl=1"), 403,
            "Permission check failed (changing feature flags (except nesting) is only allowed for root@pam)")
    assert n.lxc(vmid).config.put(features="nesting=0", memory=160) is None
    root(api).nodes("pve1").lxc(vmid).config.put(dev0="/dev/nvidia1")  # the same change as root@pam is fine
    assert n.lxc(vmid).config.get()["dev0"] == "/dev/nvidia1"
    assert wait_task(px, "pve1", n.lxc(vmid).delete())["exitstatus"] == "OK"


def test_lifecycle_real_container(api, tmp_path):
    """create → task OK → digest rules → start (memory limit, char device, /dev/shm size, bind mount, pct exec)
    → destroy refused while running → stop → destroy."""
    px, vmid = root(api), 395
    n = px.nodes("pve1")
    models = tmp_path / "models"
    models.mkdir()
    (models / "w.bin").write_text("weights\n")
    upid = n.lxc.post(vmid=vmid, ostemplate=TEMPLATE, hostname="train", rootfs="local-lvm:8", cores=1,
                      memory=256, swap=0, dev0="/dev/nvidia0", dev1="path=/dev/nvidia-uvm,mode=0660,gid=44",
                      mp0=f"{models},mp=/mnt/models,ro=1", net0="name=eth0,bridge=vmbr0,ip=dhcp")
    parts = upid.split(":")
    assert len(parts) == 9 and parts[0] == "UPID" and parts[-1] == "" and parts[1] == "pve1"
    assert [len(p) for p in parts[2:5]] == [8, 8, 8] and parts[5:8] == ["vzcreate", str(vmid), "root@pam"]
    first = http(api, "GET", f"/nodes/pve1/tasks/{upid}/status").json()["data"]
    assert first["status"] in ("running", "stopped") and ("exitstatus" in first) == (first["status"] == "stopped")
    assert wait_task(px, "pve1", upid)["exitstatus"] == "OK"
    refused(lambda: n.lxc.post(vmid=vmid, ostemplate=TEMPLATE, rootfs="local-lvm:4"), 500,
            f"CT {vmid} already exists on node 'pve1'")

    conf = Path(api["pve_dir"]) / "nodes" / "pve1" / "lxc" / f"{vmid}.conf"
    cfg = n.lxc(vmid).config.get()
    assert cfg["digest"] == hashlib.sha1(conf.read_bytes()).hexdigest()
    assert (cfg["unprivileged"], cfg["memory"], cfg["rootfs"]) == (1, 256, f"local-lvm:vm-{vmid}-disk-0,size=8G")
    assert "lxc" not in cfg
    # the host-side edit of a raw line (as the collection does over ssh) changes the digest: a stale PUT clashes
    with open(conf, "a") as fh:
        fh.write("lxc.mount.entry: tmpfs dev/shm tmpfs nodev,nosuid,size=64m,mode=1777,create=dir 0 0\n")
    refused(lambda: n.lxc(vmid).config.put(memory=320, digest=cfg["digest"]), 500, CLASH)
    cfg = n.lxc(vmid).config.get()
    assert cfg["lxc"] == [["lxc.mount.entry", "tmpfs dev/shm tmpfs nodev,nosuid,size=64m,mode=1777,create=dir 0 0"]]
    assert n.lxc(vmid).config.put(memory=320, digest=cfg["digest"]) is None
    # pct reads and writes the same file
    pct_conf = subprocess.run([str(PCT), "config", str(vmid)], capture_output=True, text=True).stdout
    assert pct_conf == conf.read_text() and "memory: 320\n" in pct_conf
    subprocess.run([str(PCT), "set", str(vmid), "--swap", "0", "--cores", "1"], check=True)
    assert n.lxc(vmid).config.get()["digest"] == hashlib.sha1(conf.read_bytes()).hexdigest()

    assert wait_task(px, "pve1", n.lxc(vmid).status.start.post())["exitstatus"] == "OK"
    refused(lambda: n.lxc(vmid).status.start.post(), 500, f"CT {vmid} already running")
    cur = n.lxc(vmid).status.current.get()
    assert (cur["status"], cur["vmid"], cur["name"], cur["maxmem"]) == ("running", vmid, "train", 320 * 2 ** 20)
    assert [c["vmid"] for c in n.lxc.get()] == [vmid]
    lxc.wait_ready(str(vmid))
    limit = lxc.sh(str(vmid), "cat /sys/fs/cgroup/memory.max 2>/dev/null || "
                              "cat /sys/fs/cgroup/memory/memory.limit_in_bytes").stdout.strip()
    assert limit == str(320 * 2 ** 20)
    p = subprocess.run([str(PCT), "exec", str(vmid), "--", "sh", "-c",
                        "hostname; stat -c '%F %t:%T %a %g' /dev/nvidia0 /dev/nvidia-uvm; "
                        "df -k --output=size /dev/shm | tail -1; cat /mnt/models/w.bin; "
                        "touch /mnt/models/x 2>/dev/null || echo ro; cat /proc/self/cgroup | head -1"],
                       capture_output=True, text=True, timeout=60)
    out = p.stdout.split("\n")
    assert p.returncode == 0, p.stderr
    assert out[0] == "train"
    # 195:0 and 509:0 (stat prints hex); devN's mode and gid applied, else the host node's mode
    assert out[1:3] == ["character special file c3:0 666 0", "character special file 1fd:0 660 44"]
    assert out[3].strip() == str(64 * 1024) and out[4:6] == ["weights", "ro"]
    assert out[6]

    refused(lambda: n.lxc(vmid).delete(), 500, f"unable to destroy CT {vmid} - container is running")
    assert wait_task(px, "pve1", n.lxc(vmid).status.stop.post())["exitstatus"] == "OK"
    assert n.lxc(vmid).status.current.get()["status"] == "stopped"
    refused(lambda: n.lxc(vmid).status.stop.post(), 500, f"CT {vmid} not running")
    refused(lambda: n.lxc(vmid).status.shutdown.post(), 500, f"CT {vmid} not running")
    assert wait_task(px, "pve1", n.lxc(vmid).delete())["exitstatus"] == "OK"
    assert not lxc.exists(str(vmid)) and not conf.exists()
    refused(lambda: n.lxc(vmid).config.get(), 500, f"Configuration file 'nodes/pve1/lxc/{vmid}.conf' does not exist")


def test_task_failure_and_stop_destroys(pve_api, tmp_path):
    """A failed start reports its error text as exitstatus; shutdown; `stop` of the CLI destroys what it created.
    A second server with --pve-version 8.0.7 simulates a host older than 8.1."""
    px, vmid = root(pve_api), 394
    n = px.nodes("pve1")
    extra = Path(pve_api["dev_root"]) / "nvidia-test"
    os.mknod(extra, 0o666 | 0o020000, os.makedev(195, 200))
    assert wait_task(px, "pve1", n.lxc.post(vmid=vmid, ostemplate=TEMPLATE, rootfs="local-lvm:2",
                                            memory=128, dev0="/dev/nvidia-test"))["exitstatus"] == "OK"
    extra.unlink()  # the host device went away before start
    st = wait_task(px, "pve1", n.lxc(vmid).status.start.post())
    assert (st["type"], st["exitstatus"]) == ("vzstart", "Device /dev/nvidia-test does not exist")
    n.lxc(vmid).config.put(delete="dev0")
    assert wait_task(px, "pve1", n.lxc(vmid).status.start.post())["exitstatus"] == "OK"
    assert lxc.state(str(vmid)) == "RUNNING"
    lxc.wait_ready(str(vmid))  # a clean shutdown needs the CT's init up
    st = wait_task(px, "pve1", n.lxc(vmid).status.shutdown.post(timeout=30))
    assert (st["type"], st["exitstatus"], lxc.state(str(vmid))) == ("vzshutdown", "OK", "STOPPED")
    old = start_pve_api(tmp_path / "old", "--pve-version", "8.0.7", "--node", "pve2")
    try:
        assert http(old, "GET", "/version").json()["data"]["version"] == "8.0.7"
        refused(lambda: token(old).nodes("pve1").lxc.get(), 500,
                "hostname lookup 'pve1' failed - failed to get address info for: pve1: Name or service not known")
        assert token(old).nodes("pve2").lxc.get() == []
        # PVE 8.0 has no devN in its schema (pve-container < 5.0.7): older hosts need raw lxc lines
        e = refused(lambda: root(old).nodes("pve2").lxc.post(vmid=393, ostemplate=TEMPLATE, rootfs="local-lvm:2",
                                                             dev0="/dev/nvidia0"), 400, "Parameter verification failed.")
        assert e.errors == {"dev0": "property is not defined in schema and the schema does not allow additional "
                                    "properties"}
        # vmids are per machine: another server refuses the one this one holds
        refused(lambda: root(old).nodes("pve2").lxc.post(vmid=vmid, ostemplate=TEMPLATE, rootfs="local-lvm:2"),
                500, f"CT {vmid} already exists on node 'pve2'")
    finally:
        stop_pve_api(tmp_path / "old")
    res = stop_pve_api(Path(pve_api["pve_dir"]))
    assert res["destroyed"] == [vmid] and not lxc.exists(str(vmid))


def test_a_killed_servers_container_is_reclaimed_by_the_next(containers_ok, tmp_path):
    """A run killed mid-test (machine restart, SIGKILL) leaves its CT behind with no server to destroy it: the next
    server's create of that vmid reclaims it instead of refusing 'already exists' forever; a live server's CT is
    never taken."""
    vmid = 396
    first = start_pve_api(tmp_path / "first")
    second = None
    try:
        assert wait_task(root(first), "pve1", root(first).nodes("pve1").lxc.post(
            vmid=vmid, ostemplate=TEMPLATE, rootfs="local-lvm:2", memory=128))["exitstatus"] == "OK"
        second = start_pve_api(tmp_path / "second")
        refused(lambda: root(second).nodes("pve1").lxc.post(vmid=vmid, ostemplate=TEMPLATE, rootfs="local-lvm:2"),
                500, f"CT {vmid} already exists on node 'pve1'")  # its owner is alive
        os.kill(first["pid"], 9)
        for _ in range(100):
            if not Path(f"/proc/{first['pid']}").exists():
                break
            time.sleep(0.05)
        assert wait_task(root(second), "pve1", root(second).nodes("pve1").lxc.post(
            vmid=vmid, ostemplate=TEMPLATE, rootfs="local-lvm:2", memory=128))["exitstatus"] == "OK"
        marker = json.loads((lxc.LXC_PATH / str(vmid) / "pve_api.json").read_text())
        assert marker["conf"] == str(Path(second["pve_dir"]) / "nodes/pve1/lxc" / f"{vmid}.conf")
    finally:
        if second:
            assert stop_pve_api(tmp_path / "second")["destroyed"] == [vmid]
        stop_pve_api(tmp_path / "first")  # its pid is gone; it removes its own PVE file and leaves the CT alone
    assert not lxc.exists(str(vmid))
