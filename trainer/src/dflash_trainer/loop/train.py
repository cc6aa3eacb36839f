"""The training loop: devices, build, resume, loop { snapshot when due, step, log when due, checkpoint when due },
finish. The one loop that trains: the proof (proofs/proof_smollm2.py) runs dflash-train, it has none of its own.

Entered from cli.main after the first heartbeat. Refusals that need torch (GPUs that do not exist,
GPU lists without CUDA) raise StartupError before any weights load.
"""

from __future__ import annotations

import json
import math
import os
import random
import threading
import time
import zlib

import numpy as np
import torch
from safetensors.torch import load_file

from dflash_trainer.loop.checkpoint import find_latest, load_checkpoint, save_checkpoint
from dflash_trainer.config import StartupError, TrainConfig, default_target_layer_ids
from dflash_trainer.data.batches import BatchLoader, TokenizedDataset, collate
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig
from dflash_trainer.export.exporter import drafter_config_from_export
from dflash_trainer.telemetry.heartbeat import Heartbeat
from dflash_trainer.loss import acceptance_proxy, describe_head_chunk
from dflash_trainer.loop.schedule import Schedule
from dflash_trainer.loop.optimizer import drafter_adamw
from dflash_trainer.loop.step import derived_seed, drafter_micro_batch
from dflash_trainer.telemetry.writers import JsonlWriter, NvmlTelemetry, Profiler
from dflash_trainer.loop.wall_clock import compile_warmup, keep_snapshot, pending_snapshots, training_clock
from dflash_trainer.telemetry.wandb_log import WandbLog, check_available


def log(msg: str) -> None:
    print(msg, flush=True)


def resolve_devices(cfg: TrainConfig) -> tuple[torch.device, torch.device]:
    """Rule: --device cpu -> CPU (GPU lists ignored, noted). auto/cuda with CUDA -> the target on the first
    --target-gpus entry and the drafter on the first --drafter-gpus entry (an empty list falls back to
    the other list, then GPU 0). Without CUDA: cuda is refused; auto runs on the CPU only if both GPU
    lists are empty, so a misconfigured GPU host never trains silently on its CPU."""
    gpus = cfg.target_gpus + cfg.drafter_gpus
    cpu = torch.device("cpu")
    if cfg.device == "cpu":
        if gpus:
            log(f"note: --device cpu: ignoring --target-gpus/--drafter-gpus {gpus}")
        return cpu, cpu
    if not torch.cuda.is_available():
        if cfg.device == "cuda":
            raise StartupError("--device cuda but CUDA is not available here; use a GPU host or --device cpu")
        if gpus:
            raise StartupError(f"GPUs {sorted(set(gpus))} requested but CUDA is not available; "
                               "pass --target-gpus '' --drafter-gpus '' (or --device cpu) to train on the CPU")
        log("note: no CUDA and no GPUs requested: training on the CPU")
        return cpu, cpu
    count = torch.cuda.device_count()
    missing = sorted({g for g in gpus if g >= count})
    if missing:
        raise StartupError(f"GPUs {missing} do not exist (this host shows {count}: 0..{count - 1}); "
                           "fix --target-gpus/--drafter-gpus (indices are after CUDA_VISIBLE_DEVICES)")
    t = (cfg.target_gpus or cfg.drafter_gpus or [0])[0]
    d = (cfg.drafter_gpus or cfg.target_gpus or [0])[0]
    if len(cfg.target_gpus) > 1 or len(cfg.drafter_gpus) > 1:
        log(f"note: single-process trainer: target on cuda:{t}, drafter on cuda:{d}; other listed GPUs stay idle")
    return torch.device("cuda", t), torch.device("cuda", d)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def training_drafter(drafter_cfg: DrafterConfig, target, device: torch.device, compile_layers: bool = True,
                     fp8_setting: str | None = None) -> tuple[DFlashDrafter, str]:
    """A fresh drafter sharing the target's embedding and lm_head (frozen), ready to train on `device`
    (prepare_drafter), and the words of the `drafter linears:` log line."""
    drafter = DFlashDrafter(drafter_cfg).to(device)
    drafter.load_frozen(target.embed_weight(), target.lm_head_weight())
    _recipe, linears = prepare_drafter(drafter, device, compile_layers, fp8_setting)
    return drafter, linears


