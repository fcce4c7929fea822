"""An engine's flags in a container's token list (`command` + `args`): which tokens are a
flag's values, and how to give a flag new ones in place (kvgate.engines.launch reads and rewrites
containers with these). Both engines' argparse accept `--flag value` and `--flag=value`, and
`_` for `-` in a flag's name. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, TypeAlias

from kvgate.errors import SpecError


@dataclass(frozen=True, slots=True)
class Token:
    """One engine-argument token and where it lives in the container."""

    list_name: str  # "command" or "args"
    index: int
    text: str


# Flags that take several values (argparse `nargs="+"`: vLLM's list-typed config fields,
# vllm/engine/arg_utils.py:252, the skip list at :1384 in 0.32.0): `--flag a b c` carries them
# all; `--flag=a` carries one (`--flag=a b` is refused: "unrecognized arguments: b").
MULTI_VALUE_FLAGS: Final = frozenset({"--kv-cache-dtype-skip-layers"})
Value: TypeAlias = str | tuple[str, ...] | None  # a flag's value: none (a switch), one, or several


def split_flag(text: str) -> tuple[str, str | None]:
    """`--kv_cache_dtype=fp8` -> (`--kv-cache-dtype`, `fp8`); argparse in vLLM accepts both spellings."""
    name, sep, value = text.partition("=")
    return name.replace("_", "-"), (value if sep else None)


def values_after(texts: Sequence[str], i: int) -> tuple[str, ...]:
    """The values a multi-value flag at texts[i] takes: every token up to the next option
    (argparse stops at a `-x`/`--x` token; a negative number is a value)."""
    end = i + 1
    while end < len(texts) and not is_option(texts[end]):
        end += 1
    return tuple(texts[i + 1 : end])


def is_option(text: str) -> bool:
    return text.startswith("-") and not text[1:2].isdigit() and len(text) > 1


def flag_pairs(texts: list[str], source: str) -> list[tuple[str, Value]]:
    pairs: list[tuple[str, Value]] = []
    i = 0
    while i < len(texts):
        text = texts[i]
        if not text.startswith("--"):
            raise SpecError(source, f"'{text}' is not a --flag; pass flags as ('--flag', 'value')")
        name, value = split_flag(text)
        if name in MULTI_VALUE_FLAGS:
            values = (value,) if value is not None else values_after(texts, i)
            if not values:
                raise SpecError(source, f"{name} needs at least one value")
            pairs.append((name, values))
            i += 1 + (len(values) if value is None else 0)
            continue
        if value is None and i + 1 < len(texts) and not texts[i + 1].startswith("--"):
            value = texts[i + 1]
            i += 1
        pairs.append((name, value))
        i += 1
    return pairs


def replace_flag(
    lists: dict[str, list[str]], tokens: Sequence[Token], flag: str, value: str | None
) -> bool:
    """Give every occurrence of `flag` the new value in place; False if the flag is absent."""
    found = False
    for position, token in enumerate(tokens):
        name, old_value = split_flag(token.text)
        if not token.text.startswith("--") or name != flag:
            continue
        found = True
        if value is None:
            continue  # a boolean flag that is already there
        if old_value is not None:
            original_name = token.text.partition("=")[0]
            lists[token.list_name][token.index] = f"{original_name}={value}"
        elif position + 1 < len(tokens) and not tokens[position + 1].text.startswith("--"):
            following = tokens[position + 1]
            lists[following.list_name][following.index] = value
        else:  # `--flag` with its value missing: write it in `=` form
            lists[token.list_name][token.index] = f"{token.text}={value}"
    return found


def replace_values(
    lists: dict[str, list[str]], tokens: Sequence[Token], flag: str, values: tuple[str, ...]
) -> bool:
    """Give every occurrence of the multi-value `flag` exactly `values` (its old values go);
    False if the flag is absent. Occurrences are rewritten from the last, so the positions of
    earlier ones still hold (the command list's tokens come before the args list's)."""
    texts = [t.text for t in tokens]
    spans = [
        (position, 1 if "=" in token.text else 1 + len(values_after(texts, position)))
        for position, token in enumerate(tokens)
        if token.text.startswith("--") and split_flag(token.text)[0] == flag
    ]
    for position, length in reversed(spans):
        head = tokens[position]
        name = head.text.partition("=")[0]
        keep_form = "=" in head.text and len(values) == 1
        new = [f"{name}={values[0]}"] if keep_form else [name, *values]
        for old in reversed(tokens[position + 1 : position + length]):
            del lists[old.list_name][old.index]
        lists[head.list_name][head.index : head.index + 1] = new
    return bool(spans)
