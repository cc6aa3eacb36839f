"""The drafter's block forward replayed from CUDA graphs, as a server runs a drafter (DFlashProposer(cuda_graphs=True)).

Decoding one sequence eagerly pays host time per kernel: SmolLM2's five-layer drafter launches about 190 a block
forward, 3.9 ms of a 29.6 ms speculative step on an H100 where its GPU work is a fraction of that (PROOF.md run 27).
A CUDA graph launches a whole forward at once, but it replays fixed shapes while the context grows by the accepted
tokens every step. So the context is padded to a bucket of `bucket` positions and a mask hides the padding; one
graph per bucket, captured at the bucket's first use. Per step, outside the graph: one copy of the taps into the
bucket's buffer, the anchor token and the context length written in place; then the replay, which ends with the
drafts' argmax in a buffer of its own.

With the mask, SDPA runs its math backend (grouped KV heads, a mask) instead of flash attention: more kernels, but
inside a graph they cost their GPU time only. Padded keys are masked, so the result is the unpadded forward's up to
rounding (the padded positions' rows change no unmasked value; the attention kernel differs): drafts, not outputs,
can change (the target verifies every token). `capture=False` runs the same padded forward without graphs: the
CPU tests check it against the unpadded one.

Legend: T context positions, C bucket capacity (T <= C), B block size, K taps, H hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_trainer.model.drafter import context_vector, draft_hidden, rope_follows_length

DEFAULT_BUCKET = 256  # context positions a graph grows by: few graphs for a few thousand positions, little padding


def padded_block_logits(d, ctx_CKH: torch.Tensor, ids_B: torch.Tensor, num_ctx: torch.Tensor) -> torch.Tensor:
    """Logits [B, V] of the block [1, B] anchored after the first `num_ctx` ([1] int64, on the device) of the C
    context rows of ctx_CKH [1, C, K*H] (the taps side by side); rows from num_ctx on are padding, masked."""
    C, B = ctx_CKH.shape[1], ids_B.shape[1]
    H = d.cfg.hidden_size
    taps = [ctx_CKH[..., i * H:(i + 1) * H] for i in range(d.cfg.num_taps)]
    block_pos = num_ctx[:, None] + torch.arange(B, device=ids_B.device)[None]  # [1, B]
    key = torch.arange(C + B, device=ids_B.device)
    mask = ((key < num_ctx) | (key >= C)).view(1, 1, 1, C + B)  # the valid context and the whole block
    hidden = draft_hidden(d, context_vector(d, taps), d.embed_tokens(ids_B), block_pos, mask)
    return d.logits(hidden[0])


@dataclass
class _Bucket:
    ctx: torch.Tensor                    # [1, C, K*H] the taps, written per step (rows >= T: padding)
    ids: torch.Tensor                    # [1, B] anchor token, then MASK
    num_ctx: torch.Tensor                # [1] int64: T
    drafts: torch.Tensor                 # [B-1] argmax of slots 1.. (the graph's output)
    graph: object = None


class GraphedBlock:
    """Drafts of one block from the padded forward, replayed from a CUDA graph per context bucket."""

    def __init__(self, drafter, bucket: int = DEFAULT_BUCKET, capture: bool = True):
        if bucket < 1:
            raise ValueError("the context bucket must be >= 1 positions")
        cfg = drafter.cfg
        self.drafter, self.bucket, self.capture = drafter, bucket, capture
        self.device = drafter.fc.weight.device
        if capture and rope_follows_length(cfg):
            # their frequencies follow the sequence's length, read on the host: no replay can hold that
            raise ValueError(f"CUDA graphs of the drafter need a rotary embedding of fixed frequencies; rope_type "
                             f"{cfg.rope_parameters['rope_type']!r} depends on the length: decode without them")
        if capture and self.device.type != "cuda":
            raise ValueError("CUDA graphs of the drafter need it on a CUDA device")
        self.dtype = drafter.fc.weight.dtype
        self._buckets: dict[int, _Bucket] = {}
        self.captured = 0  # graphs captured so far (a caller's warm-up should leave none for its timed passes)

    @torch.no_grad()
    def drafts(self, last_token: int, taps: list[torch.Tensor]) -> torch.Tensor:
        """Argmax of block slots 1..B-1 [B-1] (on the device) for the context of `taps` (K x [T, H]): the bucket's
        own buffer, which the next call overwrites (read it first)."""
        T = taps[0].shape[0]
        b = self._bucket_for(max(T, 1))
        torch.cat([t.to(self.dtype) for t in taps], dim=-1, out=b.ctx[0, :T])
        b.ids[0, :1].fill_(last_token)
        b.num_ctx.fill_(T)
        if b.graph is None:
            b.drafts.copy_(self._forward(b))
        else:
            b.graph.replay()
        return b.drafts

    def _bucket_for(self, T: int) -> _Bucket:
        C = -(-T // self.bucket) * self.bucket
        if C not in self._buckets:
            self._buckets[C] = self._new_bucket(C)
        return self._buckets[C]

    def _forward(self, b: _Bucket) -> torch.Tensor:
        return padded_block_logits(self.drafter, b.ctx, b.ids, b.num_ctx)[1:].argmax(-1)

    def _new_bucket(self, C: int) -> _Bucket:
        cfg = self.drafter.cfg
        ids = torch.full((1, cfg.block_size), cfg.mask_token_id, dtype=torch.long, device=self.device)
        b = _Bucket(ctx=torch.zeros(1, C, cfg.num_taps * cfg.hidden_size, dtype=self.dtype, device=self.device),
                    ids=ids, num_ctx=torch.ones(1, dtype=torch.long, device=self.device),
                    drafts=torch.zeros(cfg.block_size - 1, dtype=torch.long, device=self.device))
        if not self.capture:
            return b
        # the usual recipe: a few runs on a side stream (allocations, lazy inits, kernel choice), then the capture
        # (each graph with its own memory pool: a few MB of a forward's intermediates, and no replay order to keep)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                b.drafts.copy_(self._forward(b))
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            b.drafts.copy_(self._forward(b))
        b.graph = graph
        self.captured += 1
        return b
