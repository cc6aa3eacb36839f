"""Atomic checkpoints: checkpoints/step-N dirs plus a `latest` file naming the newest complete one.

Write order, so that a kill at any instant leaves a loadable `latest`:
  1. everything into checkpoints/.tmp-step-N, each file fsynced, then the directory fsynced;
  2. rename .tmp-step-N -> step-N (atomic), fsync checkpoints/;
  3. `latest` rewritten via a temp file + os.replace (atomic), fsync checkpoints/;
  4. older step-N dirs beyond keep-last-k removed: each renamed to .pruning-step-N (atomic) before it is deleted,
     so a kill mid-delete leaves a .pruning-* directory, never a half-deleted step-N.
A .tmp-* or .pruning-* directory is never loaded. What a killed process leaves (those, and an incomplete step-N
that an older trainer's prune left) is removed at start (clean_leftovers) and at each save, never the step-N
`latest` names nor a complete one; each removal is logged with its bytes.
A write that fails (a full disk: ENOSPC from a file, or torch.save's RuntimeError for it) removes what it wrote,
leaves `latest` on the previous complete checkpoint and raises CheckpointWriteError, whose one line names the
directory, the bytes free there and the bytes the checkpoint needs.

A checkpoint holds: model.safetensors (the trainable drafter weights, export key names),
drafter_config.json (to rebuild the drafter), train_state.pt (optimizer, scheduler, data position,
RNG states, step, run config).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import time

import torch
from safetensors.torch import load_file, save_file

from dflash_trainer.config.paths import tree_bytes
from dflash_trainer.failures import ExplainedFailure

STEP_DIR = re.compile(r"^step-(\d+)$")
FILES = ("model.safetensors", "drafter_config.json", "train_state.pt")


def _fsync(path: str) -> None:
    """fsync a file's data or a directory's entries (both are opened read-only for it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoints_dir(output_dir: str) -> str:
    return os.path.join(output_dir, "checkpoints")


class CheckpointWriteError(ExplainedFailure):
    """A checkpoint that could not be written; its partial files are already removed."""


def tensor_bytes(tree) -> int:
    """Bytes of the tensors in nested dicts/lists/tuples: what a checkpoint of them needs at least on disk."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tensor_bytes(v) for v in tree)
    return 0


def _latest_name(root: str) -> str | None:
    try:
        with open(os.path.join(root, "latest")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _complete(path: str) -> bool:
    return all(os.path.isfile(os.path.join(path, f)) for f in FILES)


def leftovers(root: str) -> list[str]:
    """Names under checkpoints/ that no load ever reads and only a killed process leaves: .tmp-* (a save cut
    short), .pruning-* (a prune cut short), .latest.tmp, and step-N dirs missing a file (an older trainer's prune
    cut short); never the step-N `latest` names, never a complete one."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    latest = _latest_name(root)
    found = []
    for name in sorted(names):
        path = os.path.join(root, name)
        if name.startswith((".tmp-", ".pruning-")) or name == ".latest.tmp":
            found.append(name)
        elif STEP_DIR.match(name) and name != latest and os.path.isdir(path) and not _complete(path):
            found.append(name)
    return found


def clean_leftovers(root: str, say=None) -> int:
    """Remove leftovers(root), saying what and how many bytes; returns the bytes freed."""
    freed = 0
    for name in leftovers(root):
        path = os.path.join(root, name)
        size = tree_bytes(path)
        try:
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        except FileNotFoundError:
            continue
        freed += size
        if say is not None:
            say(f"removed {path} ({size} bytes): left by a killed save or prune")
    return freed


def save_checkpoint(output_dir: str, step: int, model_state: dict[str, torch.Tensor], drafter_config: dict,
                    train_state: dict, keep: int, say=None) -> str:
    """`say` (a log function) hears of each leftover removed."""
    root = checkpoints_dir(output_dir)
    previous = _latest_name(root)
    try:
        os.makedirs(root, exist_ok=True)
        clean_leftovers(root, say)
        final = _write(root, step, model_state, drafter_config, train_state, keep)
        clean_leftovers(root, say)  # an incomplete step-N is never pruned by count: it goes here
        return final
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as RuntimeError (inline_container)
        # free space as the write found it: after the partial files go, the disk can hold more than the tensors'
        # bytes (which undercount the archive), and torch's short-write text ("unexpected pos") names no ENOSPC
        free = shutil.disk_usage(root if os.path.isdir(root) else output_dir).free
        _remove_partial(root, step)
        needed = tensor_bytes(model_state) + tensor_bytes(train_state)
        reason = " ".join(str(e).split())[:200]
        short_write = "unexpected pos" in reason or "file write failed" in reason  # torch's zip writer, disk full
        if getattr(e, "errno", None) == errno.ENOSPC or short_write or free < needed:  # torch's text never says so
            reason = f"no space left on device ({reason})"
        kept = f"`latest` stays {previous}" if previous else "no earlier checkpoint exists"
        raise CheckpointWriteError(
            f"checkpoint step-{step} could not be written in {root}: {reason}; {free} bytes free there, "
            f"about {needed} needed; the partial checkpoint was removed and {kept}; free space there (or give "
            f"--output-dir on a larger disk) and start the run again to resume") from e


def _remove_partial(root: str, step: int) -> None:
    """What a failed save leaves: its temp dir and temp `latest`, and its step dir unless `latest` names it."""
    shutil.rmtree(os.path.join(root, f".tmp-step-{step}"), ignore_errors=True)
    try:
        os.unlink(os.path.join(root, ".latest.tmp"))
    except OSError:
        pass
    if _latest_name(root) != f"step-{step}":
        shutil.rmtree(os.path.join(root, f"step-{step}"), ignore_errors=True)


def _write(root: str, step: int, model_state: dict[str, torch.Tensor], drafter_config: dict, train_state: dict,
           keep: int) -> str:
    tmp = os.path.join(root, f".tmp-step-{step}")
    final = os.path.join(root, f"step-{step}")
    os.makedirs(tmp)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in model_state.items()},
              os.path.join(tmp, "model.safetensors"))
    with open(os.path.join(tmp, "drafter_config.json"), "w") as f:
        json.dump(drafter_config, f, indent=2)
    torch.save(train_state, os.path.join(tmp, "train_state.pt"))
    for name in FILES:
        _fsync(os.path.join(tmp, name))
    _fsync(tmp)

    pause = float(os.environ.get("DFLASH_DEBUG_CHECKPOINT_PAUSE_S", "0"))
    if pause > 0:  # test hook: widens the window in which a kill hits a half-finished checkpoint
        time.sleep(pause)

    if os.path.exists(final):  # the same step saved twice (e.g. SIGTERM right after a periodic save)
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync(root)
    latest_tmp = os.path.join(root, ".latest.tmp")
    with open(latest_tmp, "w") as f:
        f.write(f"step-{step}\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(latest_tmp, os.path.join(root, "latest"))
    _fsync(root)
    prune(root, keep, protect=f"step-{step}")
    return final


def list_steps(root: str) -> list[tuple[int, str]]:
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        match = STEP_DIR.match(name)
        if match and all(os.path.isfile(os.path.join(root, name, f)) for f in FILES):
            found.append((int(match.group(1)), os.path.join(root, name)))
    return sorted(found)


def prune(root: str, keep: int, protect: str) -> None:
    """All but the newest `keep` complete step-N dirs, each renamed out of the way first: a kill mid-delete leaves
    a .pruning-step-N that clean_leftovers removes, never a step-N missing a file."""
    steps = list_steps(root)
    for _, path in steps[:-keep] if keep > 0 else []:
        name = os.path.basename(path)
        if name != protect:
            doomed = os.path.join(root, f".pruning-{name}")
            os.rename(path, doomed)
            pause = float(os.environ.get("DFLASH_DEBUG_PRUNE_PAUSE_S", "0"))
            if pause > 0:  # test hook: widens the window in which a kill hits a prune
                time.sleep(pause)
            shutil.rmtree(doomed, ignore_errors=True)


def find_latest(output_dir: str) -> str | None:
    """The directory `latest` names; if it is missing or incomplete, the highest complete step-N."""
    root = checkpoints_dir(output_dir)
    latest = os.path.join(root, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            name = f.read().strip()
        path = os.path.join(root, name)
        if STEP_DIR.match(name) and all(os.path.isfile(os.path.join(path, f)) for f in FILES):
            return path
    steps = list_steps(root)
    return steps[-1][1] if steps else None


def load_checkpoint(path: str, map_location="cpu") -> tuple[dict[str, torch.Tensor], dict, dict]:
    """Returns (model_state, drafter_config dict, train_state)."""
    model_state = load_file(os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "drafter_config.json")) as f:
        drafter_config = json.load(f)
    train_state = torch.load(os.path.join(path, "train_state.pt"), map_location=map_location, weights_only=False)
    return model_state, drafter_config, train_state
