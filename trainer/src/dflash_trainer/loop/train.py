"""dflash-train in one process: devices, build, resume, then the training loop (loop/drafter_loop.py, the same
loop a torchrun drafter rank runs) with the local target as its source of micro-batches and nothing to reduce,
then the finish line. The proof (proofs/proof_smollm2.py) runs dflash-train, it has no loop of its own.
Also the build helpers both entries share (drafter_config_for, training_drafter, prepare_drafter, target_layers;
the starting weights are loop/starting_weights.py's).

Entered from cli.main after the first heartbeat. Refusals that need torch (GPUs that do not exist,
GPU lists without CUDA) raise StartupError before any weights load.
"""

from __future__ import annotations

import math
import os
import random
import threading
from contextlib import ExitStack

import numpy as np
import torch

from dflash_trainer.loop.checkpoint import checkpoints_dir, clean_leftovers, find_latest, load_checkpoint
from dflash_trainer.config import StartupError, TrainConfig, changed_settings, default_target_layer_ids
from dflash_trainer.data.batches import BatchLoader, TokenizedDataset
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig
from dflash_trainer.telemetry.heartbeat import Heartbeat
from dflash_trainer.loop.bookkeeping import Bookkeeping
from dflash_trainer.loop.drafter_loop import LoopParts, Outcome, train
from dflash_trainer.loop.plan import StepPlan
from dflash_trainer.loop.progress import LocalProfile
from dflash_trainer.loop.reducers import OneProcess
from dflash_trainer.loop.sources import LocalTarget
from dflash_trainer.loop.starting_weights import StartingWeights, apply, starting_weights
from dflash_trainer.loop.train_state import TrainState, rng_state, set_rng_state  # noqa: F401 - importable here
from dflash_trainer.loss import describe_head_chunk, describe_labels
from dflash_trainer.loop.optimizer import drafter_adamw
from dflash_trainer.loop.schedule import Schedule
from dflash_trainer.loop.step import drafter_micro_batch
from dflash_trainer.telemetry.writers import NvmlTelemetry
from dflash_trainer.loop.wall_clock import training_clock
from dflash_trainer.telemetry.wandb_log import WandbLog, check_available
from dflash_trainer.telemetry.launch_event import record_launch


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


def target_kernels_line(cfg: TrainConfig, target_config, device: torch.device) -> str:
    """The `target kernels:` line (model/target_kernels.py): which linear-attention and conv code the target's
    layers run here; StartupError when that is transformers' torch fallback on a GPU and the operator did not opt
    in (DFLASH_SLOW_LINEAR_ATTENTION=1)."""
    from dflash_trainer.model import target_kernels
    return target_kernels.check(target_config, device.type == "cuda", cfg.slow_linear_attention)


def drafter_config_for(cfg: TrainConfig) -> tuple[object, list[int], DrafterConfig]:
    """(the target's HF config, the tapped layer ids, the drafter's config) from the flags; reads config.json only.
    cfg.mask_token_id must be known (validate_paths looks it up when the flag is not given)."""
    from transformers import AutoConfig
    target_config = AutoConfig.from_pretrained(cfg.target_model)
    num_target_layers = getattr(target_config, "text_config", target_config).num_hidden_layers
    layer_ids = cfg.target_layer_ids or default_target_layer_ids(num_target_layers, cfg.num_target_taps)
    drafter_cfg = DrafterConfig.from_target(target_config, cfg.num_draft_layers, layer_ids, cfg.block_size,
                                            cfg.mask_token_id, cfg.split_fc_layers, cfg.draft_intermediate_size)
    return target_config, layer_ids, drafter_cfg


