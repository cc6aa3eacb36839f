"""The start's checks that need only the filesystem (no torch): the target directory (a complete stage, a config
that names its layers and vocabulary, the mask token, the tapped layers) and the data directory (parquet shards
with the two columns); the default tapped layers. Stdlib only (pyarrow read when importable)."""

from __future__ import annotations

import glob
import json
import os

from dflash_trainer.config.parsing import StartupError, shard_weights_of
from dflash_trainer.config.train_config import TrainConfig


STAGED_MANIFEST = ".dflash-manifest.json"  # written last by dflash.ops.model_weights (the collection's README)


def tree_bytes(path: str) -> int:
    """Bytes of the files under path (a file's or link's own size; 0 when absent): the preflight's room for the
    next checkpoint and the checkpoints' cleaning both count a checkpoint this way."""
    if not os.path.isdir(path):
        return os.lstat(path).st_size if os.path.lexists(path) else 0
    total = 0
    for parent, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(parent, name)).st_size
            except OSError:
                pass
    return total


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
    target_config = validate_target(cfg)
    validate_data(cfg)
    return target_config


def validate_target(cfg: TrainConfig) -> dict:
    """--target-model (and the flags checked against it): a directory with a complete stage and a config.json."""
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
    return target_config


def data_shards(cfg: TrainConfig) -> list[str]:
    """--data-dir's *.parquet shards (StartupError when the directory or its shards are missing)."""
    if not os.path.isdir(cfg.data_dir):
        raise StartupError(f"--data-dir {cfg.data_dir} is not a directory; pass the directory of *.parquet shards")
    shards = sorted(glob.glob(os.path.join(cfg.data_dir, "*.parquet")))
    if not shards:
        raise StartupError(f"--data-dir {cfg.data_dir} has no *.parquet shards; "
                         "write input_ids/loss_mask parquet files there (see trainer/README.md)")
    return shards


def shard_weight_list(shards: list[str], spec: str | None, data_dir: str) -> list[int]:
    """Each shard's count of appearances an epoch by --shard-weights (1 where no prefix matches; the longest matching
    prefix wins); a prefix that matches no shard is refused, naming some of the shards."""
    if spec is None:
        return [1] * len(shards)
    pairs = shard_weights_of(spec)
    names = [os.path.basename(s) for s in shards]
    for prefix, _ in pairs:
        if not any(n.startswith(prefix) for n in names):
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            raise ValueError(f"--shard-weights {prefix}: no shard of {data_dir} starts with it (its shards: "
                             f"{shown}); fix the prefix")
    weights = []
    for name in names:
        matches = [(len(p), n) for p, n in pairs if name.startswith(p)]
        weights.append(max(matches)[1] if matches else 1)
    return weights


def validate_data(cfg: TrainConfig) -> None:
    """--data-dir: shards with input_ids and loss_mask columns; every --shard-weights prefix names some of them."""
    shards = data_shards(cfg)
    try:
        shard_weight_list(shards, cfg.shard_weights, cfg.data_dir)
    except ValueError as e:
        raise StartupError(str(e)) from None
    try:
        import pyarrow.parquet as pq
    except ImportError:  # checked again when the data loads
        return
    for shard in shards:
        names = set(pq.read_schema(shard).names)
        for column in ("input_ids", "loss_mask"):
            if column not in names:
                raise StartupError(f"data shard {shard} has no {column} column; "
                                 "regenerate the data with input_ids and loss_mask (see trainer/README.md)")


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
    """docs/dflash.md: start 1, end T-3, id_i = round(1 + i*(end-start)/(K-1)); K = 1 -> T // 2."""
    if num_taps == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end < start:
        raise ValueError(f"the target has {num_target_layers} layers, too few for the default taps; "
                         "pass --target-layer-ids explicitly")
    return [int(round(start + i * (end - start) / (num_taps - 1))) for i in range(num_taps)]


def spaced_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Evenly spaced target layers, the first and the last included; one drafter layer takes the last."""
    if num_draft_layers > num_target_layers:
        raise ValueError(f"--init-layers-from-target: the drafter's {num_draft_layers} layers are more than the "
                         f"target's {num_target_layers}; lower --num-draft-layers or drop the flag")
    if num_draft_layers == 1:
        return [num_target_layers - 1]
    step = (num_target_layers - 1) / (num_draft_layers - 1)
    return [int(round(j * step)) for j in range(num_draft_layers)]
