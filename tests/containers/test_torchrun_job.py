"""A three-process torchrun job of the real trainer (checkout's trainer/ wheel, gloo, the tiny target) in a real
container, driven by the project's playbooks (restart_training.yml / training_status.yml / stop_training.yml) over
ssh -tt + pct: a forced restart leaves exactly one job's processes and no orphan rank; stop ends them all.

The run is declared here (extra vars over the harness inventory): nproc_per_node 3, 1 target rank + 2 drafter ranks
on the CPU. The container is vmid 213 (through host ct200's connection), apart from the other container tests."""
import pytest

from harness.fixtures import REPO_ROOT

pytestmark = pytest.mark.containers
PLAYBOOKS = REPO_ROOT / "playbooks"
VMID = 213
RUN = "tiny3"
RUN_DIR = f"/workspace/runs/{RUN}"
VARS = {"run": RUN, "dflash_vmid": VMID, "dflash_runs": {RUN: {"nproc_per_node": 3,
        "trainer_args": {"target_gpus": [], "drafter_gpus": [], "target_ranks": 1, "hs_queue_depth": 3,
                         "hs_queue_min_ready": 2}}}}


def failure(result, play_result):
    return "%s\n%s\n%s" % (result.get("msg"), "\n".join(result.get("log_tail") or []), play_result.stdout[-1500:])


def job_pids(ct):
    """Pids (the container's) of every live process with the run's DFLASH_RUN_DIR: the agent, its ranks, theirs."""
    out = ct.sh(f"for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qx DFLASH_RUN_DIR={RUN_DIR}"
                " && [ \"$(cut -d' ' -f3 $p/stat)\" != Z ] && echo ${p#/proc/}; done; true").stdout
    return {int(x) for x in out.split()}


def test_torchrun_job_restart_leaves_one_jobs_processes_and_stop_ends_them_all(play, make_container):
    ct = make_container(VMID, trainer=True)
    r1 = play(PLAYBOOKS / "restart_training.yml", VARS, limit="ct200")
    first = r1.task(f"Training run {RUN}: restarted")
    assert r1.rc == 0 and first["action"] == "launched", failure(first, r1)
    assert [(k["rank"], k["role"], k["alive"]) for k in first["ranks"]] == [
        (0, "target", True), (1, "drafter", True), (2, "drafter", True)], first["ranks"]
    old = {first["pid"]} | {k["pid"] for k in first["ranks"]}
    assert job_pids(ct) == old
    st = play(PLAYBOOKS / "training_status.yml", VARS, limit="ct200")
    assert st.rc == 0 and "rank 2 drafter: pid %d alive" % first["ranks"][2]["pid"] in st.stdout, st.stdout[-2000:]

    r2 = play(PLAYBOOKS / "restart_training.yml", {**VARS, "force": True}, limit="ct200")
    second = r2.task(f"Training run {RUN}: restarted")
    assert r2.rc == 0 and second["action"] == "launched", failure(second, r2)
    (stop,) = second["stopped"]
    assert stop["signal"] == "SIGTERM" and sorted(stop["ranks"]) == sorted(k["pid"] for k in first["ranks"]), stop
    new = {second["pid"]} | {k["pid"] for k in second["ranks"]}
    assert len(new) == 4 and not new & old
    assert job_pids(ct) == new  # exactly one job's processes: no rank of the first job is left

    sp = play(PLAYBOOKS / "stop_training.yml", VARS, limit="ct200")
    done = sp.task(f"Training run {RUN}: stopped")
    assert sp.rc == 0 and done["action"] == "stopped" and done["stopped"][0]["signal"] == "SIGTERM", done
    assert job_pids(ct) == set()
    print(f"\n[harness] torchrun job of 3 via ssh+pct: launch {r1.seconds:.1f}s, forced restart {r2.seconds:.1f}s "
          f"(stop {stop['waited_s']}s), stop {sp.seconds:.1f}s")
