"""kvgate.judge.divergence: top-k KL against hand-computed values, buckets, and the flag rule."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvgate.errors import EvalError, SpecError
from kvgate.judge.divergence import (
    BucketStats,
    DocumentLogprobs,
    ScreenSettings,
    Verdict,
    bucket_edges,
    compare,
    parse_completion,
    screen,
    top1,
    topk_kl,
)


def lp(**probs: float) -> dict[str, float]:
    return {k: math.log(v) for k, v in probs.items()}


def test_kl_full_support_matches_the_closed_form() -> None:
    # 0.5 ln(0.5/0.9) + 0.5 ln(0.5/0.1)
    assert topk_kl(lp(a=0.5, b=0.5), lp(a=0.9, b=0.1)) == pytest.approx(0.5108256238, abs=1e-9)
    assert topk_kl(lp(a=0.9, b=0.1), lp(a=0.5, b=0.5)) == pytest.approx(0.3680642071, abs=1e-9)


def test_kl_of_identical_distributions_is_zero() -> None:
    p = lp(a=0.6, b=0.3)
    assert topk_kl(p, dict(p)) == 0.0


def test_kl_counts_the_tail_as_one_bucket() -> None:
    # P = (0.6, 0.3, tail 0.1), Q = (0.3, 0.6, tail 0.1): 0.6 ln 2 + 0.3 ln 0.5 = 0.3 ln 2
    assert topk_kl(lp(a=0.6, b=0.3), lp(a=0.3, b=0.6)) == pytest.approx(0.3 * math.log(2))


def test_kl_imputes_a_token_the_other_arm_did_not_return() -> None:
    # Q returned a and c (mass 0.95): b gets min(smallest 0.25, unreturned 0.05) = 0.05, and
    # Q's tail is 1 - 0.7 - 0.05 = 0.25.
    expected = 0.2 * math.log(0.2 / 0.05) + 0.1 * math.log(0.1 / 0.25)
    assert topk_kl(lp(a=0.7, b=0.2), lp(a=0.7, c=0.25)) == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx(0.1856298, abs=1e-6)


def test_kl_agrees_with_numpy_on_random_full_distributions() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        p = rng.dirichlet(np.ones(6))
        q = rng.dirichlet(np.ones(6))
        exact = float(np.sum(p * np.log(p / q)))
        ps = {str(i): math.log(x) for i, x in enumerate(p)}
        qs = {str(i): math.log(x) for i, x in enumerate(q)}
        assert topk_kl(ps, qs) == pytest.approx(exact, rel=1e-9, abs=1e-12)


def test_coarse_kl_is_at_most_the_full_kl() -> None:
    rng = np.random.default_rng(11)
    for _ in range(50):
        p = rng.dirichlet(np.ones(12))
        q = rng.dirichlet(np.ones(12))
        full = float(np.sum(p * np.log(p / q)))
        top = np.argsort(-p)[:4]
        ps = {str(i): math.log(p[i]) for i in top}
        qs = {str(i): math.log(q[i]) for i in top}  # Q known on P's tokens
        assert 0.0 <= topk_kl(ps, qs) <= full + 1e-12


def test_top1_is_the_most_likely_token() -> None:
    assert top1(lp(a=0.2, b=0.7, c=0.1)) == "b"


def doc(*positions: dict[str, float] | None) -> DocumentLogprobs:
    return DocumentLogprobs(tuple(f"t{i}" for i in range(len(positions))), tuple(positions))


def test_compare_buckets_positions_and_skips_the_first_token() -> None:
    same = lp(a=0.5, b=0.5)
    other = lp(a=0.9, b=0.1)
    ref = doc(None, same, same, same)
    cand = doc(None, same, other, lp(a=0.1, b=0.9))
    rows = compare([ref], [cand], [0, 2, 4])
    assert [r.positions for r in rows] == [1, 2]
    assert rows[0].mean_kl == 0.0 and rows[0].top1_agreement == 1.0
    assert rows[1].mean_kl == pytest.approx(0.5108256238)  # both 0.5108 by symmetry
    assert rows[1].top1_agreement == 0.5  # a vs a (tie broken to first), a vs b


def test_compare_refuses_documents_tokenised_differently() -> None:
    with pytest.raises(EvalError, match="tokenised it differently"):
        compare([doc(None, lp(a=1.0))], [doc(None)], [0, 4])


def test_bucket_edges_double_up_past_the_longest_document() -> None:
    assert bucket_edges(5000, 512) == [0, 512, 1024, 2048, 4096, 8192]
    assert bucket_edges(4096, 512) == [0, 512, 1024, 2048, 4096]
    with pytest.raises(SpecError):
        bucket_edges(0)


def stats(low: int, high: int, kl: float, agreement: float, n: int = 100) -> BucketStats:
    return BucketStats(low, high, n, agreement, kl, kl, kl)


def test_screen_flags_only_the_bucket_above_factor_times_floor() -> None:
    floor = [stats(0, 4096, 2e-3, 0.99), stats(4096, 8192, 2e-3, 0.99)]
    cand = [stats(0, 4096, 1.9e-2, 0.98), stats(4096, 8192, 2.1e-2, 0.98)]
    verdict, rows = screen(floor, cand, ScreenSettings(factor=10))
    assert verdict is Verdict.FLAG
    assert [r.flagged for r in rows] == [False, True]
    assert rows[1].reasons == ("kl_above_floor",)
    assert rows[1].to_dict()["kl_ratio"] == pytest.approx(10.5)


def test_screen_uses_the_minimum_floor_when_the_control_is_bit_identical() -> None:
    floor = [stats(0, 512, 0.0, 1.0)]
    verdict, rows = screen(floor, [stats(0, 512, 5e-3, 0.999)], ScreenSettings(factor=10))
    assert verdict is Verdict.PASS and rows[0].kl_limit == pytest.approx(1e-2)
    verdict, rows = screen(floor, [stats(0, 512, 5e-3, 0.9)], ScreenSettings(factor=10))
    assert verdict is Verdict.FLAG and rows[0].reasons == ("top1_disagreement_above_floor",)


def test_screen_with_nothing_compared_is_an_error() -> None:
    with pytest.raises(EvalError):
        screen([stats(0, 512, 0.0, 1.0, n=0)], [stats(0, 512, 0.0, 1.0, n=0)], ScreenSettings())


def test_settings_are_checked() -> None:
    with pytest.raises(SpecError):
        ScreenSettings(factor=0.5)
    with pytest.raises(SpecError):
        ScreenSettings(min_kl=0.0)


def test_parse_completion_reads_the_vllm_echo_shape() -> None:
    body = {
        "choices": [
            {
                "index": 0,
                "text": "a b",
                "logprobs": {
                    "text_offset": [0, 1],
                    "token_logprobs": [None, -0.1],
                    "tokens": ["a", " b"],
                    "top_logprobs": [None, {" b": -0.1, " c": -2.5}],
                },
            }
        ]
    }
    parsed = parse_completion(body, "arm")
    assert parsed.tokens == ("a", " b") and parsed.top == (None, {" b": -0.1, " c": -2.5})


@pytest.mark.parametrize(
    "top",
    [[None, {"x": 0.5}], [None, {"x": float("nan")}], [None, "x"], [None, {}], [None]],
)
def test_parse_completion_refuses_what_is_not_log_probs(top: list[object]) -> None:
    body = {"choices": [{"logprobs": {"tokens": ["a", "b"], "top_logprobs": top}}]}
    with pytest.raises(EvalError):
        parse_completion(body, "arm")


def test_parse_completion_without_logprobs_is_an_error() -> None:
    with pytest.raises(EvalError, match="no choices"):
        parse_completion({"choices": [{"text": "x", "logprobs": None}]}, "arm")
