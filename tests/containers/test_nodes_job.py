"""A torchrun job over two real LXC containers acting as two nodes, driven by the project's playbooks over ssh -tt +
pct (restart_training.yml, training_status.yml, stop_training.yml): the real trainer on the CPU (gloo), 1 target
rank + 1 drafter rank on node 0 (vmid 210, 127.0.0.1) and 1 drafter rank on node 1 (vmid 211, 127.0.0.2).

The network between them is one the test makes and removes (tests/harness/nodes.py: a network namespace both
containers join; nothing in the host's own changes), and the checkpoints every rank reads at a resume are in a host
directory the test made, bind-mounted at /workspace/shared in both. One job is reused across the cases (module
scope): launched, restarted with a changed flag and resumed (no batch repeated or skipped, against a one-process
reference's batch order), stopped; a rank SIGKILLed on node 1 ends it on both nodes; node 1's container stopped
mid-run ends it on node 0 too (no hang holding node 0's ranks), and a restart leaves exactly one job."""
import json
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
import yaml

from harness import lxc, nodes
from harness.fixtures import HARNESS_INVENTORY, REPO_ROOT, _prepare_clone, install_trainer, make_tiny
from harness.waiting import wait_for

pytestmark = [pytest.mark.containers, pytest.mark.slow]
PLAYBOOKS = REPO_ROOT / "playbooks"
VMIDS = (210, 211)
RUN = "tiny2n"
RUN_DIR = f"/workspace/runs/{RUN}"
TRAINER_ARGS = {"target_gpus": [], "drafter_gpus": [], "target_ranks": 1, "hs_queue_depth": 3,
                "hs_queue_min_ready": 2, "log_interval": 1, "heartbeat_interval": 0.5, "checkpoint_interval": 1000,
                "output_dir": f"{nodes.SHARED_CT}/{RUN}"}
# 0.2 s after each step (the trainer's test hook): the job lives through many plays, and the reference of the rank
# test trains again every step it took
RUN_CONFIG = {"nodes": [{"host": "node0", "nproc_per_node": 2}, {"host": "node1", "nproc_per_node": 1}],
              "rdzv_port": 29477, "trainer_args": TRAINER_ARGS, "env": {"DFLASH_DEBUG_STEP_PAUSE_S": "0.2"}}


def inventory(path: Path) -> Path:
    """The harness inventory's connection and group settings, with the two nodes as its hosts."""
    base = yaml.safe_load(HARNESS_INVENTORY.read_text())["dflash_training"]["vars"]
    group = yaml.safe_load((HARNESS_INVENTORY.parent / "group_vars" / "dflash_training.yml").read_text())
    # no wait for the training phase: a node's part counts as launched once its agent and ranks run (and node 0's
    # heartbeat is written); the test waits for the steps it needs itself
    group.update(dflash_runs={RUN: RUN_CONFIG}, dflash_stop_timeout=30, dflash_heartbeat_timeout=60,
                 dflash_wait_for_phase=None)
    hosts = {"node0": {"dflash_vmid": VMIDS[0], "dflash_node_address": "127.0.0.1"},
             "node1": {"dflash_vmid": VMIDS[1], "dflash_node_address": "127.0.0.2"}}
    path.write_text(yaml.safe_dump({"dflash_training": {"vars": {**base, **group}, "hosts": hosts}}))
    return path


def job_pids(ct):
    """Live processes (the container's pids) with the run's DFLASH_RUN_DIR: the agent, its ranks, theirs."""
    out = ct.sh(f"for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null | grep -qx DFLASH_RUN_DIR={RUN_DIR}"
                " && [ \"$(cut -d' ' -f3 $p/stat)\" != Z ] && echo ${p#/proc/}; done; true").stdout
    return {int(x) for x in out.split()}


def job_result(play_result, host):
    """The role's result for the job on one node (what its report prints)."""
    return play_result.task("Job on this node: tiny2n", host)["ansible_facts"]["__training_result"]


def failure(play_result):
    return play_result.stdout[-4000:]


