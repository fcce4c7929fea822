"""kvgate.sim GSM8K answers, checked with lm-eval's own task YAMLs and regex filters."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import lm_eval
import pytest
import yaml
from lm_eval.filters.extraction import RegexFilter

from kvgate.sim import gsm8k
from kvgate.sim.config import default_gsm8k_dir
from kvgate.sim.gsm8k import Answerer

TASKS = Path(lm_eval.__file__).parent / "tasks" / "gsm8k"
DATA = Path(os.environ.get("KVGATE_GSM8K_DIR") or default_gsm8k_dir())


def _rows(split: str) -> list[dict[str, str]]:
    with (DATA / f"{split}.jsonl").open() as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture(scope="module")
def index() -> gsm8k.Gsm8kIndex:
    return gsm8k.Gsm8kIndex.load(DATA)


@pytest.fixture(scope="module")
def test_rows() -> list[dict[str, str]]:
    return _rows("test")


def _task(name: str) -> dict:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)  # !function tags
    return yaml.load((TASKS / name).read_text(), Loader=Loader)


def _filters(task: dict) -> dict[str, RegexFilter]:
    filters = {}
    for entry in task["filter_list"]:
        regex = entry["filter"][0]
        filters[entry["name"]] = RegexFilter(
            regex_pattern=regex["regex_pattern"], group_select=regex.get("group_select", 0)
        )
    return filters


def _extract(flt: RegexFilter, text: str) -> str:
    return next(iter(flt.apply([[text]], [None])))[0]


def _clean(answer: str) -> str:
    # the exact_match metric's regexes_to_ignore (",", "$", "(?s).*#### ", "\.$")
    import re

    for pattern in (",", r"\$", r"(?s).*#### ", r"\.$"):
        answer = re.sub(pattern, "", answer)
    return answer.strip().lower()


def gsm8k_prompt(question: str, shots: list[dict[str, str]]) -> str:
    """lm-eval's gsm8k: `Question: q\\nAnswer: a` shots joined by a blank line."""
    parts = [f"Question: {s['question']}\nAnswer: {s['answer']}" for s in shots]
    return "\n\n".join([*parts, f"Question: {question}\nAnswer:"])


def cot_prompt(question: str) -> str:
    task = _task("gsm8k-cot.yaml")
    parts = [f"Q: {s['question']}\nA: {s['target']}" for s in task["fewshot_config"]["samples"]]
    return "\n\n".join([*parts, f"Q: {question}\nA:"])


def test_index_holds_both_splits(index: gsm8k.Gsm8kIndex, test_rows: list[dict[str, str]]) -> None:
    assert len(index) >= 7_473 + 1_319 - 20  # a handful of questions appear in both splits
    row = test_rows[0]
    assert (
        index.get("  " + row["question"].upper() + "\n").final
        == row["answer"].rsplit("#### ", 1)[1]
    )


def test_finds_the_last_question_in_a_gsm8k_prompt(test_rows: list[dict[str, str]]) -> None:
    shots = _rows("train")[:5]
    found = gsm8k.find_question(gsm8k_prompt(test_rows[7]["question"], shots))
    assert found == (test_rows[7]["question"].strip(), gsm8k.AnswerStyle.HASH)


def test_finds_the_last_question_in_a_cot_prompt(test_rows: list[dict[str, str]]) -> None:
    found = gsm8k.find_question(cot_prompt(test_rows[3]["question"]))
    assert found == (test_rows[3]["question"].strip(), gsm8k.AnswerStyle.COT)


def test_finds_the_question_in_a_llama_prompt(test_rows: list[dict[str, str]]) -> None:
    task = _task("gsm8k-cot-llama.yaml")
    text = task["doc_to_text"].replace("{{question}}", test_rows[5]["question"])
    assert gsm8k.find_question(text) == (test_rows[5]["question"].strip(), gsm8k.AnswerStyle.LLAMA)


def test_unknown_prompt_has_no_question() -> None:
    assert gsm8k.find_question("Tell me about the weather.") is None


@pytest.mark.parametrize(("task_file", "style"), [("gsm8k.yaml", gsm8k.AnswerStyle.HASH), ("gsm8k-cot.yaml", gsm8k.AnswerStyle.COT), ("gsm8k-cot-llama.yaml", gsm8k.AnswerStyle.LLAMA), ("gsm8k.yaml", gsm8k.AnswerStyle.BOTH), ("gsm8k-cot.yaml", gsm8k.AnswerStyle.BOTH)])  # fmt: skip
def test_both_filters_extract_the_intended_number(
    index: gsm8k.Gsm8kIndex,
    test_rows: list[dict[str, str]],
    task_file: str,
    style: gsm8k.AnswerStyle,
) -> None:
    filters = _filters(_task(task_file))
    for row in test_rows[:300]:
        problem = index.get(row["question"])
        gold = _clean(problem.final)
        for right in (True, False):
            text = gsm8k.write_answer(problem, style, right, "seed")
            for name, flt in filters.items():
                got = _clean(_extract(flt, text))
                assert (got == gold) is right, f"{name} on {text!r}: {got!r} vs {gold!r}"


