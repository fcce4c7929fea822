"""kvgate.sim text planning: pieces, stop strings and max_tokens as vLLM applies them."""

from __future__ import annotations

import pytest

from kvgate.sim.textgen import count_tokens, matched_stop, plan_output, split_pieces


@pytest.mark.parametrize(
    "text", ["", "a", " 3 + 2 = 5.\n#### 5\n\n", "Janet’s ducks  lay\t16 eggs.", "x\n\n"]
)
def test_pieces_join_back_to_the_text(text: str) -> None:
    assert "".join(split_pieces(text)) == text


def test_count_tokens_counts_words_and_punctuation() -> None:
    assert count_tokens("Hello, world!") == 4


def test_stop_string_is_cut_and_not_returned() -> None:
    pieces, reason = plan_output(" 5.\n#### 5\n\nQuestion: next", ["Question:", "</s>"], 256)
    assert reason == "stop"
    assert "".join(pieces) == " 5.\n#### 5\n\n"
    # the token that completed the stop string was generated, so it counts
    assert len(pieces) == len(split_pieces(" 5.\n#### 5\n\nQuestion:"))


def test_earliest_stop_string_wins() -> None:
    pieces, _ = plan_output("a b Q: c Question: d", ["Question:", "Q:"], 100)
    assert "".join(pieces) == "a b "


def test_text_without_stop_ends_with_eos() -> None:
    pieces, reason = plan_output(" one two", [], 10)
    assert reason == "stop"
    assert pieces == [" one", " two", ""]


def test_max_tokens_cuts_with_length() -> None:
    pieces, reason = plan_output(" one two three four", ["Question:"], 2)
    assert (pieces, reason) == ([" one", " two"], "length")


def test_eos_needs_a_token_of_its_own() -> None:
    pieces, reason = plan_output(" one two", [], 2)
    assert (pieces, reason) == ([" one", " two"], "length")


def test_stop_beyond_max_tokens_is_length() -> None:
    pieces, reason = plan_output(" a b c d Question:", ["Question:"], 3)
    assert (pieces, reason) == ([" a", " b", " c"], "length")


def test_matched_stop_is_the_earliest() -> None:
    assert matched_stop("a Q: b Question: c", ["Question:", "Q:"]) == "Q:"
    assert matched_stop("no stop here", ["Question:"]) is None
