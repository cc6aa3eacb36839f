"""dflash-train under torchrun: target ranks feed drafter ranks through bounded hidden-state queues.

One host, CPU (tests; gloo), 1 target rank + 2 drafter ranks:
    python -m torch.distributed.run --standalone --nproc-per-node 3 -m dflash_trainer.cli \
        --target-model /tmp/demo/target --data-dir /tmp/demo/data --output-dir /tmp/demo/out \
        --target-gpus '' --drafter-gpus '' --target-ranks 1 --grad-accum 1 ...
One host, 8 GPUs (5 target ranks, 3 drafter ranks; NCCL):
    torchrun --standalone --nproc-per-node 8 --shutdown-timeout 600 -m dflash_trainer.cli \
        --target-model /models/Qwen3.6-27B --data-dir /data/tok --output-dir /runs/r1/out \
        --target-gpus 0,1,2,3,4 --drafter-gpus 5,6,7 --hs-queue-depth 90 --hs-queue-min-ready 30
Several hosts (the same command on each; rank order = node rank order, targets first):
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint host0:29500 --rdzv-id r1 \
        --shutdown-timeout 600 -m dflash_trainer.cli ... --target-gpus 0,...,7 --drafter-gpus 0,...,7
A target that needs 2 GPUs (2 target ranks, layers split over GPUs 0-1 and 2-3, GPU 4 idle) and FSDP drafters:
    torchrun --standalone --nproc-per-node 5 --shutdown-timeout 600 -m dflash_trainer.cli ... \
        --target-gpus 0,1,2,3,4 --target-gpus-per-rank 2 --drafter-gpus 5,6,7 --drafter-sharding fsdp
(torchrun = python -m torch.distributed.run.) torchrun starts every rank in a session of its own and SIGKILLs
them --shutdown-timeout seconds after SIGTERM (default 30): set it at least to the stop timeout, and signal the
ranks themselves (their pids are in <run-dir>/ranks/); see dist_world.py.

The schedule is the single-process one with G = --grad-accum x D micro-batches per optimizer step: stream
item k (the k-th batch since this job started) is computed by target rank k % T; micro-batch g of a step is
trained on drafter rank g % D (interleaved: FSDP's forward gathers in step across the drafter ranks, so each needs
its next micro-batch while the others compute theirs), with the seed the single-process run gives micro-batch g. DDP
(or FSDP2: drafter_parallel.py) averages the drafters' gradients, so a job of D drafter ranks follows the same
trajectory as one process with --grad-accum G (float rounding aside). Checkpoints (same format as one process,
written by the first drafter rank) hold the data position after the last full step: a resume under any world size
repeats and skips no batch; items still in the queues are dropped and recomputed.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dflash_trainer.loop.checkpoint import find_latest, load_checkpoint, save_checkpoint
from dflash_trainer.config import StartupError, TrainConfig, default_target_layer_ids, validate_paths
from dflash_trainer.data.batches import BatchLoader, TokenizedDataset, collate
from dflash_trainer.distributed.world import World, close_world, init_world, remove_pid_file
from dflash_trainer.model.drafter import DrafterConfig
from dflash_trainer.distributed.drafter_parallel import (ParallelDrafter, agree_on_min, agree_on_sharding, choose_sharding,
                                              pad_micro_batches)
from dflash_trainer.failures import ExplainedFailure
from dflash_trainer.telemetry.heartbeat import RESERVE_NAME, Heartbeat
from dflash_trainer.distributed.hs_queue import HiddenStateQueue, batch_tap_bytes, check_host_memory, mem_available
from dflash_trainer.distributed.hs_transport import Item, Receiver, Sender
from dflash_trainer.loss import acceptance_proxy, describe_head_chunk
from dflash_trainer.loop.optimizer import drafter_adamw
from dflash_trainer.loop.step import derived_seed, drafter_micro_batch
from dflash_trainer.telemetry.writers import JsonlWriter, NvmlTelemetry, profile_line
from dflash_trainer.loop.wall_clock import compile_warmup, keep_snapshot, pending_snapshots, training_clock
from dflash_trainer.telemetry.wandb_log import WandbLog, check_available

STOP_REQUESTED, STOP_AT, PROGRESS, ERROR = "dflash/stop_requested", "dflash/stop_at", "dflash/progress", "dflash/error"
ERRORS = "dflash/errors"  # failures counted: the first failing rank's error is the job's
RANK_PROGRESS = "dflash/rank/"  # + rank: that rank's last RankProgress row


class RankProgress:
    """This rank's counters (cumulative): the last step it worked on, items (micro-batches) sent or trained,
    tokens, tokens/s since the rank started training, and seconds per phase (target: data, target forward, send =
    waiting to hand taps to the transfer, transfer = hand-off to transfer complete, overlapping the next forward;
    drafter: queue_wait, drafter_fwd_bwd, optimizer = clipping, the loss all-reduce and the update, step). Every
    update goes to the job's store, where rank 0 reads every rank's for the heartbeat's `ranks` (a stalled rank's
    step and time stay behind); a row goes to <run-dir>/profile.jsonl and the log every DFLASH_PROFILE_INTERVAL
    seconds (0: every update, not logged) and at the end. Rows carry "rank" and "role" (one file for the whole
    job, each row one append; benchmarks/pipeline.py reads its stage timings from it)."""

    def __init__(self, world: World, cfg: TrainConfig):
        self.world, self.interval_s = world, cfg.profile_interval
        self.writer = JsonlWriter(os.path.join(cfg.run_dir, "profile.jsonl"))
        self.row = {"rank": world.rank, "role": world.role, "step": 0, "items": 0, "tokens": 0, "seconds": {}}
        self._lock = threading.Lock()
        self._last_write = 0.0
        self._start = time.time()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self.row["seconds"][name] = round(self.row["seconds"].get(name, 0.0) + seconds, 6)

    def update(self, force: bool = False, **fields) -> None:
        with self._lock:
            self.row.update(fields, time=time.time())
            self.row["tokens_per_s"] = round(self.row["tokens"] / max(self.row["time"] - self._start, 1e-9), 1)
            if self.world.device.type == "cuda":
                self.row["cuda_max_allocated_mb"] = round(torch.cuda.max_memory_allocated(self.world.device) / 2**20)
            payload = json.dumps(self.row)
            if force or self.row["time"] - self._last_write >= self.interval_s:
                self._last_write = self.row["time"]
                self.writer.write(self.row)
                if force or self.interval_s > 0:
                    log(self.world, profile_line(self.row))
        try:
            self.world.store.set(RANK_PROGRESS + str(self.world.rank), payload)
        except Exception:  # noqa: BLE001 - the heartbeat misses one update; training goes on
            pass


@dataclass
class Slot:
    step: int
    micro: int          # g, over all drafter ranks
    k: int              # stream index since this job started
    indices: list[int]  # dataset rows


class Schedule:
    """The single-process loop's batch order, as (step, slots, data position after the step)."""

    def __init__(self, dataset, cfg: TrainConfig, data_state: dict | None, step0: int, total_steps: int,
                 micro_per_step: int):
        self.loader = BatchLoader(dataset, cfg.seed, cfg.token_budget, cfg.max_batch_size)
        if data_state is not None:
            self.loader.load_state_dict(data_state)
        self.epochs, self.step0, self.total_steps, self.G = cfg.epochs, step0, total_steps, micro_per_step

    def steps(self):
        loader, step, k = self.loader, self.step0, 0
        while step < self.total_steps and loader.epoch < self.epochs:
            slots = []
            for g in range(self.G):
                if loader.batch_index >= loader.batches_in_epoch() and loader.epoch + 1 >= self.epochs:
                    break  # the last epoch ends mid-step, as in train.py
                slots.append(Slot(step, g, k, loader._next_indices()))
                k += 1
            if not slots:
                return
            yield step, slots, loader.state_dict()
            step += 1


