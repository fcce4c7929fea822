"""Accuracy gate design study: the paired sequential gate against fixed-n and the manual rule.

Seeded, vectorised simulation of paired GSM8K runs: control accuracy 91.8%, a churn of 0-3% of
answers each way (uniform per run, or fixed per row), and a true loss of 0, 1, 2, 5 or 10
points. Each look draws the new questions' losses and wins (binomial), so a run costs one draw
per look. For each row it reports
  * P(promote), P(fail), P(inconclusive) and mean questions of the kvgate gate
    (kvgate.evaluation.gate: O'Brien-Fleming pass looks, a separate fail spending function);
  * which claim each FAIL made and how often it was false (a "worse than the margin" FAIL at a
    loss of at most the margin, a "worse than control" FAIL at no loss);
  * coverage of the reported one-sided bounds (look-adjusted repeated confidence bounds), over
    all runs and over the runs that stopped early, next to the single-look bound the gate used
    to print;
  * the same test at a fixed 1,319 questions (one look), and the manual rule (500 questions,
    promote when the two Wilson 95% intervals overlap).
Prints markdown; `--write` also saves it to bench/RESULTS-accuracy-gate.md. Nothing is asserted
here (tests/unit/test_sequential.py asserts the claims with fewer runs).

    nice -n 10 .venv/bin/python bench/bench_accuracy_gate.py [--runs 200000] [--seed 7] [--write]
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvgate.evaluation.gate import (
    DEFAULT_CHUNK,
    DEFAULT_FAIL_CONFIDENCE,
    DEFAULT_FAIL_SPENDING,
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
from kvgate.judge.stats import DEFAULT_CONFIDENCE, DEFAULT_MARGIN, tango_statistics, z_one_sided

BASELINE = 0.918
LOSSES = (0.0, 0.01, 0.02, 0.05, 0.10)
CHURNS = (0.0, 0.01, 0.02, 0.03)
MANUAL_N = 500
RESULTS = Path(__file__).with_name("RESULTS-accuracy-gate.md")


@dataclass(frozen=True, slots=True)
class Runs:
    """Cumulative losses and wins at each look, shape (runs, looks), and each run's p_loss."""

    losses: np.ndarray
    wins: np.ndarray
    churn: np.ndarray


def simulate_looks(
    rng: np.random.Generator,
    runs: int,
    looks: tuple[int, ...],
    loss: float,
    churn_range: tuple[float, float],
) -> Runs:
    """Binomial draws of each look's new losses and wins for `runs` paired runs."""
    low, high = churn_range
    churn = rng.uniform(low, high, size=runs) if high > low else np.full(runs, low)
    p_loss = churn + loss
    p_win_given_not_loss = churn / (1.0 - p_loss)
    steps = np.diff(np.asarray(looks), prepend=0)
    b = np.empty((runs, len(looks)), dtype=np.int64)
    c = np.empty((runs, len(looks)), dtype=np.int64)
    for k, m in enumerate(steps):
        b[:, k] = rng.binomial(m, p_loss)
        c[:, k] = rng.binomial(m - b[:, k], p_win_given_not_loss)
    return Runs(np.cumsum(b, axis=1), np.cumsum(c, axis=1), churn)


def run_gate(plan: GatePlan, runs: Runs, loss: float) -> dict[str, float]:
    """Operating characteristics of `plan` on simulated `runs` with a true loss `loss`."""
    n_runs = runs.losses.shape[0]
    reason = np.full(n_runs, NONE, dtype=np.int8)
    stop = np.zeros(n_runs, dtype=np.int64)
    for k, n in enumerate(plan.looks):
        open_ = reason == NONE
        if not open_.any():
            break
        got = reason_arrays(
            plan, k, np.full(open_.sum(), n), runs.losses[open_, k], runs.wins[open_, k]
        )
        reason[open_] = got
        stop[open_] = k
    assert (reason != NONE).all()
    looks = np.asarray(plan.looks)
    n_stop = looks[stop]
    b = runs.losses[np.arange(n_runs), stop]
    c = runs.wins[np.arange(n_runs), stop]
    # Coverage of the bounds at the stopping look: the lower bound L (T(L) = e_k) is below the
    # true difference iff T(truth) < e_k; the upper bound U (T(U) = -f_k) is above it iff
    # T(truth) > -f_k. The single-look lower bound used z at `confidence` instead of e_k.
    t_truth = tango_statistics(n_stop, b, c, -loss)
    pass_z = np.asarray(plan.boundaries)[stop]
    fail_z = np.asarray(plan.fail_boundaries)[stop]
    lower_wrong = t_truth >= pass_z
    # The upper bound is only below 0 when the gate failed (see gate.look_bounds).
    upper_wrong = (t_truth <= -fail_z) & np.isin(reason, (WORSE_THAN_MARGIN, WORSE_THAN_CONTROL))
    single_wrong = t_truth >= z_one_sided(plan.confidence)
    early = n_stop < plan.total
    fail_margin = reason == WORSE_THAN_MARGIN
    fail_control = reason == WORSE_THAN_CONTROL
    return {
        "promote": float(np.mean(reason == NONINFERIOR)),
        "fail": float(np.mean(fail_margin | fail_control)),
        "fail_margin": float(np.mean(fail_margin)),
        "fail_control": float(np.mean(fail_control)),
        "inconclusive": float(np.mean(reason == NOT_SHOWN)),
        "questions": float(np.mean(n_stop)),
        "early": float(np.mean(early)),
        "lower_wrong": float(np.mean(lower_wrong)),
        "lower_wrong_early": float(np.mean(lower_wrong[early])) if early.any() else math.nan,
        "upper_wrong": float(np.mean(upper_wrong)),
        "single_wrong": float(np.mean(single_wrong)),
        "single_wrong_early": float(np.mean(single_wrong[early])) if early.any() else math.nan,
        "runs": float(n_runs),
    }


