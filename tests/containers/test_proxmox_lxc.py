"""proxmox_lxc and lxc_raw_config through ansible-runner against the Proxmox API stand-in (tests/harness/pve_api:
real HTTPS, real LXC containers behind it): create → converge twice (second changed: false) → change memory (the diff
shows exactly that) → absent, and each refusal in one line with nothing half-applied."""
import json
import os
import subprocess
import sys

import pytest
from proxmoxer import ProxmoxAPI

from harness.fixtures import start_pve_api, stop_pve_api

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "integration"))
from ansible_helpers import Ansible  # noqa: E402

pytestmark = pytest.mark.containers

TEMPLATE = "local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst"
GPUS_ON_HOST = ["/dev/nvidia%d" % i for i in range(8)] + [
    "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-caps/nvidia-cap1",
    "/dev/nvidia-caps/nvidia-cap2"]


def conn(info, token=False, **kw):
    args = dict(api_host=info["host"], api_port=info["port"], ca_path=info["ca_cert"], node=info["node"])
    if token:
        args.update(api_token_id=info["token_id"], api_token_secret=info["token_secret"])
    else:
        args.update(api_user="root@pam", api_password=info["root_password"])
    args.update(kw)
    return args


def ct(info, vmid, **kw):
    args = conn(info, vmid=vmid, ostemplate=TEMPLATE, hostname="ct%d" % vmid, memory=2048, swap=0, cores=1,
                rootfs="local-lvm:4", unprivileged=False, gpus=[0, 1], host_devices=GPUS_ON_HOST,
                mounts=[dict(source=info["dev_root"], target="/mnt/models", read_only=True)],
                weights_gib=0.5, trainer_memory_gib=1)
    args.update(kw)
    return args


def px(info):
    return ProxmoxAPI(info["host"], port=info["port"], user="root@pam", password=info["root_password"],
                      verify_ssl=info["ca_cert"])


def conf_file(info, vmid):
    path = os.path.join(info["pve_dir"], "lxc", "%d.conf" % vmid)
    return open(path).read() if os.path.exists(path) else None


@pytest.fixture
def ansible(tmp_path):
    return Ansible(tmp_path)


