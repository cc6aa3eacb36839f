"""The whole micro-batch path (target taps -> drafter -> chunked loss -> AdamW) learns a fixed tiny batch."""

import torch

from dflash_trainer.data.batches import BatchLoader, TokenizedDataset
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig
from dflash_trainer.loop.step import drafter_micro_batch
from dflash_trainer.model.target import FrozenTarget


def _loss_curve(tiny, soft, steps=40):
    torch.manual_seed(0)
    target = FrozenTarget(tiny["target"], torch.device("cpu"), [1, 3, 5], need_last_hidden=soft)
    cfg = DrafterConfig.from_target(target.config, 1, [1, 3, 5], block_size=4, mask_token_id=511)
    drafter = DFlashDrafter(cfg)
    drafter.load_frozen(target.embed_weight(), target.lm_head_weight())
    batch = BatchLoader(TokenizedDataset(tiny["data"], 128), 0, 512, 4).next_batch()
    taps, last = target(batch.input_ids)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for step in range(steps):
        out = drafter_micro_batch(drafter, taps, last, batch.input_ids, batch.loss_mask, batch.lengths,
                                  max_anchors=16, gamma=4.0, noise_amplitude=0.01, seed=step, head_chunk_size=64,
                                  soft_label_temperature=1.0)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    return losses


def test_hard_label_loss_decreases(tiny):
    losses = _loss_curve(tiny, soft=False)
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, losses


def test_soft_label_loss_decreases(tiny):
    losses = _loss_curve(tiny, soft=True, steps=30)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses
