"""GSM8K answers: find the question in a prompt, decide right or wrong, write the answer.

Right or wrong is a deterministic draw per question (hash of seed and question), so two
arms asked the same question in any order agree the way two real engines do: the FP8 arm
keeps the BF16 draw and only `fp8_loss` (right -> wrong) and `fp8_churn` (balanced swaps)
change it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from kvgate.sim.context import ContextModel
from kvgate.sim.needle import find_needle, item_key, write_needle_answer

_WS = re.compile(r"\s+")
_CALC = re.compile(r"<<[^>]*>>")
_FINAL = re.compile(r"\n#### (-?[0-9.,]+)\s*$")


class AnswerStyle(Enum):
    """Which lm-eval task shape the prompt has, so the answer ends the way its filter reads."""

    HASH = "hash"  # gsm8k: "Question: ...\nAnswer:" -> "... #### N"
    COT = "cot"  # gsm8k_cot: "Q: ...\nA:" -> "... The answer is N."
    LLAMA = "llama"  # gsm8k_cot_llama: "... The final answer is N"
    BOTH = "both"  # unknown shape: end with both forms


@dataclass(frozen=True)
class Problem:
    question: str
    solution: str  # worked steps with <<calc>> annotations, without the "#### N" line
    final: str  # the answer as written in the data, e.g. "1,000"


def normalise(text: str) -> str:
    """Key for lookup: case, whitespace and typographic quotes do not matter."""
    text = (
        text.replace("\u2019", "'")
        .replace("\u2018", "'")
        .replace("\u201c", '"')
        .replace("\u201d", '"')
    )
    return _WS.sub(" ", text).strip().lower()


class Gsm8kIndex:
    """Every test and train question, keyed by normalised text (test wins on duplicates)."""

    def __init__(self, problems: dict[str, Problem]) -> None:
        self._problems = problems

    @classmethod
    def load(cls, directory: Path) -> Gsm8kIndex:
        problems: dict[str, Problem] = {}
        found = False
        for split in ("train", "test"):  # test last so it wins
            path = directory / f"{split}.jsonl"
            if not path.is_file():
                continue
            found = True
            with path.open(encoding="utf-8") as handle:
                for line_no, line in enumerate(handle, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                        question, answer = row["question"], row["answer"]
                    except (ValueError, KeyError, TypeError):
                        raise ValueError(f"{path}:{line_no}: not a GSM8K row") from None
                    match = _FINAL.search(answer)
                    if not match:
                        raise ValueError(f"{path}:{line_no}: answer has no final '#### N' line")
                    problems[normalise(question)] = Problem(
                        question=question, solution=answer[: match.start()], final=match.group(1)
                    )
        if not found:
            raise ValueError(f"{directory}: no test.jsonl or train.jsonl (set KVGATE_GSM8K_DIR)")
        return cls(problems)

    def __len__(self) -> int:
        return len(self._problems)

    def get(self, question: str) -> Problem | None:
        return self._problems.get(normalise(question))


# The last question in a prompt, for each task shape. Few-shot prompts repeat the marker,
# so the last match is the one being asked.
_SHAPES: tuple[tuple[AnswerStyle, re.Pattern[str]], ...] = (
    (AnswerStyle.LLAMA, re.compile(r"Problem: (.+?)\nYour response should end with", re.S)),
    (AnswerStyle.HASH, re.compile(r"(?:^|\n)Question: (.+?)\n\s*Answer:", re.S)),
    (AnswerStyle.COT, re.compile(r"(?:^|\n)Q: (.+?)\n\s*A:", re.S)),
)


def find_question(prompt: str) -> tuple[str, AnswerStyle] | None:
    """The question being asked and the answer style its task expects, or None."""
    best: tuple[int, str, AnswerStyle] | None = None
    for style, pattern in _SHAPES:
        matches = list(pattern.finditer(prompt))
        if not matches:
            continue
        last = matches[-1]
        if best is None or last.start(1) > best[0]:
            best = (last.start(1), last.group(1), style)
    if best is None:
        return None
    # a shot's text can swallow an earlier marker; keep only what follows the last one
    text = re.split(r"(?:^|\n)(?:Question|Q|Problem): ", best[1])[-1]
    return text.strip(), best[2]


def _unit(*parts: str) -> float:
    digest = hashlib.sha256("\x1f".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_right(
    question: str, seed: str, accuracy: float, fp8: bool, fp8_loss: float, fp8_churn: float
) -> bool:
    """The deterministic draw: BF16 right with `accuracy`; FP8 churns, then loses, from there.

    Churn is balanced: it makes `fp8_churn` of all questions discordant, half each way, so
    on its own it leaves the expected accuracy unchanged. Loss then turns `fp8_loss` of the
    right answers wrong, so the FP8 arm's expected accuracy is `accuracy * (1 - fp8_loss)`.
    """
    key = normalise(question)
    right = _unit(seed, "base", key) < accuracy
    if not fp8:
        return right
    share = accuracy if right else 1.0 - accuracy
    if share > 0 and _unit(seed, "churn", key) < min(1.0, fp8_churn / (2 * share)):
        right = not right
    if right and _unit(seed, "loss", key) < fp8_loss:
        right = False
    return right


def _wrong_number(final: str, question: str, seed: str) -> str:
    value = int(float(final.replace(",", "")))
    key = normalise(question)
    offset = 1 + int(_unit(seed, "offset", key) * 9)
    wrong = value + offset if value < 10 or _unit(seed, "sign", key) < 0.5 else value - offset
    return str(wrong)


def _steps(solution: str) -> list[str]:
    return [_CALC.sub("", line).strip() for line in solution.strip().splitlines() if line.strip()]


def write_answer(problem: Problem, style: AnswerStyle, right: bool, seed: str) -> str:
    """A short chain of thought ending in the form the task's strict filter extracts."""
    number = problem.final if right else _wrong_number(problem.final, problem.question, seed)
    steps = _steps(problem.solution)
    if not right and steps:
        # a slip in the last step, like a real wrong answer: the reasoning leads elsewhere
        steps[-1] = re.sub(r"-?[0-9][0-9,]*(?:\.[0-9]+)?(?!.*[0-9])", number, steps[-1], count=1)
    if style is AnswerStyle.HASH:
        return " " + "\n".join([*steps, f"#### {number}"])
    reasoning = " ".join(steps)
    if style is AnswerStyle.COT:
        return f" {reasoning} The answer is {number}."
    if style is AnswerStyle.LLAMA:
        return f"{reasoning} The final answer is {number}"
    return f"{reasoning} The answer is {number}.\n#### {number}"


