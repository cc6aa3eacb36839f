"""How the text of a dflash-train flag or environment knob becomes a value, and the checks of one field's value.
Every error message has the form "<problem>; <fix>" and names the flag. Stdlib only."""

from __future__ import annotations

import importlib.util


class StartupError(ValueError):
    """A refusal found at start, before weights load: one line on stderr, exit status 2."""


# --- how the text of a flag becomes a value (each takes the text and the flag's name, for the message) ---

def parse_int(text: str, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{flag} {text!r} is not an integer; pass a whole number") from None


def parse_float(text: str, flag: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{flag} {text!r} is not a number; pass e.g. {flag} 0.5") from None


def parse_str(text: str, flag: str) -> str:
    return text


def parse_gpu_list(text: str, flag: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2]; '' -> []."""
    text = (text or "").strip()
    if not text:
        return []
    ids = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"{flag} {text!r} is not a comma-separated list of GPU indices; "
                             f"pass e.g. {flag} 0,1 or {flag} '' for none")
        ids.append(int(part))
    if len(set(ids)) != len(ids):
        raise ValueError(f"{flag} {text!r} repeats a GPU; list each GPU once")
    return ids


def parse_int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated integers; e.g. 1,9,17") from None


def parse_float_list(text: str, flag: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated numbers; e.g. 2,5,10") from None


MAX_SHARD_WEIGHT = 100


def shard_weights_of(text: str, flag: str = "--shard-weights") -> list[tuple[str, int]]:
    """PREFIX=N[,PREFIX=N...] as (prefix, N) pairs: N whole, 0..MAX_SHARD_WEIGHT, each prefix once."""
    pairs = []
    for item in (x.strip() for x in text.split(",")):
        prefix, sep, n = item.partition("=")
        if not sep or not prefix.strip() or not n.strip().isdigit() or int(n) > MAX_SHARD_WEIGHT:
            raise ValueError(f"{flag} {text!r}: {item!r} is not PREFIX=N with N a whole number 0..{MAX_SHARD_WEIGHT}; "
                             "e.g. synth-=2,extra-=3")
        pairs.append((prefix.strip(), int(n)))
    prefixes = [p for p, _ in pairs]
    if len(set(prefixes)) != len(prefixes):
        raise ValueError(f"{flag} {text!r} names a prefix twice; give each once")
    return pairs


def check_shard_weights(value: str | None, flag: str) -> None:
    if value is not None:
        shard_weights_of(value, flag)


def parse_switch(text: str, name: str) -> bool:
    """A 0/1 environment knob."""
    if text not in ("0", "1"):
        raise ValueError(f"{name} is {text!r}; set it to 0 or 1")
    return text == "1"


def parse_inverted_switch(text: str, name: str) -> bool:
    return not parse_switch(text, name)


FP8_RECIPES = ("tensorwise", "rowwise")  # torchao's float8 training recipes (float8.py); 1 is tensorwise


def parse_fp8_setting(text: str, name: str) -> str | None:
    """auto; 0: bf16; 1 or a recipe name: that torchao float8 recipe."""
    if text == "0":
        return None
    setting = "tensorwise" if text == "1" else text
    if setting != "auto" and setting not in FP8_RECIPES:
        raise ValueError(f"{name} is {text!r}; set it to auto, 0, 1 (tensorwise) or one of {', '.join(FP8_RECIPES)}")
    return setting


def check_fp8_setting(setting: str | None) -> None:
    """A forced FP8 recipe needs torchao (auto falls back to bf16 without it)."""
    if setting not in (None, "auto") and importlib.util.find_spec("torchao") is None:
        raise ValueError(f"DFLASH_FP8_LAYERS ({setting}) needs torchao; pip install 'dflash_trainer[fp8]' or unset "
                         "DFLASH_FP8_LAYERS")


def parse_seconds(text: str, name: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} is not a number; set it to seconds, e.g. 60") from None


# --- checks of one field's value (None, the "not given" of optional flags, is never checked) ---

def at_least(low):
    def check(value, flag: str) -> None:
        if value < low:
            raise ValueError(f"{flag} is {value}; it must be at least {low}")
    return check


def positive(value, flag: str) -> None:
    if not value > 0:
        raise ValueError(f"{flag} is {value}; it must be > 0")


def ascending_positive(values, flag: str) -> None:
    if any(not v > 0 for v in values) or sorted(set(values)) != list(values):
        raise ValueError(f"{flag} {','.join(f'{v:g}' for v in values)} must be positive and increasing; "
                         f"e.g. {flag} 2,5,10")
