"""Decoding spread over several processes on one device: dflash-eval --workers K and the proof's --eval-workers.

Greedy decoding one sequence at a time of a small target is bound by the host (Python and kernel launches, ~22 ms
per forward of SmolLM2-135M on an H200), not by the device: K processes, each with its own copy of the target (and
of the drafter being measured), decode K prompts at once on the same device. Each task is one prompt (the pool
balances prompts of different lengths); results come back in prompt order, so every figure of a report is the same
as one process's (references, τ, histograms, losslessness), except times: `wall_s` and `tokens_per_s` are per
decoding stream, each stream sharing the device with the K - 1 others. For targets that fit K times on the device.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

import torch

from .spec_decode import DecodeResult

# The worker process's state (set by _start, one target per process; the drafter of the latest task's path)
_STATE: dict = {}


def _start(target_dir: str, device: str, dtype: str, threads: int) -> None:
    from .evaluate import load_target
    torch.set_num_threads(threads)
    _STATE.update(device=torch.device(device), dtype=getattr(torch, dtype), drafter=None, drafter_path=None)
    _STATE["model"], _ = load_target(target_dir, _STATE["device"], _STATE["dtype"])


def _proposer(spec: tuple):
    from .evaluate import load_drafter
    from .spec_decode import DFlashProposer, PromptLookupProposer
    kind, arg = spec
    if kind == "prompt_lookup":
        return PromptLookupProposer(arg)
    if _STATE["drafter_path"] != arg:  # a new snapshot: the one drafter this process keeps
        _STATE["drafter"] = load_drafter(arg, _STATE["model"], _STATE["device"], _STATE["dtype"])
        _STATE["drafter_path"] = arg
    return DFlashProposer(_STATE["drafter"])


def _decode(task: tuple) -> DecodeResult:
    from .spec_decode import reference_greedy, speculative_decode
    spec, prompt, block_size, max_new_tokens, eos = task
    if spec is None:
        return reference_greedy(_STATE["model"], prompt, max_new_tokens, eos)
    return speculative_decode(_STATE["model"], prompt, _proposer(spec), block_size, max_new_tokens, eos)


class DecodePool:
    """`workers` processes on `device`, each loading the target from `target_dir` once. decode() takes a proposer
    spec: None (the target's own greedy decode through generate, the reference), ("prompt_lookup", n) or
    ("dflash", export or checkpoint path)."""

    def __init__(self, target_dir: str, device: torch.device | str, dtype: torch.dtype, workers: int):
        if workers < 2:
            raise ValueError("--workers must be at least 2 for a pool (1: decode in this process)")
        device = torch.device(device)
        # each process a share of the cores on the CPU; on a GPU one thread each is enough to launch kernels
        threads = max(1, torch.get_num_threads() // workers) if device.type == "cpu" else 1
        ctx = torch.multiprocessing.get_context("spawn")  # CUDA in the children needs spawn
        self.workers = workers
        self._pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start,
                                         initargs=(os.path.abspath(target_dir), str(device),
                                                   str(dtype).removeprefix("torch."), threads))

    def decode(self, spec: tuple | None, prompts: list[list[int]], block_size: int, max_new_tokens: int,
               eos: set[int]):
        """DecodeResults in prompt order, yielded as they are ready in that order."""
        tasks = [(spec, p, block_size, max_new_tokens, set(eos)) for p in prompts]
        return self._pool.map(_decode, tasks)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
