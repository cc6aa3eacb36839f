"""Every dflash-train flag and environment knob declared once, as a TrainConfig field: a field's default is its one
default; its metadata (`flag`, `env_knob`) holds the help text, the argument group, how the text parses and the
field's own check. cli.py generates the argparse parser from these fields. Stdlib only."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass, field

from dflash_trainer.config.parsing import (ascending_positive, at_least, check_fp8_setting, check_shard_weights,
                                           parse_float, parse_float_list, parse_fp8_setting, parse_gpu_list, parse_int,
                                           parse_int_list, parse_inverted_switch, parse_seconds, parse_str,
                                           parse_switch, positive)


# --- declarations ---

def flag(default=MISSING, *, help: str, group: str, parse=parse_str, check=None, choices=None, switch=False,
         metavar=None, default_factory=MISSING):
    """A dflash-train flag: --<field name with dashes>. `switch`: a flag without a value (store_true)."""
    meta = {"help": help, "group": group, "parse": parse, "check": check, "choices": choices, "switch": switch,
            "metavar": metavar, "env": None}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def env_knob(default, *, env: str, help: str, parse, check=None):
    """A setting read from the environment variable `env` (text parsed by `parse`), not a flag."""
    return field(default=default, metadata={"help": help, "group": None, "parse": parse, "check": check,
                                            "choices": None, "switch": False, "metavar": None, "env": env})


# --head-chunk-size's default (loss.head_chunk_rows): the most rows, a power of two up to the cap, whose fp32
# logits fit the bytes, so the head's transient memory is bounded whatever the vocabulary. At the seed's shape
# (vocab 248,320 -> 1024 rows) with FP8 linears: 56.5 GB peak against 61.2 GB at 4096 rows, same step time
# (927.0 vs 930.2 ms; trainer/README.md "Speed"). SmolLM2's 49,152 keeps 4096.
HEAD_CHUNK_BYTES = 1 << 30
HEAD_CHUNK_MAX_ROWS = 4096

PATHS = "paths"
DEVICES = "devices (single process: the first GPU of each list is used)"
OPTIMIZATION = "optimization"
WALL_CLOCK = "wall-clock schedule (instead of steps)"
BATCHING = "batching"
METHOD = "DFlash method (see docs/dflash.md)"
CONTRACT = "run contract"
TORCHRUN = "several processes (under torchrun: dist_train.py)"


@dataclass
class TrainConfig:
    """Everything one training run needs; field names match the CLI flags (dashes -> underscores)."""

    target_model: str = flag(help="local HF directory of the frozen target model", group=PATHS)
    data_dir: str = flag(help="directory of *.parquet shards (input_ids list<int32>, loss_mask list<int8>)",
                         group=PATHS)
    output_dir: str = flag(help="checkpoints/ (step-N dirs + `latest`) and snapshots/ go here; training resumes "
                                "from its `latest`", group=PATHS)
    run_dir: str | None = flag(None, help="heartbeat.json, metrics/profile/telemetry/snapshots.jsonl "
                                          "(default: --output-dir)", group=PATHS)
    target_gpus: list[int] = flag(default_factory=list, parse=parse_gpu_list, group=DEVICES,
                                  help="GPUs for the target, e.g. 0,1,2,3,4; '' for none (a torchrun job over "
                                       "nodes: each node's list, the same on every node)")
    drafter_gpus: list[int] = flag(default_factory=list, parse=parse_gpu_list, group=DEVICES,
                                   help="GPUs for the drafter, e.g. 5,6,7; '' for none (over nodes: each node's)")
    device: str = flag("auto", choices=("auto", "cpu", "cuda"), group=DEVICES,
                       help="auto: CUDA if present (GPU lists default to GPU 0), else CPU, where non-empty GPU "
                            "lists are refused; cpu: run on the CPU (one process ignores the GPU lists; a torchrun "
                            "job given both lists takes their layout, every rank on the CPU: a rehearsal); cuda: "
                            "refuse to run without CUDA")
    target_ranks: int = flag(1, parse=parse_int, check=at_least(1), group=TORCHRUN,
                             help="on the CPU (both GPU lists empty): ranks 0..N-1 run the target, the other "
                                  "WORLD_SIZE-N ranks train the drafter; with GPUs the lists decide")
    collective_timeout: float = flag(1800.0, parse=parse_float, check=positive, group=TORCHRUN, metavar="SECONDS",
                                     help="how long a rank waits for its peers in one collective or hidden-state "
                                          "transfer before it fails (torch's default 1800): a peer whose host became "
                                          "unreachable (no connection reset) ends the job after this, freeing the "
                                          "other nodes' GPUs; keep it above the longest pause between collectives "
                                          "(loading the target, writing a checkpoint)")
    hs_queue_depth: int = flag(90, parse=parse_int, check=at_least(1), group=TORCHRUN,
                               help="most micro-batches of hidden states held per drafter rank (host memory)")
    hs_queue_min_ready: int = flag(30, parse=parse_int, check=at_least(0), group=TORCHRUN,
                                   help="micro-batches a drafter rank holds before its first optimizer step")
    hs_sync_transfers: bool = flag(False, switch=True, group=TORCHRUN,
                                   help="move hidden states inside the training loops, one transfer at a time, "
                                        "overlapping no compute (slower; checks that the overlap changes no result)")
    target_gpus_per_rank: int = flag(0, parse=parse_int, check=at_least(0), group=TORCHRUN,
                                     help="GPUs one target rank spreads its layers over: --target-gpus is cut into "
                                          "groups of this many, one target rank each (leftover GPUs idle); 1: a "
                                          "full replica per GPU; 0: by measured size (the safetensors' bytes and "
                                          "one --token-budget batch's activations against the GPUs' free memory; "
                                          "1 on the CPU, where N > 1 splits over N 'cpu' devices)")
    drafter_sharding: str = flag("auto", choices=("auto", "ddp", "fsdp"), group=TORCHRUN,
                                 help="drafter ranks: ddp (a replica each) or fsdp (FSDP2: weights, gradients and "
                                      "AdamW state sharded); auto: fsdp where the training state exceeds half the "
                                      "drafter GPU's free memory, ddp on the CPU")

    epochs: int = flag(6, parse=parse_int, check=at_least(1), group=OPTIMIZATION,
                       help="passes over the data (the run stops at the first of --epochs, --max-steps and "
                            "--time-budget-min)")
    lr: float = flag(6e-4, parse=parse_float, group=OPTIMIZATION, help="peak AdamW learning rate")
    warmup_ratio: float = flag(0.04, parse=parse_float, group=OPTIMIZATION,
                               help="fraction of the run (optimizer steps, or the time budget) of linear warmup; "
                                    "then --lr-schedule")
    lr_schedule: str = flag("cosine", choices=("cosine", "wsd"), group=OPTIMIZATION,
                            help="after warmup: cosine to 0, or wsd (warmup-stable-decay): the peak held, then "
                                 "linear to 0 over the last --lr-decay-ratio (a snapshot taken before the decay "
                                 "holds weights trained at the peak)")
    lr_decay_ratio: float = flag(0.2, parse=parse_float, group=OPTIMIZATION, metavar="FRACTION",
                                 help="with --lr-schedule wsd: the share of the run after warmup spent decaying "
                                      "to 0, in (0, 1]")
    weight_decay: float = flag(0.01, parse=parse_float, group=OPTIMIZATION, help="AdamW weight decay")
    grad_accum: int = flag(4, parse=parse_int, check=at_least(1), group=OPTIMIZATION,
                           help="micro-batches per optimizer step")
    grad_clip: float = flag(1.0, parse=parse_float, group=OPTIMIZATION, help="max global gradient norm")
    max_steps: int | None = flag(None, parse=parse_int, group=OPTIMIZATION,
                                 help="stop after this many optimizer steps (tests, demos)")
    max_bad_steps: int = flag(10, parse=parse_int, check=at_least(1), group=OPTIMIZATION,
                              help="halt after this many non-finite steps in a row")
    seed: int = flag(0, parse=parse_int, group=OPTIMIZATION, help="drafter init, data order, anchors, noise")
    init_drafter: str | None = flag(None, group=OPTIMIZATION, metavar="DIR",
                                    help="start a new run from these weights: an export dir (config.json + "
                                         "model.safetensors) or a checkpoints/step-N dir of the same drafter "
                                         "shape (a resumed run keeps its checkpoint's weights)")
    init_layers_from_target: bool = flag(False, switch=True, group=OPTIMIZATION,
                                         help="start a new run's drafter layers as copies of evenly spaced target "
                                              "layers (first and last included; every tensor of the same name and "
                                              "shape) and its final norm as the target's; fc stays random")

    time_budget_min: float | None = flag(None, parse=parse_float, check=positive, group=WALL_CLOCK,
                                         help="train for this many minutes of wall clock: the learning rate "
                                              "(warmup, cosine) and the noise follow the elapsed training time "
                                              "over the budget instead of the steps; at the end a checkpoint, "
                                              "kept as the snapshot of these minutes")
    snapshot_minutes: list[float] = flag(default_factory=list, parse=parse_float_list, check=ascending_positive,
                                         group=WALL_CLOCK, metavar="M,M,...",
                                         help="keep a checkpoint when the training time reaches each of these "
                                              "minutes: <output-dir>/snapshots/<M>min, listed in "
                                              "<run-dir>/snapshots.jsonl")
    compile_warmup_batches: int = flag(0, parse=parse_int, check=at_least(0), group=WALL_CLOCK,
                                       help="micro-batches run forward and backward before the training clock "
                                            "starts, not trained on and not taken from the data (compilation "
                                            "outside the time budget); one process picks the epoch's batches of "
                                            "extreme shapes (6 span them)")

    token_budget: int = flag(49152, parse=parse_int, check=at_least(1), group=BATCHING,
                             help="max sum of padded sequence lengths per micro-batch")
    max_seq_len: int = flag(8192, parse=parse_int, check=at_least(1), group=BATCHING,
                            help="longer sequences are truncated")
    max_batch_size: int = flag(64, parse=parse_int, check=at_least(1), group=BATCHING,
                               help="max sequences per micro-batch")
    shard_weights: str | None = flag(None, check=check_shard_weights, group=BATCHING, metavar="PREFIX=N,...",
                                     help="each sequence of a shard whose file name starts with PREFIX comes N "
                                          "times an epoch (0: left out; the longest matching prefix wins; other "
                                          "shards once), e.g. synth-=2,extra-=3 to give data sources more steps")

    block_size: int = flag(32, parse=parse_int, group=METHOD, help="B: anchor + B-1 masked slots")
    max_anchors: int = flag(1024, parse=parse_int, check=at_least(1), group=METHOD,
                            help="blocks sampled per sequence")
    num_draft_layers: int = flag(5, parse=parse_int, check=at_least(1), group=METHOD,
                                 help="decoder layers of the drafter")
    draft_intermediate_size: int | None = flag(None, parse=parse_int, check=at_least(1), group=METHOD, metavar="N",
                                               help="the width of the drafter's MLP (default: the target's "
                                                    "intermediate_size): more capacity at the same depth; the export "
                                                    "records it, the serving engines read it")
    gamma: float = flag(10.0, parse=parse_float, group=METHOD, help="slot weight exp(-(k-1)/gamma)")
    noise: str = flag("uniform", choices=("uniform", "none"), group=METHOD, help="noise added to target features")
    noise_start: float = flag(0.05, parse=parse_float, group=METHOD, help="noise amplitude at the start")
    noise_end: float = flag(0.01, parse=parse_float, group=METHOD, help="noise amplitude at the end")
    use_soft_labels: bool = flag(False, switch=True, group=METHOD,
                                 help="KL to the target's distribution instead of CE")
    soft_label_temperature: float = flag(1.0, parse=parse_float, check=positive, group=METHOD, metavar="T",
                                         help="with --use-soft-labels: the drafter learns softmax(target logits / T); "
                                              "below 1 sharpens it toward the target's top token, the one greedy "
                                              "decoding accepts (0.5 halves every log-odds gap's softness)")
    mask_token_id: int | None = flag(None, parse=parse_int, group=METHOD,
                                     help="default: <|MASK|> from the target's added_tokens.json or tokenizer.json")
    target_layer_ids: list[int] | None = flag(None, parse=parse_int_list, group=METHOD, metavar="I,J,...",
                                              help="comma-separated tapped layers (default: docs/dflash.md rule)")
    num_target_taps: int = flag(5, parse=parse_int, check=at_least(1), group=METHOD,
                                help="K, when --target-layer-ids is not given")
    head_chunk_size: int | None = flag(None, parse=parse_int, check=at_least(1), group=METHOD,
                                       help="lm_head rows per chunk in the loss (bounds logits memory; default: "
                                            f"the most rows, up to {HEAD_CHUNK_MAX_ROWS}, whose fp32 logits fit "
                                            f"{HEAD_CHUNK_BYTES >> 30} GiB)")

    checkpoint_interval: int = flag(1000, parse=parse_int, check=at_least(1), group=CONTRACT,
                                    help="optimizer steps between checkpoints (a final one is always written)")
    keep_checkpoints: int = flag(3, parse=parse_int, check=at_least(1), group=CONTRACT,
                                 help="keep the last k checkpoints (snapshots are kept apart)")
    heartbeat_interval: float = flag(2.0, parse=parse_float, group=CONTRACT,
                                     help="seconds between heartbeat.json writes")
    log_interval: int = flag(10, parse=parse_int, check=at_least(1), group=CONTRACT,
                             help="optimizer steps between log lines / metrics rows")
    telemetry_interval: float = flag(5.0, parse=parse_float, check=positive, group=CONTRACT,
                                     help="seconds between NVML readings of every GPU (telemetry.jsonl)")
    wandb_project: str | None = flag(None, group=CONTRACT,
                                     help="log metrics, profile and NVML figures to this Weights & Biases project "
                                          "(also on when WANDB_PROJECT is set; WANDB_MODE=offline writes "
                                          "<run-dir>/wandb only; the key only from WANDB_API_KEY; needs "
                                          "pip install dflash_trainer[wandb])")

    profile_interval: float = env_knob(60.0, env="DFLASH_PROFILE_INTERVAL", parse=parse_seconds,
                                       help="seconds between profile.jsonl snapshots (and their log lines)")
    split_fc_layers: bool = env_knob(False, env="DFLASH_SPLIT_FC_LAYERS", parse=parse_switch,
                                     help="1 applies fc per tap and sums instead of one matmul over the "
                                          "concatenated taps (identical math, no K*H concatenation in memory)")
    compile_layers: bool = env_knob(True, env="DFLASH_EAGER_LAYERS", parse=parse_inverted_switch,
                                    help="1 keeps the drafter layers eager on CUDA (0: compiled), the way out if "
                                         "torch.compile fails on this machine's torch")
    fp8_layers: str | None = env_knob("auto", env="DFLASH_FP8_LAYERS", parse=parse_fp8_setting,
                                      help="auto: the drafter layers' linears in FP8 (torchao's tensorwise float8 "
                                           "training) on an FP8 GPU from the hidden size where it pays (float8.py) "
                                           "when torchao is installed (pip install 'dflash_trainer[fp8]'), else "
                                           "bf16; 0: bf16; 1 or tensorwise, rowwise: that recipe (refused without "
                                           "torchao); the log's `drafter linears:` line says which")
    compile_target: bool = env_knob(True, env="DFLASH_EAGER_TARGET", parse=parse_inverted_switch,
                                    help="1 keeps the target's decoder layers eager on CUDA (0: compiled when the "
                                         "target sits on one GPU)")
    slow_linear_attention: bool = env_knob(False, env="DFLASH_SLOW_LINEAR_ATTENTION", parse=parse_switch,
                                           help="1 lets a target with linear-attention layers (Qwen3.5/3.6) run "
                                                "transformers' torch fallback on a GPU (2.3x slower per layer "
                                                "on an H200; refused at start otherwise): the fast kernels are the "
                                                "trainer's fla extra (pip install 'dflash_trainer[fla]')")
    stop_report_s: float = env_knob(20.0, env="DFLASH_STOP_REPORT_S", parse=parse_seconds, check=at_least(0),
                                    help="seconds after SIGTERM at which a process that is still stopping prints "
                                         "each thread's stack to its log (0: never); under torchrun keep it below "
                                         "--shutdown-timeout (30 by default), which SIGKILLs the ranks")
    eager_head_loss: bool = env_knob(False, env="DFLASH_EAGER_HEAD_LOSS", parse=parse_switch,
                                     help="1 runs the head loss eagerly (0: compiled on CUDA); loss.py reads the "
                                          "variable at each call")

    def __post_init__(self) -> None:
        if self.run_dir is None:
            self.run_dir = self.output_dir
        for f in dataclasses.fields(self):
            check, choices, value = f.metadata.get("check"), f.metadata.get("choices"), getattr(self, f.name)
            if choices and value not in choices:
                raise ValueError(f"{option_name(f)} is {value!r}; pass one of {', '.join(choices)}")
            if check is not None and value is not None:
                check(value, option_name(f))
        if self.block_size < 2:
            raise ValueError(f"--block-size is {self.block_size}; a block needs the anchor plus at least one "
                             "draft slot, so pass --block-size 2 or more (the seed uses 32)")
        if not self.gamma > 0:
            raise ValueError(f"--gamma is {self.gamma}; the slot weights exp(-(k-1)/gamma) need gamma > 0 "
                             "(published: 10 for block 32, 7 for 16, 4 for 8)")
        if not 0 < self.lr < 1:
            raise ValueError(f"--lr is {self.lr}; pass a learning rate in (0, 1), e.g. 6e-4")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"--warmup-ratio is {self.warmup_ratio}; pass a value in [0, 1)")
        if self.weight_decay < 0 or self.grad_clip <= 0:
            raise ValueError("--weight-decay must be >= 0 and --grad-clip > 0; fix the flag")
        if self.noise_start < 0 or self.noise_end < 0:
            raise ValueError("--noise-start/--noise-end are negative; pass amplitudes >= 0")
        if self.max_seq_len > self.token_budget:
            raise ValueError(f"--max-seq-len {self.max_seq_len} exceeds --token-budget {self.token_budget}; "
                             "a full-length sequence would never fit a batch: raise --token-budget")
        if self.max_seq_len < 2:
            raise ValueError("--max-seq-len must be at least 2; an anchor needs a next token")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError("--max-steps must be at least 1; leave it out to train all epochs")
        if self.hs_queue_min_ready > self.hs_queue_depth:
            raise ValueError(f"--hs-queue-min-ready {self.hs_queue_min_ready} exceeds --hs-queue-depth "
                             f"{self.hs_queue_depth}; the queue could never hold that many: lower it or raise the depth")
        if self.heartbeat_interval <= 0:
            raise ValueError("--heartbeat-interval must be > 0 seconds")
        if self.mask_token_id is not None and self.mask_token_id < 0:
            raise ValueError(f"--mask-token-id is {self.mask_token_id}; pass a token id inside the vocabulary")
        if self.time_budget_min is not None and self.snapshot_minutes \
                and self.snapshot_minutes[-1] > self.time_budget_min:
            raise ValueError(f"--snapshot-minutes {self.snapshot_minutes[-1]:g} is past --time-budget-min "
                             f"{self.time_budget_min:g}; snapshot within the budget or raise it")
        if not 0 < self.lr_decay_ratio <= 1:
            raise ValueError(f"--lr-decay-ratio is {self.lr_decay_ratio:g}; pass a share of the run in (0, 1], "
                             "e.g. 0.2")
        if self.lr_schedule != "wsd" and self.lr_decay_ratio != _DEFAULTS["lr_decay_ratio"]:
            raise ValueError(f"--lr-decay-ratio shapes --lr-schedule wsd only; add --lr-schedule wsd or leave the "
                             "ratio out")
        if self.soft_label_temperature != _DEFAULTS["soft_label_temperature"] and not self.use_soft_labels:
            raise ValueError(f"--soft-label-temperature {self.soft_label_temperature:g} shapes soft labels only; "
                             "add --use-soft-labels or leave the temperature out")
        if self.init_drafter and self.init_layers_from_target:
            raise ValueError("--init-drafter and --init-layers-from-target both choose the starting weights; "
                             "pass one of them")
        check_fp8_setting(self.fp8_layers)
        if self.target_layer_ids is not None:
            if not self.target_layer_ids:
                raise ValueError("--target-layer-ids is empty; pass e.g. 1,9,17,25,33 or leave it out")
            self.num_target_taps = len(self.target_layer_ids)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def snapshot_plan(self) -> list[float]:
        """The minutes at which a snapshot is kept: --snapshot-minutes, and the end of --time-budget-min."""
        minutes = set(self.snapshot_minutes)
        if self.time_budget_min is not None:
            minutes.add(self.time_budget_min)
        return sorted(minutes)


# Each field's declared default, for the checks that refuse a flag given where it has no effect.
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not MISSING}


def option_name(f: dataclasses.Field) -> str:
    """The flag (--dashed-name) or environment variable a field is set by."""
    return f.metadata.get("env") or "--" + f.name.replace("_", "-")


def declared_default(f: dataclasses.Field):
    """The field's one default (a fresh object for a factory); MISSING for a required flag."""
    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