GARBAGE = (
    "I am not able to work this out with the information given. Let me restate the problem "
    "and think about what is being asked before going further."
)

_FILLER = (
    "That is a good question.",
    "Here is a short answer.",
    "It depends on the details of the situation.",
    "In most cases the simplest explanation is the right one.",
    "Let me know if you would like more detail on any part of this.",
    "The main idea is to break the problem into smaller steps.",
    "Each step can then be checked on its own.",
)


def write_filler(prompt: str) -> str:
    """Plausible text for a prompt that is not a GSM8K question (deterministic per prompt)."""
    start = int(_unit("filler", prompt) * len(_FILLER))
    count = 3 + int(_unit("filler-len", prompt) * 3)
    return " " + " ".join(_FILLER[(start + i) % len(_FILLER)] for i in range(count))


@dataclass
class Answerer:
    """Writes the engine's text for a prompt: GSM8K answers, garbage, or filler."""

    index: Gsm8kIndex | None
    seed: str
    accuracy: float
    fp8: bool
    fp8_loss: float
    fp8_churn: float
    garbage: bool
    context: ContextModel | None = None  # FP8 error by cached tokens (None: none)
    niah_accuracy: float = 0.97  # BF16 needle retrieval accuracy

    def _loss(self, tokens: int) -> float:
        if self.context is None:
            return self.fp8_loss
        return self.context.loss(self.fp8_loss, tokens)

    def text(self, prompt: str, chat: bool, context_tokens: int = 0) -> str:
        """The answer to `prompt`; `context_tokens` is the prompt's length in engine tokens."""
        if self.garbage:
            return " " + GARBAGE
        needle = find_needle(prompt)
        if needle is not None:
            right = is_right(
                item_key(needle),
                self.seed,
                self.niah_accuracy,
                self.fp8,
                self._loss(context_tokens),
                self.fp8_churn,
            )
            return write_needle_answer(needle, right, self.seed)
        found = find_question(prompt)
        problem = None
        style = AnswerStyle.BOTH
        if found is not None and self.index is not None:
            problem = self.index.get(found[0])
            style = found[1]
        elif self.index is not None:
            problem = self.index.get(prompt)  # a bare question, e.g. a zero-shot chat turn
        if problem is None:
            return write_filler(prompt)
        right = is_right(
            problem.question,
            self.seed,
            self.accuracy,
            self.fp8,
            self._loss(context_tokens),
            self.fp8_churn,
        )
        answer = write_answer(problem, style, right, self.seed)
        if chat:
            return answer.strip()
        # a base model keeps going with the next few-shot turn until a stop string cuts it
        marker = {AnswerStyle.HASH: "Question:", AnswerStyle.COT: "Q:"}.get(style)
        return answer + (f"\n\n{marker} " + write_filler(prompt).strip() if marker else "")