class _Frozen:
    """What training_drafter needs of the target: its embedding and lm_head, read without the whole model."""

    def __init__(self, model_dir: str):
        import glob

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


def log(world: World, msg: str) -> None:
    print(f"{world.tag()} {msg}", flush=True)


def _store_int(store, key: str) -> int | None:
    return int(store.get(key)) if store.check([key]) else None


def run_target(cfg, world: World, schedule: Schedule, layer_ids, stop: threading.Event, nvml: NvmlTelemetry) -> None:
    from dflash_trainer.model.target import FrozenTarget
    from dflash_trainer.model.target_split import layer_ranges
    from dflash_trainer.loop.train import target_layers
    split_over = [torch.device(d) for d in world.layout[world.rank].get("devices", [])]
    target = FrozenTarget(cfg.target_model, world.device, layer_ids, need_last_hidden=cfg.use_soft_labels,
                          split_over=split_over)
    log(world, "target layers: " + target_layers(target, cfg))
    if target.layer_devices:
        log(world, "target layers split: " + layer_ranges(target.layer_devices))
    dist.barrier()  # every rank is loaded: the drafters' receivers start only now
    T, D = world.num_target_ranks, world.num_drafter_ranks
    progress = RankProgress(world, cfg)
    nvml.start(lambda: progress.row["step"])
    handed = {}  # k -> when the loop handed the item to the sender

    def sent(item: Item) -> None:  # the sender's thread (or the loop, with --hs-sync-transfers): transfer complete
        progress.add("transfer", time.perf_counter() - handed.pop(item.k, time.perf_counter()))
        progress.update(step=item.step, items=progress.row["items"] + 1,
                        tokens=progress.row["tokens"] + int(item.lengths.sum()))

    sender = Sender(world.data_group, world.data_backend, world.device, synchronous=cfg.hs_sync_transfers,
                    on_sent=sent)
    stop_at, ended, requested, num_items, t_start = None, set(), False, 0, time.perf_counter()
    for _, slots, _ in schedule.steps():
        for slot in slots:
            if slot.k % T != world.role_rank:
                continue
            dst = T + slot.micro % D
            if stop.is_set() and not requested:
                world.store.set(STOP_REQUESTED, str(world.rank))
                requested = True
            if stop_at is None:
                stop_at = _store_int(world.store, STOP_AT)
            if stop_at is not None and slot.step > stop_at:
                if dst not in ended:  # this drafter expects something from us: tell it nothing more comes
                    sender.send_end(dst)
                    ended.add(dst)
                if len(ended) == D:
                    break
                continue
            t0 = time.perf_counter()
            batch = collate(schedule.loader.dataset, slot.indices)
            t1 = time.perf_counter()
            taps, last = target(batch.input_ids)
            t2 = time.perf_counter()
            handed[slot.k] = t2
            sender.send(dst, Item(slot.k, slot.step, slot.micro, batch.input_ids, batch.loss_mask, batch.lengths,
                                  list(taps), last))
            progress.add("data", t1 - t0)
            progress.add("target", t2 - t1)  # host time: on CUDA the forward runs on while the loop goes on
            progress.add("send", time.perf_counter() - t2)  # waiting for room to send (a full queue downstream)
            num_items += 1
        if len(ended) == D:
            break
    sender.close()
    progress.update(force=True, done=True)
    elapsed = time.perf_counter() - t_start
    log(world, f"target done: {num_items} micro-batches in {elapsed:.1f} s, {sender.bytes_sent / 2**20:.1f} MiB sent")


