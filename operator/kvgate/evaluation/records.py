"""Per-question records of both arms: pairing lm-eval samples and the JSONL kept by `kvgate eval`.

Pure: lm-eval sample dicts (or saved lines) in, records and paired counts out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from kvgate.errors import EvalError, ParseError
from kvgate.inputs import load_json, read_text
from kvgate.judge.stats import PairedCounts

QUESTION_KIND: Final = "kvgate.eval/question"
FILTERS: Final = ("strict-match", "flexible-extract")


@dataclass(frozen=True, slots=True)
class ArmAnswer:
    """One arm's graded answer to one question, per lm-eval filter."""

    doc_id: int
    doc_hash: str
    prompt_hash: str
    correct: Mapping[str, bool]  # filter name -> exact_match
    answer: Mapping[str, str]  # filter name -> extracted answer


def answers_from_samples(samples: Iterable[Mapping[str, Any]], arm: str) -> dict[int, ArmAnswer]:
    """Group lm-eval `results["samples"][task]` records (one per doc and filter) by doc id."""
    grouped: dict[int, dict[str, Any]] = {}
    for s in samples:
        try:
            doc_id = int(s["doc_id"])
            filt = str(s["filter"])
            right = float(s["exact_match"]) >= 0.5
            extracted = s.get("filtered_resps")
            answer = extracted[0] if isinstance(extracted, list) and extracted else extracted
            entry = grouped.setdefault(
                doc_id,
                {"doc_hash": s["doc_hash"], "prompt_hash": s["prompt_hash"], "c": {}, "a": {}},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise EvalError(f"{arm}: lm-eval sample record lacks {exc}") from exc
        if entry["prompt_hash"] != s["prompt_hash"]:
            raise EvalError(f"{arm}: doc {doc_id} has two prompts in one run")
        entry["c"][filt] = right
        entry["a"][filt] = str(answer)
    return {
        d: ArmAnswer(d, e["doc_hash"], e["prompt_hash"], e["c"], e["a"]) for d, e in grouped.items()
    }


@dataclass(frozen=True, slots=True)
class QuestionRecord:
    """Both arms on one question; `control_right`/`candidate_right` use the gate's filter."""

    doc_id: int
    look: int
    prompt_hash: str
    doc_hash: str
    filter: str
    control: Mapping[str, bool]
    candidate: Mapping[str, bool]
    control_answer: str
    candidate_answer: str

    @property
    def control_right(self) -> bool:
        return self.control[self.filter]

    @property
    def candidate_right(self) -> bool:
        return self.candidate[self.filter]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": QUESTION_KIND,
            "doc_id": self.doc_id,
            "look": self.look,
            "prompt_hash": self.prompt_hash,
            "doc_hash": self.doc_hash,
            "filter": self.filter,
            "control_right": self.control_right,
            "candidate_right": self.candidate_right,
            "control": dict(self.control),
            "candidate": dict(self.candidate),
            "control_answer": self.control_answer,
            "candidate_answer": self.candidate_answer,
        }


def pair_answers(
    control: Mapping[int, ArmAnswer],
    candidate: Mapping[int, ArmAnswer],
    expected: Sequence[int],
    filt: str,
    look: int,
) -> list[QuestionRecord]:
    """Pair both arms on doc id, checking both saw the same documents and prompts."""
    for arm, got in (("control", control), ("candidate", candidate)):
        missing = sorted(set(expected) - set(got))
        if missing:
            raise EvalError(f"{arm}: lm-eval returned no result for doc ids {missing[:5]}")
    records = []
    for doc_id in expected:
        c, k = control[doc_id], candidate[doc_id]
        if c.prompt_hash != k.prompt_hash or c.doc_hash != k.doc_hash:
            raise EvalError(f"doc {doc_id}: the arms were sent different prompts; pairing invalid")
        if filt not in c.correct or filt not in k.correct:
            raise EvalError(f"doc {doc_id}: no result for filter {filt!r}")
        records.append(
            QuestionRecord(
                doc_id=doc_id,
                look=look,
                prompt_hash=c.prompt_hash,
                doc_hash=c.doc_hash,
                filter=filt,
                control=dict(c.correct),
                candidate=dict(k.correct),
                control_answer=c.answer.get(filt, ""),
                candidate_answer=k.answer.get(filt, ""),
            )
        )
    return records


def count_pairs(records: Iterable[QuestionRecord]) -> PairedCounts:
    return PairedCounts.from_outcomes((r.control_right, r.candidate_right) for r in records)


def read_question_lines(path: Path) -> PairedCounts:
    """Paired counts from a per-question JSONL written by `kvgate eval --output`."""
    pairs: list[tuple[bool, bool]] = []
    seen: set[int] = set()
    lines = read_text(path).splitlines()  # bounded, UTF-8 or one ParseError naming the file
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = load_json(line, str(path))  # depth and huge numbers bounded
        except ParseError as exc:
            reason = str(exc).removeprefix(f"{path}: ").removeprefix("malformed JSON: ")
            raise ParseError(str(path), f"not JSON ({reason})", line_no) from None
        if not isinstance(obj, dict) or obj.get("kind", QUESTION_KIND) != QUESTION_KIND:
            continue
        ctrl, cand, doc_id = obj.get("control_right"), obj.get("candidate_right"), obj.get("doc_id")
        if not isinstance(ctrl, bool) or not isinstance(cand, bool) or not isinstance(doc_id, int):
            raise ParseError(
                str(path),
                "a question line needs doc_id, control_right and candidate_right",
                line_no,
            )
        if doc_id in seen:
            raise ParseError(str(path), f"doc_id {doc_id} appears twice", line_no)
        seen.add(doc_id)
        pairs.append((ctrl, cand))
    if not pairs:
        raise ParseError(str(path), "no per-question lines (kind kvgate.eval/question)")
    return PairedCounts.from_outcomes(pairs)
