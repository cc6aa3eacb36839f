"""Who is who in a torchrun job: rank roles, devices, process groups, pid files, death with the agent.

Layout: T target ranks run the frozen target, D drafter ranks train the drafter (data parallel among themselves).
On GPUs --target-gpus and --drafter-gpus are each node's lists, the same on every node: a node's local ranks are
first its target ranks (the whole groups of --target-gpus-per-rank consecutive GPUs in --target-gpus, one per GPU
with 1), then one drafter rank per --drafter-gpus entry; global rank r is local rank r - (ranks of earlier nodes)
of its node (nodes.py: torchrun numbers the ranks node after node). So T = nodes x groups, D = nodes x
len(--drafter-gpus), and the roles alternate by node (node 0's targets, node 0's drafters, node 1's targets...);
role ranks count each role in global rank order. On the CPU (both lists empty) ranks 0..T-1 run the target with
T = --target-ranks, D = WORLD_SIZE - T, whatever the nodes; --device cpu with both lists lays the job out as on GPUs
with every rank on the CPU (a rehearsal). A device is (node, device name): the NCCL rule below counts
cuda:0 of two nodes as two GPUs.

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
import datetime
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
from dflash_trainer.distributed.nodes import Nodes, check_placement, job_nodes

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
    def target_ranks(self) -> list[int]:
        """The target ranks' global ranks in role order (contiguous from 0 on one node; per node over nodes)."""
        if self.layout:
            return [row["rank"] for row in self.layout if row["role"] == "target"]
        return list(range(self.num_target_ranks))

    @property
    def drafter_ranks(self) -> list[int]:
        if self.layout:
            return [row["rank"] for row in self.layout if row["role"] == "drafter"]
        return list(range(self.num_target_ranks, self.world_size))

    @property
    def is_target(self) -> bool:
        if self.layout:
            return self.layout[self.rank]["role"] == "target"
        return self.rank < self.num_target_ranks

    @property
    def role(self) -> str:
        return "target" if self.is_target else "drafter"

    @property
    def role_rank(self) -> int:
        """Index among the ranks of the same role."""
        if self.layout:
            return self.layout[self.rank]["role_rank"]
        return (self.target_ranks if self.is_target else self.drafter_ranks).index(self.rank)

    @property
    def node(self) -> int:
        return self.layout[self.rank].get("node", 0) if self.layout else 0

    @property
    def first_drafter(self) -> int:
        return self.drafter_ranks[0]

    @property
    def is_drafter_leader(self) -> bool:
        return self.rank == self.first_drafter

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


def rehearses_gpus(cfg: TrainConfig, cuda: bool) -> bool:
    """--device cpu with both GPU lists under torchrun: the GPU job's layout (roles per node), every rank on the
    CPU - a rehearsal of a GPU layout where there is no GPU (tests, a layout's check on a laptop)."""
    return cfg.device == "cpu" and bool(cfg.target_gpus) and bool(cfg.drafter_gpus)


def plan_layout(cfg: TrainConfig, world_size: int, cuda: bool, per_rank: int = 1,
                nodes: Nodes | None = None) -> tuple[int, int, list[dict]]:
    """(T, D, per-rank layout) for this job, or StartupError naming the flag to change. A target rank's layers
    go over `per_rank` devices (its layout row's `devices`, when more than one). Every row names its node and local
    rank (`nodes`: the job's node sizes, one node of world_size ranks when None)."""
    nodes = nodes or Nodes((world_size,))
    gpus = cfg.target_gpus + cfg.drafter_gpus
    idle = []
    if uses_gpus(cfg, cuda) or rehearses_gpus(cfg, cuda):
        slots, idle = _node_slots(cfg, world_size, per_rank, nodes)
        on_cpu = not uses_gpus(cfg, cuda)
        roles = []
        for rank in range(world_size):
            node, local = nodes.place(rank)
            role, index, devices = slots[local]
            roles.append((role, node, local, index, ["cpu"] * len(devices) if on_cpu else devices,
                          devices if on_cpu else None))
        t = sum(1 for s in slots if s[0] == "target")
        T, D = t * nodes.count, (len(slots) - t) * nodes.count
    else:
        if gpus and cfg.device != "cpu":
            raise StartupError(f"GPUs {sorted(set(gpus))} requested but CUDA is not available; pass "
                               "--target-gpus '' --drafter-gpus '' (or --device cpu) to train on the CPU")
        T = cfg.target_ranks
        D = world_size - T
        if T < 1 or D < 1:
            raise StartupError(f"--target-ranks {T} leaves {D} drafter ranks of the {world_size} torchrun started; "
                               f"pass --target-ranks between 1 and {world_size - 1}")
        roles = [("target" if r < T else "drafter", *nodes.place(r), None,
                  ["cpu"] * (per_rank if r < T else 1), None) for r in range(world_size)]
    layout, counts = [], {"target": 0, "drafter": 0}
    for rank, (role, node, local, _index, devices, rehearsed) in enumerate(roles):
        layout.append({"rank": rank, "role": role, "role_rank": counts[role], "node": node, "local_rank": local,
                       "device": devices[0], **({"devices": devices} if len(devices) > 1 else {}),
                       **({"rehearses": rehearsed} if rehearsed else {})})
        counts[role] += 1
    if idle and layout:
        layout[0]["idle_gpus"] = idle
    return T, D, layout


