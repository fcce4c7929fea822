"""Every claim the sequential gate prints holds at its stated confidence: seeded simulations.

Each simulated run draws each look's new questions as losses (control right, candidate wrong)
with probability churn + loss and wins with probability churn (binomial per look). The gate
sees cumulative counts at its looks. Tolerances are 3 Monte Carlo standard errors of the
stated rate (so a correct gate fails a test about 0.1% of the time per check, with fixed seeds
never). bench/bench_accuracy_gate.py runs the same with 200,000 runs per row.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvgate.evaluation.gate import (
    DEFAULT_CHUNK,
    GSM8K_TEST_QUESTIONS,
    NONE,
    NONINFERIOR,
    NOT_SHOWN,
    WORSE_THAN_CONTROL,
    WORSE_THAN_MARGIN,
    GatePlan,
    plan_gate,
    reason_arrays,
)
from kvgate.judge.stats import tango_statistics, z_one_sided

RUNS = 4000
ALPHA = 0.05  # pass claim: one-sided 95%
FAIL_ALPHA = 0.025  # fail claims: one-sided 97.5%


def _simulate(
    plan: GatePlan,
    loss: float,
    churn: float | tuple[float, float],
    seed: int,
    runs: int = RUNS,
) -> dict[str, np.ndarray]:
    """Reason code, questions used and counts at the stop, per run."""
    rng = np.random.default_rng(seed)
    c = rng.uniform(*churn, size=runs) if isinstance(churn, tuple) else np.full(runs, churn)
    p_loss = c + loss
    steps = np.diff(np.asarray(plan.looks), prepend=0)
    b_inc = np.stack([rng.binomial(m, p_loss) for m in steps], axis=1)
    c_inc = np.stack(
        [rng.binomial(m - b_inc[:, k], c / (1 - p_loss)) for k, m in enumerate(steps)], axis=1
    )
    b, w = np.cumsum(b_inc, axis=1), np.cumsum(c_inc, axis=1)
    reason = np.full(runs, NONE, dtype=np.int8)
    stop = np.zeros(runs, dtype=int)
    for k, n in enumerate(plan.looks):
        open_ = reason == NONE
        if not open_.any():
            break
        reason[open_] = reason_arrays(plan, k, np.full(open_.sum(), n), b[open_, k], w[open_, k])
        stop[open_] = k
    assert (reason != NONE).all()
    idx = np.arange(runs)
    return {
        "reason": reason,
        "stop": stop,
        "used": np.asarray(plan.looks)[stop],
        "losses": b[idx, stop],
        "wins": w[idx, stop],
    }


def _tol(p: float, runs: int = RUNS) -> float:
    return 3 * math.sqrt(p * (1 - p) / runs)


def _fail(reason: np.ndarray) -> np.ndarray:
    return (reason == WORSE_THAN_MARGIN) | (reason == WORSE_THAN_CONTROL)


@pytest.fixture(scope="module")
def plan() -> GatePlan:
    return plan_gate(GSM8K_TEST_QUESTIONS, chunk=DEFAULT_CHUNK, margin=0.02, confidence=0.95)


@pytest.mark.parametrize(("churn", "seed"), [(0.0, 1), (0.015, 2), (0.03, 3)])
def test_false_promotion_at_the_margin_stays_at_alpha(
    plan: GatePlan, churn: float, seed: int
) -> None:
    # GIVEN a candidate that is truly 2 points (the margin) worse
    run = _simulate(plan, loss=0.02, churn=churn, seed=seed)
    # THEN the gate promotes it at most α of the time (plus Monte Carlo noise)
    assert (run["reason"] == NONINFERIOR).mean() <= ALPHA + _tol(ALPHA)


@pytest.mark.parametrize(("churn", "seed"), [(0.0, 4), (0.015, 5), (0.03, 6)])
def test_fail_worse_than_the_margin_is_false_at_most_at_its_alpha(
    plan: GatePlan, churn: float, seed: int
) -> None:
    # A loss exactly at the margin: "shown worse than the margin" is false every time it is said.
    # The old uncorrected stop (T ≤ -1.645 at each of 27 looks) said it ~25% of the time.
    run = _simulate(plan, loss=0.02, churn=churn, seed=seed)
    assert (run["reason"] == WORSE_THAN_MARGIN).mean() <= FAIL_ALPHA + _tol(FAIL_ALPHA)


def test_old_uncorrected_harm_stop_was_wrong_a_quarter_of_the_time(plan: GatePlan) -> None:
    # The counter-example: the same looks with the fixed-n z at each as a harm boundary on
    # T(-margin). This shows the simulation sees the inflation the new boundary removes.
    rng = np.random.default_rng(7)
    steps = np.diff(np.asarray(plan.looks), prepend=0)
    p_loss, churn = 0.04, 0.02
    b = np.cumsum(np.stack([rng.binomial(m, p_loss, RUNS) for m in steps], axis=1), axis=1)
    inc = np.diff(b, axis=1, prepend=0)
    w_inc = rng.binomial(steps - inc, churn / (1 - p_loss))
    w = np.cumsum(w_inc, axis=1)
    n = np.broadcast_to(np.asarray(plan.looks), b.shape)
    t = tango_statistics(n, b, w, -0.02)
    passed_before = np.maximum.accumulate(t >= np.asarray(plan.boundaries), axis=1)
    harm = (t <= -z_one_sided(0.95)) & ~passed_before
    assert harm.any(axis=1).mean() > 0.15


@pytest.mark.parametrize(("churn", "seed"), [(0.01, 8), (0.03, 9)])
def test_no_loss_rarely_fails_and_never_beyond_alpha(
    plan: GatePlan, churn: float, seed: int
) -> None:
    # The old gate hard-failed 3.9% of candidates with no loss (mostly in the first 150
    # questions); "worse than control" is now false at most 2.5% of the time.
    run = _simulate(plan, loss=0.0, churn=churn, seed=seed)
    fails = _fail(run["reason"])
    assert fails.mean() <= FAIL_ALPHA + _tol(FAIL_ALPHA)
    assert (fails & (run["used"] <= 150)).mean() <= 0.01


@pytest.mark.parametrize(
    ("loss", "churn", "seed"), [(0.01, 0.02, 10), (0.02, 0.02, 11), (0.02, 0.03, 12)]
)
def test_largest_loss_ruled_out_holds_at_95_percent_after_the_looks(
    plan: GatePlan, loss: float, churn: float, seed: int
) -> None:
    # The reported lower bound L solves T(L) = e_k at the stopping look, so it is above the
    # truth (the bound is wrong) iff T(truth) ≥ e_k there. The single-look bound (z = 1.645)
    # was wrong 5.7-7.5% of the time for true losses of 1-2 points.
    run = _simulate(plan, loss=loss, churn=churn, seed=seed, runs=20_000)
    t_truth = tango_statistics(run["used"], run["losses"], run["wins"], -loss)
    wrong = t_truth >= np.asarray(plan.boundaries)[run["stop"]]
    assert wrong.mean() <= ALPHA + _tol(ALPHA, 20_000)
    if loss == 0.01:
        single_look_wrong = t_truth >= z_one_sided(0.95)
        assert single_look_wrong.mean() > ALPHA + _tol(ALPHA, 20_000)


@pytest.mark.parametrize(("loss", "seed"), [(0.05, 13), (0.10, 14)])
def test_smallest_loss_shown_holds_at_its_confidence(
    plan: GatePlan, loss: float, seed: int
) -> None:
    # The upper bound U (T(U) = -f_k, below 0 only on a fail) is below the truth at most 2.5%.
    run = _simulate(plan, loss=loss, churn=0.03, seed=seed)
    t_truth = tango_statistics(run["used"], run["losses"], run["wins"], -loss)
    wrong = (t_truth <= -np.asarray(plan.fail_boundaries)[run["stop"]]) & _fail(run["reason"])
    assert wrong.mean() <= FAIL_ALPHA + _tol(FAIL_ALPHA)


def test_no_loss_is_promoted_at_95_percent_within_720_questions(plan: GatePlan) -> None:
    # Churn U(0%, 3%) each way; the 200,000-run study gives P(promote) ≈ 0.966, mean ≈ 703.
    run = _simulate(plan, loss=0.0, churn=(0.0, 0.03), seed=15, runs=8000)
    promoted = (run["reason"] == NONINFERIOR).mean()
    assert promoted >= 0.95
    assert run["used"].mean() <= 720
    assert run["used"].max() <= GSM8K_TEST_QUESTIONS


@pytest.mark.parametrize(("loss", "limit", "seed"), [(0.05, 300, 16), (0.10, 120, 17)])
def test_large_losses_stop_early(plan: GatePlan, loss: float, limit: int, seed: int) -> None:
    # Mean questions, churn U(0%, 3%): ≈ 285 at 5 points and ≈ 117 at 10 points (200,000 runs);
    # the bound allows 3 standard errors of the mean.
    run = _simulate(plan, loss=loss, churn=(0.0, 0.03), seed=seed)
    assert _fail(run["reason"]).mean() >= 0.99
    used = run["used"]
    assert used.mean() <= limit + 3 * used.std() / math.sqrt(RUNS)


def test_broken_candidate_fails_at_the_first_look(plan: GatePlan) -> None:
    # Every right control answer turns wrong (garbage output): loss = accuracy.
    run = _simulate(plan, loss=0.9, churn=0.0, seed=18, runs=200)
    assert (run["reason"] == WORSE_THAN_MARGIN).all()
    assert (run["used"] == plan.looks[0]).all()


def test_last_look_always_decides(plan: GatePlan) -> None:
    run = _simulate(plan, loss=0.01, churn=0.03, seed=19, runs=1000)
    last = run["stop"] == len(plan.looks) - 1
    assert (run["reason"][~last] != NOT_SHOWN).all()
    assert set(np.unique(run["reason"][last])) <= {NONINFERIOR, WORSE_THAN_CONTROL, NOT_SHOWN}
