"""The SmolLM2 proof's timed training: the trainer's own drafter and micro-batch step, with the learning
rate and noise following the wall clock (warm-up, then cosine over the largest budget) and a checkpoint
when each budget is reached.

On several devices (`--train-devices cuda:0,cuda:1`) it is data-parallel: one process per device, each
with its own frozen target and drafter replica, every rank training on its own share of each round of
batches. After each backward one all-reduce averages the gradients and also carries rank 0's clock and
the round's sequence count, so every rank takes the same decisions (learning rate, snapshot, stop) at the
same step. Rank 0 saves, logs and announces snapshots; at the end the ranks check that their replicas are
still identical.
"""

from __future__ import annotations

import json
import math
import os
import time

import torch
import torch.distributed as dist

import proof_eval
import proof_report
from safetensors.torch import load_file

from dflash_trainer.checkpoint import load_checkpoint, save_checkpoint
from dflash_trainer.config import default_target_layer_ids
from dflash_trainer.data import BatchLoader, TokenizedDataset
from dflash_trainer.drafter import DrafterConfig
from dflash_trainer.export import drafter_config_from_export
from dflash_trainer.loss import acceptance_proxy
from dflash_trainer.step import derived_seed, drafter_micro_batch


def lr_factor(frac: float, warmup: float) -> float:
    if frac < warmup:
        return max(frac / warmup, 1e-3)
    return 0.5 * (1 + math.cos(math.pi * min((frac - warmup) / (1 - warmup), 1.0)))


def drafter_config(args, mask_id: int) -> DrafterConfig:
    from transformers import AutoConfig
    tconf = AutoConfig.from_pretrained(args.target)
    layer_ids = default_target_layer_ids(getattr(tconf, "text_config", tconf).num_hidden_layers, args.taps)
    return DrafterConfig.from_target(tconf, args.layers, layer_ids, args.block_size, mask_id)