def run_drafter(cfg, world: World, schedule_factory, drafter_cfg, state, total_steps: int,
                stop: threading.Event, nvml: NvmlTelemetry) -> None:
    from dflash_trainer.loop.schedule import Schedule as LrSchedule
    from dflash_trainer.loop.train import rng_state, training_drafter
    d, D, T, accum = world.role_rank, world.num_drafter_ranks, world.num_target_ranks, cfg.grad_accum
    # free memory before the drafter is built here: the sharding choice counts its weights in
    free = torch.cuda.mem_get_info(world.device)[0] if world.device.type == "cuda" else None
    frozen = _Frozen(cfg.target_model)
    torch.manual_seed(cfg.seed)  # the drafter's init draws exactly as in the single-process run
    drafter, linears = training_drafter(drafter_cfg, frozen, world.device, cfg.compile_layers, cfg.fp8_layers)
    log(world, "drafter linears: " + linears)
    log(world, "head chunk: " + describe_head_chunk(drafter_cfg.vocab_size, cfg.head_chunk_size))
    del frozen
    lr_schedule = LrSchedule(cfg, total_steps)
    step, num_bad_total, train_s, num_sequences = 0, 0, 0.0, 0
    if state is not None:
        model_state, saved_cfg, train_state = state
        if DrafterConfig.from_dict(saved_cfg) != drafter_cfg:
            raise StartupError("the checkpoint was trained with a different drafter config; use a new --output-dir "
                               "or the original flags")
        drafter.load_trainable_state_dict(model_state)  # whole, before FSDP shards it
        step, num_bad_total = train_state["step"], train_state.get("num_bad_steps", 0)
        train_s, num_sequences = train_state["scheduler"].get("train_s", 0.0), train_state.get("num_sequences", 0)
    train_s0 = train_s  # the training time of the checkpoint resumed from: the clock goes on from there
    numel = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    frozen_bytes = sum(p.numel() * p.element_size() for p in drafter.parameters() if not p.requires_grad)
    mode, why = choose_sharding(cfg.drafter_sharding, numel, frozen_bytes, free, D)
    mode = agree_on_sharding(mode, world.drafter_group)
    if world.is_drafter_leader:
        log(world, f"drafter ranks: {mode} ({why})")
    parallel = ParallelDrafter(drafter, mode, world.drafter_group, world.device)
    ddp = parallel.model
    trainable = [p for p in drafter.parameters() if p.requires_grad]  # FSDP's sharded ones: after wrapping
    optimizer = drafter_adamw(trainable, cfg.lr, cfg.weight_decay, world.device, sharded=mode == "fsdp")
    if state is not None:
        parallel.load_optimizer(optimizer, train_state["optimizer"])

    def mine(slots):
        return [s for s in slots if s.micro % D == d]

    def expected():
        for _, slots, _ in schedule_factory().steps():
            for s in mine(slots):
                yield s.k, s.step, s.micro, s.k % T

    num_mine = sum(1 for _ in expected())
    hs_queue = HiddenStateQueue(cfg.hs_queue_depth, min(cfg.hs_queue_min_ready, num_mine))
    dist.barrier()
    receiver = Receiver(expected(), hs_queue, world.data_group, world.data_backend, world.device,
                        drafter_cfg.num_taps, drafter_cfg.hidden_size, synchronous=cfg.hs_sync_transfers).start()
    progress = RankProgress(world, cfg)
    progress.update(step=step)
    nvml.start(lambda: progress.row["step"])
    if cfg.hs_sync_transfers:  # no queue: each item is received when its micro-batch comes
        log(world, f"receiving my {num_mine} micro-batches one at a time (--hs-sync-transfers)")
    else:
        log(world, f"waiting for {hs_queue.min_ready} of my {num_mine} micro-batches (queue depth {hs_queue.depth})")
        hs_queue.wait_ready(hs_queue.min_ready, stop)
    # --compile-warmup-batches: forward and backward on my first micro-batches, which stay mine to train on (left
    # in the queue; with --hs-sync-transfers held here), before the clock starts; no collective, no DDP hook
    held = []
    num_warm = 0 if stop.is_set() else min(cfg.compile_warmup_batches, num_mine,
                                           num_mine if cfg.hs_sync_transfers else hs_queue.depth)
    if parallel.sharded:  # FSDP's forward gathers collectively: every drafter rank warms up on as many
        num_warm = agree_on_min(num_warm, world.drafter_group)
    if num_warm:
        t0 = time.perf_counter()
        if cfg.hs_sync_transfers:
            held = [receiver.next_item() for _ in range(num_warm)]
            warm = held
        else:
            warm = hs_queue.peek(num_warm)
        count = compile_warmup(cfg, drafter, optimizer, ((i.taps, i.last, i.input_ids, i.loss_mask, i.lengths)
                                                          for i in warm))
        del warm
        log(world, f"compile warm-up: {count} micro-batches, not trained on, {time.perf_counter() - t0:.1f} s "
                   "(outside the training time)")

    def next_item():
        return held.pop(0) if held else (receiver.next_item if cfg.hs_sync_transfers else hs_queue.get)()

    leader = world.is_drafter_leader
    metrics = JsonlWriter(os.path.join(cfg.run_dir, "metrics.jsonl")) if leader else None
    wandb_run = WandbLog.open(cfg, lambda msg: log(world, msg), world.layout) if leader else None
    wandb_profiled = time.time()
    S = drafter_cfg.block_size
    window = {"loss": 0.0, "tokens": 0, "time": 0.0, "steps": 0, "correct": None, "count": None, "crc": 0}
    data_state, saved = None, {"step": step if state is not None else -1, "path": None}
    snapshots = JsonlWriter(os.path.join(cfg.run_dir, "snapshots.jsonl")) if leader else None
    pending, last_row, clock = pending_snapshots(cfg), {}, training_clock()

    def checkpoint() -> None:
        weights, optimizer_state = parallel.full_state(optimizer)  # FSDP gathers on every drafter rank
        if leader:  # a full disk raises CheckpointWriteError here: main() ends the job with its one line
            t0 = time.perf_counter()
            train_state = {"optimizer": optimizer_state, "scheduler": {"train_s": train_s},
                           "data": data_state, "rng": rng_state(), "step": step, "num_bad_steps": num_bad_total,
                           "num_sequences": num_sequences, "config": cfg.to_dict(), "world": world.layout}
            saved["path"] = save_checkpoint(cfg.output_dir, step, weights,
                                            drafter_cfg.to_dict(), train_state, cfg.keep_checkpoints)
            log(world, f"checkpoint {saved['path']} ({time.perf_counter() - t0:.2f} s)")
        saved["step"] = step
        dist.barrier(group=world.drafter_group)  # no drafter leaves before the checkpoint is complete

    def write_metrics(lr: float, amp: float, grad_norm: float) -> None:
        nonlocal window
        acc = (window["correct"] / window["count"].clamp(min=1)).tolist()
        row = {"step": step, "epoch": data_state["epoch"], "loss": window["loss"] / window["steps"],
               "slot_acc": [round(a, 4) for a in acc], "tau_proxy": acceptance_proxy(acc),
               "tokens_per_s": window["tokens"] / window["time"], "lr": lr, "noise": amp, "grad_norm": grad_norm,
               "num_bad_steps": num_bad_total, "data_crc": window["crc"], "train_s": round(train_s, 3),
               "sequences": num_sequences, "queue_high_water": hs_queue.high_water,
               "queue_wait_s": round(hs_queue.wait_s, 4), "time": time.time()}
        metrics.write(row)
        last_row.update(row)
        if wandb_run is not None:
            wandb_run.metrics(row)
        log(world, f"step {step} epoch {data_state['epoch']} loss {row['loss']:.4f} acc1 {acc[1]:.3f} "
                   f"tau {row['tau_proxy']:.3f} tokens/s {row['tokens_per_s']:.1f} lr {lr:.3e} noise {amp:.4f} "
                   f"train {train_s:.1f} s queue {len(hs_queue)}/{hs_queue.depth}")
        window = {"loss": 0.0, "tokens": 0, "time": 0.0, "steps": 0, "correct": None, "count": None, "crc": 0}

    def snapshot(minutes: float) -> None:  # on every drafter rank at the same step (train_s is agreed)
        if saved["step"] != step:
            checkpoint()
        if leader:
            if window["steps"]:
                write_metrics(lr, amp, float(grad_norm))
            dst = keep_snapshot(cfg, snapshots, minutes, saved["path"] or find_latest(cfg.output_dir), step=step,
                                train_s=train_s, epoch=data_state["epoch"], sequences=num_sequences,
                                dataset_rows=len(schedule_factory().loader.dataset), metrics=last_row)
            log(world, f"snapshot at {minutes:g} min of training: step {step}, {num_sequences} sequences, {dst}")

    def agree_to_stop(local: bool) -> bool:
        flag = torch.tensor([float(local or stop.is_set() or world.store.check([STOP_REQUESTED]))])
        dist.all_reduce(flag, group=world.drafter_group)
        return flag.item() > 0

    stopping, budget_spent = agree_to_stop(False), False
    drafter.train()
    t_clock = clock()  # the first drafter rank's clock is the job's (the others' readings are not used)
    last_item = None  # FSDP repeats it, zero-weighted, where a short last step leaves this rank fewer micro-batches
    for s, slots, data_after in ([] if stopping else schedule_factory().steps()):
        t_step = time.perf_counter()
        lr, amp = lr_schedule.lr(s, train_s), lr_schedule.noise(s, train_s)
        for group in optimizer.param_groups:
            group["lr"] = lr
        my_slots = mine(slots)
        # DDP all-reduces during the last backward; when some drafter has no micro-batch in this (last, short)
        # step, every drafter sums gradients by hand instead, so nobody waits for a backward that never comes.
        # FSDP shards instead: every drafter runs as many forwards (gathers) as the first, padding with zero-weighted
        # repeats of its last micro-batch, and the reduce-scatter of the last backward averages as DDP does.
        by_hand = len(slots) < D and not parallel.sharded
        extra = pad_micro_batches(len(my_slots), len(slots), D, parallel.sharded)
        loss_sum = torch.zeros((), device=world.device)
        correct, count, tokens = torch.zeros(S, device=world.device), torch.zeros(S, device=world.device), 0
        for i, slot in enumerate(my_slots):
            t_wait = time.perf_counter()
            item = next_item()
            progress.add("queue_wait", time.perf_counter() - t_wait)
            assert (item.k, item.micro) == (slot.k, slot.micro), (item.k, slot.k)
            sync = by_hand or i + 1 < len(my_slots) + extra
            t_fwd = time.perf_counter()
            with parallel.no_sync() if sync else _nothing():
                out = drafter_micro_batch(ddp, item.taps, item.last, item.input_ids, item.loss_mask, item.lengths,
                                          max_anchors=cfg.max_anchors, gamma=cfg.gamma, noise_amplitude=amp,
                                          seed=derived_seed(cfg.seed, s, slot.micro),
                                          head_chunk_size=cfg.head_chunk_size)
                (out.loss / accum).backward()
            progress.add("drafter_fwd_bwd", time.perf_counter() - t_fwd)
            loss_sum += out.loss.detach()
            correct += out.slot_correct
            count += out.slot_count
            tokens += int(item.lengths.sum())
            last_item = item
        for i in range(extra):
            if last_item is None:
                raise RuntimeError(f"drafter rank {d} has no micro-batch to repeat under FSDP; use "
                                   "--drafter-sharding ddp or more data")
            with parallel.no_sync() if i + 1 < extra else _nothing():
                out = drafter_micro_batch(ddp, last_item.taps, last_item.last, last_item.input_ids,
                                          last_item.loss_mask, last_item.lengths, max_anchors=cfg.max_anchors,
                                          gamma=cfg.gamma, noise_amplitude=0.0, seed=derived_seed(cfg.seed, s, -1),
                                          head_chunk_size=cfg.head_chunk_size)
                (out.loss * 0.0).backward()
        # The host waits here for the queued forward/backward (CUDA runs it asynchronously): that wait counts as
        # drafter_fwd_bwd, as in one process (train.py), not as the optimizer's time.
        t_wait = time.perf_counter()
        loss_host = float(loss_sum)
        progress.add("drafter_fwd_bwd", time.perf_counter() - t_wait)
        t_opt = time.perf_counter()
        if by_hand:
            for p in trainable:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad, group=world.drafter_group)
                p.grad /= D
        grad_norm = parallel.clip_grad_norm(trainable, cfg.grad_clip)
        local_stop = stop.is_set() or world.store.check([STOP_REQUESTED])
        # one all-reduce of host values per optimizer step (CPU tensor: gloo, also in a cpu:gloo,cuda:nccl group);
        # it carries the first drafter's clock reading (the others add 0), so every drafter holds the same
        # training time
        stats = torch.tensor([loss_host, len(my_slots), tokens, float(local_stop),
                              clock() - t_clock if leader else 0.0, sum(len(x.indices) for x in my_slots)]
                             + correct.tolist() + count.tolist(), dtype=torch.float64)
        dist.all_reduce(stats, group=world.drafter_group)
        loss_value, tokens_all = stats[0].item() / stats[1].item(), int(stats[2])
        train_s = train_s0 + stats[4].item()
        num_sequences += int(stats[5])
        budget_spent = lr_schedule.budget_spent(train_s)
        stopping = stats[3].item() > 0 or budget_spent
        correct_all, count_all = stats[6:6 + S], stats[6 + S:]
        if math.isfinite(loss_value) and math.isfinite(float(grad_norm)):
            optimizer.step()
        else:  # unlike one process, a skipped update still uses up its step: the targets have moved on
            num_bad_total += 1
            log(world, f"step {s}: non-finite loss {loss_value} / grad norm {float(grad_norm)}: update skipped")
        optimizer.zero_grad(set_to_none=True)
        step, data_state = s + 1, data_after
        progress.add("optimizer", time.perf_counter() - t_opt)
        elapsed = time.perf_counter() - t_step
        progress.add("step", elapsed)
        progress.update(step=step, items=progress.row["items"] + len(my_slots), tokens=progress.row["tokens"] + tokens,
                        step_s=round(elapsed, 6), queue_depth=len(hs_queue))
        window["loss"] += loss_value
        window["tokens"] += tokens_all
        window["time"] += elapsed
        window["steps"] += 1
        for slot in slots:
            window["crc"] = zlib.crc32(str(slot.indices).encode(), window["crc"])
        window["correct"] = correct_all if window["correct"] is None else window["correct"] + correct_all
        window["count"] = count_all if window["count"] is None else window["count"] + count_all
        if leader:
            world.store.set(PROGRESS, json.dumps({"step": step, "epoch": data_state["epoch"], "loss": loss_value,
                                                  "tokens_per_s": tokens_all / max(elapsed, 1e-9),
                                                  "queue_depth": len(hs_queue)}))
        if leader and (step % cfg.log_interval == 0 or step == total_steps or stopping):
            write_metrics(lr, amp, float(grad_norm))
        if wandb_run is not None and time.time() - wandb_profiled >= cfg.profile_interval:
            wandb_profiled = time.time()
            wandb_job_profile(wandb_run, world, step, nvml)
        while pending and train_s >= pending[0] * 60:  # the weights after this step, at these minutes
            snapshot(pending.pop(0))
        if stopping:
            break
        if step % cfg.checkpoint_interval == 0:
            checkpoint()

    if stopping and leader:
        world.store.set(STOP_AT, str(step - 1))  # targets send nothing for later steps
    if stopping:
        hs_queue.drain()
    if saved["step"] != step and data_state is not None:
        checkpoint()
    if leader:
        snapshots.close()
    receiver.join()
    progress.update(force=True, done=True)
    dist.barrier(group=world.drafter_group)  # every drafter's last row is in the store for the last W&B profile
    if wandb_run is not None:
        wandb_job_profile(wandb_run, world, step, nvml)
        wandb_run.close()
    why = f"the time budget of {cfg.time_budget_min:g} min is spent" if budget_spent else \
        "stopped" if stopping else "--max-steps or the epochs ended"
    log(world, f"drafter done at step {step}, {train_s:.1f} s of training ({why}); queue high water "
               f"{hs_queue.high_water}/{hs_queue.depth}, waited {hs_queue.wait_s:.2f} s for hidden states")


