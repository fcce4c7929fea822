"""Text as tokens: a rough word/punctuation tokenizer, stop strings and max_tokens.

Pieces keep their leading whitespace, so joining them gives back the text exactly; the
simulator streams one piece per decode step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_PIECE = re.compile(r"\s*(?:\w+|[^\w\s])|\s+$")


def split_pieces(text: str) -> list[str]:
    return _PIECE.findall(text)


def count_tokens(text: str) -> int:
    return len(_PIECE.findall(text))


def block_hashes(text: str, block_size: int) -> tuple[int, ...]:
    """One hash per whole block of `text`'s tokens, each covering every token before the
    block's end (vLLM's chained block hash): equal hashes mean an equal prefix."""
    pieces = _PIECE.findall(text)
    hashes: list[int] = []
    running = 0
    for end in range(block_size, len(pieces) + 1, block_size):
        running = hash((running, tuple(pieces[end - block_size : end])))
        hashes.append(running)
    return tuple(hashes)


def plan_output(
    text: str, stop: Sequence[str], max_tokens: int, ends_with_eos: bool = True
) -> tuple[list[str], str]:
    """Pieces the engine emits and the finish reason, as vLLM decides them.

    Generation ends at the first stop string (which is not returned), at EOS after the
    text, or after `max_tokens` tokens, whichever comes first. The token that completes a
    stop string still counts as generated, so its piece is kept trimmed (possibly empty).
    """
    pieces = split_pieces(text)
    hits = [(text.find(c), len(c)) for c in stop if c and text.find(c) >= 0]
    if hits:
        position, length = min(hits)
        end = position + length
        emitted: list[str] = []
        offset = 0
        for piece in pieces:
            if offset >= end:
                break
            emitted.append(text[min(offset, position) : min(offset + len(piece), position)])
            offset += len(piece)
        if len(emitted) <= max_tokens:
            return emitted, "stop"
        return pieces[:max_tokens], "length"
    if ends_with_eos:
        generated = [*pieces, ""]  # the EOS token is generated but not shown
        if len(generated) <= max_tokens:
            return generated, "stop"
    return pieces[:max_tokens], "length"


def matched_stop(text: str, stop: Sequence[str]) -> str | None:
    """The stop string that ends `text` first (vLLM's `stop_reason`), or None."""
    hits = [(text.find(c), i, c) for i, c in enumerate(stop) if c and text.find(c) >= 0]
    return min(hits)[2] if hits else None
