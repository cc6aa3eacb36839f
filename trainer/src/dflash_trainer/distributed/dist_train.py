"""dflash-train under torchrun: target ranks feed drafter ranks through bounded hidden-state queues.

One host, CPU (tests; gloo), 1 target rank + 2 drafter ranks:
    python -m torch.distributed.run --standalone --nproc-per-node 3 -m dflash_trainer.cli \
        --target-model /tmp/demo/target --data-dir /tmp/demo/data --output-dir /tmp/demo/out \
        --target-gpus '' --drafter-gpus '' --target-ranks 1 --grad-accum 1 ...
One host, 8 GPUs (5 target ranks, 3 drafter ranks; NCCL):
    torchrun --standalone --nproc-per-node 8 --shutdown-timeout 600 -m dflash_trainer.cli \
        --target-model /models/Qwen3.6-27B --data-dir /data/tok --output-dir /runs/r1/out \
        --target-gpus 0,1,2,3,4 --drafter-gpus 5,6,7 --hs-queue-depth 90 --hs-queue-min-ready 30
Several hosts (the same command on each; the GPU lists are each node's: here 5 target + 3 drafter ranks per node,
node 0's ranks 0-7, node 1's 8-15, so T = 10 and D = 6; see world.py):
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint host0:29500 --rdzv-id r1 \
        --shutdown-timeout 600 -m dflash_trainer.cli ... --target-gpus 0,1,2,3,4 --drafter-gpus 5,6,7
A target that needs 2 GPUs (2 target ranks, layers split over GPUs 0-1 and 2-3, GPU 4 idle) and FSDP drafters:
    torchrun --standalone --nproc-per-node 5 --shutdown-timeout 600 -m dflash_trainer.cli ... \
        --target-gpus 0,1,2,3,4 --target-gpus-per-rank 2 --drafter-gpus 5,6,7 --drafter-sharding fsdp
(torchrun = python -m torch.distributed.run.) torchrun starts every rank in a session of its own and SIGKILLs
them --shutdown-timeout seconds after SIGTERM (default 30): set it at least to the stop timeout, and signal the
ranks themselves (their pids are in <run-dir>/ranks/); see dist_world.py.

The plan (loop/plan.StepPlan) is the single-process one with G = --grad-accum x D micro-batches per optimizer step: stream
item k (the k-th batch since this job started) is computed by target rank k % T; micro-batch g of a step is
trained on drafter rank g % D (interleaved: FSDP's forward gathers in step across the drafter ranks, so each needs
its next micro-batch while the others compute theirs), with the seed the single-process run gives micro-batch g. DDP
(or FSDP2: drafter_parallel.py) averages the drafters' gradients, so a job of D drafter ranks follows the same
trajectory as one process with --grad-accum G (float rounding aside). The ranks are dist_ranks.py's; the drafter
ranks train in the loop one process uses (loop/). Checkpoints (same format as one process, written by the first
drafter rank) hold the data position after the last full step: a resume under any world size repeats and skips
no batch; items still in the queues are dropped and recomputed.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import signal
import sys
import threading
import traceback
from contextlib import ExitStack

import torch
import torch.distributed as dist

from dflash_trainer.loop.checkpoint import checkpoints_dir, clean_leftovers, find_latest, load_checkpoint
from dflash_trainer.config import StartupError, TrainConfig, validate_paths
from dflash_trainer.data.batches import BatchLoader, TokenizedDataset
from dflash_trainer.distributed.ranks import log, run_drafter, run_target
from dflash_trainer.distributed.world import (ERROR_KEY, ERRORS_KEY, World, close_world, init_world, job_error,
                                              remove_pid_file, write_end_file)
from dflash_trainer.failures import ExplainedFailure, failure_line
from dflash_trainer import stop_report
from dflash_trainer.telemetry.heartbeat import RESERVE_NAME, Heartbeat
from dflash_trainer.distributed.hs_queue import batch_tap_bytes, check_host_memory, mem_available
from dflash_trainer.loop.plan import StepPlan
from dflash_trainer.loop.progress import PROGRESS, RANK_PROGRESS
from dflash_trainer.telemetry.writers import NvmlTelemetry
from dflash_trainer.telemetry.wandb_log import check_available


def check_queue_memory(cfg: TrainConfig, world: World, available: int | None = None) -> None:
    """Before any weights load, on each drafter rank: its host's drafter queues, full, must fit the memory the
    host has available (hs_queue.check_host_memory; StartupError, exit 2, otherwise)."""
    with open(os.path.join(cfg.target_model, "config.json")) as f:
        target_config = json.load(f)
    hidden = int(target_config.get("text_config", target_config)["hidden_size"])
    on_cuda = world.device.type == "cuda"
    if world.layout:  # this rank's node's drafter ranks (the layout names each rank's node)
        drafters_here = sum(1 for row in world.layout if row["role"] == "drafter" and row["node"] == world.node)
    else:  # this host's ranks: torchrun numbers them RANK - LOCAL_RANK ... + LOCAL_WORLD_SIZE - 1
        first = world.rank - int(os.environ.get("LOCAL_RANK", "0"))
        local = range(first, first + int(os.environ.get("LOCAL_WORLD_SIZE", str(world.world_size))))
        drafters_here = sum(1 for r in local if r >= world.num_target_ranks)
    K = cfg.num_target_taps + int(cfg.use_soft_labels)
    check_host_memory(cfg.hs_queue_depth,
                      batch_tap_bytes(cfg.token_budget, cfg.num_target_taps, hidden, cfg.use_soft_labels, on_cuda),
                      drafters_here, mem_available() if available is None else available,
                      f"--token-budget {cfg.token_budget} tokens x {K} layers x hidden {hidden} x "
                      f"{2 if on_cuda else 4} bytes")


def _first_error(world: World, error: str) -> str:
    """The job's error: `error` if this rank failed first (recorded in the store), else the first one's."""
    try:
        if world.store.add(ERRORS_KEY, 1) == 1:
            world.store.set(ERROR_KEY, error)
            return error
        world.store.wait([ERROR_KEY], datetime.timedelta(seconds=2))
        return world.store.get(ERROR_KEY).decode()
    except Exception:  # noqa: BLE001 - the store went with the agent: our own error it is
        return error


def _relay_progress(world: World, heartbeat: Heartbeat, done: threading.Event) -> None:
    """Rank 0 writes the heartbeat; the step, loss and speed are the first drafter rank's (via the store). A
    rank's failure (in the store) makes it `failed` at once, whatever rank 0 is doing."""
    while not done.wait(heartbeat.interval_s):
        try:
            error = job_error(world.store)
            if error is not None:
                heartbeat.set_phase("failed", error=error)
                return
            _read_progress(world, heartbeat)
        except Exception:  # noqa: BLE001 - a store hiccup must not end the run; the next poll retries
            pass


