"""The row shapes dflash-prepare-data reads, each turned into chat messages (or plain text).

    sharegpt           {"conversations": [{"from": "human"|"gpt"|"system", "value": ...}, ...]}
    messages           {"messages": [{"role": "user"|"assistant"|"system", "content": ...}, ...]}  (OpenAI)
    alpaca             {"instruction": ..., "input": ... (optional), "output": ...}
    prompt_completion  {"prompt": ..., "completion": ...}  (strings, or lists of messages)
    text               {"text": ...}  (no chat template; every token is supervised)

A row of any chat shape may carry a top-level "system" string: it becomes the system turn unless the
conversation has one. detect_format picks the shape from a dataset's column names (the first that fits, in the
order above); --format names it instead.
"""

from __future__ import annotations

FORMATS = ("sharegpt", "messages", "alpaca", "prompt_completion", "text")
# (format, the columns that identify it)
SIGNATURES = (("sharegpt", ("conversations",)), ("messages", ("messages",)), ("alpaca", ("instruction", "output")),
              ("prompt_completion", ("prompt", "completion")), ("text", ("text",)))
# ShareGPT speaker names -> chat roles (the names used by ShareGPT, SlimOrca, OpenHermes, Vicuna-style sets)
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bard": "assistant", "bing": "assistant", "model": "assistant",
                  "system": "system"}


class BadRow(Exception):
    """A row that cannot become training data; str(e) is the reason counted in stats.json."""


def detect_format(columns) -> str:
    """The format whose columns the dataset has; a clear error naming the columns otherwise."""
    names = set(columns)
    for fmt, needed in SIGNATURES:
        if names.issuperset(needed):
            return fmt
    shapes = "; ".join(f"{fmt}: {', '.join(needed)}" for fmt, needed in SIGNATURES)
    raise ValueError(f"the input's columns ({', '.join(sorted(names)) or 'none'}) match no known format ({shapes}); "
                     "rename the columns or pass --format")


def _text(content) -> str:
    """A message's content: a string, or OpenAI content parts whose text parts are joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(isinstance(p, dict) for p in content):
        texts = [p.get("text") for p in content if p.get("type", "text") == "text"]
        if texts and all(isinstance(t, str) for t in texts):
            return "".join(texts)
    raise BadRow("bad_content")


def _with_system(row: dict, messages: list[dict]) -> list[dict]:
    system = row.get("system")
    if isinstance(system, str) and system.strip() and not any(m["role"] == "system" for m in messages):
        return [{"role": "system", "content": system}] + messages
    return messages


def _messages(turns, reason: str) -> list[dict]:
    if not isinstance(turns, list) or not turns or not all(isinstance(m, dict) for m in turns):
        raise BadRow(reason)
    out = []
    for m in turns:
        if not isinstance(m.get("role"), str):
            raise BadRow(reason)
        out.append({"role": m["role"], "content": _text(m.get("content"))})
    return out


def _sharegpt(row: dict) -> list[dict]:
    turns = row.get("conversations")
    if not isinstance(turns, list) or not turns or not all(isinstance(t, dict) for t in turns):
        raise BadRow("no_conversations")
    out = []
    for t in turns:
        role = SHAREGPT_ROLES.get(str(t.get("from", "")).lower())
        if role is None:
            raise BadRow("unknown_role")
        out.append({"role": role, "content": _text(t.get("value"))})
    return out


def _alpaca(row: dict) -> list[dict]:
    instruction, extra, output = row.get("instruction"), row.get("input"), row.get("output")
    if not isinstance(instruction, str) or not isinstance(output, str) or not instruction.strip():
        raise BadRow("no_instruction_output")
    user = f"{instruction}\n\n{extra}" if isinstance(extra, str) and extra.strip() else instruction
    return [{"role": "user", "content": user}, {"role": "assistant", "content": output}]


def _prompt_completion(row: dict) -> list[dict]:
    prompt, completion = row.get("prompt"), row.get("completion")
    if isinstance(prompt, str) and isinstance(completion, str):
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": completion}]
    if isinstance(prompt, list) and isinstance(completion, list):  # the conversational prompt/completion shape
        return _messages(prompt, "no_prompt_completion") + _messages(completion, "no_prompt_completion")
    raise BadRow("no_prompt_completion")


def to_example(fmt: str, row) -> list[dict] | str:
    """The row as chat messages ({"role", "content"} dicts), or its text for the text format; BadRow if not."""
    if isinstance(row, BadRow):
        raise row
    if not isinstance(row, dict):
        raise BadRow("not_an_object")
    if fmt == "text":
        text = row.get("text")
        if not isinstance(text, str) or not text.strip():
            raise BadRow("no_text")
        return text
    convert = {"sharegpt": _sharegpt, "alpaca": _alpaca, "prompt_completion": _prompt_completion,
               "messages": lambda r: _messages(r.get("messages"), "no_messages")}[fmt]
    return _with_system(row, convert(row))
