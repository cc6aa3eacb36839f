#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, dflash.ops contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

from __future__ import annotations

DOCUMENTATION = r"""
---
module: training_run
short_description: Start, stop, restart or inspect a named DFlash training run, and prove the result
description:
  - Manages one named training run inside a Proxmox LXC container (through C(pct exec)) or on the host itself
    (O(transport=local)).
  - The whole restart sequence runs inside the container in one transport call, under one lock per container
    ("runs root") - no-op when the same run with the same configuration fingerprint is alive; otherwise stop every
    run that shares a GPU (SIGTERM to its process group, grace period, SIGKILL), wait until the GPUs are released,
    launch detached (new session, stdin from /dev/null, output to the run's log, pid file written before exec),
    then assert that the new process is alive, runs the launched command and writes a heartbeat.
  - Before anything is stopped (and in check mode too), the installed trainer checks the new configuration without
    running it - the run's command with C(--check) before its flags (C(dflash-train --check)), the run's environment
    without O(secret_env), and for a torchrun job C(WORLD_SIZE) = O(nproc_per_node). A configuration it refuses (a
    misspelled or malformed flag, a missing target or data directory, GPUs it does not see, a torchrun layout its
    ranks would refuse, ...) fails the task with the trainer's lines and C(bad_input), saying that nothing was
    stopped; the live run keeps its pid and goes on training. The check answers within O(heartbeat_timeout).
  - A failed launch returns C(failed), the exit status, the trainer's own error line and the last lines of the log;
    the previous run's logs and checkpoints are kept (older C(train.log) files are renamed, never overwritten).
  - Secrets in O(secret_env) travel on stdin, never in an argument vector, a log or C(launch.json).
version_added: 0.1.0
author: dflash.ops maintainers (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: Reports whether the run would be launched or stopped (and which runs a launch would stop);
      starts and stops nothing.
  diff_mode:
    support: full
    description: Shows the run's configuration (fingerprint, argv, env, secret names, GPUs, cwd) and the runs alive
      on its GPUs before and after; with check mode, what a restart or stop would change.
extends_documentation_fragment:
  - dflash.ops.transport
options:
  name:
    description: Run name; letters, digits, C(.), C(_) and C(-), at most 64 characters.
    type: str
    required: true
  state:
    description:
      - V(restarted) launches the run unless the same configuration is already alive (or O(force=true)).
      - V(started) launches the run only when it is not alive; a live run with another configuration is kept
        (with a warning).
      - V(stopped) stops the run's process group. V(status) reports and changes nothing.
    type: str
    choices: [started, stopped, restarted, status]
    default: restarted
  python:
    description:
      - Python interpreter at the target that runs the lifecycle code (stdlib only).
      - Defaults to C(python3) inside a container, and to the module's own interpreter with O(transport=local).
    type: str
  runs_root:
    description: Directory holding every run's directory, and the lifecycle lock.
    type: path
    default: /workspace/runs
  run_dir:
    description: The run's directory; defaults to O(runs_root)/O(name).
    type: path
  command:
    description: The trainer executable and fixed arguments; required for V(started) and V(restarted).
    type: list
    elements: str
  trainer_args:
    description: Trainer flags; C(key) becomes C(--key=value) (C(_) → C(-)); V(true) is a bare flag, V(false)
      and null are left out, a list is comma-joined.
    type: dict
    default: {}
  nproc_per_node:
    description:
      - V(1) launches O(command) as one process. More makes the run a torchrun job of that many ranks on this host,
        C(<python> -m torch.distributed.run --standalone --local-addr=127.0.0.1 --nproc-per-node=N
        --shutdown-timeout=S <command> <trainer flags>), run by the python beside O(command) (or O(command)'s own
        interpreter); its elastic agent is the process launched and recorded in C(pid). The ranks meet on loopback,
        whatever the container's hostname resolves to.
      - torchrun starts every rank in a session of its own, so each rank records its pid in C(<run dir>/ranks/) (the
        trainer's C(--run-dir), else the run directory), and the lifecycle stops the job itself - SIGTERM to every
        rank (drafter ranks checkpoint), then the agent, SIGKILL to all at O(stop_timeout) - never relying on
        torchrun's own C(--shutdown-timeout) (set to O(stop_timeout) all the same). A pid counts as a rank only while
        C(/proc) shows it leads its process group with the run's C(DFLASH_RUN_DIR) and its C(RANK).
      - Alive means the agent and every rank that registered are alive. C(launch.json)'s C(job) records the process
        count, the ranks' directory and the world layout as the installed trainer's check answers them (the module
        holds no copy of the trainer's rule) - each rank's role and GPU (a target rank over several GPUs lists them
        in C(gpus); C(gpu) is null on the CPU). A process count the trainer would refuse is refused by that check,
        before anything is stopped.
      - One host only (C(--standalone)); several hosts are not managed by this module.
    type: int
    default: 1
  env:
    description: Environment of the trainer (nothing else from the caller's environment is passed).
    type: dict
    default: {}
  secret_env:
    description: Secret environment variables (API keys); only their names are recorded.
    type: dict
    default: {}
  gpus:
    description: GPU indexes the run uses; runs sharing any of them are stopped first and their release awaited.
    type: list
    elements: int
    default: []
  cwd:
    description: Working directory of the trainer; defaults to the run directory.
    type: path
  force:
    description: Restart even when the same configuration is alive.
    type: bool
    default: false
  stop_timeout:
    description:
      - Seconds a stopping run gets after SIGTERM (to checkpoint) before SIGKILL.
      - The trainer is launched with C(DFLASH_STOP_REPORT_S) at nine tenths of it (unless O(env) sets it), so a stop
        that hangs prints where each of its threads waits to the run's log just before the SIGKILL.
    type: float
    default: 120
  gpu_release_timeout:
    description: Seconds to wait for the GPUs to be released before failing.
    type: float
    default: 120
  gpu_memory_threshold_mib:
    description: A GPU counts as released when NVML reports less memory used than this.
    type: int
    default: 1024
  gpu_device_pattern:
    description: Device file of GPU C({index}); processes holding one open block the launch.
    type: str
    default: /dev/nvidia{index}
  settle_time:
    description:
      - Seconds the new process must stay alive before it counts as launched (it must also have written its
        heartbeat). Crashes later in start-up are caught by O(wait_for_phase).
    type: float
    default: 0.5
  heartbeat_timeout:
    description: Seconds (after O(settle_time)) to wait for the first heartbeat written by the new pid; also how long
      the trainer's check (C(--check)) may take before the launch is refused.
    type: float
    default: 120
  wait_for_phase:
    description: Also wait until the heartbeat reports this phase (for example V(training)).
    type: str
  phase_timeout:
    description: Seconds to wait for O(wait_for_phase).
    type: float
    default: 600
  log_tail_lines:
    description: Lines of the log returned when a launch fails.
    type: int
    default: 40
  status_log_lines:
    description: Lines of the log returned by V(status).
    type: int
    default: 0
  report:
    description:
      - With V(status), draw the run's charts with the trainer's C(dflash-report) in the container (the python of
        the venv the run was launched from; needs the trainer's C(report) extra, matplotlib) into
        C(<run dir>/report.html), and return the page (RV(report)).
    type: bool
    default: false
  lock_timeout:
    description: Seconds to wait for another lifecycle operation on the same runs root.
    type: float
    default: 900
  keep_records:
    description:
      - How many earlier logs (C(train.<stamp>.log)) and launch records (C(launch.<stamp>.json)) a launch keeps in
        the run directory, each; older ones are removed. Checkpoints are never touched.
    type: int
    default: 20
  expect_trainer_version:
    description:
      - The trainer version this collection expects (the training role sets the bundled trainer's).
      - Before anything is stopped, a launch is refused when the command's executable does not exist or is not
        executable, or when the C(dflash-install.json) of its environment (C(<venv>/bin/<command>), written by
        M(dflash.ops.trainer_install)) records an older version - naming both versions. An environment without
        that record (made by hand, or a development C(.venv)) is accepted.
      - Without it only the executable is checked.
    type: str
  timeout:
    description: Seconds the whole transport call may take.
    type: float
    default: 3600
  nodes:
    description:
      - A torchrun job over several hosts - every node, node 0 first, each as C({address, nproc_per_node}) (the
        address the other nodes reach it at). Empty - one host. The training role fills it from the run's C(nodes).
      - torchrun's c10d rendezvous numbers the nodes by their address sorted as text (it ignores C(--node-rank)), so
        nodes in another order are refused, naming the order to use. Node 0 hosts the rendezvous store and rank 0.
      - With nodes, this host runs C(nodes[node].nproc_per_node) ranks of the job (O(nproc_per_node) is not used),
        torchrun is started with C(--nnodes), C(--rdzv-backend=c10d), C(--rdzv-endpoint=<node 0>:<rdzv_port>) and
        C(--rdzv-id=<name>-<fingerprint>-<job_token>), and the trainer's check sees the whole job's C(WORLD_SIZE),
        every node's rank count (C(DFLASH_NODE_RANKS), which the ranks get too) and this node's index
        (C(GROUP_RANK)); each rank's role, GPUs and node in C(launch.json) are the trainer's answer. C(launch.json)
        records every node; the fingerprint is the job's (the same on every node).
      - A restart is made of O(job_step) calls, each on every node before the next (roles/training/tasks/run_nodes.yml;
        docs/nodes.md). O(state=stopped) and O(state=status) work on each node as for one host.
    type: list
    elements: dict
    default: []
  node:
    description: This host's index in O(nodes).
    type: int
    default: 0
  rdzv_port:
    description: TCP port of torchrun's c10d rendezvous store on node 0 (with O(nodes)).
    type: int
    default: 29400
  job_step:
    description:
      - One step of restarting a job over O(nodes) on this node, under its lifecycle lock - V(reserve) (take the node
        for this restart - a reservation other operations on the node are refused by until it is released or older
        than O(lock_timeout), and another restart's V(reserve) waits for, at most O(lock_timeout) - report whether
        its part runs with this configuration, else run the trainer's check before anything is stopped), V(stop)
        (stop the old ranks and the runs sharing its GPUs, then await the GPUs'
        release), V(launch) (start the agent; it waits in the rendezvous), V(verify) (the agent and all of this node's
        ranks alive, node 0's heartbeat written; then release), V(release) (give the reservation back).
      - Required with O(nodes) for V(started) and V(restarted).
    type: str
    choices: [reserve, stop, launch, verify, release]
  job_token:
    description: This restart's token (1-32 letters and digits), the same on every node - in the rendezvous id and
      the reservations. The training role makes one per play.
    type: str
seealso:
  - module: dflash.ops.pct_exec
notes:
  - Inside a container NVML lists no processes, so GPU release is judged by used memory there. Without NVML (no
    driver, CPU runs) the result's C(gpu_wait.skipped) is true and C(gpu_wait.reason) says why.
  - Changing only a secret value does not change the fingerprint; use O(force=true) to apply it.
  - For a torchrun job (O(nproc_per_node) > 1) the fingerprint covers torchrun's command line, which holds
    O(stop_timeout) as C(--shutdown-timeout), so changing O(stop_timeout) restarts such a run.
"""

