"""kvgate.sim.context and kvgate.sim.needle: FP8 error by cached tokens, log-probs, needles."""

from __future__ import annotations

import random

import pytest

from kvgate.sim.config import SimConfigError, read_env
from kvgate.sim.context import ContextCurve, ContextModel, CurveError
from kvgate.sim.needle import find_needle, write_needle_answer

PIECES = ["The", " grass", " is", " green", "."] * 400  # 2000 positions


def test_curve_is_linear_in_log2_tokens_and_flat_outside() -> None:
    curve = ContextCurve.parse("4096:0,16384:0.02,131072:0.08")
    assert curve.level(100) == 0.0
    assert curve.level(8192) == pytest.approx(0.01)
    assert curve.level(16384) == pytest.approx(0.02)
    assert curve.level(32768) == pytest.approx(0.04)
    assert curve.level(10**7) == pytest.approx(0.08)
    assert ContextCurve.parse("").level(10**6) == 0.0


@pytest.mark.parametrize("raw", ["4096", "x:0.1", "4096:1.5", "0:0.1"])
def test_bad_curves_are_refused(raw: str) -> None:
    with pytest.raises(CurveError):
        ContextCurve.parse(raw)


def test_env_reads_the_curve_and_the_collapse_fault() -> None:
    env = read_env(
        "vllm",
        {
            "KVGATE_SIM_FP8_CONTEXT": "1024:0,8192:0.5",
            "KVGATE_SIM_FAULTS": "long-context-collapse=16384",
            "KVGATE_SIM_LOGPROB_JITTER": "0",
        },
    )
    assert env.faults.long_context_collapse == 16384
    assert env.fp8_context.level(8192) == 0.5 and env.logprob_jitter == 0.0
    for bad in ("long-context-collapse", "long-context-collapse=0", "long-context-collapse=x"):
        with pytest.raises(SimConfigError, match="long-context-collapse"):
            read_env("vllm", {"KVGATE_SIM_FAULTS": bad})
    with pytest.raises(SimConfigError, match="KVGATE_SIM_FP8_CONTEXT"):
        read_env("vllm", {"KVGATE_SIM_FP8_CONTEXT": "nonsense"})


def test_collapse_hits_the_fp8_arm_only_from_the_threshold() -> None:
    fp8 = ContextModel(fp8=True, collapse_at=1000)
    bf16 = ContextModel(fp8=False, collapse_at=1000)
    assert fp8.error(999) == 0.0 and fp8.error(1000) == 1.0
    assert bf16.error(10**6) == 0.0
    assert fp8.loss(0.1, 999) == pytest.approx(0.1) and fp8.loss(0.1, 1000) == 1.0


def test_logprobs_repeat_exactly_without_jitter_and_nearly_with_it() -> None:
    still = ContextModel(fp8=False, jitter=0.0)
    a = still.sequence_logprobs(PIECES[:200])
    b = still.sequence_logprobs(PIECES[:200])
    assert a[0] is None and a == b
    noisy = ContextModel(fp8=False, jitter=0.02)
    c = noisy.sequence_logprobs(PIECES[:200], rng=random.Random(1))
    d = noisy.sequence_logprobs(PIECES[:200], rng=random.Random(2))
    assert c != d
    deltas = [abs(x.logprob - y.logprob) for x, y in zip(c[1:], d[1:], strict=True) if x and y]
    assert 0 < max(deltas) < 0.2


def test_fp8_logprobs_diverge_as_the_curve_says() -> None:
    control = ContextModel(fp8=False, jitter=0.0).sequence_logprobs(PIECES)
    fp8 = ContextModel(fp8=True, collapse_at=1500, fp8_logit_noise=0.03, jitter=0.0)
    cand = fp8.sequence_logprobs(PIECES)

    def mean_delta(lo: int, hi: int) -> float:
        pairs = [(control[t], cand[t]) for t in range(lo, hi)]
        return sum(abs(x.logprob - y.logprob) for x, y in pairs if x and y) / (hi - lo)

    assert 0 < mean_delta(1, 1500) < 0.05
    assert mean_delta(1500, 2000) > 1.0
    assert all(x is not None and x.token == PIECES[t] for t, x in enumerate(cand) if t)


def test_top_k_puts_the_actual_token_first_as_vllm_does() -> None:
    (position,) = ContextModel(fp8=False, jitter=0.0).sequence_logprobs(["a", " grass"], 1)
    assert position is not None
    top = position.top_k(3)
    assert next(iter(top)) == " grass" and len(top) in (3, 4)
    ranked = [lp for _, lp in position.top]
    assert ranked == sorted(ranked, reverse=True)
    assert position.rank == [t for t, _ in position.top].index(" grass") + 1


HAYSTACK = "The grass is green. The sky is blue. " * 50
PROMPT = (
    "A special magic number is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the number afterwards.\n"
    f"{HAYSTACK}One of the special magic numbers for quiet-harbor is: 4821937.\n{HAYSTACK}"
    "One of the special magic numbers for sharp-river is: 1112223.\n"
    "What is the special magic number for quiet-harbor mentioned in the provided text? "
    "The special magic number for quiet-harbor mentioned in the provided text is"
)


def test_needle_is_found_and_answered() -> None:
    item = find_needle(PROMPT)
    assert item is not None
    assert item.query == "quiet-harbor" and item.values == ("4821937",)
    assert item.distractors == ("1112223",)
    assert write_needle_answer(item, True, "s") == " 4821937."
    assert write_needle_answer(item, False, "s") == " 1112223."
    assert find_needle("Question: what is 2 + 2?\nAnswer:") is None
