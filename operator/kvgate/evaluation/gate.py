"""The accuracy gate's decision: a group-sequential, one-sided non-inferiority test (pure).

At each look k the cumulative paired counts give Tango's score statistic T = T(-margin):
  * pass    when T ≥ the O'Brien-Fleming-type (Lan-DeMets) boundary c_k for α = 1 - confidence;
  * fail    when T ≤ -harm_z: the candidate is shown worse than the margin (a non-binding harm
            stop, so it cannot raise the false-pass rate);
  * at the last look, when neither: fail if the candidate is shown worse than control
    (exact one-sided McNemar test at α), otherwise inconclusive.
Without `chunk` there is one look and c_1 = z_{confidence}, the fixed-n Tango test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

import numpy as np
from scipy.stats import binom

from kvgate.errors import SpecError
from kvgate.stats import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MARGIN,
    PairedCounts,
    efficacy_boundaries,
    lower_confidence_bound,
    mcnemar_exact_p,
    noninferiority_p,
    questions_needed,
    tango_interval,
    tango_statistics,
    z_one_sided,
)

# Tuned with bench/bench_accuracy_gate.py (10,000 runs per row, churn 1-3% each way): 50-question
# looks and a harm stop at the gate's own confidence stop a 10-point loss after 92 questions on
# average, promote a 2-point loss (the margin) 4.4% of the time, and promote no loss 95% of the
# time (86% at 3% churn each way) against 97% for one look at 1,319 questions.
DEFAULT_CHUNK: Final = 50
GSM8K_TEST_QUESTIONS: Final = 1319
SUMMARY_KIND: Final = "kvgate.eval/summary"
PROGRESS_KIND: Final = "kvgate.eval/progress"

# Codes of `decide_arrays`.
CONTINUE, PASS, FAIL, INCONCLUSIVE = 0, 1, 2, 3


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"


_CODE_TO_VERDICT: Final = {
    PASS: Verdict.PASS,
    FAIL: Verdict.FAIL,
    INCONCLUSIVE: Verdict.INCONCLUSIVE,
}
EXIT_CODES: Final = {Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.INCONCLUSIVE: 3, Verdict.ERROR: 4}


@dataclass(frozen=True, slots=True)
class GatePlan:
    """Looks (cumulative questions) and their pass boundaries, fixed before the first answer."""

    looks: tuple[int, ...]
    boundaries: tuple[float, ...]
    margin: float
    confidence: float
    harm_z: float

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    @property
    def total(self) -> int:
        return self.looks[-1]

    @property
    def sequential(self) -> bool:
        return len(self.looks) > 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "looks": list(self.looks),
            "boundaries": [round(b, 4) for b in self.boundaries],
            "margin": self.margin,
            "confidence": self.confidence,
            "harm_z": self.harm_z,
        }


def plan_gate(
    total: int,
    *,
    chunk: int | None = None,
    margin: float = DEFAULT_MARGIN,
    confidence: float = DEFAULT_CONFIDENCE,
    harm_z: float | None = None,
) -> GatePlan:
    """Plan looks every `chunk` questions up to `total` (one look when `chunk` is None).

    `harm_z` defaults to z at `confidence`: fail once the candidate is shown worse than the margin.
    """
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise SpecError("limit", f"{total!r} is not a positive number of questions")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise SpecError("chunk", f"{chunk!r} is not a positive number of questions")
    if not (0.0 < margin < 1.0):
        raise SpecError("margin", f"{margin!r} is not in (0, 1); use a fraction such as 0.02")
    if not (0.5 < confidence < 1.0):
        raise SpecError("confidence", f"{confidence!r} is not in (0.5, 1); use e.g. 0.95")
    if harm_z is None:
        harm_z = z_one_sided(confidence)
    if not harm_z > 0:
        raise SpecError("harm_z", f"{harm_z!r} is not positive")
    if chunk is None or chunk >= total:
        return GatePlan((total,), (z_one_sided(confidence),), margin, confidence, harm_z)
    looks = (*range(chunk, total, chunk), total)
    boundaries = efficacy_boundaries([n / total for n in looks], 1.0 - confidence)
    return GatePlan(looks, boundaries, margin, confidence, harm_z)


def decide_arrays(
    plan: GatePlan, look: int, n: np.ndarray, losses: np.ndarray, wins: np.ndarray
) -> np.ndarray:
    """Decision codes (CONTINUE, PASS, FAIL, INCONCLUSIVE) at 0-based `look` for many runs."""
    t_margin = tango_statistics(n, losses, wins, -plan.margin)
    codes = np.full(t_margin.shape, CONTINUE, dtype=np.int8)
    codes[t_margin <= -plan.harm_z] = FAIL
    codes[t_margin >= plan.boundaries[look]] = PASS
    if look == len(plan.looks) - 1:
        # Last look: a loss against control shown by the exact one-sided McNemar test at
        # `confidence` fails (exact, because a handful of discordant pairs is common here).
        discordant = np.asarray(losses) + np.asarray(wins)
        p_worse = binom.sf(np.asarray(losses) - 1, discordant, 0.5)
        worse = (discordant > 0) & (p_worse <= plan.alpha)
        codes[codes == CONTINUE] = np.where(worse[codes == CONTINUE], FAIL, INCONCLUSIVE)
    return codes


@dataclass(frozen=True, slots=True)
class LookResult:
    """The outcome of one look; `verdict` is None when the gate continues."""

    look: int  # 1-based
    questions: int
    statistic: float  # Tango T(-margin)
    pass_boundary: float
    harm_boundary: float
    verdict: Verdict | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "look": self.look,
            "questions": self.questions,
            "statistic": _finite(self.statistic),
            "pass_boundary": round(self.pass_boundary, 4),
            "harm_boundary": -self.harm_boundary,
            "verdict": None if self.verdict is None else str(self.verdict),
        }


def assess_look(plan: GatePlan, look: int, counts: PairedCounts) -> LookResult:
    """Decide at 0-based `look` from the cumulative paired `counts`."""
    if not 0 <= look < len(plan.looks):
        raise SpecError("look", f"{look} is outside the plan's {len(plan.looks)} looks")
    if counts.n != plan.looks[look]:
        raise SpecError(
            "look", f"look {look + 1} needs {plan.looks[look]} paired questions, got {counts.n}"
        )
    code = int(
        decide_arrays(
            plan,
            look,
            np.array([counts.n]),
            np.array([counts.control_only]),
            np.array([counts.candidate_only]),
        )[0]
    )
    statistic = float(
        tango_statistics(
            np.array([counts.n]),
            np.array([counts.control_only]),
            np.array([counts.candidate_only]),
            -plan.margin,
        )[0]
    )
    return LookResult(
        look=look + 1,
        questions=counts.n,
        statistic=statistic,
        pass_boundary=plan.boundaries[look],
        harm_boundary=plan.harm_z,
        verdict=_CODE_TO_VERDICT.get(code),
    )


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def progress_line(plan: GatePlan, result: LookResult, counts: PairedCounts) -> dict[str, Any]:
    """The JSON object printed after each look."""
    return {
        "kind": PROGRESS_KIND,
        **result.to_dict(),
        "looks_planned": len(plan.looks),
        "paired": counts.to_dict(),
        "difference": counts.difference,
    }


def build_summary(
    *,
    plan: GatePlan,
    task: str,
    verdict: Verdict,
    counts: PairedCounts | None,
    looks_taken: int,
    error: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The final summary line, per docs/contracts.md ("Eval summary")."""
    summary: dict[str, Any] = {
        "kind": SUMMARY_KIND,
        "verdict": str(verdict),
        "error": error,
        "task": task,
        "margin": plan.margin,
        "confidence": plan.confidence,
        "questions_used": 0 if counts is None else counts.n,
        "questions_planned": plan.total,
        "stopped_early": counts is not None
        and verdict is not Verdict.ERROR
        and counts.n < plan.total,
        "looks": looks_taken,
        "looks_planned": len(plan.looks),
        "control": None,
        "candidate": None,
        "paired": None,
        "largest_loss_ruled_out": None,
        "noninferiority_p": None,
        "advice": {"questions_needed": None},
    }
    if counts is not None and counts.n > 0:
        lower = lower_confidence_bound(counts, plan.confidence)
        summary.update(
            control=counts.control().to_dict(),
            candidate=counts.candidate().to_dict(),
            paired={
                **counts.to_dict(),
                "difference": counts.difference,
                "tango95": list(tango_interval(counts, 0.95)),
                "mcnemar_p": mcnemar_exact_p(counts),
            },
            largest_loss_ruled_out=max(0.0, -lower),
            noninferiority_p=noninferiority_p(counts, plan.margin),
            advice=advice(counts, plan),
        )
    if extra:
        summary.update(extra)
    return summary


def advice(counts: PairedCounts, plan: GatePlan) -> dict[str, Any]:
    """Questions a fixed-n test needs at the observed discordance (assuming no true loss)."""
    discordance = counts.discordance
    needed = questions_needed(discordance, plan.margin, plan.confidence)
    return {
        "questions_needed": needed,
        "discordance": discordance,
        "power": 0.8,
        "assumed_difference": 0.0,
        "fits_test_set": needed <= GSM8K_TEST_QUESTIONS,
    }
