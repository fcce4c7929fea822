"""kvgate.evaluation.records: lm-eval samples -> paired per-question records -> JSONL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvgate.errors import EvalError, ParseError
from kvgate.evaluation.records import (
    QUESTION_KIND,
    answers_from_samples,
    count_pairs,
    pair_answers,
    read_question_lines,
)
from kvgate.judge.stats import PairedCounts


def _sample(doc_id: int, filt: str, right: bool, prompt: str = "p", answer: str = "18") -> dict:
    """One lm-eval per-sample record, with the keys 0.4.13 writes."""
    return {
        "doc_id": doc_id,
        "doc": {"question": "q", "answer": "a"},
        "target": "a",
        "arguments": [[prompt, {}]],
        "resps": [["... #### " + answer]],
        "filtered_resps": [answer],
        "filter": filt,
        "metrics": ["exact_match"],
        "doc_hash": f"d{doc_id}",
        "prompt_hash": f"{prompt}{doc_id}",
        "target_hash": "t",
        "exact_match": 1.0 if right else 0.0,
    }


def _arm(outcomes: dict[int, tuple[bool, bool]], prompt: str = "p") -> list[dict[str, Any]]:
    out = []
    for doc_id, (strict, flexible) in outcomes.items():
        out.append(_sample(doc_id, "strict-match", strict, prompt))
        out.append(_sample(doc_id, "flexible-extract", flexible, prompt))
    return out


def test_answers_group_filters_per_doc() -> None:
    answers = answers_from_samples(_arm({0: (True, True), 1: (False, True)}), "control")
    assert set(answers) == {0, 1}
    assert answers[1].correct == {"strict-match": False, "flexible-extract": True}
    assert answers[0].answer["strict-match"] == "18"


def test_answers_reject_records_without_keys() -> None:
    bad = _sample(0, "strict-match", True)
    del bad["exact_match"]
    with pytest.raises(EvalError, match="control: lm-eval sample record lacks 'exact_match'"):
        answers_from_samples([bad], "control")


def test_pairing_counts_by_gate_filter() -> None:
    control = answers_from_samples(
        _arm({0: (True, True), 1: (True, True), 2: (False, True), 3: (False, False)}), "control"
    )
    candidate = answers_from_samples(
        _arm({0: (True, True), 1: (False, True), 2: (True, True), 3: (False, True)}), "candidate"
    )
    strict = pair_answers(control, candidate, [0, 1, 2, 3], "strict-match", look=1)
    flexible = pair_answers(control, candidate, [0, 1, 2, 3], "flexible-extract", look=1)
    assert count_pairs(strict) == PairedCounts(both=1, control_only=1, candidate_only=1, neither=1)
    assert count_pairs(flexible) == PairedCounts(
        both=3, control_only=0, candidate_only=1, neither=0
    )


def test_pairing_rejects_different_prompts() -> None:
    control = answers_from_samples(_arm({0: (True, True)}, prompt="a"), "control")
    candidate = answers_from_samples(_arm({0: (True, True)}, prompt="b"), "candidate")
    with pytest.raises(EvalError, match="doc 0: the arms were sent different prompts"):
        pair_answers(control, candidate, [0], "strict-match", look=1)


def test_pairing_rejects_missing_docs() -> None:
    control = answers_from_samples(_arm({0: (True, True), 1: (True, True)}), "control")
    candidate = answers_from_samples(_arm({0: (True, True)}), "candidate")
    with pytest.raises(EvalError, match=r"candidate: lm-eval returned no result for doc ids \[1\]"):
        pair_answers(control, candidate, [0, 1], "strict-match", look=1)


def test_record_round_trip(tmp_path: Path) -> None:
    control = answers_from_samples(_arm({0: (True, True), 1: (True, False)}), "control")
    candidate = answers_from_samples(_arm({0: (False, False), 1: (True, True)}), "candidate")
    records = pair_answers(control, candidate, [0, 1], "strict-match", look=2)
    path = tmp_path / "q.jsonl"
    lines = [json.dumps(r.to_dict()) for r in records]
    lines.append(json.dumps({"kind": "kvgate.eval/summary", "verdict": "pass"}))
    path.write_text("\n".join(lines) + "\n")
    first = json.loads(lines[0])
    assert first["kind"] == QUESTION_KIND and first["look"] == 2
    assert first["control_right"] is True and first["candidate_right"] is False
    assert read_question_lines(path) == PairedCounts(1, 1, 0, 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json\n", "q.jsonl:1: not JSON"),
        ('{"kind": "kvgate.eval/question", "doc_id": 1}\n', "q.jsonl:1: a question line needs"),
        ("", "q.jsonl: no per-question lines"),
        (
            '{"doc_id": 1, "control_right": true, "candidate_right": true}\n' * 2,
            "q.jsonl:2: doc_id 1 appears twice",
        ),
    ],
)
def test_read_question_lines_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(text)
    with pytest.raises(ParseError) as err:
        read_question_lines(path)
    assert str(err.value).startswith(f"{tmp_path}/{message}")
