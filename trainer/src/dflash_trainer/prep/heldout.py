"""Held-out prompts that no training data may contain, and the one check that keeps them out.

other_styles.jsonl (next to this file, shipped with the package) holds prompts written for this project (issue
34) in styles the SmolLM2 proof never trains on: everyday requests, rewriting and editing, code in other
languages than Python, arithmetic word problems, advice, short factual questions, multi-sentence instructions,
comparisons, planning, creative requests. Each row is {"messages": [{"role": "user", "content": ...}], "style":
...}, the shape dflash-eval reads. The proof evaluates every snapshot on it beside its own held-out split (its τ
there measures the drafter on prompts unlike its training data); dflash-prepare-data refuses any row that
overlaps it (reason `held_out`).

Overlap, one rule for both uses: a text overlaps a held-out prompt when they share a run of NGRAM tokens, or when
the held-out prompt is shorter than NGRAM tokens and appears whole in the text. The tokens are `words` (lowercase
runs of letters and digits) unless a caller passes another tokenizer (the proof's test also checks with
SmolLM2's). `template_problems` adds the check against prompt templates: no held-out prompt may be produced by or
contain a template (its fixed text with any filling)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable

from .chat_tokens import prompt_messages

NGRAM = 8
OTHER_STYLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "other_styles.jsonl")


def words(text: str) -> list[str]:
    """The word tokenizer: lowercase runs of letters and digits (punctuation and spacing never matter)."""
    return re.findall(r"\w+", text.lower())


def prompt_text(row) -> str:
    """A prompt row as one text: the contents of its prompt messages ({"messages"}: chat_tokens.prompt_messages, as
    dflash-eval reads them), or its "prompt"/"text" string, or the row itself if it is a string."""
    if isinstance(row, str):
        return row
    if "messages" in row:
        return "\n".join(m["content"] for m in prompt_messages(row["messages"]))
    return row.get("prompt", row.get("text", ""))


def load_prompts(path: str, what: str = "held-out prompts") -> list[str]:
    """The prompts of a JSONL file (one row a line, in the shapes prompt_text reads); a one-line error, starting with
    `what` and the path, for a file that is missing or holds another shape."""
    if not os.path.isfile(path):
        raise ValueError(f"{what} {path}: no such file; pass a JSONL of prompts")
    prompts = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    prompts.append(prompt_text(json.loads(line)))
                except (ValueError, KeyError, TypeError, AttributeError):
                    raise ValueError(f"{what} {path}:{n}: not a JSON row with messages, prompt or text; "
                                     "fix that line") from None
    return prompts


def _grams(tokens, n: int) -> Iterable[tuple]:
    return (tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


class HeldOut:
    """An index of held-out prompts: `overlap(text)` names the first held-out prompt a text overlaps, or None."""

    def __init__(self, prompts: list[str], tokenize: Callable[[str], list] = words, n: int = NGRAM):
        self.prompts, self.tokenize, self.n = prompts, tokenize, n
        self.grams: dict[tuple, int] = {}       # each n-gram of a held-out prompt -> that prompt's index
        self.short: dict[int, dict[tuple, int]] = {}  # length k < n -> {a whole short prompt's tokens: index}
        for i, text in enumerate(prompts):
            tokens = tokenize(text)
            if len(tokens) >= n:
                for g in _grams(tokens, n):
                    self.grams.setdefault(g, i)
            elif tokens:
                self.short.setdefault(len(tokens), {}).setdefault(tuple(tokens), i)

    @classmethod
    def from_files(cls, paths: list[str], tokenize: Callable[[str], list] = words, n: int = NGRAM) -> "HeldOut":
        return cls([p for path in paths for p in load_prompts(path)], tokenize, n)

    def overlap(self, text: str) -> int | None:
        tokens = self.tokenize(text)
        for g in _grams(tokens, self.n):
            if g in self.grams:
                return self.grams[g]
        for k, whole in self.short.items():
            for g in _grams(tokens, k):
                if g in whole:
                    return whole[g]
        return None


def template_pattern(template: str) -> re.Pattern:
    """A template ("Write a haiku about {t}.") as a pattern that finds it, with any filling, anywhere in a text;
    case and spacing are ignored."""
    parts = re.split(r"\{[^{}]*\}", template)
    fixed = [r"\s*" + r"\s+".join(re.escape(w) for w in part.split()) + r"\s*" for part in parts]
    body = r"(.+?)".join(fixed)
    return re.compile(body, re.IGNORECASE | re.DOTALL)


def template_problems(held_out: list[str], templates: list[str]) -> list[str]:
    """Each held-out prompt that a template produces or that contains one: one line per problem."""
    patterns = [(t, template_pattern(t)) for t in templates]
    return [f"held-out prompt {i} ({text[:60]!r}) contains the template {t!r}"
            for i, text in enumerate(held_out) for t, pat in patterns if pat.search(text)]


def overlap_problems(held_out: HeldOut, training: Iterable[str], limit: int = 20) -> list[str]:
    """The training prompts that overlap a held-out prompt (at most `limit` lines)."""
    problems = []
    for j, text in enumerate(training):
        i = held_out.overlap(text)
        if i is not None:
            problems.append(f"training prompt {j} ({text[:60]!r}) overlaps held-out prompt {i} "
                            f"({held_out.prompts[i][:60]!r}): a shared run of {held_out.n} tokens or the whole prompt")
            if len(problems) >= limit:
                break
    return problems


def disjointness_problems(held_out: list[str], training: Iterable[str], templates: list[str],
                          tokenize: Callable[[str], list] = words, n: int = NGRAM) -> list[str]:
    """Why `held_out` is not disjoint from a training source (its prompts and the templates that made them); an
    empty list when it is."""
    return template_problems(held_out, templates) + overlap_problems(HeldOut(held_out, tokenize, n), training)