EXAMPLES = r"""
- name: Restart run slammed5 in CT 200 with its GPUs and wait until it trains
  dflash.ops.training_run:
    name: slammed5
    vmid: 200
    command: [/opt/dflash/venv/bin/dflash-train]
    trainer_args: {target_model: /dev/shm/Qwen3.6-27B, block_size: 32, use_soft_labels: true}
    env: {DFLASH_PROFILE_INTERVAL: "60"}
    secret_env: {WANDB_API_KEY: "{{ vault_wandb_key }}"}
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    wait_for_phase: training

- name: Restart it as a torchrun job on one host - 5 target ranks and 3 drafter ranks, one GPU each
  dflash.ops.training_run:
    name: slammed5
    vmid: 200
    command: [/opt/dflash/venv/bin/dflash-train]
    nproc_per_node: 8
    trainer_args: {target_model: /dev/shm/Qwen3.6-27B, target_gpus: [0, 1, 2, 3, 4], drafter_gpus: [5, 6, 7],
                   run_dir: /workspace/runs/slammed5}
    gpus: [0, 1, 2, 3, 4, 5, 6, 7]
    stop_timeout: 600

- name: Stop it
  dflash.ops.training_run:
    name: slammed5
    vmid: 200
    state: stopped

- name: Report on a run on this host
  dflash.ops.training_run:
    name: demo
    transport: local
    runs_root: /tmp/dflash-runs
    state: status
  register: demo_status
"""

