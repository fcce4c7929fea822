"""The accuracy gate's decision: a group-sequential, one-sided non-inferiority test (pure).

At each look k the cumulative paired counts give Tango's score statistics T(-margin) and
T(0) (the latter is McNemar's z):
  * pass  when T(-margin) ≥ e_k, the O'Brien-Fleming-type (Lan-DeMets) boundary for
          α = 1 - confidence: the candidate is shown at most `margin` worse than control;
  * fail  when T(0) ≤ -f_k, the boundary of a second spending function at α_F =
          1 - fail_confidence, and the exact one-sided McNemar p is at most α_F: the
          candidate is shown worse than control, and worse than the margin as well when also
          T(-margin) ≤ -f_k;
  * at the last look, when neither: inconclusive.
A pass also needs a control that has something to lose: the control's accuracy (its one-sided
Wilson lower bound at `confidence`) at least the margin. Below that floor no loss of `margin`
can be measured (a random model scores 0 on both arms and "passes" any margin), so the look
ends inconclusive (`control_below_floor`), never non-inferior.
Both boundary sequences are computed with the other stop treated as non-binding, so each claim
keeps its own error rate whatever the other rule does. After any stop the summary reports the
repeated confidence bounds of that look (Jennison & Turnbull 1989): the lower bound solves
T(Δ) = e_k and the upper bound T(Δ) = -f_k, so they hold at `confidence` and `fail_confidence`
over every look at once, and agree with the verdict by construction (pass ⇔ lower > -margin).
The non-inferiority p is the stage-wise-ordering p of the stop (≤ α ⇔ pass).
Without `chunk` there is one look: e_1 = z_{confidence}, f_1 = z_{fail_confidence}.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final

from kvgate.errors import SpecError
from kvgate.judge.stats import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MARGIN,
    PairedCounts,
    check_confidence,
    check_margin,
    mcnemar_exact_p,
    questions_needed,
    score_limit,
    sequential_boundaries,
    spending,
    stagewise_p,
    tango_interval,
    tango_statistic,
    tango_statistics,
    wilson_lower_bound,
    z_one_sided,
)
from kvgate.vocabulary import CONTROL_BELOW_FLOOR

if TYPE_CHECKING:  # numpy and scipy are imported where used (kvgate.judge.stats says why)
    import numpy as np

# Chosen with bench/bench_accuracy_gate.py; see bench/RESULTS-accuracy-gate.md for the table.
DEFAULT_CHUNK: Final = 50
DEFAULT_FAIL_CONFIDENCE: Final = 0.975
DEFAULT_FAIL_SPENDING: Final = "power:0.25"
PASS_SPENDING: Final = "obf"
GSM8K_TEST_QUESTIONS: Final = 1319
SUMMARY_KIND: Final = "kvgate.eval/summary"
PROGRESS_KIND: Final = "kvgate.eval/progress"

# Reasons of `reason_arrays`.
NONE, NONINFERIOR, WORSE_THAN_MARGIN, WORSE_THAN_CONTROL, NOT_SHOWN = 0, 1, 2, 3, 4
REASONS: Final = {
    NONINFERIOR: "noninferior",
    WORSE_THAN_MARGIN: "worse_than_margin",
    WORSE_THAN_CONTROL: "worse_than_control",
    NOT_SHOWN: "not_shown",
}
# The reasons as a person reads them (first-hour-2 N18: "inconclusive (not_shown)").
REASON_WORDS: Final = {
    "noninferior": "no loss beyond the margin",
    "worse_than_margin": "worse by more than the margin",
    "worse_than_control": "shown worse than the control",
    "not_shown": "neither shown",
}


def reason_words(reason: str | None) -> str:
    return REASON_WORDS.get(reason or "", reason or "")


class Verdict(StrEnum):
    """A paired accuracy test's verdict, GSM8K's and long context's alike (the eval Job's JSON).

    Not `vocabulary.Outcome`: these are the eval Job's own lower-case words, which its summary
    and exit code carry; `judge.accuracy` maps them onto gate outcomes. Not the divergence
    screen's `judge.divergence.Verdict` either: a screen flags, it never passes a test.
    """

    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"
    ERROR = "error"


SEVERITY: Final = {Verdict.PASS: 0, Verdict.INCONCLUSIVE: 1, Verdict.ERROR: 2, Verdict.FAIL: 3}


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The worst of `verdicts` (PASS when there are none): fail over error over inconclusive."""
    return max(verdicts, key=SEVERITY.__getitem__, default=Verdict.PASS)


