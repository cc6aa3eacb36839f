"""dflash-train --check: a configuration checked as a launch would take it, without running anything.

    dflash-train --check --target-model /dev/shm/models/target --data-dir /workspace/data --output-dir /w/out ...
    WORLD_SIZE=8 dflash-train --check ...     # as one rank of an 8-process torchrun job sees it
    WORLD_SIZE=16 LOCAL_WORLD_SIZE=8 dflash-train --check ...   # a job of 2 nodes x 8 ranks (the whole job's layout)
    WORLD_SIZE=3 DFLASH_NODE_RANKS=2,1 GROUP_RANK=1 dflash-train --check ...   # nodes of 2 and 1 ranks, seen on node 1

The argv and the environment knobs are parsed exactly as a launch parses them (cli.py's generated flags,
config.TrainConfig and its checks), then every start-up check that needs no weights on a GPU runs: the target
directory (config readable, a model family transformers has, staged manifest complete, mask token, tapped layers),
the data directory (shards with their columns, token ids inside the target's vocabulary: the tokenizer matches), the
output directory (writable, room for the next checkpoint), the GPU indexes (visible devices), and for WORLD_SIZE > 1
the torchrun layout of the whole job, every rank's role, device, node and local rank (dist_world.plan_layout over
distributed/nodes.py's node sizes, the rule the ranks follow) and this node's hidden-state queues' host memory
(dist_train.check_queue_memory, against MemTotal). Nothing is created or written: no heartbeat, no run or output
directory. The check runs before the live run is stopped, so what that run holds (host memory, GPU memory) is
counted as the new run's: it refuses what cannot work even once the live run is gone, and the ranks check the free
amounts again at start.

Output: one JSON line on stdout, {"check": "ok"|"failed", "problems": [...], "world_size", "layout", "settings"},
where settings are the resolved values the run contract needs (run_dir, output_dir, checkpoints,
keep_checkpoints); then `ok` (exit 0), or each problem as one line `dflash-train: error: ...` on stderr (exit 2).
The collection's training_run runs this in the container before it stops anything, and takes the layout and the
settings from it (it holds no copy of these rules).

torch is imported only where the check needs it: GPUs named (device visibility) or WORLD_SIZE > 1 (the layout).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import sys

from dflash_trainer.config import (TrainConfig, data_shards, declared_default, env_fields, flag_fields,
                                   option_name, validate_data, validate_target)
from dflash_trainer.config.paths import tree_bytes

PROG = "dflash-train"


class _Collecting(argparse.ArgumentParser):
    def error(self, message: str):
        raise ValueError(f"{message}; run {PROG} --help for the flags")


def _parser() -> argparse.ArgumentParser:
    from dflash_trainer.cli import add_train_flags
    parser = _Collecting(prog=PROG, add_help=False)
    add_train_flags(parser, required=False)  # a missing required flag is one problem of the list, not the only one
    return parser


def _unknown(args: list[str]) -> list[str]:
    """One line per argument no flag takes, with the nearest flag's name when there is one."""
    names = [option_name(f) for f in flag_fields()]
    problems = []
    for arg in args:
        name = arg.split("=", 1)[0]
        if not name.startswith("-"):
            problems.append(f"unexpected argument {arg!r}; pass values as --flag=value")
            continue
        near = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
        hint = f"did you mean {near[0]}?" if near else f"run {PROG} --help for the flags"
        problems.append(f"unrecognized argument {arg}: {PROG} has no flag {name}; {hint}")
    return problems


def parse(argv: list[str], environ) -> tuple[dict, list[str]]:
    """(TrainConfig keyword arguments, problems): every flag and environment knob that parses, and one line for
    each that does not (unknown, malformed, missing)."""
    problems = []
    try:
        namespace, rest = _parser().parse_known_args(argv)
    except ValueError as e:  # e.g. a value outside a flag's choices
        return {}, [str(e)]
    problems += _unknown(rest)
    values = {}
    for f in flag_fields():
        if not hasattr(namespace, f.name):
            if declared_default(f) is dataclasses.MISSING:
                problems.append(f"{option_name(f)} is required; pass it (e.g. {_example(f)})")
            continue
        raw = getattr(namespace, f.name)
        try:
            values[f.name] = raw if f.metadata["switch"] else f.metadata["parse"](raw, option_name(f))
        except ValueError as e:
            problems.append(str(e))
    for f in env_fields():
        if option_name(f) in environ:
            try:
                values[f.name] = f.metadata["parse"](environ[option_name(f)], option_name(f))
            except ValueError as e:
                problems.append(str(e))
    return values, problems