def prepare_drafter(drafter: DFlashDrafter, device: torch.device, compile_layers: bool,
                    fp8_setting: str | None) -> tuple[str | None, str]:
    """On CUDA: the frozen tables in bf16, the layers' linears in FP8 as float8.fp8_for decides from `fp8_setting`
    (DFLASH_FP8_LAYERS), the layers compiled unless `compile_layers` is False. Returns the FP8 recipe applied (None:
    bf16) and the words of the `drafter linears:` log line. dflash-train and benchmarks/train_step.py prepare their
    drafters here."""
    from dflash_trainer.model.float8 import float8_layers, fp8_for
    recipe, linears = fp8_for(fp8_setting, device, drafter.cfg.hidden_size)
    if device.type == "cuda":  # frozen tables stay bf16 like the target; trainable weights fp32 master
        drafter.embed_tokens.to(torch.bfloat16)
        drafter.lm_head.to(torch.bfloat16)
        if recipe:  # before compiling: the compiled graphs take torchao's casts in
            float8_layers(drafter, recipe)
        if compile_layers:
            drafter.compile_layers()  # 1.50 -> 1.31 s/step at the 27B shape on one H200 (benchmarks/)
    return recipe, linears


def target_layers(target, cfg: TrainConfig) -> str:
    """The target's decoder layers compiled unless DFLASH_EAGER_TARGET=1; the words of the `target layers:` line."""
    return target.compile_layers() if cfg.compile_target else "eager (DFLASH_EAGER_TARGET=1)"


def drafter_config_for(cfg: TrainConfig) -> tuple[object, list[int], DrafterConfig]:
    """(the target's HF config, the tapped layer ids, the drafter's config) from the flags; reads config.json only.
    cfg.mask_token_id must be known (validate_paths looks it up when the flag is not given)."""
    from transformers import AutoConfig
    target_config = AutoConfig.from_pretrained(cfg.target_model)
    num_target_layers = getattr(target_config, "text_config", target_config).num_hidden_layers
    layer_ids = cfg.target_layer_ids or default_target_layer_ids(num_target_layers, cfg.num_target_taps)
    drafter_cfg = DrafterConfig.from_target(target_config, cfg.num_draft_layers, layer_ids, cfg.block_size,
                                            cfg.mask_token_id, cfg.split_fc_layers)
    return target_config, layer_ids, drafter_cfg


def initial_weights(path: str, cfg: DrafterConfig) -> dict[str, torch.Tensor]:
    """--init-drafter: the trainable weights of an export dir or a checkpoints/step-N dir, for a drafter built
    exactly like `cfg` (a warm start, e.g. from the export of an earlier session's run). StartupError otherwise."""
    if os.path.isfile(os.path.join(path, "config.json")) and os.path.isfile(os.path.join(path, "model.safetensors")):
        with open(os.path.join(path, "config.json")) as f:
            other = drafter_config_from_export(json.load(f))
        state = {k: v.float() for k, v in load_file(os.path.join(path, "model.safetensors")).items()}
    elif os.path.isfile(os.path.join(path, "drafter_config.json")):
        state, other_dict, _ = load_checkpoint(path)
        other = DrafterConfig.from_dict(other_dict)
    else:
        raise StartupError(f"--init-drafter {path} is neither an export dir (config.json + model.safetensors) nor "
                           "a checkpoints/step-N dir; pass one of those")
    mine, theirs = cfg.to_dict(), other.to_dict()
    mine.pop("split_fc_layers", None), theirs.pop("split_fc_layers", None)  # how fc is applied, not what it holds
    diff = [f"{k} {theirs.get(k)} there, {v} here" for k, v in mine.items() if theirs.get(k) != v]
    if diff:
        raise StartupError(f"--init-drafter {path} is another drafter ({'; '.join(diff)}); use the same "
                           "--num-draft-layers, --block-size, --num-target-taps/--target-layer-ids, "
                           "--mask-token-id and target")
    return state