# A look's verdict per reason code (NONE: the gate continues).
_VERDICTS: Final = (None, Verdict.PASS, Verdict.FAIL, Verdict.FAIL, Verdict.INCONCLUSIVE)
EXIT_CODES: Final = {Verdict.PASS: 0, Verdict.FAIL: 1, Verdict.INCONCLUSIVE: 3, Verdict.ERROR: 4}


@dataclass(frozen=True, slots=True)
class GatePlan:
    """Looks (cumulative questions) and their pass and fail boundaries, fixed in advance."""

    looks: tuple[int, ...]
    boundaries: tuple[float, ...]  # pass: T(-margin) ≥ boundaries[k]
    fail_boundaries: tuple[float, ...]  # fail: T(0) ≤ -fail_boundaries[k]
    margin: float
    confidence: float
    fail_confidence: float = DEFAULT_FAIL_CONFIDENCE
    fail_spending: str = DEFAULT_FAIL_SPENDING

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    @property
    def fail_alpha(self) -> float:
        return 1.0 - self.fail_confidence

    @property
    def total(self) -> int:
        return self.looks[-1]

    @property
    def sequential(self) -> bool:
        return len(self.looks) > 1

    @property
    def fractions(self) -> tuple[float, ...]:
        return tuple(n / self.total for n in self.looks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "looks": list(self.looks),
            "boundaries": [round(b, 4) for b in self.boundaries],
            "pass_spending": PASS_SPENDING if self.sequential else None,
            "fail_boundaries": [round(-b, 4) for b in self.fail_boundaries],
            "fail_spending": self.fail_spending if self.sequential else None,
            "margin": self.margin,
            "confidence": self.confidence,
            "fail_confidence": self.fail_confidence,
        }


def plan_gate(
    total: int,
    *,
    chunk: int | None = None,
    margin: float = DEFAULT_MARGIN,
    confidence: float = DEFAULT_CONFIDENCE,
    fail_confidence: float = DEFAULT_FAIL_CONFIDENCE,
    fail_spending: str = DEFAULT_FAIL_SPENDING,
) -> GatePlan:
    """Plan looks every `chunk` questions up to `total` (one look when `chunk` is None).

    Pass boundaries spend α = 1 - confidence with O'Brien-Fleming-type spending; fail
    boundaries spend 1 - fail_confidence with `fail_spending` ("obf" or "power:RHO").
    """
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        raise SpecError("limit", f"{total!r} is not a positive number of questions")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise SpecError("chunk", f"{chunk!r} is not a positive number of questions")
    check_margin(margin)
    check_confidence(confidence)
    check_confidence(fail_confidence, "fail_confidence")
    spending(1.0, 0.05, fail_spending)  # validates the name
    if chunk is None or chunk >= total:
        looks: tuple[int, ...] = (total,)
        boundaries: tuple[float, ...] = (z_one_sided(confidence),)
        fail_boundaries: tuple[float, ...] = (z_one_sided(fail_confidence),)
    else:
        looks = (*range(chunk, total, chunk), total)
        fractions = [n / total for n in looks]
        boundaries = sequential_boundaries(fractions, 1.0 - confidence, PASS_SPENDING)
        fail_boundaries = sequential_boundaries(fractions, 1.0 - fail_confidence, fail_spending)
    return GatePlan(
        looks, boundaries, fail_boundaries, margin, confidence, fail_confidence, fail_spending
    )


