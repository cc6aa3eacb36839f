"""Anchors, same-position labels and the visibility mask, checked on a real tiny drafter."""

import pytest
import torch

from dflash_trainer.model.blocks import (block_inputs, block_labels, dense_block_mask, flex_block_mask, sample_anchors,
                                   slot_weights)
from dflash_trainer.model.drafter import DFlashDrafter, DrafterConfig
from dflash_trainer.loss import dflash_loss

S = 4


def tiny_drafter(split=False, vocab=64, hidden=32, head_dim=8):
    torch.manual_seed(0)
    cfg = DrafterConfig(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=head_dim, intermediate_size=64, vocab_size=vocab, target_layer_ids=[1, 2],
                        num_target_layers=4, block_size=S, mask_token_id=vocab - 1, split_fc_layers=split)
    d = DFlashDrafter(cfg)
    torch.nn.init.normal_(d.embed_tokens.weight)
    torch.nn.init.normal_(d.lm_head.weight)
    return d


def test_anchors_eligible_sorted_unique_and_capped():
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[0, 10:30] = True
    mask[1, 5:8] = True
    anchors, valid = sample_anchors(mask, 8, torch.Generator().manual_seed(1))
    a0 = anchors[0][valid[0]]
    assert len(a0) == 8 and torch.all(a0[1:] > a0[:-1])
    assert torch.all((a0 >= 10) & (a0 <= 28))  # p and p+1 both supervised
    assert anchors[1][valid[1]].tolist() == [5, 6]
    again, _ = sample_anchors(mask, 8, torch.Generator().manual_seed(1))
    assert torch.equal(again, anchors)


def test_block_inputs_anchor_token_then_masks():
    ids = torch.arange(100, 120)[None]
    anchors = torch.tensor([[3, 9]])
    block_ids, pos = block_inputs(ids, anchors, S, mask_token_id=7)
    assert block_ids.tolist() == [[103, 7, 7, 7, 109, 7, 7, 7]]
    assert pos.tolist() == [[3, 4, 5, 6, 9, 10, 11, 12]]


def test_labels_are_same_position():
    """Slot k of the block at anchor a predicts x_{a+k}. A shifted implementation (x_{a+k+1}) fails here."""
    ids = torch.arange(100, 120)[None]
    lengths = torch.tensor([20])
    mask = torch.ones(1, 20, dtype=torch.bool)
    anchors, valid = torch.tensor([[3, 17]]), torch.tensor([[True, True]])
    labels, m = block_labels(ids, mask, lengths, anchors, valid, S)
    assert labels[0, 0].tolist() == [103, 104, 105, 106]
    assert m[0, 0].tolist() == [False, True, True, True]          # slot 0 is the given token
    assert m[0, 1].tolist() == [False, True, True, False]         # 17+3 = 20 is past the end


def test_perfect_same_position_predictions_give_zero_loss():
    """End to end through dflash_loss: hidden states that 'predict' x_{a+k} at slot k must score ~0 loss and
    accuracy 1. With shifted labels the same predictions would score accuracy ~0."""
    V = H = 32
    weight = torch.eye(V) * 30.0
    ids = torch.randint(0, V, (1, 24))
    lengths, mask = torch.tensor([24]), torch.ones(1, 24, dtype=torch.bool)
    anchors, valid = torch.tensor([[2, 8, 15]]), torch.ones(1, 3, dtype=torch.bool)
    pos = (anchors[:, :, None] + torch.arange(S)).clamp(max=23).flatten(1)
    hidden = torch.nn.functional.one_hot(ids.gather(1, pos), V).float()       # [1, Q, H]
    out = dflash_loss(hidden, weight, ids, mask, lengths, anchors, valid, S, gamma=4.0)
    assert out.loss.item() < 1e-6
    assert torch.equal(out.slot_correct[1:], out.slot_count[1:])


def test_gamma_weights():
    w = slot_weights(5, gamma=2.0)
    assert w[0] == 0
    assert torch.allclose(w[1:], torch.exp(-torch.arange(4.0) / 2.0))


