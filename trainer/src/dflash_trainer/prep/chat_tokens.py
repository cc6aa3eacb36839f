"""Token ids and loss masks of one example for dflash-prepare-data: a chat rendered with the target's chat
template (loss on the assistant turns), or plain text (loss on every token); and the prompt the target answers
under --regenerate."""

from __future__ import annotations

from .formats import BadRow


def render(tokenizer, messages, add_generation_prompt: bool) -> str:
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # noqa: BLE001 - templates raise anything (jinja errors, role checks)
        raise BadRow("template_error") from e


def tokenize_chat(tokenizer, messages: list[dict], max_seq_len: int) -> tuple[list[int], list[int]]:
    """input_ids and loss_mask (1 on assistant tokens) for one conversation."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not turns:
        raise BadRow("no_assistant_turn")
    if any(not messages[i]["content"].strip() for i in turns):
        raise BadRow("empty_assistant")
    full = render(tokenizer, messages, False)
    spans = []
    for i in turns:
        before = render(tokenizer, messages[:i], True)
        upto = render(tokenizer, messages[:i + 1], False)
        if not (upto.startswith(before) and full.startswith(upto)):
            raise BadRow("template_not_incremental")  # e.g. a template that rewrites earlier turns
        spans.append((len(before), len(upto)))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(enc["input_ids"])
    mask = [int(any(s <= start < e for s, e in spans)) for start, _ in enc["offset_mapping"]]
    if len(ids) > max_seq_len:
        raise BadRow("too_long")
    if sum(mask) == 0:
        raise BadRow("empty_assistant")
    return ids, mask


def prompt_messages(messages: list[dict]) -> list[dict]:
    """The messages a target answers (under --regenerate, in dflash-eval, as a held-out prompt): those before the
    first assistant turn; a conversation that ends with a user turn is all prompt (multi-turn: the target answers
    its last turn, the earlier turns are context)."""
    if messages and messages[-1]["role"] == "user":
        return messages
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
    return messages[:first]


def prompt_ids(tokenizer, messages: list[dict], max_seq_len: int) -> list[int]:
    """The tokens the target answers under --regenerate (prompt_messages)."""
    prompt = prompt_messages(messages)
    if not prompt or prompt[-1]["role"] != "user":
        raise BadRow("no_user_turn")
    ids = tokenizer(render(tokenizer, prompt, True), add_special_tokens=False)["input_ids"]
    if len(ids) >= max_seq_len:
        raise BadRow("too_long")
    return list(ids)


def tokenize_text(tokenizer, text: str, max_seq_len: int) -> tuple[list[int], list[int]]:
    """Plain text: its tokens, every one supervised (no chat template)."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if len(ids) < 2:
        raise BadRow("too_short")
    if len(ids) > max_seq_len:
        raise BadRow("too_long")
    return ids, [1] * len(ids)


def text_prompt_ids(tokenizer, text: str, max_seq_len: int) -> list[int]:
    """Plain text under --regenerate: its first half (at most max_seq_len // 2 tokens), which the target
    continues."""
    ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if len(ids) < 2:
        raise BadRow("too_short")
    return ids[:min(len(ids) // 2, max_seq_len // 2)]


def example_tokens(tokenizer, example, max_seq_len: int) -> tuple[list[int], list[int]]:
    """input_ids and loss_mask of a formats.to_example result (messages or text)."""
    if isinstance(example, str):
        return tokenize_text(tokenizer, example, max_seq_len)
    return tokenize_chat(tokenizer, example, max_seq_len)


def example_prompt(tokenizer, example, max_seq_len: int) -> list[int]:
    """The prompt ids the target answers (continues, for text) under --regenerate."""
    if isinstance(example, str):
        return text_prompt_ids(tokenizer, example, max_seq_len)
    return prompt_ids(tokenizer, example, max_seq_len)