def _read_progress(world: World, heartbeat: Heartbeat) -> None:
    """The first drafter's step, loss and speed, and every rank's last step: heartbeat `ranks` maps each rank to
    {role, step, items, updated_at}, so a rank whose step and time stay behind the others' shows as stalled."""
    if world.store.check([PROGRESS]):
        heartbeat.update(**json.loads(world.store.get(PROGRESS)))
    ranks = {}
    for r in range(world.world_size):
        key = RANK_PROGRESS + str(r)
        if world.store.check([key]):
            row = json.loads(world.store.get(key))
            ranks[str(r)] = {"role": row["role"], "step": row["step"], "items": row["items"],
                             "updated_at": row["time"], **({"done": True} if row.get("done") else {})}
    if ranks:
        heartbeat.update(ranks=ranks)


def _killed_peer(world: World) -> dict | None:
    """The first other rank gone without its end file (world.write_end_file): killed by a signal, its pid file
    left behind. Rank 0 names it in the `failed` heartbeat before its own error, which that death caused (a broken
    connection); the lifecycle adds the signal from the torchrun agent's log (rank_ends.py)."""
    directory = os.path.dirname(world.pid_file)
    for rank in range(world.world_size):
        if rank == world.rank or os.path.exists(os.path.join(directory, f"{rank}.end.json")):
            continue
        try:
            with open(os.path.join(directory, f"{rank}.pid")) as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            continue  # ended cleanly, or never registered
        try:
            with open(f"/proc/{pid}/stat") as f:
                gone = f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie until the agent reaps it
        except (OSError, IndexError):
            gone = True
        if gone:
            return {"rank": rank, "role": world.layout[rank]["role"], "pid": pid,
                    "exit": "gone without an error of its own (killed?)"}
    return None


