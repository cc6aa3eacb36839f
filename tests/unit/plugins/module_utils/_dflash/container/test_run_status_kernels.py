"""run_status.status shows which linear-attention code the target runs (dflash-train's `target kernels:` line,
issue 31), from a heartbeat written by the trainer's own Heartbeat. Skipped where the trainer is not installed."""
import sys

import pytest

from ansible_collections.dflash.ops.plugins.module_utils._dflash.container import run_status
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller import run_config, training_backend

heartbeat = pytest.importorskip("dflash_trainer.telemetry.heartbeat")
pytestmark = pytest.mark.checkout  # ansible-test units skips it (tests/unit/conftest.py)


def status_of(run_dir, **fields):
    hb = heartbeat.Heartbeat(str(run_dir))
    hb.update(pid=4242, **fields)
    hb.set_phase("training")
    p = training_backend.argument_spec().defaults()
    p.update(name=run_dir.name, state="status", transport="local", runs_root=str(run_dir.parent),
             command=[sys.executable, "-c", ""])
    return run_status.status(run_config.build_request(p))


@pytest.fixture
def run_dir(tmp_path):
    d = tmp_path / "runs" / "r1"
    d.mkdir(parents=True)
    (d / "pid").write_text("4242\n")
    return d


def test_status_shows_the_target_kernels_line(run_dir):
    line = "48 linear-attention layers: gated delta rule by flash-linear-attention 0.6.0 (chunked Triton kernels)"
    assert status_of(run_dir, target_kernels=line)["target_kernels"] == line


def test_an_older_trainers_heartbeat_has_none(run_dir):
    assert status_of(run_dir)["target_kernels"] is None


def test_status_shows_the_plan_warning_from_plan_json(run_dir):
    from dflash_trainer.advisor import predict
    from dflash_trainer.telemetry.heartbeat import write_json_atomic
    configured, best = predict.split_rate(5, 3, 0.709, 0.919), predict.split_rate(4, 4, 0.709, 0.919)
    warning = predict.verdict(configured, best)
    assert warning and "4 + 4" in warning and "drafter-bound" in warning
    write_json_atomic(str(run_dir / "plan.json"), {"configured": configured, "best": best, "warning": warning})
    st = status_of(run_dir)
    assert st["plan_warning"] == warning and st["plan_best_seq_per_s"] == pytest.approx(4 / 0.919)


def test_no_plan_no_plan_fields(run_dir):
    assert "plan_warning" not in status_of(run_dir)
