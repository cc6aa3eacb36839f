"""Raw lxc lines of a PVE config file: ownership (a new /dev/shm size replaces the old line), stale uvm majors,
sections and unrelated lines kept, and lxc_raw_config's backend on real files (check and diff mode, the in-place
write where the rename is refused, the missing file)."""
import errno
import os

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.proxmox import raw_config_backend as rb
from ansible_collections.dflash.ops.plugins.module_utils._dflash.proxmox import raw_lines

SHM = "lxc.mount.entry: tmpfs dev/shm tmpfs nodev,nosuid,size=%dg,mode=1777,create=dir 0 0"
CONF = """arch: amd64
hostname: ct
memory: 65536
lxc.apparmor.profile: unconfined
lxc.cgroup2.devices.allow: c 10:229 rwm

[snap1]
arch: amd64
lxc.mount.entry: tmpfs dev/shm tmpfs size=1g 0 0
"""


@pytest.mark.parametrize("line,identity", [
    (SHM % 57, ("lxc.mount.entry", "dev/shm")),
    ("lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file", ("lxc.mount.entry", "dev/nvidia0")),
    ("lxc.cgroup2.devices.allow: c 195:* rwm", ("lxc.cgroup2.devices.allow", "c 195:*")),
    ("lxc.cgroup2.devices.allow = c 195:* rw", ("lxc.cgroup2.devices.allow", "c 195:*")),
    ("lxc.apparmor.profile: unconfined", ("lxc.apparmor.profile",)),
    ("lxc.cgroup2.memory.max: 1G", ("lxc.cgroup2.memory.max",)),
    ("lxc.cap.drop: sys_time", ("lxc.cap.drop", "sys_time")),
])
def test_identity(line, identity):
    assert raw_lines.identity(*raw_lines.parse_line(line)) == identity


def test_ensure_appends_to_the_main_section_and_keeps_everything_else():
    new, added, removed = raw_lines.ensure(CONF, [SHM % 57])
    assert added == [SHM % 57] and removed == []
    assert new == CONF.replace("c 10:229 rwm\n", "c 10:229 rwm\n" + SHM % 57 + "\n")
    assert raw_lines.ensure(new, [SHM % 57]) == (new, [], [])


def test_a_new_size_replaces_the_old_line_in_place():
    old, _a, _r = raw_lines.ensure(CONF, [SHM % 48])
    new, added, removed = raw_lines.ensure(old, [SHM % 57])
    assert added == [SHM % 57] and removed == [SHM % 48]
    assert raw_lines.raw_lines(new) == ["lxc.apparmor.profile: unconfined", "lxc.cgroup2.devices.allow: c 10:229 rwm",
                                        SHM % 57]
    assert "size=1g" in new  # the snapshot's line is not the main section's


def test_duplicate_owned_lines_collapse_to_the_wanted_one():
    text = "arch: amd64\n%s\n%s\n" % (SHM % 57, SHM % 10)
    new, added, removed = raw_lines.ensure(text, [SHM % 57])
    assert added == [] and removed == [SHM % 10] and new == "arch: amd64\n%s\n" % (SHM % 57)


def test_a_stale_uvm_major_goes_other_whole_major_allows_stay():
    text = ("arch: amd64\nlxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c 508:* rwm\n"
            "lxc.cgroup2.devices.allow: c 10:229 rwm\nlxc.cgroup2.devices.allow: c 226:* rwm\n")
    wanted = ["lxc.cgroup2.devices.allow: c 195:* rwm", "lxc.cgroup2.devices.allow: c 509:* rwm"]
    new, added, removed = raw_lines.ensure(text, wanted, raw_lines.stale_whole_major([195, 509, 226, 10]))
    assert removed == ["lxc.cgroup2.devices.allow: c 508:* rwm"]
    assert added == ["lxc.cgroup2.devices.allow: c 509:* rwm"]
    assert "c 226:* rwm" in new and "c 10:229 rwm" in new


@pytest.mark.parametrize("bad", ["memory: 4096", "lxc.mount.entry", "# lxc.x: y"])
def test_a_line_that_is_not_raw_is_refused(bad):
    with pytest.raises(ValueError, match="not a raw lxc line"):
        raw_lines.ensure("", [bad])


class Module:
    def __init__(self, check_mode=False, diff=False, **params):
        self.params = rb.argument_spec().defaults()
        self.params.update(params)
        self.check_mode = check_mode
        self._diff = diff


@pytest.fixture
def pve(tmp_path):
    (tmp_path / "lxc").mkdir()
    (tmp_path / "lxc" / "200.conf").write_text(CONF)
    (tmp_path / "devices").write_text("Character devices:\n195 nvidia-frontend\n509 nvidia-uvm\n\nBlock devices:\n")
    return tmp_path


def mod(pve, **kw):
    kw.setdefault("vmid", 200)
    return Module(pve_dir=str(pve), lock_dir=str(pve / "lock"), proc_devices=str(pve / "devices"), **kw)