def run(cfg: TrainConfig, heartbeat: Heartbeat, stop: threading.Event, clock=None) -> int:
    """Trains until the epochs, --max-steps or --time-budget-min end, or SIGTERM (`stop`). `clock` measures the
    training time (the schedule, the budget and the snapshots; default wall_clock.training_clock()); it is read once
    per optimizer step, before it."""
    clock = clock or training_clock()
    target_device, drafter_device = resolve_devices(cfg)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    target_config, layer_ids, drafter_cfg = drafter_config_for(cfg)
    kernels = target_kernels_line(cfg, target_config, target_device)
    log("target kernels: " + kernels)
    heartbeat.update(target_kernels=kernels)
    start = starting_weights(cfg, drafter_cfg)
    check_available(cfg)
    try:  # bad data is a refusal at start too: it loads before any weights
        dataset = TokenizedDataset(cfg.data_dir, cfg.max_seq_len, cfg.shard_weights)
    except ValueError as e:
        raise StartupError(str(e)) from None
    batches = BatchLoader(dataset, cfg.seed, cfg.token_budget, cfg.max_batch_size).batches_in_epoch(0)

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

    steps_per_epoch = math.ceil(batches / cfg.grad_accum)
    total_steps = cfg.epochs * steps_per_epoch
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    schedule = Schedule(cfg, total_steps)
    state, resume_from = resume(cfg, drafter, optimizer, drafter_cfg, start)
    plan = StepPlan(dataset, cfg, state.data, state.step, total_steps, cfg.grad_accum)
    state.data = plan.loader.state_dict()

    num_params = sum(p.numel() for p in trainable)
    log(f"target {cfg.target_model}: {drafter_cfg.num_target_layers} layers on {target_device}; taps {layer_ids}")
    log(f"drafter: {cfg.num_draft_layers} layers, hidden {drafter_cfg.hidden_size}, MLP "
        f"{drafter_cfg.intermediate_size}, {num_params / 1e6:.2f} M "
        f"trainable params on {drafter_device}; block {cfg.block_size}, <= {cfg.max_anchors} anchors/sequence, "
        f"gamma {cfg.gamma}, {describe_labels(cfg)} labels, mask token {cfg.mask_token_id}")
    log("data: " + dataset.describe(batches))
    log(f"tokens per optimizer step: <= {cfg.token_budget} budget x {cfg.grad_accum} accumulation = "
        f"{cfg.token_budget * cfg.grad_accum}; draft positions per step: <= {cfg.max_batch_size} x "
        f"{cfg.max_anchors} x {cfg.block_size} x {cfg.grad_accum}")
    log(f"optimizer steps: at most {total_steps} ({steps_per_epoch}/epoch x {cfg.epochs} epochs"
        f"{f', capped by --max-steps {cfg.max_steps}' if cfg.max_steps else ''}); peak lr {cfg.lr}, schedule "
        f"{schedule.describe()}" + (f"; snapshots at {cfg.snapshot_plan()} min" if cfg.snapshot_plan() else ""))

    with ExitStack() as stack:  # every resource closes on every way out: errors and SIGTERM included
        nvml = NvmlTelemetry(cfg.run_dir, cfg.telemetry_interval,
                             sorted({target_device.index, drafter_device.index} - {None}))
        stack.callback(nvml.close)
        nvml.start(lambda: state.step)
        if nvml.unavailable:
            log(f"note: no GPU telemetry: {nvml.unavailable}")
        wandb_run = WandbLog.open(cfg, log)
        if wandb_run is not None:
            stack.push(lambda exc_type, exc, tb: wandb_run.close(0 if exc_type is None else 1))
        record_launch(cfg.run_dir, state.step, log, wandb_run)
        reducer = OneProcess(drafter, stop, clock)
        profile = LocalProfile(stack, cfg, log, heartbeat, wandb_run, nvml)
        source = LocalTarget(target, plan, profile)
        books = Bookkeeping(stack, cfg, writer=True, state=state, reducer=reducer, optimizer=optimizer,
                            drafter_cfg=drafter_cfg, source=source, dataset_rows=dataset.rows_per_epoch, say=log,
                            on_phase=heartbeat.set_phase, profile=profile, wandb_run=wandb_run,
                            saved=(state.step, resume_from) if resume_from else (-1, None),
                            extra_state={})
        drafter.train()
        source.warmup(cfg, drafter, optimizer, log)
        heartbeat.set_phase("training", step=state.step, epoch=state.data["epoch"])
        outcome = train(LoopParts(cfg, state, plan, source, reducer, books, profile, optimizer, trainable, schedule,
                                  total_steps, drafter_micro_batch, log, drafter_cfg.block_size))
    finish(cfg, heartbeat, state, outcome, stop)
    return 0


def resume(cfg: TrainConfig, drafter, optimizer, drafter_cfg: DrafterConfig,
           start: StartingWeights | None) -> tuple[TrainState, str | None]:
    """The train state of the latest checkpoint under --output-dir (its weights and optimizer state loaded), or
    a fresh one (with `start`'s weights: starting_weights.py); and the checkpoint resumed from."""
    clean_leftovers(checkpoints_dir(cfg.output_dir), log)  # what a kill mid-save or mid-prune left
    resume_from = find_latest(cfg.output_dir)
    if resume_from is None:
        apply(drafter, start)
        if start is not None:
            log(start.words)
        return TrainState(), None
    model_state, saved_cfg, saved = load_checkpoint(resume_from)
    if DrafterConfig.from_dict(saved_cfg) != drafter_cfg:
        raise StartupError(f"checkpoint {resume_from} was trained with a different drafter config; "
                           "use a new --output-dir or the original flags")
    drafter.load_trainable_state_dict(model_state)
    optimizer.load_state_dict(saved["optimizer"])
    state = TrainState.from_checkpoint(saved)
    log(f"resumed from {resume_from} at step {state.step} (epoch {state.data['epoch']}, batch "
        f"{state.data['batch_index']}, {state.train_s:.1f} s of training)"
        + (f": {'--init-drafter' if cfg.init_drafter else '--init-layers-from-target'} not applied" if start else ""))
    log_changed_settings(saved, cfg, log)
    return state, resume_from


def log_changed_settings(saved: dict, cfg: TrainConfig, say) -> None:
    """Say which training settings a restart changed (a new --lr-schedule or --epochs moves the learning rate at
    once, from the resumed step on), so that a jump in the loss curve has its cause in the log."""
    changed = changed_settings(saved.get("config") or {}, cfg)
    if changed:
        say("resumed with other training settings than the checkpoint's run: " + "; ".join(changed))


def finish(cfg: TrainConfig, heartbeat: Heartbeat, state: TrainState, outcome: Outcome, stop) -> None:
    """The last log line and the `finished` heartbeat."""
    epoch = state.data["epoch"]
    if stop.is_set():
        log(f"SIGTERM: stopped at step {state.step} after checkpointing")
        heartbeat.set_phase("finished", step=state.step, epoch=epoch, stopped="SIGTERM")
        return
    why = (f"the time budget of {cfg.time_budget_min:g} min is spent" if outcome.budget_spent else
           f"{'--max-steps' if state.step == cfg.max_steps else 'the epochs'} ended"
           + (f" after {state.train_s / 60:.2f} of --time-budget-min {cfg.time_budget_min:g}"
              if cfg.time_budget_min else ""))
    log(f"finished: {state.step} optimizer steps, {state.train_s:.1f} s of training; {why}")
    heartbeat.set_phase("finished", step=state.step, epoch=epoch)