def test_mask_context_strictly_before_anchor_and_own_block_only():
    anchors, valid = torch.tensor([[3, 6]]), torch.tensor([[True, False]])
    m = dense_block_mask(anchors, valid, T=10, block_size=S)[0, 0]         # [Q=8, 10+8]
    for q in range(4):
        assert m[q, :10].tolist() == [t < 3 for t in range(10)]           # never the anchor's own state
        assert m[q, 10:].tolist() == [True] * 4 + [False] * 4
    assert not m[4:, :10].any()                                          # padded anchor: no context
    assert m[4:, 14:].all() and not m[4:, 10:14].any()


def test_flex_mask_matches_dense_mask():
    from torch.nn.attention.flex_attention import create_mask

    anchors, valid = torch.tensor([[1, 5, 9], [2, 3, 0]]), torch.tensor([[True, True, True], [True, True, False]])
    T = 12
    dense = dense_block_mask(anchors, valid, T, S)
    flex = flex_block_mask(anchors, valid, T, S, make=create_mask)  # the product's mask_mod, evaluated densely
    assert torch.equal(flex, dense)


def test_compiled_block_mask_does_not_recompile_per_length():
    """Batches of ever new padded lengths: the compiled create_block_mask settles after the first graphs (static,
    then dynamic shapes) and never reaches dynamo's recompile limit, past which it would run eagerly and build
    the dense Q x (T+Q) grid. (A length dynamo guarded as a constant, e.g. a module-level int in mask_mod,
    recompiles for every length.)"""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from torch.nn.attention.flex_attention import create_block_mask

    torch._dynamo.reset()
    counters.clear()
    make = torch.compile(create_block_mask, backend="aot_eager")
    gen = torch.Generator().manual_seed(0)
    graphs = []
    for T in (229, 533, 953, 921, 289, 466, 463, 861, 981, 155):
        loss_mask = torch.ones(2, T, dtype=torch.bool)
        anchors, valid = sample_anchors(loss_mask, int(torch.randint(20, 60, (1,), generator=gen)), gen)
        flex_block_mask(anchors, valid, T, S, make=make)
        graphs.append(counters["stats"]["unique_graphs"])
    torch._dynamo.reset()
    assert graphs[-1] <= 3, graphs
    assert graphs[3:] == [graphs[3]] * len(graphs[3:]), graphs


def _run(drafter, taps, ids, anchors, valid):
    block_ids, pos = block_inputs(ids, anchors, S, drafter.cfg.mask_token_id)
    mask = dense_block_mask(anchors, valid, ids.shape[1], S)
    return drafter(taps, block_ids, pos, mask)


def test_drafter_block_sees_only_allowed_inputs():
    """Perturb what a block must not see (context at >= its anchor, another block's tokens): its output is
    unchanged. Perturb what it must see (context at anchor-1): its output changes."""
    d = tiny_drafter().eval()
    T = 16
    taps = [torch.randn(1, T, 32) for _ in range(2)]
    ids = torch.randint(0, 60, (1, T))
    anchors, valid = torch.tensor([[5, 10]]), torch.ones(1, 2, dtype=torch.bool)
    with torch.no_grad():
        base = _run(d, taps, ids, anchors, valid)
        late = [t.clone() for t in taps]
        for t in late:
            t[:, 5:] += 3.0                                   # the anchor's own state and later
        out = _run(d, late, ids, anchors, valid)
        assert torch.allclose(out[:, :S], base[:, :S], atol=1e-6)   # block 0 (anchor 5) unaffected
        assert not torch.allclose(out[:, S:], base[:, S:])          # block 1 (anchor 10) sees 5..9
        ids2 = ids.clone()
        ids2[0, 10] = (ids[0, 10] + 1) % 60                          # block 1's anchor token
        out = _run(d, taps, ids2, anchors, valid)
        assert torch.allclose(out[:, :S], base[:, :S], atol=1e-6)
        early = [t.clone() for t in taps]
        early[0][:, 4] += 3.0                                        # anchor - 1 of block 0
        out = _run(d, early, ids, anchors, valid)
        assert not torch.allclose(out[:, :S], base[:, :S])