def _node_slots(cfg: TrainConfig, world_size: int, per_rank: int, nodes: Nodes):
    """Each node's ranks by local rank: [(role, index in role on the node, devices)] - the target groups of
    --target-gpus then --drafter-gpus, the same on every node - and the GPUs left idle."""
    from dflash_trainer.model.target_split import target_groups
    if not cfg.target_gpus or not cfg.drafter_gpus:
        raise StartupError(f"a torchrun job needs target and drafter GPUs; got --target-gpus {cfg.target_gpus} "
                           f"--drafter-gpus {cfg.drafter_gpus}: list at least one GPU in each")
    try:
        groups, idle = target_groups(cfg.target_gpus, per_rank)
    except ValueError as e:
        raise StartupError(str(e)) from None
    slots = [("target", i, [f"cuda:{g}" for g in group]) for i, group in enumerate(groups)] + \
            [("drafter", i, [f"cuda:{g}"]) for i, g in enumerate(cfg.drafter_gpus)]
    per = f" ({per_rank} GPUs per target rank)" if per_rank > 1 else ""
    lists = f"--target-gpus {cfg.target_gpus}{per} + --drafter-gpus {cfg.drafter_gpus}"
    if not nodes.uniform:
        raise StartupError(f"{lists} are each node's lists ({len(slots)} ranks on every node), but the job's "
                           f"{nodes.describe()}; run --nproc-per-node {len(slots)} on every node")
    if nodes.sizes[0] != len(slots):
        many = f" on each of {nodes.count} nodes" if nodes.count > 1 else ""
        raise StartupError(f"{lists} make {len(groups)} + {len(cfg.drafter_gpus)} ranks per node but torchrun "
                           f"started {nodes.sizes[0]}{many} (WORLD_SIZE {world_size}); pass --nproc-per-node "
                           f"{len(slots)} (on every node) or change the GPU lists")
    return slots, idle


def data_backend(layout: list[dict]) -> str:
    """NCCL between GPUs; NCCL refuses two ranks on one device, so a shared GPU (and the CPU) goes host-staged
    (gloo). A device is (node, device): cuda:0 of node 0 and cuda:0 of node 1 are two GPUs. The same answer on
    every rank: it reads the whole job's layout."""
    on_gpus = all(e["device"].startswith("cuda") for e in layout)
    distinct = len({(e.get("node", 0), e["device"]) for e in layout}) == len(layout)
    return "nccl" if on_gpus and distinct else "gloo"


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
    nodes = job_nodes(world_size)
    check_placement(nodes, rank)
    T, D, layout = plan_layout(cfg, world_size, torch.cuda.is_available(), per_rank, nodes)
    if rank == 0 and per_rank > 1:
        idle = layout[0].get("idle_gpus")
        print(f"[rank 0] each target rank splits its layers over {per_rank} devices ({why})"
              + (f"; GPUs {idle} stay idle (not a whole group)" if idle else ""), flush=True)
    device = torch.device(layout[rank]["device"])
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = data_backend(layout)
    # With NCCL the groups are dual: CPU tensors (message headers, loss sums) go through gloo, CUDA ones NCCL.
    pg_backend = "cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo"
    # every collective and transfer fails after --collective-timeout without its peers (a host gone silent: no reset)
    timeout = datetime.timedelta(seconds=cfg.collective_timeout)
    if backend == "nccl":
        dist.init_process_group(pg_backend, device_id=device, timeout=timeout)
    else:
        dist.init_process_group(pg_backend, timeout=timeout)
    store = dist.distributed_c10d._get_default_store()
    _agree_on_layout(store, rank, layout)
    drafter_ranks = [e["rank"] for e in layout if e["role"] == "drafter"]
    # new_group is collective over the world: every rank makes every group, in the same order.
    drafter_group = dist.new_group(drafter_ranks, backend=pg_backend, timeout=timeout)
    return World(rank=rank, world_size=world_size, num_target_ranks=T, num_drafter_ranks=D, device=device,
                 pid_file=pid_file, drafter_group=drafter_group if rank in drafter_ranks else None,
                 data_backend=backend, data_group=dist.group.WORLD,
                 store=store, layout=layout)


LAYOUT_KEY = "dflash/layout"
ERROR_KEY = "dflash/error"
ERRORS_KEY = "dflash/errors"  # failures counted: the first failing rank's error is the job's


def job_error(store) -> str | None:
    """The job's first error, once a rank has recorded one (dist_train's failure path), else None; None too when
    the store is gone with the agent (the ranks end with it anyway)."""
    try:
        return store.get(ERROR_KEY).decode() if store.check([ERROR_KEY]) else None
    except Exception:  # noqa: BLE001 - a store that does not answer is no peer's failure
        return None


def _agree_on_layout(store, rank: int, layout: list[dict]) -> None:
    """Every rank plans the layout itself (same flags, same rule); over nodes one input may differ per node - the
    GPUs per target rank measured from each node's free memory - so each rank compares its plan with rank 0's."""
    mine = json.dumps(layout, sort_keys=True)
    if rank == 0:
        store.set(LAYOUT_KEY, mine)
        return
    theirs = store.get(LAYOUT_KEY).decode()
    if theirs != mine:
        node = layout[rank]["node"]
        raise StartupError(f"rank {rank} (node {node}) planned another layout than rank 0: "
                           f"{_roles(json.loads(theirs))} there, {_roles(layout)} here; pass the same flags on every "
                           "node and --target-gpus-per-rank N (not 0, measured per node) so every node splits alike")


def _roles(layout: list[dict]) -> str:
    return " ".join(f"{e['rank']}:{e['role'][0]}@{e['node']}/{'+'.join(e.get('devices', [e['device']]))}"
                    for e in layout)


def close_world(world: World) -> None:
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        remove_pid_file(world.pid_file)
