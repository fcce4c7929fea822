"""Promote, roll back, hold or not needed? `decide` over every gate's result.

`decide` takes the worst outcome: any FAILED, ERROR or INCONCLUSIVE rolls back, listing every
reason; missing evidence is ERROR or PENDING and never promotes (fail closed). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from kvgate.records.status import GateResult
from kvgate.vocabulary import Outcome, PromotionMode, worst


class Decision(StrEnum):
    PROMOTE = "Promote"
    ROLL_BACK = "RollBack"
    HOLD = "Hold"
    NOT_NEEDED = "NotNeeded"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What `decide` found: the deciding gates whole, where status's `VerdictRecord` keeps only
    their reason words (and what the judge does not know: the key, reused gates)."""

    decision: Decision
    outcome: Outcome
    reasons: tuple[GateResult, ...]  # the gates that decided, worst first
    message: str


def decide(
    results: Sequence[GateResult],
    *,
    mode: PromotionMode,
    config_hash: str,
    approval: str | None,
) -> Verdict:
    """Promote, roll back, hold or not-needed from every gate result; fail closed.

    PENDING holds. A pass in manual mode holds until the approval annotation equals
    `config_hash`, so an approval given for another candidate never promotes this one.
    """
    if not results:
        return Verdict(Decision.HOLD, Outcome.PENDING, (), "no evidence yet")
    overall = worst(r.outcome for r in results)
    ranked = sorted(results, key=lambda r: list(Outcome).index(r.outcome), reverse=True)
    if overall.blocks:
        blocking = tuple(r for r in ranked if r.outcome.blocks)
        return Verdict(
            Decision.ROLL_BACK, overall, blocking, "; ".join(r.message for r in blocking)
        )
    if overall is Outcome.NOT_NEEDED:
        why = tuple(r for r in ranked if r.outcome is Outcome.NOT_NEEDED)
        return Verdict(Decision.NOT_NEEDED, overall, why, "; ".join(r.message for r in why))
    if overall is Outcome.PENDING:
        waiting = tuple(r for r in ranked if r.outcome is Outcome.PENDING)
        return Verdict(Decision.HOLD, overall, waiting, "; ".join(r.message for r in waiting))
    warnings = tuple(r for r in ranked if r.outcome is Outcome.WARNING)
    note = f" (warnings: {'; '.join(r.message for r in warnings)})" if warnings else ""
    if mode is PromotionMode.MANUAL and approval != config_hash:
        stale = f"; approval {approval!r} is for another config" if approval else ""
        return Verdict(
            Decision.HOLD,
            overall,
            warnings,
            f"all gates passed; approve with annotation kvgate.io/approve={config_hash}{stale}{note}",
        )
    return Verdict(Decision.PROMOTE, overall, warnings, f"all gates passed{note}")
