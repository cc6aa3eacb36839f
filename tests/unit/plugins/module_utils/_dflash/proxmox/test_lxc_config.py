"""The wanted config, its comparison by meaning with what the API reports, the update plan (changed keys, deletes),
create-only refusals and the root@pam-only keys of a request (table-driven)."""
import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.proxmox import lxc_config as lc

MODELS = dict(source="/mnt/models", target="/mnt/models", read_only=True, options=None)


def params(**kw):
    p = dict(hostname=None, cores=None, memory=None, swap=None, rootfs=None, unprivileged=None, onboot=None,
             features=None, mounts=None, nets=None, config=None, gpus=None)
    p.update(kw)
    return p


def test_wanted_config_only_manages_what_is_given():
    want = lc.wanted_config(params(memory=196608, cores=64, unprivileged=True, features={"nesting": True,
                                                                                         "fuse": False},
                                   mounts=[MODELS], nets=["name=eth0,bridge=vmbr0,ip=dhcp"],
                                   config={"cpulimit": 16, "protection": False}),
                            {"dev0": "/dev/nvidia0"})
    assert want == {"memory": "196608", "cores": "64", "unprivileged": "1", "features": "nesting=1",
                    "mp0": "/mnt/models,mp=/mnt/models,ro=1", "net0": "name=eth0,bridge=vmbr0,ip=dhcp",
                    "dev0": "/dev/nvidia0", "cpulimit": "16", "protection": "0"}


@pytest.mark.parametrize("config,needle", [
    ({"memory": 1}, "config may not set memory"),
    ({"dev3": "/dev/fuse"}, "config may not set dev3"),
    ({"digest": "x"}, "config may not set digest"),
])
def test_config_may_not_shadow_options(config, needle):
    with pytest.raises(ValueError, match=needle):
        lc.wanted_config(params(memory=1024, config=config), {})


def test_a_mount_needs_an_absolute_target():
    with pytest.raises(ValueError, match="absolute target"):
        lc.mount_value(dict(source="/mnt/models", target="mnt", read_only=False, options=None))


@pytest.mark.parametrize("key,want,have,same", [
    ("memory", "4096", "4096", True),
    ("memory", "4096", 4096, True),
    ("memory", "8192", "4096", False),
    ("features", "nesting=1", "nesting=1", True),
    ("features", "keyctl=1,nesting=1", "nesting=1,keyctl=1", True),
    ("features", "nesting=1", "nesting=1,keyctl=1", False),
    ("features", "", None, True),
    ("unprivileged", "0", None, True),
    ("onboot", "1", 1, True),
    ("net0", "name=eth0,bridge=vmbr0,ip=dhcp", "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=dhcp,type=veth",
     True),
    ("net0", "name=eth0,bridge=vmbr1", "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01", False),
    ("dev0", "/dev/nvidia0", "/dev/nvidia0", True),
    ("dev0", "/dev/nvidia0", "path=/dev/nvidia0", True),
    ("dev0", "/dev/nvidia0", "/dev/nvidia0,mode=0666", False),
    ("mp0", "/mnt/models,mp=/mnt/models,ro=1", "/mnt/models,mp=/mnt/models,ro=1", True),
    ("mp0", "/mnt/models,mp=/mnt/models", "/mnt/models,mp=/mnt/models,ro=0", True),
    ("mp0", "/mnt/models,mp=/mnt/models,ro=1", "/mnt/models,mp=/mnt/models", False),
    ("mp1", "local-lvm:32,mp=/data", "local-lvm:vm-200-disk-1,mp=/data,size=32G", True),
    ("mp1", "local-lvm:64,mp=/data", "local-lvm:vm-200-disk-1,mp=/data,size=32G", True),  # size is create-only
    ("mp1", "local-lvm:32,mp=/scratch", "local-lvm:vm-200-disk-1,mp=/data,size=32G", False),
    ("mp1", "other:32,mp=/data", "local-lvm:vm-200-disk-1,mp=/data,size=32G", False),
    ("hostname", "a", None, False),
])
def test_same(key, want, have, same):
    assert lc.same(key, want, None if have is None else str(have)) is same