@pytest.fixture(scope="module")
def cluster(golden, trainer_wheel, tmp_path_factory):
    """Both containers on the test's own network, each with the checkout's trainer and the tiny target."""
    net = nodes.PrivateNetwork()
    shared = Path(tempfile.mkdtemp(prefix="dflash-nodes-shared-"))
    made = []
    try:
        wait_for(net.ready, 10, "the test's network namespace")
        cts = []
        for vmid in VMIDS:
            ct = _prepare_clone(golden, vmid, start=False)
            made.append(ct)
            nodes.join(ct.name, net, shared)
            cts.append(ct)
        errors = []

        def prepare(ct):
            try:
                lxc.start(ct.name)
                lxc.wait_ready(ct.name)
                install_trainer(ct, trainer_wheel)
                make_tiny(ct)
            except Exception as exc:  # noqa: BLE001 - reported below, from the test's thread
                errors.append(f"{ct.name}: {exc}")

        threads = [threading.Thread(target=prepare, args=(ct,)) for ct in cts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        # one network: both containers see the same namespace, which is not the host's
        ns = [ct.sh("readlink /proc/1/ns/net").stdout.strip() for ct in cts]
        assert ns[0] == ns[1] != str(Path("/proc/self/ns/net").readlink()), ns
        yield cts, inventory(tmp_path_factory.mktemp("nodes-inv") / "hosts.yml")
    finally:
        for ct in made:
            lxc.stop(ct.name, kill=True)
            lxc.destroy(ct.name)
        net.stop()
        shutil.rmtree(shared, ignore_errors=True)


PLAY_SECONDS = []  # (what, seconds) of every play, printed at the end of the module


def run(play, inv, what, playbook, **extra):
    r = play(PLAYBOOKS / playbook, {"run": RUN, **extra}, inventory=inv)
    PLAY_SECONDS.append((what, round(r.seconds, 1)))
    assert r.rc == 0, failure(r)
    return r


def restart(play, inv, what, **extra):
    return run(play, inv, what, "restart_training.yml", **extra)


@pytest.fixture(scope="module", autouse=True)
def report_times():
    yield
    print("\n[harness] job over two nodes, seconds per play: " + ", ".join("%s %s" % w for w in PLAY_SECONDS))


def metrics(ct):
    return [json.loads(line) for line in (ct.read(f"{RUN_DIR}/metrics.jsonl") or "").splitlines() if line.strip()]


def step_of(ct):
    return (ct.read_json(f"{RUN_DIR}/heartbeat.json") or {}).get("step") or 0


def test_a_job_over_two_nodes_launches_is_kept_and_restarts_with_a_changed_flag_resuming(cluster, play):
    (n0, n1), inv = cluster
    r1 = restart(play, inv, "launch")
    a0, a1 = job_result(r1, "node0"), job_result(r1, "node1")
    first0, first1 = r1.task("Training job tiny2n: verify", "node0"), r1.task("Training job tiny2n: verify", "node1")
    assert [(k["rank"], k["role"], k["node"]) for k in first0["ranks"]] == [(0, "target", 0), (1, "drafter", 0)]
    assert [(k["rank"], k["role"], k["node"]) for k in first1["ranks"]] == [(2, "drafter", 1)]
    old0, old1 = job_pids(n0), job_pids(n1)
    assert old0 == {first0["pid"]} | {k["pid"] for k in first0["ranks"]} and len(old1) == 2
    launch0, launch1 = n0.read_json(f"{RUN_DIR}/launch.json"), n1.read_json(f"{RUN_DIR}/launch.json")
    assert launch0["job"]["nodes"] == launch1["job"]["nodes"] == [
        {"address": "127.0.0.1", "nproc_per_node": 2}, {"address": "127.0.0.2", "nproc_per_node": 1}]
    assert a0["job_token"] == a1["job_token"] and f"-{a0['job_token']}" in " ".join(launch1["argv"])

    # the same again: a no-op for the whole job
    again = restart(play, inv, "no-op")
    assert job_result(again, "node0")["action"] == "noop"
    assert job_pids(n0) == old0 and job_pids(n1) == old1
    wait_for(lambda: step_of(n0) >= 1, 180, "an optimizer step of the job")
    st = run(play, inv, "status", "training_status.yml")
    assert "node 1 (127.0.0.2) of the job over 2 nodes" in st.stdout, failure(st)

    # a changed flag: both nodes' ranks stop (the drafters checkpoint to the shared dir), one new job resumes
    r2 = restart(play, inv, "changed flag",
                 dflash_runs={RUN: {**RUN_CONFIG, "trainer_args": {**TRAINER_ARGS, "hs_queue_depth": 4}}})
    stops = [r2.task("Training job tiny2n: stop", f"node{n}")["stopped"] for n in (0, 1)]
    assert [s[0]["signal"] for s in stops] == ["SIGTERM", "SIGTERM"], stops
    new0, new1 = job_pids(n0), job_pids(n1)
    assert len(new0) == 3 and len(new1) == 2 and not new0 & old0 and not new1 & old1
    saved = wait_for(lambda: "resumed from" in (n0.read(f"{RUN_DIR}/train.log") or ""), 120, "the resume")
    resumed_at = step_of(n0)
    wait_for(lambda: step_of(n0) > resumed_at, 120, "a step after the resume")
    assert saved


def test_a_rank_killed_on_node_1_ends_the_job_on_both_nodes_and_no_batch_was_repeated_or_skipped(cluster, play):
    (n0, n1), inv = cluster
    if not job_pids(n1):
        restart(play, inv, "launch again")
    (rank2,) = [int(p) for p in n1.sh(f"cat {RUN_DIR}/ranks/2.pid").stdout.split()]
    n1.sh(f"kill -KILL {rank2}")
    wait_for(lambda: not job_pids(n0) and not job_pids(n1), 60, "the job's end on both nodes")

    # the jobs so far (launch, then the resume after the changed flag): their steps and each step's data against a
    # one-process run's (the same 2 micro-batches per optimizer step: 1 process x 2 = 2 drafter ranks x 1)
    rows = metrics(n0)
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, len(steps) + 1)), steps
    ref = f"/tmp/{RUN}-reference"
    args = " ".join(f"--{k.replace('_', '-')}={v}" for k, v in group_trainer_args().items())
    n0.sh(f"OMP_NUM_THREADS=1 dflash-train {args} --grad-accum=2 --max-steps={len(steps)} --output-dir={ref} "
          f"--run-dir={ref} > {ref}.log 2>&1 || {{ tail -20 {ref}.log; exit 1; }}", timeout=300)
    reference = [json.loads(x) for x in n0.read(f"{ref}/metrics.jsonl").splitlines() if x.strip()]
    assert [r["data_crc"] for r in rows] == [r["data_crc"] for r in reference]


