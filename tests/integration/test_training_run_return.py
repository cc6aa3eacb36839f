"""training_run's RETURN documents exactly what it returns, in every state; --diff shows what would change.

Each scenario runs the real module (ansible-runner, local transport, the stand-in trainer as a real child).
"""
import json
import os
import signal
import time

import pytest
import yaml
from ansible_helpers import FAKE

from ansible_collections.dflash.ops.plugins.modules import pct_exec, training_run

pytestmark = pytest.mark.timeout(300)

# Keys Ansible itself adds or that every module may return (not part of a module's RETURN).
STANDARD = {"changed", "failed", "msg", "invocation", "warnings", "deprecations", "diff", "skipped",
            "skip_reason", "exception", "_ansible_no_log", "_ansible_verbose_always"}
# Documented keys only a live job over nodes returns: asserted by test_nodes_job_local (status of a two-node job;
# a second restart's reserve waiting for the first).
LIVE_JOB_OVER_NODES = {"slowest_node", "waited_for"}
NODES = [{"address": "127.0.0.1", "nproc_per_node": 1}, {"address": "127.0.0.2", "nproc_per_node": 1}]


def documented(module):
    return yaml.safe_load(module.RETURN)


def args(runs_root, name="r1", **extra):
    a = {"name": name, "transport": "local", "runs_root": str(runs_root), "command": [FAKE],
         "stop_timeout": 5, "heartbeat_timeout": 10}
    a.update(extra)
    return a


def scenarios(ansible, runs_root):
    """(label, ok, result) for every state and outcome of training_run. The calls between two steps of the test's
    own (a file written, a process killed) are the tasks of one ansible-playbook run, in order."""
    out = []

    def call(label, module_args, want_ok=True, check=False):
        return label, module_args, want_ok, check

    def run(*calls):
        results = ansible.modules("dflash.ops.training_run", [(a, check, False) for _, a, _, check in calls])
        for (label, _, want_ok, _), (ok, res) in zip(calls, results):
            assert ok is want_ok, (label, res.get("msg"))
            out.append((label, ok, res))
        return results[-1][1]

    run(call("status, never launched", args(runs_root, state="status")),
        call("restart, check mode", args(runs_root, trainer_args={"tag": "a"}), check=True),
        call("restart, launched", args(runs_root, trainer_args={"tag": "a"})),
        call("restart, same config", args(runs_root, trainer_args={"tag": "a"})),
        call("started, other config kept", args(runs_root, state="started", trainer_args={"tag": "b"})),
        call("status, alive", args(runs_root, state="status", status_log_lines=3)))
    # the layout advisor's plan.json in the run dir (dflash-train --plan writes it): its verdict in the status
    (runs_root / "r1" / "plan.json").write_text(json.dumps({"warning": None, "configured": {"seq_per_s": 3.27},
                                                            "best": {"seq_per_s": 4.35}}))
    killed = run(
        call("status, with a plan", args(runs_root, state="status")),
        # the stand-in trainer has no venv beside it: the report's one-line error (the page itself:
        # test_watch_run_local)
        call("status, report", args(runs_root, state="status", report=True)),
        call("stopped", args(runs_root, state="stopped")),
        call("stopped, nothing alive", args(runs_root, state="stopped")),
        # one step of a job over nodes: giving back a reservation nobody took
        call("job over nodes, release", args(runs_root, name="j1", nodes=NODES, node=0, rdzv_port=29400,
                                             job_step="release", job_token="t1")),
        call("status, finished", args(runs_root, state="status")),
        call("restart, then killed", args(runs_root, name="r2")))
    os.kill(killed["pid"], signal.SIGKILL)
    time.sleep(0.3)
    # A stopped container (pct as pve-container answers then): a stop does nothing and succeeds.
    pct = runs_root.parent / "pct-stopped"
    pct.write_text("#!/bin/sh\necho \"container '$2' not running!\" >&2\nexit 255\n")
    pct.chmod(0o755)
    run(call("status, dead", args(runs_root, name="r2", state="status")),
        call("restart, crash", args(runs_root, name="r3", trainer_args={"crash": 3}), want_ok=False),
        call("restart, no heartbeat", args(runs_root, name="r4", trainer_args={"no_heartbeat": True},
                                           heartbeat_timeout=1), want_ok=False),
        call("restart, refused by the trainer's check", args(runs_root, name="r5",
                                                             trainer_args={"refuse_check": "no"}), want_ok=False),
        call("stopped, container stopped", dict(args(runs_root, state="stopped"), transport="pct", vmid=201,
                                                pct_path=str(pct))))
    return out


