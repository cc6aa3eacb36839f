"""Who is who in a torchrun job: rank roles, devices, process groups, pid files, death with the agent.

Layout: ranks 0..T-1 run the frozen target, ranks T..T+D-1 train the drafter (data parallel among themselves).
On GPUs T = the whole groups of --target-gpus-per-rank consecutive GPUs in --target-gpus (one per GPU with 1) and
D = len(--drafter-gpus); on the CPU (both lists empty) T = --target-ranks and D = WORLD_SIZE - T. Target rank r
uses group r, drafter rank r the drafter GPU r - T.

torchrun's process model, and what this module does about it:
- every rank is started in a session of its own (start_new_session=True), so signalling the agent's process
  group does not reach the ranks: each rank writes its pid to <run-dir>/ranks/<rank>.pid so the lifecycle can
  signal every rank itself. The rank removes its file whenever it ends by a path of its own (finished, SIGTERM,
  an exception, a refusal at start); only a SIGKILLed rank leaves it, and the lifecycle counts a file whose
  process is gone (or is not this run's rank) as a dead rank;
- the agent SIGKILLs its ranks --shutdown-timeout seconds after SIGTERM (default 30): launch torchrun with a
  shutdown timeout at least the lifecycle's stop timeout, or a slow drafter checkpoint is cut short;
- if the agent itself dies (SIGKILL, OOM killer) nothing would stop the ranks: each rank asks the kernel for
  SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG), with a watchdog thread on os.getppid() where prctl
  is not available.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from dflash_trainer.config import StartupError, TrainConfig

PR_SET_PDEATHSIG = 1


def in_torchrun() -> bool:
    """True when this process is one rank of a multi-process job (torchrun sets WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent (the torchrun agent) dies."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
        except (OSError, AttributeError):
            _watch_parent(parent)
    else:
        _watch_parent(parent)
    # The parent may have died before prctl took effect: then we were reparented already.
    if os.getppid() != parent or parent == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def _watch_parent(parent: int) -> None:
    def loop():
        while True:
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.5)
    threading.Thread(target=loop, name="parent-watchdog", daemon=True).start()


@dataclass
class World:
    rank: int
    world_size: int
    num_target_ranks: int
    num_drafter_ranks: int
    device: torch.device
    pid_file: str
    drafter_group: object = None      # the drafters' own process group (DDP, loss sums, stop agreement)
    data_backend: str = "gloo"        # how hidden states travel: "nccl" (GPU to GPU) or "gloo" (host-staged)
    data_group: object = None         # the group the hidden states go through (world, or a gloo twin of it)
    store: object = None              # the job's key-value store (stop requests, progress for the heartbeat)
    layout: list[dict] = field(default_factory=list)

    @property
    def is_target(self) -> bool:
        return self.rank < self.num_target_ranks

    @property
    def role(self) -> str:
        return "target" if self.is_target else "drafter"

    @property
    def role_rank(self) -> int:
        """Index among the ranks of the same role."""
        return self.rank if self.is_target else self.rank - self.num_target_ranks

    @property
    def first_drafter(self) -> int:
        return self.num_target_ranks

    @property
    def is_drafter_leader(self) -> bool:
        return self.rank == self.num_target_ranks

    def tag(self) -> str:
        return f"[rank {self.rank} {self.role} {self.role_rank}]"


def uses_gpus(cfg: TrainConfig, cuda: bool) -> bool:
    return cuda and cfg.device != "cpu" and bool(cfg.target_gpus + cfg.drafter_gpus)


def gpus_per_target_rank(cfg: TrainConfig, cuda: bool, free: tuple[int, str] | None = None) -> tuple[int, str]:
    """(GPUs each target rank spreads its layers over, why): --target-gpus-per-rank, or measured (target_split;
    `free`: the memory to plan with and its words, else the target GPUs' free memory now)."""
    if cfg.target_gpus_per_rank:
        return cfg.target_gpus_per_rank, f"--target-gpus-per-rank {cfg.target_gpus_per_rank}"
    if not uses_gpus(cfg, cuda) or not cfg.target_gpus:
        return 1, "on the CPU"
    from dflash_trainer.model.target_split import measured_gpus_per_rank
    try:
        return measured_gpus_per_rank(cfg.target_model, cfg.target_gpus, cfg.token_budget, free)
    except (OSError, KeyError, ValueError) as e:
        raise StartupError(f"GPUs per target rank by measured size (--target-gpus-per-rank 0): {e} (or pass "
                           "--target-gpus-per-rank: 1 a replica per GPU, N the layers split over N GPUs)") from None