def reason_arrays(
    plan: GatePlan, look: int, n: np.ndarray, losses: np.ndarray, wins: np.ndarray
) -> np.ndarray:
    """Reason codes (NONE = continue, NONINFERIOR, WORSE_THAN_*, NOT_SHOWN) at 0-based `look`."""
    import numpy as np

    t_margin = tango_statistics(n, losses, wins, -plan.margin)
    t_zero = tango_statistics(n, losses, wins, 0.0)
    fail_z = plan.fail_boundaries[look]
    reasons = np.full(t_margin.shape, NONE, dtype=np.int8)
    if look == len(plan.looks) - 1:
        reasons[:] = NOT_SHOWN
    worse = (t_zero <= -fail_z) & _exact_worse(losses, wins, plan.fail_alpha)
    reasons[worse] = WORSE_THAN_CONTROL
    reasons[worse & (t_margin <= -fail_z)] = WORSE_THAN_MARGIN
    reasons[t_margin >= plan.boundaries[look]] = NONINFERIOR
    return reasons


def _exact_worse(losses: np.ndarray, wins: np.ndarray, level: float) -> np.ndarray:
    """Exact one-sided McNemar test at `level` (b ~ Bin(b + c, 1/2)), the fail's floor.

    McNemar's z alone overstates a handful of discordant pairs (4 losses to 0 wins give
    z = -2.0 but an exact one-sided p of 0.0625), so a fail needs both the z boundary (which
    keeps the error over all looks) and an exact p at most 1 - fail_confidence at this look.
    """
    import numpy as np
    import numpy.typing as npt
    from scipy.stats import binom

    b = np.asarray(losses)
    m = b + np.asarray(wins)
    p_worse: npt.NDArray[np.float64] = binom.sf(b - 1, m, 0.5)  # scipy is untyped (Any)
    # numpy types arithmetic on arrays of unknown dtype as Any; these comparisons give booleans
    worse: npt.NDArray[np.bool_] = (m > 0) & (p_worse <= level)
    return worse


@dataclass(frozen=True, slots=True)
class LookResult:
    """The outcome of one look; `verdict` is None when the gate continues."""

    look: int  # 1-based
    questions: int
    statistic: float  # Tango T(-margin)
    pass_boundary: float
    fail_statistic: float  # T(0), McNemar's z
    fail_boundary: float
    verdict: Verdict | None
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "look": self.look,
            "questions": self.questions,
            "statistic": _finite(self.statistic),
            "pass_boundary": round(self.pass_boundary, 4),
            "fail_statistic": _finite(self.fail_statistic),
            "fail_boundary": round(-self.fail_boundary, 4),
            "verdict": None if self.verdict is None else str(self.verdict),
            "reason": self.reason,
        }


def assess_look(plan: GatePlan, look: int, counts: PairedCounts) -> LookResult:
    """Decide at 0-based `look` from the cumulative paired `counts`."""
    if not 0 <= look < len(plan.looks):
        raise SpecError("look", f"{look} is outside the plan's {len(plan.looks)} looks")
    if counts.n != plan.looks[look]:
        raise SpecError(
            "look", f"look {look + 1} needs {plan.looks[look]} paired questions, got {counts.n}"
        )
    import numpy as np

    reason = int(
        reason_arrays(
            plan,
            look,
            np.array([counts.n]),
            np.array([counts.control_only]),
            np.array([counts.candidate_only]),
        )[0]
    )
    verdict = _VERDICTS[reason]
    named = REASONS.get(reason)
    if verdict is Verdict.PASS and control_below_floor(plan, counts):
        verdict, named = Verdict.INCONCLUSIVE, CONTROL_BELOW_FLOOR
    return LookResult(
        look=look + 1,
        questions=counts.n,
        statistic=tango_statistic(counts, -plan.margin),
        pass_boundary=plan.boundaries[look],
        fail_statistic=tango_statistic(counts, 0.0),
        fail_boundary=plan.fail_boundaries[look],
        verdict=verdict,
        reason=named,
    )


