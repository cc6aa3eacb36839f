"""Run configuration: one dataclass, validated in __post_init__.

Stdlib only: cli.py builds and validates this before torch is imported, so that a bad flag costs
milliseconds and the launcher sees a `failed` heartbeat instead of a slow crash. Every ValueError
message has the form "<problem>; <fix>" and names the flag to change.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from dataclasses import dataclass, field


class StartupError(ValueError):
    """A refusal found at start, before weights load: one line on stderr, exit status 2."""


def parse_gpu_list(text: str, flag: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; '' -> []."""
    text = (text or "").strip()
    if not text:
        return []
    ids = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"{flag} {text!r} is not a comma-separated list of GPU indices; "
                             f"pass e.g. {flag} 0,1 or {flag} '' for none")
        ids.append(int(part))
    if len(set(ids)) != len(ids):
        raise ValueError(f"{flag} {text!r} repeats a GPU; list each GPU once")
    return ids


@dataclass
class TrainConfig:
    """Everything one training run needs; field names match the CLI flags (dashes -> underscores)."""

    target_model: str
    """Local directory of the frozen HF causal LM (config.json + safetensors)."""
    data_dir: str
    """Directory of *.parquet shards with columns input_ids list<int32>, loss_mask list<int8>."""
    output_dir: str
    """Holds checkpoints/ (step-N dirs + `latest`)."""
    run_dir: str | None = None
    """Holds heartbeat.json, metrics.jsonl, profile.jsonl, telemetry.jsonl. Default: output_dir."""
    target_gpus: list[int] = field(default_factory=list)
    """GPUs for the target; this single-process trainer uses the first one."""
    drafter_gpus: list[int] = field(default_factory=list)
    """GPUs for the drafter; this single-process trainer uses the first one."""
    device: str = "auto"
    """auto: CUDA when present, else CPU (GPU lists must then be empty); cpu: force CPU; cuda: require CUDA."""
    epochs: int = 6
    lr: float = 6e-4
    warmup_ratio: float = 0.04
    weight_decay: float = 0.01
    grad_accum: int = 4
    grad_clip: float = 1.0
    token_budget: int = 49152
    """Per micro-batch: sum of padded sequence lengths stays at or under this."""
    max_seq_len: int = 8192
    max_batch_size: int = 64
    block_size: int = 32
    max_anchors: int = 1024
    num_draft_layers: int = 5
    gamma: float = 10.0
    noise: str = "uniform"
    noise_start: float = 0.05
    noise_end: float = 0.01
    use_soft_labels: bool = False
    seed: int = 0
    checkpoint_interval: int = 1000
    """Optimizer steps between checkpoints (a final one is always written)."""
    keep_checkpoints: int = 3
    mask_token_id: int | None = None
    """Default: the `<|MASK|>` entry of the target's added_tokens.json / tokenizer.json."""
    target_layer_ids: list[int] | None = None
    """Default: DFLASH.md's rule for num_target_taps taps."""
    num_target_taps: int = 5
    heartbeat_interval: float = 2.0
    log_interval: int = 10
    max_steps: int | None = None
    max_bad_steps: int = 10
    """Consecutive non-finite steps tolerated before the run halts."""
    head_chunk_size: int = 4096
    """Rows of the frozen lm_head computed at once in the loss (bounds logits memory)."""
    profile_interval: float = 60.0
    """From env DFLASH_PROFILE_INTERVAL: seconds between profile.jsonl snapshots."""
    split_fc_layers: bool = False
    """From env DFLASH_SPLIT_FC_LAYERS: apply fc per tap and sum (identical math, less peak memory)."""
    compile_layers: bool = True
    """From env DFLASH_EAGER_LAYERS (1 = eager): torch.compile the drafter layers on CUDA."""

    def __post_init__(self) -> None:
        if self.run_dir is None:
            self.run_dir = self.output_dir
        positive_ints = ("epochs", "grad_accum", "token_budget", "max_seq_len", "max_batch_size",
                         "max_anchors", "num_draft_layers", "checkpoint_interval", "keep_checkpoints",
                         "log_interval", "max_bad_steps", "head_chunk_size", "num_target_taps")
        for name in positive_ints:
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} is {getattr(self, name)}; it must be at least 1")
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
        if self.noise not in ("uniform", "none"):
            raise ValueError(f"--noise is {self.noise!r}; pass --noise uniform or --noise none")
        if self.noise_start < 0 or self.noise_end < 0:
            raise ValueError("--noise-start/--noise-end are negative; pass amplitudes >= 0")
        if self.max_seq_len > self.token_budget:
            raise ValueError(f"--max-seq-len {self.max_seq_len} exceeds --token-budget {self.token_budget}; "
                             "a full-length sequence would never fit a batch: raise --token-budget")
        if self.max_seq_len < 2:
            raise ValueError("--max-seq-len must be at least 2; an anchor needs a next token")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device is {self.device!r}; pass auto, cpu or cuda")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError("--max-steps must be at least 1; leave it out to train all epochs")
        if self.heartbeat_interval <= 0:
            raise ValueError("--heartbeat-interval must be > 0 seconds")
        if self.mask_token_id is not None and self.mask_token_id < 0:
            raise ValueError(f"--mask-token-id is {self.mask_token_id}; pass a token id inside the vocabulary")
        if self.target_layer_ids is not None:
            if not self.target_layer_ids:
                raise ValueError("--target-layer-ids is empty; pass e.g. 1,9,17,25,33 or leave it out")
            self.num_target_taps = len(self.target_layer_ids)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


