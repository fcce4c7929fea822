"""Accuracy gate benchmark: the paired sequential gate against the usual manual rule.

Seeded simulation of paired GSM8K runs: control accuracy 91.8%, a churn of 1-3% of answers each
way (drawn per run), and a true loss of 0, 1, 2, 5 or 10 points. Compares
  * the kvgate gate (kvgate.evaluation.gate: sequential looks, Tango NI test, harm stop),
  * the same test at a fixed 1,319 questions (one look),
  * the manual rule: 500 questions, promote when the two Wilson 95% intervals overlap.
Prints a markdown table of P(promote), P(fail) and mean questions used. Nothing is asserted.

    .venv/bin/python bench/bench_accuracy_gate.py [--runs 4000] [--chunk 50] [--seed 7]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

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
from kvgate.stats import DEFAULT_CONFIDENCE, DEFAULT_MARGIN, wilson_interval

BASELINE = 0.918
LOSSES = (0.0, 0.01, 0.02, 0.05, 0.10)
MANUAL_N = 500


def simulate_cells(
    rng: np.random.Generator,
    runs: int,
    questions: int,
    loss: float,
    churn_range: tuple[float, float] = (0.01, 0.03),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-question (loss, win, control right) indicators, shape (runs, questions)."""
    churn = rng.uniform(*churn_range, size=(runs, 1))
    p_loss, p_win = churn + loss, churn
    u = rng.random((runs, questions))
    # Cells in order: loss (b), win (c), both right (a), neither (d).
    is_loss = u < p_loss
    is_win = (u >= p_loss) & (u < p_loss + p_win)
    control_right = is_loss | (u >= p_loss + p_win) & (u < p_loss + BASELINE)
    return is_loss, is_win, control_right


def run_gate(plan: GatePlan, is_loss: np.ndarray, is_win: np.ndarray) -> dict[str, float]:
    runs = is_loss.shape[0]
    losses = np.cumsum(is_loss, axis=1)
    wins = np.cumsum(is_win, axis=1)
    outcome = np.full(runs, CONTINUE, dtype=np.int8)
    used = np.zeros(runs, dtype=int)
    first_look = np.zeros(runs, dtype=bool)
    for k, n in enumerate(plan.looks):
        open_ = outcome == CONTINUE
        if not open_.any():
            break
        codes = decide_arrays(
            plan, k, np.full(open_.sum(), n), losses[open_, n - 1], wins[open_, n - 1]
        )
        outcome[open_] = codes
        used[open_] = n
        if k == 0:
            first_look = outcome != CONTINUE
    return {
        "promote": float(np.mean(outcome == PASS)),
        "fail": float(np.mean(outcome == FAIL)),
        "questions": float(np.mean(used)),
        "first_look": float(np.mean(first_look)),
    }


def run_manual(is_loss: np.ndarray, is_win: np.ndarray, control_right: np.ndarray) -> float:
    """Share of runs the manual rule promotes (Wilson 95% intervals at 500 questions overlap)."""
    ctrl = control_right[:, :MANUAL_N].sum(axis=1)
    cand = ctrl - is_loss[:, :MANUAL_N].sum(axis=1) + is_win[:, :MANUAL_N].sum(axis=1)
    promoted = 0
    for x, y in zip(ctrl.tolist(), cand.tolist(), strict=True):
        lo1, hi1 = wilson_interval(x, MANUAL_N)
        lo2, hi2 = wilson_interval(y, MANUAL_N)
        promoted += hi2 >= lo1 and hi1 >= lo2
    return promoted / len(ctrl)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=4000)
    parser.add_argument("--chunk", type=int, default=DEFAULT_CHUNK)
    parser.add_argument("--harm-z", type=float, default=None, help="default: z at --confidence")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    parser.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--losses", type=lambda s: tuple(float(x) for x in s.split(",")), default=LOSSES
    )
    args = parser.parse_args()

    started = time.perf_counter()
    total = GSM8K_TEST_QUESTIONS
    sequential = plan_gate(
        total,
        chunk=args.chunk,
        margin=args.margin,
        confidence=args.confidence,
        harm_z=args.harm_z,
    )
    fixed = plan_gate(total, margin=args.margin, confidence=args.confidence, harm_z=args.harm_z)
    rng = np.random.default_rng(args.seed)
    print(
        f"# Accuracy gate: {args.runs} simulated runs per row, control {BASELINE:.1%}, "
        f"churn U(1%, 3%) each way, margin {args.margin:.0%}, one-sided confidence "
        f"{args.confidence:.0%}, looks every {args.chunk} questions up to {total} "
        f"(final pass boundary z = {sequential.boundaries[-1]:.3f}), harm stop at "
        f"T(-margin) <= -{sequential.harm_z:.3f}, seed {args.seed}\n"
    )
    print(
        "| true loss | gate P(promote) | gate P(fail) | gate mean questions | "
        "stopped at 1st look | fixed-1319 P(promote) | manual P(promote) | manual questions |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for loss in args.losses:
        is_loss, is_win, control_right = simulate_cells(rng, args.runs, total, loss)
        gate = run_gate(sequential, is_loss, is_win)
        one_look = run_gate(fixed, is_loss, is_win)
        manual = run_manual(is_loss, is_win, control_right)
        print(
            f"| {loss * 100:.0f} pt | {gate['promote']:.3f} | {gate['fail']:.3f} | "
            f"{gate['questions']:.0f} | {gate['first_look']:.3f} | {one_look['promote']:.3f} | "
            f"{manual:.3f} | {MANUAL_N} |"
        )
    print(
        "\n## Worst cases: fixed churn each way (the goals are P(promote) <= 0.05 at a 2-point "
        "loss and >= 0.80 with no loss)\n"
    )
    print("| churn each way | true loss | gate P(promote) | gate mean questions | fixed-1319 |")
    print("|---:|---:|---:|---:|---:|")
    for churn in (0.01, 0.02, 0.03):
        for loss in (0.0, 0.02):
            is_loss, is_win, _ = simulate_cells(rng, args.runs, total, loss, (churn, churn))
            gate = run_gate(sequential, is_loss, is_win)
            one_look = run_gate(fixed, is_loss, is_win)
            print(
                f"| {churn:.0%} | {loss * 100:.0f} pt | {gate['promote']:.3f} | "
                f"{gate['questions']:.0f} | {one_look['promote']:.3f} |"
            )
    print(f"\n({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
