"""Attention backend for decoding on CUDA: scaled_dot_product_attention kept off cuDNN.

With an explicit mask (a verify block over a KV cache, a padded batch, the drafter's block), torch 2.11 may
route SDPA to cuDNN first on Hopper and later GPUs. cuDNN builds an execution plan for every new shape, and
decoding changes shape at every step (the cache grows), so each step pays a plan build that a second pass
over the same lengths does not (the serve benchmark's timed pass ran 44.8 ms/step against 30.1 for the
same steps repeated). Flash / memory-efficient attention have no per-shape plan."""

from __future__ import annotations

import torch


def use_plan_free_attention(device: torch.device | str) -> None:
    """Process-wide: take cuDNN out of SDPA's backend choice when decoding on CUDA (no effect elsewhere)."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)