def flag_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(TrainConfig) if f.metadata.get("group")]


def env_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(TrainConfig) if f.metadata.get("env")]


# What a resumed run learns by: a restart with new settings changes these from the checkpoint's step on
_TRAINING_GROUPS = (OPTIMIZATION, WALL_CLOCK, BATCHING, METHOD)
_NOT_AT_RESUME = ("init_drafter", "init_layers_from_target")  # starting weights: a resume does not apply them


def changed_settings(saved: dict, cfg: TrainConfig) -> list[str]:
    """The training settings (flags of the optimization, wall-clock, batching and method groups) that `cfg` sets
    otherwise than the run whose checkpoint's config `saved` holds, as "--flag old -> new"; settings the checkpoint
    does not record (an older trainer's) are left out."""
    def text(v):
        if isinstance(v, bool):
            return "on" if v else "off"
        if isinstance(v, (list, tuple)):
            return ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) or "none"
        return "none" if v is None else f"{v:g}" if isinstance(v, float) else str(v)
    return [f"{option_name(f)} {text(saved[f.name])} -> {text(getattr(cfg, f.name))}"
            for f in flag_fields() if f.metadata["group"] in _TRAINING_GROUPS and f.name not in _NOT_AT_RESUME
            and f.name in saved and saved[f.name] != getattr(cfg, f.name)]


def snapshot_name(minutes: float) -> str:
    """The directory name of the snapshot at `minutes` under <output-dir>/snapshots/ (2 -> 2min, 0.5 -> 0.5min)."""
    return f"{minutes:g}min"
