"""Run configuration, stdlib only (cli.py builds and validates it before torch is imported, so a bad flag costs
milliseconds and the launcher sees a `failed` heartbeat instead of a slow crash):

- parsing.py: how the text of a flag or knob becomes a value, and one field's checks (`StartupError`);
- train_config.py: every dflash-train flag and environment knob declared once, as a `TrainConfig` field;
- paths.py: the start's filesystem checks of the target and data directories;
- preflight.py: `dflash-train --check` (every check a launch makes that needs no weights on a GPU).

The names of the first three are importable from here (`from dflash_trainer.config import TrainConfig`)."""

from dflash_trainer.config.parsing import (  # noqa: F401
    StartupError, parse_int, parse_float, parse_str, parse_gpu_list, parse_int_list, parse_float_list, parse_switch, parse_inverted_switch, FP8_RECIPES, parse_fp8_setting, check_fp8_setting, parse_seconds, at_least, positive, ascending_positive)
from dflash_trainer.config.train_config import (  # noqa: F401
    flag, env_knob, HEAD_CHUNK_BYTES, HEAD_CHUNK_MAX_ROWS, PATHS, DEVICES, OPTIMIZATION, WALL_CLOCK, BATCHING, METHOD, CONTRACT, TORCHRUN, TrainConfig, option_name, declared_default, flag_fields, env_fields, snapshot_name,
    changed_settings)
from dflash_trainer.config.paths import (  # noqa: F401
    STAGED_MANIFEST, check_staged_manifest, validate_paths, validate_target, data_shards, validate_data, find_mask_token_id, default_target_layer_ids,
    spaced_layer_ids)