def initial_weights(path: str, cfg: DrafterConfig) -> dict[str, torch.Tensor]:
    """--init-drafter: the trainable weights of an export dir or a checkpoints/step-N dir, for a drafter
    built exactly like `cfg` (a warm start: e.g. the export of an earlier session's run)."""
    if os.path.isfile(os.path.join(path, "config.json")) and os.path.isfile(os.path.join(path, "model.safetensors")):
        with open(os.path.join(path, "config.json")) as f:
            other = drafter_config_from_export(json.load(f))
        state = {k: v.float() for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
    elif os.path.isfile(os.path.join(path, "drafter_config.json")):
        state, other_dict, _ = load_checkpoint(path)
        other = DrafterConfig.from_dict(other_dict)
    else:
        raise ValueError(f"--init-drafter {path} is neither an export dir (config.json + model.safetensors) nor a "
                         "checkpoints/step-N dir; pass one of those")
    mine, theirs = cfg.to_dict(), other.to_dict()
    diff = [f"{k} {theirs.get(k)} there, {v} here" for k, v in mine.items() if theirs.get(k) != v]
    if diff:
        raise ValueError(f"--init-drafter {path} is another drafter ({'; '.join(diff)}); use the same --layers, "
                         "--block-size, --taps, mask token and target")
    return state


def run_training(args, data_dir: str, mask_id: int, out: str, devices: list[str], results: dict,
                 t0: float) -> list[dict]:
    """Trains on `devices` (one process each when there are several); returns the snapshots."""
    if len(devices) == 1:
        return train_rank(0, args, data_dir, mask_id, out, devices, results, t0)
    torch.multiprocessing.start_processes(train_rank, args=(args, data_dir, mask_id, out, devices, results, t0),
                                          nprocs=len(devices), start_method="spawn")  # CUDA needs spawn
    return proof_eval.listed_snapshots(out)


def _own_batch(loader: BatchLoader, rank: int, world: int):
    """This rank's batch of the next round of `world` batches (every rank walks the same plan)."""
    mine = None
    for r in range(world):
        if r == rank:
            mine = loader.next_batch()
        else:
            loader.skip_batch()
    return mine


def _all_reduce(params: list[torch.Tensor], clock: float, sequences: int, world: int) -> tuple[float, int]:
    """Averages the gradients over the ranks; returns (rank 0's clock, the round's sequences)."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    extra = torch.tensor([clock, sequences], dtype=grads[0].dtype, device=grads[0].device)
    flat = torch.cat([g.reshape(-1) for g in grads] + [extra])
    dist.all_reduce(flat)
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset:offset + n].view_as(g).div_(world)
        offset += n
    clock_all, seq_all = flat[-2:].tolist()  # the one host sync of the step
    return clock_all, int(round(seq_all))


def _replicas_identical(params: list[torch.Tensor], world: int) -> bool:
    digest = torch.stack([p.detach().double().sum() for p in params] +
                         [p.detach().double().abs().sum() for p in params]).reshape(1, -1)
    gathered = [torch.zeros_like(digest) for _ in range(world)]
    dist.all_gather(gathered, digest)
    return all(torch.equal(g, gathered[0]) for g in gathered)


def train_rank(rank: int, args, data_dir: str, mask_id: int, out: str, devices: list[str], results: dict,
               t0: float) -> list[dict]:
    from dflash_trainer.target import FrozenTarget
    from dflash_trainer.train import training_drafter

    def log(msg: str) -> None:
        if rank == 0:
            print(f"[{time.time() - t0:7.1f} s] {msg}", flush=True)

    world = len(devices)
    device = torch.device(devices[rank])
    if device.type == "cuda":
        if device.index is None:  # plain "cuda" (--device cuda): set_device needs an index
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world,
                                init_method="file://" + os.path.join(out, "train", "rendezvous"))
    torch.manual_seed(args.seed)  # the same initial drafter on every rank
    cfg = drafter_config(args, mask_id)
    layer_ids = cfg.target_layer_ids
    dataset = TokenizedDataset(data_dir, args.max_seq_len)
    loader = BatchLoader(dataset, args.seed, args.token_budget, args.max_batch_size)
    target = FrozenTarget(args.target, device, layer_ids, need_last_hidden=args.soft_labels)
    drafter = training_drafter(cfg, target, device, compile_layers=not args.eager_layers)  # as dflash-train
    if args.init_drafter:
        drafter.load_trainable_state_dict(initial_weights(args.init_drafter, cfg))
        log(f"warm start from {args.init_drafter}")
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    n_mask = sum(int((dataset.row(i)[0] == mask_id).sum()) for i in range(len(dataset)))
    log(f"train: {len(dataset)} sequences, {int(dataset.lengths.sum())} tokens "
        f"({dataset.num_supervised_tokens} supervised), mask token {mask_id} occurs {n_mask} times in the data; "
        f"drafter {args.layers} layers, block {args.block_size}, taps {layer_ids}, "
        f"{'soft (KL to the target)' if args.soft_labels else 'hard'} labels, lr {args.lr}, "
        f"{sum(p.numel() for p in params) / 1e6:.2f} M params; budgets {args.minutes} min on {', '.join(devices)}")
    budgets = sorted(args.minutes)
    total_s = budgets[-1] * 60
    snapshots, curve, step, sequences, window = [], [], 0, 0, []
    results["curve"] = curve  # the training log's figures, in the report
    drafter.train()
    t_warm = time.time()
    for i in range(args.warmup_batches):  # compile outside the timed budget; no update
        batch = _own_batch(loader, rank, world)
        taps, last = target(batch.input_ids)
        drafter_micro_batch(drafter, taps, last, batch.input_ids, batch.loss_mask, batch.lengths,
                            max_anchors=args.max_anchors, gamma=args.gamma, noise_amplitude=0.0,
                            seed=derived_seed(args.seed, -1 - i - rank * 1000), head_chunk_size=4096).loss.backward()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if world > 1:
        dist.barrier()  # the clock starts when every rank has compiled
    if args.warmup_batches:
        log(f"warm-up (compile) {args.warmup_batches} batches, not trained on: {time.time() - t_warm:.1f} s")
    t_start = time.time()
    clock = 0.0  # rank 0's seconds since t_start, as every rank agreed at the last step
    while budgets:
        frac = clock / total_s
        amp = args.noise_start + (args.noise_end - args.noise_start) * min(frac, 1.0)
        batch = _own_batch(loader, rank, world)
        taps, last = target(batch.input_ids)
        out_ = drafter_micro_batch(drafter, taps, last, batch.input_ids, batch.loss_mask, batch.lengths,
                                   max_anchors=args.max_anchors, gamma=args.gamma, noise_amplitude=amp,
                                   seed=derived_seed(args.seed, step * world + rank), head_chunk_size=4096)
        out_.loss.backward()
        if world > 1:
            clock, n_seq = _all_reduce(params, time.time() - t_start if rank == 0 else 0.0, len(batch.lengths), world)
        else:
            clock, n_seq = time.time() - t_start, len(batch.lengths)
        for g in opt.param_groups:
            g["lr"] = args.lr * lr_factor(clock / total_s, args.warmup)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        sequences += n_seq
        window.append((out_.loss.detach(), out_.slot_correct.detach(), out_.slot_count.detach()))
        reached = clock >= budgets[0] * 60
        if step % args.log_every == 0 or reached:
            loss = float(torch.stack([w[0] for w in window]).mean())  # rank 0's batches; one sync per line
            acc = (sum(w[1] for w in window) / sum(w[2] for w in window).clamp(min=1)).tolist()
            window = []
            log(f"step {step} epoch {loader.epoch} {clock:6.1f} s loss {loss:.4f} acc1 {acc[1]:.3f} "
                f"tau_proxy {acceptance_proxy(acc):.2f} lr {opt.param_groups[0]['lr']:.2e}")
            curve.append({"step": step, "s": round(clock, 1), "passes": round(sequences / len(dataset), 2),
                          "loss": round(loss, 4), "acc1": round(acc[1], 4),
                          "tau_proxy": round(acceptance_proxy(acc), 3), "lr": opt.param_groups[0]["lr"]})
        if reached:
            minutes = budgets.pop(0)
            if rank == 0:
                path = save_checkpoint(os.path.join(out, "train"), step, drafter.trainable_state_dict(),
                                       cfg.to_dict(), {"step": step, "minutes": minutes}, keep=100)
                snapshots.append({"minutes": minutes, "step": step, "wall_s": round(clock, 1),
                                  "epoch": loader.epoch, "sequences": sequences,
                                  "passes": round(sequences / len(dataset), 2), "loss": loss,
                                  "slot_acc": [round(a, 4) for a in acc], "tau_proxy": acceptance_proxy(acc),
                                  "checkpoint": path, "train_devices": devices})
                log(f"snapshot at {minutes} min: step {step}, {sequences} sequences, {path}")
                proof_eval.record_snapshot(out, snapshots[-1])
                results["snapshots"] = snapshots  # the report so far, with what the evaluation finished
                proof_eval.merge(out, results)
                proof_report.write_results(out, results)
    if rank == 0:
        with open(os.path.join(out, "train", "curve.json"), "w") as f:
            json.dump(curve, f)
    if world > 1:
        identical = _replicas_identical(params, world)
        log(f"replicas identical after {step} steps: {identical}")
        if rank == 0:
            with open(os.path.join(out, "train", "replicas.json"), "w") as f:
                json.dump({"world_size": world, "steps": step, "identical": identical}, f)
        dist.destroy_process_group()
    del target
    return snapshots