def control_floor(plan: GatePlan, counts: PairedCounts) -> float:
    """The control's accuracy that a pass can rest on: its one-sided Wilson lower bound at the
    plan's confidence (a loss larger than the control's own accuracy cannot be observed)."""
    control = counts.both + counts.control_only
    return wilson_lower_bound(control, counts.n, plan.confidence)


def control_below_floor(plan: GatePlan, counts: PairedCounts) -> bool:
    """True when the control scores too little for a loss of the margin to be measured."""
    return counts.n > 0 and control_floor(plan, counts) < plan.margin


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


@dataclass(frozen=True, slots=True)
class Bounds:
    """The look-adjusted one-sided bounds and p-value the verdict rests on."""

    look: int  # 0-based look the counts belong to
    lower: float  # repeated lower confidence bound for Δ at `confidence`
    upper: float  # repeated upper confidence bound for Δ at `fail_confidence`
    noninferiority_p: float  # stage-wise ordering p of H0: Δ ≤ -margin

    def to_dict(self, plan: GatePlan) -> dict[str, Any]:
        return {
            "lower": self.lower,
            "lower_confidence": plan.confidence,
            "upper": self.upper,
            "upper_confidence": plan.fail_confidence,
            "sided": "one-sided",
            "look_adjusted": plan.sequential,
            "look": self.look + 1,
            "method": (
                "Tango score, repeated confidence bounds at the stopping look's boundaries"
                if plan.sequential
                else "Tango score, one-sided"
            ),
        }


def look_bounds(plan: GatePlan, look: int, counts: PairedCounts) -> Bounds:
    """Bounds after stopping at 0-based `look` with cumulative `counts`.

    lower solves T(Δ) = e_k and upper T(Δ) = -f_k: repeated confidence bounds, valid at their
    levels whatever the stopping rule did (upper is raised to 0 unless the gate failed, when
    the exact test did not confirm a loss the score bound alone would show). The p-value is
    ≤ α exactly when the gate passed.
    """
    if counts.n != plan.looks[look]:
        raise SpecError("look", f"look {look + 1} needs {plan.looks[look]} questions")
    lower = score_limit(counts, plan.boundaries[look])
    upper = score_limit(counts, -plan.fail_boundaries[look])
    failed = assess_look(plan, look, counts).verdict is Verdict.FAIL
    if not failed:
        # The exact test did not confirm the loss: claim none (a larger bound only covers more).
        upper = max(upper, 0.0)
    t = tango_statistic(counts, -plan.margin)
    fractions = plan.fractions
    last = len(plan.looks) - 1
    if t >= plan.boundaries[look]:
        p = stagewise_p(fractions, plan.boundaries, look, t)
    else:
        # A stop without a pass (a fail, or the last look) ranks below every pass, as a last
        # look with the same statistic would: > α, so it never contradicts the verdict.
        p = stagewise_p(fractions, plan.boundaries, last, min(t, plan.boundaries[last]))
        p = max(p, math.nextafter(plan.alpha, 1.0))
    return Bounds(look, lower, upper, p)


def _look_of(plan: GatePlan, counts: PairedCounts, looks_taken: int) -> int:
    look = looks_taken - 1
    if 0 <= look < len(plan.looks) and plan.looks[look] == counts.n:
        return look
    if counts.n in plan.looks:
        return plan.looks.index(counts.n)
    raise SpecError("looks", f"{counts.n} paired questions is not one of the planned looks")


