"""The drafter ranks' data parallelism: DDP (a full replica per rank) or FSDP2 (`fully_shard`: parameters,
gradients and optimizer state sharded over the drafter ranks) where the drafter does not fit one GPU.

Both average the gradients over the D drafter ranks, so they follow the same trajectory (float rounding aside).
FSDP2 shards each decoder layer and, as one root unit, fc and the norms; the frozen embedding and lm_head (the
target's, bf16) stay whole on every rank: the loss reads lm_head's weight outside the forward.
Checkpoints are full and unsharded in both modes (the trainable weights and the optimizer state keyed as one
process keys it), so a run resumes under DDP, FSDP or another number of ranks alike. FSDP's forward gathers the
shards collectively: every rank must run as many micro-batches as the others, so a rank short of micro-batches in
the last step runs its last one again with its loss times zero (`pad_micro_batches`).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

# Of a drafter GPU's free memory, DDP may plan this fraction for weights, gradients and AdamW state; the rest is
# for activations, the hidden-state items on the GPU and the allocator's slack.
STATE_FRACTION = 0.5
ADAMW_BYTES_PER_PARAM = 16  # fp32 weight, gradient, exp_avg, exp_avg_sq


def choose_sharding(mode: str, trainable_numel: int, frozen_bytes: int, free_bytes: int | None,
                    num_drafters: int = 2) -> tuple[str, str]:
    """("ddp" | "fsdp", why). auto: FSDP when the drafter's training state does not fit STATE_FRACTION of the
    drafter GPU's free memory (None: the CPU, where memory is the host's: DDP; one drafter rank: nothing to shard
    over, DDP)."""
    if mode != "auto":
        return mode, f"--drafter-sharding {mode}"
    if free_bytes is None:
        return "ddp", "auto: on the CPU"
    if num_drafters < 2:
        return "ddp", "auto: one drafter rank"
    need = trainable_numel * ADAMW_BYTES_PER_PARAM + frozen_bytes
    fits = need <= free_bytes * STATE_FRACTION
    return ("ddp" if fits else "fsdp"), (f"auto: weights + gradients + AdamW {need / 1e9:.1f} GB "
                                         f"{'fit' if fits else 'exceed'} {STATE_FRACTION:.0%} of "
                                         f"{free_bytes / 1e9:.1f} GB free")


class _DDPDrafter(torch.nn.parallel.DistributedDataParallel):
    """DDP whose unknown attributes (cfg, fc, lm_head) are the drafter's, so step.drafter_micro_batch takes it."""

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "module":
                raise
            return getattr(super().__getattr__("module"), name)


class ParallelDrafter:
    """`model` is what the training step calls (DDP wrapper, or the drafter itself, sharded in place)."""

    def __init__(self, drafter: torch.nn.Module, mode: str, group, device: torch.device):
        self.drafter, self.mode, self.group = drafter, mode, group
        if mode == "fsdp":
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.fsdp import fully_shard
            mesh = DeviceMesh.from_group(group, device.type)
            for layer in drafter.layers:
                fully_shard(layer, mesh=mesh)
            frozen = {p for p in drafter.parameters() if not p.requires_grad}
            fully_shard(drafter, mesh=mesh, ignored_params=frozen)
            self.model = drafter
        else:
            self.model = _DDPDrafter(drafter, process_group=group,
                                     device_ids=[device] if device.type == "cuda" else None)

    @property
    def sharded(self) -> bool:
        return self.mode == "fsdp"

    def no_sync(self):
        """Gradients accumulate locally (no all-reduce / reduce-scatter) inside this context."""
        if not self.sharded:
            return self.model.no_sync()

        @contextlib.contextmanager
        def accumulate():
            self.model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                self.model.set_requires_gradient_sync(True)
        return accumulate()

    def clip_grad_norm(self, params, max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def full_state(self, optimizer) -> tuple[dict, dict]:
        """(trainable weights, optimizer state) unsharded, in the format one process writes; collective under FSDP
        (every drafter rank calls it), gathered tensor by tensor to the CPU."""
        weights = self.drafter.trainable_state_dict()
        state = optimizer.state_dict()
        if not self.sharded:
            return weights, state
        weights = {k: _full(v) for k, v in weights.items()}
        state = {"state": {i: {k: _full(v) for k, v in s.items()} for i, s in state["state"].items()},
                 "param_groups": state["param_groups"]}
        return weights, state

    def load_optimizer(self, optimizer, state: dict) -> None:
        """An unsharded optimizer state (any world, DDP or FSDP) into this rank's optimizer."""
        if self.sharded:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            state = {"state": {i: {k: _shard_like(v, params[int(i)]) for k, v in s.items()}
                               for i, s in state["state"].items()},
                     "param_groups": state["param_groups"]}
        optimizer.load_state_dict(state)


def _full(value):
    """A DTensor gathered whole onto the CPU (a collective); anything else as it is."""
    if hasattr(value, "full_tensor"):
        return value.full_tensor().cpu()
    return value


def _shard_like(value, param):
    """A whole tensor of `param`'s shape cut as `param` is sharded (this rank's piece); anything else as it is."""
    if isinstance(value, torch.Tensor) and hasattr(param, "placements") and value.shape == param.shape:
        from torch.distributed.tensor import distribute_tensor
        return distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
    return value


def pad_micro_batches(num_mine: int, num_slots: int, num_drafters: int, sharded: bool) -> int:
    """How many extra zero-weighted micro-batches this drafter rank runs in a step of `num_slots` micro-batches
    (dealt out g % D): under FSDP every rank runs as many forwards as the first (which has the most); DDP none."""
    if not sharded:
        return 0
    return -(-num_slots // num_drafters) - num_mine


def agree_on_sharding(mode: str, group) -> str:
    """FSDP on every drafter rank if any of them needs it (their free memory may differ a little); a CPU tensor,
    so gloo carries it in a cpu:gloo,cuda:nccl group too."""
    flag = torch.tensor([1.0 if mode == "fsdp" else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return "fsdp" if flag.item() > 0 else "ddp"


def agree_on_min(count: int, group) -> int:
    """The least of every drafter rank's `count` (CPU tensor: gloo)."""
    box = torch.tensor([float(count)])
    dist.all_reduce(box, op=dist.ReduceOp.MIN, group=group)
    return int(box.item())
