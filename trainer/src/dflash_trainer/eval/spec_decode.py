"""Greedy speculative decoding with a DFlash drafter, a prompt-lookup baseline, or an oracle (docs/dflash.md,
"Drafting at inference" and "Measuring τ").

One sequence at a time, correctness first:
  prefill   the target runs the prompt x_0..x_{P-1} once (DynamicCache), giving the tapped hidden states
            of positions 0..P-1 and the first token x_P = argmax.
  step      the proposer drafts up to B-1 tokens d_1.. from [last token, MASK x (B-1)] (DFlash: one drafter
            forward over the context features of every position the target has processed so far, i.e.
            positions < the anchor, exactly as in training); the target verifies [last, d_1, ..] in one
            forward with the cache; the accepted length A is the number of leading d_k equal to the
            target's own argmax; the A drafts and the target's next choice (the bonus token) are
            appended; the cache is cropped back to the kept positions and their taps are kept.
τ = mean of (A + 1) over verification steps, so 1 <= τ <= B. Greedy verification makes the output equal
the target's own greedy decode token for token; `reference_greedy` (transformers' generate, an
independent implementation) is what evaluate.py compares against.

Legend: T context positions processed by the target, H hidden, K taps, B block size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch


@dataclass
class DecodeResult:
    tokens: list[int]                      # generated tokens (not the prompt), cut at the first EOS
    accept_lengths: list[int] = field(default_factory=list)   # A + 1 per verification step
    num_proposed: list[int] = field(default_factory=list)     # drafts offered per step
    num_target_forwards: int = 0           # prefill included
    wall_s: float = 0.0
    step_times: list[tuple[float, float, float]] = field(default_factory=list)
    """Per verification step: (drafting, verify forward incl. its greedy choice, bookkeeping) seconds.
    Exact per phase only with profile=True (CUDA work is then synchronized at each step's end)."""
    anchor_lengths: list[int] = field(default_factory=list)
    """A replay's (replay.py) only: the accept length a step would get at each token of the output as its anchor,
    visited by the decode or not (index j: the anchor is output token j)."""


class Proposer:
    """Drafts tokens; `layer_ids` not None means it wants the target's tapped hidden states."""

    layer_ids: list[int] | None = None

    def propose(self, tokens: list[int], taps: list[torch.Tensor] | None, num: int) -> list[int]:
        raise NotImplementedError


class NoDraft(Proposer):
    """Plain greedy decoding through the same loop (one token per target forward)."""

    def propose(self, tokens, taps, num):
        return []


class OracleProposer(Proposer):
    """Proposes a known continuation (e.g. the target's own greedy output): the 'perfect drafter' in tests."""

    def __init__(self, full_sequence: list[int]):
        self.full = list(full_sequence)

    def propose(self, tokens, taps, num):
        return self.full[len(tokens):len(tokens) + num]


PROMPT_LOOKUP_NGRAM = 3  # the baseline's longest n-gram: dflash-eval's --ngram default, the proof's baseline


class PromptLookupProposer(Proposer):
    """Training-free n-gram drafting: find the most recent earlier occurrence of the last n tokens
    (n = max_ngram down to min_ngram) in prompt + output and propose the tokens that followed it."""

    def __init__(self, max_ngram: int = PROMPT_LOOKUP_NGRAM, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("--ngram must be >= 1 (min_ngram <= max_ngram)")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def propose(self, tokens, taps, num):
        if num <= 0:
            return []
        n_tok = len(tokens)
        for n in range(min(self.max_ngram, n_tok - 1), self.min_ngram - 1, -1):
            pattern = tokens[n_tok - n:]
            # start i of an earlier match, most recent first; the match must leave at least one token after it
            for i in range(n_tok - n - 1, -1, -1):
                if tokens[i:i + n] == pattern:
                    follow = tokens[i + n:i + n + num]
                    if follow:
                        return follow
        return []


class DFlashProposer(Proposer):
    """One drafter forward over [last token, MASK x (B-1)] at positions T..T+B-1, context = taps of 0..T-1."""

    def __init__(self, drafter, cuda_graphs: bool = False, graph_bucket: int | None = None):
        """cuda_graphs: the block forward padded to context buckets and replayed from CUDA graphs
        (eval/draft_graphs.py), as a server runs its drafter; drafts may differ by rounding, outputs not."""
        self.drafter = drafter
        self.layer_ids = list(drafter.cfg.target_layer_ids)
        self.block_size = drafter.cfg.block_size
        self.mask_token_id = drafter.cfg.mask_token_id
        self.graphs = None
        if cuda_graphs:
            from dflash_trainer.eval.draft_graphs import DEFAULT_BUCKET, GraphedBlock
            self.graphs = GraphedBlock(drafter, graph_bucket or DEFAULT_BUCKET)

    @torch.no_grad()
    def propose(self, tokens, taps, num):
        if num <= 0:
            return []
        if self.graphs is not None:
            assert taps[0].shape[0] == len(tokens) - 1, "the target has processed every token but the last"
            return self.graphs.drafts(tokens[-1], taps)[:num].tolist()
        return self.block_logits(tokens, taps)[1:1 + num].argmax(-1).tolist()

    @torch.no_grad()
    def block_logits(self, tokens, taps) -> torch.Tensor:
        """Logits [B, V] of the block anchored at the last token (slot 0 included, for tests)."""
        d = self.drafter
        device = d.fc.weight.device
        B = self.block_size
        T = taps[0].shape[0]
        assert T == len(tokens) - 1, "the target has processed every token but the last"
        ids = torch.full((1, B), self.mask_token_id, dtype=torch.long, device=device)
        ids[0, 0] = tokens[-1]
        pos = torch.arange(T, T + B, device=device)[None]
        ctx = [t[None].to(device=device, dtype=d.fc.weight.dtype) for t in taps]
        # no mask: the block sees all context (every position < the anchor) and the whole block
        return d.logits(d(ctx, ids, pos, None)[0])


def _new_cache(model):
    from transformers import DynamicCache
    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


def _target_forward(model, ids: list[int], cache, layer_ids, device):
    out = model(input_ids=torch.tensor([ids], device=device), past_key_values=cache, use_cache=True,
                output_hidden_states=layer_ids is not None)
    taps = [out.hidden_states[i + 1][0] for i in layer_ids] if layer_ids is not None else None
    return out.logits[0], taps


@torch.no_grad()
def speculative_decode(model, prompt: list[int], proposer: Proposer, block_size: int, max_new_tokens: int,
                       eos_ids: set[int] | frozenset = frozenset(), profile: bool = False) -> DecodeResult:
    """Greedy decode of `prompt` with `proposer` drafting up to block_size-1 tokens per target forward.
    profile: synchronize CUDA at the end of every step so step_times attribute GPU work to its phase."""
    if block_size < 1 or max_new_tokens < 1 or not prompt:
        raise ValueError("need a non-empty prompt, --block-size >= 1 and --max-new-tokens >= 1")
    device = next(model.parameters()).device
    layer_ids = proposer.layer_ids
    t0 = time.perf_counter()
    cache = _new_cache(model)
    logits, taps = _target_forward(model, prompt, cache, layer_ids, device)
    result = DecodeResult(tokens=[int(logits[-1].argmax())], num_target_forwards=1)
    tokens = list(prompt) + result.tokens
    while len(result.tokens) < max_new_tokens and result.tokens[-1] not in eos_ids:
        remaining = max_new_tokens - len(result.tokens)
        t_draft = time.perf_counter()
        draft = proposer.propose(tokens, taps, min(block_size - 1, remaining - 1))
        t_verify = time.perf_counter()
        block = [tokens[-1]] + list(draft)
        logits, new_taps = _target_forward(model, block, cache, layer_ids, device)
        result.num_target_forwards += 1
        choice = logits.argmax(-1).tolist()  # the host copy waits for the verify forward
        t_book = time.perf_counter()
        accepted = 0
        while accepted < len(draft) and draft[accepted] == choice[accepted]:
            accepted += 1
        new = list(draft[:accepted]) + [choice[accepted]]
        for j, tok in enumerate(new):  # stop at EOS even inside an accepted run
            if tok in eos_ids:
                new = new[:j + 1]
                break
        # keep the cache and taps of block slots 0..accepted (their tokens are final); drop the rest
        drop = len(block) - (accepted + 1)
        if drop > 0:
            cache.crop(-drop)
        if taps is not None:
            taps = [torch.cat([t, n[:accepted + 1]], dim=0) for t, n in zip(taps, new_taps)]
        result.accept_lengths.append(len(new))
        result.num_proposed.append(len(draft))
        tokens += new
        result.tokens += new
        if profile and device.type == "cuda":
            torch.cuda.synchronize(device)
        t_end = time.perf_counter()
        result.step_times.append((t_verify - t_draft, t_book - t_verify, t_end - t_book))
    result.tokens = result.tokens[:max_new_tokens]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    result.wall_s = time.perf_counter() - t0
    return result


@torch.no_grad()
def reference_greedy(model, prompt: list[int], max_new_tokens: int, eos_ids=frozenset(),
                     static_cache: bool = False) -> DecodeResult:
    """The target's own greedy decode via transformers' generate (independent of the loop above).
    static_cache: generate's static KV cache; generate's own automatic compilation stays off, so the caller
    decides compilation for both decoding paths alike (serve_bench)."""
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    eos = sorted(eos_ids)
    extra = {"cache_implementation": "static", "disable_compile": True} if static_cache else {}
    gen = GenerationConfig(max_new_tokens=max_new_tokens, min_new_tokens=0, do_sample=False, num_beams=1,
                           eos_token_id=eos or None, pad_token_id=eos[0] if eos else 0, **extra)
    t0 = time.perf_counter()
    ids = torch.tensor([prompt], device=device)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    tokens = out[0, len(prompt):].tolist()
    for j, tok in enumerate(tokens):
        if tok in eos_ids:
            tokens = tokens[:j + 1]
            break
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return DecodeResult(tokens=tokens, num_target_forwards=len(tokens), wall_s=time.perf_counter() - t0)


def summarize(results: list[DecodeResult], block_size: int) -> dict:
    """τ, histogram of A+1, per-slot acceptance, tokens per target forward, wall time."""
    lengths = [a for r in results for a in r.accept_lengths]
    steps = len(lengths)
    new_tokens = sum(len(r.tokens) for r in results)
    forwards = sum(r.num_target_forwards for r in results)
    wall = sum(r.wall_s for r in results)
    hist = [0] * (block_size + 1)
    for a in lengths:
        hist[min(a, block_size)] += 1
    # slot k (1..B-1) is accepted in a step iff A >= k, i.e. accept length >= k + 1
    reach = [sum(1 for a in lengths if a >= k + 1) / steps if steps else 0.0 for k in range(1, block_size)]
    cond = []
    prev = 1.0
    for r in reach:
        cond.append(r / prev if prev > 0 else 0.0)
        prev = r
    return {
        "tau": sum(lengths) / steps if steps else None,
        "num_steps": steps,
        "num_new_tokens": new_tokens,
        "num_target_forwards": forwards,
        "tokens_per_target_forward": new_tokens / forwards if forwards else None,
        "accept_length_histogram": {str(k): hist[k] for k in range(1, block_size + 1)},
        "slot_accept_rate": [round(x, 4) for x in reach],
        "slot_accept_rate_conditional": [round(x, 4) for x in cond],
        "mean_proposed": (sum(n for r in results for n in r.num_proposed) / steps) if steps else None,
        "wall_s": round(wall, 3),
        "tokens_per_s": new_tokens / wall if wall > 0 else None,
        # per prompt, in order: verification steps and accepted length (τ of a group = sum accepted / sum steps)
        "prompt_steps": [len(r.accept_lengths) for r in results],
        "prompt_accepted": [sum(r.accept_lengths) for r in results],
    }
