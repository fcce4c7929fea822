"""What do the eval Job's results say? The accuracy, long-context and divergence gates.

Each reads the typed `AccuracyStatus` the operator keeps of the eval Job's summary (read once, in
`kvgate.records.evalsummary`) and returns a `GateResult`; a missing or unreadable block is ERROR
or PENDING and never promotes. The gate names are `kvgate.judge.gates`'. Nothing here does I/O.
"""

from __future__ import annotations

from functools import partial
from typing import Final

from kvgate.judge.divergence import SUMMARY_KIND
from kvgate.judge.gates import ACCURACY, DIVERGENCE, LONG_CONTEXT
from kvgate.reasons import Reason
from kvgate.records.evalsummary import (
    AccuracyStatus,
    DivergenceBucketRecord,
    LongContextBucketRecord,
)
from kvgate.records.status import GateResult
from kvgate.spec.rollout import AccuracyGate, DivergenceGate, LongContextTask
from kvgate.vocabulary import CONTROL_BELOW_FLOOR, GateMode, Outcome


def assess_accuracy(gate: AccuracyGate, summary: AccuracyStatus | None) -> GateResult:
    """The eval summary's verdict (pass / fail / inconclusive / error) as an outcome."""
    result = partial(GateResult, ACCURACY)
    if summary is None:
        return result(Outcome.PENDING, Reason.ACCURACY_PENDING, "accuracy not evaluated yet")
    verdict = summary.verdict
    detail = accuracy_detail(summary)
    if verdict == "pass":
        return result(Outcome.SUCCESSFUL, Reason.ACCURACY_NON_INFERIOR, detail)
    if verdict == "fail":
        return result(Outcome.FAILED, Reason.ACCURACY_REGRESSED, detail)
    if verdict == "inconclusive" and summary.reason == CONTROL_BELOW_FLOOR:
        floor = summary.claim or "the control scored below the margin"
        return result(Outcome.INCONCLUSIVE, Reason.ACCURACY_INCONCLUSIVE, floor)
    if verdict == "inconclusive":
        needed = summary.advice.questions_needed if summary.advice is not None else None
        more = f"; about {needed} questions would decide" if needed else ""
        return result(Outcome.INCONCLUSIVE, Reason.ACCURACY_INCONCLUSIVE, detail + more)
    error = summary.error or f"eval summary verdict {verdict!r} is not pass/fail/inconclusive"
    return result(Outcome.ERROR, Reason.EVAL_ERROR, error)


def accuracy_detail(summary: AccuracyStatus) -> str:
    """The accuracy evidence in one line, with the one-sided bound the decision rests on.

    `control 91.0% vs candidate 90.5%, difference -0.5 pp; at least -1.9 pp (95% one-sided,
    adjusted for 4 looks) (margin 2 pp, n=200)`. A fail leads with what was shown: `candidate
    worse: 82.0% vs control 88.7%, difference -6.7 pp; shown worse by at least 0.3 pp (97.5%
    one-sided, adjusted for 3 looks) (margin 2 pp, n=300)`. Summaries without look-adjusted
    bounds (older eval images) show the two-sided interval, labelled as such.
    """
    c, k, paired = summary.control, summary.candidate, summary.paired
    if c is None or k is None or paired is None:
        return f"eval verdict {summary.verdict!r}"
    if c.accuracy is None or k.accuracy is None or paired.difference is None:
        return f"eval verdict {summary.verdict!r}"
    diff = paired.difference * 100
    margin = (summary.margin or 0) * 100
    control, candidate = c.accuracy * 100, k.accuracy * 100
    head = f"control {control:.1f}% vs candidate {candidate:.1f}%, difference {diff:+.1f} pp"
    tail = f"(margin {margin:g} pp, n={summary.questions_used})"
    bounds = summary.bounds
    if bounds is not None and bounds.lower is not None:
        adjusted = f", adjusted for {bounds.look} looks" if bounds.look_adjusted else ""
        if summary.verdict == "fail" and bounds.upper is not None:
            sure = (bounds.upper_confidence or 0.975) * 100
            return (
                f"candidate worse: {candidate:.1f}% vs control {control:.1f}%, difference "
                f"{diff:+.1f} pp; shown worse by at least {max(0.0, -bounds.upper) * 100:.1f}"
                f" pp ({sure:g}% one-sided{adjusted}) {tail}"
            )
        sure = (bounds.lower_confidence or 0.95) * 100
        text = f"{head}; at least {bounds.lower * 100:+.1f} pp ({sure:g}% one-sided{adjusted})"
        return f"{text} {tail}"
    interval = paired.tango95 or (float("nan"),) * 2
    if len(interval) != 2:
        return f"eval verdict {summary.verdict!r}"
    low, high = (x * 100 for x in interval)
    return f"{head} [{low:+.1f}, {high:+.1f}] (two-sided 95%) {tail}"


