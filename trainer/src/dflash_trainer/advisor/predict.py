"""The advisor's arithmetic, stdlib only: seconds per sequence of each stage -> each split's predicted rate.

A target rank holds the whole target on `per_rank` GPUs (its layers one after the other, so a sequence takes the
one-GPU time) and a drafter rank trains on one GPU; the stages run at the same time and the hidden-state queue
decouples them, so a job's rate is the slower stage's: min(target ranks / s_target, drafter ranks / s_drafter)
sequences per second. Ranks that share one GPU (a target and a drafter on the same index, as on a one-GPU host)
take turns: 1 / (s_target + s_drafter) for the pair.
"""

from __future__ import annotations

WARN_BELOW_BEST = 0.15  # the configured split predicted this much below the best: training_status warns


def split_rate(target_gpus: int, drafter_gpus: int, s_target: float, s_drafter: float, per_rank: int = 1) -> dict:
    """Predicted sequences/s of a job of `target_gpus` target and `drafter_gpus` drafter GPUs (disjoint)."""
    target = (target_gpus // per_rank) / s_target
    drafter = drafter_gpus / s_drafter
    return {"target_gpus": target_gpus, "drafter_gpus": drafter_gpus, "target_seq_per_s": target,
            "drafter_seq_per_s": drafter, "seq_per_s": min(target, drafter),
            "bound_by": "target" if target < drafter else "drafter"}


def shared_rate(pairs: int, s_target: float, s_drafter: float) -> dict:
    """`pairs` GPUs each holding one target and one drafter rank."""
    rate = pairs / (s_target + s_drafter)
    return {"target_gpus": pairs, "drafter_gpus": pairs, "shared": True, "target_seq_per_s": pairs / s_target,
            "drafter_seq_per_s": pairs / s_drafter, "seq_per_s": rate,
            "bound_by": "target" if s_target > s_drafter else "drafter"}


def splits(gpus: int, s_target: float, s_drafter: float, per_rank: int = 1) -> list[dict]:
    """Every split of `gpus` GPUs into whole target ranks and at least one drafter GPU."""
    return [split_rate(t, gpus - t, s_target, s_drafter, per_rank)
            for t in range(per_rank, gpus, per_rank)]


def verdict(configured: dict, best: dict) -> str | None:
    """The warning when the configured split is predicted >= WARN_BELOW_BEST below the best, else None."""
    if configured["seq_per_s"] > (1 - WARN_BELOW_BEST) * best["seq_per_s"] or not configured["seq_per_s"]:
        return None
    return (f"the configured split ({configured['target_gpus']} target + {configured['drafter_gpus']} drafter "
            f"GPUs) is predicted at {configured['seq_per_s']:.2f} seq/s, {configured['bound_by']}-bound; "
            f"{best['target_gpus']} + {best['drafter_gpus']} would give {best['seq_per_s']:.2f} "
            f"({best['seq_per_s'] / configured['seq_per_s']:.2f}x): set --target-gpus/--drafter-gpus to that split "
            f"(dflash-train --plan)")


def deepest_queue(available_bytes: int, batch_bytes: int, drafter_ranks: int) -> int:
    """The deepest --hs-queue-depth whose full queues fit the host memory (hs_queue.check_host_memory's rule)."""
    return available_bytes // (batch_bytes * max(1, drafter_ranks))
