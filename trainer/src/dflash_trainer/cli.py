"""dflash-train: train a DFlash drafter against a frozen target.

This module is stdlib-only on purpose: the launcher measures time-to-first-heartbeat, so flags are
parsed and validated and heartbeat.json (phase `loading`) is written before torch/transformers load.

One process, CPU (tiny demo):
    dflash-make-tiny --target-dir /tmp/demo/target --data-dir /tmp/demo/data
    dflash-train --target-model /tmp/demo/target --data-dir /tmp/demo/data --output-dir /tmp/demo/out \
        --target-gpus '' --drafter-gpus '' --block-size 8 --max-anchors 64 --num-draft-layers 2 --gamma 4 \
        --token-budget 2048 --max-seq-len 256 --grad-accum 1 --log-interval 1
One host with GPUs (the target on the first --target-gpus entry, the drafter on the first --drafter-gpus):
    dflash-train --target-model /models/Qwen3-8B --data-dir /data/tok --output-dir /runs/r1/out \
        --target-gpus 0 --drafter-gpus 1
By wall clock (lr and noise follow the training time; a kept checkpoint at 2 and 5 minutes and at the end):
    dflash-train ... --time-budget-min 10 --snapshot-minutes 2,5 --compile-warmup-batches 2 --epochs 100
Check a configuration without running it (every problem one line, exit 2; `ok` and 0; config/preflight.py):
    dflash-train --check ...                 (WORLD_SIZE=N: as a torchrun job of N ranks)
Predict the target:drafter split from one GPU's measurements (seconds per sequence of each stage, the rate of each
split, the deepest hidden-state queue; plan.json in the run dir; advisor/):
    dflash-train --plan ...
Exit status: 0 finished (also after SIGTERM, which checkpoints first); 2 refused at start; 1 failed.

The flags are not declared here: each is a field of config.TrainConfig (default, help, parsing, check), and
build_parser() generates them (add_train_flags, which drivers such as proofs/proof_smollm2.py use too).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import threading
import traceback

from dflash_trainer.config import (StartupError, TrainConfig, declared_default, env_fields, flag_fields,
                                   option_name, parse_inverted_switch, validate_paths)
from dflash_trainer.failures import ExplainedFailure, failure_line
from dflash_trainer import stop_report
from dflash_trainer.telemetry.heartbeat import Heartbeat, write_json_atomic

PROG = "dflash-train"
CHECK_FLAG = "--check"
PLAN_FLAG = "--plan"


class UsageError(StartupError):
    """A flag that does not parse."""


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + error; the contract wants one line
        raise UsageError(f"{message}; run {PROG} --help for the flags")


def _help(f) -> str:
    text = f.metadata["help"]
    default = declared_default(f)
    if isinstance(default, list):
        default = ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in default) or "''"
    if default is not None and default is not dataclasses.MISSING and not f.metadata["switch"]:
        text += f" (default: {default})"
    return text.replace("%", "%%")


def add_train_flags(parser: argparse.ArgumentParser, only=None, skip=(), required: bool = True) -> None:
    """Adds the flags of TrainConfig's fields (all, or those named in `only`, less `skip`) to `parser`, grouped
    as declared. argparse holds no default (SUPPRESS): a flag not given is absent from the namespace, and
    TrainConfig's field default applies. Values stay text until train_values() parses them, so
    given_train_argv() can hand them on unchanged. `required`: a field without a default is a required flag."""
    groups = {}
    for f in flag_fields():
        if (only is not None and f.name not in only) or f.name in skip:
            continue
        group = f.metadata["group"]
        if group not in groups:
            groups[group] = parser.add_argument_group(group)
        kwargs = {"dest": f.name, "default": argparse.SUPPRESS, "help": _help(f)}
        if f.metadata["switch"]:
            kwargs["action"] = "store_true"
        else:
            kwargs.update(choices=f.metadata["choices"], metavar=f.metadata["metavar"])
            kwargs["required"] = required and declared_default(f) is dataclasses.MISSING
        action = groups[group].add_argument(option_name(f), **kwargs)
        action.train_field = f.name  # tests/test_flags.py: every trainer flag of every parser comes from here


def train_values(namespace: argparse.Namespace) -> dict:
    """The given trainer flags of a namespace, parsed: {field name: value}."""
    values = {}
    for f in flag_fields():
        if hasattr(namespace, f.name):
            raw = getattr(namespace, f.name)
            values[f.name] = raw if f.metadata["switch"] else f.metadata["parse"](raw, option_name(f))
    return values


def train_settings(namespace: argparse.Namespace, only) -> dict:
    """Every trainer flag named in `only`: the given value, else its declared default (a benchmark's settings)."""
    defaults = {f.name: declared_default(f) for f in flag_fields() if f.name in only}
    return {**defaults, **{k: v for k, v in train_values(namespace).items() if k in only}}


def given_train_argv(namespace: argparse.Namespace, skip=()) -> list[str]:
    """The given trainer flags of a namespace as a dflash-train command line (a driver hands them on)."""
    argv = []
    for f in flag_fields():
        if hasattr(namespace, f.name) and f.name not in skip:
            raw = getattr(namespace, f.name)
            argv += [option_name(f)] if f.metadata["switch"] else [f"{option_name(f)}={raw}"]
    return argv


def env_values(environ=os.environ) -> dict:
    """The environment knobs that are set, parsed: {field name: value}."""
    return {f.name: f.metadata["parse"](environ[option_name(f)], option_name(f))
            for f in env_fields() if option_name(f) in environ}


def env_setting(name: str, environ=os.environ):
    """One environment knob's value as dflash-train takes it: set, parsed; else its declared default."""
    (f,) = [f for f in env_fields() if f.name == name]
    return env_values(environ).get(name, declared_default(f))


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_train_flags(p)
    p.epilog = "environment: " + "; ".join(
        f"{option_name(f)}: {f.metadata['help']} (unset: {_env_default(f)})" for f in env_fields()) + "."
    return p


def _env_default(f) -> str:
    default = declared_default(f)
    if f.metadata["parse"] is parse_inverted_switch:
        return "0" if default else "1"
    return {True: "1", False: "0"}.get(default, f"{default:g}") if isinstance(default, (bool, float)) else str(default)


def config_from_args(argv: list[str] | None) -> TrainConfig:
    args = build_parser().parse_args(argv)
    return TrainConfig(**train_values(args), **env_values())


def _guess_run_dir(argv: list[str]) -> str | None:
    """Where to record a refusal when the flags themselves did not parse."""
    for flag in ("--run-dir", "--output-dir"):
        for i, arg in enumerate(argv):
            if arg == flag and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def _refuse(message: str, run_dir: str | None, heartbeat: Heartbeat | None) -> int:
    message = " ".join(str(message).split())  # one line, whatever the exception text held
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    try:
        if heartbeat is not None:
            heartbeat.set_phase("failed", error=message)
        elif run_dir:
            os.makedirs(run_dir, exist_ok=True)
            import time
            write_json_atomic(os.path.join(run_dir, "heartbeat.json"),
                              {"pid": os.getpid(), "phase": "failed", "step": 0, "epoch": 0,
                               "tokens_per_s": None, "loss": None, "updated_at": time.time(), "error": message})
    except OSError:
        pass
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if CHECK_FLAG in argv:  # check the configuration, run nothing (config/preflight.py)
        from dflash_trainer.config import preflight
        return preflight.main([a for a in argv if a != CHECK_FLAG])
    if PLAN_FLAG in argv:  # measure on one GPU and predict the splits, train nothing (advisor/plan.py)
        from dflash_trainer.advisor import plan
        return plan.main([a for a in argv if a != PLAN_FLAG])
    try:
        cfg = config_from_args(argv)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except ValueError as e:
        return _refuse(str(e), _guess_run_dir(argv), None)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # one rank of a torchrun job
        from dflash_trainer.distributed import dist_train
        return dist_train.main(cfg)

    heartbeat = Heartbeat(cfg.run_dir, cfg.heartbeat_interval)
    heartbeat.write()  # phase `loading`, before any heavy import
    heartbeat.start()

    # SIGTERM only sets a flag: the loop finishes its step, checkpoints and exits 0.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    stop_report.watch(cfg.stop_report_s)

    try:
        validate_paths(cfg)
        from dflash_trainer.loop import train  # heavy: torch, transformers
        status = train.run(cfg, heartbeat, stop)
    except StartupError as e:  # refusals found before weights load (train.run checks devices first)
        heartbeat.stop()
        return _refuse(str(e), cfg.run_dir, heartbeat)
    except BaseException as e:  # noqa: BLE001 - every failure must reach the heartbeat
        status = _fail(e, heartbeat)
    heartbeat.stop()
    return status


def _fail(e: BaseException, heartbeat: Heartbeat) -> int:
    heartbeat.stop()
    heartbeat.release_reserve()  # the disk may be full: room for the lines below and the `failed` heartbeat
    if isinstance(e, ExplainedFailure):  # its one line says it all
        message = " ".join(str(e).split())
    else:
        traceback.print_exc()
        message = failure_line(e)
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    heartbeat.set_phase("failed", error=message)
    return 130 if isinstance(e, KeyboardInterrupt) else 1


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