def _report_failure(cfg: TrainConfig, world: World, heartbeat, e: BaseException) -> str:
    """The failed rank's lines in the log and, on rank 0, the `failed` heartbeat (called inside the except);
    returns this rank's error line."""
    explained = isinstance(e, (StartupError, ExplainedFailure))  # a refusal, a full disk: the line says it all
    message = " ".join(str(e).split()) if explained else failure_line(e)
    first = _first_error(world, f"rank {world.rank}: {message}")
    try:  # as in one process: a full disk leaves room for the lines below and the `failed` heartbeat
        os.unlink(os.path.join(cfg.run_dir, RESERVE_NAME))
    except OSError:
        pass
    if explained:  # one line, as dflash-train fails in one process
        print(f"dflash-train: error: rank {world.rank}: {message}", file=sys.stderr, flush=True)
    elif first.startswith(f"rank {world.rank}: "):
        traceback.print_exc()
        log(world, f"error: {message}")
    else:  # a consequence (a peer's collective broke): the cause is the other rank's line
        log(world, f"error: {message} (after {first.split(':')[0]} failed)")
    if heartbeat is not None:
        heartbeat.stop()
        killed = _killed_peer(world)
        heartbeat.set_phase("failed", error=first, **({"failed_rank": killed} if killed else {}))
    return message


def _open_nvml(cfg: TrainConfig, world: World) -> NvmlTelemetry:
    """Each rank reads its own GPU (rows carry the rank); on the CPU NVML is absent: rank 0 says so once."""
    nvml = NvmlTelemetry(cfg.run_dir, cfg.telemetry_interval,
                         [world.device.index] if world.device.type == "cuda" else [], rank=world.rank)
    if world.device.type != "cuda":
        nvml.close()
        nvml.unavailable = nvml.unavailable or "this rank runs on the CPU"
    if nvml.unavailable and world.rank == 0:
        log(world, f"note: no GPU telemetry: {nvml.unavailable}")
    return nvml


