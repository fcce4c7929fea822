"""Needle-in-a-haystack answers (RULER `niah_*` prompts, as lm-eval writes them).

The prompt hides sentences "One of the special magic {numbers|uuids} for KEY is: VALUE." in a
haystack and ends asking "What is the special magic number for KEY mentioned in the provided
text?" (or "What are all the special magic numbers for KEY ..."). A right answer gives every
value of KEY; a wrong one gives a distractor, as a model that lost its place would. Right or
wrong is a deterministic draw per item, degraded for the FP8 arm by the context model.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

_QUESTION = re.compile(
    r"What (?:is|are all) the special magic \w+ for (.+?) mentioned in the provided text\?"
)
_NEEDLE = re.compile(r"One of the special magic \w+ for (.+?) is: ([^\s.]+)\.")


@dataclass(frozen=True)
class NeedleItem:
    query: str
    values: tuple[str, ...]
    distractors: tuple[str, ...]  # values of other keys in the haystack


def find_needle(prompt: str) -> NeedleItem | None:
    """The needle question of a prompt and its answers, or None for any other prompt."""
    asked = list(_QUESTION.finditer(prompt))
    if not asked:
        return None
    query = asked[-1].group(1).strip()
    values: list[str] = []
    distractors: list[str] = []
    for match in _NEEDLE.finditer(prompt, 0, asked[-1].start()):
        key, value = match.group(1).strip(), match.group(2)
        (values if key == query else distractors).append(value)
    if not values:
        return None
    return NeedleItem(query, tuple(values), tuple(distractors[:50]))


def _unit(*parts: str) -> float:
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def item_key(item: NeedleItem) -> str:
    return item.query + "\x1e" + "\x1e".join(item.values)


def write_needle_answer(item: NeedleItem, right: bool, seed: str) -> str:
    """' 1234567.' or a wrong value (a distractor from the haystack when there is one)."""
    if right:
        return " " + ", ".join(item.values) + "."
    key = item_key(item)
    if item.distractors:
        pick = item.distractors[int(_unit(seed, "distractor", key) * len(item.distractors))]
        return f" {pick}."
    value = item.values[0]
    if value.isdigit():
        wrong = str((int(value) + 1 + int(_unit(seed, "needle-off", key) * 999)) % 10**7).zfill(7)
        return f" {wrong}."
    return " I could not find it in the text."
