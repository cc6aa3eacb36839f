"""Pure config generation: GPU device selection and devN entries, /proc/devices parsing, raw GPU lines for PVE < 8.1,
the /dev/shm line and the memory arithmetic (table-driven)."""
import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.proxmox import gpu, lxc_config, memory

HOST = ["/dev/nvidia%d" % i for i in range(8)] + [
    "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset",
    "/dev/nvidia-caps/nvidia-cap2", "/dev/nvidia-caps/nvidia-cap1"]

PROC_DEVICES = """Character devices:
  1 mem
  4 /dev/vc/0
195 nvidia-frontend
195 nvidia
235 nvidia-caps
509 nvidia-uvm
510 nvidia-nvlink

Block devices:
  8 sd
509 nvidia-uvm-fake-block
"""


@pytest.mark.parametrize("gpus,host,expected", [
    ([], HOST, []),
    (None, HOST, []),
    ([0], ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"], ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"]),
    ([5, 2], HOST, ["/dev/nvidia5", "/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                    "/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"]),
    (list(range(8)), HOST, ["/dev/nvidia%d" % i for i in range(8)] + [
        "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2"]),
])
def test_gpu_device_paths(gpus, host, expected):
    assert gpu.gpu_device_paths(gpus, host) == expected


@pytest.mark.parametrize("gpus,host,needle", [
    ([8], HOST, "/dev/nvidia8 not on the host (it has GPUs 0,1,2,3,4,5,6,7)"),
    ([0], ["/dev/nvidia0", "/dev/nvidiactl"], "/dev/nvidia-uvm not on the host"),
    ([0], [], "/dev/nvidia0, /dev/nvidiactl, /dev/nvidia-uvm not on the host (it has GPUs none)"),
    ([1, 1], HOST, "gpus must be distinct"),
    ([-1], HOST, "gpus must be distinct indexes >= 0"),
])
def test_gpu_device_paths_refusals(gpus, host, needle):
    with pytest.raises(ValueError) as e:
        gpu.gpu_device_paths(gpus, host)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_dev_entries_number_from_zero():
    assert lxc_config.dev_entries_for(["/dev/nvidia3", "/dev/nvidiactl"]) == {"dev0": "/dev/nvidia3",
                                                                             "dev1": "/dev/nvidiactl"}


@pytest.mark.parametrize("text,expected", [
    (PROC_DEVICES, {"mem": 1, "/dev/vc/0": 4, "nvidia-frontend": 195, "nvidia": 195, "nvidia-caps": 235,
                    "nvidia-uvm": 509, "nvidia-nvlink": 510}),
    ("Character devices:\n511 nvidia-uvm\n", {"nvidia-uvm": 511}),
    ("", {}),
    ("Block devices:\n509 nvidia-uvm\n", {}),
])
def test_parse_proc_devices(text, expected):
    assert gpu.parse_proc_devices(text) == expected


@pytest.mark.parametrize("paths,majors,expected", [
    (["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"], {"nvidia-frontend": 195, "nvidia-uvm": 509}, [195, 509]),
    (["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap1"], {"nvidia": 195, "nvidia-uvm": 237, "nvidia-caps": 236},
     [195, 236, 237]),
    ([], {}, []),
])
def test_needed_majors(paths, majors, expected):
    assert gpu.needed_majors(paths, majors) == expected


@pytest.mark.parametrize("majors,needle", [
    ({"nvidia-frontend": 195}, "nvidia-uvm has no character device major"),
    ({"nvidia-uvm": 509}, "the NVIDIA driver has no character device major"),
])
def test_needed_majors_without_the_driver(majors, needle):
    with pytest.raises(ValueError) as e:
        gpu.needed_majors(["/dev/nvidia0"], majors)
    assert needle in str(e.value)


def test_raw_gpu_lines():
    paths = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1"]
    assert gpu.raw_gpu_lines(paths, gpu.parse_proc_devices(PROC_DEVICES)) == [
        "lxc.cgroup2.devices.allow: c 195:* rwm",
        "lxc.cgroup2.devices.allow: c 235:* rwm",
        "lxc.cgroup2.devices.allow: c 509:* rwm",
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file",
        "lxc.mount.entry: /dev/nvidia-caps/nvidia-cap1 dev/nvidia-caps/nvidia-cap1 none bind,optional,create=file",
    ]


def test_shm_line():
    assert gpu.shm_line(57) == "lxc.mount.entry: tmpfs dev/shm tmpfs nodev,nosuid,size=57g,mode=1777,create=dir 0 0"


@pytest.mark.parametrize("weights,margin,expected", [
    (51, 0.1, 57),        # 56.1 → 57: the example inventory's 27B target
    (50, 0.1, 55),        # 55.000000000000007 in floating point must stay 55
    (54, 0.0, 54),
    (0.5, 0.1, 1),
    (None, 0.1, 0),
    (0, 0.1, 0),
    (100, 0.25, 125),
])
def test_shm_size_gib(weights, margin, expected):
    assert memory.shm_size_gib(weights, margin) == expected


def test_negative_margin_is_refused():
    with pytest.raises(ValueError, match="shm_margin must be 0 or more"):
        memory.shm_size_gib(10, -0.1)


@pytest.mark.parametrize("memory_mib,shm,trainer,needed", [
    (86016, 60, 24, 86016),
    (196608, 57, 96, 156672),
    (512, 0, 0, 0),
    (4096, 1, 1.5, 2560),
])
def test_memory_that_fits(memory_mib, shm, trainer, needed):
    assert memory.check_memory(memory_mib, shm, trainer) == needed


@pytest.mark.parametrize("memory_mib,shm,trainer,msg", [
    (65536, 60, 24, "memory 65536 MiB < /dev/shm 60 GiB + trainer 24 GiB = 86016 MiB (tmpfs pages count against the "
                    "container's memory): raise memory to at least 86016, or lower weights_gib, shm_margin or "
                    "trainer_memory_gib"),
    (86015, 60, 24, "memory 86015 MiB < /dev/shm 60 GiB + trainer 24 GiB = 86016 MiB"),
    (2048, 1, 1.5, "memory 2048 MiB < /dev/shm 1 GiB + trainer 1.5 GiB = 2560 MiB"),
])
def test_memory_too_small_is_refused_with_the_numbers(memory_mib, shm, trainer, msg):
    with pytest.raises(ValueError) as e:
        memory.check_memory(memory_mib, shm, trainer)
    assert str(e.value).startswith(msg) and "\n" not in str(e.value)