def _example(f) -> str:
    return {"--target-model": "--target-model /dev/shm/models/target", "--data-dir": "--data-dir /workspace/data",
            "--output-dir": "--output-dir /workspace/runs/r1/out"}.get(option_name(f), option_name(f) + "=VALUE")


def _tokens_fit(cfg: TrainConfig, vocab_size: int) -> list[str]:
    """Data tokenized by another tokenizer: a token id at or past the target's vocabulary (parquet footers' column
    statistics only; a shard without them is not read)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return []
    problems = []
    for shard in data_shards(cfg):
        meta = pq.ParquetFile(shard).metadata
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            for c in range(group.num_columns):
                column = group.column(c)
                stats = column.statistics
                if not column.path_in_schema.startswith("input_ids") or stats is None or not stats.has_min_max:
                    continue
                if stats.max >= vocab_size or stats.min < 0:
                    bad = stats.max if stats.max >= vocab_size else stats.min
                    problems.append(f"--data-dir {cfg.data_dir}: shard {os.path.basename(shard)} holds token id "
                                    f"{bad}, outside --target-model's vocabulary (vocab_size {vocab_size}): the data "
                                    f"was tokenized for another model; regenerate it with dflash-prepare-data "
                                    f"--target-model {cfg.target_model}")
                    return problems
    return problems


def check_family(cfg: TrainConfig, target_config: dict) -> list[str]:
    """The target's model_type is a family the installed transformers has (its models/<type> package), found
    without importing transformers (which imports torch: seconds)."""
    import importlib.metadata
    import importlib.util
    model_type = target_config.get("model_type")
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return ["transformers is not installed in this environment; reinstall the trainer (pip install "
                "dflash_trainer pulls it in)"]
    if not isinstance(model_type, str) or not model_type:
        return [f"--target-model {cfg.target_model}: config.json has no model_type; pass a Hugging Face causal LM "
                "directory"]
    models = os.path.join(spec.submodule_search_locations[0], "models")
    if os.path.isdir(os.path.join(models, model_type.replace("-", "_"))):
        return []
    return [f"--target-model {cfg.target_model}: model_type {model_type!r} is not a family transformers "
            f"{importlib.metadata.version('transformers')} can load; pass a Hugging Face causal LM directory "
            "(e.g. qwen3, qwen3_5, llama) or install a transformers that knows it"]


def check_kernels(cfg: TrainConfig, target_config: dict, cuda: bool | None = None) -> tuple[str | None, list[str]]:
    """(the `target kernels:` line, problems): the torch fallback of a linear-attention target refused on a GPU
    (model/target_kernels.py). `cuda`: whether this host has CUDA (asked of torch when None)."""
    from dflash_trainer.config import StartupError
    from dflash_trainer.model import target_kernels
    if target_kernels.LINEAR_ATTENTION not in target_kernels.layer_types(target_config):
        return None, []
    if cuda is None:
        import torch
        cuda = torch.cuda.is_available()
    from dflash_trainer.distributed.world import uses_gpus
    on_gpu = cuda and (cfg.device == "cuda" or uses_gpus(cfg, cuda))
    try:
        return target_kernels.check(target_config, on_gpu, cfg.slow_linear_attention), []
    except StartupError as e:
        return None, [str(e)]


def check_start(cfg: TrainConfig) -> list[str]:
    """--init-drafter and --init-layers-from-target refused as the start would refuse them, from the configs and the
    target's safetensors headers (loop/starting_weights.py; no tensor read); imports torch and transformers
    (seconds), only when one of them is given."""
    from dflash_trainer.loop.starting_weights import check_starting_weights
    from dflash_trainer.loop.train import drafter_config_for
    try:
        check_starting_weights(cfg, drafter_config_for(cfg)[2])
    except ValueError as e:  # StartupError is one
        return [" ".join(str(e).split())]
    return []


def _nearest_existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def check_output(cfg: TrainConfig) -> list[str]:
    """--output-dir (and --run-dir) writable, with room for the next checkpoint (the size of the newest one)."""
    problems = []
    for flag, path in (("--output-dir", cfg.output_dir), ("--run-dir", cfg.run_dir)):
        where = _nearest_existing(path)
        if not os.path.isdir(where):
            problems.append(f"{flag} {path}: {where} is not a directory; pass a directory path")
        elif not os.access(where, os.W_OK | os.X_OK):
            problems.append(f"{flag} {path}: {where} is not writable by uid {os.getuid()}; pass a writable "
                            f"directory or fix its permissions")
    root = os.path.join(cfg.output_dir, "checkpoints")
    try:
        with open(os.path.join(root, "latest")) as f:
            newest = os.path.join(root, f.read().strip())
    except OSError:
        return problems
    if os.path.isdir(newest):
        need = tree_bytes(newest)
        st = os.statvfs(_nearest_existing(root))
        free = st.f_bavail * st.f_frsize
        if free < need:
            problems.append(f"--output-dir {cfg.output_dir}: {free} bytes free, the next checkpoint needs about "
                            f"{need} (the size of {newest}); free space there or pass another --output-dir")
    return problems


def check_devices(cfg: TrainConfig) -> list[str]:
    """The GPU indexes against the devices this process sees (train.resolve_devices' rule, asked of torch)."""
    gpus = sorted(set(cfg.target_gpus + cfg.drafter_gpus))
    if cfg.device == "cpu" or (not gpus and cfg.device != "cuda"):
        return []
    import torch
    if not torch.cuda.is_available():
        if cfg.device == "cuda":
            return ["--device cuda but CUDA is not available here; use a GPU host or --device cpu"]
        return [f"GPUs {gpus} requested but CUDA is not available; pass --target-gpus '' --drafter-gpus '' (or "
                "--device cpu) to train on the CPU"]
    count = torch.cuda.device_count()
    missing = [g for g in gpus if g >= count]
    if missing:
        return [f"GPUs {missing} do not exist (this host shows {count}: 0..{count - 1}); fix --target-gpus/"
                "--drafter-gpus (indices are after CUDA_VISIBLE_DEVICES)"]
    return []


def _gpus_per_target_rank(cfg: TrainConfig, cuda: bool) -> int:
    """dist_world.gpus_per_target_rank, except where it measures (--target-gpus-per-rank 0 on GPUs): the check runs
    before the live run is stopped, while that run still holds these GPUs, so it plans with their total memory - what
    the ranks will have once the run is stopped and its memory released (the lifecycle waits for that). The ranks
    measure the free memory again at start."""
    from dflash_trainer.distributed import world as dist_world
    free = None
    if not cfg.target_gpus_per_rank and dist_world.uses_gpus(cfg, cuda) and cfg.target_gpus:
        import torch
        total = min(torch.cuda.get_device_properties(i).total_memory for i in cfg.target_gpus)
        free = (total, "total (checked before the live run is stopped)")
    return dist_world.gpus_per_target_rank(cfg, cuda, free)[0]


def check_world(cfg: TrainConfig, world_size: int, environ=os.environ) -> tuple[list | None, list[str]]:
    """(layout, problems) of a torchrun job of world_size ranks over its nodes (distributed/nodes.py: from
    DFLASH_NODE_RANKS or torchrun's variables): the ranks' own rule, and the queue check for this node (GROUP_RANK,
    node 0 when unset)."""
    import torch

    from dflash_trainer.distributed import dist_train
    from dflash_trainer.distributed import hs_queue
    from dflash_trainer.distributed import world as dist_world
    from dflash_trainer.distributed.nodes import job_nodes
    from dflash_trainer.config import StartupError
    cuda = torch.cuda.is_available()
    try:
        nodes = job_nodes(world_size, environ)
        per_rank = _gpus_per_target_rank(cfg, cuda)
        T, D, layout = dist_world.plan_layout(cfg, world_size, cuda, per_rank, nodes)
        node = int(environ.get("GROUP_RANK") or 0)
        if not 0 <= node < nodes.count:
            raise StartupError(f"GROUP_RANK {node} is not a node of the job's {nodes.describe()}; set it to this "
                               f"node's index (0 to {nodes.count - 1})")
    except StartupError as e:
        return None, [str(e)]
    here = [row for row in layout if row["node"] == node and row["role"] == "drafter"]
    if not here:
        return layout, []
    # check_queue_memory counts this node's drafter ranks from the layout, seen from its first drafter rank
    world = dist_world.World(rank=here[0]["rank"], world_size=world_size, num_target_ranks=T, num_drafter_ranks=D,
                             device=torch.device(here[0]["device"]), pid_file="", layout=layout)
    try:
        # MemTotal, not MemAvailable: the live run's queues still hold host memory until it is stopped; the check
        # refuses what cannot fit even then, and the ranks check MemAvailable again at start.
        dist_train.check_queue_memory(cfg, world, available=hs_queue.meminfo("MemTotal"))
    except (StartupError, OSError, KeyError, ValueError) as e:
        return layout, [str(e)]
    return layout, []


def check(argv: list[str], environ=os.environ) -> dict:
    """The report: {"check", "problems", "world_size", "layout", "settings", "target_kernels"}."""
    report = {"check": "failed", "problems": [], "world_size": None, "layout": None, "settings": None,
              "target_kernels": None}
    problems = report["problems"]
    try:
        world_size = int(environ.get("WORLD_SIZE", "1"))
        if world_size < 1:
            raise ValueError
    except ValueError:
        problems.append(f"WORLD_SIZE is {environ.get('WORLD_SIZE')!r}; set it to the job's process count, e.g. 8")
        world_size = 1
    report["world_size"] = world_size
    values, unparsed = parse(argv, environ)
    problems += unparsed
    try:  # the flags that parsed: their paths are checked too, so one run of the check lists every problem
        cfg = TrainConfig(**values)
    except TypeError:  # a required flag is missing (already one of the problems)
        return report
    except ValueError as e:
        problems.append(str(e))
        return report
    report["settings"] = {"run_dir": cfg.run_dir, "output_dir": cfg.output_dir,
                          "checkpoints": os.path.join(cfg.output_dir, "checkpoints"),
                          "keep_checkpoints": cfg.keep_checkpoints}
    target_ok = True
    try:
        target_config = validate_target(cfg)
    except (ValueError, OSError) as e:
        problems.append(" ".join(str(e).split()))
        target_ok = False
    except KeyError as e:
        problems.append(f"--target-model {cfg.target_model}: config.json has no {e}; pass a HF causal LM directory")
        target_ok = False
    if target_ok:
        problems += check_family(cfg, target_config)
        report["target_kernels"], more = check_kernels(cfg, target_config)
        problems += more
        if cfg.init_drafter or cfg.init_layers_from_target:
            problems += check_start(cfg)
    try:
        validate_data(cfg)
        if target_ok:
            text_config = target_config.get("text_config", target_config)
            problems += _tokens_fit(cfg, int(text_config["vocab_size"]))
    except (ValueError, OSError) as e:
        problems.append(" ".join(str(e).split()))
    problems += check_output(cfg)
    problems += check_devices(cfg)
    if world_size > 1 and target_ok:
        report["layout"], more = check_world(cfg, world_size, environ)
        problems += more
    if not problems:
        report["check"] = "ok"
    else:
        report["settings"] = None  # settings of a refused configuration are nobody's answer
    return report


def main(argv: list[str], environ=os.environ) -> int:
    report = check(argv, environ)
    report["problems"] = [" ".join(p.split()) for p in report["problems"]]  # each one line
    print(json.dumps(report, sort_keys=True), flush=True)
    if report["check"] == "ok":
        print("ok", flush=True)
        return 0
    for problem in report["problems"]:
        print(f"{PROG}: error: {problem}", file=sys.stderr, flush=True)
    return 2
