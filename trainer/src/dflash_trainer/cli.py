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
Exit status: 0 finished (also after SIGTERM, which checkpoints first); 2 refused at start; 1 failed.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback

from dflash_trainer.config import StartupError, TrainConfig, parse_gpu_list, validate_paths
from dflash_trainer.heartbeat import Heartbeat, write_json_atomic

PROG = "dflash-train"


class UsageError(StartupError):
    """A flag that does not parse."""


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse prints usage + error; the contract wants one line
        raise UsageError(f"{message}; run {PROG} --help for the flags")


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    g = p.add_argument_group("paths")
    g.add_argument("--target-model", required=True, help="local HF directory of the frozen target model")
    g.add_argument("--data-dir", required=True, help="directory of *.parquet shards (input_ids, loss_mask)")
    g.add_argument("--output-dir", required=True, help="checkpoints/ go here; training resumes from its `latest`")
    g.add_argument("--run-dir", default=None,
                   help="heartbeat.json, metrics/profile/telemetry.jsonl (default: --output-dir)")
    g = p.add_argument_group("devices (single process: the first GPU of each list is used)")
    g.add_argument("--target-gpus", default="", help="e.g. 0,1,2,3,4; '' for none")
    g.add_argument("--drafter-gpus", default="", help="e.g. 5,6,7; '' for none")
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="auto: CUDA if present (GPU lists default to GPU 0), else CPU, where non-empty GPU "
                        "lists are refused; cpu: ignore the GPU lists; cuda: refuse to run without CUDA")
    g = p.add_argument_group("optimization")
    a("--epochs", type=int, default=6)
    a("--lr", type=float, default=6e-4, help="peak AdamW learning rate")
    a("--warmup-ratio", type=float, default=0.04, help="fraction of optimizer steps of linear warmup")
    a("--weight-decay", type=float, default=0.01)
    a("--grad-accum", type=int, default=4, help="micro-batches per optimizer step")
    a("--grad-clip", type=float, default=1.0, help="max global gradient norm")
    a("--max-steps", type=int, default=None, help="stop after this many optimizer steps (tests, demos)")
    a("--max-bad-steps", type=int, default=10, help="halt after this many non-finite steps in a row")
    a("--seed", type=int, default=0)
    g = p.add_argument_group("batching")
    a("--token-budget", type=int, default=49152, help="max sum of padded sequence lengths per micro-batch")
    a("--max-seq-len", type=int, default=8192, help="longer sequences are truncated")
    a("--max-batch-size", type=int, default=64, help="max sequences per micro-batch")
    g = p.add_argument_group("DFlash method (see DFLASH.md)")
    a("--block-size", type=int, default=32, help="B: anchor + B-1 masked slots")
    a("--max-anchors", type=int, default=1024, help="blocks sampled per sequence")
    a("--num-draft-layers", type=int, default=5)
    a("--gamma", type=float, default=10.0, help="slot weight exp(-(k-1)/gamma)")
    a("--noise", default="uniform", choices=["uniform", "none"], help="noise added to target features")
    a("--noise-start", type=float, default=0.05, help="noise amplitude at step 0")
    a("--noise-end", type=float, default=0.01, help="noise amplitude at the last step")
    a("--use-soft-labels", action="store_true", help="KL to the target's distribution instead of CE")
    a("--mask-token-id", type=int, default=None,
      help="default: <|MASK|> from the target's added_tokens.json or tokenizer.json")
    a("--target-layer-ids", default=None, help="comma-separated tapped layers (default: DFLASH.md rule)")
    a("--num-target-taps", type=int, default=5, help="K, when --target-layer-ids is not given")
    a("--head-chunk-size", type=int, default=4096, help="lm_head rows per chunk in the loss")
    g = p.add_argument_group("run contract")
    a("--checkpoint-interval", type=int, default=1000, help="optimizer steps between checkpoints")
    a("--keep-checkpoints", type=int, default=3, help="keep the last k checkpoints")
    a("--heartbeat-interval", type=float, default=2.0, help="seconds between heartbeat.json writes")
    a("--log-interval", type=int, default=10, help="optimizer steps between log lines / metrics rows")
    p.epilog = ("environment: DFLASH_PROFILE_INTERVAL (seconds between profile.jsonl snapshots, default 60); "
                "DFLASH_SPLIT_FC_LAYERS=1 applies fc per tap and sums instead of one matmul over the "
                "concatenated taps (identical math, no K*H concatenation in memory); "
                "DFLASH_EAGER_LAYERS=1 keeps the drafter layers eager on CUDA (default 0: compiled), "
                "the way out if torch.compile fails on this machine's torch; "
                "DFLASH_EAGER_HEAD_LOSS=1 runs the head loss eagerly (default 0: compiled on CUDA).")
    return p


def config_from_args(argv: list[str] | None) -> TrainConfig:
    args = build_parser().parse_args(argv)
    kwargs = vars(args)
    kwargs["target_gpus"] = parse_gpu_list(kwargs["target_gpus"], "--target-gpus")
    kwargs["drafter_gpus"] = parse_gpu_list(kwargs["drafter_gpus"], "--drafter-gpus")
    if kwargs["target_layer_ids"] is not None:
        try:
            kwargs["target_layer_ids"] = [int(x) for x in kwargs["target_layer_ids"].split(",") if x.strip()]
        except ValueError:
            raise UsageError("--target-layer-ids must be comma-separated integers; e.g. 1,9,17") from None
    try:
        kwargs["profile_interval"] = float(os.environ.get("DFLASH_PROFILE_INTERVAL", "60"))
    except ValueError:
        raise UsageError("DFLASH_PROFILE_INTERVAL is not a number; set it to seconds, e.g. 60") from None
    kwargs["split_fc_layers"] = _env_switch("DFLASH_SPLIT_FC_LAYERS")
    kwargs["compile_layers"] = not _env_switch("DFLASH_EAGER_LAYERS")
    _env_switch("DFLASH_EAGER_HEAD_LOSS")  # checked up front; loss.compile_head_loss reads it at each call
    return TrainConfig(**kwargs)


def _env_switch(name: str) -> bool:
    """A 0/1 environment knob, off when unset; anything else is a usage error."""
    value = os.environ.get(name, "0")
    if value not in ("0", "1"):
        raise UsageError(f"{name} is {value!r}; set it to 0 or 1")
    return value == "1"


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
    try:
        cfg = config_from_args(argv)
    except SystemExit as e:  # --help
        return int(e.code or 0)
    except ValueError as e:
        return _refuse(str(e), _guess_run_dir(argv), None)

    heartbeat = Heartbeat(cfg.run_dir, cfg.heartbeat_interval)
    heartbeat.write()  # phase `loading`, before any heavy import
    heartbeat.start()

    # SIGTERM only sets a flag: the loop finishes its step, checkpoints and exits 0.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())

    try:
        validate_paths(cfg)
        from dflash_trainer import train  # heavy: torch, transformers
        status = train.run(cfg, heartbeat, stop)
    except StartupError as e:  # refusals found before weights load (train.run checks devices first)
        heartbeat.stop()
        return _refuse(str(e), cfg.run_dir, heartbeat)
    except BaseException as e:  # noqa: BLE001 - every failure must reach the heartbeat
        status = _fail(e, heartbeat)
    heartbeat.stop()
    return status


def _fail(e: BaseException, heartbeat: Heartbeat) -> int:
    traceback.print_exc()
    message = " ".join(f"{type(e).__name__}: {e}".split())
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    heartbeat.stop()
    heartbeat.set_phase("failed", error=message)
    return 130 if isinstance(e, KeyboardInterrupt) else 1


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