def group_trainer_args():
    group = yaml.safe_load((HARNESS_INVENTORY.parent / "group_vars" / "dflash_training.yml").read_text())
    args = {k: v for k, v in group["dflash_run_defaults"]["trainer_args"].items()
            if k not in ("output_dir", "grad_accum")}
    args.update(log_interval=1)
    return args


def test_node_1_stopped_mid_run_ends_the_job_and_a_restart_leaves_one_job_then_stop_ends_it(cluster, play):
    (n0, n1), inv = cluster
    restart(play, inv, "launch")
    lxc.stop(n1.name, kill=True)
    # node 0's ranks lose their peer: the job ends there too, not hanging on its ranks
    wait_for(lambda: not job_pids(n0), 90, "node 0's part to end after node 1's container stopped")
    lxc.start(n1.name)
    lxc.wait_ready(n1.name)
    r = restart(play, inv, "restart after node 1 came back")
    v0, v1 = r.task("Training job tiny2n: verify", "node0"), r.task("Training job tiny2n: verify", "node1")
    assert job_pids(n0) == {v0["pid"]} | {k["pid"] for k in v0["ranks"]}
    assert job_pids(n1) == {v1["pid"]} | {k["pid"] for k in v1["ranks"]}
    sp = run(play, inv, "stop", "stop_training.yml")
    stopped = [sp.task("Training run tiny2n: stopped", h)["stopped"][0]["signal"] for h in ("node0", "node1")]
    assert not job_pids(n0) and not job_pids(n1) and "SIGKILL" not in stopped, stopped