CURRENT = {"arch": "amd64", "hostname": "dflash-train", "memory": 131072, "swap": 0, "cores": 64,
           "rootfs": "local-lvm:vm-200-disk-0,size=256G", "mp0": "/mnt/models,mp=/mnt/models,ro=1",
           "mp1": "local-lvm:vm-200-disk-1,mp=/scratch,size=100G",
           "net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:AA:BB:CC,ip=dhcp,type=veth",
           "dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl", "dev2": "/dev/nvidia-uvm", "dev3": "/dev/nvidia1",
           "features": "nesting=1", "digest": "0" * 40}


@pytest.mark.parametrize("want,families,changes,deletes", [
    ({"memory": "131072", "hostname": "dflash-train", "rootfs": "local-lvm:256"}, set(), {}, []),
    ({"memory": "196608"}, set(), {"memory": ("131072", "196608")}, []),
    # the model store only: mp1 goes (mounts given), the devices stay (gpus not given)
    ({"mp0": "/mnt/models,mp=/mnt/models,ro=1"}, {"mp"}, {}, ["mp1"]),
    ({"dev0": "/dev/nvidia0", "dev1": "/dev/nvidiactl", "dev2": "/dev/nvidia-uvm"}, {"dev"}, {}, ["dev3"]),
    ({"net0": "name=eth0,bridge=vmbr1,ip=dhcp"}, {"net"},
     {"net0": ("name=eth0,bridge=vmbr0,hwaddr=BC:24:11:AA:BB:CC,ip=dhcp,type=veth",
               "name=eth0,bridge=vmbr1,ip=dhcp,hwaddr=BC:24:11:AA:BB:CC")}, []),
    ({"features": ""}, set(), {}, ["features"]),
    ({"onboot": "1"}, set(), {"onboot": (None, "1")}, []),
])
def test_plan(want, families, changes, deletes):
    assert lc.plan(want, CURRENT, families) == (changes, deletes)


@pytest.mark.parametrize("want,needle", [
    ({"rootfs": "local-lvm:512"}, "CT 200's rootfs is 256G, wanted 512G: grow it with pct resize 200 rootfs 512G"),
    ({"rootfs": "fast:256"}, "CT 200's rootfs is on storage local-lvm, wanted fast: move it with pct move-volume"),
    ({"unprivileged": "1"}, "CT 200 is privileged, wanted unprivileged: that is fixed at creation"),
])
def test_create_only_refusals(want, needle):
    with pytest.raises(ValueError) as e:
        lc.check_create_only(want, CURRENT, 200)
    assert str(e.value).startswith(needle) and "\n" not in str(e.value)


@pytest.mark.parametrize("want", [{"rootfs": "local-lvm:128"}, {"rootfs": "local-lvm:256"}, {"unprivileged": "0"}])
def test_create_only_accepts_what_is_there_or_larger(want):
    lc.check_create_only(want, CURRENT, 200)


@pytest.mark.parametrize("changes,deletes,expected", [
    ({"memory": ("1", "2")}, [], []),
    ({"dev4": (None, "/dev/nvidia2")}, [], ["dev4"]),
    ({"mp0": (None, "/mnt/models,mp=/mnt/models,ro=1")}, [], ["mp0 (bind mount)"]),
    ({"mp2": (None, "local-lvm:8,mp=/x")}, [], []),
    ({"features": ("nesting=1", "nesting=1,keyctl=1")}, [], ["features (nesting=1,keyctl=1)"]),
    ({"features": (None, "nesting=1")}, [], []),
    ({}, ["dev3", "mp0", "mp1"], ["dev3 (delete)", "mp0 (delete)"]),
])
def test_root_only_keys(changes, deletes, expected):
    assert lc.root_only(changes, deletes, CURRENT, False) == expected