def test_completion_stops_at_the_tasks_until(
    index: gsm8k.Gsm8kIndex, test_rows: list[dict[str, str]]
) -> None:
    from kvgate.sim.textgen import plan_output

    task = _task("gsm8k.yaml")
    answerer = Answerer(index, "seed", 1.0, False, 0.0, 0.0, False)
    question = test_rows[11]["question"]
    text = answerer.text(gsm8k_prompt(question, _rows("train")[:5]), chat=False)
    pieces, reason = plan_output(text, task["generation_kwargs"]["until"], 256)
    output = "".join(pieces)
    assert reason == "stop"
    assert "Question:" not in output
    assert _clean(_extract(_filters(task)["strict-match"], output)) == _clean(
        index.get(question).final
    )


def test_draw_is_deterministic_and_order_free(test_rows: list[dict[str, str]]) -> None:
    questions = [row["question"] for row in test_rows[:200]]
    first = {q: gsm8k.is_right(q, "s", 0.9, True, 0.05, 0.02) for q in questions}
    shuffled = questions[:]
    random.Random(3).shuffle(shuffled)
    assert {q: gsm8k.is_right(q, "s", 0.9, True, 0.05, 0.02) for q in shuffled} == first
    other_seed = {q: gsm8k.is_right(q, "t", 0.9, True, 0.05, 0.02) for q in questions}
    assert other_seed != first


def _binomial_ok(count: int, n: int, p: float, sigmas: float = 4.0) -> bool:
    return abs(count - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1


@pytest.mark.parametrize("accuracy", [0.918, 0.6])
def test_base_accuracy_and_fp8_discordance(
    test_rows: list[dict[str, str]], accuracy: float
) -> None:
    loss, churn = 0.05, 0.02
    questions = [row["question"] for row in test_rows]
    n = len(questions)
    control = [gsm8k.is_right(q, "kvgate", accuracy, False, loss, churn) for q in questions]
    candidate = [gsm8k.is_right(q, "kvgate", accuracy, True, loss, churn) for q in questions]
    assert _binomial_ok(sum(control), n, accuracy)
    control_only = sum(c and not d for c, d in zip(control, candidate, strict=True))
    candidate_only = sum(d and not c for c, d in zip(control, candidate, strict=True))
    # churn: `churn` of all questions flip, half each way; then `loss` of the right ones fail
    p_control_only = churn / 2 + (accuracy - churn / 2) * loss
    p_candidate_only = churn / 2 * (1 - loss)
    assert _binomial_ok(control_only, n, p_control_only)
    assert _binomial_ok(candidate_only, n, p_candidate_only)
    assert candidate_only > 0 and control_only > candidate_only
    assert _binomial_ok(sum(candidate), n, accuracy * (1 - loss))


def test_churn_alone_keeps_accuracy(test_rows: list[dict[str, str]]) -> None:
    questions = [row["question"] for row in test_rows]
    control = sum(gsm8k.is_right(q, "x", 0.918, False, 0.0, 0.05) for q in questions)
    candidate = sum(gsm8k.is_right(q, "x", 0.918, True, 0.0, 0.05) for q in questions)
    assert abs(candidate - control) <= 4 * math.sqrt(len(questions) * 0.05) + 1


def test_bf16_arm_ignores_fp8_settings(test_rows: list[dict[str, str]]) -> None:
    for row in test_rows[:300]:
        q = row["question"]
        assert gsm8k.is_right(q, "x", 0.8, False, 0.5, 0.5) == gsm8k.is_right(
            q, "x", 0.8, False, 0.0, 0.0
        )


def test_garbage_answers_have_no_number(
    index: gsm8k.Gsm8kIndex, test_rows: list[dict[str, str]]
) -> None:
    answerer = Answerer(index, "seed", 1.0, False, 0.0, 0.0, garbage=True)
    text = answerer.text(cot_prompt(test_rows[0]["question"]), chat=False)
    for flt in _filters(_task("gsm8k-cot.yaml")).values():
        assert _extract(flt, text) == "[invalid]"


def test_unknown_prompts_get_plain_text(index: gsm8k.Gsm8kIndex) -> None:
    answerer = Answerer(index, "seed", 1.0, False, 0.0, 0.0, False)
    text = answerer.text("Write a haiku about autumn.", chat=True)
    assert len(text.split()) > 5
    assert text == answerer.text("Write a haiku about autumn.", chat=True)


def test_bad_data_file_names_the_line(tmp_path: Path) -> None:
    (tmp_path / "test.jsonl").write_text('{"question": "q", "answer": "no final line"}\n')
    with pytest.raises(ValueError, match=r"test.jsonl:1: answer has no final '#### N' line"):
        gsm8k.Gsm8kIndex.load(tmp_path)


def test_missing_directory_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="KVGATE_GSM8K_DIR"):
        gsm8k.Gsm8kIndex.load(tmp_path / "nope")
