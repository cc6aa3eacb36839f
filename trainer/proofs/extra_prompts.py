"""Extra training prompts for the SmolLM2 proof, from permissively licensed prompt sets that PyPI packages ship: a file
of chat rows the proof answers and trains on beside its own prompts (`--extra-prompts FILE`), never split off for
evaluation. Kept apart from proof_prompts.py's file, so that file (and the proof's split of it) stays as it was.

  - user requests of the Berkeley Function Calling Leaderboard (PyPI `bfcl-eval==2026.3.23`, data apache-2.0 by its
    data/README.md): the first user turn of every row of its BFCL_v4_*.json files (everyday requests, questions,
    arithmetic and code tasks, phrased as asks of an assistant with tools; the tools are not given to the target);
  - the English questions of ChatterBot's corpus (PyPI `chatterbot-corpus==1.3.3`, BSD-3-Clause): the first line of
    each conversation (short factual questions and chit-chat).
Only the packages' data files are read (never imported); a package that is not installed gives no prompt. Prompts are
kept when they are mostly ASCII (the sets mix in other languages), 12-400 characters long, and not seen before.

    python -m proofs.extra_prompts --out extra.jsonl
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import sys

from .proof_prompts import _package_file

MIN_CHARS, MAX_CHARS = 12, 400


def _english(text: str) -> bool:
    """Mostly ASCII: the sets' Chinese, Hindi and other rows are left out (the target is an English model)."""
    return sum(ord(c) < 128 for c in text) >= 0.95 * len(text)


def _keep(texts, limit: int | None, seed: int) -> list[str]:
    seen, out = set(), []
    for text in texts:
        text = text.strip()
        if MIN_CHARS <= len(text) <= MAX_CHARS and _english(text) and text not in seen:
            seen.add(text)
            out.append(text)
    random.Random(seed).shuffle(out)
    return out if limit is None else out[:limit]


def bfcl(limit: int | None = None, seed: int = 0) -> list[str]:
    marker = _package_file("bfcl_eval", os.path.join("data", "README.md"))
    if marker is None:
        return []
    texts = []
    for path in sorted(glob.glob(os.path.join(os.path.dirname(marker), "BFCL_v4_*.json"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    turns = json.loads(line).get("question")
                except (ValueError, AttributeError):  # format_sensitivity.json is one JSON object of ids, no rows
                    continue
                if isinstance(turns, list) and turns and isinstance(turns[0], list):
                    users = [m.get("content") for m in turns[0] if m.get("role") == "user"]
                    if users and isinstance(users[0], str):
                        texts.append(users[0])
    return _keep(texts, limit, seed)


def chatterbot(limit: int | None = None, seed: int = 0) -> list[str]:
    import yaml  # PyYAML: ansible-core's own dependency
    marker = _package_file("chatterbot_corpus", os.path.join("data", "english", "ai.yml"))
    if marker is None:
        return []
    texts = []
    for path in sorted(glob.glob(os.path.join(os.path.dirname(marker), "*.yml"))):
        with open(path, encoding="utf-8") as f:
            for conversation in yaml.safe_load(f).get("conversations") or []:
                if conversation and isinstance(conversation[0], str):
                    texts.append(conversation[0])
    return _keep(texts, limit, seed)


def build(num_bfcl: int | None = None, num_chatterbot: int | None = None, seed: int = 0) -> list[dict]:
    """Chat rows, each with the name of its set as "source"."""
    tagged = [(t, "bfcl") for t in bfcl(num_bfcl, seed)] + [(t, "chatterbot") for t in chatterbot(num_chatterbot, seed)]
    random.Random(seed).shuffle(tagged)
    return [{"messages": [{"role": "user", "content": t}], "source": source} for t, source in tagged]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--num-bfcl", type=int, default=None, help="at most this many BFCL requests (default: all)")
    p.add_argument("--num-chatterbot", type=int, default=None, help="at most this many ChatterBot questions "
                   "(default: all)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rows = build(args.num_bfcl, args.num_chatterbot, args.seed)
    if not rows:
        print("extra_prompts: error: no prompt found: install bfcl-eval==2026.3.23 and chatterbot-corpus==1.3.3 "
              "with pip install --no-deps (tests/requirements-nodeps.txt)", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    counts = {s: sum(r["source"] == s for r in rows) for s in ("bfcl", "chatterbot")}
    print(f"{len(rows)} prompts ({counts['bfcl']} BFCL, {counts['chatterbot']} ChatterBot) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
