"""The two kinds of rank of a torchrun job (dist_train.main starts one of them): a target rank computes the
hidden states of its share of the plan's micro-batches and sends them to the drafter ranks (run_target); a
drafter rank receives its share and trains (run_drafter: the build and resume, then the training loop of
loop/drafter_loop.py, the same one a single process runs, with the hidden-state queue as its source of
micro-batches and the drafter group's DDP/FSDP reduction)."""

from __future__ import annotations

import glob
import os
import threading
import time
from contextlib import ExitStack

import torch
import torch.distributed as dist

from dflash_trainer.config import StartupError, TrainConfig
from dflash_trainer.data.batches import collate
from dflash_trainer.distributed.world import World, job_error
from dflash_trainer.model.drafter import DrafterConfig
from dflash_trainer.distributed.drafter_parallel import ParallelDrafter, agree_on_min, agree_on_sharding, choose_sharding
from dflash_trainer.distributed.hs_queue import HiddenStateQueue
from dflash_trainer.distributed.hs_transport import Item, Receiver, Sender
from dflash_trainer.loop.bookkeeping import Bookkeeping
from dflash_trainer.loop.drafter_loop import LoopParts, Outcome, train
from dflash_trainer.loop.progress import RankProfile, RankProgress, wandb_job_profile
from dflash_trainer.loop.reducers import DrafterRanks
from dflash_trainer.loop.sources import HiddenStates
from dflash_trainer.loop.train_state import TrainState
from dflash_trainer.loss import describe_head_chunk
from dflash_trainer.loop.optimizer import drafter_adamw
from dflash_trainer.loop.schedule import Schedule
from dflash_trainer.loop.step import drafter_micro_batch
from dflash_trainer.telemetry.writers import NvmlTelemetry
from dflash_trainer.loop.wall_clock import training_clock
from dflash_trainer.telemetry.launch_event import record_launch
from dflash_trainer.telemetry.wandb_log import WandbLog

STOP_REQUESTED, STOP_AT = "dflash/stop_requested", "dflash/stop_at"


def log(world: World, msg: str) -> None:
    print(f"{world.tag()} {msg}", flush=True)


class _Frozen:
    """What training_drafter needs of the target: its embedding and lm_head, read without the whole model."""

    def __init__(self, model_dir: str):
        from safetensors import safe_open
        from transformers import AutoConfig, AutoModelForCausalLM
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
        embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        names = {"embed": [n for n, p in model.named_parameters(remove_duplicate=False) if p is embed],
                 "head": [n for n, p in model.named_parameters(remove_duplicate=False) if p is head]}
        # A vision-language checkpoint (Qwen3.5/3.6: Qwen3_5ForConditionalGeneration) keeps the text model under
        # model.language_model.*, which AutoModelForCausalLM loads as its model.*
        names = {what: [*found, *(f"model.language_model.{n[6:]}" for n in found if n.startswith("model."))]
                 for what, found in names.items()}
        found = {}
        for path in sorted(glob.glob(os.path.join(model_dir, "*.safetensors"))):
            with safe_open(path, "pt") as f:
                keys = set(f.keys())
                for what, candidates in names.items():
                    for name in candidates:
                        if what not in found and name in keys:
                            found[what] = f.get_tensor(name)
        if "head" not in found and embed is head and "embed" in found:
            found["head"] = found["embed"]  # tied embeddings
        if set(found) != {"embed", "head"}:
            raise StartupError(f"--target-model {model_dir}: embedding/lm_head weights {names} not found in its "
                               "*.safetensors; the drafter ranks need them (re-stage the model)")
        self.embed, self.head = found["embed"], found["head"]

    def embed_weight(self):
        return self.embed

    def lm_head_weight(self):
        return self.head


# --- target ranks ---