def test_return_documents_exactly_the_returned_keys(ansible, runs_root):
    doc = documented(training_run)
    results = scenarios(ansible, runs_root)
    returned = set()
    for label, ok, res in results:
        keys = set(res) - STANDARD
        assert keys <= set(doc), "%s returned undocumented keys %s" % (label, sorted(keys - set(doc)))
        returned |= keys
        missing = [k for k, v in doc.items() if v["returned"] == "always" and k not in res]
        assert not missing, "%s lacks keys documented as always returned: %s" % (label, missing)
    assert returned | LIVE_JOB_OVER_NODES == set(doc), "documented but never returned: %s" % sorted(
        set(doc) - returned - LIVE_JOB_OVER_NODES)
    by_label = dict((label, res) for label, _, res in results)
    # The conditions that decide the trickier keys, as RETURN states them.
    assert "pid" not in by_label["restart, check mode"] and "would_stop" in by_label["restart, check mode"]
    assert by_label["status, dead"]["phase"] == "dead" and "dead_since" in by_label["status, dead"]
    assert "dead_since" not in by_label["status, alive"]
    assert by_label["status, with a plan"]["plan_best_seq_per_s"] == 4.35 and "plan_warning" not in by_label[
        "status, alive"]
    # nothing was reserved, so nothing was given back
    assert by_label["job over nodes, release"]["released"] is False and by_label["job over nodes, release"][
        "node"] == "node 0 (127.0.0.1)"
    assert by_label["status, report"]["report"]["error"].startswith("no trainer venv found for run r1")
    assert "heartbeat_age_s" not in by_label["status, never launched"]
    assert by_label["restart, crash"]["rc"] == 3 and by_label["restart, crash"]["log_tail"]
    assert by_label["status, never launched"]["state"] == "not running (never launched)"
    assert by_label["stopped, nothing alive"]["state"].startswith("not running (stopped by SIGTERM at step ")
    assert by_label["status, finished"]["state"] == by_label["stopped, nothing alive"]["state"]
    assert by_label["status, dead"]["state"].startswith("crashed (exit status not recorded")
    assert by_label["stopped, container stopped"]["state"] == "container stopped"


def test_pct_exec_return_documents_exactly_the_returned_keys(ansible, tmp_path):
    doc = documented(pct_exec)
    marker = tmp_path / "made"
    returned = set()
    calls = [(dict(module_args, transport="local"), check, False) for module_args, check in (
        ({"argv": ["touch", str(marker)], "creates": str(marker)}, True),
        ({"argv": ["touch", str(marker)], "creates": str(marker)}, False),
        ({"argv": ["touch", str(marker)], "creates": str(marker)}, False),
        ({"argv": ["false"], "expected_rc": [0]}, False))]
    for _, res in ansible.modules("dflash.ops.pct_exec", calls):  # one ansible-playbook run, the calls in order
        keys = set(res) - STANDARD
        assert keys <= set(doc), "undocumented keys %s" % sorted(keys - set(doc))
        returned |= keys
    assert returned == set(doc), "documented but never returned: %s" % sorted(set(doc) - returned)


def test_diff_shows_the_configuration_change_and_the_runs_that_would_stop(ansible, runs_root):
    for index in (0, 1):  # without NVML a GPU index needs its device file (stand-ins for /dev/nvidiaN)
        (runs_root / ("nv%d" % index)).write_text("")
    gpu_files = str(runs_root / "nv{index}")
    # one ansible-playbook run, the calls in order: a launch, then four in check mode with --diff
    (ok, first), (ok_other, other), (ok_same, same), (ok_changed, changed), (ok_stop, stop) = ansible.modules(
        "dflash.ops.training_run", [
            (args(runs_root, trainer_args={"tag": "a"}, gpus=[0], gpu_device_pattern=gpu_files), False, False),
            (args(runs_root, name="r2", trainer_args={"tag": "b"}, gpus=[0, 1], gpu_device_pattern=gpu_files), True,
             True),
            (args(runs_root, trainer_args={"tag": "a"}, gpus=[0], gpu_device_pattern=gpu_files), True, True),
            (args(runs_root, trainer_args={"tag": "c"}, gpus=[0], gpu_device_pattern=gpu_files), True, True),
            (args(runs_root, state="stopped"), True, True)])
    assert ok, first.get("msg")
    assert ok_other and other["changed"], other.get("msg")
    before, after = other["diff"]["before"], other["diff"]["after"]
    assert before["alive"] is False and before["fingerprint"] is None
    assert before["alive_on_its_gpus"] == ["r1"], "r1 shares GPU 0 and would be stopped"
    assert after["alive"] is True and after["alive_on_its_gpus"] == ["r2"] and after["gpus"] == [0, 1]
    assert after["argv"] == [FAKE, "--tag=b"]
    # after every call in check mode: r1's run dir (the launch), nothing of r2
    assert os.path.exists(str(runs_root / "r1" / "pid")) and not (runs_root / "r2").exists(), "check mode acts"

    assert ok_same and not same["changed"] and same["diff"]["before"] == same["diff"]["after"]

    before, after = changed["diff"]["before"], changed["diff"]["after"]
    assert ok_changed and changed["changed"] and before["fingerprint"] == first["fingerprint"] != after["fingerprint"]
    assert (before["argv"], after["argv"]) == ([FAKE, "--tag=a"], [FAKE, "--tag=c"])

    assert ok_stop and stop["changed"] and stop["diff"]["before"]["alive"] and not stop["diff"]["after"]["alive"]
    assert stop["diff"]["after"]["alive_on_its_gpus"] == []