def test_split_fc_is_identical():
    d1, d2 = tiny_drafter(split=False), tiny_drafter(split=True)
    d2.load_state_dict(d1.state_dict())
    taps = [torch.randn(2, 7, 32) for _ in range(2)]
    assert torch.allclose(d1.context(taps), d2.context(taps), atol=1e-5)


@pytest.mark.parametrize("lengths, max_anchors", [([45, 30, 17], 11), ([45], 3)])
def test_tile_padding_leaves_the_loss_unchanged(lengths, max_anchors):
    """step.pad_to_tiles (on CUDA by default, for flex attention's fixed tiles) pads the context and the anchors
    (a batch of one stays one); no block may see the padding and padded anchors carry no loss, so loss and gradients equal the unpadded ones."""
    from dflash_trainer.loop.step import drafter_micro_batch

    torch.manual_seed(0)
    d = tiny_drafter(vocab=512, hidden=64, head_dim=16)
    B, T = len(lengths), 45
    lengths = torch.tensor(lengths)
    ids = torch.randint(5, 500, (B, T))
    loss_mask = (torch.arange(T)[None, :] < lengths[:, None]) & (torch.arange(T)[None, :] >= 3)
    taps = [torch.randn(B, T, 64) for _ in range(d.cfg.num_taps)]
    last = torch.randn(B, T, 64)
    results = []
    for tile_shapes in (False, True):
        d.zero_grad()
        out = drafter_micro_batch(d, taps, last, ids, loss_mask, lengths, max_anchors=max_anchors, gamma=4.0,
                                  noise_amplitude=0.05, seed=7, head_chunk_size=64, soft_label_temperature=1.0,
                                  tile_shapes=tile_shapes)
        out.loss.backward()
        results.append((out.loss.detach(), d.fc.weight.grad.clone(), d.layers[0].mlp.up_proj.weight.grad.clone()))
    (loss, g_fc, g_up), (loss_t, g_fc_t, g_up_t) = results
    assert torch.allclose(loss, loss_t, rtol=1e-5, atol=1e-6), (loss, loss_t)
    assert torch.allclose(g_fc, g_fc_t, rtol=1e-4, atol=1e-7) and torch.allclose(g_up, g_up_t, rtol=1e-4, atol=1e-7)


def test_tile_padding_shapes():
    from dflash_trainer.loop.step import pad_to_tiles

    ids, mask = torch.ones(2, 130, dtype=torch.long), torch.ones(2, 130, dtype=torch.bool)
    anchors, valid = torch.ones(2, 9, dtype=torch.long), torch.ones(2, 9, dtype=torch.bool)
    taps, last, ids_p, mask_p, anchors_p, valid_p = pad_to_tiles(
        [torch.ones(2, 130, 8)], None, ids, mask, anchors, valid, block_size=16)
    assert taps[0].shape == (2, 256, 8) and last is None and ids_p.shape == mask_p.shape == (2, 256)
    assert not mask_p[:, 130:].any() and not taps[0][:, 130:].any()
    assert anchors_p.shape == (2, 16) and not valid_p[:, 9:].any()           # 16 anchors x 16 slots = 2 tiles
    assert pad_to_tiles([], None, ids, mask, anchors, valid, block_size=32)[4].shape == (2, 12)  # 3 tiles
    # no size of 1 in the block queries: at least two tiles (block 12: 32 anchors fill 3 tiles)
    assert pad_to_tiles([], None, ids, mask, anchors[:, :3], valid[:, :3], block_size=12)[4].shape == (2, 32)
    one = pad_to_tiles([torch.ones(1, 130, 8)], torch.ones(1, 130, 8), ids[:1], mask[:1], anchors[:1, :4],
                       valid[:1, :4], block_size=16)
    assert [t.shape for t in one[0] + [one[1]]] == [(1, 256, 8)] * 2 and one[2].shape == one[3].shape == (1, 256)
    assert one[4].shape == one[5].shape == (1, 16)  # a batch of one stays one