RETURN = r"""
run:
  description: The run's name.
  returned: always
  type: str
  sample: slammed5
run_dir:
  description: The run's directory.
  returned: always
  type: str
  sample: /workspace/runs/slammed5
action:
  description: What was done (or, in check mode, would be); V(launched), V(noop), V(stopped) or V(none).
  returned: state is not status
  type: str
  sample: launched
pid:
  description: The run's process (group leader; a torchrun job's agent) id; null when no process of the run is
    alive.
  returned: state is status or stopped, when launched (not in check mode), or when a live run is kept
  type: int
  sample: 4242
fingerprint:
  description: Hash of argv, env, GPUs, secret names and cwd of the run (null when it never launched).
  returned: state is status, when launched (not in check mode), or when a live run is kept
  type: str
  sample: 3f2a9c0d1e2b4a55
same_config:
  description: Whether the live run that was kept has the requested configuration.
  returned: when a live run is kept (action V(noop))
  type: bool
  sample: true
phase:
  description: The trainer's phase from its heartbeat (V(dead) when its process is gone without finishing,
    V(never launched) when it has no launch record).
  returned: state is status, or when launched (not in check mode)
  type: str
  sample: training
heartbeat:
  description: The heartbeat written by the run's pid.
  returned: state is status, when launched (not in check mode), or when a live run is kept
  type: dict
  sample: {pid: 4242, phase: training, step: 120, loss: 2.31, tokens_per_s: 51234.0, updated_at: 1764480000.5}
log_path:
  description: The run's current log file.
  returned: state is not status
  type: str
  sample: /workspace/runs/slammed5/train.log
stopped:
  description: Runs stopped first, each with the signal that ended it and the seconds waited.
  returned: state is not status
  type: list
  elements: dict
  sample: [{run: slammed4, pid: 4100, pgid: 4100, signal: SIGTERM, waited_s: 12.4}]
waited_for:
  description: A job over nodes, step V(reserve) - the other restart of the job that held this node and was waited
    for until it gave the node back (at most O(lock_timeout)), with the seconds waited.
  returned: when a reserve waited for another restart
  type: dict
  sample: {run: big, token: 4fQm2xAa9Lk0PzTq, waited_s: 41.3}
would_stop:
  description: Live runs (this one included) that the launch stops first, or would stop in check mode.
  returned: when launched, or when a launch would happen in check mode
  type: list
  elements: str
  sample: [slammed4]
launch_reason:
  description: Why the run is (re)launched - V(first launch), V(config change), V(force), V(crash) (the last
    process is gone without finishing), V(relaunch) (it finished or was stopped) or V(unverified process replaced);
    the trainer gets it in C(DFLASH_LAUNCH_REASON) and logs it (C(events.jsonl), the log, W&B).
  returned: when launched, or when a launch would happen in check mode
  type: str
  sample: config change
kept:
  description: Previous log and launch files moved aside before the launch (never overwritten).
  returned: state is not status
  type: list
  elements: str
  sample: [/workspace/runs/slammed5/train.20261130-101500.log]
gpu_wait:
  description: The GPU release wait; C(skipped) with a C(reason) when it could not be done.
  returned: when launched (not in check mode)
  type: dict
  sample: {gpus: [0, 1], skipped: true, reason: "GPU memory wait skipped: NVML could not start", waited_s: 0.0}
timings:
  description: Seconds per phase (lock, trainer_check, stop, gpu_wait, launch, first_heartbeat, verify) that ran.
  returned: state is not status
  type: dict
  sample: {lock: 0.0, trainer_check: 0.5, stop: 3.2, gpu_wait: 0.5, launch: 0.01, first_heartbeat: 0.8, verify: 1.0}
rc:
  description: Exit status of a launched trainer that died during verification; for a trainer command refused
    before anything was stopped, 127 (it does not exist) or 126 (not executable, or older than
    O(expect_trainer_version)).
  returned: when failed after launch, or when the trainer command was refused
  type: int
  sample: 1
bad_input:
  description: True when the trainer's check refused the configuration (nothing was stopped or launched); the
    message holds the trainer's lines.
  returned: when the trainer's check refused the configuration
  type: bool
  sample: true
log_tail:
  description: Last lines of the run's log (O(log_tail_lines) on failure, O(status_log_lines) with V(status)).
  returned: state is status, or when failed after launch
  type: list
  elements: str
  sample: ["Traceback (most recent call last):", "ValueError: --block-size must be >= 2"]
ranks:
  description: The ranks of a torchrun job that registered (C(ranks/<rank>.pid)), each with its pid, whether it is
    alive, and its role and GPU (C(gpus) too for a target rank over several) where the layout is known; empty for
    one process.
  returned: state is status, or when a torchrun job was launched (not in check mode)
  type: list
  elements: dict
  sample: [{rank: 0, pid: 4250, alive: true, role: target, gpu: 0},
           {rank: 1, pid: 4251, alive: true, role: drafter, gpu: 1}]
world:
  description: The torchrun job's record from C(launch.json) (null for one process) - C(nproc_per_node), C(ranks_dir),
    C(layout) (the trainer check's answer - each rank's role and GPU), C(shutdown_timeout_s).
  returned: state is status, or when launched (not in check mode)
  type: dict
  sample: {launcher: torchrun, nproc_per_node: 2, ranks_dir: /workspace/runs/r1/ranks, shutdown_timeout_s: 600,
           layout: [{rank: 0, role: target, gpu: 0}, {rank: 1, role: drafter, gpu: 1}]}
alive:
  description: Whether the run's process is alive (for a torchrun job, the agent and every rank that registered).
  returned: state is status
  type: bool
  sample: true
launched:
  description: Whether the run has a launch record (C(launch.json)).
  returned: state is status
  type: bool
  sample: true
launched_at:
  description: Unix time of the last launch (null when it never launched).
  returned: state is status
  type: float
  sample: 1764480000.1
heartbeat_age_s:
  description: Seconds since the heartbeat was written.
  returned: state is status and a heartbeat exists
  type: float
  sample: 1.4
step:
  description: Optimizer step from the heartbeat.
  returned: state is status and a heartbeat exists
  type: int
  sample: 120
epoch:
  description: Epoch from the heartbeat.
  returned: state is status and a heartbeat exists
  type: int
  sample: 0
loss:
  description: Last training loss from the heartbeat.
  returned: state is status and a heartbeat exists
  type: float
  sample: 2.31
tokens_per_s:
  description: Training throughput from the heartbeat.
  returned: state is status and a heartbeat exists
  type: float
  sample: 51234.0
dead_since:
  description: Unix time of the last heartbeat of a run whose process is gone without finishing.
  returned: state is status and phase is V(dead) with a heartbeat
  type: float
  sample: 1764480000.5
gpu_utilization:
  description: The last NVML reading of each GPU in the run's C(telemetry.jsonl) (written by the trainer every
    C(--telemetry-interval) seconds; the rank that read it under torchrun) and its age; null when there is none
    (no NVIDIA driver, or none written yet).
  returned: state is status
  type: list
  elements: dict
  sample: [{gpu: 0, rank: 0, util_pct: 97, mem_used_mb: 61234.5, mem_total_mb: 143771.0, power_w: 612.3,
            temp_c: 61, age_s: 2.4}]
report:
  description: With O(report) - the page's C(path) in the container, its C(bytes) and the page itself base64-encoded
    (C(html_b64)) for the role to save on the controller; or C(error), one line, when it could not be drawn.
  returned: state is status and report is true
  type: dict
  sample: {path: /workspace/runs/r1/report.html, bytes: 183211, html_b64: PCFET0NUWVBFIGh0bWw+...}
progress:
  description: The trainer's progress from the heartbeat - the run's optimizer steps (C(total_steps)), the share
    done (C(done_pct), by steps or by the time budget), the seconds of training left (C(eta_s)) and what ends the
    run first (C(ends_by), V(steps) or V(time budget)); null before the first step.
  returned: state is status and a heartbeat exists
  type: dict
  sample: {total_steps: 200, done_pct: 25.0, eta_s: 83.4, ends_by: steps}
queue_depth:
  description: Micro-batches of hidden states waiting on the first drafter rank of a torchrun job (heartbeat).
  returned: state is status and the heartbeat of a torchrun job has it
  type: int
  sample: 27
target_kernels:
  description: Which linear-attention and causal-conv code the target's layers run (the trainer's C(target kernels:)
    line, from the heartbeat), e.g. flash-linear-attention or transformers' torch fallback; null from trainers
    that do not report it.
  returned: state is status and the run has a heartbeat
  type: str
  sample: "48 linear-attention layers: gated delta rule by flash-linear-attention 0.6.0; causal conv by ..."
plan_warning:
  description: The layout advisor's warning (C(dflash-train --plan) wrote C(plan.json) into the run directory) when
    the configured target:drafter split is predicted at least 15 % below the best one; null when it is not.
  returned: when the run directory holds a plan.json (status, and launches)
  type: str
plan_predicted_seq_per_s:
  description: The advisor's predicted rate of the configured split, in sequences per second.
  returned: when the run directory holds a plan.json (status, and launches)
  type: float
  sample: 3.27
plan_best_seq_per_s:
  description: The advisor's predicted rate of the best split for the run's GPUs, in sequences per second.
  returned: when the run directory holds a plan.json (status, and launches)
  type: float
  sample: 4.35
failed_rank:
  description: The rank of a torchrun job that failed first (container/rank_ends.py) - a rank killed from outside
    before any rank's own error (a peer's broken connection is its consequence), else the earliest error - with its
    role, pid, exit code (C(rc), negative for a signal, null where unknown), C(exit) in words and its own C(error)
    as plain text where it wrote one; null for one process, a job that did not fail, or ranks that all died with
    their agent.
  returned: state is status, or when a launch failed
  type: dict
  sample: {rank: 2, role: drafter, pid: 1226, rc: -9, exit: killed by SIGKILL}
slowest_rank:
  description: The torchrun rank furthest behind (lowest step among the ranks still working; ties - the oldest
    update), from the heartbeat's C(ranks); null for one process or when every rank is done.
  returned: state is status and a heartbeat exists
  type: dict
  sample: {rank: 6, role: drafter, step: 1200, steps_behind: 31, updated_s_ago: 1.8}
gpu_memory:
  description: NVML's memory use and compute processes per GPU of the run; null without NVML or GPUs.
  returned: state is status
  type: dict
  sample: {"0": {used_mib: 40210, processes: []}}
gpu_memory_note:
  description: Why O(gpus)' memory could not be read.
  returned: state is status and gpu_memory is null
  type: str
  sample: no GPUs configured for this run
state:
  description:
    - The run in one phrase - C(running); C(not running) with why in brackets (C(never launched), C(stopped by
      SIGTERM at step N, checkpointed), C(finished at step N), or C(stopped by SIGKILL after S s at step N, before
      the trainer checkpointed)); C(crashed) with C(exit N) in brackets (or, when the exit status was not recorded,
      the last heartbeat); or C(container stopped) (pct; a stop then does nothing and succeeds).
  returned: state is status, or state is stopped with nothing to stop
  type: str
  sample: not running (stopped by SIGTERM at step 1200, checkpointed)
node:
  description: This node of a job over nodes, as C(node <index> (<address>)).
  returned: with O(nodes)
  type: str
  sample: node 1 (10.10.0.12)
slowest_node:
  description: The node of the slowest rank (see RV(slowest_rank)), on the node whose heartbeat lists the ranks
    (node 0).
  returned: state is status, with O(nodes), when the heartbeat lists the ranks
  type: dict
  sample: {node: 1, address: 10.10.0.12, rank: 9, steps_behind: 3}
job_step:
  description: The step of a job over nodes that ran.
  returned: with O(job_step)
  type: str
  sample: verify
released:
  description: Whether this restart's reservation of the node was given back.
  returned: with O(job_step) V(verify) or V(release)
  type: bool
  sample: true
container_note:
  description: The transport's message when the container is not running (state is V(container stopped)).
  returned: state is status or stopped and the container is not running
  type: str
  sample: "container 200 is not running: start it with `pct start 200`, then run this again"
"""

from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.module_failure import ModuleFailure
from ansible_collections.dflash.ops.plugins.module_utils._dflash.controller.training_backend import (
    argument_spec, manage_run)


def main():
    module = argument_spec().create_ansible_module(supports_check_mode=True)
    try:
        result = manage_run(module)
    except ModuleFailure as exc:
        module.fail_json(msg=str(exc), **exc.facts)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
