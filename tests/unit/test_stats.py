"""kvgate.judge.stats against the published vectors of reference/eval-stats.md §6.

Sources of the expected values: Wilson table (the published field check, 459/454/458 of 500);
cavo_2012 from contingencytables tests/testthat/test-ch8.R (Fagerland, Lydersen & Laake);
the worked NI examples, sample-size table and O'Brien-Fleming boundaries of §6(b)-(d).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, binomtest

from kvgate.errors import InputError, SpecError
from kvgate.judge.stats import (
    ArmResult,
    PairedCounts,
    analyse_paired,
    lower_confidence_bound,
    mcnemar_exact_p,
    noninferiority_p,
    obf_spending,
    power_spending,
    questions_needed,
    score_limit,
    sequential_boundaries,
    spending,
    stagewise_p,
    tango_interval,
    tango_statistic,
    tango_statistics,
    wilson_interval,
    wilson_lower_bound,
)

# --------------------------------------------------------------------------- Wilson

# (correct, n, 95% low/high in %, 90% low/high in %), §6(a)
WILSON = [
    (459, 500, (89.06, 93.90), (89.55, 93.60)),
    (454, 500, (87.95, 93.03), (88.45, 92.71)),
    (458, 500, (88.84, 93.73), (89.33, 93.42)),
]

# The published field check's table, to one decimal.
FIELD_CHECK = [
    (459, 500, "91.8", "89.1", "93.9"),
    (454, 500, "90.8", "87.9", "93.0"),
    (458, 500, "91.6", "88.8", "93.7"),
]


@pytest.mark.parametrize(("k", "n", "ci95", "ci90"), WILSON)
def test_wilson_matches_published_values(k: int, n: int, ci95: tuple, ci90: tuple) -> None:
    assert [round(100 * x, 2) for x in wilson_interval(k, n, 0.95)] == list(ci95)
    assert [round(100 * x, 2) for x in wilson_interval(k, n, 0.90)] == list(ci90)


@pytest.mark.parametrize(("k", "n", "acc", "low", "high"), FIELD_CHECK)
def test_wilson_reproduces_field_check(k: int, n: int, acc: str, low: str, high: str) -> None:
    arm = ArmResult.from_counts(k, n)
    assert f"{100 * arm.accuracy:.1f}" == acc
    assert (f"{100 * arm.wilson95[0]:.1f}", f"{100 * arm.wilson95[1]:.1f}") == (low, high)


@pytest.mark.parametrize(("k", "n"), [(0, 10), (10, 10), (1, 1), (37, 120), (1318, 1319)])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_wilson_equals_scipy(k: int, n: int, confidence: float) -> None:
    ref = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    low, high = wilson_interval(k, n, confidence)
    assert low == pytest.approx(ref.low, abs=1e-12)
    assert high == pytest.approx(ref.high, abs=1e-12)


@pytest.mark.parametrize(("k", "n"), [(0, 10), (10, 10), (37, 120), (1318, 1319)])
@pytest.mark.parametrize("confidence", [0.55, 0.7, 0.95, 0.999])
def test_the_one_sided_wilson_bound_is_the_two_sided_one_at_2c_minus_1(
    k: int, n: int, confidence: float
) -> None:
    # defined for every confidence in (0.5, 1): 2c-1 is no valid two-sided level below 0.75's
    # twin, so the bound must not be taken through wilson_interval
    ref = binomtest(k, n).proportion_ci(confidence_level=2 * confidence - 1, method="wilson")
    assert wilson_lower_bound(k, n, confidence) == pytest.approx(ref.low, abs=1e-12)


@pytest.mark.parametrize(
    ("k", "n", "confidence", "message"),
    [
        (6, 5, 0.95, "correct: 6 is more than n=5"),
        (0, 0, 0.95, "n: 0 questions; an accuracy needs at least one"),
        (-1, 5, 0.95, "correct: -1 is not a non-negative integer"),
        (1, 5, 1.5, "confidence: 1.5 is not in (0.5, 1); use e.g. 0.95"),
    ],
)
def test_wilson_rejects_bad_input(k: int, n: int, confidence: float, message: str) -> None:
    with pytest.raises(SpecError) as err:
        wilson_interval(k, n, confidence)
    assert str(err.value) == message
    assert isinstance(err.value, InputError)


def test_arm_result_to_dict() -> None:
    d = ArmResult.from_counts(459, 500).to_dict()
    assert set(d) == {"correct", "n", "accuracy", "wilson95"}
    assert d["accuracy"] == 0.918
    assert isinstance(d["wilson95"], list) and len(d["wilson95"]) == 2


# --------------------------------------------------------------------------- paired, cavo_2012

# [[59, 6], [16, 80]]: 59 both right, 6 wins (candidate only), 16 losses, 80 neither.
CAVO = PairedCounts(both=59, control_only=16, candidate_only=6, neither=80)


def test_mcnemar_and_tango_interval_cavo() -> None:
    assert round(mcnemar_exact_p(CAVO), 6) == 0.052479
    assert tuple(round(x, 4) for x in tango_interval(CAVO, 0.95)) == (-0.1240, -0.0054)


# --------------------------------------------------------------------------- worked NI examples

# (a, b, c, d), McNemar exact p, Tango 90% (pp), NI p, PASS
WORKED = [
    (
        (449, 10, 5, 36),
        0.302,
        (-2.44, 0.30),
        0.116,
        False,
    ),
    (
        (444, 15, 10, 31),
        0.424,
        (-2.76, 0.68),
        0.166,
        False,
    ),
    (
        (452, 7, 6, 35),
        1.000,
        (-1.51, 1.08),
        0.016,
        True,
    ),
]


def _pp(interval: tuple[float, float]) -> tuple[float, float]:
    return (round(100 * interval[0], 2), round(100 * interval[1], 2))


@pytest.mark.parametrize(("cells", "p_mc", "tango", "p_ni", "passes"), WORKED)
def test_worked_noninferiority_examples(
    cells: tuple[int, int, int, int],
    p_mc: float,
    tango: tuple,
    p_ni: float,
    passes: bool,
) -> None:
    counts = PairedCounts(*cells)
    assert round(mcnemar_exact_p(counts), 3) == p_mc
    assert _pp(tango_interval(counts, 0.90)) == tango
    assert round(noninferiority_p(counts, 0.02), 3) == p_ni
    analysis = analyse_paired(counts, margin=0.02, confidence=0.95)
    assert analysis.noninferior is passes
    # The decision rule and the score test agree: lower 90% bound > -δ iff T(-δ) > z_0.95.
    assert (analysis.noninferiority_p < 0.05) is passes
    assert analysis.largest_loss_ruled_out == pytest.approx(-tango_interval(counts, 0.90)[0])


def test_same_marginals_different_verdicts() -> None:
    # 459 vs 454 right in both tables; the split of discordant pairs changes the p-value.
    a, b = PairedCounts(449, 10, 5, 36), PairedCounts(444, 15, 10, 31)
    assert a.control().correct == b.control().correct == 459
    assert a.candidate().correct == b.candidate().correct == 454
    assert noninferiority_p(a, 0.02) < noninferiority_p(b, 0.02)


@pytest.mark.parametrize(
    "cells",
    [(0, 0, 0, 10), (10, 0, 0, 0), (0, 10, 0, 0), (0, 0, 10, 0), (5, 0, 0, 5), (3, 1, 0, 0)],
)
def test_tango_interval_edges_stay_in_range(cells: tuple[int, int, int, int]) -> None:
    counts = PairedCounts(*cells)
    low, high = tango_interval(counts, 0.95)
    assert -1.0 <= low <= counts.difference <= high <= 1.0
    assert low < high


@pytest.mark.parametrize(
    "cells", [(449, 10, 5, 36), (59, 16, 6, 80), (100, 0, 0, 0), (0, 3, 0, 0), (40, 2, 9, 1)]
)
@pytest.mark.parametrize("delta0", [-0.2, -0.02, 0.0, 0.05])
def test_vectorised_tango_equals_scalar(cells: tuple[int, int, int, int], delta0: float) -> None:
    counts = PairedCounts(*cells)
    vec = tango_statistics(
        np.array([counts.n]),
        np.array([counts.control_only]),
        np.array([counts.candidate_only]),
        delta0,
    )[0]
    assert vec == pytest.approx(tango_statistic(counts, delta0), rel=1e-12, abs=1e-12)


def test_tango_interval_inverts_the_statistic() -> None:
    counts = PairedCounts(449, 10, 5, 36)
    low, high = tango_interval(counts, 0.95)
    assert tango_statistic(counts, low) == pytest.approx(1.959964, abs=1e-6)
    assert tango_statistic(counts, high) == pytest.approx(-1.959964, abs=1e-6)


def test_lower_bound_is_one_sided() -> None:
    counts = PairedCounts(449, 10, 5, 36)
    assert lower_confidence_bound(counts, 0.95) == tango_interval(counts, 0.90)[0]


def test_paired_counts_from_outcomes_and_addition() -> None:
    outcomes = [(True, True)] * 3 + [(True, False)] * 2 + [(False, True)] + [(False, False)] * 4
    counts = PairedCounts.from_outcomes(outcomes)
    assert counts == PairedCounts(3, 2, 1, 4)
    assert counts + counts == PairedCounts(6, 4, 2, 8)
    assert counts.n == 10 and counts.discordant == 3
    assert counts.difference == pytest.approx(-0.1)


def test_paired_counts_reject_negative() -> None:
    with pytest.raises(SpecError, match="control_only: -1 is not a non-negative integer"):
        PairedCounts(1, -1, 0, 0)


def test_analysis_to_dict_has_cli_keys() -> None:
    d = analyse_paired(PairedCounts(452, 7, 6, 35)).to_dict()
    for key in ("difference", "tango95", "mcnemar_p", "noninferior", "largest_loss_ruled_out"):
        assert key in d
    assert d["tango95"][0] < d["difference"] < d["tango95"][1]


def test_largest_loss_ruled_out_is_zero_when_candidate_is_better() -> None:
    analysis = analyse_paired(PairedCounts(400, 0, 60, 40))
    assert analysis.largest_loss_ruled_out == 0.0
    assert analysis.noninferior


# --------------------------------------------------------------------------- sample size

# (ψ, Δ1, one-sided α, n score), §6(d)
SAMPLE_SIZES = [
    (0.03, 0.0, 0.05, 558),
    (0.04, 0.0, 0.05, 695),
    (0.05, 0.0, 0.05, 837),
    (0.06, 0.0, 0.05, 982),
    (0.08, 0.0, 0.05, 1277),
    (0.03, 0.0, 0.025, 715),
    (0.04, 0.0, 0.025, 888),
    (0.05, 0.0, 0.025, 1067),
    (0.06, 0.0, 0.025, 1250),
    (0.03, -0.005, 0.05, 955),
    (0.04, -0.005, 0.05, 1204),
    (0.05, -0.005, 0.05, 1460),
    (0.06, -0.005, 0.05, 1721),
    (0.03, -0.005, 0.025, 1223),
    (0.06, -0.005, 0.025, 2190),
]


@pytest.mark.parametrize(("psi", "delta1", "alpha", "n_score"), SAMPLE_SIZES)
def test_questions_needed_table(psi: float, delta1: float, alpha: float, n_score: int) -> None:
    assert questions_needed(psi, 0.02, 1 - alpha, 0.8, delta1) == n_score


@pytest.mark.parametrize(
    ("psi", "alpha", "n"),
    [
        (0.03, 0.05, 752),
        (0.05, 0.05, 1146),
        (0.06, 0.05, 1349),
        (0.03, 0.025, 933),
        (0.05, 0.025, 1413),
        (0.06, 0.025, 1660),
    ],
)
def test_questions_needed_at_90_percent_power(psi: float, alpha: float, n: int) -> None:
    assert questions_needed(psi, 0.02, 1 - alpha, 0.9) == n


@pytest.mark.parametrize(("margin", "n"), [(0.01, 3162), (0.015, 1442), (0.02, 837), (0.03, 400)])
def test_questions_needed_other_margins(margin: float, n: int) -> None:
    assert questions_needed(0.05, margin, 0.95) == n


def test_questions_needed_rejects_loss_beyond_margin() -> None:
    with pytest.raises(SpecError, match="true_difference"):
        questions_needed(0.05, 0.02, 0.95, 0.8, true_difference=-0.02)


# --------------------------------------------------------------------------- group-sequential

# (one-sided α, looks as fractions, published boundaries), §6(c)
BOUNDARIES = [
    (0.05, (0.5, 1.0), (2.538, 1.662)),
    (0.05, (1 / 3, 2 / 3, 1.0), (3.200, 2.141, 1.695)),
    (0.05, (500 / 1319, 1000 / 1319, 1.0), (2.977, 1.979, 1.719)),
    (0.025, (0.5, 1.0), (2.963, 1.969)),
    (0.025, (1 / 3, 2 / 3, 1.0), (3.710, 2.511, 1.993)),
    (0.025, (500 / 1319, 1000 / 1319, 1.0), (3.458, 2.328, 2.014)),
]


@pytest.mark.parametrize(("alpha", "fractions", "expected"), BOUNDARIES)
def test_obf_boundaries_match_published(alpha: float, fractions: tuple, expected: tuple) -> None:
    got = sequential_boundaries(fractions, alpha)
    assert tuple(round(z, 3) for z in got) == expected


def test_obf_boundaries_spend_exactly_alpha() -> None:
    # Monte Carlo check of the recursive integration: crossing probability under H0 ≈ α.
    rng = np.random.default_rng(11)
    fractions = np.array([0.25, 0.5, 0.75, 1.0])
    bounds = np.array(sequential_boundaries(fractions, 0.05))
    increments = rng.standard_normal((200_000, 4)) * np.sqrt(np.diff(fractions, prepend=0.0))
    z = np.cumsum(increments, axis=1) / np.sqrt(fractions)
    crossed = (z >= bounds).any(axis=1).mean()
    assert crossed == pytest.approx(0.05, abs=0.0025)


def test_obf_spending_function() -> None:
    assert obf_spending(1.0, 0.05) == pytest.approx(0.05)
    # The first look spends its nominal p: 0.0056 at t = 1/2 and 0.00069 at t = 1/3 (§6(c)).
    assert round(obf_spending(0.5, 0.05), 4) == 0.0056
    assert round(obf_spending(1 / 3, 0.05), 5) == 0.00069
    assert obf_spending(0.0, 0.05) == 0.0


@pytest.mark.parametrize(
    ("fractions", "alpha", "field"),
    [
        ((0.5, 0.4), 0.05, "looks"),
        ((), 0.05, "looks"),
        ((0.5, 1.2), 0.05, "looks"),
        ((1.0,), 0.7, "alpha"),
    ],
)
def test_boundaries_reject_bad_plans(fractions: tuple, alpha: float, field: str) -> None:
    with pytest.raises(SpecError) as err:
        sequential_boundaries(fractions, alpha)
    assert err.value.field == field


def test_single_look_boundary_is_fixed_n_z() -> None:
    assert sequential_boundaries((1.0,), 0.05)[0] == pytest.approx(1.6448536, abs=1e-6)
    assert math.isfinite(sequential_boundaries((0.01, 1.0), 0.05)[0])


@pytest.mark.parametrize("n", [100, 300])
def test_exact_size_of_the_fixed_n_noninferiority_test(n: int) -> None:
    # Enumerate every (losses, wins) outcome at a true loss equal to the margin: the asymptotic
    # score test's real false-pass rate stays near α (it oscillates; worst seen ≈ 0.055).
    worst = 0.0
    for psi in np.linspace(0.021, 0.3, 12):
        p_loss = (psi + 0.02) / 2
        size = 0.0
        for m in range(n + 1):
            pm = binom.pmf(m, n, psi)
            if pm < 1e-13:
                continue
            losses = np.arange(m + 1)
            t = tango_statistics(np.full(m + 1, n), losses, m - losses, -0.02)
            size += pm * binom.pmf(losses, m, p_loss / psi)[t >= 1.6448536].sum()
        worst = max(worst, size)
    assert 0.03 < worst <= 0.06


# --------------------------------------------------------------------------- look-adjusted


def test_score_limit_inverts_the_statistic() -> None:
    for z in (1.645, 2.5, 7.0, -1.96, -3.0):
        d0 = score_limit(CAVO, z)
        assert tango_statistic(CAVO, d0) == pytest.approx(z, abs=1e-7)
    assert score_limit(CAVO, 0.0) == CAVO.difference
    assert score_limit(CAVO, 1.6448536269514722) == pytest.approx(
        lower_confidence_bound(CAVO, 0.95)
    )
    # A boundary the data cannot reach clips to the edge.
    assert score_limit(PairedCounts(0, 1, 0, 0), 3.0) == -1.0
    assert score_limit(PairedCounts(0, 0, 1, 0), -3.0) == 1.0


def test_power_spending() -> None:
    assert power_spending(1.0, 0.025, 0.25) == pytest.approx(0.025)
    assert power_spending(0.0625, 0.025, 0.25) == pytest.approx(0.0125)
    assert spending(0.5, 0.05, "obf") == obf_spending(0.5, 0.05)
    assert spending(0.5, 0.05, "power:2") == pytest.approx(0.0125)
    for bad in ("pocock", "power:-1", "power:x"):
        with pytest.raises(SpecError):
            spending(0.5, 0.05, bad)


def test_power_boundaries_spend_alpha_by_monte_carlo() -> None:
    rng = np.random.default_rng(12)
    fractions = np.array([0.1, 0.2, 0.4, 0.7, 1.0])
    bounds = np.array(sequential_boundaries(fractions, 0.025, "power:0.25"))
    increments = rng.standard_normal((200_000, 5)) * np.sqrt(np.diff(fractions, prepend=0.0))
    z = np.cumsum(increments, axis=1) / np.sqrt(fractions)
    first = (z[:, 0] >= bounds[0]).mean()
    assert first == pytest.approx(power_spending(0.1, 0.025, 0.25), abs=0.001)
    assert (z >= bounds).any(axis=1).mean() == pytest.approx(0.025, abs=0.0012)


def test_stagewise_p_agrees_with_the_boundaries() -> None:
    fractions = [n / 1319 for n in (*range(50, 1319, 50), 1319)]
    bounds = sequential_boundaries(fractions, 0.05)
    last = len(fractions) - 1
    # At a boundary the p is the α spent up to that look; the last boundary spends all of α.
    for k in (0, 5, 13):
        assert stagewise_p(fractions, bounds, k, bounds[k]) == pytest.approx(
            obf_spending(fractions[k], 0.05), rel=1e-3, abs=1e-12
        )
    assert stagewise_p(fractions, bounds, last, bounds[last]) == pytest.approx(0.05, abs=1e-6)
    # Below the last boundary, above α: an INCONCLUSIVE cannot print p < 0.05.
    assert stagewise_p(fractions, bounds, last, 1.70) > 0.05
    # One look: the fixed-n p.
    assert stagewise_p([1.0], [1.6448536], 0, 2.0) == pytest.approx(0.0227501, abs=1e-6)


def test_stagewise_p_by_monte_carlo() -> None:
    rng = np.random.default_rng(13)
    fractions = np.array([0.25, 0.5, 0.75, 1.0])
    bounds = sequential_boundaries(fractions, 0.05)
    increments = rng.standard_normal((200_000, 4)) * np.sqrt(np.diff(fractions, prepend=0.0))
    z = np.cumsum(increments, axis=1) / np.sqrt(fractions)
    crossed_before = (z[:, :2] >= np.array(bounds[:2])).any(axis=1)
    expected = (crossed_before | (z[:, 2] >= 1.5)).mean()
    assert stagewise_p(fractions, bounds, 2, 1.5) == pytest.approx(expected, abs=0.002)