def run(cfg: TrainConfig, heartbeat: Heartbeat, stop: threading.Event, clock=None) -> int:
    """Trains until the epochs, --max-steps or --time-budget-min end, or SIGTERM (`stop`). `clock` measures the
    training time (the schedule, the budget and the snapshots; default wall_clock.training_clock()); it is read once
    per optimizer step."""
    clock = clock or training_clock()
    target_device, drafter_device = resolve_devices(cfg)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    _, layer_ids, drafter_cfg = drafter_config_for(cfg)
    num_target_layers = drafter_cfg.num_target_layers
    init_state = initial_weights(cfg.init_drafter, drafter_cfg) if cfg.init_drafter else None
    check_available(cfg)
    try:  # bad data is a refusal at start too: it loads before any weights
        dataset = TokenizedDataset(cfg.data_dir, cfg.max_seq_len)
    except ValueError as e:
        raise StartupError(str(e)) from None
    loader = BatchLoader(dataset, cfg.seed, cfg.token_budget, cfg.max_batch_size)

    # --- weights load from here on ---
    from dflash_trainer.model.target import FrozenTarget
    # Loading some targets draws from the CPU generator (Qwen3.5's Gated DeltaNet initializes A_log in __init__):
    # the drafter's initial weights depend on --seed only, as on a drafter rank, which never loads the target.
    with torch.random.fork_rng(devices=[]):
        target = FrozenTarget(cfg.target_model, target_device, layer_ids, need_last_hidden=cfg.use_soft_labels)
    log("target layers: " + target_layers(target, cfg))
    drafter, linears = training_drafter(drafter_cfg, target, drafter_device, cfg.compile_layers, cfg.fp8_layers)
    log("drafter linears: " + linears)
    log("head chunk: " + describe_head_chunk(drafter_cfg.vocab_size, cfg.head_chunk_size))
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = drafter_adamw(trainable, cfg.lr, cfg.weight_decay, drafter_device)

    steps_per_epoch = math.ceil(loader.batches_in_epoch(0) / cfg.grad_accum)
    total_steps = cfg.epochs * steps_per_epoch
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    schedule = Schedule(cfg, total_steps)

    step, num_bad_total, num_sequences, train_s0 = 0, 0, 0, 0.0
    resume_from = find_latest(cfg.output_dir)
    if resume_from is not None:
        model_state, saved_cfg, state = load_checkpoint(resume_from)
        if DrafterConfig.from_dict(saved_cfg) != drafter_cfg:
            raise StartupError(f"checkpoint {resume_from} was trained with a different drafter config; "
                               "use a new --output-dir or the original flags")
        drafter.load_trainable_state_dict(model_state)
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        step, num_bad_total = state["step"], state.get("num_bad_steps", 0)
        num_sequences, train_s0 = state.get("num_sequences", 0), state["scheduler"].get("train_s", 0.0)
        log(f"resumed from {resume_from} at step {step} (epoch {loader.epoch}, batch {loader.batch_index}, "
            f"{train_s0:.1f} s of training)" + (": --init-drafter not applied" if init_state else ""))
    elif init_state is not None:
        drafter.load_trainable_state_dict(init_state)
        log(f"warm start from {cfg.init_drafter}")

    num_params = sum(p.numel() for p in trainable)
    log(f"target {cfg.target_model}: {num_target_layers} layers on {target_device}; taps {layer_ids}")
    log(f"drafter: {cfg.num_draft_layers} layers, hidden {drafter_cfg.hidden_size}, {num_params / 1e6:.2f} M "
        f"trainable params on {drafter_device}; block {cfg.block_size}, <= {cfg.max_anchors} anchors/sequence, "
        f"gamma {cfg.gamma}, {'soft' if cfg.use_soft_labels else 'hard'} labels, mask token {cfg.mask_token_id}")
    log(f"data: {len(dataset)} sequences, {int(dataset.lengths.sum())} tokens "
        f"({dataset.num_supervised_tokens} supervised); {loader.batches_in_epoch(0)} micro-batches/epoch")
    log(f"tokens per optimizer step: <= {cfg.token_budget} budget x {cfg.grad_accum} accumulation = "
        f"{cfg.token_budget * cfg.grad_accum}; draft positions per step: <= {cfg.max_batch_size} x "
        f"{cfg.max_anchors} x {cfg.block_size} x {cfg.grad_accum}")
    log(f"optimizer steps: at most {total_steps} ({steps_per_epoch}/epoch x {cfg.epochs} epochs"
        f"{f', capped by --max-steps {cfg.max_steps}' if cfg.max_steps else ''}); peak lr {cfg.lr}, schedule "
        f"{schedule.describe()}" + (f"; snapshots at {cfg.snapshot_plan()} min" if cfg.snapshot_plan() else ""))

    metrics = JsonlWriter(os.path.join(cfg.run_dir, "metrics.jsonl"))
    snapshots = JsonlWriter(os.path.join(cfg.run_dir, "snapshots.jsonl"))
    profiler = Profiler(cfg.run_dir, cfg.profile_interval, log)
    nvml = NvmlTelemetry(cfg.run_dir, cfg.telemetry_interval,
                         sorted({target_device.index, drafter_device.index} - {None})).start(lambda: step)
    if nvml.unavailable:
        log(f"note: no GPU telemetry: {nvml.unavailable}")
    wandb_run = WandbLog.open(cfg, log)
    train_s = train_s0  # training seconds at the start of the current step
    saved = {"step": step if resume_from else -1, "path": resume_from}

    def checkpoint() -> None:
        heartbeat.set_phase("checkpointing")
        t0 = time.perf_counter()
        state = {"optimizer": optimizer.state_dict(), "scheduler": {"train_s": train_s},
                 "data": loader.state_dict(), "rng": rng_state(), "step": step, "num_bad_steps": num_bad_total,
                 "num_sequences": num_sequences, "config": cfg.to_dict()}
        saved["path"] = save_checkpoint(cfg.output_dir, step, drafter.trainable_state_dict(), drafter_cfg.to_dict(),
                                        state, cfg.keep_checkpoints)
        saved["step"] = step
        profiler.add("checkpoint", time.perf_counter() - t0)
        log(f"checkpoint {saved['path']} ({time.perf_counter() - t0:.2f} s)")
        heartbeat.set_phase("training")

    window = {"loss": 0.0, "tokens": 0, "time": 0.0, "steps": 0, "correct": None, "count": None, "crc": 0}
    last_row: dict = {}

    def write_metrics(lr: float, amp: float, grad_norm: float) -> None:
        nonlocal window
        acc = (window["correct"] / window["count"].clamp(min=1)).tolist()
        row = {"step": step, "epoch": loader.epoch, "loss": window["loss"] / window["steps"],
               "slot_acc": [round(a, 4) for a in acc], "tau_proxy": acceptance_proxy(acc),
               "tokens_per_s": window["tokens"] / window["time"], "lr": lr, "noise": amp, "grad_norm": grad_norm,
               "num_bad_steps": num_bad_total, "data_crc": window["crc"], "train_s": round(train_s, 3),
               "sequences": num_sequences, "time": time.time()}
        metrics.write(row)
        if wandb_run is not None:
            wandb_run.metrics(row)
        last_row.update(row)
        log(f"step {step} epoch {loader.epoch} loss {row['loss']:.4f} acc1 {acc[1]:.3f} tau {row['tau_proxy']:.3f} "
            f"tokens/s {row['tokens_per_s']:.1f} lr {lr:.3e} noise {amp:.4f} train {train_s:.1f} s")
        window = {"loss": 0.0, "tokens": 0, "time": 0.0, "steps": 0, "correct": None, "count": None, "crc": 0}

    def snapshot(minutes: float) -> None:
        if saved["step"] != step:
            checkpoint()
        dst = keep_snapshot(cfg, snapshots, minutes, saved["path"], step=step, train_s=train_s, epoch=loader.epoch,
                            sequences=num_sequences, dataset_rows=len(dataset), metrics=last_row)
        log(f"snapshot at {minutes:g} min of training: step {step}, {num_sequences} sequences, {dst}")

    drafter.train()
    if cfg.compile_warmup_batches:
        t0 = time.perf_counter()
        position = loader.state_dict()

        def warmup_batches():
            for indices in loader.shape_spanning_batches(cfg.compile_warmup_batches):
                batch = collate(loader.dataset, indices)
                taps, last = target(batch.input_ids)
                yield taps, last, batch.input_ids, batch.loss_mask, batch.lengths

        compile_warmup(cfg, drafter, optimizer, warmup_batches())
        loader.load_state_dict(position)  # nothing trained, nothing skipped
        log(f"compile warm-up: {cfg.compile_warmup_batches} micro-batches, not trained on, "
            f"{time.perf_counter() - t0:.1f} s (outside the training time)")
    pending = pending_snapshots(cfg)
    heartbeat.set_phase("training", step=step, epoch=loader.epoch)
    num_bad_in_row, budget_spent = 0, False
    lr = amp = grad_norm = 0.0  # the last step's, written by write_metrics only once a step has run (window)
    t_clock = clock()
    while step < total_steps and loader.epoch < cfg.epochs and not stop.is_set():
        train_s = train_s0 + clock() - t_clock
        while pending and train_s >= pending[0] * 60:  # the weights after the last step, at these minutes
            if window["steps"]:
                write_metrics(lr, amp, float(grad_norm))
            snapshot(pending.pop(0))
        if schedule.budget_spent(train_s):
            budget_spent = True
            break
        t_step = time.perf_counter()
        lr, amp = schedule.lr(step, train_s), schedule.noise(step, train_s)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum, tokens, n_micro, n_seq = 0.0, 0, 0, 0
        correct = count = None
        for micro in range(cfg.grad_accum):
            if loader.batch_index >= loader.batches_in_epoch() and loader.epoch + 1 >= cfg.epochs:
                break  # the last epoch is exhausted mid-step: train on what this step got
            t0 = time.perf_counter()
            batch = loader.next_batch()
            window["crc"] = zlib.crc32(str(batch.indices).encode(), window["crc"])
            t1 = time.perf_counter()
            taps, last = target(batch.input_ids)
            t2 = time.perf_counter()
            out = drafter_micro_batch(drafter, taps, last, batch.input_ids, batch.loss_mask, batch.lengths,
                                      max_anchors=cfg.max_anchors, gamma=cfg.gamma, noise_amplitude=amp,
                                      seed=derived_seed(cfg.seed, step, micro), head_chunk_size=cfg.head_chunk_size)
            (out.loss / cfg.grad_accum).backward()
            t3 = time.perf_counter()
            profiler.add("data", t1 - t0)
            profiler.add("target", t2 - t1)
            profiler.add("drafter_fwd_bwd", t3 - t2)
            loss_sum = loss_sum + out.loss.detach()
            correct = out.slot_correct if correct is None else correct + out.slot_correct
            count = out.slot_count if count is None else count + out.slot_count
            tokens += batch.num_tokens
            n_seq += len(batch.lengths)
            n_micro += 1
        if n_micro == 0:
            break
        # The host waits here for the queued forward/backward work (CUDA runs it asynchronously), so the wait
        # counts as drafter_fwd_bwd; timed after it, "optimizer" was mostly that wait (39% of run 8's time).
        loss_value = float(loss_sum) / n_micro
        profiler.add("drafter_fwd_bwd", time.perf_counter() - t3)
        t0 = time.perf_counter()
        grad_norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
        if not (math.isfinite(loss_value) and math.isfinite(float(grad_norm))):
            optimizer.zero_grad(set_to_none=True)
            num_bad_in_row += 1
            num_bad_total += 1
            log(f"step {step}: non-finite loss {loss_value} / grad norm {float(grad_norm)}: update skipped "
                f"({num_bad_in_row} in a row, {num_bad_total} total)")
            if num_bad_in_row >= cfg.max_bad_steps:
                raise RuntimeError(f"{num_bad_in_row} non-finite steps in a row at step {step}; lower --lr or "
                                   f"check the data (--max-bad-steps {cfg.max_bad_steps})")
            continue
        num_bad_in_row = 0
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        num_sequences += n_seq
        profiler.add("optimizer", time.perf_counter() - t0)

        elapsed = time.perf_counter() - t_step
        window["loss"] += loss_value
        window["tokens"] += tokens
        window["time"] += elapsed
        window["steps"] += 1
        window["correct"] = correct if window["correct"] is None else window["correct"] + correct
        window["count"] = count if window["count"] is None else window["count"] + count
        heartbeat.update(step=step, epoch=loader.epoch, loss=loss_value, tokens_per_s=tokens / max(elapsed, 1e-9))
        if step % cfg.log_interval == 0 or step == total_steps:
            write_metrics(lr, amp, float(grad_norm))
        profiler.tokens += tokens
        if profiler.maybe_write(step) is not None and wandb_run is not None:
            wandb_run.profile(profiler.last_row)
            wandb_run.gpus(step, nvml.latest)
        if step % cfg.checkpoint_interval == 0 and not stop.is_set():
            checkpoint()

    if not budget_spent:  # the minutes the last step ran through (the budget's end was handled in the loop)
        train_s = train_s0 + clock() - t_clock
    if window["steps"]:
        write_metrics(lr, amp, float(grad_norm))
    while pending and train_s >= pending[0] * 60:
        snapshot(pending.pop(0))
    if saved["step"] != step:
        checkpoint()
    profiler.maybe_write(step, force=True)
    nvml.close()
    if wandb_run is not None:
        wandb_run.profile(profiler.last_row)
        wandb_run.close()
    for writer in (metrics, snapshots, profiler):
        writer.close()
    if stop.is_set():
        log(f"SIGTERM: stopped at step {step} after checkpointing")
        heartbeat.set_phase("finished", step=step, epoch=loader.epoch, stopped="SIGTERM")
    else:
        why = (f"the time budget of {cfg.time_budget_min:g} min is spent" if budget_spent else
               f"{'--max-steps' if step == cfg.max_steps else 'the epochs'} ended"
               + (f" after {train_s / 60:.2f} of --time-budget-min {cfg.time_budget_min:g}"
                  if cfg.time_budget_min else ""))
        log(f"finished: {step} optimizer steps, {train_s:.1f} s of training; {why}")
        heartbeat.set_phase("finished", step=step, epoch=loader.epoch)
    return 0