def run_manual(rng: np.random.Generator, runs: Runs, loss: float) -> float:
    """Share of runs the manual rule promotes (Wilson 95% intervals at 500 questions overlap)."""
    # Draw the first 500 questions again (the looks need not include 500).
    p_loss = runs.churn + loss
    b = rng.binomial(MANUAL_N, p_loss)
    c = rng.binomial(MANUAL_N - b, runs.churn / (1 - p_loss))
    both = rng.binomial(MANUAL_N - b - c, (BASELINE - p_loss) / (1 - p_loss - runs.churn))
    ctrl, cand = both + b, both + c
    lo1, hi1 = _wilson(ctrl, MANUAL_N)
    lo2, hi2 = _wilson(cand, MANUAL_N)
    return float(np.mean((hi2 >= lo1) & (hi1 >= lo2)))


def _wilson(k: np.ndarray, n: int, z: float = 1.959963984540054) -> tuple[np.ndarray, np.ndarray]:
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def _se(p: float, runs: float) -> float:
    return math.sqrt(max(p * (1 - p), 1e-12) / runs)


def study(args: argparse.Namespace) -> list[str]:
    total = GSM8K_TEST_QUESTIONS
    plan = plan_gate(
        total,
        chunk=args.chunk,
        margin=args.margin,
        confidence=args.confidence,
        fail_confidence=args.fail_confidence,
        fail_spending=args.fail_spending,
    )
    fixed = plan_gate(
        total,
        margin=args.margin,
        confidence=args.confidence,
        fail_confidence=args.fail_confidence,
    )
    rng = np.random.default_rng(args.seed)
    out = [
        "# Accuracy gate design study",
        "",
        f"{args.runs:,} simulated runs per row, seed {args.seed}; control {BASELINE:.1%}; churn "
        f"(share of answers that flip each way) U(0%, 3%) per run unless a row fixes it; margin "
        f"{args.margin:.0%}. Pass: T(-margin) ≥ e_k, O'Brien-Fleming-type spending of "
        f"{1 - args.confidence:.1%}; fail: McNemar z = T(0) ≤ -f_k (and an exact one-sided "
        f"McNemar p ≤ {1 - args.fail_confidence:.1%}), `{args.fail_spending}` "
        f"spending of {1 - args.fail_confidence:.1%}; looks every {args.chunk} questions up to "
        f"{total} ({len(plan.looks)} looks). e_k = "
        f"{', '.join(f'{b:.2f}' for b in plan.boundaries[:4])}, ..., {plan.boundaries[-1]:.3f}; "
        f"f_k = {', '.join(f'{b:.2f}' for b in plan.fail_boundaries[:4])}, ..., "
        f"{plan.fail_boundaries[-1]:.3f}.",
        "",
        "Standard errors: ±√(p(1-p)/runs), e.g. ±0.0005 at 0.95 and ±0.0002 at 0.01 with 200,000 "
        "runs. `L wrong` is the share of runs whose reported lower bound (largest loss ruled out) "
        "is above the true difference; the stated confidence allows 0.05. `single-look L "
        "wrong` is the same for the unadjusted bound the gate printed before. `U wrong` is the "
        f"same for the upper bound (stated {args.fail_confidence:.1%}; it is below 0 only on a "
        "fail). P(fail) at 0 pt is the hard-FAIL rate of a candidate with no loss.",
        "",
        "## Churn U(0%, 3%) each way",
        "",
        "| true loss | P(promote) | P(fail) | of which worse than margin | P(inconclusive) | "
        "mean questions | stopped early | L wrong (all) | L wrong (early stops) | single-look "
        "L wrong (all / early) | U wrong | fixed-1319 P(promote) | manual P(promote) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    mixed: dict[float, dict[str, float]] = {}
    worst_two_point = 0.0
    for loss in args.losses:
        runs = simulate_looks(rng, args.runs, plan.looks, loss, (0.0, 0.03))
        gate = run_gate(plan, runs, loss)
        one = run_gate(fixed, simulate_looks(rng, args.runs, fixed.looks, loss, (0.0, 0.03)), loss)
        manual = run_manual(rng, runs, loss)
        mixed[loss] = gate
        out.append(
            f"| {loss * 100:.0f} pt | {gate['promote']:.4f} | {gate['fail']:.4f} | "
            f"{gate['fail_margin']:.4f} | {gate['inconclusive']:.4f} | {gate['questions']:.0f} | "
            f"{gate['early']:.3f} | {gate['lower_wrong']:.4f} | {gate['lower_wrong_early']:.4f} | "
            f"{gate['single_wrong']:.4f} / {gate['single_wrong_early']:.4f} | "
            f"{gate['upper_wrong']:.4f} | {one['promote']:.4f} | {manual:.4f} |"
        )
        print(out[-1], flush=True)
    out += [
        "",
        "## Fixed churn each way (goal: P(promote | 2-point loss) ≤ 0.05 at every level)",
        "",
        "| churn each way | true loss | P(promote) | P(fail) | worse than margin | mean "
        "questions | L wrong (all / early) | U wrong | fixed-1319 P(promote) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for churn in args.churns:
        for loss in args.losses:
            runs = simulate_looks(rng, args.runs, plan.looks, loss, (churn, churn))
            gate = run_gate(plan, runs, loss)
            one_runs = simulate_looks(rng, args.runs, fixed.looks, loss, (churn, churn))
            one = run_gate(fixed, one_runs, loss)
            if loss == 0.02:
                worst_two_point = max(worst_two_point, gate["promote"])
            out.append(
                f"| {churn:.0%} | {loss * 100:.0f} pt | {gate['promote']:.4f} | "
                f"{gate['fail']:.4f} | {gate['fail_margin']:.4f} | {gate['questions']:.0f} | "
                f"{gate['lower_wrong']:.4f} / {gate['lower_wrong_early']:.4f} | "
                f"{gate['upper_wrong']:.4f} | {one['promote']:.4f} |"
            )
            print(out[-1], flush=True)
    out += ["", "## Goals", "", *_goals(mixed, worst_two_point, args.runs)]
    return out


def _goals(mixed: dict[float, dict[str, float]], worst_two_point: float, runs: int) -> list[str]:
    """Each design goal against the rows above (churn U(0%, 3%) unless stated)."""
    lines = [
        f"- P(promote | 2-point loss) ≤ 0.05 at every churn level: worst {worst_two_point:.4f}"
    ]
    if 0.0 in mixed:
        zero = mixed[0.0]
        se = _se(zero["promote"], runs)
        lines += [
            f"- P(promote | no loss) ≥ 0.95: {zero['promote']:.4f} ± {se:.4f}; mean questions "
            f"≤ 720: {zero['questions']:.0f}; hard FAIL with no loss {zero['fail']:.4f}",
        ]
    for loss, limit in ((0.05, 300), (0.10, 120)):
        if loss in mixed:
            lines.append(
                f"- {loss * 100:.0f}-point loss stopped in ≤ {limit} questions on average: "
                f"{mixed[loss]['questions']:.0f} (P(fail) {mixed[loss]['fail']:.4f})"
            )
    worst_lower = max((g["lower_wrong"] for g in mixed.values()), default=math.nan)
    worst_upper = max((g["upper_wrong"] for g in mixed.values()), default=math.nan)
    lines.append(
        f"- reported bounds hold at their confidence: lower bound wrong at most {worst_lower:.4f}"
        f" (≤ 0.05), upper bound wrong at most {worst_upper:.4f} (≤ 0.025)"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200_000)
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK)
    parser.add_argument("--fail-confidence", type=float, default=DEFAULT_FAIL_CONFIDENCE)
    parser.add_argument("--fail-spending", default=DEFAULT_FAIL_SPENDING)
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    parser.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--losses", type=lambda s: tuple(float(x) for x in s.split(",")), default=LOSSES
    )
    parser.add_argument(
        "--churns", type=lambda s: tuple(float(x) for x in s.split(",")), default=CHURNS
    )
    parser.add_argument("--write", action="store_true", help=f"also write {RESULTS.name}")
    args = parser.parse_args()
    started = time.perf_counter()
    lines = study(args)
    lines.append(f"\n({time.perf_counter() - started:.0f} s)")
    text = "\n".join(lines) + "\n"
    print()
    print(text)
    if args.write:
        RESULTS.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
