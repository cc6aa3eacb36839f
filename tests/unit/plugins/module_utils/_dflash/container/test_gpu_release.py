"""The GPU release wait. NVML cannot run on these machines (no driver), so the NVML side is a stand-in module
that answers as pynvml does (bytes in .used, process objects with .pid, NVMLError from nvmlInit without a
driver); the device-file side uses real open files."""
import sys
import time
import types

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import gpu_release

MiB = 1024 * 1024


class FakeNvml(types.ModuleType):
    """pynvml stand-in: per-GPU memory that is released `release_after` seconds after creation."""

    class NVMLError(Exception):
        pass

    def __init__(self, used_mib, procs=None, release_after=None, count=8, no_driver=False):
        types.ModuleType.__init__(self, "pynvml")
        self.used_mib, self.procs, self.count, self.no_driver = used_mib, procs or {}, count, no_driver
        self.release_at = time.monotonic() + release_after if release_after is not None else None
        self.inits = 0

    def nvmlInit(self):
        if self.no_driver:
            raise self.NVMLError("NVML Shared Library Not Found")
        self.inits += 1

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def _released(self):
        return self.release_at is not None and time.monotonic() >= self.release_at

    def nvmlDeviceGetMemoryInfo(self, handle):
        used = 300 if self._released() else self.used_mib.get(handle, 300)
        return types.SimpleNamespace(used=used * MiB, total=143771 * MiB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if self._released():
            return []
        return [types.SimpleNamespace(pid=p, usedGpuMemory=None) for p in self.procs.get(handle, [])]


@pytest.fixture
def nvml(monkeypatch):
    def install(**kw):
        fake = FakeNvml(**kw)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake
    return install


def test_waits_until_memory_is_released(nvml, tmp_path):
    fake = nvml(used_mib={5: 70000, 6: 900}, procs={5: [4242]}, release_after=0.6)
    res = gpu_release.wait_for_release([5, 6], str(tmp_path / "nvidia{index}"), 1024, timeout_s=10, poll_s=0.05)
    assert not res["skipped"] and res["nvml"] == "used"
    assert 0.5 <= res["waited_s"] < 5 and fake.inits > 2


def test_timeout_names_what_holds_the_memory(nvml, tmp_path):
    nvml(used_mib={5: 70000}, procs={5: [4242]})
    with pytest.raises(RuntimeError) as exc:
        gpu_release.wait_for_release([5, 6], str(tmp_path / "nvidia{index}"), 1024, timeout_s=0.3, poll_s=0.05)
    msg = str(exc.value)
    assert "GPU 5 has 70000 MiB in use by pids [4242]" in msg and "GPU 6" not in msg and "\n" not in msg


def test_memory_under_threshold_counts_as_released(nvml, tmp_path):
    nvml(used_mib={0: 1023})
    # Held memory would make it wait the whole timeout and raise; released, it returns at its first look.
    res = gpu_release.wait_for_release([0], str(tmp_path / "nvidia{index}"), 1024, timeout_s=30)
    assert not res["skipped"] and res["nvml"] == "used" and res["waited_s"] < 30


def test_missing_gpu_is_refused_before_anything_happens(nvml):
    nvml(used_mib={}, count=2)
    gpu_release.check_gpus_exist([0, 1])
    with pytest.raises(ValueError, match=r"GPU 5,7 does not exist here: NVML sees 2 GPUs \(0-1\); fix"):
        gpu_release.check_gpus_exist([0, 5, 7])


def test_gpu_check_is_silent_without_nvml(nvml):
    nvml(used_mib={}, no_driver=True)
    gpu_release.check_gpus_exist([5])


def test_without_nvml_gpu_indexes_are_checked_against_their_device_files(nvml, tmp_path):
    nvml(used_mib={}, no_driver=True)
    pattern = str(tmp_path / "nvidia{index}")
    for index in (0, 1):
        (tmp_path / ("nvidia%d" % index)).write_text("")
    gpu_release.check_gpus_exist([0, 1], pattern)
    with pytest.raises(ValueError) as exc:
        gpu_release.check_gpus_exist([0, 1, 99, 7], pattern)
    msg = str(exc.value)
    assert msg.startswith("GPU 99,7 does not exist here: no device file %s, %s, and NVML is unusable (NVML could "
                          "not start" % (tmp_path / "nvidia99", tmp_path / "nvidia7")), msg
    assert "fix the run's GPU lists (dflash_target_gpus / dflash_drafter_gpus)" in msg


def test_with_nvml_the_device_files_are_not_what_decides(nvml, tmp_path):
    nvml(used_mib={}, count=2)
    gpu_release.check_gpus_exist([0, 1], str(tmp_path / "nvidia{index}"))  # NVML sees them; no files needed


def test_no_driver_says_the_wait_was_skipped(nvml, tmp_path):
    nvml(used_mib={}, no_driver=True)
    res = gpu_release.wait_for_release([0], str(tmp_path / "nvidia{index}"), 1024, timeout_s=0.1)
    assert res["skipped"] and "NVML could not start" in res["reason"] and "device files were checked" in res["reason"]


def test_no_gpus_no_wait():
    res = gpu_release.wait_for_release([], "/dev/nvidia{index}", 1024, timeout_s=0.1)
    assert res["skipped"] and res["reason"] == "no GPUs configured for this run"


def test_device_file_holder_blocks_until_closed(nvml, tmp_path):
    nvml(used_mib={}, no_driver=True)
    dev = tmp_path / "nvidia3"
    dev.write_text("")
    import subprocess
    holder = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1]); time.sleep(0.8)",
                               str(dev)])
    try:
        time.sleep(0.3)
        res = gpu_release.wait_for_release([3], str(tmp_path / "nvidia{index}"), 1024, timeout_s=10, poll_s=0.05)
        assert res["waited_s"] > 0.2
    finally:
        holder.wait()