STAGED_MANIFEST = ".dflash-manifest.json"  # written last by dflash.ops.model_weights (the collection's README)


def check_staged_manifest(target_model: str) -> None:
    """A --target-model staged by the collection has a manifest; it must be complete (complete: true, every file it
    lists present with its size). A directory without one (a tiny or hand-made target) is accepted as it is."""
    path = os.path.join(target_model, STAGED_MANIFEST)
    if not os.path.lexists(path):
        return
    fix = "re-run stage_weights (ansible-playbook playbooks/stage_weights.yml)"
    try:
        with open(path) as f:
            manifest = json.load(f)
        files = manifest["files"]
        complete = manifest.get("complete") is True and isinstance(files, dict)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise StartupError(f"--target-model {target_model}: {STAGED_MANIFEST} is unreadable; {fix}") from None
    if not complete:
        raise StartupError(f"--target-model {target_model} is a partial stage (its manifest is not complete); {fix}")
    for rel, entry in sorted(files.items()):
        try:
            size = os.stat(os.path.join(target_model, rel)).st_size
        except OSError:
            raise StartupError(f"--target-model {target_model} is missing {rel}, listed in its manifest; {fix}") \
                from None
        if size != entry.get("size"):
            raise StartupError(f"--target-model {target_model}: {rel} has {size} bytes, its manifest says "
                               f"{entry.get('size')}; {fix}")


def validate_paths(cfg: TrainConfig) -> dict:
    """Checks that only need the filesystem (no torch); returns the target's config.json.

    Reads parquet schemas with pyarrow when it is importable (cheap: footers only).
    """
    if not os.path.isdir(cfg.target_model):
        raise StartupError(f"--target-model {cfg.target_model} is not a directory; "
                         "pass the local directory of the target model (dflash-make-tiny builds a tiny one)")
    check_staged_manifest(cfg.target_model)
    config_path = os.path.join(cfg.target_model, "config.json")
    if not os.path.isfile(config_path):
        raise StartupError(f"--target-model {cfg.target_model} has no config.json; pass a HF model directory")
    with open(config_path) as f:
        target_config = json.load(f)
    text_config = target_config.get("text_config", target_config)
    vocab_size = int(text_config["vocab_size"])
    num_layers = int(text_config["num_hidden_layers"])

    if cfg.mask_token_id is None:
        cfg.mask_token_id = find_mask_token_id(cfg.target_model)
        if cfg.mask_token_id is None:
            raise StartupError(f"no <|MASK|> token found in {cfg.target_model}; pass --mask-token-id "
                             "with an id that exists in the target's embedding table")
    if not 0 <= cfg.mask_token_id < vocab_size:
        raise StartupError(f"--mask-token-id {cfg.mask_token_id} is outside the target vocabulary "
                         f"(vocab_size {vocab_size}); pass an id in [0, {vocab_size})")
    if cfg.target_layer_ids is not None:
        bad = [i for i in cfg.target_layer_ids if not 0 <= i < num_layers - 1]
        if bad:
            raise StartupError(f"--target-layer-ids {bad} are outside the target's layers 0..{num_layers - 2} "
                             "(the last layer's output is normed in HF, so it cannot be tapped); fix the list")

    if not os.path.isdir(cfg.data_dir):
        raise StartupError(f"--data-dir {cfg.data_dir} is not a directory; pass the directory of *.parquet shards")
    shards = sorted(glob.glob(os.path.join(cfg.data_dir, "*.parquet")))
    if not shards:
        raise StartupError(f"--data-dir {cfg.data_dir} has no *.parquet shards; "
                         "write input_ids/loss_mask parquet files there (see trainer/README.md)")
    try:
        import pyarrow.parquet as pq
    except ImportError:  # checked again when the data loads
        return target_config
    for shard in shards:
        names = set(pq.read_schema(shard).names)
        for column in ("input_ids", "loss_mask"):
            if column not in names:
                raise StartupError(f"data shard {shard} has no {column} column; "
                                 "regenerate the data with input_ids and loss_mask (see trainer/README.md)")
    return target_config


def find_mask_token_id(model_dir: str) -> int | None:
    """Looks up `<|MASK|>` in added_tokens.json, then tokenizer.json's added_tokens."""
    added = os.path.join(model_dir, "added_tokens.json")
    if os.path.isfile(added):
        with open(added) as f:
            table = json.load(f)
        if "<|MASK|>" in table:
            return int(table["<|MASK|>"])
    tok = os.path.join(model_dir, "tokenizer.json")
    if os.path.isfile(tok):
        with open(tok) as f:
            for entry in json.load(f).get("added_tokens", []):
                if entry.get("content") == "<|MASK|>":
                    return int(entry["id"])
    return None


def default_target_layer_ids(num_target_layers: int, num_taps: int) -> list[int]:
    """DFLASH.md: start 1, end T-3, id_i = round(1 + i*(end-start)/(K-1)); K = 1 -> T // 2."""
    if num_taps == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end < start:
        raise ValueError(f"the target has {num_target_layers} layers, too few for the default taps; "
                         "pass --target-layer-ids explicitly")
    return [int(round(start + i * (end - start) / (num_taps - 1))) for i in range(num_taps)]