def test_create_converge_change_memory_destroy(pve_api, ansible):
    info, vmid = pve_api, 310
    ok, r = ansible.module("dflash.ops.proxmox_lxc", ct(info, vmid, state="started"), check=True)
    assert ok and r["changed"] and r["created"] and r["tasks"] == [] and conf_file(info, vmid) is None

    ok, r = ansible.module("dflash.ops.proxmox_lxc", ct(info, vmid, state="started"), diff=True)
    assert ok and r["changed"] and r["created"] and r["status"] == "running", r
    assert [t["type"] for t in r["tasks"]] == ["vzcreate", "vzstart"] and all(t["exitstatus"] == "OK"
                                                                               for t in r["tasks"])
    assert r["gpu_passthrough"] == "devN" and r["shm_size_gib"] == 1 and r["memory_needed_mib"] == 2048
    text = conf_file(info, vmid)
    for line in ("dev0: /dev/nvidia0", "dev1: /dev/nvidia1", "dev2: /dev/nvidiactl", "dev3: /dev/nvidia-uvm",
                 "dev4: /dev/nvidia-uvm-tools", "dev5: /dev/nvidia-caps/nvidia-cap1", "memory: 2048",
                 "mp0: %s,mp=/mnt/models,ro=1" % info["dev_root"]):
        assert line + "\n" in text
    assert info["root_password"] not in json.dumps(r)

    ok, r = ansible.module("dflash.ops.lxc_raw_config", dict(vmid=vmid, pve_dir=info["pve_dir"], shm_size_gib=1,
                                                             lock_dir=str(ansible.tmp / "lock")))
    assert ok and r["changed"] and r["write"] == "rename"
    ok, r = ansible.module("dflash.ops.lxc_raw_config", dict(vmid=vmid, pve_dir=info["pve_dir"], shm_size_gib=1,
                                                             lock_dir=str(ansible.tmp / "lock")))
    assert ok and not r["changed"]

    for check in (True, False):  # converge again: nothing to do, in check mode and for real
        ok, r = ansible.module("dflash.ops.proxmox_lxc", ct(info, vmid, state="started"), check=check, diff=True)
        assert ok and not r["changed"] and r["changes"] == {} and r["tasks"] == [], r

    ok, r = ansible.module("dflash.ops.proxmox_lxc", ct(info, vmid, state="started", memory=3072), diff=True)
    assert ok and r["changed"] and r["changes"] == {"memory": {"before": "2048", "after": "3072"}}
    assert r["diff"]["before"] == "memory: 2048\n" and r["diff"]["after"] == "memory: 3072\n"
    assert "memory: 3072\n" in conf_file(info, vmid)

    # the container is real: restart it and look at /dev/shm and a GPU node inside
    ok, r = ansible.module("dflash.ops.proxmox_lxc", conn(info, vmid=vmid, state="stopped"))
    assert ok and r["changed"] and r["status"] == "stopped"
    ok, r = ansible.module("dflash.ops.proxmox_lxc", conn(info, vmid=vmid, state="started"))
    assert ok and r["changed"] and r["status"] == "running"
    out = subprocess.run(["lxc-attach", "-n", str(vmid), "--", "sh", "-c", "df -k /dev/shm | tail -1; "
                          "stat -c %t:%T /dev/nvidia0; test -r /mnt/models/nvidia0 && echo ro-mounted"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert " 1048576 " in out.stdout and "c3:0" in out.stdout and "ro-mounted" in out.stdout, out.stdout

    ok, r = ansible.module("dflash.ops.proxmox_lxc", conn(info, vmid=vmid, state="absent"), diff=True)
    assert ok and r["changed"] and r["status"] == "absent" and [t["type"] for t in r["tasks"]] == ["vzstop",
                                                                                                   "vzdestroy"]
    assert conf_file(info, vmid) is None
    ok, r = ansible.module("dflash.ops.proxmox_lxc", conn(info, vmid=vmid, state="absent"))
    assert ok and not r["changed"]


def test_a_token_converges_a_container_whose_devices_already_match(pve_api, ansible):
    info = pve_api
    ok, r = ansible.module("dflash.ops.proxmox_lxc", ct(info, 311))
    assert ok and r["created"]
    ok, r = ansible.module("dflash.ops.proxmox_lxc", ct(info, 311, memory=4096, api_password=None, api_user=None,
                                                         **conn(info, token=True)))
    assert ok and r["changes"] == {"memory": {"before": "2048", "after": "4096"}}, r
    assert info["token_secret"] not in json.dumps(r)


@pytest.mark.parametrize("case,args,needle", [
    ("token + devN", dict(token=True), "CT 312: changing dev0, dev1, dev2, dev3, dev4, dev5, dev6, mp0 (bind mount) "
                                       "is allowed only to the user root@pam itself, and this module logs in as "
                                       "root@pam!ci (an API token): provision as root@pam with a password"),
    ("memory too small", dict(memory=1024), "memory 1024 MiB < /dev/shm 1 GiB + trainer 1 GiB = 2048 MiB"),
    ("vmid of a VM", dict(vmid=150), "vmid 150 is a VM on node pve1, not a container: choose another vmid"),
    ("node missing", dict(node="pve9"), "node 'pve9' is not in this cluster (nodes: pve1): set node to one of them"),
    ("bad password", dict(api_password="wrong"), "authentication as root@pam at https://127.0.0.1:"),
    ("bad token", dict(token=True, api_token_secret="0" * 32, gpus=[], mounts=[]),
     "authentication as root@pam!ci at https://127.0.0.1:"),
    ("template missing", dict(ostemplate="local:vztmpl/nope.tar.zst"),
     "template local:vztmpl/nope.tar.zst does not exist on node pve1: download it (pveam download local nope.tar.zst)"),
    ("GPU missing", dict(gpus=[9]), "/dev/nvidia9 not on the host (it has GPUs 0,1,2,3,4,5,6,7)"),
])
def test_refusals_are_one_line_and_create_nothing(pve_api, ansible, case, args, needle):
    info = pve_api
    args = dict(args)
    token = args.pop("token", False)
    kw = ct(info, args.pop("vmid", 312), **args)
    if token:
        kw.update(conn(info, token=True, **dict((k, v) for k, v in args.items() if k.startswith("api_"))))
        kw.pop("api_user")
        kw.pop("api_password")
    before = sorted(c["vmid"] for c in px(info).nodes(info["node"]).lxc.get())
    ok, r = ansible.module("dflash.ops.proxmox_lxc", kw)
    assert not ok and needle in r["msg"] and "\n" not in r["msg"], (case, r["msg"])
    assert sorted(c["vmid"] for c in px(info).nodes(info["node"]).lxc.get()) == before
    for secret in (info["root_password"], info["token_secret"]):
        assert secret not in json.dumps(r)


def test_refusals_on_an_existing_container_change_nothing(pve_api, ansible):
    info = pve_api
    ok, r = ansible.module("dflash.ops.proxmox_lxc", ct(info, 313))
    assert ok and r["created"]
    text = conf_file(info, 313)
    for args, needle in [
        (dict(memory=4096, gpus=[0, 1, 2], **conn(info, token=True)), "changing dev2, dev3, dev4, dev5, dev6, dev7 "
                                                                      "is allowed only to the user root@pam"),
        (dict(memory=4096, rootfs="local-lvm:8"), "CT 313's rootfs is 4G, wanted 8G: grow it with pct resize"),
        (dict(memory=4096, unprivileged=True), "CT 313 is privileged, wanted unprivileged"),
        (dict(memory=1536), "memory 1536 MiB < /dev/shm 1 GiB + trainer 1 GiB = 2048 MiB"),
    ]:
        kw = ct(info, 313, **args)
        if "api_token_id" in args:
            kw.pop("api_password")
            kw.pop("api_user")
        ok, r = ansible.module("dflash.ops.proxmox_lxc", kw)
        assert not ok and needle in r["msg"] and "\n" not in r["msg"], r["msg"]
        assert conf_file(info, 313) == text


def test_digest_clash_applies_nothing(pve_api):
    """Someone edits the file between our read and our update (a raw line appended on the host, as pct set or
    lxc_raw_config would): the update carries the digest read and is refused as a whole."""
    from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
    from ansible_collections.dflash.ops.plugins.module_utils._dflash.proxmox import api, lxc_backend

    info = pve_api
    path = os.path.join(info["pve_dir"], "lxc", "314.conf")

    class Module:
        def __init__(self, **kw):
            self.params = lxc_backend.argument_spec().defaults()
            self.params.update(ct(info, 314, **kw))
            self.check_mode, self._diff = False, False

        def warn(self, msg):
            pass

    class MeddlingApi(api.Api):
        def get(self, path_, what=None, **params):
            out = api.Api.get(self, path_, what, **params)
            if path_.endswith("/config"):
                with open(path, "a") as f:
                    f.write("lxc.apparmor.profile: unconfined\n")
            return out

    lxc_backend.manage_container(Module())
    with pytest.raises(ModuleFailure) as e:
        lxc_backend.manage_container(Module(memory=4096, cores=2), api_factory=MeddlingApi)
    assert str(e.value) == ("CT 314's config was changed by someone else meanwhile (digest clash); nothing was "
                            "applied: run again")
    text = open(path).read()
    assert "memory: 2048\n" in text and "cores: 1\n" in text
    r = lxc_backend.manage_container(Module(memory=4096, cores=2))  # run again: applied
    assert r["changes"] == {"cores": {"before": "1", "after": "2"}, "memory": {"before": "2048", "after": "4096"}}


def test_pve_before_8_1_gets_raw_gpu_lines(containers_ok, tmp_path, ansible):
    """No devN below PVE 8.1: the module leaves the devices out and says so; lxc_raw_config writes the cgroup and
    bind lines with nvidia-uvm's major from (a stand-in of) the host's /proc/devices; the container starts."""
    info = start_pve_api(tmp_path / "old", "--pve-version", "8.0.4")
    try:
        ok, r = ansible.module("dflash.ops.proxmox_lxc", ct(info, 315))
        assert ok and r["created"] and r["gpu_passthrough"] == "raw" and "dev0" not in conf_file(info, 315)
        proc = tmp_path / "devices"
        proc.write_text("Character devices:\n  1 mem\n195 nvidia-frontend\n235 nvidia-caps\n508 nvidia-uvm\n\n"
                        "Block devices:\n  8 sd\n")
        args = dict(vmid=315, pve_dir=info["pve_dir"], shm_size_gib=1, gpu_devices=r["gpu_devices"],
                    proc_devices=str(proc), lock_dir=str(tmp_path / "lock"))
        ok, raw = ansible.module("dflash.ops.lxc_raw_config", args)
        assert ok and raw["changed"]
        text = conf_file(info, 315)
        for line in ("lxc.cgroup2.devices.allow: c 195:* rwm", "lxc.cgroup2.devices.allow: c 235:* rwm",
                     "lxc.cgroup2.devices.allow: c 508:* rwm",
                     "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file"):
            assert line + "\n" in text
        proc.write_text(proc.read_text().replace("508 nvidia-uvm", "511 nvidia-uvm"))  # a reboot moved uvm
        ok, raw = ansible.module("dflash.ops.lxc_raw_config", args)
        assert ok and raw["removed"] == ["lxc.cgroup2.devices.allow: c 508:* rwm"]
        assert raw["added"] == ["lxc.cgroup2.devices.allow: c 511:* rwm"]
        ok, r = ansible.module("dflash.ops.proxmox_lxc", ct(info, 315, state="started"))
        assert ok and r["status"] == "running" and not r["changes"], r
    finally:
        stop_pve_api(tmp_path / "old")