def plan_layout(cfg: TrainConfig, world_size: int, cuda: bool, per_rank: int = 1) -> tuple[int, int, list[dict]]:
    """(T, D, per-rank layout) for this job, or StartupError naming the flag to change. A target rank's layers
    go over `per_rank` devices (its layout row's `devices`, when more than one)."""
    gpus = cfg.target_gpus + cfg.drafter_gpus
    idle = []
    if uses_gpus(cfg, cuda):
        from dflash_trainer.model.target_split import target_groups
        if not cfg.target_gpus or not cfg.drafter_gpus:
            raise StartupError(f"a torchrun job needs target and drafter GPUs; got --target-gpus {cfg.target_gpus} "
                               f"--drafter-gpus {cfg.drafter_gpus}: list at least one GPU in each")
        try:
            groups, idle = target_groups(cfg.target_gpus, per_rank)
        except ValueError as e:
            raise StartupError(str(e)) from None
        T, D = len(groups), len(cfg.drafter_gpus)
        if T + D != world_size:
            per = f" ({per_rank} GPUs per target rank)" if per_rank > 1 else ""
            raise StartupError(f"--target-gpus {cfg.target_gpus}{per} + --drafter-gpus {cfg.drafter_gpus} make "
                               f"{T} + {D} ranks but torchrun started {world_size}; pass --nproc-per-node {T + D} "
                               "(times --nnodes) or change the GPU lists")
        devices = [[f"cuda:{g}" for g in group] for group in groups] + [[f"cuda:{g}"] for g in cfg.drafter_gpus]
    else:
        if gpus and cfg.device != "cpu":
            raise StartupError(f"GPUs {sorted(set(gpus))} requested but CUDA is not available; pass "
                               "--target-gpus '' --drafter-gpus '' (or --device cpu) to train on the CPU")
        T = cfg.target_ranks
        D = world_size - T
        if T < 1 or D < 1:
            raise StartupError(f"--target-ranks {T} leaves {D} drafter ranks of the {world_size} torchrun started; "
                               f"pass --target-ranks between 1 and {world_size - 1}")
        devices = [["cpu"] * per_rank] * T + [["cpu"]] * D
    layout = [{"rank": r, "role": "target" if r < T else "drafter", "role_rank": r if r < T else r - T,
               "device": devices[r][0], **({"devices": devices[r]} if len(devices[r]) > 1 else {})}
              for r in range(world_size)]
    if idle and layout:
        layout[0]["idle_gpus"] = idle
    return T, D, layout


def write_pid_file(run_dir: str, rank: int) -> str:
    directory = os.path.join(run_dir, "ranks")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{rank}.pid")
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.replace(tmp, path)
    return path


def write_end_file(pid_file: str, rank: int, role: str, rc: int, error: str) -> None:
    """<ranks dir>/<rank>.end.json on a failing rank's way out, before its pid file goes: how it ended and when,
    so that the lifecycle names the rank that failed first (a rank killed by a signal writes none; its pid file
    stays). Best effort: a full disk must not stop the exit."""
    path = os.path.join(os.path.dirname(pid_file), f"{rank}.end.json")
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump({"rank": rank, "role": role, "pid": os.getpid(), "rc": rc, "error": error,
                       "at": time.time()}, f)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def remove_pid_file(path: str) -> None:
    try:
        with open(path) as f:
            if int(f.read().strip()) != os.getpid():
                return  # a newer job's rank owns it now
        os.unlink(path)
    except (OSError, ValueError):
        pass


def init_world(cfg: TrainConfig) -> World:
    """Called first thing in every rank: pid file, death with the agent, then the process groups."""
    die_with_parent()
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    pid_file = write_pid_file(cfg.run_dir, rank)
    try:
        return _join_world(cfg, rank, world_size, pid_file)
    except BaseException:
        remove_pid_file(pid_file)  # a refused start leaves no file that would name this rank as dead
        raise


def _join_world(cfg: TrainConfig, rank: int, world_size: int, pid_file: str) -> World:
    per_rank, why = gpus_per_target_rank(cfg, torch.cuda.is_available())
    T, D, layout = plan_layout(cfg, world_size, torch.cuda.is_available(), per_rank)
    if rank == 0 and per_rank > 1:
        idle = layout[0].get("idle_gpus")
        print(f"[rank 0] each target rank splits its layers over {per_rank} devices ({why})"
              + (f"; GPUs {idle} stay idle (not a whole group)" if idle else ""), flush=True)
    device = torch.device(layout[rank]["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # NCCL between GPUs; NCCL refuses two ranks on one device, so a shared GPU (and the CPU) goes host-staged.
    distinct = len({e["device"] for e in layout}) == world_size
    backend = "nccl" if device.type == "cuda" and distinct else "gloo"
    # With NCCL the groups are dual: CPU tensors (message headers, loss sums) go through gloo, CUDA ones NCCL.
    pg_backend = "cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo"
    if backend == "nccl":
        dist.init_process_group(pg_backend, device_id=device)
    else:
        dist.init_process_group(pg_backend)
    drafter_ranks = list(range(T, T + D))
    # new_group is collective over the world: every rank makes every group, in the same order.
    drafter_group = dist.new_group(drafter_ranks, backend=pg_backend)
    return World(rank=rank, world_size=world_size, num_target_ranks=T, num_drafter_ranks=D, device=device,
                 pid_file=pid_file, drafter_group=drafter_group if rank in drafter_ranks else None,
                 data_backend=backend, data_group=dist.group.WORLD,
                 store=dist.distributed_c10d._get_default_store(), layout=layout)


def close_world(world: World) -> None:
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        remove_pid_file(world.pid_file)