def wandb_job_profile(wandb_run: WandbLog, world: World, step: int, nvml: NvmlTelemetry) -> None:
    """Every rank's last progress row (from the store, as the heartbeat reads them) and this rank's GPUs."""
    for r in range(world.world_size):
        key = RANK_PROGRESS + str(r)
        if world.store.check([key]):
            wandb_run.profile(json.loads(world.store.get(key)), step)
    wandb_run.gpus(step, nvml.latest)


def check_queue_memory(cfg: TrainConfig, world: World, available: int | None = None) -> None:
    """Before any weights load, on each drafter rank: its host's drafter queues, full, must fit the memory the
    host has available (hs_queue.check_host_memory; StartupError, exit 2, otherwise)."""
    with open(os.path.join(cfg.target_model, "config.json")) as f:
        target_config = json.load(f)
    hidden = int(target_config.get("text_config", target_config)["hidden_size"])
    on_cuda = world.device.type == "cuda"
    # this host's ranks: torchrun numbers them RANK - LOCAL_RANK ... + LOCAL_WORLD_SIZE - 1
    first = world.rank - int(os.environ.get("LOCAL_RANK", "0"))
    local = range(first, first + int(os.environ.get("LOCAL_WORLD_SIZE", str(world.world_size))))
    drafters_here = sum(1 for r in local if r >= world.num_target_ranks)
    K = cfg.num_target_taps + int(cfg.use_soft_labels)
    check_host_memory(cfg.hs_queue_depth,
                      batch_tap_bytes(cfg.token_budget, cfg.num_target_taps, hidden, cfg.use_soft_labels, on_cuda),
                      drafters_here, mem_available() if available is None else available,
                      f"--token-budget {cfg.token_budget} tokens x {K} layers x hidden {hidden} x "
                      f"{2 if on_cuda else 4} bytes")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _first_error(world: World, error: str) -> str:
    """The job's error: `error` if this rank failed first (recorded in the store), else the first one's."""
    try:
        if world.store.add(ERRORS, 1) == 1:
            world.store.set(ERROR, error)
            return error
        world.store.wait([ERROR], datetime.timedelta(seconds=2))
        return world.store.get(ERROR).decode()
    except Exception:  # noqa: BLE001 - the store went with the agent: our own error it is
        return error