def claim(plan: GatePlan, reason: str | None, bounds: Bounds) -> str | None:
    """The one sentence the verdict asserts, with its confidence."""
    looks = f", adjusted for {bounds.look + 1} looks" if plan.sequential else ""
    lo, hi = 100 * bounds.lower, 100 * bounds.upper
    conf, fconf = f"{plan.confidence:.1%}", f"{plan.fail_confidence:.1%}"
    margin = f"{100 * plan.margin:g} pp"
    if reason == "noninferior":
        worse = (
            f"; worse than control by at least {-hi:.2f} pp (one-sided {fconf})"
            if bounds.upper < 0
            else ""
        )
        return (
            f"candidate minus control ≥ {lo:+.2f} pp (one-sided {conf}{looks}): no loss larger "
            f"than {max(0.0, -lo):.2f} pp, within the {margin} margin{worse}"
        )
    worse = f"candidate minus control ≤ {hi:+.2f} pp (one-sided {fconf}{looks}): worse than control"
    if reason == "worse_than_margin":
        return f"{worse} by more than the {margin} margin"
    if reason == "worse_than_control":
        return (
            f"{worse} by at least {-hi:.2f} pp; whether the loss exceeds the {margin} margin "
            "is not known"  # not "not shown", which read as reassurance (first-hour-2 N13)
        )
    if reason == "not_shown":
        return (
            f"candidate minus control between {lo:+.2f} pp ({conf}) and {hi:+.2f} pp ({fconf}) "
            f"one-sided{looks}: neither a loss within the {margin} margin nor a loss is shown"
        )
    return None


def floor_claim(plan: GatePlan, counts: PairedCounts) -> str:
    """What a look below the control's floor says instead of a pass."""
    control = counts.both + counts.control_only
    return (
        f"the control scored {control}/{counts.n} ({control / counts.n:.1%}; at least "
        f"{control_floor(plan, counts):.1%}, one-sided {plan.confidence:.1%}), below the "
        f"{100 * plan.margin:g} pp margin: a loss of the margin cannot be measured on this "
        "model, so the candidate is not shown non-inferior"
    )


def build_summary(
    *,
    plan: GatePlan,
    task: str,
    verdict: Verdict,
    counts: PairedCounts | None,
    looks_taken: int,
    error: str | None = None,
    extra: dict[str, Any] | None = None,
    reason: str | None = None,
) -> dict[str, Any]:
    """The final summary line, per docs/contracts.md ("Eval summary").

    Every statistic is the one the verdict rests on: look-adjusted one-sided bounds and the
    stage-wise p-value at the stopping look. The two-sided Tango interval and McNemar p are
    single-look descriptions, labelled as such.
    """
    summary: dict[str, Any] = {
        "kind": SUMMARY_KIND,
        "verdict": str(verdict),
        "reason": None,
        "claim": None,
        "error": error,
        "task": task,
        "margin": plan.margin,
        "confidence": plan.confidence,
        "fail_confidence": plan.fail_confidence,
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
        "bounds": None,
        "largest_loss_ruled_out": None,
        "smallest_loss_shown": None,
        "noninferiority_p": None,
        "advice": {"questions_needed": None},
    }
    if counts is not None and counts.n > 0:
        look = _look_of(plan, counts, looks_taken)
        bounds = look_bounds(plan, look, counts)
        if verdict is not Verdict.ERROR:
            got = assess_look(plan, look, counts)
            if got.verdict is not verdict or (reason is not None and reason != got.reason):
                raise SpecError(
                    "verdict", f"{verdict} does not follow from the counts ({got.verdict})"
                )
            reason = got.reason
            said = (
                floor_claim(plan, counts)
                if reason == CONTROL_BELOW_FLOOR
                else claim(plan, reason, bounds)
            )
            summary.update(reason=reason, claim=said)
        summary.update(
            control=counts.control().to_dict(),
            candidate=counts.candidate().to_dict(),
            paired={
                **counts.to_dict(),
                "difference": counts.difference,
                "tango95": list(tango_interval(counts, 0.95)),
                "tango95_sided": "two-sided, at the questions used, not adjusted for looks",
                "mcnemar_p": mcnemar_exact_p(counts),
                "mcnemar_p_sided": "two-sided exact, at the questions used, not adjusted for looks",
                "lower_bound": bounds.lower,
                "upper_bound": bounds.upper,
            },
            bounds=bounds.to_dict(plan),
            largest_loss_ruled_out=max(0.0, -bounds.lower),
            smallest_loss_shown=max(0.0, -bounds.upper),
            noninferiority_p=bounds.noninferiority_p,
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