def test_check_diff_real_rerun(pve):
    conf = pve / "lxc" / "200.conf"
    r = rb.ensure_raw_config(Module(check_mode=True, diff=True, **mod(pve, shm_size_gib=57).params))
    assert r["changed"] and r["added"] == [SHM % 57] and conf.read_text() == CONF
    assert r["diff"]["after"].endswith(SHM % 57 + "\n") and SHM % 57 not in r["diff"]["before"]
    r = rb.ensure_raw_config(mod(pve, shm_size_gib=57))
    assert r["changed"] and r["write"] == "rename" and SHM % 57 in conf.read_text()
    assert not rb.ensure_raw_config(Module(check_mode=True, **mod(pve, shm_size_gib=57).params))["changed"]
    assert not rb.ensure_raw_config(mod(pve, shm_size_gib=57))["changed"]
    assert os.listdir(str(pve / "lxc")) == ["200.conf"]  # no temporary file left


def test_gpu_lines_from_proc_devices(pve):
    r = rb.ensure_raw_config(mod(pve, gpu_devices=["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]))
    assert r["added"][:2] == ["lxc.cgroup2.devices.allow: c 195:* rwm", "lxc.cgroup2.devices.allow: c 509:* rwm"]
    assert len(r["added"]) == 5


def test_in_place_write_where_the_rename_is_refused(pve, monkeypatch):
    def refuse(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(rb.os, "rename", refuse)
    r = rb.ensure_raw_config(mod(pve, shm_size_gib=8))
    assert r["write"] == "in-place" and (pve / "lxc" / "200.conf").read_text().count(SHM % 8) == 1
    assert os.listdir(str(pve / "lxc")) == ["200.conf"]


@pytest.mark.parametrize("kw,needle", [
    (dict(vmid=201, shm_size_gib=8), "CT 201 has no config file"),
    (dict(shm_size_gib=0), "shm_size_gib must be at least 1"),
    (dict(gpu_devices=["/dev/sda"]), "gpu_devices must be NVIDIA device nodes"),
    (dict(lines=["memory: 1"]), "not a raw lxc line"),
])
def test_refusals_change_nothing(pve, kw, needle):
    with pytest.raises(ModuleFailure) as e:
        rb.ensure_raw_config(mod(pve, **kw))
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert (pve / "lxc" / "200.conf").read_text() == CONF


def test_missing_proc_devices(pve):
    with pytest.raises(ModuleFailure, match="cannot read .*nope"):
        rb.ensure_raw_config(Module(vmid=200, pve_dir=str(pve), proc_devices=str(pve / "nope"),
                                    gpu_devices=["/dev/nvidia0"]))


def test_check_mode_before_the_container_exists(pve):
    r = rb.ensure_raw_config(Module(check_mode=True, **mod(pve, vmid=300, shm_size_gib=8).params))
    assert r["changed"] and "does not exist yet" in r["msg"]


@pytest.fixture
def dev(tmp_path):
    """A stand-in /dev: two GPUs, the control nodes and one nvidia-caps node (plain files are enough to be seen)."""
    d = tmp_path / "dev"
    (d / "nvidia-caps").mkdir(parents=True)
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-caps/nvidia-cap1",
                 "sda", "null"):
        (d / name).write_text("")
    return d


def test_the_host_devices_are_read_in_the_same_call(pve, dev):
    r = rb.ensure_raw_config(mod(pve, gpus=[1], dev_dir=str(dev), weights_gib=50))
    assert r["host_devices"] == ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                                 "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"]
    # sized as proxmox_lxc sizes it: 50 GiB x 1.1 -> 55, no GPU line (devN is the API's, on PVE >= 8.1)
    assert r["exists"] and r["shm_size_gib"] == 55 and r["added"] == [SHM % 55]
    assert not rb.ensure_raw_config(mod(pve, gpus=[1], dev_dir=str(dev), weights_gib=50))["changed"]


def test_a_gpu_the_host_lacks_is_refused_before_anything_changes(pve, dev):
    with pytest.raises(ModuleFailure) as e:
        rb.ensure_raw_config(mod(pve, gpus=[0, 5], dev_dir=str(dev), weights_gib=50))
    assert "/dev/nvidia5 not on the host (it has GPUs 0,1)" in str(e.value) and "\n" not in str(e.value)
    assert (pve / "lxc" / "200.conf").read_text() == CONF


@pytest.mark.parametrize("kw", [dict(weights_gib=70), dict(weights_gib=50, memory=32768),
                                dict(weights_gib=50, trainer_memory_gib=20)])
def test_a_shm_the_memory_cannot_hold_is_refused_with_the_numbers(pve, kw):
    """The config's own memory (65536 MiB) or the one given must hold /dev/shm plus the trainer."""
    with pytest.raises(ModuleFailure) as e:
        rb.ensure_raw_config(mod(pve, **kw))
    assert str(e.value).startswith("memory ") and "raise memory to at least" in str(e.value)
    assert (pve / "lxc" / "200.conf").read_text() == CONF


def test_absent_ok_before_the_container_exists(pve, dev):
    r = rb.ensure_raw_config(mod(pve, vmid=300, gpus=[0], dev_dir=str(dev), weights_gib=50, absent_ok=True))
    assert not r["changed"] and not r["exists"] and "/dev/nvidia0" in r["host_devices"]
    assert not (pve / "lxc" / "300.conf").exists()
    with pytest.raises(ModuleFailure, match="^memory 1024 MiB < /dev/shm 55 GiB"):  # given memory: checked already
        rb.ensure_raw_config(mod(pve, vmid=300, weights_gib=50, memory=1024, absent_ok=True))
    assert not rb.ensure_raw_config(mod(pve, vmid=300, weights_gib=50, memory=65536, absent_ok=True))["exists"]