class _Ending:
    """A target rank's side of an early stop: SIGTERM here asks the drafters to stop (STOP_REQUESTED); once the
    first drafter has said which step was its last (STOP_AT), each drafter rank that still expects something from
    this rank is told that nothing more comes, once."""

    def __init__(self, world: World, stop: threading.Event, sender: Sender):
        self.world, self.stop, self.sender = world, stop, sender
        self.requested, self.stop_at, self.ended = False, None, set()

    def past(self, slot, dst: int) -> bool:
        """Whether `slot` lies past the drafters' last step (then `dst` has been told the stream ended)."""
        store = self.world.store
        if self.stop.is_set() and not self.requested:
            store.set(STOP_REQUESTED, str(self.world.rank))
            self.requested = True
        if self.stop_at is None and store.check([STOP_AT]):
            self.stop_at = int(store.get(STOP_AT))
        if self.stop_at is None or slot.step <= self.stop_at:
            return False
        if dst not in self.ended:
            self.sender.send_end(dst)
            self.ended.add(dst)
        return True

    @property
    def every_drafter_told(self) -> bool:
        return len(self.ended) == self.world.num_drafter_ranks


def _load_target(cfg: TrainConfig, world: World, layer_ids):
    from dflash_trainer.model.target import FrozenTarget
    from dflash_trainer.model.target_split import layer_ranges
    from dflash_trainer.loop.train import target_layers
    split_over = [torch.device(d) for d in world.layout[world.rank].get("devices", [])]
    target = FrozenTarget(cfg.target_model, world.device, layer_ids, need_last_hidden=cfg.use_soft_labels,
                          split_over=split_over)
    log(world, "target layers: " + target_layers(target, cfg))
    if target.layer_devices:
        log(world, "target layers split: " + layer_ranges(target.layer_devices))
    return target


def run_target(cfg: TrainConfig, world: World, plan, layer_ids, stop: threading.Event,
               nvml: NvmlTelemetry) -> None:
    """Stream item k of the plan (the k-th micro-batch since the job started) is this rank's if k % T is its
    role rank: collated, run through the target, sent to drafter g % D (g: the micro-batch's index in its step;
    drafter i is global rank world.drafter_ranks[i]), until the plan ends or the drafters stop."""
    target = _load_target(cfg, world, layer_ids)
    dist.barrier()  # every rank is loaded: the drafters' receivers start only now
    T, D, drafters = world.num_target_ranks, world.num_drafter_ranks, world.drafter_ranks
    with ExitStack() as stack:
        progress = RankProgress(world, cfg, lambda msg: log(world, msg))
        stack.callback(progress.close)
        nvml.start(lambda: progress.row["step"])
        handed = {}  # k -> when the loop handed the item to the sender

        def sent(item: Item) -> None:  # the sender's thread (or this loop, --hs-sync-transfers): transfer done
            progress.add("transfer", time.perf_counter() - handed.pop(item.k, time.perf_counter()))
            progress.update(step=item.step, items=progress.row["items"] + 1,
                            tokens=progress.row["tokens"] + int(item.lengths.sum()))

        sender = Sender(world.data_group, world.data_backend, world.device, synchronous=cfg.hs_sync_transfers,
                        on_sent=sent, job_error=lambda: job_error(world.store))
        ending, num_items, t_start = _Ending(world, stop, sender), 0, time.perf_counter()
        mine = (slot for _, slots, _ in plan.steps() for slot in slots if slot.k % T == world.role_rank)
        for slot in mine:
            dst = drafters[slot.micro % D]
            if ending.past(slot, dst):
                if ending.every_drafter_told:
                    break
                continue
            t0 = time.perf_counter()
            batch = collate(plan.loader.dataset, slot.indices)
            t1 = time.perf_counter()
            taps, last = target(batch.input_ids)
            t2 = handed[slot.k] = time.perf_counter()
            sender.send(dst, Item(slot.k, slot.step, slot.micro, batch.input_ids, batch.loss_mask, batch.lengths,
                                  list(taps), last))
            progress.add("data", t1 - t0)
            progress.add("target", t2 - t1)  # host time: on CUDA the forward runs on while the loop goes on
            progress.add("send", time.perf_counter() - t2)  # waiting for room to send (a full queue downstream)
            num_items += 1
        sender.close()
        progress.update(force=True, done=True)
    log(world, f"target done: {num_items} micro-batches in {time.perf_counter() - t_start:.1f} s, "
               f"{sender.bytes_sent / 2**20:.1f} MiB sent")