def _run_rank(cfg: TrainConfig, world: World, heartbeat, stop: threading.Event, done: threading.Event,
              nvml: NvmlTelemetry) -> None:
    """The checks, the job's plan and resume point (read by every rank before any may write), then this rank's
    role (dist_ranks.run_target or run_drafter) and the barrier that ends the job."""
    from dflash_trainer.loop.starting_weights import starting_weights
    from dflash_trainer.loop.train import drafter_config_for, log_changed_settings, target_kernels_line
    validate_paths(cfg)
    if world.is_drafter_leader:
        check_available(cfg)
    if not world.is_target:
        check_queue_memory(cfg, world)
    target_config, layer_ids, drafter_cfg = drafter_config_for(cfg)
    if world.is_target:  # each target rank says (and checks) which kernels its layers run
        kernels = target_kernels_line(cfg, target_config, world.device)
        log(world, "target kernels: " + kernels)
        if heartbeat is not None:
            heartbeat.update(target_kernels=kernels)
    dataset = TokenizedDataset(cfg.data_dir, cfg.max_seq_len, cfg.shard_weights)
    G = cfg.grad_accum * world.num_drafter_ranks
    batches = BatchLoader(dataset, cfg.seed, cfg.token_budget, cfg.max_batch_size).batches_in_epoch(0)
    total_steps = cfg.epochs * math.ceil(batches / G)
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    if world.is_drafter_leader:  # the checkpoint writer: what a kill mid-save or mid-prune left (never `latest`)
        clean_leftovers(checkpoints_dir(cfg.output_dir), lambda msg: log(world, msg))
    resume_from = find_latest(cfg.output_dir)
    saved, step0, data_state = None, 0, None
    if resume_from is not None:
        if world.is_target:  # the data position only; mmap spares reading the optimizer state
            train_state = torch.load(os.path.join(resume_from, "train_state.pt"), mmap=True, weights_only=False)
        else:
            saved = load_checkpoint(resume_from)
            train_state = saved[2]
        step0, data_state = train_state["step"], train_state["data"]
    # a new run's starting weights, read (and refused) on each drafter rank before any rank trains
    start = starting_weights(cfg, drafter_cfg) if resume_from is None and not world.is_target else None
    dist.barrier()  # everybody has read `latest` before anybody may write a newer one

    def plan():
        return StepPlan(dataset, cfg, data_state, step0, total_steps, G)

    if world.rank == 0:
        log(world, "data: " + dataset.describe(batches))
        log(world, f"world: {world.num_target_ranks} target + {world.num_drafter_ranks} drafter ranks "
                   f"({world.data_backend} transport); micro-batches per optimizer step: {cfg.grad_accum} x "
                   f"{world.num_drafter_ranks} = {G}; {total_steps} optimizer steps"
                   + (f"; resumed from {resume_from} at step {step0}" if resume_from else ""))
        if resume_from is not None:
            log_changed_settings(train_state, cfg, lambda msg: log(world, msg))
        heartbeat.set_phase("training", step=step0)
        threading.Thread(target=_relay_progress, args=(world, heartbeat, done), daemon=True).start()
    if world.is_target:
        run_target(cfg, world, plan(), layer_ids, stop, nvml)
    else:
        run_drafter(cfg, world, plan, drafter_cfg, saved, start, total_steps, stop, nvml)
    dist.barrier()


def main(cfg: TrainConfig) -> int:
    """One rank of a torchrun job; dflash-train's entry comes here when WORLD_SIZE > 1."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    stop_report.watch(cfg.stop_report_s)
    try:
        world = init_world(cfg)
    except StartupError as e:
        print(f"dflash-train: error: rank {os.environ.get('RANK')}: {e}", flush=True)
        return 2
    heartbeat = None
    if world.rank == 0:
        heartbeat = Heartbeat(cfg.run_dir, cfg.heartbeat_interval)
        heartbeat.update(pid=os.getppid(), rank0_pid=os.getpid(), world=world.layout)  # pid: the agent's, as launched
        heartbeat.write()
        heartbeat.start()
    done = threading.Event()
    try:
        with ExitStack() as stack:  # NVML (and, inside the ranks, every writer and W&B) closes on every way out
            nvml = _open_nvml(cfg, world)
            stack.callback(nvml.close)
            _run_rank(cfg, world, heartbeat, stop, done, nvml)
    except BaseException as e:  # noqa: BLE001 - every failure must name its rank and reach the log
        rc, message = (2 if isinstance(e, StartupError) else 1), f"{type(e).__name__}"
        try:
            message = _report_failure(cfg, world, heartbeat, e)
        finally:  # os._exit skips every cleanup; the pid file last, so the rank shows until it goes
            write_end_file(world.pid_file, world.rank, world.role, rc, message)  # the lifecycle's first cause
            remove_pid_file(world.pid_file)
            # peers may be blocked in collectives with us: leave now, torchrun ends the job (the process group
            # goes with the process; destroying it here could wait on those peers)
            os._exit(rc)
    try:
        done.set()
        if heartbeat is not None:
            heartbeat.stop()
            _read_progress(world, heartbeat)
            heartbeat.set_phase("finished", **({"stopped": "SIGTERM"} if stop.is_set() else {}))
    finally:
        close_world(world)
    return 0