# The kind of the eval Job's long-context block (`kvgate eval` writes it, the gate reads it).
LONG_CONTEXT_KIND: Final = "kvgate.eval/long_context"
_LC_VERDICTS: Final = {
    "fail": (Outcome.FAILED, Reason.LONG_CONTEXT_REGRESSED),
    "inconclusive": (Outcome.INCONCLUSIVE, Reason.LONG_CONTEXT_INCONCLUSIVE),
}


def _tokens(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else f"{n:,}"


def bucket_label(length: int) -> str:
    """A context-length bucket as a range: 32768 -> `16k-32k` (its prompts fill up to 32k)."""
    return f"{_tokens(length // 2)}-{_tokens(length)}"


def _bucket_figures(
    row: LongContextBucketRecord,
) -> tuple[float, int, float, float, int, float] | None:
    """(difference, context length, control and candidate accuracy, items, lower bound) of a
    long-context bucket; None when one is missing."""
    diff = row.paired.difference if row.paired else None
    ctl = row.control.accuracy if row.control else None
    cand = row.candidate.accuracy if row.candidate else None
    lower = row.bounds.lower if row.bounds else None
    length, items = row.context_length, row.items
    if diff is None or ctl is None or cand is None or lower is None or length is None:
        return None
    return None if items is None else (diff, length, ctl, cand, items, lower)


def assess_long_context(gate: LongContextTask | None, summary: AccuracyStatus) -> GateResult:
    """The eval summary's `long_context` block as the long-context task's outcome.

    Fail closed: when the task was asked for, a missing, malformed or self-contradicting block
    (a pass with a bucket that did not pass, other tasks than asked) is an ERROR, never a pass.
    A fail or inconclusive names the worst bucket: of those with the block's verdict, the one
    where the candidate lost most.
    """
    result = partial(GateResult, LONG_CONTEXT)
    if gate is None:
        return result(Outcome.SKIPPED, Reason.GATE_OFF, "long context not evaluated")
    block = summary.long_context
    broken = partial(result, Outcome.ERROR, Reason.LONG_CONTEXT_ERROR)

    if block is None or block.kind != LONG_CONTEXT_KIND:
        return broken(
            "the eval summary has no long_context block, though spec.gates.accuracy.longContext "
            "asks for it (an eval image without the task?)"
        )
    verdict = block.verdict
    if verdict == "error" or verdict not in ("pass", "fail", "inconclusive"):
        return broken(f"long-context task: {block.error or f'verdict {verdict!r}'}")
    if list(block.tasks) != list(gate.tasks):
        return broken(f"long-context block ran tasks {list(block.tasks)!r}, not {list(gate.tasks)}")
    if gate.context_lengths and list(block.context_lengths) != list(gate.context_lengths):
        return broken(
            f"long-context block judged lengths {list(block.context_lengths)!r}, not "
            f"{list(gate.context_lengths)}"
        )
    rows = block.buckets
    if not rows:
        return broken("long-context block judged no bucket")
    figures = [_bucket_figures(r) for r in rows]
    worst_rows = [(r, f) for r, f in zip(rows, figures, strict=True) if r.verdict == verdict]
    if (verdict == "pass" and len(worst_rows) != len(rows)) or not worst_rows:
        return broken(f"long-context verdict {verdict} contradicts its buckets")
    if any(f is None for f in figures):
        return broken("long-context block is malformed (a bucket lacks its figures)")
    row, worst = min(worst_rows, key=lambda pair: pair[1][0] if pair[1] else 0.0)
    assert worst is not None
    _, length, control, candidate, items, lower = worst
    detail = f"control {control:.0%} vs candidate {candidate:.0%} on {items} items"
    if row.recovery is not None:
        detail += f", recovery {row.recovery:.2f} (floor {gate.recovery_floor:g})"
    if verdict == "pass":
        lengths = ", ".join(bucket_label(f[1]) for f in figures if f is not None)
        return result(
            Outcome.SUCCESSFUL,
            Reason.LONG_CONTEXT_NON_INFERIOR,
            f"long context non-inferior in every bucket ({lengths}); closest: "
            f"{bucket_label(length)} {detail}, at least {lower * 100:+.1f} pp "
            f"(margin {gate.margin_pp:g} pp)",
        )
    outcome, reason = _LC_VERDICTS[verdict]
    why = {
        "worse_than_margin": f"worse than the {gate.margin_pp:g} pp margin",
        "below_recovery_floor": f"below {gate.recovery_floor:.0%} of the control's score",
    }.get(str(row.reason), "not shown non-inferior")
    label = f"{bucket_label(length)} ({length:,} tokens)"
    return result(outcome, reason, f"long-context bucket {label}: {why}: {detail}")


def _flag_message(gate: DivergenceGate, first: DivergenceBucketRecord | None) -> str | None:
    """The first flagged bucket's figures in words (None when one is missing)."""
    if first is None or first.floor is None or first.candidate is None:
        return None
    f, c = first.floor, first.candidate
    figures = (first.low, first.high, c.mean_kl, f.mean_kl, c.top1_agreement, f.top1_agreement)
    if any(x is None for x in figures):
        return None
    low, high, kl, floor_kl, agree, floor_agree = figures
    return (
        f"token divergence above {gate.factor:g}x the A/A floor from position bucket "
        f"{low:,}-{high:,}: mean KL {kl:.3g} vs floor {floor_kl:.3g}, "
        f"top-1 agreement {agree:.0%} vs {floor_agree:.0%}"
    )


def assess_divergence(gate: DivergenceGate, summary: AccuracyStatus) -> GateResult:
    """The eval summary's `divergence` block (the screen's own summary) as an outcome.

    `require`: a flag fails, and a screen that did not run (missing block, error) is an ERROR;
    `warn`: both are WARNINGs. The message names the first flagged position bucket.
    """
    result = partial(GateResult, DIVERGENCE)
    if gate.mode is GateMode.OFF:
        return result(Outcome.SKIPPED, Reason.GATE_OFF, "divergence not screened")
    bad = Outcome.FAILED if gate.mode is GateMode.REQUIRE else Outcome.WARNING
    unknown = partial(
        result,
        Outcome.ERROR if gate.mode is GateMode.REQUIRE else Outcome.WARNING,
        Reason.DIVERGENCE_UNKNOWN,
    )
    block = summary.divergence
    if block is None or block.kind != SUMMARY_KIND:
        return unknown(
            "the eval summary has no divergence block, though spec.gates.divergence asks for it"
        )
    verdict = block.verdict
    if verdict == "pass":
        positions = block.positions or 0
        if block.buckets and positions > 0 and all(r.flagged is False for r in block.buckets):
            return result(
                Outcome.SUCCESSFUL,
                Reason.DIVERGENCE_WITHIN_FLOOR,
                f"token divergence within {gate.factor:g}x the A/A floor in every position "
                f"bucket ({positions:,} positions)",
            )
        return unknown("divergence pass contradicts its buckets")
    if verdict == "flag":
        message = _flag_message(gate, block.first_flagged) or (
            "token divergence above the A/A floor in position buckets "
            f"{list(block.flagged_buckets)!r}"
        )
        return result(bad, Reason.DIVERGENCE_FLAGGED, message)
    return unknown(f"divergence screen: {block.error or f'verdict {verdict!r}'}")