# --- drafter ranks ---

def _build_drafter(cfg: TrainConfig, world: World, drafter_cfg: DrafterConfig, saved, start):
    """The drafter (the checkpoint's weights when `saved`, else `start`'s: loop/starting_weights.py), wrapped
    for the drafter group (DDP or FSDP), its optimizer and the TrainState: (parallel, optimizer, state)."""
    from dflash_trainer.loop.starting_weights import apply
    from dflash_trainer.loop.train import training_drafter
    D = world.num_drafter_ranks
    # free memory before the drafter is built here: the sharding choice counts its weights in
    free = torch.cuda.mem_get_info(world.device)[0] if world.device.type == "cuda" else None
    frozen = _Frozen(cfg.target_model)
    torch.manual_seed(cfg.seed)  # the drafter's init draws exactly as in the single-process run
    drafter, linears = training_drafter(drafter_cfg, frozen, world.device, cfg.compile_layers, cfg.fp8_layers)
    log(world, "drafter linears: " + linears)
    log(world, "head chunk: " + describe_head_chunk(drafter_cfg.vocab_size, cfg.head_chunk_size))
    del frozen
    state = TrainState()
    if saved is not None:
        model_state, saved_cfg, train_state = saved
        if DrafterConfig.from_dict(saved_cfg) != drafter_cfg:
            raise StartupError("the checkpoint was trained with a different drafter config; use a new --output-dir "
                               "or the original flags")
        drafter.load_trainable_state_dict(model_state)  # whole, before FSDP shards it
        state = TrainState.from_checkpoint(train_state)
    elif start is not None:
        apply(drafter, start)  # whole, before FSDP shards it
        if world.is_drafter_leader:
            log(world, start.words)
    numel = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    frozen_bytes = sum(p.numel() * p.element_size() for p in drafter.parameters() if not p.requires_grad)
    mode, why = choose_sharding(cfg.drafter_sharding, numel, frozen_bytes, free, D)
    mode = agree_on_sharding(mode, world.drafter_group)
    if world.is_drafter_leader:
        log(world, f"drafter ranks: {mode} ({why})")
    parallel = ParallelDrafter(drafter, mode, world.drafter_group, world.device)
    trainable = [p for p in drafter.parameters() if p.requires_grad]  # FSDP's sharded ones: after wrapping
    optimizer = drafter_adamw(trainable, cfg.lr, cfg.weight_decay, world.device, sharded=mode == "fsdp")
    if saved is not None:
        parallel.load_optimizer(optimizer, saved[2]["optimizer"])
    return parallel, optimizer, state


def _receive(cfg: TrainConfig, world: World, plan_factory, reducer: DrafterRanks, drafter_cfg: DrafterConfig):
    """This rank's queue and the receiver filling it with its slots' items in plan order: (queue, receiver,
    number of my micro-batches)."""
    T, targets = world.num_target_ranks, world.target_ranks

    def expected():
        for _, slots, _ in plan_factory().steps():
            for s in reducer.mine(slots):
                yield s.k, s.step, s.micro, targets[s.k % T]

    num_mine = sum(1 for _ in expected())
    hs_queue = HiddenStateQueue(cfg.hs_queue_depth, min(cfg.hs_queue_min_ready, num_mine))
    dist.barrier()
    receiver = Receiver(expected(), hs_queue, world.data_group, world.data_backend, world.device,
                        drafter_cfg.num_taps, drafter_cfg.hidden_size, synchronous=cfg.hs_sync_transfers).start()
    return hs_queue, receiver, num_mine