def _relay_progress(world: World, heartbeat: Heartbeat, done: threading.Event) -> None:
    """Rank 0 writes the heartbeat; the step, loss and speed are the first drafter rank's (via the store). A
    rank's failure (in the store) makes it `failed` at once, whatever rank 0 is doing."""
    while not done.wait(heartbeat.interval_s):
        try:
            if world.store.check([ERROR]):
                heartbeat.set_phase("failed", error=world.store.get(ERROR).decode())
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


def _report_failure(cfg: TrainConfig, world: World, heartbeat, e: BaseException) -> None:
    """The failed rank's lines in the log and, on rank 0, the `failed` heartbeat (called inside the except)."""
    explained = isinstance(e, (StartupError, ExplainedFailure))  # a refusal, a full disk: the line says it all
    message = " ".join((str(e) if explained else f"{type(e).__name__}: {e}").split())
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
        heartbeat.set_phase("failed", error=first)


def main(cfg: TrainConfig) -> int:
    """One rank of a torchrun job; dflash-train's entry comes here when WORLD_SIZE > 1."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
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
    # each rank reads its own GPU (rows carry the rank); on the CPU NVML is absent: rank 0 says so once
    nvml = NvmlTelemetry(cfg.run_dir, cfg.telemetry_interval,
                         [world.device.index] if world.device.type == "cuda" else [], rank=world.rank)
    if world.device.type != "cuda":
        nvml.close()
        nvml.unavailable = nvml.unavailable or "this rank runs on the CPU"
    if nvml.unavailable and world.rank == 0:
        log(world, f"note: no GPU telemetry: {nvml.unavailable}")
    try:
        validate_paths(cfg)
        if world.is_drafter_leader:
            check_available(cfg)
        if not world.is_target:
            check_queue_memory(cfg, world)
        from transformers import AutoConfig
        target_config = AutoConfig.from_pretrained(cfg.target_model)
        num_target_layers = getattr(target_config, "text_config", target_config).num_hidden_layers
        layer_ids = cfg.target_layer_ids or default_target_layer_ids(num_target_layers, cfg.num_target_taps)
        drafter_cfg = DrafterConfig.from_target(target_config, cfg.num_draft_layers, layer_ids, cfg.block_size,
                                                cfg.mask_token_id, cfg.split_fc_layers)
        dataset = TokenizedDataset(cfg.data_dir, cfg.max_seq_len)
        G = cfg.grad_accum * world.num_drafter_ranks
        batches = BatchLoader(dataset, cfg.seed, cfg.token_budget, cfg.max_batch_size).batches_in_epoch(0)
        total_steps = cfg.epochs * math.ceil(batches / G)
        if cfg.max_steps is not None:
            total_steps = min(total_steps, cfg.max_steps)
        resume_from = find_latest(cfg.output_dir)
        state, step0, data_state = None, 0, None
        if resume_from is not None:
            if world.is_target:  # the data position only; mmap spares reading the optimizer state
                train_state = torch.load(os.path.join(resume_from, "train_state.pt"), mmap=True, weights_only=False)
            else:
                state = load_checkpoint(resume_from)
                train_state = state[2]
            step0, data_state = train_state["step"], train_state["data"]
        dist.barrier()  # everybody has read `latest` before anybody may write a newer one

        def schedule():
            return Schedule(dataset, cfg, data_state, step0, total_steps, G)

        if world.rank == 0:
            log(world, f"world: {world.num_target_ranks} target + {world.num_drafter_ranks} drafter ranks "
                       f"({world.data_backend} transport); micro-batches per optimizer step: {cfg.grad_accum} x "
                       f"{world.num_drafter_ranks} = {G}; {total_steps} optimizer steps"
                       + (f"; resumed from {resume_from} at step {step0}" if resume_from else ""))
            heartbeat.set_phase("training", step=step0)
            threading.Thread(target=_relay_progress, args=(world, heartbeat, done), daemon=True).start()
        if world.is_target:
            run_target(cfg, world, schedule(), layer_ids, stop, nvml)
        else:
            run_drafter(cfg, world, schedule, drafter_cfg, state, total_steps, stop, nvml)
        dist.barrier()
        status = 0
    except BaseException as e:  # noqa: BLE001 - every failure must name its rank and reach the log
        try:
            _report_failure(cfg, world, heartbeat, e)
        finally:  # os._exit skips every cleanup; the pid file last, so the rank shows until it goes
            remove_pid_file(world.pid_file)
            # peers may be blocked in collectives with us: leave now, torchrun ends the job
            os._exit(2 if isinstance(e, StartupError) else 1)
    try:
        done.set()
        nvml.close()
        if heartbeat is not None:
            heartbeat.stop()
            _read_progress(world, heartbeat)
            heartbeat.set_phase("finished", **({"stopped": "SIGTERM"} if stop.is_set() else {}))
    finally:
        close_world(world)
    return status
