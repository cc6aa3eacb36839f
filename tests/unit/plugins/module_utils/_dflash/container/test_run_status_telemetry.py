"""run_status.status on a run dir whose heartbeat.json and telemetry.jsonl are written by the trainer's own writers
(dflash_trainer.telemetry.heartbeat.Heartbeat, dflash_trainer.telemetry.writers.NvmlTelemetry): per-GPU utilization from the last
telemetry rows, the hidden-state queue's depth, and the slowest rank from the heartbeat's `ranks`.

This machine has no NVIDIA driver, so NvmlTelemetry reads a stand-in `pynvml` module (the calls it makes, with
numbers per GPU that change per reading); everything else is the trainer's code. ansible-test's units venv has no
trainer: there these tests are skipped (scripts/test's .venv has it)."""
import json
import sys
import time
import types

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import job_ranks, run_status
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import run_config, training_backend

heartbeat = pytest.importorskip("dflash_trainer.telemetry.heartbeat")
telemetry = pytest.importorskip("dflash_trainer.telemetry.writers")
pytestmark = pytest.mark.checkout  # ansible-test units skips it (tests/unit/conftest.py)


def standin_pynvml(readings):
    """A pynvml whose GPU i reports utilization readings[i][n] at its n-th reading."""
    count = {i: 0 for i in range(len(readings))}

    def utilization(i):
        value = readings[i][min(count[i], len(readings[i]) - 1)]
        count[i] += 1
        return types.SimpleNamespace(gpu=value, memory=0)

    return types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0, nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: len(readings), nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=utilization,
        nvmlDeviceGetMemoryInfo=lambda i: types.SimpleNamespace(used=(10 + i) * 2**30, total=80 * 2**30),
        nvmlDeviceGetPowerUsage=lambda i: 300000 + i, nvmlDeviceGetTemperature=lambda i, kind: 60 + i)


def status_req(runs_root, name="r1"):
    p = training_backend.argument_spec().defaults()
    p.update(name=name, state="status", transport="local", runs_root=str(runs_root), command=[sys.executable, "-c", ""])
    return run_config.build_request(p)


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "runs" / "r1"
    d.mkdir(parents=True)
    (d / "pid").write_text("4242\n")  # the launched agent's pid: the heartbeat below is that launch's
    return d


def write_heartbeat(run_dir, **fields):
    hb = heartbeat.Heartbeat(str(run_dir))
    hb.update(pid=4242, **fields)
    hb.set_phase("training")


def test_status_shows_the_last_reading_of_each_gpu_the_queue_and_the_slowest_rank(run_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", standin_pynvml([[11, 55, 97], [12, 66, 3]]))
    readers = [telemetry.NvmlTelemetry(str(run_dir), 60, [gpu], rank=rank) for rank, gpu in ((0, 0), (5, 1))]
    for step in range(3):
        for reader in readers:
            reader.read(step)
    for reader in readers:
        reader.close()
    now = time.time()
    write_heartbeat(run_dir, step=40, queue_depth=27, ranks={
        "0": {"role": "target", "step": 44, "items": 90, "updated_at": now},
        "4": {"role": "drafter", "step": 40, "items": 40, "updated_at": now},
        "5": {"role": "drafter", "step": 37, "items": 37, "updated_at": now - 12},
        "1": {"role": "target", "step": 10, "items": 20, "updated_at": now - 99, "done": True}})

    st = run_status.status(status_req(run_dir.parent))
    gpus = st["gpu_utilization"]
    assert [(g["gpu"], g["rank"], g["util_pct"]) for g in gpus] == [(0, 0, 97), (1, 5, 3)]  # the last readings
    assert gpus[1]["mem_used_mb"] == 11 * 1024 and gpus[1]["power_w"] == pytest.approx(300.001)
    assert gpus[0]["temp_c"] == 60 and all(0 <= g["age_s"] < 60 for g in gpus)
    assert st["queue_depth"] == 27
    slow = st["slowest_rank"]  # rank 1 is lower but done: it is not holding anyone up
    assert (slow["rank"], slow["role"], slow["step"], slow["steps_behind"]) == (5, "drafter", 37, 7)
    assert slow["updated_s_ago"] >= 12


def test_status_of_one_process_without_nvml_has_no_utilization_and_no_slowest_rank(run_dir):
    write_heartbeat(run_dir, step=3)
    st = run_status.status(status_req(run_dir.parent))
    assert st["gpu_utilization"] is None and st["slowest_rank"] is None and st["queue_depth"] is None


def test_a_torn_or_foreign_telemetry_line_is_skipped(run_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", standin_pynvml([[42]]))
    with open(run_dir / "telemetry.jsonl", "w") as f:
        f.write('{"gpu": 0, "util_pct": 9\n')  # a row cut off (the disk filled up)
    reader = telemetry.NvmlTelemetry(str(run_dir), 60, [0])
    reader.read(1)
    reader.close()
    with open(run_dir / "telemetry.jsonl", "a") as f:
        f.write(json.dumps({"gpu": 0, "error": "Unknown Error"}) + "\n")  # a failed reading
    write_heartbeat(run_dir, step=1)
    st = run_status.status(status_req(run_dir.parent))
    assert [(g["gpu"], g["util_pct"]) for g in st["gpu_utilization"]] == [(0, 42)]


def test_slowest_rank_ties_go_to_the_oldest_update():
    hb = {"ranks": {"2": {"role": "drafter", "step": 5, "updated_at": 100.0},
                    "3": {"role": "drafter", "step": 5, "updated_at": 90.0}}}
    assert job_ranks.slowest_rank(hb, 100.0) == {"rank": 3, "role": "drafter", "step": 5, "steps_behind": 0,
                                                 "updated_s_ago": 10.0}