def run_drafter(cfg: TrainConfig, world: World, plan_factory, drafter_cfg: DrafterConfig, saved, start,
                total_steps: int, stop: threading.Event, nvml: NvmlTelemetry) -> None:
    """Builds (and resumes) the drafter, waits for the first hidden states, warms up, then trains in the loop
    every drafter rank and the single process share. `saved`: load_checkpoint's (weights, config, train state);
    `start`: a new run's starting weights (starting_weights.py), or None."""
    parallel, optimizer, state = _build_drafter(cfg, world, drafter_cfg, saved, start)
    reducer = DrafterRanks(parallel, world, stop, training_clock(), STOP_REQUESTED)
    hs_queue, receiver, num_mine = _receive(cfg, world, plan_factory, reducer, drafter_cfg)
    leader, say = world.is_drafter_leader, (lambda msg: log(world, msg))
    with ExitStack() as stack:  # every resource closes on every way out: errors and SIGTERM included
        progress = RankProgress(world, cfg, say)
        stack.callback(progress.close)
        progress.update(step=state.step)
        nvml.start(lambda: progress.row["step"])
        if cfg.hs_sync_transfers:  # no queue: each item is received when its micro-batch comes
            say(f"receiving my {num_mine} micro-batches one at a time (--hs-sync-transfers)")
        else:
            say(f"waiting for {hs_queue.min_ready} of my {num_mine} micro-batches (queue depth {hs_queue.depth})")
            hs_queue.wait_ready(hs_queue.min_ready, stop)
        source = HiddenStates(cfg, world, hs_queue, receiver, progress, STOP_AT)
        num_warm = 0 if stop.is_set() else min(cfg.compile_warmup_batches, num_mine,
                                               num_mine if cfg.hs_sync_transfers else hs_queue.depth)
        if parallel.sharded:  # FSDP's forward gathers collectively: every drafter rank warms up on as many
            num_warm = agree_on_min(num_warm, world.drafter_group)
        source.warmup(cfg, parallel.drafter, optimizer, say, num_warm)
        wandb_run = WandbLog.open(cfg, say, world.layout) if leader else None
        if wandb_run is not None:
            stack.push(lambda exc_type, exc, tb: wandb_run.close(0 if exc_type is None else 1))
        if leader:
            record_launch(cfg.run_dir, state.step, say, wandb_run)
        profile = RankProfile(progress, world, cfg, wandb_run, nvml)
        plan = plan_factory()
        books = Bookkeeping(stack, cfg, writer=leader, state=state, reducer=reducer, optimizer=optimizer,
                            drafter_cfg=drafter_cfg, source=source,
                            dataset_rows=plan.loader.dataset.rows_per_epoch, say=say,
                            on_phase=lambda phase: None, profile=profile, wandb_run=wandb_run,
                            saved=(state.step if saved is not None else -1, None), extra_state={"world": world.layout})
        parallel.drafter.train()
        trainable = [p for p in parallel.drafter.parameters() if p.requires_grad]
        outcome = train(LoopParts(cfg, state, plan, source, reducer, books, profile, optimizer, trainable,
                                  Schedule(cfg, total_steps), total_steps, drafter_micro_batch, say,
                                  drafter_cfg.block_size))
        receiver.join()
        progress.update(force=True, done=True)
        dist.barrier(group=world.drafter_group)  # every drafter's last row is in the store for the last W&B profile
        if wandb_run is not None:
            wandb_job_profile(wandb_run, world, state.step, nvml)
    _say_done(world, state, outcome, hs_queue, cfg)


def _say_done(world: World, state: TrainState, outcome: Outcome, hs_queue, cfg: TrainConfig) -> None:
    why = f"the time budget of {cfg.time_budget_min:g} min is spent" if outcome.budget_spent else \
        "stopped" if outcome.stopped else "--max-steps or the epochs ended"
    log(world, f"drafter done at step {state.step}, {state.train_s:.1f} s of training ({why}); queue high water "
               f"{hs_queue.high_water}/{hs_queue.depth}, waited {hs_queue.wait_s:.2f} s for hidden states")
