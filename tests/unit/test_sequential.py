"""The sequential gate keeps its error rate: seeded simulations of paired Bernoulli runs.

Each simulated question is a loss (control right, candidate wrong) with probability churn + loss,
a win with probability churn, else concordant. The gate sees cumulative counts at its looks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvgate.evaluation.gate import (
    CONTINUE,
    DEFAULT_CHUNK,
    FAIL,
    GSM8K_TEST_QUESTIONS,
    PASS,
    GatePlan,
    decide_arrays,
    plan_gate,
)

RUNS = 2000
ALPHA = 0.05


def _simulate(
    plan: GatePlan, loss: float, churn: float, seed: int, runs: int = RUNS
) -> tuple[np.ndarray, np.ndarray]:
    """Outcome code and questions used per run."""
    rng = np.random.default_rng(seed)
    u = rng.random((runs, plan.total))
    losses = np.cumsum(u < churn + loss, axis=1)
    wins = np.cumsum((u >= churn + loss) & (u < 2 * churn + loss), axis=1)
    outcome = np.full(runs, CONTINUE, dtype=np.int8)
    used = np.zeros(runs, dtype=int)
    for k, n in enumerate(plan.looks):
        open_ = outcome == CONTINUE
        codes = decide_arrays(
            plan, k, np.full(open_.sum(), n), losses[open_, n - 1], wins[open_, n - 1]
        )
        outcome[open_] = codes
        used[open_] = n
    assert (outcome != CONTINUE).all()
    return outcome, used


def _mc_tolerance(p: float, runs: int) -> float:
    return 3 * math.sqrt(p * (1 - p) / runs)


@pytest.fixture(scope="module")
def default_plan() -> GatePlan:
    return plan_gate(GSM8K_TEST_QUESTIONS, chunk=DEFAULT_CHUNK, margin=0.02, confidence=0.95)


@pytest.mark.parametrize(("churn", "seed"), [(0.015, 1), (0.025, 2)])
def test_false_promotion_at_the_margin_stays_at_alpha(
    default_plan: GatePlan, churn: float, seed: int
) -> None:
    # GIVEN a candidate that is truly 2 points (the margin) worse
    outcome, _ = _simulate(default_plan, loss=0.02, churn=churn, seed=seed)
    # THEN the gate promotes it at most α of the time (plus Monte Carlo noise)
    assert (outcome == PASS).mean() <= ALPHA + _mc_tolerance(ALPHA, RUNS)


def test_naive_peeking_would_inflate_the_error(default_plan: GatePlan) -> None:
    # The same looks with the fixed-n boundary at each: shows the simulation can see inflation.
    naive = GatePlan(
        default_plan.looks,
        tuple([1.6448536] * len(default_plan.looks)),
        default_plan.margin,
        default_plan.confidence,
        default_plan.harm_z,
    )
    outcome, _ = _simulate(naive, loss=0.02, churn=0.02, seed=3)
    assert (outcome == PASS).mean() > ALPHA + _mc_tolerance(ALPHA, RUNS)


def test_ten_point_loss_stops_at_the_first_look_in_most_runs() -> None:
    plan = plan_gate(GSM8K_TEST_QUESTIONS, chunk=100, margin=0.02, confidence=0.95)
    outcome, used = _simulate(plan, loss=0.10, churn=0.02, seed=4)
    assert (outcome == PASS).sum() == 0
    assert (used == 100).mean() > 0.5
    assert (outcome == FAIL).all()


def test_ten_point_loss_uses_under_100_questions_on_average(default_plan: GatePlan) -> None:
    outcome, used = _simulate(default_plan, loss=0.10, churn=0.02, seed=5)
    assert (outcome == FAIL).all()
    assert used.mean() < 100


def test_broken_candidate_fails_at_the_first_look(default_plan: GatePlan) -> None:
    # Every right control answer turns wrong (garbage output): loss = accuracy.
    outcome, used = _simulate(default_plan, loss=0.9, churn=0.0, seed=6, runs=200)
    assert (outcome == FAIL).all()
    assert (used == default_plan.looks[0]).all()


def test_no_loss_is_promoted_within_the_test_set(default_plan: GatePlan) -> None:
    outcome, used = _simulate(default_plan, loss=0.0, churn=0.02, seed=7)
    assert (outcome == PASS).mean() >= 0.80
    assert used.max() <= GSM8K_TEST_QUESTIONS
